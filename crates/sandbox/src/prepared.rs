//! Sandboxes built ahead of need: everything but the function.
//!
//! Creating a sandbox costs a few milliseconds (namespaces, a cgroup attach that on
//! cgroup v2 hosts waits for an RCU grace period, a dozen mounts, pivot_root), most of
//! a restore's time. None of it depends on the function, only on its shape (limits,
//! runtime directory, identity), so [`Sandbox::prepare`] does it all in advance and
//! leaves the init waiting with an empty /var/task. [`Prepared::start`] then sends the
//! function's code as detached mounts (`open_tree(OPEN_TREE_CLONE)` on the host,
//! passed with SCM_RIGHTS, attached with `move_mount` inside) with the restore stub,
//! and the init goes on exactly as a stub sandbox made by [`Sandbox::spawn`] does.
//!
//! A prepared sandbox is used once: nothing runs in it before `start`, and the
//! sandbox it becomes is killed like any other. Its init is a child of the thread
//! that prepared it and dies with that thread (PR_SET_PDEATHSIG), so prepare on a
//! thread that lives as long as the sandboxes it makes (see `pool.rs`).

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::socket;

use crate::config::{self, RealFs, CODE_DIR, OPT_DIR, PREPARED_MARK};
use crate::error::SandboxError;
use crate::sandbox::{self, Launched, Resources};
use crate::spec::{Entry, SandboxSpec};
use crate::{sys, Sandbox};

/// A sandbox whose init has built everything but /var/task and waits for
/// [`Prepared::start`]. Dropping it kills the init and removes what it created.
pub struct Prepared {
    id: String,
    launched: Option<Launched>,
    res: Option<Resources>,
}

impl Sandbox {
    /// Build a sandbox of `spec`'s shape without its function: `spec.code_dir` is not
    /// used (the code comes with [`Prepared::start`]); `spec.env` and `cwd` are those
    /// of the sandbox it becomes. Returns once the init reports its root is built.
    pub fn prepare(spec: &SandboxSpec) -> Result<Prepared, SandboxError> {
        spec.validate()?;
        let id = spec.id.as_str();
        let ops = config::plan(spec, &RealFs, true)?;
        let mut res = Resources::new(spec);
        let launched = sandbox::launch(spec, None, &[], ops, &mut res).and_then(|mut l| match wait_prepared(id, &mut l) {
            Ok(()) => Ok(l),
            Err(e) => Err((e, l.child())),
        });
        match launched {
            Ok(l) => Ok(Prepared { id: id.to_string(), launched: Some(l), res: Some(res) }),
            Err(e) => Sandbox::assemble(id, Err(e), res).map(|_| unreachable!("an error stays an error")),
        }
    }
}

/// Read the init's one-byte report that its root is built (or its error record).
fn wait_prepared(id: &str, l: &mut Launched) -> Result<(), SandboxError> {
    let mut status = std::fs::File::from(l.status.try_clone().map_err(|source| SandboxError::Sys {
        id: id.into(),
        step: "dup the status socket".into(),
        source,
    })?);
    // An init that hangs (a mount that never returns) must not hang the pool's thread.
    let timeout = nix::sys::time::TimeVal::from(libc::timeval { tv_sec: sandbox::INIT_TIMEOUT.as_secs() as _, tv_usec: 0 });
    socket::setsockopt(&status, socket::sockopt::ReceiveTimeout, &timeout)
        .map_err(|e| SandboxError::Sys { id: id.into(), step: "set SO_RCVTIMEO".into(), source: e.into() })?;
    let mut mark = [0u8; 1];
    match status.read(&mut mark) {
        Ok(1) if mark[0] == PREPARED_MARK => Ok(()),
        Ok(1) => {
            let mut rest = mark.to_vec();
            let _ = status.read_to_end(&mut rest);
            Err(sandbox::report_error(id, &rest))
        }
        Ok(_) => Err(SandboxError::InitVanished { id: id.into(), status: "ended before its root was built".into() }),
        Err(source) => Err(SandboxError::Sys { id: id.into(), step: "read init status".into(), source }),
    }
}

impl Prepared {
    /// The id the sandbox keeps once started.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Attach `code_dir` at /var/task, `opt_dir` (if any) at /opt and each of
    /// `ro_binds` (host paths, files or directories) at the same path, all read-only,
    /// and start `entry` (a restore stub) as [`Sandbox::spawn`] would: the calling
    /// thread becomes the stub's tracer. On error the prepared sandbox is gone; the
    /// caller can spawn a new one.
    pub fn start(mut self, code_dir: &Path, opt_dir: Option<&Path>, ro_binds: &[PathBuf], entry: &Entry) -> Result<Sandbox, SandboxError> {
        let id = self.id.clone();
        entry.validate(&id)?;
        let Entry::Stub { addr, len, blob } = entry else {
            return Err(SandboxError::InvalidSpec { id, reason: "a prepared sandbox starts only a restore stub".into() });
        };
        let launched = self.launched.take().expect("a prepared sandbox is started once");
        let res = self.res.take().expect("resources until started");
        let spawned = match send_go(&id, &launched, code_dir, opt_dir, ro_binds, *addr, *len, blob) {
            Ok(()) => {
                let _ = socket::shutdown(launched.status.as_raw_fd(), socket::Shutdown::Write);
                sandbox::finish(&id, entry, launched)
            }
            Err(e) => Err((e, launched.child())),
        };
        Sandbox::assemble(&id, spawned, res)
    }
}

/// The go frame: one detached, cloned mount per bind, and the stub.
#[allow(clippy::too_many_arguments)]
fn send_go(
    id: &str,
    l: &Launched,
    code_dir: &Path,
    opt_dir: Option<&Path>,
    ro_binds: &[PathBuf],
    addr: u64,
    len: usize,
    blob: &[u8],
) -> Result<(), SandboxError> {
    let mut binds = Vec::with_capacity(2 + ro_binds.len());
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(binds.capacity());
    let dirs = std::iter::once((code_dir, Path::new(CODE_DIR))).chain(opt_dir.map(|o| (o, Path::new(OPT_DIR))));
    for (src, dst) in dirs.chain(ro_binds.iter().map(|p| (p.as_path(), p.as_path()))) {
        let host_err = |what: &'static str| {
            let path = src.to_path_buf();
            move |source: std::io::Error| SandboxError::HostPath { id: id.into(), what, path, source }
        };
        if !src.is_absolute() {
            return Err(host_err("bind source")(std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let dir = std::fs::metadata(src).map_err(host_err("bind source"))?.is_dir();
        if (dst == Path::new(CODE_DIR) || dst == Path::new(OPT_DIR)) && !dir {
            return Err(host_err(if dst == Path::new(CODE_DIR) { "code_dir" } else { "opt_dir" })(std::io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        fds.push(detached_clone(src).map_err(host_err("clone the mount of"))?);
        binds.push((dst.to_path_buf(), dir));
    }
    let frame = config::encode(&config::Go { binds, addr, len }, blob);
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    sys::send_with_fds(l.status.as_fd(), &frame, &borrowed)
        .map_err(|source| SandboxError::Sys { id: id.into(), step: "send the code mounts".into(), source })
}

/// Host path `src` (and what is mounted under it) as a detached mount, to be moved
/// into a sandbox (`move_mount`).
pub(crate) fn detached_clone(src: &Path) -> std::io::Result<OwnedFd> {
    use rustix::mount::OpenTreeFlags;
    let flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_RECURSIVE;
    Ok(rustix::mount::open_tree(rustix::fs::CWD, src, flags)?)
}

impl Drop for Prepared {
    fn drop(&mut self) {
        let Some(l) = self.launched.take() else { return };
        let _ = sys::pidfd_send_signal(l.pidfd.as_fd(), libc::SIGKILL);
        let reaped = sandbox::reap(l.pid).is_some();
        if let Some(mut res) = self.res.take() {
            if reaped {
                res.init_reaped(l.pidfd.as_fd());
            }
            if let Err(e) = res.cleanup() {
                tracing::warn!(sandbox = %self.id, error = %e, "prepared sandbox cleanup failed");
            }
        }
    }
}
