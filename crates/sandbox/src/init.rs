//! The sandbox init: PID 1 of the new pid namespace. It reads its [`InitConfig`] from
//! fd 4, builds the root filesystem, and forks PID 2: either the program (exec) or the
//! restore stub (which the caller seizes with ptrace). A prepared sandbox's init
//! (`InitMode::Deferred`) stops before that, with /var/task empty, until the parent
//! sends the function's code as mount descriptors and the stub to start. PID 1 stays behind as the
//! namespace's reaper and exits when PID 2 does. Single-threaded; allocating is fine
//! here.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};
use seccompiler::BpfProgram;

use crate::config::{self, InitConfig, InitMode, RootOp, StatusError, EXEC_MARK, FD_STATUS, PREPARED_MARK, STUB_MARK};
use crate::sys;

const NOFILE_LIMIT: u64 = 1024;

/// A failed step: what was attempted and the errno it failed with.
struct Fail {
    step: String,
    errno: i32,
}

trait Step<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, Fail>;
}

impl<T> Step<T> for nix::Result<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, Fail> {
        self.map_err(|e| Fail { step: what(), errno: e as i32 })
    }
}

impl<T> Step<T> for std::io::Result<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, Fail> {
        self.map_err(|e| Fail { step: what(), errno: e.raw_os_error().unwrap_or(libc::EIO) })
    }
}

/// Entry point of the sandbox init (see [`crate::SandboxSpec::init_exe`]). Never returns.
/// If the process was not started by [`crate::Sandbox::spawn`] it prints a message and
/// exits with status 2.
pub fn sandbox_init_main() -> ! {
    let Some(status) = sys::take_inherited_fd(FD_STATUS) else {
        eprintln!("thaw-sandbox-init: must be started by thaw_sandbox::Sandbox::spawn (no fd {FD_STATUS})");
        sys::exit_now(2)
    };
    let mut status = std::fs::File::from(status);
    let fail = run(&mut status).unwrap_err();
    let mut rec = serde_json::to_vec(&StatusError { step: fail.step, errno: fail.errno }).unwrap_or_default();
    if rec.is_empty() {
        rec = config::error_prefix("report error");
        rec.extend_from_slice(b"0}");
    }
    let _ = status.write_all(&rec);
    sys::exit_now(1)
}

/// Returns only on failure.
fn run(status: &mut std::fs::File) -> Result<std::convert::Infallible, Fail> {
    let frame = read_frame(status).step(|| "read config".into())?;
    fcntl(status.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).step(|| "set CLOEXEC on status fd".into())?;
    let (cfg, blob) =
        config::decode::<InitConfig>(&frame).map_err(|e| Fail { step: format!("decode config: {e}"), errno: libc::EINVAL })?;

    // Before anything is created: the sandbox's files must not depend on the caller's
    // umask (under 077 the mount points would be unreadable to the function's user).
    nix::sys::stat::umask(Mode::from_bits_truncate(0o022));
    build_root(&cfg)?;
    nix::unistd::sethostname(&cfg.hostname).step(|| format!("sethostname {}", cfg.hostname))?;
    sys::loopback_up().step(|| "bring up lo".into())?;
    let null = std::fs::OpenOptions::new().read(true).open("/dev/null").step(|| "open /dev/null".into())?;
    nix::unistd::dup2(null.as_raw_fd(), 0).step(|| "dup2 /dev/null to fd 0".into())?;
    drop(null);
    setrlimit(Resource::RLIMIT_NOFILE, NOFILE_LIMIT, NOFILE_LIMIT).step(|| "setrlimit RLIMIT_NOFILE".into())?;
    sys::close_from(FD_STATUS as u32 + 1).step(|| "close inherited descriptors".into())?;
    let filter = crate::seccomp::deny_list(&denied_syscalls());
    // PID 1 dies with the caller's thread, and the whole namespace with it.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).step(|| "PR_SET_PDEATHSIG".into())?;

    if cfg.mode == InitMode::Deferred {
        return prepared(&cfg, &filter, status);
    }
    mount(None::<&str>, "/", None::<&str>, ro_remount(), None::<&str>).step(|| "remount / read-only".into())?;
    nix::unistd::chdir(&cfg.cwd).step(|| format!("chdir {}", cfg.cwd.display()))?;
    match cfg.mode {
        InitMode::Exec { ref argv } => exec(&cfg, argv, &filter, status),
        InitMode::Stub { addr, len } => stub(addr, len, blob, &filter, status),
        InitMode::Deferred => unreachable!("handled above"),
    }
}

/// A prepared sandbox: fork the stub now (it waits for its code in [`waiting_stub`]),
/// report `PREPARED_MARK`, and wait, as long as it takes, for the function's mounts.
/// Once they are attached and / is read-only, pass the stub its go and become the
/// reaper, as in a stub sandbox.
fn prepared(cfg: &InitConfig, filter: &BpfProgram, status: &mut std::fs::File) -> Result<std::convert::Infallible, Fail> {
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).step(|| "pipe to the stub".into())?;
    let child = match sys::fork().step(|| "fork the stub".into())? {
        Some(child) => child,
        None => {
            drop(tx);
            return waiting_stub(&cfg.cwd, rx, filter, status);
        }
    };
    drop(rx);
    status.write_all(&[PREPARED_MARK]).step(|| "report prepared".into())?;
    let (go, blob) = attach(status)?;
    mount(None::<&str>, "/", None::<&str>, ro_remount(), None::<&str>).step(|| "remount / read-only".into())?;
    std::fs::File::from(tx).write_all(&config::encode(&go, &blob)).step(|| "pass the stub its go".into())?;
    become_reaper(child, filter, status)
}

/// The stub of a prepared sandbox, forked before the function's code is attached: it
/// waits for its go (stub address and code) from the init, then goes on as [`stub`]'s.
fn waiting_stub(cwd: &Path, rx: std::os::fd::OwnedFd, filter: &BpfProgram, status: &mut std::fs::File) -> Result<std::convert::Infallible, Fail> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).step(|| "PR_SET_PDEATHSIG".into())?;
    apply_seccomp(filter)?;
    let frame = read_frame(&mut std::fs::File::from(rx)).step(|| "read the stub's go".into())?;
    let (go, blob) =
        config::decode::<config::Go>(&frame).map_err(|e| Fail { step: format!("decode the stub's go: {e}"), errno: libc::EINVAL })?;
    // Only now: /var/task is the attached code.
    nix::unistd::chdir(cwd).step(|| format!("chdir {}", cwd.display()))?;
    stub_ready(go.addr, go.len, blob, status)
}

/// Flags that make an existing mount read-only (and nosuid, nodev).
pub(crate) fn ro_remount() -> MsFlags {
    MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV
}

/// One frame (see `config.rs`), read exactly: the socket stays open for what follows.
fn read_frame(status: &mut std::fs::File) -> std::io::Result<Vec<u8>> {
    let mut header = [0u8; config::HEADER_LEN];
    status.read_exact(&mut header)?;
    read_body(status, header)
}

fn read_body(status: &mut std::fs::File, header: [u8; config::HEADER_LEN]) -> std::io::Result<Vec<u8>> {
    let mut frame = header.to_vec();
    frame.resize(config::HEADER_LEN + config::body_len(&header), 0);
    status.read_exact(&mut frame[config::HEADER_LEN..])?;
    Ok(frame)
}

/// A prepared sandbox's second step: receive the [`config::Go`] frame with its mount
/// descriptors (detached trees the parent cloned with `open_tree`) and attach each at
/// its mount point, read-only. Returns the frame and the stub blob.
fn attach(status: &mut std::fs::File) -> Result<(config::Go, Vec<u8>), Fail> {
    let (header, fds) = sys::recv_with_fds::<{ config::HEADER_LEN }>(status.as_fd()).step(|| "receive the code mounts".into())?;
    let frame = read_body(status, header).step(|| "read the go frame".into())?;
    let (go, blob) =
        config::decode::<config::Go>(&frame).map_err(|e| Fail { step: format!("decode go frame: {e}"), errno: libc::EINVAL })?;
    if go.binds.len() != fds.len() {
        return Err(Fail { step: format!("{} mounts for {} mount points", fds.len(), go.binds.len()), errno: libc::EINVAL });
    }
    for ((dst, dir), fd) in go.binds.iter().zip(fds) {
        mount_point(Path::new("/"), dst, *dir)?;
        rustix::mount::move_mount(
            &fd,
            "",
            rustix::fs::CWD,
            dst,
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(|e| Fail { step: format!("attach the mount at {}", dst.display()), errno: e.raw_os_error() })?;
        mount(None::<&str>, dst, None::<&str>, ro_remount(), None::<&str>)
            .step(|| format!("remount {} read-only", dst.display()))?;
    }
    Ok((go, blob.to_vec()))
}

/// Create `dst` (inside `root`) as a directory or an empty file unless it exists.
fn mount_point(root: &Path, dst: &Path, dir: bool) -> Result<(), Fail> {
    let mut dirs = std::fs::DirBuilder::new();
    dirs.recursive(true).mode(0o755);
    let mkdir = |p: &Path| dirs.create(inside(root, p)).step(|| format!("mkdir {}", p.display()));
    if dir {
        return mkdir(dst);
    }
    if let Some(parent) = dst.parent() {
        mkdir(parent)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(inside(root, dst))
        .step(|| format!("create mount point {}", dst.display()))?;
    Ok(())
}

fn inside(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

fn build_root(cfg: &InitConfig) -> Result<(), Fail> {
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).step(|| "make / rprivate".into())?;
    let root = &cfg.root;
    mount(Some("tmpfs"), root, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(config::ROOT_TMPFS_OPTS))
        .step(|| format!("mount root tmpfs at {}", root.display()))?;
    let mut dirs = std::fs::DirBuilder::new();
    dirs.recursive(true).mode(0o755);
    let mkdir = |p: &Path| dirs.create(inside(root, p)).step(|| format!("mkdir {}", p.display()));
    let ro_flags = ro_remount();
    for op in &cfg.ops {
        match op {
            RootOp::Bind { src, dst, dir, readonly } => {
                let target = inside(root, dst);
                mount_point(root, dst, *dir)?;
                let what = || format!("bind-mount {} at {}", src.display(), dst.display());
                mount(Some(src.as_path()), &target, none, MsFlags::MS_BIND | MsFlags::MS_REC, none).step(what)?;
                if *readonly {
                    mount(none, &target, none, ro_flags, none)
                        .step(|| format!("remount {} read-only", dst.display()))?;
                }
            }
            RootOp::Symlink { target, dst } => {
                if let Some(parent) = dst.parent() {
                    mkdir(parent)?;
                }
                std::os::unix::fs::symlink(target, inside(root, dst))
                    .step(|| format!("symlink {} -> {}", dst.display(), target.display()))?;
            }
            RootOp::Tmpfs { dst, data, noexec } => {
                mkdir(dst)?;
                let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
                if *noexec {
                    flags |= MsFlags::MS_NOEXEC;
                }
                if dst == Path::new("/dev") {
                    // Device nodes are bind-mounted into it.
                    flags.remove(MsFlags::MS_NODEV);
                }
                mount(Some("tmpfs"), &inside(root, dst), Some("tmpfs"), flags, Some(data.as_str()))
                    .step(|| format!("mount tmpfs at {}", dst.display()))?;
            }
            RootOp::Proc { dst } => {
                mkdir(dst)?;
                let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
                mount(Some("proc"), &inside(root, dst), Some("proc"), flags, none)
                    .step(|| format!("mount proc at {}", dst.display()))?;
            }
            RootOp::File { dst, data } => {
                if let Some(parent) = dst.parent() {
                    mkdir(parent)?;
                }
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(inside(root, dst))
                    .and_then(|mut f| f.write_all(data.as_bytes()))
                    .step(|| format!("write {}", dst.display()))?;
            }
            RootOp::Dir { dst } => mkdir(dst)?,
            RootOp::RemountRo { dst } => {
                mount(none, &inside(root, dst), none, ro_flags, none)
                    .step(|| format!("remount {} read-only", dst.display()))?;
            }
        }
    }
    // pivot_root(".", "."): the old root ends up stacked on the new one and is detached
    // right away, so no put_old directory is needed.
    nix::unistd::chdir(root).step(|| format!("chdir {}", root.display()))?;
    nix::unistd::pivot_root(".", ".").step(|| "pivot_root".into())?;
    umount2(".", MntFlags::MNT_DETACH).step(|| "detach old root".into())?;
    nix::unistd::chdir("/").step(|| "chdir /".into())?;
    // `run` makes / read-only once a prepared sandbox has its mounts attached.
    Ok(())
}

/// Denied with EPERM; everything else is allowed (the restore engine injects prctl,
/// userfaultfd, mmap, rseq, setresuid, ... into the stub).
pub(crate) fn denied_syscalls() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_ptrace,
        libc::SYS_setns,
        libc::SYS_unshare,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_open_by_handle_at,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_lookup_dcookie,
        libc::SYS_syslog,
        // Reviewed against Docker's default profile (moby profiles/seccomp/default.json):
        // io_uring bypasses syscall filtering for the operations it submits and has been
        // a steady source of kernel exploits; the rest need privileges a function never
        // has, or reach other processes' memory or the NUMA placement of the host.
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_kcmp,
        libc::SYS_move_pages,
        libc::SYS_migrate_pages,
        libc::SYS_mbind,
        libc::SYS_set_mempolicy,
        libc::SYS_clock_adjtime,
        libc::SYS_clock_settime,
        libc::SYS_settimeofday,
        libc::SYS_name_to_handle_at,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_mount_setattr,
        libc::SYS_vhangup,
        libc::SYS_ustat,
        libc::SYS_sysfs,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_uselib]);
    v
}

fn apply_seccomp(filter: &BpfProgram) -> Result<(), Fail> {
    // Also sets PR_SET_NO_NEW_PRIVS.
    seccompiler::apply_filter(filter).map_err(|e| Fail {
        step: "install seccomp filter".into(),
        errno: match &e {
            seccompiler::Error::Prctl(io) | seccompiler::Error::Seccomp(io) => io.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EINVAL,
        },
    })
}

fn cstring(s: &str, what: &str) -> Result<CString, Fail> {
    CString::new(s).map_err(|_| Fail { step: format!("{what} contains NUL"), errno: libc::EINVAL })
}

/// Exec mode: fork the program as PID 2 of the namespace and stay behind as its
/// reaper. The child reports `EXEC_MARK` right before `execve` (its status copy is
/// CLOEXEC, so a successful exec is EOF) or a failure record.
fn exec(cfg: &InitConfig, argv: &[String], filter: &BpfProgram, status: &mut std::fs::File) -> Result<std::convert::Infallible, Fail> {
    let path = cstring(&argv[0], "argv[0]")?;
    let c_argv = argv.iter().map(|a| cstring(a, "argv")).collect::<Result<Vec<_>, _>>()?;
    let c_env = cfg.env.iter().map(|(k, v)| cstring(&format!("{k}={v}"), "env")).collect::<Result<Vec<_>, _>>()?;
    match sys::fork().step(|| "fork the program".into())? {
        Some(child) => become_reaper(child, filter, status),
        None => {
            set_pdeathsig_and_drop(cfg)?;
            nix::sys::prctl::set_no_new_privs().step(|| "PR_SET_NO_NEW_PRIVS".into())?;
            apply_seccomp(filter)?;
            status.write_all(&[EXEC_MARK]).step(|| "report exec".into())?;
            let err = nix::unistd::execve(&path, &c_argv, &c_env).unwrap_err();
            Err(Fail { step: format!("execve {}", argv[0]), errno: err as i32 })
        }
    }
}

/// In the forked program: default signal dispositions, the sandbox's identity, and
/// death with the init (a credential change clears the parent-death signal, so it
/// is set after).
fn set_pdeathsig_and_drop(cfg: &InitConfig) -> Result<(), Fail> {
    sys::reset_signals();
    nix::unistd::setgroups(&[]).step(|| "setgroups []".into())?;
    let gid = Gid::from_raw(cfg.gid);
    let uid = Uid::from_raw(cfg.uid);
    nix::unistd::setresgid(gid, gid, gid).step(|| format!("setresgid {}", cfg.gid))?;
    nix::unistd::setresuid(uid, uid, uid).step(|| format!("setresuid {}", cfg.uid))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).step(|| "PR_SET_PDEATHSIG".into())
}

/// Stub mode: fork the restore stub as PID 2. It maps the injection region, reports
/// `STUB_MARK` and waits in `pause()` for the caller to seize it with ptrace (the
/// restore then rebuilds the image's process inside it). It keeps root: the restore
/// drops to the image's credentials by injection.
fn stub(addr: u64, len: usize, blob: &[u8], filter: &BpfProgram, status: &mut std::fs::File) -> Result<std::convert::Infallible, Fail> {
    match sys::fork().step(|| "fork the stub".into())? {
        Some(child) => become_reaper(child, filter, status),
        None => {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).step(|| "PR_SET_PDEATHSIG".into())?;
            apply_seccomp(filter)?;
            stub_ready(addr, len, blob, status)
        }
    }
}

/// The stub, confined: map the injection region, report `STUB_MARK` and wait in
/// `pause()` to be seized.
fn stub_ready(addr: u64, len: usize, blob: &[u8], status: &mut std::fs::File) -> Result<std::convert::Infallible, Fail> {
    sys::map_stub(addr, len, blob).step(|| format!("map stub at {addr:#x}+{len:#x}"))?;
    status.write_all(&[STUB_MARK]).step(|| "report stub".into())?;
    // `status` is never used or dropped again: this branch ends in _exit.
    nix::unistd::close(status.as_raw_fd()).step(|| "close status fd".into())?;
    loop {
        nix::unistd::pause();
    }
}

/// What PID 1 does once the program (PID 2) runs: hold nothing of the program's
/// (its descriptors are closed here, so the caller sees EOF when the program dies),
/// reap every process that ends in the namespace — orphans are reparented to PID 1,
/// and zombies would otherwise pile up to pids.max — and exit when the program does,
/// with its exit code, or 128 + the signal that killed it (PID 1 cannot die by a
/// signal raised from inside its namespace). Exiting tears the namespace down.
fn become_reaper(program: i32, filter: &BpfProgram, status: &mut std::fs::File) -> ! {
    let _ = nix::unistd::close(status.as_raw_fd());
    let _ = sys::close_from(0);
    // Unprivileged processes of the sandbox cannot signal or trace a root PID 1;
    // the filter also keeps it from doing anything but reaping.
    let _ = apply_seccomp(filter);
    sys::reap_until(program)
}
