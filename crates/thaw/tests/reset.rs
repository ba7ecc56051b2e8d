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
import ctypes
import os
import resource
import signal
import threading

STATE = {"g": None}
LIBC = ctypes.CDLL(None, use_errno=True)
EFD = os.eventfd(0, os.EFD_NONBLOCK)


class Itimerspec(ctypes.Structure):
    _fields_ = [("i_s", ctypes.c_long), ("i_ns", ctypes.c_long), ("v_s", ctypes.c_long), ("v_ns", ctypes.c_long)]


TFD = LIBC.timerfd_create(1, 0o4000)  # CLOCK_MONOTONIC, TFD_NONBLOCK; disarmed at the snapshot


def tfd_left():
    cur = Itimerspec()
    LIBC.timerfd_gettime(TFD, ctypes.byref(cur))
    return cur.v_s
MFD = os.memfd_create("canary")  # a memfd of the snapshot, only held open
os.write(MFD, b"clean")
EP = __import__("select").epoll()
EP.register(EFD, 1)  # EPOLLIN: a registration of the snapshot


def epoll_view():
    lines = open("/proc/self/fdinfo/%d" % EP.fileno()).read().splitlines()
    return sorted(" ".join(l.split()[:4]) for l in lines if l.startswith("tfd:"))
SP_A, SP_B = __import__("socket").socketpair()
SP_B.setblocking(False)


def sock_unread():
    try:
        return SP_B.recv(100).decode()
    except BlockingIOError:
        return None


def efd_value():
    try:
        return os.eventfd_read(EFD)
    except BlockingIOError:
        return 0


class StackT(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def altstack():
    old = StackT()
    LIBC.sigaltstack(None, ctypes.byref(old))
    return [old.ss_sp or 0, old.ss_flags, old.ss_size]
CACHE = {}
KEEP = []
# Heap memory from init (malloc's, below the program break) that a call may free:
# malloc then gives the top of the heap back (brk shrinks).
TRIM = [bytearray(1000) for _ in range(3000)]
BIG = []
ALT = []
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
        "itimer": list(signal.getitimer(signal.ITIMER_VIRTUAL)),
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "altstack": altstack(),
        "eventfd": efd_value(),
        "timerfd": tfd_left(),
        "socketpair": sock_unread(),
        "tasks": len(os.listdir("/proc/self/task")),
        "procs": sorted(p for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())),
        "timers": sum(1 for l in open("/proc/self/timers") if l.startswith("ID:")),
        "trim": len(TRIM),
        "epoll": epoll_view(),
        "memfd": os.pread(MFD, 64, 0).decode(),
        "signals": [l for l in open("/proc/self/status") if l.startswith(("SigIgn:", "SigCgt:"))],
    }
    do = event.get("do", "gcbfetdwuirav")
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
    if "i" in do:
        signal.setitimer(signal.ITIMER_VIRTUAL, 1000, 1000)
    if "r" in do:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    if "v" in do:
        os.eventfd_write(EFD, 7)
        LIBC.timerfd_settime(TFD, 0, ctypes.byref(Itimerspec(0, 0, 1000, 0)), None)
    if "a" in do:
        ALT.append(ctypes.create_string_buffer(1 << 16))
        new = StackT(ctypes.addressof(ALT[-1]), 0, 1 << 16)
        if LIBC.sigaltstack(ctypes.byref(new), None) != 0:
            raise OSError(ctypes.get_errno(), "sigaltstack")
    extra = event.get("extra")
    if extra == "thread":
        threading.Thread(target=lambda held=c * 100: threading.Event().wait(), daemon=True).start()
    elif extra == "pidfd":
        FDS.append(os.pidfd_open(os.getpid()))
    elif extra == "epoll":
        EP.register(os.eventfd(0))  # a new descriptor (closed by the reset)
        EP.register(SP_B.fileno(), 1)  # a descriptor of the snapshot
        EP.modify(EFD, 5)  # the snapshot's registration changed (EPOLLIN | EPOLLOUT)
    elif extra == "memfd":
        os.pwrite(MFD, c.encode(), 0)  # overwrites "clean", and grows it
    elif extra == "epollrm":
        EP.unregister(EFD)  # the snapshot's registration removed
    elif extra == "signal":
        signal.signal(signal.SIGUSR2, lambda *a: None)
    elif extra == "sockdata":
        SP_A.send(c.encode())
    elif extra == "pool":
        import concurrent.futures
        KEEP.append(concurrent.futures.ThreadPoolExecutor(4))
        list(KEEP[-1].map(lambda x: threading.Event().wait(0.05), range(8)))
        KEEP[-1].submit(lambda held=c * 100: threading.Event().wait())
    elif extra == "child":
        import subprocess, sys
        KEEP.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", c]))
    elif extra == "daemon":
        if os.fork() == 0:
            if os.fork() == 0:
                os.setsid()
                threading.Event().wait(1000)
            os._exit(0)
        os.wait()
    elif extra == "trim":
        TRIM.clear()
        import gc
        gc.collect()
        LIBC.malloc_trim(0)  # what malloc does by itself when enough is free at the top
    elif extra == "ptimer":
        sev = ctypes.create_string_buffer(64)
        sev[12] = 1  # sigev_notify = SIGEV_NONE
        tid = ctypes.c_int(-1)
        if LIBC.syscall(222, 1, sev, ctypes.byref(tid)) != 0:  # timer_create(CLOCK_MONOTONIC)
            raise OSError(ctypes.get_errno(), "timer_create")
        LIBC.syscall(223, tid, 0, ctypes.byref(Itimerspec(0, 0, 1000, 0)), None)  # timer_settime
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

/// Restore `snap` with `payload` and `extra` options: (answers, --stats).
fn restore_with(snap: &std::path::Path, name: &str, payload: &str, extra: &[&str]) -> (Vec<serde_json::Value>, serde_json::Value) {
    let f = scratch().join(format!("{name}-stats-{}.json", extra.len()));
    let mut args = vec!["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--quiet", "--stats", f.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = stdout(&ok(thaw(&args)));
    (out.lines().map(|l| serde_json::from_str(l).unwrap()).collect(), serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap())
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
    assert!(second["itimer"][0].as_f64().unwrap() > 0.0, "{second}");
    assert_eq!(second["nofile"][0], 100, "{second}");
    assert_eq!(second["altstack"][2], 1 << 16, "{second}");
    assert_eq!(second["eventfd"], 7, "{second}");
    assert!(second["timerfd"].as_i64().unwrap() > 900, "{second}");
    assert!(stats["memory_matches"].as_u64().unwrap() > 1000, "{stats}");
}

#[test]
fn after_a_reset_no_canary_is_seen_or_left_in_memory() {
    let (answers, stats) = run(&payload(None), &["--invocations", "3", "--reset", "--search-memory", CANARY]);
    assert_eq!(answers.len(), 3);
    let first = &answers[0];
    assert_eq!(first["g"], serde_json::Value::Null, "{first}");
    assert_eq!(first["cwd"], "/var/task", "{first}");
    assert_eq!(first["itimer"], serde_json::json!([0.0, 0.0]), "{first}");
    assert_ne!(first["nofile"][0], 100, "{first}");
    assert_ne!(first["altstack"][2], 1 << 16, "{first}");
    assert_eq!(first["eventfd"], 0, "{first}");
    assert_eq!(first["timerfd"], 0, "{first}");
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
        assert_eq!(r["limits_reset"], true, "{r}");
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
    // reseeds; 0 to ~35 pages with Python), and the pages both invocations wrote, which
    // the resets leave writable (reset::Hot) and so rewrite every time — never the
    // invocation's other pages again.
    let first = noop[0]["pages_written_back"].as_u64().unwrap();
    assert!(first > 100, "{stats}");
    for w in noop.windows(2) {
        let (writable, n) = (w[0]["pages_left_writable"].as_u64().unwrap(), w[1]["pages_written_back"].as_u64().unwrap());
        assert!(n.saturating_sub(writable) * 4 < first, "a reset with nothing run since rewrote {n} pages ({writable} left writable): {stats}");
    }
}

/// What everyday handlers leave behind (issue #30): a background thread, a thread
/// pool, a child process, a double-forked daemon in a session of its own, a POSIX
/// timer, a signal handler, heap memory freed back to the kernel (brk shrunk: grown
/// back, and served from the image again), epoll registrations added, changed and
/// removed, a memfd of the snapshot written. A reset ends them all (the handler's disposition goes
/// back to the image's); the next invocation sees the threads, processes and
/// timers of the snapshot, and nothing else.
#[test]
fn threads_children_daemons_and_timers_left_behind_are_reset() {
    for (extra, field, at_least) in
        [("thread", "threads_ended", 1), ("pool", "threads_ended", 2), ("child", "processes_killed", 1), ("daemon", "processes_killed", 1), ("ptimer", "timers_deleted", 1), ("signal", "signals_reset", 1), ("trim", "pages_written_back", 1), ("epoll", "epoll_changes", 3), ("epollrm", "epoll_changes", 1), ("memfd", "memfds_rewritten", 1)]
    {
        // (trim: the call frees heap memory and plants no more than it must, or the
        // heap would grow by more than it gives back.)
        let p = if extra == "trim" { format!(r#"{{"tag":"{TAG}","extra":"trim","do":"gc"}}"#) } else { payload(Some(extra)) };
        let (answers, stats) = run(&p, &["--invocations", "3", "--reset", "--search-memory", CANARY]);
        assert_eq!(answers.len(), 3, "{extra}: every invocation answered");
        // The threads held the canary (a thread's own reference, on its stack and in
        // the heap), the child had it in its arguments: after the reset following the
        // last call, nothing of it is in the frozen instance's memory.
        assert_eq!(stats["memory_matches"], 0, "{extra}: the canary survived in memory: {stats}");
        let first = &answers[0];
        assert_eq!((first["procs"].as_array().map(Vec::len), &first["timers"]), (Some(1), &serde_json::json!(0)), "{extra}: only the sandbox's init beside it: {first}");
        assert!(answers.iter().all(|a| a == first), "{extra}: an invocation saw what the one before left: {answers:?}");
        let resets = stats["resets"].as_array().unwrap();
        assert_eq!(resets.len(), 2, "{stats}");
        for r in resets {
            assert!(r.get("discarded").is_none(), "{extra}: the reset was refused: {r}");
            assert!(r[field].as_u64().unwrap() >= at_least, "{extra}: {field} in {r}");
        }
    }
}

/// The differential check (issue #30): `--dump-state` reads the idle instance at the
/// ready point before each invocation — right after the restore, then after each reset
/// — as named facts: every mapping, a hash of every page (a never-touched one as the
/// image holds it), every thread's registers, extended state and signal mask, every
/// descriptor with its flags and offset, signal dispositions and pending signals,
/// timers, limits, cwd. After a reset they must all be the fresh restore's, but the
/// pages the runtime itself writes answering the restore notice (marked `written`:
/// reseeding), which must stay few. Without resets, the same reading tells the
/// instance apart from its fresh self (the check can fail).
///
/// `registers`: whether threads' registers and extended state, and the bounds of
/// anonymous mappings, are compared too. Not for runtimes whose threads run on their
/// own after the ready point (V8's platform threads and event loop, the JVM's VM and
/// compiler threads): where each is when it is read, and whether one has grown its
/// malloc arena by then, is a matter of timing; their signal masks and pending
/// signals, and every page's contents, still are.
///
/// `control`: also run the control (two calls without a reset; not for payloads whose
/// second call without a reset fails, such as registering a descriptor twice).
fn reset_is_a_fresh_restore(snap: &std::path::Path, name: &str, payload: &str, registers: bool, control: bool) {
    let dir = scratch().join(format!("dump-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    restore_with(snap, name, payload, &["--invocations", "3", "--reset", "--dump-state", dir.to_str().unwrap()]);
    let read = |d: &std::path::Path, i: usize| -> std::collections::BTreeMap<String, String> {
        serde_json::from_slice(&std::fs::read(d.join(format!("state-{i}.json"))).unwrap()).unwrap()
    };
    let differences = |a: &std::collections::BTreeMap<String, String>, b: &std::collections::BTreeMap<String, String>| -> Vec<String> {
        let noted = |v: Option<&String>| v.is_some_and(|v| v.ends_with(" written"));
        // An anonymous mapping's bounds: a helper thread's malloc arena grows (by
        // mprotect) when it allocates, as it runs on its own after the ready point.
        let anonymous = |v: Option<&String>| v.is_none_or(|v| v.split_whitespace().count() == 5);
        let timing = |k: &str| {
            !registers
                && ((k.starts_with("thread:") && !k.ends_with(":sigmask") && !k.ends_with(":SigPnd") && !k.ends_with(":SigBlk"))
                    || (k.starts_with("map:") && anonymous(a.get(k)) && anonymous(b.get(k))))
        };
        a.keys()
            .chain(b.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|k| a.get(*k) != b.get(*k) && !noted(a.get(*k)) && !noted(b.get(*k)) && !timing(k))
            .map(|k| format!("{k}: {:?} -> {:?}", a.get(k), b.get(k)))
            .collect()
    };
    let fresh = read(&dir, 0);
    let pages = fresh.keys().filter(|k| k.starts_with("page:")).count();
    let written = fresh.values().filter(|v| v.ends_with(" written")).count();
    assert!(pages > 1000 && written * 20 < pages, "{name}: {pages} pages read, {written} written after the restore");
    assert!(fresh.keys().any(|k| k.ends_with(":rip")) && fresh.keys().any(|k| k.starts_with("fd:")), "{name}: no registers or descriptors read");
    for i in [1, 2] {
        let d = differences(&fresh, &read(&dir, i));
        assert!(d.is_empty(), "{name}: after reset {i}, {} facts differ from the fresh restore's: {:#?}", d.len(), &d[..d.len().min(20)]);
    }
    if !control {
        return;
    }
    // The control: without resets, the instance after an invocation is not its fresh self.
    let plain = scratch().join(format!("dump-{name}-plain"));
    let _ = std::fs::remove_dir_all(&plain);
    restore_with(snap, &format!("{name}-plain"), payload, &["--invocations", "2", "--dump-state", plain.to_str().unwrap()]);
    let d = differences(&read(&plain, 0), &read(&plain, 1));
    assert!(d.len() > 10, "{name}: an invocation changed nothing the reading sees: {d:?}");
}

#[test]
fn a_reset_instance_is_a_fresh_restore_fact_for_fact() {
    for extra in [None, Some("thread"), Some("pool"), Some("child"), Some("daemon"), Some("ptimer"), Some("signal"), Some("epoll"), Some("epollrm"), Some("memfd")] {
        reset_is_a_fresh_restore(&snapshot(), &format!("python-{}", extra.unwrap_or("canaries")), &payload(extra), true, extra.is_none());
    }
    reset_is_a_fresh_restore(&snapshot(), "python-trim", &format!(r#"{{"tag":"{TAG}","extra":"trim","do":"gc"}}"#), true, false);
}

#[test]
fn what_a_reset_cannot_take_back_is_refused_and_a_fresh_restore_answers() {
    for (extra, reason) in [
        ("pidfd", "anon_inode:[pidfd]"),
        ("sockdata", "socketpair holding data"),
    ] {
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

/// The same canaries from a Node.js function: module state, a large buffer, the
/// environment, /tmp, cwd and umask, a descriptor, an interval timer left pending
/// is not (the event loop must be idle when the invocation ends).
const NODE_HANDLER: &str = r#"
const fs = require('fs');
const state = { g: null, big: [], fds: [] };
exports.handler = async (event) => {
  const c = event.tag.split('').reverse().join('');
  const seen = {
    g: state.g, big: state.big.length, env: process.env.THAW_CANARY || null,
    tmp: fs.readdirSync('/tmp').sort(), cwd: process.cwd(), umask: process.umask(0o022),
    fds: fs.readdirSync('/proc/self/fd').length,
  };
  state.g = c;
  state.big.push(Buffer.from(c.repeat((8 << 20) / c.length)));
  process.env.THAW_CANARY = c;
  fs.writeFileSync('/tmp/canary-file', c);
  state.fds.push(fs.openSync('/tmp/canary-file', 'r'));
  process.chdir('/tmp');
  process.umask(0o077);
  return seen;
};
"#;

#[test]
fn nodejs_instances_reset_to_a_clean_state_too() {
    let code = bundle("node-canary", &[("index.js", NODE_HANDLER)]);
    let snap = scratch().join("snap-node-canary");
    ok(thaw(&[
        "snapshot", "create", "--runtime", "nodejs20.x", "--code", code.to_str().unwrap(), "--handler", "index.handler",
        "--memory", "256", "--out", snap.to_str().unwrap(),
    ]));
    let restore = |extra: &[&str]| restore_with(&snap, "node", &payload(None), extra);
    // Control: without a reset the second invocation sees the first one's canaries.
    let (answers, stats) = restore(&["--invocations", "2", "--search-memory", CANARY]);
    assert_eq!(answers[1]["g"], CANARY, "{answers:?}");
    assert_eq!(answers[1]["env"], CANARY);
    assert_eq!(answers[1]["cwd"], "/tmp");
    assert!(stats["memory_matches"].as_u64().unwrap() > 0, "{stats}");
    // With resets: every invocation sees the restored state, and no canary is left.
    let (answers, stats) = restore(&["--invocations", "3", "--reset", "--search-memory", CANARY]);
    assert_eq!(answers[0]["g"], serde_json::Value::Null, "{answers:?}");
    assert_eq!(answers[0]["cwd"], "/var/task");
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    for r in stats["resets"].as_array().unwrap() {
        assert!(r.get("discarded").is_none(), "a Node.js reset was refused: {r}");
    }
    assert_eq!(stats["memory_matches"], 0, "{stats}");
    reset_is_a_fresh_restore(&snap, "nodejs", &payload(None), false, true);
}

/// The same from a Java function: static fields, a large array on the heap and a
/// system property; compiled here with javac (a static `Class::method` handler needs
/// no library on the class path).
const JAVA_HANDLER: &str = r#"
package example;

import java.util.*;

public class Canary {
    static String g = null;
    static final List<byte[]> BIG = new ArrayList<>();

    public static Map<String, Object> handle(Map<String, Object> event) {
        String c = new StringBuilder((String) event.get("tag")).reverse().toString();
        Map<String, Object> seen = new TreeMap<>();
        seen.put("g", g);
        seen.put("big", BIG.size());
        seen.put("prop", System.getProperty("thaw.canary"));
        g = c;
        // Within the heap the JVM committed at start; "grow" makes it commit more
        // (new protections in its reserved range: a layout a reset refuses).
        int size = Boolean.TRUE.equals(event.get("grow")) ? 32 << 20 : 256 << 10;
        BIG.add(c.repeat(size / c.length()).getBytes());
        System.setProperty("thaw.canary", c);
        return seen;
    }
}
"#;

#[test]
fn java_instances_reset_to_a_clean_state_too() {
    let src = bundle("java-canary-src", &[("Canary.java", JAVA_HANDLER)]);
    let code = scratch().join("java-canary");
    let javac = std::process::Command::new("javac")
        .args(["--release", "17", "-d", code.to_str().unwrap(), src.join("Canary.java").to_str().unwrap()])
        .output()
        .expect("running javac");
    assert!(javac.status.success(), "javac: {}", String::from_utf8_lossy(&javac.stderr));
    let snap = scratch().join("snap-java-canary");
    ok(thaw(&[
        "snapshot", "create", "--runtime", "java17", "--code", code.to_str().unwrap(), "--handler", "example.Canary::handle",
        "--memory", "512", "--out", snap.to_str().unwrap(),
    ]));
    let restore = |extra: &[&str]| restore_with(&snap, "java", &payload(None), extra);
    // Control: without a reset the second invocation sees the first one's canaries.
    let (answers, stats) = restore(&["--invocations", "2", "--search-memory", CANARY]);
    assert_eq!((answers[1]["g"].as_str(), answers[1]["prop"].as_str(), answers[1]["big"].as_u64()), (Some(CANARY), Some(CANARY), Some(1)), "{answers:?}");
    assert!(stats["memory_matches"].as_u64().unwrap() > 0, "{stats}");
    // With resets: every invocation sees the restored state, and no canary is left.
    let (answers, stats) = restore(&["--invocations", "3", "--reset", "--search-memory", CANARY]);
    assert_eq!((answers[0]["g"].clone(), answers[0]["big"].as_u64()), (serde_json::Value::Null, Some(0)), "{answers:?}");
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    for r in stats["resets"].as_array().unwrap() {
        assert!(r.get("discarded").is_none(), "a Java reset was refused: {r}");
    }
    assert_eq!(stats["memory_matches"], 0, "{stats}");
    // A JVM that commits more of its reserved heap (32 MiB more here) splits a
    // snapshot mapping by protection: the reset puts fresh memory with the mapping's
    // protection back over the pieces, and the next caller still sees nothing.
    let grow = format!(r#"{{"tag":"{TAG}","grow":true}}"#);
    let (answers, stats) = restore_with(&snap, "java-grow", &grow, &["--invocations", "3", "--reset", "--search-memory", CANARY]);
    assert!(answers.iter().all(|a| a == &answers[0]) && answers[0]["g"].is_null(), "{answers:?}");
    for r in stats["resets"].as_array().unwrap() {
        assert!(r.get("discarded").is_none(), "a Java reset after heap growth was refused: {r}");
        assert!(r["mappings_reprotected"].as_u64() > Some(0), "the heap did not grow: {r}");
    }
    assert_eq!(stats["memory_matches"], 0, "{stats}");
    reset_is_a_fresh_restore(&snap, "java", &grow, false, true);
}

/// A Node.js function doing I/O (the imageresize sample: files and libuv's thread
/// pool) changes its event loop's epoll registrations in most calls; the reset puts
/// them back (the snapshot's re-added or modified, new ones removed) instead of
/// refusing, and every call answers the same.
#[test]
fn nodejs_io_changes_epoll_registrations_and_is_reset() {
    let code = common::root().join("build/samples/nodejs/imageresize");
    assert!(code.join("index.js").is_file(), "sample nodejs/imageresize not built: run scripts/build-samples.sh");
    let snap = scratch().join("snap-node-imageresize");
    // A full image, as this test was written for: on a diff (the default since layered
    // snapshots, issue #31) one suite run of three had every reset refused because a V8
    // heap mapping was unmapped or changed in a call (fail closed: the calls answered from
    // fresh restores). Open in #31's notes.
    ok(thaw(&[
        "snapshot", "create", "--no-base", "--runtime", "nodejs20.x", "--code", code.to_str().unwrap(), "--handler", "index.handler",
        "--out", snap.to_str().unwrap(),
    ]));
    let (answers, stats) = restore_with(&snap, "node-io", r#"{"width": 80}"#, &["--invocations", "4", "--reset"]);
    assert!(answers.iter().all(|a| a == &answers[0]) && answers[0]["width"] == 80, "{answers:?}");
    // (Whether libuv changed its registrations in these calls depends on its thread
    // pool's timing: most runs do, some do not; the Python epoll cases above put
    // each kind of change back deterministically.)
    let resets = stats["resets"].as_array().unwrap();
    assert!(resets.iter().all(|r| r.get("discarded").is_none()), "a reset was refused: {stats}");
}

/// A /tmp file the function holds open for writing from its init is carried across the
/// snapshot (each instance's /tmp is its own copy). A call that writes through it
/// changes /tmp; a reset recreates /tmp's files, which would leave the descriptor on
/// the old file, so it refuses, and the next call runs on a fresh restore: every call
/// sees the file as the snapshot had it.
#[test]
fn a_tmp_file_held_open_for_writing_is_restored_and_its_reset_refused() {
    let code = bundle(
        "tmp-held",
        &[(
            "handler.py",
            "import os\nFD = os.open('/tmp/held', os.O_RDWR | os.O_CREAT)\nos.write(FD, b'init')\n\n\
             def handler(event, context):\n    seen = open('/tmp/held').read()\n    os.write(FD, b'+call')\n    return seen\n",
        )],
    );
    let snap = scratch().join("snap-tmp-held");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "tmp-held", "{}", &["--invocations", "3", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!("init"); 3], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        let why = r["discarded"].as_str().unwrap_or_else(|| panic!("the reset was not refused: {r}"));
        assert!(why.contains("/tmp"), "{why}");
    }
    // Without resets the same instance answers on: the file keeps what each call wrote.
    let (answers, _) = restore_with(&snap, "tmp-held-plain", "{}", &["--invocations", "2"]);
    assert_eq!(answers, vec![serde_json::json!("init"), serde_json::json!("init+call")]);
}

/// Shared anonymous memory (Python's `mmap.mmap(-1, n)` is MAP_SHARED|MAP_ANONYMOUS)
/// is restored with its contents and stays shared. A reset cannot track writes to it,
/// so every reset is refused by name (fail closed: the instance is discarded and the
/// next call gets a fresh restore): every call sees the snapshot's contents.
#[test]
fn shared_anonymous_memory_is_restored_and_its_reset_refused() {
    let code = bundle(
        "shared-anon",
        &[(
            "handler.py",
            "import mmap\nM = mmap.mmap(-1, 4 * 4096)\nM[:4] = b'init'\n\n\
             def handler(event, context):\n    seen = M[:8].rstrip(b'\\0').decode()\n    M[4:8] = b'+cal'\n    \
             shared = [l.split()[1] for l in open('/proc/self/maps') if 'dev/zero' in l]\n    return [seen, shared]\n",
        )],
    );
    let snap = scratch().join("snap-shared-anon");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "shared-anon", "{}", &["--invocations", "3", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!(["init", ["rw-s"]]); 3], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        let why = r["discarded"].as_str().unwrap_or_else(|| panic!("the reset was not refused: {r}"));
        assert!(why.contains("shared anonymous memory"), "{why}");
    }
    // Without resets the same instance answers on: the memory keeps what each call wrote.
    let (answers, _) = restore_with(&snap, "shared-anon-plain", "{}", &["--invocations", "2"]);
    assert_eq!(answers, vec![serde_json::json!(["init", ["rw-s"]]), serde_json::json!(["init+cal", ["rw-s"]])]);
}

/// A memfd mapped shared and its descriptor closed at init (what V8 and JITs do) is
/// carried across the snapshot: made again for its mapping and closed once mapped.
/// A reset is refused by name (its writes are not tracked); without resets the memory
/// keeps what each call wrote.
#[test]
fn a_mapped_memfd_whose_descriptor_was_closed_is_restored_and_its_reset_refused() {
    // libc's mmap through ctypes: Python's mmap module keeps a dup of the descriptor.
    let code = bundle(
        "memfd-mapped",
        &[(
            "handler.py",
            "import ctypes, os\nlibc = ctypes.CDLL(None)\nlibc.mmap.restype = ctypes.c_void_p\n\
             libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
             fd = os.memfd_create('jit')\nos.ftruncate(fd, 2 * 4096)\nA = libc.mmap(None, 2 * 4096, 3, 1, fd, 0)\nos.close(fd)\n\
             ctypes.memmove(A, b'init', 4)\n\n\
             def handler(event, context):\n    seen = ctypes.string_at(A, 8).rstrip(b'\\0').decode()\n    ctypes.memmove(A + 4, b'+cal', 4)\n    \
             maps = [l.split()[1] for l in open('/proc/self/maps') if 'memfd:jit' in l]\n    \
             fds = [n for n in os.listdir('/proc/self/fd') if os.path.exists('/proc/self/fd/' + n) and os.readlink('/proc/self/fd/' + n).startswith('/memfd:')]\n    \
             return [seen, maps, fds]\n",
        )],
    );
    let snap = scratch().join("snap-memfd-mapped");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "memfd-mapped", "{}", &["--invocations", "2", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!(["init", ["rw-s"], []]); 2], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        let why = r["discarded"].as_str().unwrap_or_else(|| panic!("the reset was not refused: {r}"));
        assert!(why.contains("memfd"), "{why}");
    }
    let (answers, _) = restore_with(&snap, "memfd-mapped-plain", "{}", &["--invocations", "2"]);
    assert_eq!(answers, vec![serde_json::json!(["init", ["rw-s"], []]), serde_json::json!(["init+cal", ["rw-s"], []])]);
}

/// An inotify instance watching a /tmp directory is carried across the snapshot (the
/// watch added again by path); a reset is refused by name (it does not check the
/// watches and queued events a call leaves).
#[test]
fn an_inotify_watch_is_restored_and_its_reset_refused() {
    let code = bundle(
        "inotify",
        &[(
            "handler.py",
            "import ctypes, os, struct\nlibc = ctypes.CDLL(None)\nos.makedirs('/tmp/w', exist_ok=True)\n\
             FD = libc.inotify_init1(os.O_NONBLOCK)\nWD = libc.inotify_add_watch(FD, b'/tmp/w', 0x100)\n\n\
             def handler(event, context):\n    open('/tmp/w/f%d' % len(os.listdir('/tmp/w')), 'w').close()\n    \
             w, mask = struct.unpack_from('<iI', os.read(FD, 4096))\n    return [WD, w, mask]\n",
        )],
    );
    let snap = scratch().join("snap-inotify");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "inotify", "{}", &["--invocations", "2", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!([1, 1, 0x100]); 2], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        let why = r["discarded"].as_str().unwrap_or_else(|| panic!("the reset was not refused: {r}"));
        assert!(why.contains("inotify"), "{why}");
    }
}

/// A signal left pending (blocked) at init is pending again after the restore, with
/// its sender; a call that takes it must not leave the next call without it. A reset
/// does not queue signals again, so it is refused by name and each call gets a fresh
/// restore that has the signal pending; without resets the instance answers on
/// without it.
#[test]
fn a_pending_signal_is_restored_and_its_reset_refused() {
    let code = bundle(
        "sig-pending",
        &[(
            "handler.py",
            "import os, signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])\nos.kill(os.getpid(), signal.SIGUSR2)\n\n\
             def handler(event, context):\n    pending = signal.SIGUSR2 in signal.sigpending()\n    \
             info = signal.sigtimedwait([signal.SIGUSR2], 0)\n    return [pending, info is not None and info.si_pid == os.getpid()]\n",
        )],
    );
    let snap = scratch().join("snap-sig-pending");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "sig-pending", "{}", &["--invocations", "3", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!([true, true]); 3], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        let why = r["discarded"].as_str().unwrap_or_else(|| panic!("the reset was not refused: {r}"));
        assert!(why.contains("signals were pending"), "{why}");
    }
    let (answers, _) = restore_with(&snap, "sig-pending-plain", "{}", &["--invocations", "2"]);
    assert_eq!(answers, vec![serde_json::json!([true, true]), serde_json::json!([false, false])]);
}

/// A child that exited at init and was not waited for is a zombie again after the
/// restore, with its pid and exit status; a call that waits for it takes it for good,
/// and a reset cannot make it again, so each reset is refused by name and each call
/// gets a fresh restore with the zombie; without resets the second call finds none.
#[test]
fn a_zombie_child_is_restored_and_its_reset_refused() {
    let code = bundle(
        "zombie",
        &[(
            "handler.py",
            "import os, time\nKID = os.fork()\nif KID == 0:\n    os._exit(9)\ntime.sleep(0.2)\n\n\
             def handler(event, context):\n    try:\n        pid, status = os.waitpid(KID, os.WNOHANG)\n    except ChildProcessError:\n        \
             return None\n    return [pid == KID, os.waitstatus_to_exitcode(status)]\n",
        )],
    );
    let snap = scratch().join("snap-zombie");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "zombie", "{}", &["--invocations", "3", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!([true, 9]); 3], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        let why = r["discarded"].as_str().unwrap_or_else(|| panic!("the reset was not refused: {r}"));
        assert!(why.contains("zombie"), "{why}");
    }
    let (answers, _) = restore_with(&snap, "zombie-plain", "{}", &["--invocations", "2"]);
    assert_eq!(answers, vec![serde_json::json!([true, 9]), serde_json::Value::Null]);
}

/// A worker process forked at init, joined to the runtime by two pipes, is live again
/// after the restore with its pid and its own memory (it counts the requests it
/// served), and answers each call. A reset would kill it and cannot make it again, so
/// each reset is refused by name and each call gets a fresh restore whose worker has
/// served one request (the one before the snapshot); without resets the count goes on.
#[test]
fn a_live_child_process_is_restored_and_its_reset_refused() {
    let code = bundle(
        "worker",
        &[(
            "handler.py",
            r#"import os
REQ_R, REQ = os.pipe()
RESP, RESP_W = os.pipe()
KID = os.fork()
if KID == 0:
    os.close(REQ)
    os.close(RESP)
    served = 0
    while os.read(REQ_R, 1):
        served += 1
        os.write(RESP_W, b'%d %d' % (os.getpid(), served))
    os._exit(0)
os.close(REQ_R)
os.close(RESP_W)
os.write(REQ, b'x')
os.read(RESP, 100)


def handler(event, context):
    os.write(REQ, b'x')
    pid, served = os.read(RESP, 100).split()
    return [int(pid) == KID, int(served)]
"#,
        )],
    );
    let snap = scratch().join("snap-worker");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "worker", "{}", &["--invocations", "3", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!([true, 2]); 3], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        let why = r["discarded"].as_str().unwrap_or_else(|| panic!("the reset was not refused: {r}"));
        assert!(why.contains("child processes were live"), "{why}");
    }
    let (answers, _) = restore_with(&snap, "worker-plain", "{}", &["--invocations", "2"]);
    assert_eq!(answers, vec![serde_json::json!([true, 2]), serde_json::json!([true, 3])]);
}

/// A /tmp file opened and then deleted at init is carried across the snapshot (made
/// again at its path, opened, unlinked). A call that writes it is reset: its contents
/// go back (rewritten through the descriptor), and every call reads them as the
/// snapshot had them.
#[test]
fn a_deleted_tmp_file_held_open_is_restored_and_reset() {
    let code = bundle(
        "tmp-deleted",
        &[(
            "handler.py",
            "import os\nFD = os.open('/tmp/scratch', os.O_RDWR | os.O_CREAT)\nos.write(FD, b'init')\nos.unlink('/tmp/scratch')\n\n\
             def handler(event, context):\n    seen = os.pread(FD, 100, 0).decode()\n    os.pwrite(FD, b'+call+call', 4)\n    \
             return [seen, os.path.exists('/tmp/scratch'), os.readlink('/proc/self/fd/%d' % FD)]\n",
        )],
    );
    let snap = scratch().join("snap-tmp-deleted");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "tmp-deleted", "{}", &["--invocations", "3", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!(["init", false, "/tmp/scratch (deleted)"]); 3], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        assert!(r.get("discarded").is_none(), "the reset was refused: {r}");
        assert_eq!(r["memfds_rewritten"], 1, "{r}");
    }
}

/// Memory a call releases after a reset (MADV_DONTNEED on private anonymous memory of
/// the image) reads as zeros, as the kernel says, in every call: the page server
/// followed the reset before applying the release. It did not: the release came before
/// any fault after the reset, and the first fault then forgot it with the reset's own
/// — the call read the image's bytes (7) from the second call on.
#[test]
fn memory_released_after_a_reset_reads_as_zeros() {
    let code = bundle(
        "released",
        &[(
            "handler.py",
            "import mmap\nBUF = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\nBUF.write(b'\\x07' * (1 << 20))\n\n\
             def handler(event, context):\n    BUF.madvise(mmap.MADV_DONTNEED)\n    seen = [BUF[0], BUF[len(BUF) // 2]]\n    BUF[0] = 9\n    return seen\n",
        )],
    );
    let snap = scratch().join("snap-released");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    for paging in ["lazy", "prefetch"] {
        let (answers, stats) = restore_with(&snap, &format!("released-{paging}"), "{}", &["--invocations", "5", "--reset", "--paging", paging]);
        assert_eq!(answers, vec![serde_json::json!([0, 0]); 5], "{paging}: {stats}");
        for r in stats["resets"].as_array().unwrap() {
            assert!(r.get("discarded").is_none(), "{paging}: the reset was refused: {r}");
        }
    }
}

/// A call that frees a large block its init allocated (malloc had mapped it: free()
/// unmaps it, a piece of the snapshot's anonymous memory) is reset, not refused: the
/// reset maps the memory back with the image's pages installed, so every call finds
/// the block as the init left it (and does not fault it in page by page).
#[test]
fn snapshot_memory_a_call_unmapped_is_mapped_back_by_the_reset() {
    let code = bundle(
        "unmapped",
        &[(
            "handler.py",
            "BLOCK = [bytearray(b'\\x05' * (3 << 20))]\n\n\
             def handler(event, context):\n    b = BLOCK[0]\n    seen = [len(b), b[0], b[len(b) // 2], b[-1]]\n    BLOCK[0] = None\n    del b\n    return seen\n",
        )],
    );
    let snap = scratch().join("snap-unmapped");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "unmapped", "{}", &["--invocations", "4", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!([3 << 20, 5, 5, 5]); 4], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        assert!(r.get("discarded").is_none(), "the reset was refused: {r}");
        assert!(r["mappings_remapped"].as_u64() >= Some(1), "nothing was mapped back: {r}");
        // Its pages are installed by the reset, not left to fault in during the call.
        assert!(r["pages_installed"].as_u64() >= Some(768), "the block's pages were not installed: {r}");
    }
}

/// A call that frees the blocks at the top of the heap its init allocated (malloc
/// trims the heap: brk shrinks, inside the snapshot's memory) is reset with the heap
/// grown back and the image's pages installed there by the reset: every call finds the
/// blocks as the init left them, and does not fault the top of the heap in page by
/// page (imagerotate's calls after a reset were 47% slower than warm ones for that).
#[test]
fn the_heap_a_call_trimmed_is_grown_back_with_its_pages_installed() {
    let code = bundle(
        "trimmed",
        &[(
            "handler.py",
            "import ctypes\n\
             LIBC = ctypes.CDLL(None)\n\
             LIBC.malloc.restype = ctypes.c_void_p\n\
             LIBC.free.argtypes = [ctypes.c_void_p]\n\
             # From the heap, not a mapping of its own (M_MMAP_THRESHOLD): its top.\n\
             LIBC.mallopt(-3, 64 << 20)\n\
             N = 3 << 20\n\
             BLOCK = LIBC.malloc(N)\n\
             ctypes.memset(BLOCK, 7, N)\n\n\
             def handler(event, context):\n    seen = [ctypes.string_at(BLOCK, 1)[0], ctypes.string_at(BLOCK + N - 1, 1)[0]]\n    LIBC.free(BLOCK)\n    return seen\n",
        )],
    );
    let snap = scratch().join("snap-trimmed");
    // A full image: the heap's top is the function's own allocations.
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--no-base", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "trimmed", "{}", &["--invocations", "4", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!([7, 7]); 4], "{stats}");
    for r in stats["resets"].as_array().unwrap() {
        assert!(r.get("discarded").is_none(), "the reset was refused: {r}");
        assert_eq!(r["mappings_remapped"], 0, "{r}");
        // 3 MiB freed at the heap's top, installed by the reset.
        assert!(r["pages_installed"].as_u64() >= Some(512), "the heap's pages were not installed: {r}");
    }
}

/// Pages every call writes are left writable by the resets (no fault on the next
/// call's first write to each), and rewritten by every reset all the same: no call
/// sees what the previous one wrote, also across the resets that learn them again.
#[test]
fn pages_every_call_writes_stay_writable_and_are_still_reset() {
    let code = bundle(
        "hot",
        &[(
            "handler.py",
            "BUF = bytearray(b'i' * (64 * 4096))\n\n\
             def handler(event, context):\n    seen = chr(BUF[0]) + chr(BUF[len(BUF) // 2]) + chr(BUF[-1])\n    BUF[:] = b'x' * len(BUF)\n    return seen\n",
        )],
    );
    let snap = scratch().join("snap-hot");
    ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let (answers, stats) = restore_with(&snap, "hot", "{}", &["--invocations", "24", "--reset"]);
    assert_eq!(answers, vec![serde_json::json!("iii"); 24], "{stats}");
    let resets = stats["resets"].as_array().unwrap();
    assert!(resets.iter().all(|r| r.get("discarded").is_none()), "a reset was refused: {stats}");
    let writable: Vec<u64> = resets.iter().map(|r| r["pages_left_writable"].as_u64().unwrap()).collect();
    assert!(writable.iter().filter(|&&n| n >= 64).count() >= 16, "the buffer's pages were not left writable: {writable:?}");
    assert!(writable.contains(&0), "no reset learned them again: {writable:?}");
}

/// A Python function (b_mod.handler) that reports what it sees of another's canaries
/// (the reversed `tag` of its event): its module, environment, /tmp, threads, children,
/// and any object in its heap holding the canary.
fn canary_seeker(name: &str) -> PathBuf {
    bundle(
        name,
        &[(
            "b_mod.py",
            concat!(
                "import gc, os, sys, threading\n",
                "def handler(event, context):\n",
                "    canary = event['tag'][::-1]\n",
                "    seen = any(isinstance(o, str) and canary in o for o in gc.get_objects())\n",
                "    seen = seen or any(isinstance(v, str) and canary in v for o in gc.get_objects() if isinstance(o, list) for v in o)\n",
                "    return {'fn': 'B', 'cwd': sorted(os.listdir('.')), 'task': sorted(os.listdir('/var/task')),\n",
                "            'a_module': 'a_mod' in sys.modules, 'env': 'LEFT_BY_A' in os.environ, 'tmp': sorted(os.listdir('/tmp')),\n",
                "            'threads': threading.active_count(), 'children': [p for p in os.listdir('/proc') if p.isdigit() and p not in ('1', str(os.getpid()))],\n",
                "            'canary_in_heap': seen}\n",
            ),
        )],
    )
}

/// Issue #30, repurposing: one instance of the Python base serves three functions in
/// turn (`thaw base repurpose`), reset to the base between them. The second function
/// sees its own code at /var/task and in its cwd, and nothing of the first: not its
/// module, globals, environment, threads, children or /tmp files, and no object in its
/// heap holds the first one's canary. The first function, served again, starts from
/// its init, not from its previous call's state.
#[test]
fn one_base_instance_serves_functions_in_turn_and_each_sees_nothing_of_the_others() {
    let a = bundle(
        "repurpose-a",
        &[
            ("a_mod.py", concat!(
                "import os, subprocess, threading, time\n",
                "CALLS = 0\n",
                "KEEP = []\n",
                "def handler(event, context):\n",
                "    global CALLS\n",
                "    CALLS += 1\n",
                "    canary = event['tag'][::-1]\n",
                "    KEEP.append(canary * 3)\n",
                "    os.environ['LEFT_BY_A'] = canary\n",
                "    open('/tmp/left-by-a', 'w').write(canary)\n",
                "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
                "    subprocess.Popen(['sleep', '60'])\n",
                "    return {'fn': 'A', 'calls': CALLS, 'cwd': sorted(os.listdir('.'))}\n",
            )),
            ("a-only.txt", "A's file\n"),
        ],
    );
    let b = canary_seeker("repurpose-b");
    let tag = "yranac-esoprup";
    let calls = serde_json::json!([
        {"code": a, "handler": "a_mod.handler", "payload": {"tag": tag}},
        {"code": a, "handler": "a_mod.handler", "payload": {"tag": tag}},
        {"code": b, "handler": "b_mod.handler", "payload": {"tag": tag}},
        {"code": common::sample("helloworld"), "handler": "handler.handler", "payload": {"name": "third"}},
        {"code": a, "handler": "a_mod.handler", "payload": {"tag": tag}},
    ]);
    let file = scratch().join("repurpose-calls.json");
    std::fs::write(&file, calls.to_string()).unwrap();
    let out = stdout(&ok(thaw(&["base", "repurpose", "--calls", file.to_str().unwrap()])));
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5, "{out}");
    let r = |i: usize| &lines[i]["response"];
    assert_eq!(r(0), &serde_json::json!({"fn": "A", "calls": 1, "cwd": ["a-only.txt", "a_mod.py"]}), "{out}");
    // The same function again: a warm call, not repurposed.
    assert_eq!(r(1)["calls"], 2, "{out}");
    assert!(lines[1].get("load_ms").is_none() && lines[1].get("reset_ms").is_none(), "{out}");
    let want_b = serde_json::json!({"fn": "B", "cwd": ["b_mod.py"], "task": ["b_mod.py"], "a_module": false, "env": false,
        "tmp": [], "threads": 1, "children": [], "canary_in_heap": false});
    assert_eq!(r(2), &want_b, "{out}");
    assert_eq!(r(3), &serde_json::json!({"message": "hello, third"}), "{out}");
    // A again: its init ran again; nothing of its two earlier calls is left.
    assert_eq!(r(4)["calls"], 1, "{out}");
    for (i, l) in lines.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert!(l["code_ms"].as_f64().is_some() && l["load_ms"].as_f64().is_some(), "call {i} was repurposed: {l}");
        assert_eq!(l.get("reset_ms").is_some(), i > 0, "call {i}: reset to the base before it: {l}");
    }
}

/// SnapFaaS's "base only" (bench/layers.py's base-import mode): a base instance that
/// loads one function, once, tracks no writes, and its restore up to the load is
/// recorded as the base's working set (never what the function touched), so the next
/// such start prefetches the base. A data directory of its own: a fresh base.
#[test]
fn a_base_instance_loading_one_function_records_the_bases_working_set_and_prefetches_it_next() {
    let data = scratch().join("base-only-data");
    let data = data.to_str().unwrap();
    let calls = scratch().join("base-only-calls.json");
    let call = serde_json::json!({"code": common::sample("helloworld"), "handler": "handler.handler", "payload": {"name": "base only"}});
    std::fs::write(&calls, serde_json::json!([call]).to_string()).unwrap();
    let first_line = || -> serde_json::Value {
        let out = stdout(&ok(common::thaw_env(&[("THAW_DATA_DIR", data)], &["base", "repurpose", "--calls", calls.to_str().unwrap()]))).to_string();
        serde_json::from_str(out.lines().next().unwrap()).unwrap()
    };
    let first = first_line();
    assert_eq!((&first["base_paging"], &first["tracks_writes"]), (&serde_json::json!("record"), &serde_json::json!(false)), "{first}");
    assert_eq!(first["response"], serde_json::json!({"message": "hello, base only"}), "{first}");
    let bases: Vec<_> = std::fs::read_dir(std::path::Path::new(data).join("bases")).unwrap().flatten().filter(|e| e.path().join("base.json").is_file()).collect();
    assert_eq!(bases.len(), 1);
    let recorded = std::fs::metadata(bases[0].path().join("ws.trace")).expect("the base's working set").len();
    let second = first_line();
    assert_eq!((&second["base_paging"], &second["how"]), (&serde_json::json!("prefetch"), &serde_json::json!("repurposed")), "{second}");
    assert_eq!(second["response"], first["response"]);
    // A prefetching base instance does not extend the base's working set with the function's pages.
    assert_eq!(std::fs::metadata(bases[0].path().join("ws.trace")).unwrap().len(), recorded);
}

/// Issue #30, repurposing by diff: functions snapshotted as diffs on the Python base
/// are installed into one base instance in turn (their pages and state; their init
/// does not run again: a value drawn at init is the one their snapshot holds), reset to
/// the base between them. A function whose init imported a C extension (new file
/// mappings) and grew the heap answers correctly; the next one sees nothing of it;
/// a function loaded from its code in between still works.
#[test]
fn diffs_are_installed_into_one_base_instance_in_turn() {
    let a = bundle(
        "install-a",
        &[(
            "a_mod.py",
            concat!(
                "import hashlib, os, subprocess, threading, time\n",
                "TOKEN = os.urandom(8).hex()\n",
                "TABLE = [str(i) * 50 for i in range(20000)]\n",
                "CALLS = 0\n",
                "KEEP = []\n",
                "def handler(event, context):\n",
                "    global CALLS\n",
                "    CALLS += 1\n",
                "    canary = event['tag'][::-1]\n",
                "    KEEP.append(canary * 3)\n",
                "    os.environ['LEFT_BY_A'] = canary\n",
                "    open('/tmp/left-by-a', 'w').write(canary)\n",
                "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
                "    subprocess.Popen(['sleep', '60'])\n",
                "    return {'fn': 'A', 'token': TOKEN, 'calls': CALLS, 'rows': len(TABLE), 'cwd': sorted(os.listdir('.')),\n",
                "            'sha': hashlib.sha256(TABLE[-1].encode()).hexdigest()[:12]}\n",
            ),
        )],
    );
    let b = canary_seeker("install-b");
    let snap = |code: &std::path::Path, handler: &str, name: &str| {
        let out = scratch().join(name);
        let _ = std::fs::remove_dir_all(&out);
        let created = stdout(&ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", handler, "--out", out.to_str().unwrap()])));
        assert!(created.contains("\"base\":\""), "a diff on the Python base: {created}");
        out
    };
    let (sa, sb) = (snap(&a, "a_mod.handler", "install-a-snap"), snap(&b, "b_mod.handler", "install-b-snap"));
    let tag = "yranac-llatsni";
    let payload = serde_json::json!({"tag": tag}).to_string();
    let restored = stdout(&ok(thaw(&["snapshot", "restore", sa.to_str().unwrap(), "--payload", &payload, "--quiet"])));
    let restored: serde_json::Value = serde_json::from_str(restored.lines().next().unwrap()).unwrap();
    let calls = serde_json::json!([
        {"snapshot": sa, "payload": {"tag": tag}},
        {"snapshot": sa, "payload": {"tag": tag}},
        {"snapshot": sb, "payload": {"tag": tag}},
        {"code": common::sample("helloworld"), "handler": "handler.handler", "payload": {"name": "loaded"}},
        {"snapshot": sa, "payload": {"tag": tag}},
    ]);
    let file = scratch().join("install-calls.json");
    std::fs::write(&file, calls.to_string()).unwrap();
    let out = stdout(&ok(thaw(&["base", "repurpose", "--calls", file.to_str().unwrap()])));
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5, "{out}");
    let r = |i: usize| &lines[i]["response"];
    for i in [0, 2, 4] {
        assert_eq!(lines[i]["how"], "repurposed-diff", "call {i} installed its diff: {}", lines[i]);
    }
    assert_eq!(lines[3]["how"], "repurposed", "{out}");
    // Installed, not loaded: the value drawn at init is the snapshot's.
    assert_eq!(r(0), &restored, "the installed instance answers as a restore of the diff: {out}");
    assert_eq!((r(0)["calls"].as_u64(), r(0)["rows"].as_u64()), (Some(1), Some(20000)), "{out}");
    assert_eq!(r(1)["calls"], 2, "{out}");
    let want_b = serde_json::json!({"fn": "B", "cwd": ["b_mod.py"], "task": ["b_mod.py"], "a_module": false, "env": false,
        "tmp": [], "threads": 1, "children": [], "canary_in_heap": false});
    assert_eq!(r(2), &want_b, "{out}");
    assert_eq!(r(3), &serde_json::json!({"message": "hello, loaded"}), "{out}");
    // A again: from its snapshot, nothing of its two earlier calls left.
    assert_eq!(r(4), &restored, "{out}");
}

/// Issue #30, the differential check of repurposing by diff: an instance of the base
/// with a function's diff installed and a fresh restore of that diff, both at the
/// ready point, have the same layout (page by page: protection, file, offset), page
/// contents, registers, FPU state, descriptors and signal state. Python pyaes (its
/// init mapped a C extension and grew the heap): every fact. Node.js jsontransform
/// (libuv's epoll registrations, V8's protection changes): every fact but the pages
/// the runtime rewrites when told it is a restored clone (it reseeds) and its threads'
/// registers, which differ from clone to clone. (In both, the pages holding a thread's
/// rseq area, where the kernel writes the CPU it runs on, are set aside.)
#[test]
fn an_installed_diff_is_a_fresh_restore_fact_for_fact() {
    type Facts = std::collections::BTreeMap<String, String>;
    let normal = |k: &str, v: &str| -> String {
        let v = v.trim_end_matches(" written");
        if k.starts_with("fd:") {
            // Pipe and socket inode numbers are each process's own.
            let mut out = String::new();
            let mut digits = false;
            for c in v.chars() {
                if c.is_ascii_digit() && (digits || out.ends_with('[')) {
                    digits = true;
                    continue;
                }
                digits = false;
                out.push(c);
            }
            return out;
        }
        v.to_string()
    };
    // map:START = "END perms offset dev inode name", as one entry per page (the kernel
    // may split or merge mappings differently; what each page is must match).
    let layout = |f: &Facts| -> std::collections::BTreeMap<u64, String> {
        let mut out = std::collections::BTreeMap::new();
        for (k, v) in f.iter().filter(|(k, _)| k.starts_with("map:")) {
            let start = u64::from_str_radix(k.trim_start_matches("map:0x"), 16).unwrap();
            let p: Vec<&str> = v.split_whitespace().collect();
            let end = u64::from_str_radix(p[0].trim_start_matches("0x"), 16).unwrap();
            let off = u64::from_str_radix(p[2].trim_start_matches("0x"), 16).unwrap();
            for (i, page) in (start..end).step_by(4096).enumerate() {
                let at = if p[4] == "0" { 0 } else { off + i as u64 * 4096 };
                out.insert(page, format!("{} {} {} {at:#x}", p[1], p.get(5).unwrap_or(&""), p[4]));
            }
        }
        out
    };
    let check = |name: &str, runtime: &str, code: PathBuf, handler: &str, strict_pages: bool| {
        let snap = scratch().join(format!("facts-{name}"));
        let _ = std::fs::remove_dir_all(&snap);
        ok(thaw(&["snapshot", "create", "--runtime", runtime, "--code", code.to_str().unwrap(), "--handler", handler, "--out", snap.to_str().unwrap()]));
        let (fresh_dir, installed_dir) = (scratch().join(format!("facts-{name}-fresh")), scratch().join(format!("facts-{name}-installed")));
        for d in [&fresh_dir, &installed_dir] {
            let _ = std::fs::remove_dir_all(d);
        }
        ok(thaw(&["snapshot", "restore", snap.to_str().unwrap(), "--payload", "{}", "--quiet", "--dump-state", fresh_dir.to_str().unwrap()]));
        let calls = scratch().join(format!("facts-{name}-calls.json"));
        std::fs::write(&calls, serde_json::json!([{"snapshot": snap, "payload": {}}]).to_string()).unwrap();
        let out = stdout(&ok(thaw(&["base", "repurpose", "--runtime", runtime, "--calls", calls.to_str().unwrap(), "--dump-state", installed_dir.to_str().unwrap()])));
        assert!(out.contains("\"how\":\"repurposed-diff\""), "{name}: installed: {out}");
        let read = |d: &std::path::Path| -> Facts { serde_json::from_slice(&std::fs::read(d.join("state-0.json")).unwrap()).unwrap() };
        let (fresh, installed) = (read(&fresh_dir), read(&installed_dir));
        assert!(fresh.keys().filter(|k| k.starts_with("page:")).count() > 1000 && fresh.keys().any(|k| k.ends_with(":rip")), "{name}: too little read");
        let (la, lb) = (layout(&fresh), layout(&installed));
        // A runtime's own threads run on after the restore notice and change the
        // protection of a page or two of their anonymous memory when they get to it (a
        // JVM's safepoint polling and guard pages: rw-p in one clone, ---p in the other
        // under load); where those threads are set aside, so are a few such pages.
        let runtime_toggled = |a: &str, b: &str| {
            let (a, b): (Vec<&str>, Vec<&str>) = (a.split(' ').collect(), b.split(' ').collect());
            !strict_pages && a.len() == b.len() && a[1..] == b[1..] && a.get(2) == Some(&"0")
        };
        let moved: Vec<String> = la.keys().chain(lb.keys()).collect::<std::collections::BTreeSet<_>>().into_iter()
            .filter(|p| la.get(p) != lb.get(p))
            .map(|p| format!("{p:#x}: {:?} -> {:?}", la.get(p), lb.get(p)))
            .collect();
        let toggled = la.iter().filter(|(p, a)| lb.get(p).is_some_and(|b| b != *a && runtime_toggled(a, b))).count();
        assert!(moved.len() == toggled && toggled <= 4, "{name}: the layout differs from a fresh restore's: {:#?}", &moved[..moved.len().min(10)]);
        // The kernel writes the CPU a thread runs on into its rseq area, in its TCB (at
        // fs_base), whenever it schedules it: those pages differ from clone to clone.
        let tcb_pages = common::tcb_pages(&fresh);
        // Helper threads (V8's workers) run on after the restore notice: their registers
        // and FPU state are where they stopped, clone by clone (as reset.rs's check).
        let helper_state = |k: &str| !strict_pages && k.starts_with("thread:") && !k.ends_with(":sigmask") && !k.ends_with(":SigPnd") && !k.ends_with(":SigBlk");
        let differs: Vec<String> = fresh.keys().chain(installed.keys()).collect::<std::collections::BTreeSet<_>>().into_iter()
            .filter(|k| !k.starts_with("map:") && (strict_pages || !k.starts_with("page:")) && !tcb_pages.contains(k) && !helper_state(k))
            .filter(|k| fresh.get(*k).map(|v| normal(k, v)) != installed.get(*k).map(|v| normal(k, v)))
            .map(|k| format!("{k}: {:?} -> {:?}", fresh.get(k), installed.get(k)))
            .collect();
        assert!(differs.is_empty(), "{name}: {} facts differ from a fresh restore's: {:#?}", differs.len(), &differs[..differs.len().min(20)]);
    };
    check("pyaes", "python3", common::sample("pyaes"), "handler.handler", true);
    check("nodejs-jsontransform", "nodejs20.x", common::root().join("build/samples/nodejs/jsontransform"), "index.handler", false);
    // The JVM's threads (GC, compiler) run on after the restore notice, as V8's do.
    check("java-jsonhandler", "java17", common::root().join("build/samples/java/jsonhandler"), "example.Orders", false);
}

/// Issue #30: Java diffs installed into one instance of the Java base in turn. The
/// JVM's threads run on after the base's restore (their pages take the diff's
/// contents); its init moved a jar's offset and opened the function's jars (opened
/// again at the same descriptors). Each answers as it would restored.
#[test]
fn java_diffs_are_installed_into_one_base_instance_in_turn() {
    let java = common::root().join("build/samples/java");
    let snap = |name: &str, handler: &str| {
        let out = scratch().join(format!("install-java-{name}"));
        let _ = std::fs::remove_dir_all(&out);
        ok(thaw(&["snapshot", "create", "--runtime", "java17", "--code", java.join(name).to_str().unwrap(), "--handler", handler, "--out", out.to_str().unwrap()]));
        out
    };
    let (hello, json) = (snap("helloworld", "example.Hello"), snap("jsonhandler", "example.Orders"));
    let calls = serde_json::json!([
        {"snapshot": hello, "payload": {"name": "one"}},
        {"snapshot": json, "payload": {}},
        {"snapshot": hello, "payload": {"name": "two"}},
    ]);
    let file = scratch().join("install-java-calls.json");
    std::fs::write(&file, calls.to_string()).unwrap();
    let out = stdout(&ok(thaw(&["base", "repurpose", "--runtime", "java17", "--calls", file.to_str().unwrap()])));
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{out}");
    for l in &lines {
        assert_eq!(l["how"], "repurposed-diff", "installed: {l}");
    }
    assert_eq!(lines[0]["response"], "Hello, one!", "{out}");
    assert_eq!(lines[1]["response"], serde_json::json!({"canonical": "{}", "orders": 0, "totalByRegion": {}}), "{out}");
    assert_eq!(lines[2]["response"], "Hello, two!", "{out}");
}

/// Repurposing with the Node.js base: a function served again after another starts
/// from its init, sees its own code at /var/task and in its cwd, and nothing the
/// previous tenant left in /tmp or in the global object.
#[test]
fn one_nodejs_base_instance_serves_functions_in_turn() {
    let a = bundle(
        "repurpose-node-a",
        &[("index.js", concat!(
            "const fs = require('fs');\n",
            "let calls = 0;\n",
            "exports.handler = async () => {\n",
            "  calls += 1;\n",
            "  const seen = { left: globalThis.LEFT_BY_A || null, tmp: fs.readdirSync('/tmp').sort() };\n",
            "  globalThis.LEFT_BY_A = 'canary';\n",
            "  fs.writeFileSync('/tmp/left-by-a', 'x');\n",
            "  return { calls, seen, cwd: fs.readdirSync('.').sort(), task: fs.readdirSync('/var/task').sort() };\n",
            "};\n",
        ))],
    );
    let hello = common::root().join("build/samples/nodejs/helloworld");
    // A's snapshot, a diff on the Node.js base: installed, then reset away for a load.
    let sa = scratch().join("repurpose-node-a-snap");
    let _ = std::fs::remove_dir_all(&sa);
    ok(thaw(&["snapshot", "create", "--runtime", "nodejs20.x", "--code", a.to_str().unwrap(), "--handler", "index.handler", "--out", sa.to_str().unwrap()]));
    let calls = serde_json::json!([
        {"code": a, "handler": "index.handler", "payload": {}},
        {"code": hello, "handler": "index.handler", "payload": {"name": "n"}},
        {"code": a, "handler": "index.handler", "payload": {}},
        {"snapshot": sa, "payload": {}},
        {"code": hello, "handler": "index.handler", "payload": {"name": "m"}},
    ]);
    let file = scratch().join("repurpose-node-calls.json");
    std::fs::write(&file, calls.to_string()).unwrap();
    let out = stdout(&ok(thaw(&["base", "repurpose", "--runtime", "nodejs20.x", "--calls", file.to_str().unwrap()])));
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let fresh = serde_json::json!({"calls": 1, "seen": {"left": null, "tmp": []}, "cwd": ["index.js"], "task": ["index.js"]});
    assert_eq!(lines[0]["response"], fresh, "{out}");
    assert_eq!(lines[1]["response"]["message"], "Hello, n!", "{out}");
    assert_eq!(lines[2]["response"], fresh, "A again starts from its init and sees nothing of its first call: {out}");
    assert_eq!(lines[3]["how"], "repurposed-diff", "A's diff installed (libuv's epoll registrations with it): {out}");
    assert_eq!(lines[3]["response"], fresh, "{out}");
    assert_eq!(lines[4]["response"]["message"], "Hello, m!", "reset to the base after an install: {out}");
}
