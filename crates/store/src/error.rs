//! Errors of the snapshot store (remote layer, publish, fetch, gc).

use std::io;
use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("invalid store URL '{url}': {reason}")]
    BadUrl { url: String, reason: String },
    #[error("store configuration: {detail}")]
    Config { detail: String, #[source] source: Option<object_store::Error> },
    /// The store could not be reached or refused a request.
    #[error("{op} {object} failed")]
    Remote { op: &'static str, object: String, #[source] source: object_store::Error },
    #[error("{object} not found in the store")]
    NotFound { object: String },
    /// An object's bytes do not hash to its name (or are not the expected size):
    /// corrupt or truncated in the store. Never restored from.
    #[error("{object} is corrupt or truncated ({detail})")]
    Corrupt { object: String, detail: String },
    #[error("manifest {object} is invalid: {detail}")]
    BadManifest { object: String, detail: String },
    #[error("snapshot {dir}: {what}")]
    Local { dir: PathBuf, what: String, #[source] source: io::Error },
    #[error("snapshot {dir} cannot be published: {detail}")]
    Snapshot { dir: PathBuf, detail: String },
    #[error("{dir} already exists")]
    Exists { dir: PathBuf },
    #[error("pulled snapshot {dir} does not open")]
    Image { dir: PathBuf, #[source] source: thaw_engine::image::ImageError },
    /// The node cache, filling from the store (a diff's base, a scratch directory).
    #[error(transparent)]
    Cache(#[from] Box<crate::cache::CacheError>),
    /// A task of the store's runtime panicked or was cancelled.
    #[error("a store task failed: {detail}")]
    Task { detail: String },
    #[error("pulled snapshot {dir}: working set")]
    WorkingSet { dir: PathBuf, #[source] source: thaw_engine::ws::WsError },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// A local I/O error with what was being done.
    pub fn local(dir: &std::path::Path, what: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
        let (dir, what) = (dir.to_path_buf(), what.into());
        move |source| StoreError::Local { dir, what, source }
    }
}
