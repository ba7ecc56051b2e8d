//! The node's snapshot store (issue #13): `thaw serve --snapshot-store s3://BUCKET/PREFIX`.
//!
//! With a store configured, a snapshot's home is the store, and this node keeps
//! copies in its bounded cache (`DATA_DIR/snapshot-cache`, `--cache-max-bytes`;
//! see `thaw_store::cache`) instead of in the revision's directory:
//!
//! - **Build.** The captured snapshot is published (chunks, then the manifest),
//!   its id recorded with the revision, and the local files are moved into the
//!   cache (no second copy). A publish that fails (store down) leaves the
//!   snapshot in the revision's directory, served exactly as without a store,
//!   and is retried when the node next starts.
//! - **Restore.** A revision's opened snapshot pins its cache entry. A miss
//!   (evicted, or the local copy lost) fetches it from the store, verified and
//!   once for concurrent starts. If that fails (store down, a corrupt or
//!   truncated object), the start falls back to a cold boot and the next start
//!   tries again; a cached copy that does not open is purged.
//! - **Unload.** A store-backed snapshot that no instance has used for the
//!   keep-alive period is closed, unpinning its entry so the cache may evict it.
//! - **Delete.** When a revision is retired (function deleted, code or
//!   configuration replaced), its stored snapshot's manifest is deleted; its
//!   chunks become orphans (they may be shared), collected every
//!   `--store-gc-interval` by [`SnapshotStore::collect`] or by `thaw snapshot gc`.
//!
//! The store's client is blocking (it owns a small runtime): every call here is
//! made from worker threads, never from the node's async tasks.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use thaw_engine::fingerprint::{self, CodeCheck};
use thaw_engine::instance::LoadedSnapshot;

use thaw_store::cache::{self, Cache, CacheError, Handle};
use thaw_store::{Store, StoreConfig, StoreError, StoreSource, StoreUrl};
use thiserror::Error;
use tracing::{info, warn};

#[derive(Debug, Error)]
pub enum SnapStoreError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// Counters shown by `thaw status` (and its JSON).
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    publish_failures: AtomicU64,
    bytes_uploaded: AtomicU64,
    fetches: AtomicU64,
    fetch_failures: AtomicU64,
    bytes_fetched: AtomicU64,
    /// Misses that started from the snapshot's head (see `thaw_store::lazy`).
    lazy_fetches: AtomicU64,
    /// Lazy misses completed into the cache.
    lazy_settled: AtomicU64,
    removed: AtomicU64,
    working_sets: AtomicU64,
    gc_deleted: AtomicU64,
}

/// A snapshot that arrived lazily is fetched whole after its first response, or
/// this long after its head arrived if no instance has answered by then.
const LAZY_FILL_AT_LATEST: Duration = Duration::from_secs(2);

/// A snapshot in the cache, and a diff's base, pinned while this lives.
pub struct Pinned {
    handle: Handle,
    _base: Option<Handle>,
    /// The lazy miss this snapshot arrived by, for `thaw status`.
    lazy_was: Option<Arc<LazyMiss>>,
}

impl Pinned {
    pub fn dir(&self) -> &Path {
        self.handle.dir()
    }

    pub fn id(&self) -> &str {
        self.handle.id()
    }
}

/// What [`SnapshotStore::get`] gives.
pub enum Fetched {
    /// A complete snapshot in the cache.
    Cached(Pinned),
    /// A miss being served from its head.
    Lazy(Arc<LazyMiss>),
}

/// A snapshot arriving from the store while instances already run on it: its head
/// is in `dir`, `fill` fetches the pages faults need and, in the background,
/// everything else; then it moves into the cache ([`SnapshotSlot::settle`]).
/// `dir` goes when the last user drops it.
pub struct LazyMiss {
    fill: Arc<thaw_store::lazy::RemoteFill>,
    /// A diff's base, in the cache (linked beside the diff).
    base: Option<Handle>,
    dir: PathBuf,
    id: String,
    /// Bytes of the fill already added to the store's counters.
    counted: AtomicU64,
    /// When the head arrived.
    opened: Instant,
}

impl Drop for LazyMiss {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The store plus this node's cache of it.
pub struct SnapshotStore {
    store: Arc<Store>,
    cache: Arc<Cache>,
    n: Counters,
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore").field("url", &self.store.url().to_string()).finish_non_exhaustive()
    }
}

impl SnapshotStore {
    /// Open the store at `url` (no request is made yet: a store that is down does not
    /// stop the node) and the cache at `cache_dir`, bounded to `max_bytes`.
    pub fn open(url: &StoreUrl, cfg: &StoreConfig, cache_dir: &Path, max_bytes: u64) -> Result<SnapshotStore, SnapStoreError> {
        let store = Arc::new(Store::open(url, cfg)?);
        let cache = Cache::open(cache_dir, max_bytes)?;
        Ok(SnapshotStore { store, cache, n: Counters::default() })
    }

    pub fn url(&self) -> &StoreUrl {
        self.store.url()
    }

    /// The code bundle `key` in the store, checked against `sha256` (a ThawFunction's
    /// `spec.code`; see `thaw_store::bundle`). Blocking.
    pub fn bundle(&self, key: &str, sha256: &str) -> Result<Vec<u8>, SnapStoreError> {
        Ok(self.store.get_bundle(key, sha256)?)
    }

    /// Create the bucket if it is missing (test and demo servers).
    pub fn ensure_bucket(&self) -> Result<(), SnapStoreError> {
        Ok(self.store.ensure_bucket()?)
    }

    /// Publish the snapshot in `snapdir` (chunks, then the manifest); returns its id.
    pub fn push(&self, snapdir: &Path) -> Result<String, SnapStoreError> {
        let report = match self.store.push(snapdir, &|_| {}) {
            Ok(r) => r,
            Err(e) => {
                self.n.publish_failures.fetch_add(1, Ordering::Relaxed);
                return Err(e.into());
            }
        };
        self.n.published.fetch_add(1, Ordering::Relaxed);
        self.n.bytes_uploaded.fetch_add(report.bytes_uploaded, Ordering::Relaxed);
        info!(
            snapshot = %report.url, chunks = report.chunks, uploaded = report.chunks_uploaded,
            bytes_uploaded = report.bytes_uploaded, deduplicated = report.bytes_deduplicated,
            ms = report.seconds * 1e3, "snapshot published"
        );
        Ok(report.id)
    }

    /// Move the published snapshot in `snapdir` into the cache as entry `id` (pinned).
    /// `snapdir` is removed either way; None if the move failed (the next use fetches it).
    pub fn adopt(&self, id: &str, snapdir: &Path) -> Option<Pinned> {
        let handle = self
            .cache
            .get(id, &cache::Adopt { dir: snapdir.to_path_buf() })
            .inspect_err(|e| warn!(error = %crate::node::error_chain(e), "moving a published snapshot into the cache"))
            .ok();
        let _ = std::fs::remove_dir_all(snapdir);
        // A diff captured here names its base where this node keeps it.
        handle.map(|handle| Pinned { handle, _base: None, lazy_was: None })
    }

    /// Stored snapshot `id`: from the cache (pinned until dropped), or, on a miss, its
    /// head only — the rest arrives while instances run ([`LazyMiss`]) — or, for a
    /// snapshot without a head (or with `THAW_STORE_FETCH=whole`), fetched whole.
    pub fn get(&self, id: &str) -> Result<Fetched, SnapStoreError> {
        if !self.cache.contains(id) && thaw_store::lazy::enabled() {
            match self.get_lazy(id) {
                Ok(Some(l)) => return Ok(Fetched::Lazy(l)),
                Ok(None) => {}
                Err(e) => {
                    self.n.fetches.fetch_add(1, Ordering::Relaxed);
                    self.n.fetch_failures.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        self.get_whole(id).map(Fetched::Cached)
    }

    fn get_lazy(&self, id: &str) -> Result<Option<Arc<LazyMiss>>, SnapStoreError> {
        let t0 = Instant::now();
        let (m, manifest_len) = self.store.manifest_with_len(id)?;
        let Some(thaw_store::Miss { fill, dir, base }) = thaw_store::open_miss(&self.store, &self.cache, id, m, manifest_len)? else {
            return Ok(None);
        };
        // The base (fetched whole, if not cached) and the head; not the manifest.
        let bytes = fill.fetched().1 - manifest_len;
        self.n.fetches.fetch_add(1, Ordering::Relaxed);
        self.n.lazy_fetches.fetch_add(1, Ordering::Relaxed);
        self.n.bytes_fetched.fetch_add(bytes, Ordering::Relaxed);
        info!(
            snapshot = %self.store.snapshot_url(id), bytes, ms = t0.elapsed().as_secs_f64() * 1e3,
            "snapshot head fetched from the store; the rest follows in the background"
        );
        let counted = AtomicU64::new(fill.counters.bytes.load(Ordering::Relaxed));
        Ok(Some(Arc::new(LazyMiss { fill, base, dir, id: id.to_string(), counted, opened: Instant::now() })))
    }

    fn get_whole(&self, id: &str) -> Result<Pinned, SnapStoreError> {
        let source = StoreSource::new(&self.store);
        let got = source.cached(&self.cache, id).map(|(handle, _base)| Pinned { handle, _base, lazy_was: None });
        let fetched = source.bytes_fetched.load(Ordering::Relaxed);
        if fetched > 0 || got.is_err() {
            self.n.fetches.fetch_add(1, Ordering::Relaxed);
            self.n.bytes_fetched.fetch_add(fetched, Ordering::Relaxed);
        }
        match got {
            Ok(h) => {
                if fetched > 0 {
                    info!(snapshot = %self.store.snapshot_url(id), bytes = fetched, cached = h.handle.cached(), "snapshot fetched from the store");
                }
                Ok(h)
            }
            Err(e) => {
                self.n.fetch_failures.fetch_add(1, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    /// Fetch what a lazy miss still lacks (blocks until it has it all).
    fn complete(&self, l: &LazyMiss) -> std::io::Result<()> {
        let r = l.fill.complete();
        self.count_fetched(l);
        if r.is_err() {
            self.n.fetch_failures.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Add to `bytes_fetched` what lazy miss `l` has fetched since last counted (the
    /// head's pages arrive after the open, beside the restore).
    fn count_fetched(&self, l: &LazyMiss) {
        let now = l.fill.counters.bytes.load(Ordering::Relaxed);
        let before = l.counted.swap(now, Ordering::Relaxed);
        self.n.bytes_fetched.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
    }

    /// Move a completed lazy miss into the cache (pinned). Its directory is empty
    /// afterwards; instances running on its files keep them open.
    fn settle(&self, l: &LazyMiss) -> Result<Pinned, SnapStoreError> {
        let handle = self.cache.get(&l.id, &cache::Adopt { dir: l.dir.clone() })?;
        // Empty now (its files moved); the lazy miss itself stays for `thaw status`.
        let _ = std::fs::remove_dir_all(&l.dir);
        self.n.lazy_settled.fetch_add(1, Ordering::Relaxed);
        info!(snapshot = %self.store.snapshot_url(&l.id), cached = handle.cached(), "a snapshot fetched lazily is complete");
        // Its base stays pinned as long as it (a second pin of the same entry).
        let base = l.base.as_ref().and_then(Handle::pin_again);
        Ok(Pinned { handle, _base: base, lazy_was: None })
    }

    /// Publish stored snapshot `old` again from `dir` (its cached copy), now that a
    /// restore recorded its working set there.
    ///
    /// Published again, the snapshot's head carries the working set, so a cold
    /// restore elsewhere starts after the manifest and the head. It is a new stored
    /// snapshot (the working set is part of what an id names): returns its id (the
    /// same if nothing changed). The cached copy is linked under the new id and the
    /// old stored snapshot deleted.
    pub fn republish(self: &Arc<Self>, old: &str, dir: &Path) -> Result<String, SnapStoreError> {
        let id = self.push(dir)?;
        if id != old {
            self.link_cached(&id, dir);
            self.remove_later(old.to_string());
            self.n.working_sets.fetch_add(1, Ordering::Relaxed);
            info!(snapshot = %self.store.snapshot_url(&id), replaces = old, "snapshot published again with its recorded working set");
        }
        Ok(id)
    }

    /// Cache the snapshot files in `dir` (a cache entry) under `id` too, as links to
    /// the same files. A failure only means the next open fetches it.
    fn link_cached(&self, id: &str, dir: &Path) {
        let linked = self.cache.scratch_dir(id).map_err(SnapStoreError::from).and_then(|tmp| {
            let copy = || -> std::io::Result<()> {
                for e in std::fs::read_dir(dir)? {
                    let e = e?;
                    let to = tmp.join(e.file_name());
                    match std::fs::read_link(e.path()) {
                        Ok(target) => std::os::unix::fs::symlink(target, to)?,
                        Err(_) => std::fs::hard_link(e.path(), to)?,
                    }
                }
                Ok(())
            };
            let r = copy().map_err(|e| SnapStoreError::Cache(CacheError::Io { root: tmp.clone(), what: "linking a snapshot".into(), source: e }));
            let r = r.and_then(|()| self.cache.get(id, &cache::Adopt { dir: tmp.clone() }).map(drop).map_err(Into::into));
            let _ = std::fs::remove_dir_all(&tmp);
            r
        });
        if let Err(e) = linked {
            warn!(error = %crate::node::error_chain(&e), "caching a snapshot published again");
        }
    }


    /// One run of the store's collector (two phases a grace period apart, see
    /// `thaw_store::gc`): chunks no manifest references any more go. Safe with other
    /// nodes collecting the same store. Blocks: call from a blocking thread.
    pub fn collect(&self, grace: Duration) {
        match self.store.gc(grace) {
            Ok(r) => {
                self.n.gc_deleted.fetch_add(r.deleted as u64, Ordering::Relaxed);
                info!(store = %self.store.url(), deleted = r.deleted, deleted_bytes = r.deleted_bytes, condemned = r.condemned, "snapshot store collected");
            }
            Err(e) => warn!(store = %self.store.url(), error = %crate::node::error_chain(&e), "collecting the snapshot store failed; retried at the next interval"),
        }
    }

    /// Drop the cached copy of `id` (it did not open); the next use fetches it again.
    pub fn purge(&self, id: &str) {
        self.cache.purge(id);
    }

    /// Delete stored snapshot `id` in the background (its manifest; the chunks are
    /// collected by `thaw snapshot gc`), and its cached copy once unpinned.
    pub fn remove_later(self: &Arc<Self>, id: String) {
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("thaw-store-rm".into()).spawn(move || {
            me.cache.purge(&id);
            match me.store.remove(&id) {
                Ok(()) | Err(StoreError::NotFound { .. }) => {
                    me.n.removed.fetch_add(1, Ordering::Relaxed);
                    info!(snapshot = %me.store.snapshot_url(&id), "stored snapshot deleted");
                }
                Err(e) => warn!(
                    snapshot = %me.store.snapshot_url(&id), error = %crate::node::error_chain(&e),
                    "deleting a stored snapshot failed; `thaw snapshot rm` removes it by hand"
                ),
            }
        });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start a thread to delete a stored snapshot");
        }
    }

    /// For `thaw status`.
    pub fn status(&self) -> serde_json::Value {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "url": self.store.url().to_string(),
            "published": c(&self.n.published),
            "publish_failures": c(&self.n.publish_failures),
            "bytes_uploaded": c(&self.n.bytes_uploaded),
            "fetches": c(&self.n.fetches),
            "fetch_failures": c(&self.n.fetch_failures),
            "bytes_fetched": c(&self.n.bytes_fetched),
            "lazy_fetches": c(&self.n.lazy_fetches),
            "lazy_settled": c(&self.n.lazy_settled),
            "removed": c(&self.n.removed),
            "working_sets_published": c(&self.n.working_sets),
            "gc_chunks_deleted": c(&self.n.gc_deleted),
            "cache": self.cache.stats(),
        })
    }
}


/// How the node sets up every snapshot it opens.
#[derive(Clone, Default)]
pub(crate) struct OpenSettings {
    /// CPU the page server may spend per instance (see `--fault-cpu-share`).
    pub fault_cpu_share: f64,
    /// Restores take their sandboxes from here (see `--sandbox-pool`).
    pub sandboxes: Option<Arc<thaw_sandbox::SandboxPool>>,
}

impl OpenSettings {
    fn apply(&self, mut snap: LoadedSnapshot) -> LoadedSnapshot {
        snap.source.set_fault_cpu_share(self.fault_cpu_share);
        snap.sandboxes = self.sandboxes.clone();
        snap
    }
}

/// The fingerprint of a revision's files (its code and layers), taken once per node
/// process. The node writes a revision's directory once, at deploy, under its own
/// root-only data directory, and never changes it, so the snapshot opened again after
/// a keep-alive compares fingerprints instead of walking thousands of files after a
/// cold cache (issue #35). The first open of each revision after the node starts pays
/// one walk, unless [`BundlePrint::take`] ran before (after a build, and in the
/// background at start-up).
pub(super) struct BundlePrint {
    code_dir: PathBuf,
    opt_dir: Option<PathBuf>,
    print: std::sync::OnceLock<Result<String, String>>,
}

impl BundlePrint {
    pub(super) fn new(code_dir: PathBuf, opt_dir: Option<PathBuf>) -> BundlePrint {
        BundlePrint { code_dir, opt_dir, print: std::sync::OnceLock::new() }
    }

    /// Walk the bundle now if it was not yet (blocks: call from worker threads).
    pub(super) fn take(&self) -> &Result<String, String> {
        self.print.get_or_init(|| fingerprint::of_bundle(&self.code_dir, self.opt_dir.as_deref()).map_err(|e| e.to_string()))
    }

    /// How an open of this revision's snapshot checks the bundle.
    fn check(&self) -> CodeCheck {
        match self.take() {
            Ok(fp) => CodeCheck::Known { code_dir: self.code_dir.clone(), opt_dir: self.opt_dir.clone(), fingerprint: fp.clone() },
            // Unreadable: the open's own walk says why.
            Err(_) => CodeCheck::Before,
        }
    }
}

/// How a revision holds its opened snapshot: opened on first use and shared by
/// its instances; with a store, pinned in the cache while open and closed again
/// when unused (see the module docs).
pub(super) struct SnapshotSlot {
    state: Mutex<Slot>,
    /// The snapshot's id in the store, once published.
    stored: Mutex<Option<String>>,
    store: Option<Arc<SnapshotStore>>,
    /// Where the snapshot is captured, and kept when there is no store.
    local_dir: PathBuf,
    open: OpenSettings,
    /// Modification time of the recorded working set last published (or being published).
    ws_published: Mutex<Option<SystemTime>>,
    /// What the snapshot's bundle must be.
    pub(super) bundle: BundlePrint,
    /// The stored snapshot was published by another node (a cluster's builder): never
    /// deleted or published again from here.
    adopted: std::sync::atomic::AtomicBool,
}

enum Slot {
    Closed,
    /// `lazy`: the snapshot is still arriving from the store (it has no pin yet).
    Open { snap: Arc<LoadedSnapshot>, _pin: Option<Pinned>, lazy: Option<Arc<LazyMiss>>, last_use: Instant },
    /// A local snapshot that does not open (never retried: it will not change).
    Failed(String),
}

impl SnapshotSlot {
    pub(super) fn new(
        local_dir: PathBuf,
        stored: Option<String>,
        adopted: bool,
        store: Option<Arc<SnapshotStore>>,
        open: OpenSettings,
        bundle: BundlePrint,
    ) -> SnapshotSlot {
        SnapshotSlot {
            bundle,
            adopted: std::sync::atomic::AtomicBool::new(adopted && stored.is_some() && store.is_some()),
            state: Mutex::new(Slot::Closed),
            stored: Mutex::new(stored),
            store,
            local_dir,
            open,
            ws_published: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn stored_id(&self) -> Option<String> {
        self.stored.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the stored snapshot is another node's (see `adopted`).
    pub(super) fn adopted(&self) -> bool {
        self.adopted.load(Ordering::Acquire)
    }

    /// The adopted snapshot does not serve here: forget it (closed), so that the one
    /// captured instead is published as this node's own.
    pub(super) fn unadopt(&self) {
        *self.lock() = Slot::Closed;
        *self.stored.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.adopted.store(false, Ordering::Release);
    }

    /// The opened snapshot. Blocks while it is fetched: call from worker threads.
    pub(super) fn get(&self) -> Result<Arc<LoadedSnapshot>, String> {
        let mut st = self.lock();
        match &mut *st {
            // A lazy miss whose fetch failed (the store went down): instances may have
            // lost pages; start over (a new fetch, or a cold boot while it fails).
            Slot::Open { lazy: Some(l), .. } if l.fill.failed() && !l.fill.is_complete() => {
                warn!(snapshot = %l.id, "a snapshot being fetched lazily lost its store; fetching it again");
                *st = Slot::Closed;
            }
            Slot::Open { snap, last_use, .. } => {
                *last_use = Instant::now();
                return Ok(snap.clone());
            }
            Slot::Failed(e) => return Err(e.clone()),
            Slot::Closed => {}
        }
        let (snap, pin, lazy) = match (&self.store, self.stored_id()) {
            (Some(store), Some(id)) => {
                let h = match store.get(&id).map_err(|e| crate::node::error_chain(&e))? {
                    Fetched::Cached(h) => h,
                    Fetched::Lazy(l) => {
                        let s = LoadedSnapshot::open_filled(&l.dir, false, self.bundle.check(), Some(l.fill.clone() as _))
                            .map_err(|e| format!("snapshot {id}, fetched lazily, does not open: {}", crate::node::error_chain(&e)))?;
                        // The rest of the image follows the first response (see `responded`).
                        let snap = Arc::new(self.open.apply(s));
                        self.note_working_set(&l.dir);
                        *st = Slot::Open { snap: snap.clone(), _pin: None, lazy: Some(l), last_use: Instant::now() };
                        return Ok(snap);
                    }
                };
                self.note_working_set(h.dir());
                match LoadedSnapshot::open_checked(h.dir(), false, self.bundle.check()) {
                    Ok(s) => (s, Some(h), None),
                    Err(e) => {
                        // Verified when fetched, so damaged since: fetch it again next time.
                        drop(h);
                        store.purge(&id);
                        return Err(format!("cached snapshot {id} does not open (purged): {}", crate::node::error_chain(&e)));
                    }
                }
            }
            // A layered snapshot's instances share the pages they do not write.
            _ => match LoadedSnapshot::open_checked(&self.local_dir, true, self.bundle.check()) {
                Ok(s) => (s, None, None),
                Err(e) => {
                    let e = crate::node::error_chain(&e);
                    *st = Slot::Failed(e.clone());
                    return Err(e);
                }
            },
        };
        let snap = Arc::new(self.open.apply(snap));
        *st = Slot::Open { snap: snap.clone(), _pin: pin, lazy, last_use: Instant::now() };
        Ok(snap)
    }

    /// An invocation of an instance of this snapshot answered: a snapshot still
    /// arriving notes what it had fetched by then and fetches the rest now, in the
    /// background (not before: it would compete with the cold start's own faults for
    /// the link and the CPU). Never blocks.
    pub(super) fn responded(&self) {
        let Ok(st) = self.state.try_lock() else { return };
        let Slot::Open { lazy: Some(l), .. } = &*st else { return };
        if !l.fill.first_response() {
            return;
        }
        let (Some(store), job) = (self.store.clone(), l.clone()) else { return };
        store.count_fetched(&job);
        let spawned = std::thread::Builder::new().name("thaw-store-fill".into()).spawn(move || {
            if let Err(e) = store.complete(&job) {
                warn!(snapshot = %job.id, error = %e, "completing a lazily fetched snapshot failed; the next start fetches it again");
            }
        });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start a thread to complete a lazily fetched snapshot; pages arrive as faults need them");
        }
    }

    /// A snapshot that arrived lazily and whose instances have not answered yet (a
    /// provisioned instance, say): its rest is fetched after `wait` anyway.
    fn responded_late(&self, wait: Duration) {
        let due = match self.state.try_lock().as_deref() {
            Ok(Slot::Open { lazy: Some(l), .. }) => l.opened.elapsed() >= wait,
            _ => false,
        };
        if due {
            self.responded();
        }
    }

    /// How the open snapshot was fetched, for `thaw status`: null unless lazily.
    pub(super) fn fetch_status(&self) -> serde_json::Value {
        let Ok(st) = self.state.try_lock() else { return serde_json::Value::Null };
        let (Slot::Open { lazy: Some(l), .. } | Slot::Open { _pin: Some(Pinned { lazy_was: Some(l), .. }), .. }) = &*st else {
            return serde_json::Value::Null;
        };
        let first = l.fill.at_first_response();
        let (requests, bytes) = l.fill.fetched();
        serde_json::json!({
            "lazy": true,
            "requests_before_first_response": first.map(|f| f.0),
            "bytes_fetched_before_first_response": first.map(|f| f.1),
            "requests": requests,
            "bytes_fetched": bytes,
            "complete": l.fill.is_complete(),
        })
    }

    /// Whether a lazy miss has arrived whole (see [`SnapshotSlot::settle`]). Never blocks.
    pub(super) fn lazy_complete(&self) -> bool {
        let Ok(st) = self.state.try_lock() else { return false };
        matches!(&*st, Slot::Open { lazy: Some(l), .. } if l.fill.is_complete())
    }

    /// A lazy miss that has arrived whole: moved into the cache, and the slot reopened
    /// from there (instances running on the old files keep them). Call from worker threads.
    pub(super) fn settle(&self) {
        let Some(store) = &self.store else { return };
        let mut st = self.lock();
        let Slot::Open { lazy: Some(l), .. } = &*st else { return };
        if !l.fill.is_complete() {
            return;
        }
        let l = l.clone();
        let reopened = store.settle(&l).map_err(|e| crate::node::error_chain(&e)).and_then(|h| {
            LoadedSnapshot::open_checked(h.dir(), false, self.bundle.check()).map(|s| (s, h)).map_err(|e| crate::node::error_chain(&e))
        });
        match reopened {
            Ok((s, mut h)) => {
                h.lazy_was = Some(l.clone());
                *st = Slot::Open { snap: Arc::new(self.open.apply(s)), _pin: Some(h), lazy: None, last_use: Instant::now() }
            }
            Err(e) => {
                // Whatever moved is in the cache or gone: the next start opens it again.
                warn!(snapshot = %l.id, error = %e, "installing a lazily fetched snapshot in the cache failed");
                *st = Slot::Closed;
            }
        }
    }

    /// Publish the captured snapshot (if the node has a store and it is not
    /// published yet) and move it into the cache. Returns the stored id. On failure
    /// the local snapshot stays and serves. Call from worker threads.
    pub(super) fn publish(&self) -> Option<Result<String, SnapStoreError>> {
        let store = self.store.as_ref()?;
        if let Some(id) = self.stored_id() {
            return Some(Ok(id));
        }
        if !matches!(*self.lock(), Slot::Closed) || !self.local_dir.join(thaw_engine::image::STATE_FILE).exists() {
            return None; // in use from its local files (or none): at the next start
        }
        // Not holding the slot while uploading: a start meanwhile opens the local files.
        let pushed = match store.push(&self.local_dir) {
            Ok(id) => id,
            Err(e) => return Some(Err(e)),
        };
        *self.stored.lock().unwrap_or_else(|p| p.into_inner()) = Some(pushed.clone());
        let mut st = self.lock();
        if matches!(*st, Slot::Closed) {
            // Its home is the store now: the local files move into the cache.
            if let Some(h) = store.adopt(&pushed, &self.local_dir) {
                match LoadedSnapshot::open_checked(h.dir(), false, self.bundle.check()) {
                    Ok(s) => *st = Slot::Open { snap: Arc::new(self.open.apply(s)), _pin: Some(h), lazy: None, last_use: Instant::now() },
                    Err(e) => warn!(error = %crate::node::error_chain(&e), "opening a published snapshot"),
                }
            }
        }
        Some(Ok(pushed))
    }

    pub(super) fn is_open(&self) -> bool {
        self.state.try_lock().map(|s| matches!(*s, Slot::Open { .. })).unwrap_or(true)
    }

    /// Close a store-backed snapshot no instance has used for `idle` (unpinning its
    /// cache entry). Never blocks: a slot in use is left alone.
    pub(super) fn close_if_unused(&self, idle: Duration) -> bool {
        let Ok(mut st) = self.state.try_lock() else { return false };
        let unused = match &*st {
            Slot::Open { snap, _pin, lazy, last_use } if _pin.is_some() || lazy.is_some() => {
                Arc::strong_count(snap) == 1 && Arc::strong_count(&snap.source) == 1 && last_use.elapsed() >= idle
            }
            _ => false,
        };
        if unused {
            *st = Slot::Closed;
        }
        unused
    }

    /// A working set recorded (or extended) in the cached copy since it was last
    /// published: (store, stored id, cached directory). Marks it as being published;
    /// [`ws_publish_failed`](Self::ws_publish_failed) undoes that. Never blocks.
    pub(super) fn working_set_to_publish(&self) -> Option<(Arc<SnapshotStore>, String, PathBuf)> {
        let store = self.store.as_ref().filter(|_| !self.adopted())?;
        let st = self.state.try_lock().ok()?;
        let Slot::Open { _pin: Some(h), .. } = &*st else { return None };
        let dir = h.dir().to_path_buf();
        drop(st);
        let id = self.stored_id()?;
        let mtime = std::fs::metadata(dir.join(thaw_engine::ws::TRACE_FILE)).and_then(|m| m.modified()).ok()?;
        let mut published = self.ws_published.lock().unwrap_or_else(|p| p.into_inner());
        if *published == Some(mtime) {
            return None;
        }
        *published = Some(mtime);
        Some((store.clone(), id, dir))
    }

    /// The working set in `dir` (just opened) is the one its stored snapshot has.
    fn note_working_set(&self, dir: &Path) {
        let mtime = std::fs::metadata(dir.join(thaw_engine::ws::TRACE_FILE)).and_then(|m| m.modified()).ok();
        *self.ws_published.lock().unwrap_or_else(|p| p.into_inner()) = mtime;
    }

    /// Stored snapshot `id` replaces the one this revision had.
    pub(super) fn set_stored(&self, id: String) {
        *self.stored.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    }

    pub(super) fn ws_publish_failed(&self) {
        *self.ws_published.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The revision is gone: delete its stored snapshot.
    pub(super) fn retire(&self) {
        if let (Some(store), Some(id), false) = (&self.store, self.stored_id(), self.adopted()) {
            store.remove_later(id);
        }
    }
}

impl super::Node {
    /// At start, with a store: publish the ready revisions whose publish failed (or
    /// that were built before the node had a store), in the background.
    pub(super) fn publish_pending(self: &Arc<Self>) {
        if self.cfg.snapshot_store.is_none() {
            return;
        }
        let revs: Vec<Arc<super::Revision>> = self.serving_revisions().into_iter().filter(|r| r.snapshot.stored_id().is_none()).collect();
        for rev in revs {
            let node = self.clone();
            let queued = self.build_workers.spawn(move || match rev.snapshot.publish() {
                Some(Ok(id)) => {
                    if let Err(e) = node.registry.set_snapshot_id(rev.id, Some(&id)) {
                        warn!(revision = rev.id, error = %crate::node::error_chain(&e), "recording a published snapshot");
                    }
                }
                Some(Err(e)) => warn!(revision = rev.id, error = %crate::node::error_chain(&e), "publishing a snapshot failed; retried at the next start"),
                None => {}
            });
            if let Err(e) = queued {
                warn!(error = %e, "queueing a snapshot publish");
            }
        }
    }

    /// Publish the working sets that restores recorded in cached snapshots since they
    /// were published (reaper tick; the uploads run on the build workers).
    pub(super) fn publish_working_sets(self: &Arc<Self>) {
        let revs = self.serving_revisions();
        for rev in revs {
            let Some((store, id, dir)) = rev.snapshot.working_set_to_publish() else { continue };
            let (job_rev, node) = (rev.clone(), self.clone());
            let queued = self.build_workers.spawn(move || match store.republish(&id, &dir) {
                Ok(new) if new != id => {
                    job_rev.snapshot.set_stored(new.clone());
                    if let Err(e) = node.registry.set_snapshot_id(job_rev.id, Some(&new)) {
                        warn!(revision = job_rev.id, error = %crate::node::error_chain(&e), "recording a snapshot published again");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(revision = job_rev.id, error = %crate::node::error_chain(&e), "publishing a recorded working set failed; retried later");
                    job_rev.snapshot.ws_publish_failed();
                }
            });
            if queued.is_err() {
                rev.snapshot.ws_publish_failed();
            }
        }
    }

    /// Move lazily fetched snapshots that have arrived whole into the cache (reaper
    /// tick; the moves run on the build workers).
    pub(super) fn settle_lazy_snapshots(&self) {
        for rev in self.serving_revisions() {
            rev.snapshot.responded_late(LAZY_FILL_AT_LATEST);
            if !rev.snapshot.lazy_complete() {
                continue;
            }
            if let Err(e) = self.build_workers.spawn(move || rev.snapshot.settle()) {
                warn!(error = %e, "queueing the install of a fetched snapshot");
            }
        }
    }

    /// The revisions functions serve from: active ones and those of published versions.
    fn serving_revisions(&self) -> Vec<Arc<super::Revision>> {
        self.functions_map()
            .values()
            .flat_map(|f| {
                let st = f.lock();
                st.active.iter().cloned().chain(st.versions.values().map(|p| p.rev.clone())).collect::<Vec<_>>()
            })
            .collect()
    }

    /// Revision `id` is being forgotten at start: delete its stored snapshot too.
    pub(super) fn forget_stored(&self, id: i64) {
        if let Some(store) = &self.cfg.snapshot_store {
            if let Ok(Some(rec)) = self.registry.get_revision(id).map(|r| r.filter(|r| !r.snapshot_adopted)) {
                if let Some(sid) = rec.snapshot_id {
                    store.remove_later(sid);
                }
            }
        }
    }
}
