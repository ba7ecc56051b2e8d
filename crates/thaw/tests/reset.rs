//! In-place reset (issue #12) through the `thaw` CLI, as root: canaries planted by
//! one invocation are invisible to the next one after a reset, and absent from the
//! idle instance's whole memory read from outside; resets that cannot prove the
//! state restored are refused and the CLI answers from a fresh restore.

mod common;

use std::path::PathBuf;

use common::{bundle, ok, scratch, stdout, thaw};

/// A Python function that reports what it sees of earlier canaries (module global,
/// cache dict, large allocation, environment, /tmp, descriptors, cwd, umask), then
/// plants new ones: its canary is the reversed `tag`, so the payload itself never
/// holds the string searched for.
const HANDLER: &str = r#""""Plants canaries everywhere it can, after reporting what it sees of earlier ones."""
import os
import threading

STATE = {"g": None}
CACHE = {}
BIG = []
FDS = []


def handler(event, context):
    c = event["tag"][::-1]
    seen = {
        "g": STATE["g"],
        "cache": sorted(CACHE),
        "big": len(BIG),
        "env": os.environ.get("THAW_CANARY"),
        "tmp": sorted(os.listdir("/tmp")),
        "cwd": os.getcwd(),
        "fds": sorted(os.listdir("/proc/self/fd")),
        "umask": os.umask(0o022),
    }
    do = event.get("do", "gcbfetdwu")
    if "g" in do:
        STATE["g"] = c
    if "c" in do:
        CACHE[c] = c * 10
    if "b" in do:
        BIG.append(bytearray((c * ((8 << 20) // len(c))).encode()))
    if "s" in do:
        x = c * ((8 << 20) // len(c))
        del x
    if "m" in do:
        import mmap
        BIG.append(mmap.mmap(-1, 8 << 20))
        BIG[-1][0:5] = b"hello"
    if "k" in do:
        BIG.append(bytearray(100000))
    if "f" in do:
        freed = [c + str(i) for i in range(2000)]
        del freed
    if "e" in do:
        os.environ["THAW_CANARY"] = c
    if "t" in do:
        with open("/tmp/canary-file", "w") as f:
            f.write(c)
    if "d" in do:
        FDS.append(os.open("/tmp/canary-file", os.O_RDONLY))
        r, w = os.pipe()
        os.write(w, c.encode())
        FDS.extend([r, w])
    if "w" in do:
        os.chdir("/tmp")
    if "u" in do:
        os.umask(0o077)
    extra = event.get("extra")
    if extra == "thread":
        threading.Thread(target=lambda: threading.Event().wait(), daemon=True).start()
    elif extra == "pidfd":
        FDS.append(os.pidfd_open(os.getpid()))
    elif extra == "signal":
        import signal
        signal.signal(signal.SIGUSR2, lambda *a: None)
    return seen
"#;

/// Reversed by the handler into the canary searched for.
const TAG: &str = "yranac-teser-7f3a9c";
const CANARY: &str = "c9a3f7-reset-canary";

fn snapshot() -> PathBuf {
    static SNAP: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SNAP.get_or_init(|| {
        let code = bundle("canary", &[("handler.py", HANDLER)]);
        let out = scratch().join("snap-canary");
        ok(thaw(&[
            "snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--memory", "256",
            "--out", out.to_str().unwrap(),
        ]));
        out
    })
    .clone()
}

fn run(payload: &str, extra: &[&str]) -> (Vec<serde_json::Value>, serde_json::Value) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let f = scratch().join(format!("reset-stats-{}.json", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let snap = snapshot();
    let mut args = vec!["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--quiet", "--stats", f.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = stdout(&ok(thaw(&args)));
    let answers = out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    (answers, serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap())
}

fn payload(extra: Option<&str>) -> String {
    match extra {
        Some(x) => format!(r#"{{"tag":"{TAG}","extra":"{x}"}}"#),
        None => format!(r#"{{"tag":"{TAG}"}}"#),
    }
}

#[test]
fn without_reset_the_canaries_are_seen_and_found_in_memory() {
    // The control: the same run without --reset sees every canary and finds it in memory.
    let (answers, stats) = run(&payload(None), &["--invocations", "2", "--search-memory", CANARY]);
    let second = &answers[1];
    assert_eq!(second["g"], CANARY, "{second}");
    assert_eq!(second["env"], CANARY, "{second}");
    assert_eq!(second["big"], 1, "{second}");
    assert_eq!(second["tmp"], serde_json::json!(["canary-file"]), "{second}");
    assert_eq!(second["cwd"], "/tmp", "{second}");
    assert!(stats["memory_matches"].as_u64().unwrap() > 1000, "{stats}");
}

#[test]
fn after_a_reset_no_canary_is_seen_or_left_in_memory() {
    let (answers, stats) = run(&payload(None), &["--invocations", "3", "--reset", "--search-memory", CANARY]);
    assert_eq!(answers.len(), 3);
    let first = &answers[0];
    assert_eq!(first["g"], serde_json::Value::Null, "{first}");
    assert_eq!(first["cwd"], "/var/task", "{first}");
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a, first, "invocation {} saw something of the one before", i + 1);
    }
    let resets = stats["resets"].as_array().unwrap();
    assert_eq!(resets.len(), 2, "{stats}");
    for r in resets {
        assert!(r.get("discarded").is_none(), "a reset was refused: {r}");
        assert!(r["pages_written_back"].as_u64().unwrap() > 0, "{r}");
        assert!(r["fds_closed"].as_u64().unwrap() >= 3, "file + pipe ends: {r}");
        assert_eq!(r["tmp_reset"], true, "{r}");
    }
    // Searched in the idle instance after a reset following the last invocation.
    assert_eq!(stats["memory_matches"], 0, "the canary survived in memory: {stats}");
}

#[test]
fn consecutive_and_noop_resets_leave_the_instance_answering_identically() {
    let (answers, stats) = run(&payload(None), &["--invocations", "2", "--reset", "--noop-resets", "4"]);
    assert_eq!(answers.len(), 3, "two invocations and one after the no-op resets");
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    let noop = stats["noop_resets"].as_array().unwrap();
    assert_eq!(noop.len(), 4);
    // The first reset takes back the invocation's writes; the later ones have little
    // to do: only what the runtime itself wrote answering the restore notice (it
    // reseeds; 0 to ~35 pages with Python), never the invocation's pages again.
    let first = noop[0]["pages_written_back"].as_u64().unwrap();
    assert!(first > 100, "{stats}");
    for r in &noop[1..] {
        let n = r["pages_written_back"].as_u64().unwrap();
        assert!(n * 4 < first, "a reset with nothing run since rewrote {n} pages: {stats}");
    }
}

#[test]
fn what_a_reset_cannot_take_back_is_refused_and_a_fresh_restore_answers() {
    for (extra, reason) in [("thread", "threads"), ("pidfd", "anon_inode:[pidfd]"), ("signal", "SigCgt")] {
        let (answers, stats) = run(&payload(Some(extra)), &["--invocations", "3", "--reset"]);
        assert_eq!(answers.len(), 3, "{extra}: every invocation answered");
        assert!(answers.iter().all(|a| a == &answers[0]), "{extra}: {answers:?}");
        for r in stats["resets"].as_array().unwrap() {
            let why = r["discarded"].as_str().unwrap_or_else(|| panic!("{extra}: the reset was not refused: {r}"));
            assert!(why.contains(reason), "{extra}: {why}");
            assert_eq!(r["reset_ms"], serde_json::Value::Null);
        }
    }
}
