//! The crate's only `unsafe` code: clone, the pre-exec child, and a few raw syscalls.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};

/// Descriptors installed as 0..=4 in the child, in that order.
pub(crate) const CHILD_FDS: usize = 5;
const CHILD_STACK_SIZE: usize = 64 * 1024;

/// Everything the pre-exec child touches, prepared by the parent. The child only reads
/// it (raw pointers into owned buffers that outlive the clone call) and makes raw
/// async-signal-safe system calls.
pub(crate) struct ChildExec {
    path: CString,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    /// Source descriptors for fds 0..=4 (stdin, stdout, stderr, control, status).
    fds: [RawFd; CHILD_FDS],
    err_dup: Vec<u8>,
    err_exec: Vec<u8>,
    /// A network namespace to join (`setns`) instead of making one, or -1.
    netns: RawFd,
    err_netns: Vec<u8>,
}

impl ChildExec {
    pub(crate) fn new(
        path: CString,
        argv: Vec<CString>,
        envp: Vec<CString>,
        fds: [BorrowedFd<'_>; CHILD_FDS],
        err_dup: Vec<u8>,
        err_exec: Vec<u8>,
        netns: Option<(BorrowedFd<'_>, Vec<u8>)>,
    ) -> Self {
        let argv_ptrs = argv.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let envp_ptrs = envp.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        ChildExec {
            path,
            _argv: argv,
            _envp: envp,
            argv_ptrs,
            envp_ptrs,
            fds: fds.map(|f| f.as_raw_fd()),
            err_dup,
            err_exec,
            netns: netns.as_ref().map_or(-1, |(fd, _)| fd.as_raw_fd()),
            err_netns: netns.map(|(_, e)| e).unwrap_or_default(),
        }
    }
}

/// Runs in the child between clone and execve. It shares the parent's memory
/// (CLONE_VM|CLONE_VFORK, the parent thread is suspended) and must not allocate, lock,
/// unwind or touch anything but `arg`.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `&ChildExec` passed by `clone_sandbox`, which stays borrowed and
    // unmodified until the child has exec'd or exited (CLONE_VFORK).
    let a = unsafe { &*(arg as *const ChildExec) };
    // SAFETY: setns takes a descriptor number and a constant; no memory is passed.
    if a.netns >= 0 && unsafe { libc::setns(a.netns, libc::CLONE_NEWNET) } < 0 {
        child_fail(a.fds[4], &a.err_netns);
    }
    let mut tmp = [-1; CHILD_FDS];
    for (t, &src) in tmp.iter_mut().zip(&a.fds) {
        // SAFETY: plain fcntl on a descriptor number; no memory is passed.
        *t = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 16) };
        if *t < 0 {
            child_fail(a.fds[4], &a.err_dup);
        }
    }
    for (i, &t) in tmp.iter().enumerate() {
        // SAFETY: dup2 on descriptor numbers; the target loses CLOEXEC, the source keeps it.
        if unsafe { libc::dup2(t, i as c_int) } < 0 {
            child_fail(a.fds[4], &a.err_dup);
        }
    }
    // Everything from 5 up goes; the parent's descriptors are CLOEXEC anyway.
    // SAFETY: close_range takes only integers.
    unsafe { libc::syscall(libc::SYS_close_range, 5u32, u32::MAX, 0u32) };
    // SAFETY: path, argv and envp are NUL-terminated strings in NULL-terminated arrays
    // owned by `a`.
    unsafe { libc::execve(a.path.as_ptr(), a.argv_ptrs.as_ptr(), a.envp_ptrs.as_ptr()) };
    child_fail(4, &a.err_exec)
}

/// Writes `prefix` + errno digits + `}` to `fd` and exits; async-signal-safe.
fn child_fail(fd: RawFd, prefix: &[u8]) -> ! {
    // SAFETY: errno is thread-local storage of the (shared) thread pointer; reading it is fine.
    let errno = unsafe { *libc::__errno_location() };
    let mut buf = [0u8; 16];
    let mut n = buf.len();
    buf[n - 1] = b'}';
    n -= 1;
    let mut e = errno.unsigned_abs();
    loop {
        n -= 1;
        buf[n] = b'0' + (e % 10) as u8;
        e /= 10;
        if e == 0 {
            break;
        }
    }
    // SAFETY: writes from valid buffers of the given lengths; _exit never returns and runs
    // no atexit handlers (which belong to the parent).
    unsafe {
        libc::write(fd, prefix.as_ptr().cast(), prefix.len());
        libc::write(fd, buf[n..].as_ptr().cast(), buf.len() - n);
        libc::_exit(1)
    }
}

/// The namespaces a sandbox's first process is cloned into: pid, mount, ipc, uts,
/// and net unless it joins one used before (see `netns.rs`).
fn namespace_flags(ce: &ChildExec) -> c_int {
    let ns = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    if ce.netns >= 0 {
        ns
    } else {
        ns | libc::CLONE_NEWNET
    }
}

/// clone(2)s the sandbox's first process into new pid, mount, ipc, uts and net
/// namespaces (see [`namespace_flags`]) and execs `ce.path` there. Returns its pid and
/// a pidfd once the child has
/// exec'd or failed (CLONE_VFORK). The child is a child of the calling thread.
pub(crate) fn clone_sandbox(ce: &ChildExec) -> io::Result<(i32, OwnedFd)> {
    let mut stack = vec![0u8; CHILD_STACK_SIZE];
    // Stack grows down: pass its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK_SIZE) & !15;
    let flags = namespace_flags(ce) | libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    let mut pidfd: c_int = -1;
    // No signal handler of the parent may run on the child's stack in shared memory: block
    // everything around the clone. The child execs with this mask; the init clears it.
    let mut old = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), Some(&mut old)).map_err(io::Error::from)?;
    // SAFETY: `child_main` only reads `ce` (alive for the whole call) and runs on `stack`,
    // which outlives the child's use of it because CLONE_VFORK suspends us until the child
    // execs or exits. `pidfd` is a valid c_int for CLONE_PIDFD to write.
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut c_void,
            flags,
            ce as *const ChildExec as *mut c_void,
            &mut pidfd as *mut c_int,
        )
    };
    let err = io::Error::last_os_error();
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    drop(stack);
    if pid < 0 {
        return Err(err);
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor (O_CLOEXEC) that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok((pid, pidfd))
}

/// `struct clone_args` of clone3(2) (the fields up to `cgroup`, Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// [`clone_sandbox`], but the child starts in the cgroup (v2) open as `cgroup`
/// (clone3 with CLONE_INTO_CGROUP): no attach afterwards, which on cgroup v2 waits
/// for an RCU grace period. The child is a copy-on-write fork rather than a
/// CLONE_VM child (clone3 would need a hand-made stack switch for that); it runs the
/// same async-signal-safe code before exec, and the parent is suspended until then
/// (CLONE_VFORK). Errors (e.g. ENOSYS, EINVAL on an old kernel) leave no child.
pub(crate) fn clone_sandbox_into(ce: &ChildExec, cgroup: BorrowedFd<'_>) -> io::Result<(i32, OwnedFd)> {
    let mut pidfd: c_int = -1;
    let ns = namespace_flags(ce);
    let args = CloneArgs {
        flags: (ns | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64 | CLONE_INTO_CGROUP,
        pidfd: &mut pidfd as *mut c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..Default::default()
    };
    let mut old = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), Some(&mut old)).map_err(io::Error::from)?;
    // SAFETY: clone3 reads `args` (valid for its size) and writes the pidfd into
    // `pidfd`. Without CLONE_VM the child has its own copy of memory, so calling
    // `child_main` there cannot disturb the parent; it only execs or _exits.
    let pid = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    if pid == 0 {
        child_main(ce as *const ChildExec as *mut c_void);
        // SAFETY: _exit ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(127) };
    }
    let err = io::Error::last_os_error();
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    if pid < 0 {
        return Err(err);
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor (O_CLOEXEC) that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok((pid as i32, pidfd))
}

/// pidfd_open(2).
pub(crate) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments only; the result is checked and owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The first child of process `pid` (host pids, from /proc/PID/task/PID/children).
pub(crate) fn first_child(pid: i32) -> io::Result<Option<i32>> {
    let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    Ok(list.split_whitespace().next().and_then(|p| p.parse().ok()))
}

/// PTRACE_SEIZE `pid` (the calling thread becomes its tracer; it is killed if that
/// thread exits), PTRACE_INTERRUPT it and wait for the stop.
pub(crate) fn seize_and_stop(pid: i32) -> Result<(), nix::errno::Errno> {
    use nix::sys::ptrace::{self, Options};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let p = nix::unistd::Pid::from_raw(pid);
    ptrace::seize(p, Options::PTRACE_O_TRACESYSGOOD | Options::PTRACE_O_EXITKILL)?;
    ptrace::interrupt(p)?;
    loop {
        match waitpid(p, Some(WaitPidFlag::__WALL))? {
            WaitStatus::PtraceEvent(..) | WaitStatus::Stopped(..) => return Ok(()),
            WaitStatus::Exited(..) | WaitStatus::Signaled(..) => return Err(nix::errno::Errno::ESRCH),
            _ => {}
        }
    }
}

/// pidfd_send_signal(2): no pid-reuse race.
pub(crate) fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: c_int) -> io::Result<()> {
    // SAFETY: integer arguments only; NULL siginfo is allowed.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, std::ptr::null::<c_void>(), 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

// ---- init side ----

/// Takes ownership of a descriptor inherited at a fixed number.
pub(crate) fn take_inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: F_GETFD only queries the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the descriptor is open and nothing else in this process owns it: it was
    // installed by the parent at this number for the init alone.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Closes every descriptor >= `from`.
pub(crate) fn close_from(from: u32) -> io::Result<()> {
    // SAFETY: integer arguments only; no owned descriptors above `from` exist in the init.
    let r = unsafe { libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Resets every catchable signal to SIG_DFL and unblocks all signals.
pub(crate) fn reset_signals() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL is always sound; EINVAL for reserved numbers is ignored.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// Runs the calling thread under SCHED_IDLE: only when a core has nothing else to run.
pub(crate) fn idle_priority() -> io::Result<()> {
    // Zeroed rather than a struct literal: musl's sched_param has more fields than
    // glibc's (the sandbox init is built for both).
    // SAFETY: sched_param is plain old data; all-zero is a valid value (priority 0,
    // which SCHED_IDLE requires).
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // SAFETY: `param` is a valid sched_param for the call; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets IFF_UP on the loopback interface of the current network namespace.
pub(crate) fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() with constant arguments; the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes ifru_flags inside `ifr`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just filled ifru_flags, the active union member.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS only reads `ifr`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps `len` (rounded up to pages) RWX private anonymous bytes exactly at `addr`
/// (MAP_FIXED_NOREPLACE) and copies `blob` there. The mapping is deliberately leaked:
/// it is the restore stub's code and data.
pub(crate) fn map_stub(addr: u64, len: usize, blob: &[u8]) -> io::Result<()> {
    let len = (len + 4095) & !4095;
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so no Rust object
    // can be clobbered; the result is checked.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    if p as u64 != addr {
        // Kernels without MAP_FIXED_NOREPLACE treat it as a hint.
        // SAFETY: unmapping the region we just mapped and nobody references.
        unsafe { libc::munmap(p, len) };
        return Err(io::Error::from_raw_os_error(libc::EEXIST));
    }
    // SAFETY: `p` is a fresh writable mapping of `len >= blob.len()` bytes that does not
    // overlap `blob`.
    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), p.cast::<u8>(), blob.len()) };
    Ok(())
}

/// fork(2) of the single-threaded init: `Some(child pid)` in the parent, `None` in the child.
pub(crate) fn fork() -> io::Result<Option<i32>> {
    // SAFETY: the sandbox init is single-threaded (no other thread can hold a lock the
    // child would inherit), so the child may keep running ordinary Rust code.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child.as_raw())),
        nix::unistd::ForkResult::Child => Ok(None),
    }
}

/// PID 1's loop: reap every child that ends (the program and any orphan reparented
/// to us) and exit when `program` ends: with its exit code, or 128 + the signal that
/// killed it.
pub(crate) fn reap_until(program: i32) -> ! {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw() == program => exit_now(code),
            Ok(WaitStatus::Signaled(p, sig, _)) if p.as_raw() == program => exit_now(128 + sig as c_int),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => exit_now(125),
        }
    }
}

/// _exit(2): no atexit handlers, no unwinding.
pub(crate) fn exit_now(code: c_int) -> ! {
    // SAFETY: _exit is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

/// Receive exactly `N` bytes from a stream socket together with the descriptors sent
/// with them (SCM_RIGHTS, received close-on-exec).
pub(crate) fn recv_with_fds<const N: usize>(sock: BorrowedFd<'_>) -> io::Result<([u8; N], Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    let mut buf = [0u8; N];
    let mut fds = Vec::new();
    let mut got = 0;
    while got < N {
        let mut cmsg = nix::cmsg_space!([RawFd; 8]);
        let mut iov = [std::io::IoSliceMut::new(&mut buf[got..])];
        let msg = match recvmsg::<UnixAddr>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: SCM_RIGHTS installed these descriptors in this process just
                // now; nothing else owns them.
                fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if msg.bytes == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += msg.bytes;
    }
    Ok((buf, fds))
}

/// Send all of `bytes` on a stream socket, `fds` attached to the first chunk.
pub(crate) fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [std::io::IoSlice::new(&bytes[sent..])];
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if sent == 0 && !raw.is_empty() { &rights } else { &[] };
        match sendmsg::<UnixAddr>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// clone3 with CLONE_INTO_CGROUP puts the child straight into the cgroup, checked on
    /// the host's cgroup2 hierarchy (the unified one of a hybrid host, or the root of a
    /// v2-only host). Needs root.
    #[test]
    fn clone_into_cgroup_starts_the_child_in_it() {
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .map(std::path::Path::new)
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists())
            .expect("a cgroup2 hierarchy");
        let dir = root.join(format!("thaw-clone3-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let cg = std::fs::File::open(&dir).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let path = CString::new("/bin/sleep").unwrap();
        let argv = vec![path.clone(), CString::new("30").unwrap()];
        let n = null.as_fd();
        let ce = ChildExec::new(path, argv, vec![], [n, n, n, n, n], b"dup".to_vec(), b"exec".to_vec(), None);
        let (pid, pidfd) = clone_sandbox_into(&ce, cg.as_fd()).unwrap();
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap();
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL).unwrap();
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        std::fs::remove_dir(&dir).unwrap();
        assert!(cgroups.lines().any(|l| l.starts_with("0::/") && l.ends_with(name)), "{cgroups}");
        assert_eq!(procs.trim(), pid.to_string());
    }
}
