//! Process sandbox for Thaw function instances.
//!
//! Each sandbox is a Linux process tree in its own pid, mount, ipc, uts and net
//! namespaces, confined by cgroups (v1 or v2), a read-only root built from bind mounts,
//! an unprivileged identity and a seccomp deny-list (`seccomp.rs`). Its network
//! namespace is new, or one an ended sandbox left showing no use (`netns.rs`).
//!
//! ```text
//!  caller thread                      sandbox init (PID 1)                 program
//!  ─────────────                      ────────────────────                 ───────
//!  validate spec, plan mounts
//!  mkdir /run/thaw/sandboxes/<id>
//!  create cgroup(s), write limits
//!  clone(NEW{PID,NS,IPC,UTS,NET},VM,VFORK)
//!     └─ child: [setns(net) instead of NEWNET]
//!               dup2 fds 0-4, execve(init_exe) ──▶ sandbox_init_main()
//!  add pid to cgroup(s)
//!  send config (fd 4) ───────────────────────────▶ read config, build root,
//!                                                   pivot_root, hostname, lo up,
//!                                                   rlimits, seccomp
//!                                                   fork PID 2, then reap forever ─┐
//!                                                   Exec: PID 2 drops to uid/gid, execve ──▶ runs
//!                                                   Stub: PID 2 maps blob, pause()
//!  read status (fd 4) until EOF ◀─────────────────── errors: {"step","errno"}
//!  Stub: PTRACE_SEIZE PID 2
//! ```
//!
//! Descriptors in the program: 0 = /dev/null, 1 and 2 = the log pipe
//! ([`Sandbox::take_log`]), 3 = the control socket ([`Sandbox::take_control`]).
//!
//! The caller's thread is the parent of the sandbox's init (and, for a stub, the tracer
//! of PID 2); see
//! [`Sandbox`] for what that implies.
//!
//! # Usage
//! The init is either the small `thaw-sandbox-init` binary of this crate (best linked
//! statically against musl as `thaw-sandbox-init-static`, `scripts/build-init.sh`:
//! glibc's start-up costs ten times its CPU), or the caller's own binary re-exec'd
//! through `/proc/self/exe` (the default) with a marker argument that `main` checks
//! before doing anything else; [`init_exe::default_init`] picks a small binary when it
//! sits next to the caller and comes from the same build:
//!
//! ```no_run
//! use thaw_sandbox::{Entry, Sandbox, SandboxSpec};
//!
//! fn main() {
//!     if std::env::args().nth(1).as_deref() == Some("__sandbox-init") {
//!         thaw_sandbox::sandbox_init_main();
//!     }
//!     let mut spec = SandboxSpec::new("fn-42", "/srv/functions/42");
//!     spec.init_args = vec!["__sandbox-init".into()];
//!     spec.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
//!     let mut sb = Sandbox::spawn(&spec, Entry::Exec { argv: vec!["/usr/bin/python3".into()] }).unwrap();
//!     let _log = sb.take_log();         // the program's stdout + stderr
//!     let _control = sb.take_control(); // the program's fd 3
//!     sb.kill().unwrap();               // or just drop it
//! }
//! ```

#![deny(unsafe_code)]

mod cgroup;
mod config;
mod error;
mod etc;
mod init;
mod netns;
pub mod init_exe;
mod pool;
mod prepared;
mod recode;
mod sandbox;
mod seccomp;
mod spec;
mod sys;

pub use cgroup::{for_sandbox as cgroup_for_sandbox, is_v2 as cgroup_is_v2, Cgroup, CgroupV1, CgroupV2};
pub use error::{CgroupError, EtcStageError, SandboxError};
pub use init::sandbox_init_main;
pub use netns::{stats as netns_stats, NetnsStats};
pub use pool::{PoolStats, SandboxPool};
pub use prepared::Prepared;
pub use sandbox::{sweep_stale, ExitStatus, Sandbox};
pub use spec::{Entry, Limits, SandboxSpec};
