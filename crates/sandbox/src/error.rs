//! Errors of this crate. Messages carry context only; the cause is the `#[source]`.

use std::io;
use std::path::PathBuf;

/// Errors from the cgroup layer.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroupfs operation (`mkdir`, `write`, `read`, `rmdir`) failed on `path`.
    #[error("cgroup {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A cgroupfs file had unexpected content.
    #[error("cgroup file {path}: cannot parse {content:?}")]
    Parse { path: PathBuf, content: String },
}

/// Staging the minimal /etc as a host directory (`etc::stage`) failed: `op` on
/// `path`. The sandbox then gets the minimal /etc entry by entry instead.
#[derive(Debug, thiserror::Error)]
#[error("staging the minimal /etc: {op} {path}")]
pub struct EtcStageError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Errors from [`crate::Sandbox`] operations.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The spec or entry is invalid; nothing was created.
    #[error("sandbox {id}: invalid spec: {reason}")]
    InvalidSpec { id: String, reason: String },
    /// A host path named by the spec cannot be used.
    #[error("sandbox {id}: {what} {path}")]
    HostPath {
        id: String,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Another sandbox (or a leftover of one) uses this id.
    #[error("sandbox {id}: id already in use ({path} exists)")]
    IdInUse { id: String, path: PathBuf },
    /// cgroup setup, query or teardown failed.
    #[error("sandbox {id}: cgroup")]
    Cgroup {
        id: String,
        #[source]
        source: CgroupError,
    },
    /// A host-side system call made by the parent failed.
    #[error("sandbox {id}: {step}")]
    Sys {
        id: String,
        step: String,
        #[source]
        source: io::Error,
    },
    /// The sandbox init reported a failed setup step (e.g.
    /// `bind-mount /usr at /usr`) with its errno.
    #[error("sandbox {id}: {step}")]
    Init {
        id: String,
        step: String,
        #[source]
        source: io::Error,
    },
    /// The init exited or stopped without reporting success or an error.
    #[error("sandbox {id}: init ended unexpectedly ({status})")]
    InitVanished { id: String, status: String },
    /// The init sent something that is not part of the protocol.
    #[error("sandbox {id}: malformed status from init: {detail}")]
    Protocol { id: String, detail: String },
}
