//! `thaw snapshot push | pull | gc`: snapshots in an S3-compatible store
//! (the `thaw-store` crate does the work; this is arguments and output).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use thaw_store::{SnapshotUrl, Store, StoreConfig, StoreUrl};

/// How to reach the store. Credentials come from the environment only, as for
/// the AWS tools: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN).
#[derive(Args)]
pub struct StoreArgs {
    /// S3 endpoint, e.g. http://127.0.0.1:9000 for MinIO (default: AWS). Env: AWS_ENDPOINT_URL.
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    endpoint_url: Option<String>,
    /// Region. Env: AWS_REGION.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    region: String,
    /// Give up on the store after this many seconds (a store that is down fails within it).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    store_timeout: u64,
    /// Create the bucket if it does not exist (for test and demo servers).
    #[arg(long)]
    create_bucket: bool,
}

#[derive(Args)]
pub struct PushArgs {
    /// Snapshot directory made by `thaw snapshot create`.
    snapdir: PathBuf,
    /// Store: s3://BUCKET/PREFIX.
    url: String,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Args)]
pub struct PullArgs {
    /// Stored snapshot: s3://BUCKET/PREFIX/ID, as printed by `thaw snapshot push`.
    url: String,
    /// Directory to create (must not exist); appears only once complete and verified.
    dir: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Args)]
pub struct RmArgs {
    /// Stored snapshot: s3://BUCKET/PREFIX/ID.
    url: String,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Args)]
pub struct GcArgs {
    /// Store: s3://BUCKET/PREFIX.
    url: String,
    /// Orphaned chunks younger than this are kept (a publish in flight), and a
    /// condemned chunk is deleted only by a run at least this much later.
    /// Publishes must finish within it. Units: s, m, h.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    grace: Duration,
    #[command(flatten)]
    store: StoreArgs,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("expected a duration like 30s, 10m or 1h, got '{s}'"))?;
    let secs = match unit {
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("unknown unit '{unit}' in '{s}' (use s, m or h)")),
    };
    Ok(Duration::from_secs(secs))
}

#[derive(Args)]
pub struct BundlePushArgs {
    /// The function's code, a zip file (as for Lambda's CreateFunction).
    zip: PathBuf,
    /// Store: s3://BUCKET/PREFIX, the one the agents fetch from (their --snapshot-store).
    url: String,
    #[command(flatten)]
    store: StoreArgs,
}

/// `thaw bundle push`: put a code bundle in the store under its content address and
/// print the `code:` block of a ThawFunction that names it.
pub fn bundle_push(a: BundlePushArgs) -> Result<()> {
    let zip = std::fs::read(&a.zip).with_context(|| format!("reading {}", a.zip.display()))?;
    if !(zip.starts_with(b"PK\x03\x04") || zip.starts_with(b"PK\x05\x06")) {
        bail!("{} is not a zip file", a.zip.display());
    }
    if zip.len() > thaw_store::bundle::MAX_BUNDLE_BYTES {
        bail!("{} is {} bytes, over the {} byte limit of a bundle", a.zip.display(), zip.len(), thaw_store::bundle::MAX_BUNDLE_BYTES);
    }
    let url = StoreUrl::parse(&a.url)?;
    let store = open(&url, &a.store)?;
    let (key, sha) = store.put_bundle(&zip).with_context(|| format!("pushing {} to {url}", a.zip.display()))?;
    eprintln!("pushed {} ({} bytes) to {}", a.zip.display(), zip.len(), url.object_url(&key));
    println!("code:\n  key: {key}\n  sha256: {sha}");
    Ok(())
}

fn open(url: &StoreUrl, a: &StoreArgs) -> Result<Store> {
    let cfg = StoreConfig {
        endpoint: a.endpoint_url.clone(),
        region: Some(a.region.clone()),
        timeout: Some(Duration::from_secs(a.store_timeout)),
        ..Default::default()
    };
    let store = Store::open(url, &cfg)?;
    if a.create_bucket {
        store.ensure_bucket()?;
    }
    Ok(store)
}

fn bar(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

pub fn push(a: PushArgs) -> Result<()> {
    let url = StoreUrl::parse(&a.url)?;
    let store = open(&url, &a.store)?;
    // A diff's base is pushed first (stored once; counted in the bar whether or not it is there).
    let (plan, base) = thaw_store::publish::plan_layered(&a.snapdir)?;
    let pb = bar(plan.uploads.iter().chain(base.iter().flat_map(|b| &b.uploads)).map(|u| u.len).sum(), "push");
    let report = store.push_layered(plan, base, &|n| pb.inc(n));
    pb.finish_and_clear();
    let report = report.with_context(|| format!("pushing {} to {url}", a.snapdir.display()))?;
    eprintln!(
        "pushed {} ({} bytes in {} chunks, {} packs): uploaded {} chunks in {} packs, {} bytes; {} bytes already stored; {} requests; {:.2} s",
        a.snapdir.display(),
        report.snapshot_bytes,
        report.chunks,
        report.packs,
        report.chunks_uploaded,
        report.packs_uploaded,
        report.bytes_uploaded,
        report.bytes_deduplicated,
        report.requests,
        report.seconds
    );
    println!("{}", serde_json::to_string(&report)?);
    println!("{}", report.url);
    Ok(())
}

pub fn pull(a: PullArgs) -> Result<()> {
    let url = SnapshotUrl::parse(&a.url)?;
    if a.dir.exists() {
        bail!("{} already exists", a.dir.display());
    }
    let store = open(&url.store, &a.store)?;
    let m = store.manifest(&url.id)?;
    let total: u64 = m.unique_chunks().iter().map(|(_, n)| n).sum();
    let pb = bar(total, "pull");
    let report = store.pull(&url.id, &a.dir, &|n| pb.inc(n));
    pb.finish_and_clear();
    let report = report.with_context(|| format!("pulling {url}"))?;
    if thaw_engine::image::Snapshot::open(&a.dir).is_ok_and(|s| s.sealer.is_some()) {
        sealed_lz4_frames(&a.dir);
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// A sealed snapshot's working set arrives as the store's zstd frames, which only a
/// holder of the node key can replace: a node rewrites them once the snapshot is
/// here, and so does the CLI with the key it was given (LZ4 decodes at twice zstd's
/// speed, which is what a later restore from this disk waits for), both only for a
/// working set its restores read from ws.lz4 (`ws::LZ4_READ_FROM` or more; a smaller
/// one is read from ws.pages). A clear one got LZ4 frames with its rebuilt ws.pages.
/// Failing only costs that speed: logged. For a sealed snapshot only (the caller has
/// opened it once already).
fn sealed_lz4_frames(dir: &std::path::Path) {
    let written = thaw_engine::instance::LoadedSnapshot::open_checked(dir, false, thaw_engine::fingerprint::CodeCheck::Unchecked)
        .map_err(anyhow::Error::from)
        .and_then(|s| s.compress_working_set_if_read().map_err(anyhow::Error::from));
    match written {
        Ok(true) => tracing::debug!(dir = %dir.display(), "LZ4 frames written for the store's zstd ones"),
        Ok(false) => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %format!("{e:#}"), "the working set keeps the store's zstd frames"),
    }
}

/// `thaw snapshot inspect s3://BUCKET/PREFIX/ID`: the manifest, verified, as JSON.
pub fn inspect(url: &str, a: &StoreArgs) -> Result<()> {
    let url = SnapshotUrl::parse(url)?;
    let store = open(&url.store, a)?;
    let m = store.manifest(&url.id).with_context(|| format!("reading {url}"))?;
    println!("{}", serde_json::to_string_pretty(&m)?);
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    let url = SnapshotUrl::parse(&a.url)?;
    let store = open(&url.store, &a.store)?;
    store.remove(&url.id).with_context(|| format!("removing {url}"))?;
    eprintln!("removed {url}; `thaw snapshot gc` collects the packs only it used");
    Ok(())
}

pub fn gc(a: GcArgs) -> Result<()> {
    let url = StoreUrl::parse(&a.url)?;
    let store = open(&url, &a.store)?;
    let report = store.gc(a.grace).with_context(|| format!("collecting garbage in {url}"))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// The snapshot a restore uses: a local directory, or a stored snapshot
/// fetched into the node cache (pinned while this lives), or — a miss of a snapshot
/// with a head pack — its head only, the rest fetched as the restore faults on it
/// ([`thaw_store::lazy`]) and completed into the cache by [`Resolved::finish`].
pub struct Resolved {
    dir: PathBuf,
    _pin: Option<thaw_store::cache::Handle>,
    /// A diff's base, in the cache.
    _base: Option<thaw_store::cache::Handle>,
    /// For --stats: null for a local directory, else what the fetch did.
    pub stats: serde_json::Value,
    lazy: Option<Lazy>,
    /// A miss: the sandbox the manifest names, prepared while the rest arrives.
    sandboxes: Option<Arc<thaw_sandbox::SandboxPool>>,
}

struct Lazy {
    fill: Arc<thaw_store::lazy::RemoteFill>,
    cache: Arc<thaw_store::cache::Cache>,
    id: String,
}

impl Resolved {
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// A miss: a pool in which the snapshot's sandbox has been in preparation since the
    /// manifest arrived (the restore takes it if it has the shape state.bin asks for).
    pub fn sandboxes(&self) -> Option<Arc<thaw_sandbox::SandboxPool>> {
        self.sandboxes.clone()
    }

    /// What the engine asks for pages not fetched yet (a lazy miss).
    pub fn fill(&self) -> Option<Arc<dyn thaw_engine::pagefiles::PageFill>> {
        self.lazy.as_ref().map(|l| l.fill.clone() as Arc<dyn thaw_engine::pagefiles::PageFill>)
    }

    /// Note what was fetched by the time the first response came back.
    pub fn first_response(&mut self) {
        if let Some(l) = &self.lazy {
            l.fill.first_response();
        }
    }

    /// After the restore: fetch the rest of a lazy miss and install it in the cache
    /// (a failure only means the next restore fetches again). Returns the stats.
    pub fn finish(mut self) -> serde_json::Value {
        let Some(l) = self.lazy.take() else { return self.stats.clone() };
        let before = l.fill.at_first_response().unwrap_or_else(|| l.fill.fetched());
        let completed = l.fill.complete();
        let (requests, bytes) = l.fill.fetched();
        let mut stats = self.stats.clone();
        stats["requests_before_first_response"] = json!(before.0);
        stats["bytes_fetched_before_first_response"] = json!(before.1);
        stats["requests"] = json!(requests);
        stats["bytes_fetched"] = json!(bytes);
        // A base that arrived lazily under it goes into the cache first (pinned until
        // the diff is there), and the diff links it there.
        let installed = completed
            .map_err(anyhow::Error::from)
            .and_then(|()| thaw_engine::image::Snapshot::open(&self.dir).map(|s| s.sealer.is_some()).map_err(anyhow::Error::from))
            .and_then(|sealed| thaw_store::settle_base(&l.cache, &l.fill, &self.dir).map(|base| (sealed, base)).map_err(anyhow::Error::from))
            // With a diff's base settled: its pages are in the working set too.
            .inspect(|(sealed, _base)| if *sealed { sealed_lz4_frames(&self.dir) })
            .and_then(|(_, _base)| l.cache.get(&l.id, &thaw_store::cache::Adopt { dir: self.dir.clone() }).map(drop).map_err(anyhow::Error::from));
        if let Err(e) = &installed {
            tracing::warn!(error = %format!("{e:#}"), "the fetched snapshot was not cached; the next restore fetches it again");
        }
        stats["cached"] = json!(installed.is_ok());
        let _ = std::fs::remove_dir_all(&self.dir);
        stats
    }
}

impl Drop for Resolved {
    /// A lazy miss not finished (the restore failed): its partial files go.
    fn drop(&mut self) {
        if self.lazy.take().is_some() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `snap` as given to `thaw snapshot restore`: a directory, or s3://BUCKET/PREFIX/ID
/// fetched (verified) into DATA_DIR/snapshot-cache unless cached there already. A
/// miss fetches only the snapshot's head when it has one (`THAW_STORE_FETCH=whole`
/// fetches everything first, as before heads).
pub fn resolve(snap: &std::path::Path, data_dir: &std::path::Path, cache_max_bytes: u64) -> Result<Resolved> {
    let Some(url) = snap.to_str().filter(|s| s.starts_with("s3://")) else {
        return Ok(Resolved { dir: snap.to_path_buf(), _pin: None, _base: None, stats: serde_json::Value::Null, lazy: None, sandboxes: None });
    };
    let url = SnapshotUrl::parse(url)?;
    let t0 = std::time::Instant::now();
    let cache_root = data_dir.join("snapshot-cache");
    let cache = thaw_store::cache::Cache::open(&cache_root, cache_max_bytes)?;
    // A hit needs no store: the client (an I/O runtime, TLS roots) is built only on a miss.
    if cache.contains(&url.id) {
        if let Ok(handle) = cache.get(&url.id, &Unreachable) {
            // A diff's base must be cached too (else the miss below fetches both).
            if let Some(base) = thaw_store::linked_base(&cache, handle.dir(), &Unreachable) {
                let stats = json!({"url": url.to_string(), "cache_hit": true, "cached": handle.cached(),
                    "bytes_fetched": 0, "requests": 0, "fetch_ms": t0.elapsed().as_secs_f64() * 1e3});
                return Ok(Resolved { dir: handle.dir().to_path_buf(), _pin: Some(handle), _base: base, stats, lazy: None, sandboxes: None });
            }
        }
    }
    let store = Arc::new(Store::open(&url.store, &StoreConfig::default())?);
    let t_open = t0.elapsed();
    // A miss served from the head reads the head's copy beside the manifest.
    let lazy = thaw_store::lazy::enabled();
    let start = if lazy {
        store.block_on(thaw_store::fetch::manifest_and_head(&store.remote, &url.id)).with_context(|| format!("fetching {url}"))?
    } else {
        let (manifest, manifest_len) = store.block_on(thaw_store::fetch::manifest(&store.remote, &url.id)).with_context(|| format!("fetching {url}"))?;
        thaw_store::fetch::MissStart { manifest, manifest_len, manifest_requests: 1, head: thaw_store::fetch::HeadCopy::none() }
    };
    let (manifest_len, manifest_requests) = (start.manifest_len, start.manifest_requests);
    tracing::debug!(
        store_open_ms = t_open.as_secs_f64() * 1e3,
        manifest_ms = (t0.elapsed() - t_open).as_secs_f64() * 1e3,
        manifest_bytes = manifest_len,
        "manifest fetched"
    );
    // THAW_STORE_EARLY_SANDBOX=1: prepare the sandbox from the manifest's copy of its
    // record while the head arrives. Off by default: since the head's pages arrive
    // beside the restore, preparing it then (a clone of this process, beside the
    // threads receiving the head) made misses slower, not faster (1 Gbit, 11 runs:
    // pyaes 16.07 ms without, 18.17 with; lrserving 56.67, 57.82).
    let early = std::env::var("THAW_STORE_EARLY_SANDBOX").as_deref() == Ok("1");
    let sandboxes = start.manifest.sandbox.as_ref().filter(|_| early).and_then(|rec| match thaw_sandbox::SandboxPool::new(1) {
        Ok(pool) => {
            thaw_engine::instance::prepare_restore_sandbox(&pool, rec);
            Some(Arc::new(pool))
        }
        Err(e) => {
            tracing::debug!(error = %e, "no sandbox prepared during the fetch");
            None
        }
    });
    if lazy {
        let miss = thaw_store::open_miss(&store, &cache, &url.id, start.clone()).with_context(|| format!("fetching {url}"))?;
        if let Some(thaw_store::Miss { fill, dir, base }) = miss {
            let (requests, bytes) = fill.fetched();
            let stats = json!({"url": url.to_string(), "cache_hit": false, "lazy": true, "bytes_fetched": bytes,
                "requests": requests, "fetch_ms": t0.elapsed().as_secs_f64() * 1e3, "sandbox_during_fetch": sandboxes.is_some()});
            let lazy = Lazy { fill, cache, id: url.id.clone() };
            return Ok(Resolved { dir, _pin: None, _base: base, stats, lazy: Some(lazy), sandboxes });
        }
    }
    let source = thaw_store::StoreSource::new(&store).with_manifest(&url.id, start.manifest);
    let (handle, base) = source.cached(&cache, &url.id).with_context(|| format!("fetching {url}"))?;
    let bytes = source.bytes_fetched.load(Ordering::Relaxed) + manifest_len;
    let requests = source.requests.load(Ordering::Relaxed) + manifest_requests;
    let stats = json!({"url": url.to_string(), "cache_hit": false, "cached": handle.cached(), "lazy": false,
        "bytes_fetched": bytes, "requests": requests, "requests_before_first_response": requests,
        "bytes_fetched_before_first_response": bytes, "fetch_ms": t0.elapsed().as_secs_f64() * 1e3, "sandbox_during_fetch": sandboxes.is_some()});
    Ok(Resolved { dir: handle.dir().to_path_buf(), _pin: Some(handle), _base: base, stats, lazy: None, sandboxes })
}

/// The source of a lookup expected to hit (a miss is an error, and the caller
/// then opens the store).
struct Unreachable;

impl thaw_store::cache::Source for Unreachable {
    fn size(&self, id: &str) -> Result<u64, thaw_store::cache::SourceError> {
        Err(format!("snapshot {id} left the cache").into())
    }
    fn fetch(&self, id: &str, _dir: &std::path::Path) -> Result<(), thaw_store::cache::SourceError> {
        Err(format!("snapshot {id} left the cache").into())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("1d").is_err() && parse_duration("h").is_err());
    }
}
