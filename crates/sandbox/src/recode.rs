//! Replacing the code of a live sandbox (issue #30, repurposing): an idle instance of a
//! runtime's base becomes an instance of another function without a new sandbox.
//!
//! The new code is attached as a prepared sandbox's is (see `prepared.rs`): the host
//! directory is cloned as a detached mount (`open_tree(OPEN_TREE_CLONE)`), then moved
//! onto /var/task inside. Here the sandbox runs already, so instead of passing the
//! mount to its init, a thread of ours joins the sandbox's mount namespace: it
//! unshares its filesystem attributes (a thread that shares them may not change mount
//! namespace), `setns`, detaches the old /var/task (lazily: whatever still has it open
//! keeps it), moves the new one there and makes it read-only, and ends (its namespace
//! goes with it). Nothing runs inside the sandbox for it.
//!
//! The caller makes sure nothing of the previous tenant runs any more (killed, or
//! reset) before it replaces the code, and moves the processes that stay (their
//! current directory, for one) onto the new /var/task.

use std::path::Path;

use nix::sched::CloneFlags;
use rustix::mount::{MoveMountFlags, UnmountFlags};

use crate::config::CODE_DIR;
use crate::error::SandboxError;
use crate::Sandbox;

impl Sandbox {
    /// Put host directory `code_dir` at /var/task in place of the code there, read-only,
    /// as a sandbox created for it would have it. On error the sandbox should be killed:
    /// /var/task may be empty.
    pub fn replace_code(&self, code_dir: &Path) -> Result<(), SandboxError> {
        let id = self.id().to_string();
        let host_err = |source: std::io::Error| SandboxError::HostPath { id: id.clone(), what: "code_dir", path: code_dir.to_path_buf(), source };
        if !code_dir.is_absolute() || !std::fs::metadata(code_dir).map_err(host_err)?.is_dir() {
            return Err(host_err(std::io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        let tree = crate::prepared::detached_clone(code_dir).map_err(host_err)?;
        let sys = |step: &str| {
            let (id, step) = (id.clone(), step.to_string());
            move |source: std::io::Error| SandboxError::Sys { id, step, source }
        };
        let ns = std::fs::File::open(format!("/proc/{}/ns/mnt", self.init_pid())).map_err(sys("open the sandbox's mount namespace"))?;
        std::thread::scope(|s| {
            s.spawn(|| -> Result<(), SandboxError> {
                nix::sched::unshare(CloneFlags::CLONE_FS).map_err(|e| sys("unshare CLONE_FS")(e.into()))?;
                nix::sched::setns(&ns, CloneFlags::CLONE_NEWNS).map_err(|e| sys("join the sandbox's mount namespace")(e.into()))?;
                rustix::mount::unmount(CODE_DIR, UnmountFlags::DETACH).map_err(|e| sys("detach the old /var/task")(e.into()))?;
                rustix::mount::move_mount(&tree, "", rustix::fs::CWD, CODE_DIR, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
                    .map_err(|e| sys("attach the new /var/task")(e.into()))?;
                nix::mount::mount(None::<&str>, CODE_DIR, None::<&str>, crate::init::ro_remount(), None::<&str>).map_err(|e| sys("remount /var/task read-only")(e.into()))
            })
            .join()
            .unwrap_or_else(|_| Err(sys("replace the code")(std::io::Error::other("the thread panicked"))))
        })
    }
}
