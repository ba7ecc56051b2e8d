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
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How long a snapshot published again with its working set keeps its old id in the
/// store: longer than a cluster agent takes to see the new id recorded (the builder
/// records it at its next reconcile, every 5 s) and to start fetching what it read.
pub const REPUBLISHED_GRACE: Duration = Duration::from_secs(15);

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
pub(super) const LAZY_FILL_AT_LATEST: Duration = Duration::from_secs(2);

/// A snapshot in the cache, and a diff's base, pinned while this lives.
pub struct Pinned {
    handle: Handle,
    _base: Option<Handle>,
    /// The lazy miss this snapshot arrived by, for `thaw status`.
    pub(super) lazy_was: Option<Arc<LazyMiss>>,
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
/// everything else; then it moves into the cache ([`super::slot::SnapshotSlot::settle`]).
/// `dir` goes when the last user drops it.
pub struct LazyMiss {
    pub(super) fill: Arc<thaw_store::lazy::RemoteFill>,
    /// A diff's base, in the cache (linked beside the diff).
    base: Option<Handle>,
    pub(super) dir: PathBuf,
    pub(super) id: String,
    /// Bytes of the fill already added to the store's counters.
    counted: AtomicU64,
    /// When the head arrived.
    pub(super) opened: Instant,
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
        let start = self.store.miss_start(id)?;
        let manifest_len = start.manifest_len;
        let Some(thaw_store::Miss { fill, dir, base }) = thaw_store::open_miss(&self.store, &self.cache, id, start)? else {
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
    pub(super) fn complete(&self, l: &LazyMiss) -> std::io::Result<()> {
        let r = l.fill.complete();
        self.count_fetched(l);
        if r.is_err() {
            self.n.fetch_failures.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Add to `bytes_fetched` what lazy miss `l` has fetched since last counted (the
    /// head's pages arrive after the open, beside the restore).
    pub(super) fn count_fetched(&self, l: &LazyMiss) {
        let now = l.fill.counters.bytes.load(Ordering::Relaxed);
        let before = l.counted.swap(now, Ordering::Relaxed);
        self.n.bytes_fetched.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
    }

    /// Move a completed lazy miss into the cache (pinned). Its directory is empty
    /// afterwards; instances running on its files keep them open.
    pub(super) fn settle(&self, l: &LazyMiss) -> Result<Pinned, SnapStoreError> {
        // A base that arrived lazily under it goes first, and the diff links it there.
        let lazy_base = thaw_store::settle_base(&self.cache, &l.fill, &l.dir)?;
        let handle = self.cache.get(&l.id, &cache::Adopt { dir: l.dir.clone() })?;
        // Empty now (its files moved); the lazy miss itself stays for `thaw status`.
        let _ = std::fs::remove_dir_all(&l.dir);
        self.n.lazy_settled.fetch_add(1, Ordering::Relaxed);
        info!(snapshot = %self.store.snapshot_url(&l.id), cached = handle.cached(), "a snapshot fetched lazily is complete");
        // Its base stays pinned as long as it (a second pin of the same entry).
        let base = lazy_base.or_else(|| l.base.as_ref().and_then(Handle::pin_again));
        Ok(Pinned { handle, _base: base, lazy_was: None })
    }

    /// Publish stored snapshot `old` again from `dir` (its cached copy), now that a
    /// restore recorded its working set there. `old` is deleted [`REPUBLISHED_GRACE`]
    /// later: other nodes may have just read its id (a cluster records it in a
    /// function's or a version's object) and be about to fetch it.
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
            self.remove_later(old.to_string(), REPUBLISHED_GRACE);
            self.n.working_sets.fetch_add(1, Ordering::Relaxed);
            info!(snapshot = %self.store.snapshot_url(&id), replaces = old, "snapshot published again with its recorded working set");
        }
        Ok(id)
    }

    /// Cache the snapshot files in `dir` (a cache entry) under `id` too, as links to
    /// the same files. A failure only means the next open fetches it.
    fn link_cached(&self, id: &str, dir: &Path) {
        let linked = self.cache.get(id, &cache::Link { dir: dir.to_path_buf() });
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

    /// Delete stored snapshot `id` in the background, `after` from now (its manifest;
    /// the chunks are collected by `thaw snapshot gc`), and its cached copy once
    /// unpinned. A node that stops before `after` has passed leaves it in the store
    /// (`thaw snapshot rm` removes it).
    pub fn remove_later(self: &Arc<Self>, id: String, after: Duration) {
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("thaw-store-rm".into()).spawn(move || {
            std::thread::sleep(after);
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
