//! Integration tests: need root, cgroups and namespaces (run as root on the dev machines).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thaw_sandbox::{Entry, ExitStatus, Limits, Sandbox, SandboxError, SandboxSpec};

fn id(name: &str) -> String {
    format!("it-{name}-{}", std::process::id())
}

fn code_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("hello.txt"), "hello from code\n").unwrap();
    d
}

fn spec(name: &str, code: &Path) -> SandboxSpec {
    let mut s = SandboxSpec::new(id(name), code);
    s.init_exe = env!("CARGO_BIN_EXE_thaw-sandbox-init").into();
    s.env = vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("FOO".into(), "bar baz".into()),
    ];
    s
}

fn sh(script: &str) -> Entry {
    Entry::Exec { argv: vec!["/bin/sh".into(), "-c".into(), script.into()] }
}

fn read_all(fd: OwnedFd) -> String {
    let mut s = String::new();
    File::from(fd).read_to_string(&mut s).unwrap();
    s
}

/// Asserts the sandbox left nothing behind.
fn assert_gone(pid: i32, cgroup_paths: &[PathBuf], run_dir: &Path) {
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} still exists");
    for p in cgroup_paths {
        assert!(!p.exists(), "cgroup dir {} still exists", p.display());
    }
    assert!(!run_dir.exists(), "{} still exists", run_dir.display());
}

fn run_dir(s: &SandboxSpec) -> PathBuf {
    s.run_dir.join(&s.id)
}

#[test]
fn opt_dir_is_mounted_read_only_at_opt() {
    let code = code_dir();
    let opt = tempfile::tempdir().unwrap();
    std::fs::create_dir(opt.path().join("bin")).unwrap();
    std::fs::write(opt.path().join("bin/tool"), "layer file\n").unwrap();
    let mut s = spec("opt", code.path());
    s.opt_dir = Some(opt.path().to_path_buf());
    let script = "cat /opt/bin/tool; if touch /opt/new 2>/dev/null; then echo optw=yes; else echo optw=no; fi";
    let mut sb = Sandbox::spawn(&s, sh(script)).expect("spawn");
    let out = read_all(sb.take_log().unwrap());
    assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(0), "output:\n{out}");
    assert_eq!(out, "layer file\noptw=no\n");
    // Without one, /opt is an empty directory (as in Lambda).
    let s = spec("noopt", code.path());
    let mut sb = Sandbox::spawn(&s, sh("[ -d /opt ] && echo \"opt=[$(ls -A /opt)]\"")).expect("spawn");
    let out = read_all(sb.take_log().unwrap());
    sb.wait().unwrap();
    assert_eq!(out, "opt=[]\n");
}

#[test]
fn exec_environment() {
    let code = code_dir();
    let s = spec("env", code.path());
    let script = r#"
echo "procs=$(ls /proc | grep -E '^[0-9]+$' | tr '\n' ' ')"
echo "pid=$$"
echo "host=$(cat /proc/sys/kernel/hostname)"
echo "ids=$(id -u) $(id -g) $(id -G)"
if touch /x 2>/dev/null; then echo root=rw; else echo root=ro; fi
echo "rootmnt=$(grep ' / ' /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1)"
if echo hi > /tmp/f && [ "$(cat /tmp/f)" = hi ]; then echo tmp=rw; else echo tmp=ro; fi
echo "task=$(cat /var/task/hello.txt)"
if touch /var/task/new 2>/dev/null; then echo taskw=yes; else echo taskw=no; fi
echo "taskmnt=$(grep ' /var/task ' /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1)"
echo "netdevs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
echo "fd0=$(readlink /proc/2/fd/0)"
echo "fd3=$(readlink /proc/2/fd/3 | cut -d: -f1)"
echo "initfds=$(ls /proc/1/fd 2>&1 | wc -l)"
echo "cwd=$(pwd)"
echo "umask=$(umask)"
echo "nofile=$(ulimit -n)"
if unshare -U true 2>/dev/null; then echo unshare=allowed; else echo unshare=denied; fi
echo "devnull=$(ls /dev | tr '\n' ' ')"
echo "etc=$(ls /etc | tr '\n' ' ')"
echo "user=$(id -un)"
echo "localhost=$(getent hosts localhost | head -n1 | cut -d' ' -f1)"
if [ -e /etc/shadow ] || [ -e /etc/ssl/private ] || [ -e /etc/ssh ]; then echo hostsecrets=visible; else echo hostsecrets=absent; fi
echo "certs=$(ls /etc/ssl/certs | grep -c pem)"
echo "err line" >&2
read line <&3; echo "ctl=$line"
echo ok >&3
tr '\0' '\n' < /proc/2/environ | sed 's/^/env:/'
"#;
    let mut sb = Sandbox::spawn(&s, sh(script)).expect("spawn");
    let mut control = File::from(sb.take_control().unwrap());
    control.write_all(b"ping\n").unwrap();
    let out = read_all(sb.take_log().unwrap());
    assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(0), "output:\n{out}");

    let mut kv = BTreeMap::new();
    let mut env = Vec::new();
    for line in out.lines() {
        if let Some(e) = line.strip_prefix("env:") {
            env.push(e.to_string());
        } else if let Some((k, v)) = line.split_once('=') {
            kv.insert(k.to_string(), v.trim().to_string());
        } else {
            kv.insert(line.to_string(), String::new());
        }
    }
    let get = |k: &str| kv.get(k).unwrap_or_else(|| panic!("{k} missing in:\n{out}")).as_str();
    assert_eq!(get("pid"), "2", "the program runs as PID 2 under the sandbox's init");
    assert_eq!(get("host"), "thaw");
    assert_eq!(get("ids"), "65534 65534 65534");
    assert_eq!(get("root"), "ro");
    assert_eq!(get("rootmnt"), "ro");
    assert_eq!(get("tmp"), "rw");
    assert_eq!(get("task"), "hello from code");
    assert_eq!(get("taskw"), "no");
    assert_eq!(get("taskmnt"), "ro");
    let procs: Vec<u32> = get("procs").split_whitespace().map(|p| p.parse().unwrap()).collect();
    // init (1), sh (2), the command substitution's subshell, ls, grep, tr: nothing from the host.
    assert!(procs.contains(&1) && procs.contains(&2) && procs.len() <= 6 && procs.iter().all(|&p| p < 10), "host pids visible: {procs:?}");
    assert_eq!(get("netdevs"), "lo");
    assert_eq!(get("fd0"), "/dev/null");
    assert_eq!(get("fd3"), "socket");
    // The init holds none of the program's descriptors (the caller sees EOF when the
    // program dies); its fd directory is not even readable by the program's uid.
    assert_ne!(get("initfds"), "4");
    assert_eq!(get("cwd"), "/var/task");
    assert_eq!(get("umask"), "0022");
    assert_eq!(get("nofile"), "1024");
    assert_eq!(get("unshare"), "denied");
    assert_eq!(get("devnull"), "fd full null random shm stderr stdin stdout urandom zero");
    // Its own minimal /etc: the function's user, loopback names, CA certificates, and
    // nothing of the host's secrets.
    let etc: Vec<&str> = get("etc").split_whitespace().collect();
    for want in ["passwd", "group", "hosts", "resolv.conf", "nsswitch.conf", "hostname", "ld.so.cache", "ssl"] {
        assert!(etc.contains(&want), "/etc lacks {want}: {etc:?}");
    }
    assert!(!etc.contains(&"shadow") && !etc.contains(&"ssh") && !etc.contains(&"machine-id"), "{etc:?}");
    assert_eq!(get("user"), "sbx_user");
    assert!(["127.0.0.1", "::1"].contains(&get("localhost")), "localhost resolves to {}", get("localhost"));
    assert_eq!(get("hostsecrets"), "absent");
    assert_ne!(get("certs"), "0", "no CA certificates");
    assert!(kv.contains_key("err line"), "stderr goes to the log pipe:\n{out}");
    assert_eq!(get("ctl"), "ping");
    env.sort();
    assert_eq!(env, vec!["FOO=bar baz", "LANG=C.UTF-8", "PATH=/usr/bin:/bin"]);

    let mut reply = String::new();
    control.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "ok\n");

    let cg = sb.cgroup().paths();
    let pid = sb.pid();
    sb.kill().unwrap();
    assert_gone(pid, &cg, &run_dir(&s));
}

/// The program sees exactly fds 0-3 (checked from the host: shells open their own).
#[test]
fn program_descriptors() {
    let code = code_dir();
    let s = spec("fds", code.path());
    let mut sb = Sandbox::spawn(&s, Entry::Exec { argv: vec!["/usr/bin/sleep".into(), "100".into()] }).unwrap();
    // spawn returns once the program is about to execve: look after the exec.
    let exe = format!("/proc/{}/exe", sb.pid());
    let t0 = std::time::Instant::now();
    while std::fs::read_link(&exe).map(|p| p != std::path::Path::new("/usr/bin/sleep")).unwrap_or(true) {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the program never exec'd");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let dir = format!("/proc/{}/fd", sb.pid());
    // The exe link switches before execve closes the close-on-exec descriptors: a
    // listing can race with that; list again until no entry vanishes under it.
    let mut fds: Vec<(u32, String)> = loop {
        let listed: Option<Vec<(u32, String)>> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let target = std::fs::read_link(e.path()).ok()?.to_string_lossy().into_owned();
                Some((e.file_name().to_str().unwrap().parse().unwrap(), target))
            })
            .collect();
        match listed {
            Some(l) if l.len() <= 4 => break l,
            _ if t0.elapsed() < std::time::Duration::from_secs(10) => std::thread::sleep(std::time::Duration::from_millis(1)),
            Some(l) => break l,
            None => panic!("descriptors kept vanishing"),
        }
    };
    fds.sort();
    let fd_nums: Vec<u32> = fds.iter().map(|f| f.0).collect();
    assert_eq!(fd_nums, vec![0, 1, 2, 3], "{fds:?}");
    assert_eq!(fds[0].1, "/dev/null");
    assert!(fds[1].1.starts_with("pipe:") && fds[1].1 == fds[2].1, "{fds:?}");
    assert!(fds[3].1.starts_with("socket:"), "{fds:?}");
    // The log pipe's read end is ours.
    let log = sb.take_log().unwrap();
    let ino = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&log))).unwrap();
    assert_eq!(fds[1].1, format!("pipe:[{}]", std::os::unix::fs::MetadataExt::ino(&ino)));
}

#[test]
fn loopback_is_up() {
    let code = code_dir();
    let s = spec("lo", code.path());
    let py = "import socket\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\n\
              c=socket.create_connection(s.getsockname())\na,_=s.accept()\nc.sendall(b'lo-up')\nprint(a.recv(5).decode())";
    let mut sb = Sandbox::spawn(&s, Entry::Exec { argv: vec!["/usr/bin/python3".into(), "-c".into(), py.into()] }).unwrap();
    let out = read_all(sb.take_log().unwrap());
    assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(0), "{out}");
    assert_eq!(out, "lo-up\n");
}

#[test]
fn memory_limit_oom_kills() {
    let code = code_dir();
    let mut s = spec("oom", code.path());
    s.limits = Limits { memory_mb: 64, ..Limits::default() };
    let argv = vec!["/usr/bin/python3".into(), "-c".into(), "x = b'a' * (256 << 20)\nprint('survived')".into()];
    // (No oom_killed() check before the kill: the process may be killed before it runs.)
    let mut sb = Sandbox::spawn(&s, Entry::Exec { argv }).unwrap();
    let out = read_all(sb.take_log().unwrap());
    assert_eq!(sb.wait().unwrap(), ExitStatus::Signaled(libc::SIGKILL), "{out}");
    assert!(!out.contains("survived"));
    assert!(sb.cgroup().oom_killed());
    let cg = sb.cgroup().paths();
    sb.kill().unwrap();
    assert_gone(sb.pid(), &cg, &run_dir(&s));
    // Within its limit: not reported as killed by it.
    let s = spec("oom-not", code.path());
    let mut sb = Sandbox::spawn(&s, Entry::Exec { argv: vec!["/usr/bin/python3".into(), "-c".into(), "print('fine')".into()] }).unwrap();
    let out = read_all(sb.take_log().unwrap());
    assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(0), "{out}");
    assert!(!sb.cgroup().oom_killed());
    sb.kill().unwrap();
}

#[test]
fn kill_removes_everything() {
    let code = code_dir();
    let s = spec("kill", code.path());
    let mut sb = Sandbox::spawn(&s, sh("sleep 100 & sleep 100 & echo started; wait")).unwrap();
    let mut log = File::from(sb.take_log().unwrap());
    let mut buf = [0u8; 8];
    log.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"started\n");
    let pids = sb.cgroup().pids().unwrap();
    assert_eq!(pids.len(), 4, "the init, sh and two sleeps in the cgroup: {pids:?}");
    assert!(sb.cgroup().memory_usage_bytes().unwrap() > 0);
    assert!(run_dir(&s).exists());
    let cg = sb.cgroup().paths();
    for p in &cg {
        assert!(p.exists());
    }
    sb.kill().unwrap();
    for p in pids {
        assert!(!Path::new(&format!("/proc/{p}")).exists(), "{p} survived");
    }
    assert_gone(sb.pid(), &cg, &run_dir(&s));
    sb.kill().expect("kill is idempotent");
    assert_eq!(sb.wait_exit().unwrap(), Some(ExitStatus::Signaled(libc::SIGKILL)));
    // The id can be reused once killed.
    drop(sb);
    let mut again = Sandbox::spawn(&s, sh("true")).unwrap();
    assert_eq!(again.wait().unwrap(), ExitStatus::Exited(0));
}

#[test]
fn drop_cleans_up() {
    let code = code_dir();
    let s = spec("drop", code.path());
    let sb = Sandbox::spawn(&s, sh("sleep 100")).unwrap();
    let (pid, cg) = (sb.pid(), sb.cgroup().paths());
    drop(sb);
    assert_gone(pid, &cg, &run_dir(&s));
}

#[test]
fn duplicate_id_rejected() {
    let code = code_dir();
    let s = spec("dup", code.path());
    let _sb = Sandbox::spawn(&s, sh("sleep 100")).unwrap();
    let err = Sandbox::spawn(&s, sh("true")).unwrap_err();
    assert!(matches!(err, SandboxError::IdInUse { .. }), "{err}");
    assert_eq!(err.to_string(), format!("sandbox {}: id already in use ({} exists)", s.id, run_dir(&s).display()));
}

fn status_field(pid: i32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim_start_matches(':').trim().to_string()))
        .unwrap_or_else(|| panic!("{key} not in status"))
}

#[test]
fn stub_is_stopped_tracee_with_blob() {
    let code = code_dir();
    let s = spec("stub", code.path());
    let addr = 0x6000_0000_0000u64;
    let blob: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut sb = Sandbox::spawn(&s, Entry::Stub { addr, len: 3 * 4096, blob: blob.clone() }).unwrap();
    let pid = sb.pid();
    let state = status_field(pid, "State");
    assert!(state.starts_with('t') || state.starts_with('T'), "state {state}");
    let tid = nix::unistd::gettid().as_raw();
    assert_eq!(status_field(pid, "TracerPid"), tid.to_string());
    assert_eq!(status_field(pid, "NSpid").split_whitespace().last(), Some("2"));
    assert_eq!(status_field(sb.init_pid(), "NSpid").split_whitespace().last(), Some("1"));
    assert_eq!(status_field(pid, "PPid"), sb.init_pid().to_string(), "the stub is the init's child");
    assert!(status_field(pid, "Uid").starts_with("0\t"), "stub stays root");
    assert_eq!(status_field(pid, "Seccomp"), "2");

    // GLIBC_TUNABLES=glibc.pthread.rseq=0: the stub has no rseq area registered.
    let mut rseq = [0u64; 3];
    // SAFETY: PTRACE_GET_RSEQ_CONFIGURATION writes at most `addr` (24) bytes into `rseq`;
    // we are the tracer of the stopped `pid`.
    let r = unsafe { libc::ptrace(0x420f, pid, std::mem::size_of_val(&rseq), rseq.as_mut_ptr()) };
    assert_eq!(r, 24, "{}", std::io::Error::last_os_error());
    assert_eq!(rseq[0], 0, "rseq_abi_pointer of the stub");

    let mut mem = File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.seek(SeekFrom::Start(addr)).unwrap();
    let mut back = vec![0u8; blob.len()];
    mem.read_exact(&mut back).unwrap();
    assert_eq!(back, blob);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains(&format!("{addr:x}-{:x} rwxp", addr + 3 * 4096)), "{maps}");

    let root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap();
    assert_eq!(root, Path::new("/"));
    assert!(Path::new(&format!("/proc/{pid}/root/var/task/hello.txt")).exists());

    let cg = sb.cgroup().paths();
    let mut pids = sb.cgroup().pids().unwrap();
    pids.sort();
    assert_eq!(pids, vec![sb.init_pid(), pid]);
    sb.kill().unwrap();
    assert_gone(pid, &cg, &run_dir(&s));
}

#[test]
fn stub_resumed_without_a_restore_keeps_waiting_and_dies_with_its_sandbox() {
    let code = code_dir();
    let s = spec("stubwait", code.path());
    let mut sb = Sandbox::spawn(&s, Entry::Stub { addr: 0x6100_0000_0000, len: 4096, blob: vec![0xcc] }).unwrap();
    let pid = sb.pid();
    nix::sys::ptrace::detach(nix::unistd::Pid::from_raw(pid), None).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(status_field(pid, "State").starts_with('S'), "back in pause()");
    assert_eq!(sb.wait_exit().unwrap(), None);
    let cg = sb.cgroup().paths();
    sb.kill().unwrap();
    assert_gone(pid, &cg, &run_dir(&s));
}

/// PID 1 reaps orphans: daemons that double-fork and exit leave no zombies behind,
/// and the program's exit status is reported through the init.
#[test]
fn init_reaps_orphans_and_reports_the_program_status() {
    let code = code_dir();
    let s = spec("reap", code.path());
    // 40 double-forked daemons: each intermediate child is reaped by sh, each grandchild
    // becomes an orphan (reparented to PID 1) and exits.
    let script = "for i in $(seq 40); do (sh -c 'sleep 0.01' &) ; done; sleep 0.5; \
                  echo zombies=$(grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l); exit 7";
    let mut sb = Sandbox::spawn(&s, sh(script)).unwrap();
    let out = read_all(sb.take_log().unwrap());
    assert_eq!(out.trim(), "zombies=0", "{out}");
    assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(7));
}

#[test]
fn missing_code_dir_fails_cleanly() {
    let s = spec("nocode", Path::new("/nonexistent/thaw-code"));
    let err = Sandbox::spawn(&s, sh("true")).unwrap_err();
    assert_eq!(err.to_string(), format!("sandbox {}: code_dir /nonexistent/thaw-code", s.id));
    assert_eq!(std::error::Error::source(&err).unwrap().to_string(), "No such file or directory (os error 2)");
    assert!(!run_dir(&s).exists());
    for p in thaw_sandbox::cgroup_for_sandbox(&s.cgroup_root, &s.id).paths() {
        assert!(!p.exists(), "{}", p.display());
    }
}

fn assert_init_error(name: &str, mutate: impl FnOnce(&mut SandboxSpec), entry: Entry, msg: &str, cause: &str) {
    let code = code_dir();
    let mut s = spec(name, code.path());
    mutate(&mut s);
    let err = Sandbox::spawn(&s, entry).unwrap_err();
    assert!(matches!(err, SandboxError::Init { .. }), "{err:?}");
    assert_eq!(err.to_string(), format!("sandbox {}: {msg}", s.id));
    assert_eq!(std::error::Error::source(&err).unwrap().to_string(), cause);
    assert!(!run_dir(&s).exists());
    for p in thaw_sandbox::cgroup_for_sandbox(&s.cgroup_root, &s.id).paths() {
        assert!(!p.exists(), "{}", p.display());
    }
}

#[test]
fn init_errors_are_reported_with_step() {
    assert_init_error("badcwd", |s| s.cwd = "/nope".into(), sh("true"), "chdir /nope", "No such file or directory (os error 2)");
    assert_init_error(
        "badexe",
        |_| {},
        Entry::Exec { argv: vec!["/usr/bin/does-not-exist".into()] },
        "execve /usr/bin/does-not-exist",
        "No such file or directory (os error 2)",
    );
    assert_init_error(
        "badinit",
        |s| s.init_exe = "/nonexistent-init".into(),
        sh("true"),
        "execve /nonexistent-init",
        "No such file or directory (os error 2)",
    );
    assert_init_error(
        "badstub",
        |_| {},
        // 1 TiB of private writable memory is refused by the overcommit heuristic.
        Entry::Stub { addr: 0x1000, len: 1 << 40, blob: vec![] },
        &format!("map stub at {:#x}+{:#x}", 0x1000, 1u64 << 40),
        "Cannot allocate memory (os error 12)",
    );
}

#[test]
fn not_an_init_is_detected() {
    let code = code_dir();
    let mut s = spec("notinit", code.path());
    s.init_exe = "/bin/true".into();
    let err = Sandbox::spawn(&s, sh("true")).unwrap_err();
    assert_eq!(err.to_string(), format!("sandbox {}: init ended unexpectedly (Exited(0))", s.id));
    assert!(!run_dir(&s).exists());
}

/// Cold-start cost: spawn() of `/bin/true`, and spawn + wait for its exit.
#[test]
fn spawn_timing() {
    let code = code_dir();
    let s = spec("timing", code.path());
    let n = 20;
    let (mut spawn, mut total, mut kill) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t0 = Instant::now();
        let mut sb = Sandbox::spawn(&s, Entry::Exec { argv: vec!["/bin/true".into()] }).unwrap();
        let t1 = Instant::now();
        assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(0));
        let t2 = Instant::now();
        sb.kill().unwrap();
        let t3 = Instant::now();
        spawn.push(t1 - t0);
        total.push(t2 - t0);
        kill.push(t3 - t2);
    }
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[v.len() * 9 / 10])
    };
    let (s50, s90) = med(&mut spawn);
    let (t50, t90) = med(&mut total);
    let (k50, k90) = med(&mut kill);
    eprintln!(
        "spawn_timing n={n}: spawn p50 {s50:?} p90 {s90:?}; spawn+exit p50 {t50:?} p90 {t90:?}; kill+cleanup p50 {k50:?} p90 {k90:?}"
    );
    assert!(t50 < Duration::from_millis(500), "spawn+exit median {t50:?}");
}

#[test]
fn leftovers_of_dead_processes_are_swept() {
    let run = tempfile::tempdir().unwrap();
    let cg = tempfile::tempdir().unwrap();
    // pid 999999999 is above any pid_max; pid 1 always runs.
    for d in [run.path().join("restore-999999999-5-0"), cg.path().join("memory/thaw/restore-999999999-5-0"), run.path().join("boot-1-5-0")] {
        std::fs::create_dir_all(&d).unwrap();
    }
    assert_eq!(thaw_sandbox::sweep_stale(run.path(), cg.path()), 2);
    assert!(!run.path().join("restore-999999999-5-0").exists());
    assert!(!cg.path().join("memory/thaw/restore-999999999-5-0").exists());
    assert!(run.path().join("boot-1-5-0").exists(), "a live owner's sandbox must be kept");
}

/// The mount options of `path` in `pid`'s mount namespace.
fn mount_opts(pid: i32, path: &str) -> String {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    info.lines()
        .find(|l| l.split_whitespace().nth(4) == Some(path))
        .unwrap_or_else(|| panic!("{path} is not a mount point in {pid}:\n{info}"))
        .split_whitespace()
        .nth(5)
        .unwrap()
        .to_string()
}

#[test]
fn prepared_sandbox_starts_a_stub_with_its_code_attached_read_only() {
    let code = code_dir();
    let opt = tempfile::tempdir().unwrap();
    std::fs::create_dir(opt.path().join("python")).unwrap();
    std::fs::write(opt.path().join("python/layer.py"), "X = 1\n").unwrap();
    let extra = tempfile::NamedTempFile::new_in("/run").unwrap();
    std::fs::write(extra.path(), "shared bytes").unwrap();
    let mut s = spec("prep", Path::new("/nonexistent-code"));
    s.env.clear();
    let prepared = Sandbox::prepare(&s).unwrap();
    assert_eq!(prepared.id(), s.id);
    let addr = 0x6200_0000_0000u64;
    let blob = vec![0x90u8; 5000];
    let entry = Entry::Stub { addr, len: 2 * 4096, blob: blob.clone() };
    let mut sb = prepared.start(code.path(), Some(opt.path()), &[extra.path().to_path_buf()], &entry).unwrap();
    let pid = sb.pid();
    assert!(status_field(pid, "State").starts_with(['t', 'T']));
    assert_eq!(status_field(pid, "TracerPid"), nix::unistd::gettid().as_raw().to_string(), "the starting thread traces it");
    assert_eq!(status_field(pid, "NSpid").split_whitespace().last(), Some("2"));
    assert_eq!(status_field(pid, "Seccomp"), "2");
    let mut mem = File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.seek(SeekFrom::Start(addr)).unwrap();
    let mut back = vec![0u8; blob.len()];
    mem.read_exact(&mut back).unwrap();
    assert_eq!(back, blob);
    let root = format!("/proc/{pid}/root");
    assert_eq!(std::fs::read_to_string(format!("{root}/var/task/hello.txt")).unwrap(), "hello from code\n");
    assert_eq!(std::fs::read_to_string(format!("{root}{}", extra.path().display())).unwrap(), "shared bytes");
    assert_eq!(std::fs::read_to_string(format!("{root}/opt/python/layer.py")).unwrap(), "X = 1\n", "the layers at /opt");
    assert_eq!(std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(), Path::new("/var/task"), "cwd is the attached code");
    for p in ["/var/task", "/opt", extra.path().to_str().unwrap(), "/"] {
        assert!(mount_opts(pid, p).split(',').any(|o| o == "ro"), "{p} is read-only: {}", mount_opts(pid, p));
    }
    let cg = sb.cgroup().paths();
    let mut pids = sb.cgroup().pids().unwrap();
    pids.sort();
    assert_eq!(pids, vec![sb.init_pid(), pid], "init and stub in the prepared cgroup");
    sb.kill().unwrap();
    assert_gone(pid, &cg, &run_dir(&s));
}

#[test]
fn prepared_sandbox_refuses_bad_starts_and_leaves_nothing() {
    let s = spec("prepbad", Path::new("/nonexistent-code"));
    let stub = Entry::Stub { addr: 0x6300_0000_0000, len: 4096, blob: vec![0xcc] };
    // Dropped unstarted.
    let p = Sandbox::prepare(&s).unwrap();
    drop(p);
    assert!(!run_dir(&s).exists());
    // A code directory that does not exist: a clear error, everything removed.
    let p = Sandbox::prepare(&s).unwrap();
    let e = p.start(Path::new("/nonexistent-code"), None, &[], &stub).unwrap_err();
    assert_eq!(e.to_string(), format!("sandbox {}: bind source /nonexistent-code", s.id));
    assert!(!run_dir(&s).exists());
    // Only a restore stub can start in a prepared sandbox.
    let code = code_dir();
    let p = Sandbox::prepare(&s).unwrap();
    let e = p.start(code.path(), None, &[], &sh("true")).unwrap_err();
    assert!(e.to_string().contains("a prepared sandbox starts only a restore stub"), "{e}");
    assert!(!run_dir(&s).exists());
}

/// A pool of `per_shape` and a spec (no environment: restores take theirs from the image).
fn pool_and_spec(name: &str, code: &Path) -> (thaw_sandbox::SandboxPool, SandboxSpec) {
    let mut s = spec(name, code);
    s.env.clear();
    (thaw_sandbox::SandboxPool::new(1).unwrap(), s)
}

/// Drop the pool and check that none of its sandboxes is left.
fn drop_pool_leaving_nothing(pool: thaw_sandbox::SandboxPool, s: &SandboxSpec) {
    let mine = format!("{}-", pool.id_prefix());
    drop(pool);
    let left: Vec<_> = std::fs::read_dir(&s.run_dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&mine)).collect();
    assert!(left.is_empty(), "the pool removed its prepared sandboxes: {left:?}");
}

#[test]
fn pool_hands_out_prepared_sandboxes_of_the_asked_shape() {
    let code = code_dir();
    let (pool, s) = pool_and_spec("pool", code.path());
    assert!(pool.take(&s).is_none(), "nothing prepared for a new shape");
    assert_eq!(pool.fill(&s, 2, Duration::from_secs(30)), 2);
    let mut other = s.clone();
    other.limits.memory_mb = 300;
    assert!(pool.take(&other).is_none(), "another shape is not served from this one's sandboxes");
    let p = pool.take(&s).expect("a prepared sandbox");
    let entry = Entry::Stub { addr: 0x6400_0000_0000, len: 4096, blob: vec![0xcc] };
    let mut sb = p.start(code.path(), None, &[], &entry).unwrap();
    let pid = sb.pid();
    assert!(Path::new(&format!("/proc/{pid}/root/var/task/hello.txt")).exists());
    let st = pool.stats();
    assert_eq!((st.hits, st.misses, st.shapes), (1, 2, 2), "{st:?}");
    assert_eq!(pool.fill(&other, 1, Duration::from_secs(30)), 1);
    let cg = sb.cgroup().paths();
    sb.kill().unwrap();
    assert_gone(pid, &cg, Path::new("/nonexistent"));
    drop_pool_leaving_nothing(pool, &s);
}


#[test]
fn pool_grows_for_a_shape_that_runs_dry() {
    let code = code_dir();
    let (pool, s) = pool_and_spec("poolgrow", code.path());
    assert!(pool.take(&s).is_none(), "a new shape: learned, not grown");
    assert_eq!(pool.fill(&s, 1, Duration::from_secs(30)), 1);
    let burst: Vec<_> = (0..4).map(|_| pool.take(&s)).collect();
    assert_eq!(burst.iter().filter(|p| p.is_some()).count(), 1, "one was ready");
    // Three misses of a known shape: four kept ready from now on.
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.stats().ready < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(pool.stats().ready, 4, "{:?}", pool.stats());
    drop(burst);
    drop_pool_leaving_nothing(pool, &s);
}

#[test]
fn pool_forgets_the_least_recently_used_shape_beyond_sixteen() {
    let code = code_dir();
    let (pool, mut s) = pool_and_spec("poolmany", code.path());
    for mb in 0..17u64 {
        s.limits.memory_mb = 200 + mb;
        assert!(pool.take(&s).is_none());
    }
    assert_eq!(pool.stats().shapes, 16, "{:?}", pool.stats());
    // The forgotten shape (200 MiB) is new again: its take is a miss that does not grow it.
    s.limits.memory_mb = 200;
    assert_eq!(pool.fill(&s, 1, Duration::from_secs(30)), 1);
    assert!(pool.take(&s).is_some());
    drop_pool_leaving_nothing(pool, &s);
}

#[test]
fn the_small_init_is_used_only_from_the_same_build_and_safe_to_exec() {
    use std::os::unix::fs::PermissionsExt;
    use thaw_sandbox::init_exe::check_init_binary;
    let ours = Path::new(env!("CARGO_BIN_EXE_thaw-sandbox-init"));
    assert_eq!(check_init_binary(ours), Ok(()));
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("thaw-sandbox-init");
    std::fs::write(&other, "#!/bin/sh\necho 0.1.0-another-build\n").unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = check_init_binary(&other).unwrap_err();
    assert!(e.contains("another build (0.1.0-another-build)"), "{e}");
    std::fs::copy(ours, &other).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o775)).unwrap();
    assert!(check_init_binary(&other).unwrap_err().contains("writable by group/others"));
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(check_init_binary(&other), Ok(()), "a copy of the same build is fine");
    assert!(check_init_binary(&dir.path().join("missing")).is_err());
}

#[test]
fn the_static_init_is_preferred_when_it_is_of_the_same_build() {
    use std::os::unix::fs::PermissionsExt;
    use thaw_sandbox::init_exe::{find_init_binary, INIT_BINARIES, INIT_BINARY, STATIC_INIT_BINARY};
    let ours = Path::new(env!("CARGO_BIN_EXE_thaw-sandbox-init"));
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join(INIT_BINARY);
    std::fs::copy(ours, &plain).unwrap();
    let found = |names: &[&str]| find_init_binary(dir.path(), names).map(|(path, _)| path);
    assert_eq!(found(&INIT_BINARIES), Ok(plain.clone()), "only the glibc one");
    // A static one of another build is passed over.
    let stat = dir.path().join(STATIC_INIT_BINARY);
    std::fs::write(&stat, "#!/bin/sh\necho 0.1.0-another-build\n").unwrap();
    std::fs::set_permissions(&stat, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (path, passed_over) = find_init_binary(dir.path(), &INIT_BINARIES).unwrap();
    assert_eq!(path, plain, "a stale static one is passed over");
    assert_eq!(passed_over, vec![format!("{STATIC_INIT_BINARY}: another build (0.1.0-another-build)")], "saying why");
    // One of this build is preferred: the musl one scripts/build-init.sh put beside
    // the glibc one (same sources, same id), else a copy standing in for it.
    let real = ours.with_file_name(STATIC_INIT_BINARY);
    std::fs::copy(if real.exists() { &real } else { ours }, &stat).unwrap();
    assert_eq!(find_init_binary(dir.path(), &INIT_BINARIES), Ok((stat.clone(), Vec::new())));
    assert_eq!(found(&[INIT_BINARY]), Ok(plain), "THAW_SANDBOX_INIT=glibc");
    let empty = tempfile::tempdir().unwrap();
    let why = find_init_binary(empty.path(), &INIT_BINARIES).unwrap_err();
    assert!(why.contains(STATIC_INIT_BINARY) && why.contains(INIT_BINARY), "{why}");
}

/// The musl-linked init, where scripts/build-init.sh made it, runs a program as the
/// glibc one does (the other tests here use the glibc one; the thaw CLI's tests, which
/// restore through stubs and prepared sandboxes, use the static one).
#[test]
fn the_static_init_runs_a_sandbox() {
    let real = Path::new(env!("CARGO_BIN_EXE_thaw-sandbox-init")).with_file_name(thaw_sandbox::init_exe::STATIC_INIT_BINARY);
    if !real.exists() {
        eprintln!("no {} (scripts/build-init.sh makes it): nothing to run", real.display());
        return;
    }
    let code = code_dir();
    let mut s = spec("static-init", code.path());
    s.init_exe = real;
    let mut sb = Sandbox::spawn(&s, sh("cat /var/task/hello.txt; echo pid $$")).expect("spawn");
    let out = read_all(sb.take_log().unwrap());
    assert_eq!(sb.wait().unwrap(), ExitStatus::Exited(0), "output:\n{out}");
    assert_eq!(out, "hello from code\npid 2\n");
}

#[test]
fn the_small_init_check_waits_out_a_writer_that_is_about_to_close() {
    // What a fork elsewhere in the process does between its fork and its exec: it holds
    // a descriptor open for writing on the freshly copied binary for a moment.
    use thaw_sandbox::init_exe::check_init_binary;
    let ours = Path::new(env!("CARGO_BIN_EXE_thaw-sandbox-init"));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("thaw-sandbox-init");
    std::fs::copy(ours, &copy).unwrap();
    let writer = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    let err = std::process::Command::new(&copy).arg("--build-id").output().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ETXTBSY), "the writer makes the file busy");
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(writer);
    });
    assert_eq!(check_init_binary(&copy), Ok(()), "busy for 50 ms is waited out");
    closer.join().unwrap();
}

#[test]
fn the_code_of_a_live_sandbox_is_replaced() {
    let (a, b) = (code_dir(), tempfile::tempdir().unwrap());
    std::fs::write(b.path().join("other.txt"), "other code\n").unwrap();
    let s = spec("recode", a.path());
    // Lists /var/task, waits until the other code is there, lists it again, tries to
    // write it and reads it.
    let script = "ls /var/task; while [ ! -e /var/task/other.txt ]; do sleep 0.01; done; ls /var/task; \
                  touch /var/task/x 2>/dev/null && echo writable || echo read-only; cat /var/task/other.txt";
    let mut sb = Sandbox::spawn(&s, sh(script)).expect("spawn");
    let log = sb.take_log().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    sb.replace_code(b.path()).expect("replace the code");
    let status = sb.wait().unwrap();
    let out = read_all(log);
    assert_eq!(status, ExitStatus::Exited(0), "{out}");
    assert_eq!(out, "hello.txt\nother.txt\nread-only\nother code\n");
    assert!(sb.replace_code(Path::new("relative")).is_err(), "a relative path is refused");
    drop(sb);
    assert!(a.path().join("hello.txt").exists() && !b.path().join("x").exists(), "the host directories are untouched");
}
