//! How the node captures a revision: a diff on its runtime's base (layered snapshots,
//! see the engine's `layers.rs`) when the node keeps bases and one exists for the
//! function's runtime and memory class (built on the first deploy that needs it, one
//! build at a time; `--no-bases` turns layering off), otherwise a full image. A base
//! that cannot be used or built is logged with why, and the revision gets a full
//! image: a deploy never fails because of layering.

use std::path::{Path, PathBuf};

use thaw_engine::capture::CaptureStats;
use thaw_engine::instance::{FunctionConfig, Instance, InstanceError};
use thaw_engine::layered;
use thaw_engine::layers::{self, BaseMeta};
use tracing::{info, warn};

/// Where the node keeps its runtimes' bases (DATA_DIR/bases; missing ones are built on
/// the first deploy that needs them).
#[derive(Debug, Clone)]
pub struct Bases {
    pub dir: PathBuf,
}

fn base_for(cfg: &FunctionConfig, bases: &Bases) -> Option<BaseMeta> {
    if let Err(e) = layered::usable(cfg) {
        if !matches!(e, layers::LayerError::Unsupported { .. }) {
            info!(function = %cfg.function_name, "{e}");
        }
        return None;
    }
    let building = |key: &layers::BaseKey| {
        info!(runtime = %key.runtime, memory_mb = key.memory_mb, function = %cfg.function_name, "building the runtime's base (once per runtime and memory class; --no-bases for full images)")
    };
    match layered::find_or_build(cfg, &bases.dir, building) {
        Ok(b) => Some(b),
        Err(e) => {
            warn!(error = %crate::node::error_chain(&e), runtime = cfg.runtime.name(), function = %cfg.function_name, "no base for this runtime; capturing a full image");
            None
        }
    }
}

/// Capture `cfg` into `snapdir`: a diff on its base when there is one, else a full image.
pub fn capture(cfg: &FunctionConfig, snapdir: &Path, bases: Option<&Bases>) -> Result<(PathBuf, CaptureStats), InstanceError> {
    if let Some(base) = bases.and_then(|b| base_for(cfg, b)) {
        match layered::create_diff(cfg, &base, snapdir) {
            Ok(c) => {
                if let Some(why) = &c.full_image {
                    info!(function = %cfg.function_name, base = %base.id, "a full image rather than a diff: {why}");
                }
                return Ok((c.dir, c.stats));
            }
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
        "dir": bases.dir,
        "bases": list.iter().map(|m| serde_json::json!({"id": m.id, "runtime": m.key.runtime, "memory_mb": m.key.memory_mb, "bytes": m.bytes})).collect::<Vec<_>>(),
        "bytes": list.iter().map(|m| m.bytes).sum::<u64>(),
    })
}
