//! Network namespaces used again (src/netns.rs). Its own test binary: the recycling is
//! process-wide, and these steps count on what it holds. Needs root, as sandbox.rs.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use thaw_sandbox::{netns_stats, Entry, ExitStatus, NetnsStats, Sandbox, SandboxSpec};

fn spec(name: &str, code: &Path) -> SandboxSpec {
    let mut s = SandboxSpec::new(format!("it-netns-{name}-{}", std::process::id()), code);
    s.init_exe = env!("CARGO_BIN_EXE_thaw-sandbox-init").into();
    s.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    s
}

fn python(script: &str) -> Entry {
    Entry::Exec { argv: vec!["/usr/bin/python3".into(), "-c".into(), script.into()] }
}

/// The identity of a process's network namespace (its nsfs inode), and a descriptor
/// that keeps the namespace (and so its inode number) from being freed meanwhile.
fn netns_of(pid: i32) -> (String, OwnedFd) {
    let p = format!("/proc/{pid}/ns/net");
    (std::fs::read_link(&p).unwrap().to_string_lossy().into_owned(), File::open(&p).unwrap().into())
}

/// Run `entry` to its end in a new sandbox; its output, and its namespace's identity.
fn run(name: &str, code: &Path, entry: Entry) -> (String, String, OwnedFd) {
    let mut sb = Sandbox::spawn(&spec(name, code), entry).expect("spawn");
    let ns = netns_of(sb.init_pid());
    let mut out = String::new();
    File::from(sb.take_log().unwrap()).read_to_string(&mut out).unwrap();
    assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(0), "{name}: {out}");
    sb.kill().unwrap();
    (out, ns.0, ns.1)
}

fn wait_for(what: &str, f: impl Fn(&NetnsStats) -> bool) -> NetnsStats {
    let t0 = Instant::now();
    loop {
        let s = netns_stats();
        if f(&s) {
            return s;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

const QUIET: &str = "print('quiet')";
/// One loopback connection, as `loopback_is_up` in sandbox.rs.
const TALKS: &str = "import socket\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\n\
                     c=socket.create_connection(s.getsockname())\na,_=s.accept()\nc.sendall(b'lo-up')\nprint(a.recv(5).decode())";
/// No packet at all: the kernel counts an unroutable connect, which the next tenant
/// could read.
const UNROUTABLE: &str = "import socket\ntry:\n  socket.create_connection(('10.255.0.1', 9), timeout=1)\nexcept OSError as e:\n  print(e.errno)";

#[test]
fn only_namespaces_that_show_no_use_are_used_again() {
    if std::env::var("THAW_NETNS_REUSE").is_ok_and(|v| v == "0") {
        assert_eq!(netns_stats(), NetnsStats::default());
        return;
    }
    let code = tempfile::tempdir().unwrap();
    let host = std::fs::read_link("/proc/self/ns/net").unwrap().to_string_lossy().into_owned();

    // A quiet sandbox's namespace is kept once its sandbox ends ...
    let (out, quiet, _keep_quiet) = run("quiet", code.path(), python(QUIET));
    assert_eq!(out, "quiet\n");
    assert_ne!(quiet, host, "a sandbox has a network namespace of its own");
    let s = wait_for("the quiet namespace kept", |s| s.kept == 1);
    assert_eq!(s.dropped, 0, "{s:?}");

    // ... and the next sandbox joins it (the last kept is the first taken), loopback
    // up and working.
    let (out, talked, _keep_talked) = run("talks", code.path(), python(TALKS));
    assert_eq!(out, "lo-up\n");
    assert_eq!(talked, quiet, "the next sandbox joined the namespace the quiet one left");
    let s = wait_for("the talking sandbox's namespace dropped", |s| s.dropped == 1);
    assert_eq!(s.kept, 1, "{s:?}");
    assert!(s.reused >= 1, "{s:?}");

    // Traffic, or a connect the kernel counted without any, and the namespace is
    // never handed out again: every later sandbox is in another one.
    let (out, unroutable, _keep_unroutable) = run("unroutable", code.path(), python(UNROUTABLE));
    assert_eq!(out.trim(), libc::ENETUNREACH.to_string(), "{out}");
    assert_ne!(unroutable, talked);
    let s = wait_for("the unroutable sandbox's namespace dropped", |s| s.dropped == 2);
    assert_eq!(s.kept, 1, "{s:?}");
    for i in 0..4 {
        let (out, later, _keep) = run(&format!("later{i}"), code.path(), python(QUIET));
        assert_eq!(out, "quiet\n");
        assert!(later != talked && later != unroutable, "sandbox {i} joined a namespace that showed use");
    }
    // (`ready` reads 0 while the checker holds the list: stats never wait for it.)
    let s = wait_for("the quiet ones kept", |s| s.kept == 5 && s.ready >= 1);
    assert!(s.ready <= 32, "{s:?}");
}
