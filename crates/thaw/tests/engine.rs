//! End-to-end tests of the snapshot engine through the `thaw` CLI, as root.
//!
//! They need the sample functions built by `scripts/build-samples.sh` (the
//! test script runs it). Each test asserts results, paging figures or exact
//! error messages; none asserts timings (those belong to the benchmarks).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{bundle, ok, sample, scratch, stderr, stdout, thaw};

/// Create (once per name) a snapshot of a sample function.
fn snapshot(name: &str, memory: u32) -> PathBuf {
    static SNAPS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut snaps = SNAPS.lock().unwrap();
    if let Some((_, p)) = snaps.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let out = scratch().join(format!("snap-{name}"));
    let code = sample(name);
    ok(thaw(&[
        "snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler",
        "--memory", &memory.to_string(), "--out", out.to_str().unwrap(),
    ]));
    snaps.push((name.to_string(), out.clone()));
    out
}

fn boot(name: &str, payload: &str) -> Output {
    let code = sample(name);
    thaw(&["boot", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--memory", "1024", "--payload", payload, "--quiet"])
}

fn restore(snap: &Path, payload: &str, extra: &[&str]) -> Output {
    let mut args = vec!["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--quiet"];
    args.extend_from_slice(extra);
    thaw(&args)
}

fn restore_stats(snap: &Path, payload: &str, extra: &[&str]) -> (String, serde_json::Value) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let f = scratch().join(format!("stats-{}.json", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--stats", f.to_str().unwrap()]);
    let o = ok(restore(snap, payload, &args));
    let stats = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
    (stdout(&o), stats)
}

#[test]
fn restored_results_equal_cold_boot_results() {
    for (name, payloads) in [
        ("helloworld", vec![r#"{"name":"a"}"#, r#"{}"#, r#"{"name":"ünïcødé ✓"}"#]),
        ("stdlib", vec![r#"{"text":"the quick brown fox","items":[["apple","1.25"],["pear","0.10"]]}"#, r#"{}"#, r#"{"n":17}"#]),
    ] {
        let snap = snapshot(name, 512);
        // The interpreter's written relro/.data segments are stored whole and served lazily.
        let inspect: serde_json::Value = serde_json::from_slice(&ok(thaw(&["snapshot", "inspect", snap.to_str().unwrap()])).stdout).unwrap();
        assert!(inspect["vma_kinds"]["file_copied"].as_u64().unwrap() > 0, "{}", inspect["vma_kinds"]);
        for p in payloads {
            let booted = stdout(&ok(boot(name, p)));
            let lazy = stdout(&ok(restore(&snap, p, &["--paging", "lazy"])));
            let eager = stdout(&ok(restore(&snap, p, &["--paging", "eager"])));
            let one_page = stdout(&ok(restore(&snap, p, &["--paging", "lazy", "--readaround-kb", "4"])));
            assert!(!booted.trim().is_empty());
            assert_eq!(booted, lazy, "{name} {p}: lazy restore differs from boot");
            assert_eq!(booted, one_page, "{name} {p}: lazy restore without read-around differs from boot");
            assert_eq!(booted, eager, "{name} {p}: eager restore differs from boot");
        }
    }
}

#[test]
fn module_state_continues_over_many_invocations() {
    let snap = snapshot("counter", 512);
    let out = stdout(&ok(restore(&snap, "{}", &["--invocations", "60"])));
    let counts: Vec<u64> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["count"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, (1..=60).collect::<Vec<_>>());
    // A cold boot's first call sees the same state as a restored instance's first call.
    assert_eq!(stdout(&ok(boot("counter", "{}"))), format!("{}\n", out.lines().next().unwrap()));
}

#[test]
fn lazy_restore_reads_only_touched_pages_of_a_200mb_heap() {
    let snap = snapshot("bigheap", 1024);
    let inspect: serde_json::Value = serde_json::from_slice(&ok(thaw(&["snapshot", "inspect", snap.to_str().unwrap()])).stdout).unwrap();
    let stored = inspect["stored_bytes"].as_u64().unwrap();
    assert!(stored > 200 << 20, "image should hold the 200 MB heap, has {stored}");

    let (lazy_out, lazy) = restore_stats(&snap, r#"{"i":5}"#, &["--paging", "lazy"]);
    let read = lazy["bytes_read_from_image"].as_u64().unwrap();
    assert!(read < 32 << 20, "lazy restore read {read} bytes of a {stored}-byte image");
    assert!(lazy["page_faults"].as_u64().unwrap() > 0);

    // Without read-around a lazy restore reads exactly the pages it faults on.
    let (page_out, page) = restore_stats(&snap, r#"{"i":5}"#, &["--paging", "lazy", "--readaround-kb", "4"]);
    let page_read = page["bytes_read_from_image"].as_u64().unwrap();
    let stored_faults = page["page_faults"].as_u64().unwrap() - page["zero_faults"].as_u64().unwrap();
    let upfront = page["pages_installed_upfront"].as_u64().unwrap();
    assert_eq!(page_read, (stored_faults + upfront) * 4096, "{page}");
    assert!(page_read <= read, "one page per fault read {page_read}, read-around {read}");
    assert_eq!(page_out, lazy_out);

    let (eager_out, eager) = restore_stats(&snap, r#"{"i":5}"#, &["--paging", "eager"]);
    assert!(eager["bytes_read_from_image"].as_u64().unwrap() >= stored, "eager must install every stored page");
    // Memory follows: the lazy instance was never charged for the heap it did not touch.
    let peak = |s: &serde_json::Value| s["memory_peak_bytes"].as_u64().unwrap();
    assert!(peak(&eager) > peak(&lazy) + (150 << 20), "peak memory: eager {} lazy {}", peak(&eager), peak(&lazy));
    assert_eq!(lazy_out, eager_out);
    assert_eq!(lazy_out, stdout(&ok(boot("bigheap", r#"{"i":5}"#))));
}

#[test]
fn two_instances_from_one_image_do_not_interfere() {
    let snap = snapshot("counter", 512);
    let spawn = move || {
        Command::new(env!("CARGO_BIN_EXE_thaw"))
            .env("THAW_DATA_DIR", scratch().join("data"))
            .args(["snapshot", "restore", snap.to_str().unwrap(), "--invocations", "25", "--quiet"])
            .output()
    };
    let a = std::thread::spawn(spawn.clone());
    let b = std::thread::spawn(spawn);
    let (a, b) = (ok(a.join().unwrap().unwrap()), ok(b.join().unwrap().unwrap()));
    let expect: String = (1..=25).map(|i| format!("{{\"count\": {i}}}\n")).collect();
    assert_eq!(stdout(&a), expect);
    assert_eq!(stdout(&b), expect);
}

#[test]
fn function_errors_are_reported_as_lambda_error_objects() {
    let snap = snapshot("error", 512);
    for o in [boot("error", r#"{"fail":"x"}"#), restore(&snap, r#"{"fail":"x"}"#, &[])] {
        assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["errorType"], "ValueError");
        assert!(v["errorMessage"].as_str().unwrap().contains("bad input"));
        assert!(v["stackTrace"].as_array().unwrap().len() > 0);
    }
    // The instance survives a function error.
    let o = restore(&snap, r#"{}"#, &["--invocations", "2"]);
    assert_eq!(stdout(&ok(o)), "{\"ok\": true}\n{\"ok\": true}\n");
}

#[test]
fn init_errors_and_bad_input_are_refused_clearly() {
    let dir = scratch().join("snap-initerror");
    let code = sample("initerror");
    let o = thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("function init failed: RuntimeError"), "{}", stderr(&o));
    assert!(!dir.exists(), "a failed capture must leave no snapshot");

    let hello = sample("helloworld");
    let o = thaw(&["boot", "--code", hello.to_str().unwrap(), "--handler", "handler.nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("function init failed: Runtime.HandlerNotFound"), "{}", stderr(&o));

    let o = thaw(&["boot", "--code", hello.to_str().unwrap(), "--handler", "handler.handler", "--payload", "{not json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("thaw: error: payload is not valid JSON: "), "{}", stderr(&o));

    let o = thaw(&["boot", "--code", "/nonexistent/code", "--handler", "handler.handler"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("thaw: error: function code directory /nonexistent/code: No such file"), "{}", stderr(&o));

    let o = thaw(&["boot", "--code", hello.to_str().unwrap(), "--handler", "handler.handler", "--runtime", "cobol"]);
    assert_eq!(stderr(&o), "thaw: error: unknown runtime 'cobol' (supported: python3, python3.11, nodejs20.x, java17, provided.al2023)\n");
}

#[test]
fn an_open_tcp_connection_is_refused_at_capture() {
    let code = bundle(
        "tcp-code",
        &[(
            "handler.py",
            "import socket\nsrv = socket.socket()\nsrv.bind(('127.0.0.1', 0))\nsrv.listen()\n\
             conn = socket.create_connection(srv.getsockname())\n\ndef handler(event, context):\n    return 1\n",
        )],
    );
    let out = scratch().join("snap-tcp");
    let o = thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("cannot capture pid"), "{e}");
    assert!(e.contains("is an open TCP socket"), "{e}");
    assert!(e.contains("network connections cannot be carried across a snapshot"), "{e}");
    assert!(!out.exists());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn corrupt_or_truncated_images_are_rejected() {
    let snap = snapshot("helloworld", 512);

    let bad = scratch().join("snap-bad-state");
    copy_dir(&snap, &bad);
    let mut st = std::fs::read(bad.join("state.bin")).unwrap();
    let mid = st.len() / 2;
    st[mid] ^= 0x55;
    std::fs::write(bad.join("state.bin"), &st).unwrap();
    let o = restore(&bad, "{}", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("state.bin is truncated or corrupt (checksum mismatch"), "{}", stderr(&o));

    let trunc = scratch().join("snap-truncated");
    copy_dir(&snap, &trunc);
    let f = std::fs::OpenOptions::new().write(true).open(trunc.join("pages.img")).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 4096).unwrap();
    let o = restore(&trunc, "{}", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(&format!("pages.img is truncated or corrupt (size is {} bytes, the index needs {len})", len - 4096)), "{}", stderr(&o));

    // Same size, every byte flipped: the first page read fails its checksum and the
    // instance is never allowed to run on it.
    let flipped = scratch().join("snap-flipped");
    copy_dir(&snap, &flipped);
    let pages: Vec<u8> = std::fs::read(flipped.join("pages.img")).unwrap().iter().map(|b| !b).collect();
    std::fs::write(flipped.join("pages.img"), pages).unwrap();
    for paging in ["lazy", "eager"] {
        let o = restore(&flipped, "{}", &["--paging", paging]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("failed its checksum: the image is corrupt"), "{paging}: {}", stderr(&o));
        assert!(stdout(&o).is_empty());
    }

    let o = restore(&scratch().join("no-such-snapshot"), "{}", &[]);
    assert!(stderr(&o).contains("cannot read state.bin: No such file or directory"), "{}", stderr(&o));

    // Creating over an existing snapshot is refused and leaves it intact.
    let code = sample("helloworld");
    let o = thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    ok(restore(&snap, "{}", &[]));
}

#[test]
fn a_restored_instance_dies_with_its_page_server() {
    let code = bundle(
        "sleep-code",
        &[("handler.py", "import time\nBIG = bytearray(b'x' * (8 << 20))\n\ndef handler(event, context):\n    time.sleep(30)\n    return len(BIG)\n")],
    );
    let snap = scratch().join("snap-sleep");
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let mut node = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .env("THAW_DATA_DIR", scratch().join("data"))
        .args(["snapshot", "restore", snap.to_str().unwrap(), "--paging", "lazy", "--quiet"])
        .spawn()
        .unwrap();
    // Find the instance: PID 2 of its sandbox, the child of the sandbox's init (the
    // child of the node's process).
    let children = |pid: u32| -> Vec<i32> {
        let mut out = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(c.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
            }
        }
        out
    };
    let mut inst = None;
    for _ in 0..500 {
        if let Some(&p) = children(node.id()).first().and_then(|&init| children(init as u32).first().copied()).as_ref() {
            // Restored and running the handler: its comm is python's.
            if std::fs::read_to_string(format!("/proc/{p}/comm")).map(|c| c.starts_with("python")).unwrap_or(false) {
                inst = Some(p);
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let inst = inst.expect("restored instance not found");
    std::thread::sleep(std::time::Duration::from_millis(200));
    node.kill().unwrap();
    node.wait().unwrap();
    let mut gone = false;
    for _ in 0..300 {
        let state = std::fs::read_to_string(format!("/proc/{inst}/stat")).ok();
        // Gone, or a zombie waiting for a reaper.
        if state.as_deref().map_or(true, |s| s.split_whitespace().nth(2) == Some("Z")) {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(gone, "instance {inst} outlived its node and page server");
}

#[test]
fn only_instances_booted_for_a_snapshot_are_told_so() {
    // The runtimes warm up their own paths only when THAW_SNAPSHOT=1 (see the Java and
    // Node.js shims); a plain cold boot must not pay for it, and a user cannot set it.
    let code = bundle("snapshot-env", &[("handler.py", "import os\n\ndef handler(event, context):\n    return os.environ.get('THAW_SNAPSHOT')\n")]);
    let c = code.to_str().unwrap();
    let booted = ok(thaw(&["boot", "--code", c, "--handler", "handler.handler", "--env", "THAW_SNAPSHOT=1", "--payload", "{}", "--quiet"]));
    assert_eq!(stdout(&booted).trim(), "null");
    let snap = scratch().join("snap-snapshot-env");
    ok(thaw(&["snapshot", "create", "--no-base", "--code", c, "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    assert_eq!(stdout(&ok(restore(&snap, "{}", &[]))).trim(), "\"1\"");
}

/// A static sandbox init beside `thaw` that is stale (the sandbox crate changed since
/// scripts/build-init.sh made it) is passed over for the glibc one, with a warning that
/// says how to rebuild it; the start works either way.
#[test]
fn a_stale_static_init_is_passed_over_with_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let bin = Path::new(env!("CARGO_BIN_EXE_thaw"));
    let dir = scratch().join("stale-init");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["thaw", "thaw-sandbox-init"] {
        let from = bin.with_file_name(name);
        if std::fs::hard_link(&from, dir.join(name)).is_err() {
            std::fs::copy(&from, dir.join(name)).unwrap();
        }
    }
    let stale = dir.join("thaw-sandbox-init-static");
    std::fs::write(&stale, "#!/bin/sh\necho 0.1.0-another-build\n").unwrap();
    std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o755)).unwrap();
    let code = sample("helloworld");
    let o = Command::new(dir.join("thaw"))
        .env("THAW_DATA_DIR", scratch().join("data"))
        .env("THAW_LOG", "thaw_sandbox=debug")
        .args(["boot", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--quiet"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(stdout(&ok(o)).contains("hello, world"));
    assert!(err.contains("not using the static sandbox init") && err.contains("another build (0.1.0-another-build)") && err.contains("scripts/build-init.sh"), "{err}");
    assert!(err.contains(&format!("init={}", dir.join("thaw-sandbox-init").display())), "the glibc init of the same build: {err}");
}
