//! Thaw's snapshot store: snapshots published to S3-compatible object storage,
//! content-addressed, and fetched back verified.
//!
//! Data flow: snapshot directory → [`publish`] (chunks, then the manifest) →
//! S3 → [`fetch`] (verified, atomic) → snapshot directory → restore.
//! [`remote`] is the object layer (URLs, configuration, verified objects),
//! [`manifest`] the format of a stored snapshot, [`gc`] the collector of
//! orphaned chunks. See README.md for the layout and the invariants.
//!
//! [`Store`] is a blocking facade over the async layers (it owns a small tokio
//! runtime); do not call it from inside another tokio runtime.

pub mod bundle;
pub mod cache;
pub mod error;
pub mod events;
pub mod fetch;
pub mod gc;
pub mod lazy;
pub mod manifest;
pub mod pack;
pub mod publish;
pub mod remote;

/// Re-exported for callers handling object bytes.
pub use bytes;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use error::{Result, StoreError};
pub use fetch::PullReport;
pub use gc::GcReport;
pub use manifest::Manifest;
pub use publish::{Plan, PushReport};
pub use remote::{Remote, SnapshotUrl, StoreConfig, StoreUrl};

/// A snapshot store at `s3://BUCKET/PREFIX`.
pub struct Store {
    pub remote: Remote,
    rt: tokio::runtime::Runtime,
    /// Bases arriving lazily under the diffs that missed them, by stored id (see
    /// [`open_miss`]): a diff of one of them that misses meanwhile shares it. Each
    /// entry is locked while its base opens (misses of other bases do not wait).
    lazy_bases: Mutex<HashMap<String, Arc<Mutex<std::sync::Weak<lazy::LazyBase>>>>>,
}

impl Store {
    pub fn open(url: &StoreUrl, cfg: &StoreConfig) -> Result<Store> {
        let t0 = Instant::now();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("thaw-store")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Local { dir: ".".into(), what: "starting the I/O runtime".into(), source: e })?;
        // The client spawns nothing at build time, but building it inside the
        // runtime keeps any future background task on it.
        let t_rt = t0.elapsed();
        let remote = rt.block_on(async { Remote::new(url, cfg) })?;
        tracing::debug!(runtime_ms = t_rt.as_secs_f64() * 1e3, client_ms = (t0.elapsed() - t_rt).as_secs_f64() * 1e3, "store opened");
        Ok(Store { remote, rt, lazy_bases: Mutex::new(HashMap::new()) })
    }

    pub fn url(&self) -> &StoreUrl {
        &self.remote.url
    }

    /// The URL of snapshot `id` in this store.
    pub fn snapshot_url(&self, id: &str) -> SnapshotUrl {
        SnapshotUrl { store: self.remote.url.clone(), id: id.to_string() }
    }

    /// Run a future of the async layers to completion.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Run a future of the async layers in the background.
    pub(crate) fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.spawn(f)
    }

    /// Run `f` on the store's runtime from a task of another runtime and await it
    /// there (the S3 client's connections live on the store's runtime).
    pub async fn run<F>(&self, f: F) -> Result<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.spawn(f).await.map_err(|e| StoreError::Task { detail: e.to_string() })
    }

    pub fn ensure_bucket(&self) -> Result<()> {
        self.rt.block_on(self.remote.ensure_bucket())
    }

    /// Publish the snapshot in `dir`: put the chunks the store lacks into packs,
    /// then the manifest (see [`pack`]). `progress(bytes)` is called as chunks land
    /// (the total is at most the sum of `plan.uploads` lengths).
    /// `THAW_STORE_FORMAT=1` publishes each chunk as an object of its own instead
    /// (the format before packs, kept to measure against).
    pub fn push_plan(&self, plan: &Plan, progress: &(dyn Fn(u64) + Sync)) -> Result<PushReport> {
        if plan.base_dir.is_some() && plan.manifest.base.is_none() {
            return Err(StoreError::Snapshot { dir: plan.dir.clone(), detail: "a diff is pushed after its base (Store::push)".into() });
        }
        let t0 = Instant::now();
        let r = &self.remote;
        let files = &plan.manifest.files;
        let stored: u64 = plan.uploads.iter().map(|u| u.len).sum();
        let mut report = PushReport {
            snapshot_bytes: plan.manifest.total_bytes(),
            chunks: files.iter().map(|f| f.chunks.len()).sum(),
            zero_chunks: files.iter().flat_map(|f| &f.chunks).filter(|c| c.sha256.is_none()).count(),
            ..Default::default()
        };
        if std::env::var("THAW_STORE_FORMAT").as_deref() == Ok("1") {
            let (chunks_uploaded, bytes) = self.rt.block_on(async {
                let condemned = gc::condemned(r).await?;
                let sent = publish::upload(r, plan, 0..plan.uploads.len(), &condemned, progress).await?;
                publish::commit(r, plan).await?;
                Ok::<_, StoreError>(sent)
            })?;
            report.id = plan.id.clone();
            report.chunks_uploaded = chunks_uploaded;
            report.bytes_uploaded = bytes + plan.manifest_bytes.len() as u64;
            report.bytes_deduplicated = stored - bytes;
            report.requests = 1 + plan.uploads.len() as u64 + chunks_uploaded as u64 + 1;
        } else {
            let p = self.rt.block_on(async {
                let condemned = gc::condemned(r).await?;
                pack::publish(r, plan, &condemned, progress).await
            })?;
            report.id = p.id;
            report.chunks_uploaded = p.chunks_uploaded;
            report.packs = p.packs;
            report.packs_uploaded = p.packs_uploaded;
            report.bytes_uploaded = p.bytes_uploaded;
            report.head_copy_bytes = p.head_copy_bytes;
            report.bytes_deduplicated = stored - p.chunk_bytes_uploaded;
            report.requests = p.requests + 1;
        }
        report.url = self.snapshot_url(&report.id).to_string();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    /// [`publish::plan`] + [`Store::push_plan`]. A diff's base is pushed first (a
    /// snapshot of its own, stored once for all its diffs), and the diff names it.
    pub fn push(&self, dir: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<PushReport> {
        let (plan, base) = publish::plan_layered(dir)?;
        self.push_layered(plan, base, progress)
    }

    /// [`Store::push`] of a snapshot planned by [`publish::plan_layered`].
    pub fn push_layered(&self, mut plan: Plan, base: Option<Plan>, progress: &(dyn Fn(u64) + Sync)) -> Result<PushReport> {
        let mut pushed_base = None;
        if let Some(b) = base {
            if std::env::var("THAW_STORE_FORMAT").is_ok_and(|f| f == "1" || f == "2") {
                return Err(StoreError::Snapshot { dir: plan.dir.clone(), detail: "a diff names its base in format 3 only (THAW_STORE_FORMAT)".into() });
            }
            let r = self.push_plan(&b, progress)?;
            plan.set_base(&r.id);
            pushed_base = Some(r);
        }
        let mut report = self.push_plan(&plan, progress)?;
        if let Some(b) = pushed_base {
            report.requests += b.requests;
            report.bytes_uploaded += b.bytes_uploaded;
            report.head_copy_bytes += b.head_copy_bytes;
            report.base = Some(b.id);
        }
        Ok(report)
    }

    /// Fetch snapshot `id` into `dest` (verified; `dest` appears only when complete).
    pub fn pull(&self, id: &str, dest: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<PullReport> {
        self.rt.block_on(fetch::pull(&self.remote, id, dest, progress))
    }

    /// The verified manifest of snapshot `id`.
    pub fn manifest(&self, id: &str) -> Result<Manifest> {
        self.manifest_with_len(id).map(|(m, _)| m)
    }

    /// [`Store::manifest`], and its size in bytes.
    pub fn manifest_with_len(&self, id: &str) -> Result<(Manifest, u64)> {
        self.rt.block_on(fetch::manifest(&self.remote, id))
    }

    /// Delete snapshot `id` (its manifest, recorded working set and head copy, the
    /// copy's first part before its second; its
    /// packs become orphans for [`Store::gc`] unless other snapshots use them).
    pub fn remove(&self, id: &str) -> Result<()> {
        let key = Remote::manifest_key(id);
        if self.rt.block_on(self.remote.head(&key))?.is_none() {
            return Err(StoreError::NotFound { object: self.remote.url.object_url(&key) });
        }
        for extra in [Remote::ws_key(id), Remote::head_key(id), Remote::head_rest_key(id)] {
            match self.rt.block_on(self.remote.delete(&extra)) {
                Ok(()) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.rt.block_on(self.remote.delete(&key))
    }

    /// What a miss of snapshot `id` fetches first: its manifest and, in parallel,
    /// its head copy (see [`fetch::manifest_and_head`]).
    pub fn miss_start(&self, id: &str) -> Result<fetch::MissStart> {
        self.rt.block_on(fetch::manifest_and_head(&self.remote, id))
    }

    /// Publish the working set recorded in `dir` (ws.trace) for stored snapshot
    /// `id`, replacing any earlier one. Returns its size.
    pub fn put_working_set(&self, id: &str, dir: &Path) -> Result<u64> {
        let trace = std::fs::read(dir.join(thaw_engine::ws::TRACE_FILE)).map_err(StoreError::local(dir, "reading ws.trace"))?;
        let n = trace.len() as u64;
        self.rt.block_on(self.remote.put(&Remote::ws_key(id), bytes::Bytes::from(trace)))?;
        Ok(n)
    }

    /// Collect orphaned packs and chunks (see [`gc`]).
    pub fn gc(&self, grace: Duration) -> Result<GcReport> {
        self.rt.block_on(gc::gc(&self.remote, grace))
    }
}

/// A miss of a stored snapshot served from its head (see [`lazy`]).
pub struct Miss {
    pub fill: Arc<lazy::RemoteFill>,
    /// Where it is assembled: a scratch directory of the cache (see
    /// [`cache::Cache::scratch_dir`]), moved into the cache once complete.
    pub dir: PathBuf,
    /// A diff's base, in the cache, linked beside it (None for a base arriving
    /// lazily too: see [`lazy::RemoteFill::lazy_base`] and [`settle_base`]).
    pub base: Option<cache::Handle>,
}

/// Stored snapshot `id` (`start`: its manifest and the head's copy, read in
/// parallel), missing from `cache`, served from its head. A diff's base, when the
/// cache lacks it, is served from its own head the same way (its manifest and head
/// copy, in parallel: the base's pages the diff's working set needs arrive with the
/// diff's head), shared by the diffs of it that miss until it is complete
/// ([`settle_base`]); `THAW_STORE_BASE=whole` fetches it whole into the cache first,
/// as before. None: the snapshot has no head (fetch it whole). The fill counts the
/// manifest (and a base fetched whole) as fetched before the head.
pub fn open_miss(store: &Arc<Store>, cache: &Arc<cache::Cache>, id: &str, start: fetch::MissStart) -> Result<Option<Miss>> {
    let fetch::MissStart { manifest: m, manifest_len, manifest_requests, head } = start;
    if m.head.is_none() {
        return Ok(None);
    }
    let t0 = Instant::now();
    let source = StoreSource::new(store).with_manifest(id, m.clone());
    let lazy_base = match &m.base {
        Some(b) if !cache.contains(b) && std::env::var("THAW_STORE_BASE").as_deref() != Ok("whole") => {
            // The base's start, where the diff's copy carries it (THAW_STORE_HEAD_BASE=0:
            // read apart, the baseline).
            let carried = match std::env::var("THAW_STORE_HEAD_BASE").as_deref() {
                Ok("0") => None,
                _ => store.block_on(head.base()),
            };
            lazy_base(store, cache, b, carried)?
        }
        _ => None,
    };
    let base = match (&m.base, &lazy_base) {
        (Some(b), None) => Some(source.cached(cache, b).map_err(Box::new)?.0),
        _ => None,
    };
    let dir = cache.scratch_dir(id).map_err(Box::new)?;
    let base_dir = base.as_ref().map(|b| b.dir()).or(lazy_base.as_ref().map(|(b, _)| b.fill.dir()));
    // Before the lazy open: a diff's base (opened lazily or taken from the cache) and
    // the scratch directory.
    let t_before = t0.elapsed();
    let opened = base_dir.map_or(Ok(()), |b| fetch::link_base(&dir, b)).and_then(|()| lazy::open(store.clone(), m, id, &dir, head, lazy_base));
    tracing::debug!(base_and_dir_ms = t_before.as_secs_f64() * 1e3, ms = t0.elapsed().as_secs_f64() * 1e3, "miss opened");
    match opened {
        Ok(Some(fill)) => {
            fill.count_before_head(manifest_requests + source.requests.load(std::sync::atomic::Ordering::Relaxed), manifest_len + source.bytes_fetched.load(std::sync::atomic::Ordering::Relaxed));
            Ok(Some(Miss { fill, dir, base }))
        }
        Ok(None) | Err(_) => {
            let _ = std::fs::remove_dir_all(&dir);
            opened.map(|_| None)
        }
    }
}

/// Base `id` arriving lazily: the one a miss of another of its diffs opened, still
/// arriving (and not failed), or opened now from the start the diff's copy `carried`
/// ([`fetch::carried_start`]), else from its manifest and head copy (read in parallel;
/// `true`: opened by this miss). None: it has no head (fetch it whole).
fn lazy_base(store: &Arc<Store>, cache: &Arc<cache::Cache>, id: &str, carried: Option<bytes::Bytes>) -> Result<Option<(Arc<lazy::LazyBase>, bool)>> {
    let entry = {
        let mut bases = store.lazy_bases.lock().unwrap_or_else(|p| p.into_inner());
        // Entries of bases gone (not one a miss holds, about to open it or opening it).
        bases.retain(|_, e| Arc::strong_count(e) > 1 || e.try_lock().map_or(true, |w| w.strong_count() > 0));
        bases.entry(id.to_string()).or_default().clone()
    };
    // Held while this base opens: a second diff of it waits for that one, not fetch it twice.
    let mut slot = entry.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = slot.upgrade().filter(|b| !b.fill.failed()) {
        return Ok(Some((b, false)));
    }
    // From the start the diff's copy carried (no round trip before the restore), else
    // read: its manifest and copy.
    let start = match carried.and_then(|first| store.block_on(fetch::carried_start(&store.remote, id, first))) {
        Some(start) => start,
        None => store.block_on(fetch::manifest_and_head(&store.remote, id))?,
    };
    if start.manifest.base.is_some() {
        return Err(StoreError::BadManifest { object: store.remote.url.object_url(&Remote::manifest_key(id)), detail: "a base that is itself a diff".into() });
    }
    let dir = cache.scratch_dir(id).map_err(Box::new)?;
    match lazy::open(store.clone(), start.manifest, id, &dir, start.head, None) {
        Ok(Some(fill)) => {
            fill.count_before_head(start.manifest_requests, start.manifest_len);
            let b = Arc::new(lazy::LazyBase { id: id.to_string(), fill });
            *slot = Arc::downgrade(&b);
            Ok(Some((b, true)))
        }
        r => {
            let _ = std::fs::remove_dir_all(&dir);
            r.map(|_| None)
        }
    }
}

/// Once the lazy miss of a diff is complete ([`lazy::RemoteFill::complete`]), before
/// the diff in `dir` moves into the cache: its lazily fetched base goes into the
/// cache too (its files linked, so that the other diffs still assembled on it keep
/// theirs), and the diff's link to it is pointed there, atomically. Returns the
/// base's pin. None: the diff's base was in the cache already, or it is no diff.
pub fn settle_base(cache: &Arc<cache::Cache>, fill: &lazy::RemoteFill, dir: &Path) -> std::result::Result<Option<cache::Handle>, cache::CacheError> {
    let Some(b) = fill.lazy_base() else { return Ok(None) };
    let handle = cache.get(&b.id, &cache::Link { dir: b.fill.dir().to_path_buf() })?;
    let ioe = |what: &str| {
        let (root, what) = (dir.to_path_buf(), what.to_string());
        move |source| cache::CacheError::Io { root, what, source }
    };
    let link = dir.join(thaw_engine::layers::BASE_LINK);
    let tmp = dir.join(format!(".{}.new", thaw_engine::layers::BASE_LINK));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(handle.dir(), &tmp).map_err(ioe("linking the cached base"))?;
    std::fs::rename(&tmp, &link).map_err(ioe("linking the cached base"))?;
    Ok(Some(handle))
}

/// The base that the cached snapshot in `dir` links beside it (a diff, see
/// `thaw_engine::layers::BASE_LINK`), pinned from `cache` (through `source` if it
/// is not there). `Some(None)`: not a diff. `None`: the link does not lead to the
/// cache's entry of that base (it went): the diff must be fetched again with it.
pub fn linked_base(cache: &Arc<cache::Cache>, dir: &Path, source: &dyn cache::Source) -> Option<Option<cache::Handle>> {
    let Ok(target) = std::fs::read_link(dir.join(thaw_engine::layers::BASE_LINK)) else { return Some(None) };
    let id = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    cache.get(&id, source).ok().filter(|b| b.dir() == target).map(Some)
}

/// The store as the node cache's [`cache::Source`]: snapshots fetched whole
/// (a few ranged reads of packs) and verified (chunk hashes, then the image opens).
pub struct StoreSource<'a> {
    pub store: &'a Store,
    manifests: Mutex<HashMap<String, Manifest>>,
    /// Bytes read from the store by fetches through this source.
    pub bytes_fetched: std::sync::atomic::AtomicU64,
    /// Requests made to the store by fetches through this source (manifests included).
    pub requests: std::sync::atomic::AtomicU64,
    /// Where the bases of the diffs this source fetches are (by stored id).
    bases: Mutex<HashMap<String, PathBuf>>,
}

impl<'a> StoreSource<'a> {
    pub fn new(store: &'a Store) -> StoreSource<'a> {
        StoreSource {
            store,
            manifests: Mutex::new(HashMap::new()),
            bytes_fetched: Default::default(),
            requests: Default::default(),
            bases: Mutex::new(HashMap::new()),
        }
    }

    /// Stored snapshot `id` from `cache`, fetched whole into it on a miss. A diff's
    /// base comes first, a snapshot of its own in the cache (fetched once for all its
    /// diffs), linked beside the diff and pinned by the second handle.
    pub fn cached(&self, cache: &Arc<cache::Cache>, id: &str) -> std::result::Result<(cache::Handle, Option<cache::Handle>), cache::CacheError> {
        if cache.contains(id) {
            let h = cache.get(id, self)?;
            match linked_base(cache, h.dir(), self) {
                Some(base) => return Ok((h, base)),
                // Its base went (evicted, or another copy): fetch the diff again with it.
                None => {
                    drop(h);
                    cache.purge(id);
                }
            }
        }
        let m = self.manifest(id).map_err(|e| cache::CacheError::Fetch { id: id.to_string(), source: Box::new(e) })?;
        let base = match &m.base {
            Some(b) => {
                let h = cache.get(b, self)?;
                self.bases.lock().unwrap_or_else(|p| p.into_inner()).insert(b.clone(), h.dir().to_path_buf());
                Some(h)
            }
            None => None,
        };
        Ok((cache.get(id, self)?, base))
    }

    /// Where the base of `m` is, fetched by [`StoreSource::cached`].
    pub fn base_of(&self, m: &Manifest) -> Result<Option<PathBuf>> {
        let Some(b) = &m.base else { return Ok(None) };
        match self.bases.lock().unwrap_or_else(|p| p.into_inner()).get(b) {
            Some(d) => Ok(Some(d.clone())),
            None => Err(StoreError::BadManifest { object: self.store.remote.url.object_url(&Remote::manifest_key(b)), detail: "a diff fetched before its base".into() }),
        }
    }

    /// This source, with the manifest of `id` already fetched (and verified).
    pub fn with_manifest(self, id: &str, m: Manifest) -> StoreSource<'a> {
        self.manifests.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), m);
        self
    }

    pub fn manifest(&self, id: &str) -> Result<Manifest> {
        if let Some(m) = self.manifests.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Ok(m.clone());
        }
        let m = self.store.manifest(id)?;
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.manifests.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), m.clone());
        Ok(m)
    }
}

impl cache::Source for StoreSource<'_> {
    fn size(&self, id: &str) -> std::result::Result<u64, cache::SourceError> {
        let m = self.manifest(id)?;
        // ws.pages, unless stored (format 4), is rebuilt locally: at most one page per trace entry.
        let derived = m.file(thaw_engine::ws::PAGES_FILE).is_none();
        let ws = m.file(thaw_engine::ws::TRACE_FILE).filter(|_| derived).map(|f| f.size.saturating_sub(28) / 16 * 4096).unwrap_or(0);
        Ok(m.total_bytes() + ws)
    }

    fn fetch(&self, id: &str, dir: &Path) -> std::result::Result<(), cache::SourceError> {
        let m = self.manifest(id)?;
        if let Some(base) = self.base_of(&m)? {
            fetch::link_base(dir, &base)?;
        }
        let (requests, bytes) = self.store.block_on(fetch::download(&self.store.remote, &m, dir, &|_| {}))?;
        let ws = self.store.block_on(fetch::working_set(&self.store.remote, &m, id, dir));
        self.bytes_fetched.fetch_add(bytes + ws, std::sync::atomic::Ordering::Relaxed);
        let ws_requests = u64::from(fetch::asks_recorded_trace(&m));
        self.requests.fetch_add(requests as u64 + ws_requests, std::sync::atomic::Ordering::Relaxed);
        thaw_engine::image::Snapshot::open(dir).map_err(|source| StoreError::Image { dir: dir.to_path_buf(), source })?;
        Ok(())
    }
}
