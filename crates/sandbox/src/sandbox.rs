//! [`Sandbox::spawn`] and the lifecycle of a running sandbox.

use std::ffi::CString;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{self, setsockopt, sockopt, AddressFamily, MsgFlags, SockFlag, SockType};
use nix::sys::time::TimeVal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::cgroup::{self, Cgroup};
use crate::config::{self, RealFs, StatusError, EXEC_MARK, STUB_MARK};
use crate::error::{CgroupError, SandboxError};
use crate::spec::{Entry, SandboxSpec};
use crate::sys;

/// How long `spawn` waits for the init to report before giving up.
pub(crate) const INIT_TIMEOUT: Duration = Duration::from_secs(30);

/// How the sandbox's first process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

/// A running sandbox: a process tree in its own pid, mount, ipc, uts and net namespaces
/// and its own cgroup(s). Dropping it kills everything and removes its cgroup and
/// directory.
///
/// # Threads
/// The sandbox's init (PID 1) is a child of the *thread* that called [`Sandbox::spawn`]:
/// it gets `PR_SET_PDEATHSIG(SIGKILL)`, which fires when that thread exits (and the
/// init's death ends the namespace), and in [`Entry::Stub`] mode that thread seizes the
/// stub (PID 2) with `PTRACE_SEIZE`. Spawn from a
/// long-lived thread (not e.g. a `spawn_blocking` worker that may be retired), and issue
/// ptrace requests for a stub from that same thread.
#[derive(Debug)]
pub struct Sandbox {
    id: String,
    /// The init (PID 1 inside), our child.
    pid: i32,
    pidfd: OwnedFd,
    /// The program or restore stub (PID 2 inside), the init's child.
    main: i32,
    main_pidfd: OwnedFd,
    control: Option<OwnedFd>,
    log: Option<OwnedFd>,
    res: Resources,
    exit: Option<ExitStatus>,
    /// Reaped (by us or, per ECHILD, by someone else).
    reaped: bool,
}

/// Host-side resources to undo: the cgroup(s) and the root mount-point directory.
#[derive(Debug)]
pub(crate) struct Resources {
    id: String,
    cgroup: Box<dyn Cgroup>,
    cgroup_created: bool,
    root_dir: PathBuf,
    root_created: bool,
    /// The sandbox's network namespace, to be used again once its init is reaped
    /// (`netns.rs`); `None` when recycling is off.
    netns: Option<OwnedFd>,
}

impl Resources {
    pub(crate) fn new(spec: &SandboxSpec) -> Resources {
        Resources {
            id: spec.id.clone(),
            cgroup: cgroup::for_sandbox(&spec.cgroup_root, &spec.id),
            cgroup_created: false,
            root_dir: spec.run_dir.join(&spec.id),
            root_created: false,
            netns: None,
        }
    }

    /// The sandbox's init (`pidfd`) has been reaped: its network namespace goes to the
    /// checker (`netns.rs`) if the init has indeed ended — the end of its pid
    /// namespace, every process of which the kernel has waited for by then.
    pub(crate) fn init_reaped(&mut self, pidfd: BorrowedFd<'_>) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let Some(ns) = self.netns.take() else { return };
        // A pidfd reads as ready once its process has exited.
        if matches!(poll(&mut [PollFd::new(pidfd, PollFlags::POLLIN)], PollTimeout::ZERO), Ok(1)) {
            crate::netns::give_back(ns);
        }
    }

    pub(crate) fn cleanup(&mut self) -> Result<(), SandboxError> {
        let mut result = Ok(());
        if self.cgroup_created {
            match self.cgroup.destroy() {
                Ok(()) => self.cgroup_created = false,
                Err(source) => result = Err(SandboxError::Cgroup { id: self.id.clone(), source }),
            }
        }
        if self.root_created {
            match std::fs::remove_dir(&self.root_dir) {
                Ok(()) => self.root_created = false,
                Err(e) if e.kind() == ErrorKind::NotFound => self.root_created = false,
                Err(source) => {
                    if result.is_ok() {
                        result = Err(SandboxError::HostPath {
                            id: self.id.clone(),
                            what: "remove root directory",
                            path: self.root_dir.clone(),
                            source,
                        });
                    }
                }
            }
        }
        result
    }
}

fn sys_err(id: &str, step: impl Into<String>) -> impl FnOnce(Errno) -> SandboxError {
    let (id, step) = (id.to_string(), step.into());
    move |e| SandboxError::Sys { id, step, source: e.into() }
}

/// How the program ended, from the init's wait status: the init exits with the
/// program's code, or 128 + the signal that killed the program.
fn status_of(ws: WaitStatus) -> Option<ExitStatus> {
    match ws {
        WaitStatus::Exited(_, code) if code > 128 && code <= 128 + 64 => Some(ExitStatus::Signaled(code - 128)),
        WaitStatus::Exited(_, code) => Some(ExitStatus::Exited(code)),
        WaitStatus::Signaled(_, sig, _) => Some(ExitStatus::Signaled(sig as i32)),
        _ => None,
    }
}

impl Sandbox {
    /// Creates the sandbox and starts `entry` in it.
    ///
    /// Returns once the init has finished setting up: for [`Entry::Exec`] when `execve`
    /// of PID 2 succeeded, for [`Entry::Stub`] when the stub (PID 2) is seized and in a
    /// ptrace stop — the caller gets a stopped tracee (traced by the calling thread) and
    /// can go straight to `PTRACE_GETREGS`/`PTRACE_CONT` etc.
    /// On error everything created so far is removed again.
    pub fn spawn(spec: &SandboxSpec, entry: Entry) -> Result<Sandbox, SandboxError> {
        spec.validate()?;
        entry.validate(&spec.id)?;
        let ops = config::plan(spec, &RealFs, false)?;
        let mut res = Resources::new(spec);
        let blob: &[u8] = match &entry {
            Entry::Stub { blob, .. } => blob,
            Entry::Exec { .. } => &[],
        };
        let spawned = launch(spec, Some(&entry), blob, ops, &mut res).and_then(|l| {
            let _ = socket::shutdown(l.status.as_raw_fd(), socket::Shutdown::Write);
            finish(&spec.id, &entry, l)
        });
        Self::assemble(&spec.id, spawned, res)
    }

    /// The sandbox from a finished launch, or, on error, everything it created removed.
    pub(crate) fn assemble(
        id: &str,
        spawned: Result<Spawned, (SandboxError, Option<(i32, OwnedFd)>)>,
        mut res: Resources,
    ) -> Result<Sandbox, SandboxError> {
        match spawned {
            Ok(sp) => Ok(Sandbox {
                id: id.to_string(),
                pid: sp.pid,
                pidfd: sp.pidfd,
                main: sp.main,
                main_pidfd: sp.main_pidfd,
                control: Some(sp.control),
                log: Some(sp.log),
                res,
                exit: None,
                reaped: false,
            }),
            Err((e, pid)) => {
                if let Some((pid, pidfd)) = pid {
                    let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
                    if reap(pid).is_some() {
                        res.init_reaped(pidfd.as_fd());
                    }
                }
                if let Err(ce) = res.cleanup() {
                    tracing::warn!(sandbox = id, error = %ce, "cleanup after failed spawn");
                }
                Err(e)
            }
        }
    }

    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Host pid of the program (or restore stub): PID 2 inside, child of the init.
    pub fn pid(&self) -> i32 {
        self.main
    }

    /// pidfd of the program (poll it for exit; signal it or take descriptors out of it
    /// without pid reuse races).
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.main_pidfd.as_fd()
    }

    /// Host pid of the sandbox's init (PID 1 inside): the reaper of the namespace,
    /// whose exit (killing) ends everything in the sandbox.
    pub fn init_pid(&self) -> i32 {
        self.pid
    }

    /// Parent end of the AF_UNIX stream socket that is fd 3 in the program.
    pub fn take_control(&mut self) -> Option<OwnedFd> {
        self.control.take()
    }

    /// Read end of the pipe that is fd 1 and 2 in the program.
    pub fn take_log(&mut self) -> Option<OwnedFd> {
        self.log.take()
    }

    /// The sandbox's cgroup(s), for memory usage and OOM checks.
    pub fn cgroup(&self) -> &dyn Cgroup {
        self.res.cgroup.as_ref()
    }

    /// Reaps the first process if it has exited, without blocking. Returns its status
    /// once it is known. Stops of a traced stub are not reported (and are consumed).
    pub fn wait_exit(&mut self) -> Result<Option<ExitStatus>, SandboxError> {
        self.wait_inner(false)
    }

    /// Blocks until the first process exits (or is killed) and reaps it.
    pub fn wait(&mut self) -> Result<ExitStatus, SandboxError> {
        loop {
            if let Some(s) = self.wait_inner(true)? {
                return Ok(s);
            }
            if self.reaped {
                return Err(SandboxError::Sys {
                    id: self.id.clone(),
                    step: "wait: reaped elsewhere".into(),
                    source: Errno::ECHILD.into(),
                });
            }
        }
    }

    fn wait_inner(&mut self, block: bool) -> Result<Option<ExitStatus>, SandboxError> {
        if self.reaped {
            return Ok(self.exit);
        }
        let mut flags = WaitPidFlag::__WALL;
        if !block {
            flags |= WaitPidFlag::WNOHANG;
        }
        match waitpid(Pid::from_raw(self.pid), Some(flags)) {
            Ok(ws) => {
                if let Some(s) = status_of(ws) {
                    self.exit = Some(s);
                    self.reaped = true;
                }
                Ok(self.exit)
            }
            Err(Errno::ECHILD) => {
                self.reaped = true;
                Ok(None)
            }
            Err(Errno::EINTR) => Ok(None),
            Err(e) => Err(sys_err(&self.id, "waitpid")(e)),
        }
    }

    /// SIGKILLs the whole sandbox (its pid namespace), reaps the first process, kills
    /// anything left in the cgroup and removes the cgroup(s) and the root directory.
    /// Idempotent. Works on a ptrace-stopped stub too (SIGKILL ends any stop); if the
    /// process was already reaped by someone else (ECHILD) that is not an error.
    pub fn kill(&mut self) -> Result<(), SandboxError> {
        if !self.reaped {
            match sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => return Err(SandboxError::Sys { id: self.id.clone(), step: "kill".into(), source }),
            }
            // A frozen sandbox dies only once thawed; the SIGKILL is already pending,
            // so no user code runs in between.
            let _ = self.res.cgroup.thaw();
            // If this thread traces the program (a stub not yet handed over), its exit
            // waits for us, and the init's exit waits for it: collect it first.
            // ECHILD (not traced by this thread) is the normal case.
            if self.main != self.pid {
                let _ = waitpid(Pid::from_raw(self.main), Some(WaitPidFlag::__WALL));
            }
            while !self.reaped {
                self.wait_inner(true)?;
            }
        }
        self.res.init_reaped(self.pidfd.as_fd());
        self.res.cleanup()
    }
}

/// A sandbox's init, cloned into its namespaces and cgroup(s) and sent its config,
/// before it has reported.
pub(crate) struct Launched {
    pub(crate) pid: i32,
    pub(crate) pidfd: OwnedFd,
    /// The config/status socket (fd 4 in the init).
    pub(crate) status: OwnedFd,
    control: OwnedFd,
    log: OwnedFd,
}

impl Launched {
    /// The init's pid and pidfd, for an error path that has to kill it.
    pub(crate) fn child(self) -> Option<(i32, OwnedFd)> {
        Some((self.pid, self.pidfd))
    }
}

pub(crate) type LaunchError = (SandboxError, Option<(i32, OwnedFd)>);

/// Create the sandbox's root directory and cgroup(s), clone its init and send the
/// config (`entry` `None`: a prepared sandbox, see `prepared.rs`). On error, what was
/// created is recorded in `res` and the init (if any) comes with the error.
pub(crate) fn launch(
    spec: &SandboxSpec,
    entry: Option<&Entry>,
    blob: &[u8],
    ops: Vec<config::RootOp>,
    res: &mut Resources,
) -> Result<Launched, LaunchError> {
    let id = spec.id.as_str();
    let fail = |e: SandboxError| (e, None);

    // Host directory that becomes the mount point of the new root.
    match std::fs::create_dir(&res.root_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {
            std::fs::create_dir_all(&spec.run_dir).and_then(|()| std::fs::create_dir(&res.root_dir)).map_err(|source| {
                fail(SandboxError::HostPath { id: id.into(), what: "create root directory", path: res.root_dir.clone(), source })
            })?;
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            return Err(fail(SandboxError::IdInUse { id: id.into(), path: res.root_dir.clone() }));
        }
        Err(source) => {
            return Err(fail(SandboxError::HostPath { id: id.into(), what: "create root directory", path: res.root_dir.clone(), source }))
        }
    }
    res.root_created = true;

    match res.cgroup.create() {
        Ok(()) => res.cgroup_created = true,
        Err(CgroupError::Io { path, source, .. }) if source.kind() == ErrorKind::AlreadyExists => {
            return Err(fail(SandboxError::IdInUse { id: id.into(), path }));
        }
        Err(source) => return Err(fail(SandboxError::Cgroup { id: id.into(), source })),
    }
    res.cgroup.set_limits(&spec.limits).map_err(|source| fail(SandboxError::Cgroup { id: id.into(), source }))?;

    // Everything the child needs, prepared before clone.
    let cfg_bytes = config::encode(&config::init_config(spec, entry, res.root_dir.clone(), ops), blob);
    let cstr = |b: &[u8]| CString::new(b).expect("validated: no NUL");
    let path = cstr(spec.init_exe.as_os_str().as_bytes());
    let argv: Vec<CString> = std::iter::once(path.clone()).chain(spec.init_args.iter().map(|a| cstr(a.as_bytes()))).collect();
    let envp = vec![cstr(b"GLIBC_TUNABLES=glibc.pthread.rseq=0")];

    let devnull = std::fs::File::open("/dev/null")
        .map_err(|source| fail(SandboxError::HostPath { id: id.into(), what: "open", path: "/dev/null".into(), source }))?;
    let (log_r, log_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| fail(sys_err(id, "pipe2")(e)))?;
    let sockpair = || {
        socket::socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| fail(sys_err(id, "socketpair")(e)))
    };
    let (control_parent, control_child) = sockpair()?;
    let (status_parent, status_child) = sockpair()?;
    let joined = crate::netns::take();
    let ce = sys::ChildExec::new(
        path,
        argv,
        envp,
        [devnull.as_fd(), log_w.as_fd(), log_w.as_fd(), control_child.as_fd(), status_child.as_fd()],
        config::error_prefix("dup2 sandbox descriptors"),
        config::error_prefix(&format!("execve {}", spec.init_exe.display())),
        joined.as_ref().map(|ns| (ns.as_fd(), config::error_prefix("join a network namespace used before"))),
    );

    // cgroup v2: born in its cgroup, so no attach (an RCU grace period there) follows.
    let born_in = res.cgroup.clone_target().and_then(|dir| std::fs::File::open(dir).ok()).and_then(|dir| {
        sys::clone_sandbox_into(&ce, dir.as_fd())
            .inspect_err(|e| tracing::debug!(sandbox = id, error = %e, "clone3 into the cgroup refused; cloning and attaching"))
            .ok()
    });
    let in_cgroup = born_in.is_some();
    let (pid, pidfd) = match born_in {
        Some(child) => child,
        None => sys::clone_sandbox(&ce).map_err(|source| fail(SandboxError::Sys { id: id.into(), step: "clone".into(), source }))?,
    };
    drop((ce, devnull, log_w, control_child, status_child));
    // Kept to be used again once the init is reaped (a new one is named by its init).
    res.netns = match joined {
        Some(ns) => Some(ns),
        None if crate::netns::enabled() => std::fs::File::open(format!("/proc/{pid}/ns/net")).ok().map(OwnedFd::from),
        None => None,
    };
    let launched = Launched { pid, pidfd, status: status_parent, control: control_parent, log: log_r };

    // Into the cgroup(s) before the init sees its config.
    if !in_cgroup {
        if let Err(source) = res.cgroup.add_pid(pid) {
            return Err((SandboxError::Cgroup { id: id.into(), source }, launched.child()));
        }
    }
    if let Err(e) = send_all(&launched.status, &cfg_bytes) {
        // EPIPE: the init died early (e.g. exec failed); its report tells why.
        if e != Errno::EPIPE {
            return Err((sys_err(id, "send config")(e), launched.child()));
        }
    }
    Ok(launched)
}

/// The error an init's report describes (its `{"step","errno"}` record), or a
/// protocol error for anything else.
pub(crate) fn report_error(id: &str, rest: &[u8]) -> SandboxError {
    match serde_json::from_slice::<StatusError>(rest) {
        Ok(se) => SandboxError::Init { id: id.into(), step: se.step, source: std::io::Error::from_raw_os_error(se.errno) },
        Err(_) => SandboxError::Protocol { id: id.into(), detail: String::from_utf8_lossy(rest).chars().take(200).collect() },
    }
}

/// Read a launched init's report to the end (its write side is shut down) and, for a
/// stub, seize the stub with the calling thread.
pub(crate) fn finish(id: &str, entry: &Entry, launched: Launched) -> Result<Spawned, LaunchError> {
    let Launched { pid, pidfd, status, control, log } = launched;
    let mut child = Some((pid, pidfd));
    macro_rules! bail {
        ($e:expr) => {
            return Err(($e, child.take()))
        };
    }
    if let Err(e) = setsockopt(&status, sockopt::ReceiveTimeout, &TimeVal::from(libc::timeval {
        tv_sec: INIT_TIMEOUT.as_secs() as _,
        tv_usec: 0,
    })) {
        bail!(sys_err(id, "set SO_RCVTIMEO")(e));
    }
    let mut report = Vec::new();
    match std::fs::File::from(status).read_to_end(&mut report) {
        Ok(_) => {}
        // The init died with our config unread in its socket: same as EOF.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => bail!(SandboxError::Sys { id: id.into(), step: "read init status".into(), source: e }),
    }

    let (want, rest) = match (entry, report.split_first()) {
        (Entry::Exec { .. }, Some((&EXEC_MARK, rest))) => (true, rest),
        (Entry::Stub { .. }, Some((&STUB_MARK, rest))) => (true, rest),
        _ => (false, &report[..]),
    };
    if !rest.is_empty() {
        bail!(report_error(id, rest));
    }
    if !want {
        // EOF without a word: the init died (or init_exe is not a sandbox init).
        let (pid, pidfd) = child.take().expect("child present");
        let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        let status = reap(pid).map(|s| format!("{s:?}")).unwrap_or_else(|| "not reaped".into());
        return Err((SandboxError::InitVanished { id: id.into(), status }, None));
    }

    // The program (or stub) is PID 2, the init's only child at this point.
    // A program that already ended (it may be very short) is represented by the
    // init, which exits with its status.
    let found = match sys::first_child(pid) {
        Ok(m) => m.and_then(|m| sys::pidfd_open(m).ok().map(|fd| (m, fd))),
        Err(_) => None,
    };
    let (main, main_pidfd) = match (found, entry) {
        (Some(x), _) => x,
        (None, Entry::Stub { .. }) => {
            bail!(SandboxError::InitVanished { id: id.into(), status: "the stub (PID 2) is not running".into() })
        }
        (None, Entry::Exec { .. }) => match sys::pidfd_open(pid) {
            Ok(fd) => (pid, fd),
            Err(source) => bail!(SandboxError::Sys { id: id.into(), step: "pidfd_open".into(), source }),
        },
    };
    if let Entry::Stub { .. } = entry {
        // The stub waits in pause(): attach (this thread becomes its tracer) and stop it.
        if let Err(e) = sys::seize_and_stop(main) {
            bail!(sys_err(id, "ptrace-seize the stub")(e));
        }
    }

    let (pid, pidfd) = child.take().expect("child present");
    Ok(Spawned { pid, pidfd, main, main_pidfd, control, log })
}

pub(crate) struct Spawned {
    pid: i32,
    pidfd: OwnedFd,
    main: i32,
    main_pidfd: OwnedFd,
    control: OwnedFd,
    log: OwnedFd,
}

/// Blocking reap for error paths.
pub(crate) fn reap(pid: i32) -> Option<ExitStatus> {
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::__WALL)) {
            Ok(ws) => {
                if let Some(s) = status_of(ws) {
                    return Some(s);
                }
            }
            Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
}

fn send_all(fd: &OwnedFd, mut buf: &[u8]) -> Result<(), Errno> {
    while !buf.is_empty() {
        match socket::send(fd.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            tracing::warn!(sandbox = %self.id, error = %e, source = ?std::error::Error::source(&e), "sandbox cleanup failed");
        }
    }
}

/// Remove what sandboxes of dead processes left behind: their root mount-point
/// directories under `run_dir` and their (empty) cgroup directories. A sandbox
/// id is `<kind>-<owner pid>-...`; entries whose owner is no longer running are
/// stale (its node was killed before it could clean up). Best effort: anything
/// still in use (a cgroup with processes) is left alone. Returns how many
/// entries were removed.
pub fn sweep_stale(run_dir: &std::path::Path, cgroup_root: &std::path::Path) -> usize {
    let owner_dead = |name: &str| -> bool {
        name.split('-')
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    let mut removed = 0;
    let mut parents = vec![run_dir.to_path_buf()];
    for ctrl in ["memory", "cpu", "pids", "freezer"] {
        parents.push(cgroup_root.join(ctrl).join("thaw"));
    }
    parents.push(cgroup_root.join("thaw"));
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(&parent) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.path().is_dir() || !owner_dead(&name) {
                continue;
            }
            // Processes its dead node left frozen would never die (their SIGKILL from
            // PR_SET_PDEATHSIG stays pending): thaw them first.
            for (file, value) in [("freezer.state", "THAWED"), ("cgroup.freeze", "0")] {
                let _ = cgroup::write_if_exists(&e.path().join(file), value);
            }
            if std::fs::remove_dir(e.path()).is_ok() {
                tracing::info!(path = %e.path().display(), "removed a stale sandbox leftover");
                removed += 1;
            }
        }
    }
    removed
}
