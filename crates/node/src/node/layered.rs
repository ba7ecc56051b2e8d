//! How the node captures a revision: a diff on its runtime's base (layered snapshots,
//! see the engine's `layers.rs`) when the node keeps bases and one exists for the
//! function's runtime and memory class (built on demand with `--build-bases`),
//! otherwise a full image. A base that cannot be used or built is logged and the
//! revision gets a full image: a deploy never fails because of layering.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use thaw_engine::capture::CaptureStats;
use thaw_engine::instance::{FunctionConfig, Instance, InstanceError};
use thaw_engine::layered;
use thaw_engine::layers::{self, BaseMeta};
use tracing::{info, warn};

/// Where the node keeps bases, and whether it builds missing ones.
#[derive(Debug, Clone)]
pub struct Bases {
    pub dir: PathBuf,
    pub build: bool,
}

/// One base build at a time (two deploys of one runtime would build it twice).
static BUILDING: Mutex<()> = Mutex::new(());

fn base_for(cfg: &FunctionConfig, bases: &Bases) -> Option<BaseMeta> {
    if let Err(e) = layered::usable(cfg) {
        if !matches!(e, layers::LayerError::Unsupported { .. }) {
            info!(function = %cfg.function_name, "{e}");
        }
        return None;
    }
    let key = layered::key_for(cfg);
    let find = || layers::find(&bases.dir, &key).map_err(|e| warn!(error = %e, "listing the bases")).ok().flatten();
    if let Some(b) = find() {
        return Some(b);
    }
    if !bases.build {
        return None;
    }
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = find() {
        return Some(b);
    }
    if let Err(e) = std::fs::create_dir_all(&bases.dir) {
        warn!(error = %e, dir = %bases.dir.display(), "cannot create the bases directory");
        return None;
    }
    match layered::build_base(cfg, &bases.dir) {
        Ok(b) => {
            info!(base = %b.id, runtime = %b.key.runtime, memory_mb = b.key.memory_mb, bytes = b.bytes, "base built");
            Some(b)
        }
        Err(e) => {
            warn!(error = %crate::node::error_chain(&e), runtime = cfg.runtime.name(), "building the base failed; full images for this runtime");
            None
        }
    }
}

/// Capture `cfg` into `snapdir`: a diff on its base when there is one, else a full image.
pub fn capture(cfg: &FunctionConfig, snapdir: &Path, bases: Option<&Bases>) -> Result<(PathBuf, CaptureStats), InstanceError> {
    if let Some(base) = bases.and_then(|b| base_for(cfg, b)) {
        match layered::create_diff(cfg, &base, snapdir) {
            Ok(r) => return Ok(r),
            // The function's own init failed: a full image would fail the same way.
            Err(e @ (InstanceError::Init(_) | InstanceError::InitOutOfMemory { .. })) => return Err(e),
            Err(e) => {
                warn!(base = %base.id, error = %crate::node::error_chain(&e), "no diff on the base; capturing a full image");
                let _ = std::fs::remove_dir_all(snapdir);
            }
        }
    }
    Instance::boot_for_snapshot(cfg)?.capture(snapdir)
}

/// Set the bases' gauges (scraped with /metrics).
pub fn set_metrics(bases: &Bases, m: &crate::metrics::Metrics) {
    let list = layers::list(&bases.dir).unwrap_or_default();
    m.bases.set(list.len() as i64);
    m.bases_bytes.set(list.iter().map(|b| b.bytes).sum::<u64>() as i64);
    m.shared_memory_bytes.set(thaw_engine::sharedmem::resident_bytes() as i64);
}

/// The bases in `bases` for `thaw status`: id, runtime, memory class, bytes.
pub fn describe(bases: &Bases) -> serde_json::Value {
    let list = layers::list(&bases.dir).unwrap_or_default();
    serde_json::json!({
        "dir": bases.dir, "build_on_demand": bases.build,
        "bases": list.iter().map(|m| serde_json::json!({"id": m.id, "runtime": m.key.runtime, "memory_mb": m.key.memory_mb, "bytes": m.bytes})).collect::<Vec<_>>(),
        "bytes": list.iter().map(|m| m.bytes).sum::<u64>(),
    })
}
