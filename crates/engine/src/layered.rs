//! Building layered snapshots (issue #31): a runtime's base (the runtime booted with
//! no function, captured waiting for one) and a function's diff on it (the base
//! restored into the function's sandbox, the function loaded, what differs captured).
//! It composes the instance (boot, restore, capture) with the layers' format
//! ([`crate::layers`]: bases on disk, the comparer, page sources), so it sits above
//! both (issue #34: `layers` no longer imports the instance that uses it).

use std::path::{Path, PathBuf};

use tracing::info;

use crate::capture::{CaptureStats, Layer};
use crate::instance::{FunctionConfig, Instance, InstanceError, LoadedSnapshot};
use crate::layers::{add_user, find, install, placeholder, prune_superseded, supported, BaseKey, BaseMeta, Comparer, LayerError};

/// Build (or find) the base for `cfg`'s runtime and sandbox shape in `bases`: boot
/// the runtime with an empty /var/task and no function environment, capture it
/// waiting for its function, install it under its content id.
pub fn build_base(cfg: &FunctionConfig, bases: &Path) -> Result<BaseMeta, InstanceError> {
    supported(cfg.runtime)?;
    let placeholder = placeholder(bases)?;
    let inst = Instance::boot_base(cfg, &placeholder)?;
    let key = key_for(cfg);
    let tmp = bases.join(format!(".building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let (dir, _) = inst.capture_as(&tmp, Layer::Base)?;
    Ok(install(&dir, bases, key)?)
}

/// Beside the bases: held (an exclusive flock) by whoever builds one, so that
/// processes and threads sharing a bases directory build each base once.
const BUILD_LOCK: &str = ".build.lock";

/// The base for `cfg` in `bases`: the newest one built for its key, or, when there is
/// none, one built now (`on_build` is called first, for a progress message; bases of
/// the same shape from older shims that no diff names are removed after it). Builds
/// are one at a time per bases directory, across threads and processes: whoever
/// waited for another's build finds its base and builds nothing.
pub fn find_or_build(cfg: &FunctionConfig, bases: &Path, on_build: impl FnOnce(&BaseKey)) -> Result<BaseMeta, InstanceError> {
    supported(cfg.runtime)?;
    let key = key_for(cfg);
    if let Some(b) = find(bases, &key)? {
        return Ok(b);
    }
    let io = |what: &'static str| move |source| LayerError::Io { path: bases.join(BUILD_LOCK), what, source };
    std::fs::create_dir_all(bases).map_err(io("creating the directory of"))?;
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(bases.join(BUILD_LOCK)).map_err(io("opening"))?;
    lock.lock().map_err(io("locking"))?;
    if let Some(b) = find(bases, &key)? {
        return Ok(b);
    }
    on_build(&key);
    let built = build_base(cfg, bases)?;
    // Bases of older shims for this shape are never used again once no diff names them.
    prune_superseded(bases, &built.key);
    Ok(built)
    // The lock is released when `lock` is closed.
}

/// Variables a runtime reads as it starts, before a base knows its function: a
/// function that sets one gets a full image, so that they take effect.
fn read_at_start(runtime: thaw_runtime::Runtime) -> &'static [&'static str] {
    match runtime {
        thaw_runtime::Runtime::Nodejs20 => &["NODE_OPTIONS"],
        // The JVM's options (the launcher and the VM read them) and which JVM runs.
        thaw_runtime::Runtime::Java17 => &["JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "JAVA_HOME"],
        _ => &[],
    }
}

/// Whether a snapshot of `cfg` can be a diff on a base, and if not why: its runtime
/// can have one ([`supported`]), and nothing of the function is needed before
/// its runtime starts (a Node.js function's NODE_OPTIONS is read as node starts,
/// a Java function's JAVA_TOOL_OPTIONS as the JVM starts, before a base knows the function).
pub fn usable(cfg: &FunctionConfig) -> Result<(), LayerError> {
    supported(cfg.runtime)?;
    if let Some((k, _)) = cfg.env.iter().find(|(k, _)| read_at_start(cfg.runtime).contains(&k.as_str())) {
        return Err(LayerError::Refused(format!(
            "the function sets {k}, which {} reads as it starts, before a base knows the function: its snapshot is a full image",
            cfg.runtime.name()
        )));
    }
    Ok(())
}

/// The base key `cfg` would be layered on.
pub fn key_for(cfg: &FunctionConfig) -> BaseKey {
    BaseKey::of(&cfg.record())
}

/// A diff is kept only when its base can provide at least this share (percent) of
/// the function's resident memory; below it the function is captured as a full image
/// from the same instance. Such a diff saves little disk and no memory to speak of,
/// and costs a second image's open at every restore: bigheap (a 211 MB heap of its
/// own) took 2% of its pages from its base and its diff restored 1.09x slower than its
/// full image (bench/results/layers-bigheap-*). 5%, not more: lrserving's base could
/// provide at most 8% of its resident pages (numpy's zeroed buffers count too) and its
/// diff restores as fast as its full image and shares the base with other functions.
/// `THAW_DIFF_MIN_BASE_SHARE=N` sets the share (0 keeps every diff: the baseline).
pub const MIN_BASE_SHARE_PERCENT: u64 = 5;

/// What [`create_diff`] captured.
#[derive(Debug)]
pub struct Captured {
    pub dir: PathBuf,
    pub stats: CaptureStats,
    /// Set when the function was captured as a full image instead of a diff, saying
    /// why (its base could provide little of its memory).
    pub full_image: Option<String>,
}

fn min_base_share() -> u64 {
    std::env::var("THAW_DIFF_MIN_BASE_SHARE").ok().and_then(|v| v.parse().ok()).unwrap_or(MIN_BASE_SHARE_PERCENT)
}

/// Why a function whose instance has `resident` anonymous pages is better a full
/// image than a diff on a base of `base_pages` stored pages, if it is: at most
/// `base_pages` of its pages can come from the base (an upper bound: some of them the
/// function changed), under `min_share` percent of them.
fn full_image_reason(base_pages: u64, resident: u64, min_share: u64) -> Option<String> {
    (resident > 0 && base_pages.saturating_mul(100) < resident.saturating_mul(min_share)).then(|| {
        format!(
            "its base could provide at most {base_pages} of its {resident} resident pages ({:.1}%, under {min_share}%)",
            base_pages as f64 * 100.0 / resident as f64
        )
    })
}

/// Create a diff snapshot of `cfg` in `out` on `base`: restore the base eagerly into
/// the function's sandbox, let the runtime load the function (its init), capture
/// what differs from the base. A function the base could provide little of (see
/// [`MIN_BASE_SHARE_PERCENT`]) is captured from that instance as a full image.
pub fn create_diff(cfg: &FunctionConfig, base: &BaseMeta, out: &Path) -> Result<Captured, InstanceError> {
    let key = key_for(cfg);
    if key != base.key {
        return Err(LayerError::Refused(format!("base {} was built for {:?}, not {:?}", base.id, base.key, key)).into());
    }
    let snap = LoadedSnapshot::open(&base.dir)?;
    let comparer = Comparer::new(base, &snap.image.pages, snap.source.file(), snap.id)?;
    let mut inst = Instance::restore_as(&snap, crate::pageserver::Paging::Eager, cfg.record())?;
    if let Err(e) = inst.load_function(cfg) {
        inst.kill();
        return Err(e);
    }
    // A process the status of which cannot be read is captured as a diff, as before.
    let resident = crate::procfs::status(inst.pid()).map_or(0, |s| s.rss_anon_kb * 1024 / crate::sys::PAGE_SIZE);
    if let Some(why) = full_image_reason(snap.image.pages.stored_pages(), resident, min_base_share()) {
        let (dir, stats) = inst.capture(out)?;
        info!(dir = %dir.display(), base = %base.id, stored = stats.pages_stored, "full image captured: {why}");
        return Ok(Captured { dir, stats, full_image: Some(why) });
    }
    let (dir, stats) = inst.capture_as(out, Layer::Diff(&comparer))?;
    add_user(base, &dir)?;
    info!(dir = %dir.display(), base = %base.id, stored = stats.pages_stored, from_base = stats.pages_from_base, "diff captured");
    Ok(Captured { dir, stats, full_image: None })
}

#[cfg(test)]
mod tests {
    use super::full_image_reason;

    #[test]
    fn a_base_that_provides_little_gives_a_full_image() {
        // bigheap: a base of 1,360 pages under a 53,000-page instance.
        let why = full_image_reason(1_360, 53_000, 5).expect("a full image");
        assert!(why.contains("at most 1360 of its 53000") && why.contains("2.6%") && why.contains("under 5%"), "{why}");
        // helloworld: the base is most of the instance; lrserving: 8% at most.
        assert_eq!(full_image_reason(1_300, 1_600, 5), None);
        assert_eq!(full_image_reason(1_357, 16_974, 5), None);
        // The edge, and 0 (every diff kept), and an unreadable status.
        assert_eq!(full_image_reason(50, 1_000, 5), None);
        assert!(full_image_reason(49, 1_000, 5).is_some());
        assert_eq!(full_image_reason(1, 1_000_000, 0), None);
        assert_eq!(full_image_reason(1_360, 0, 5), None);
    }
}
