//! How a revision holds its opened snapshot ([`SnapshotSlot`]): opened on first use and
//! shared by its instances, pinned in the store's cache while open (see `snapstore`),
//! closed again when unused; with the settings every open applies ([`OpenSettings`])
//! and the bundle's fingerprint it checks ([`BundlePrint`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use thaw_engine::fingerprint::{self, CodeCheck};
use thaw_engine::instance::LoadedSnapshot;
use tracing::warn;

use super::snapstore::{Fetched, LazyMiss, Pinned, SnapStoreError, SnapshotStore, LAZY_FILL_AT_LATEST};

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
    /// The crc of the recorded working set's trace last published (or being published):
    /// compared by content, not time, as a store's fill writes ws.trace again unchanged
    /// (publishing it again would only make a new id: a sealed working set's frames get
    /// new nonces).
    ws_published: Mutex<Option<u32>>,
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
        if pin.is_some() {
            compress_later(&snap);
        }
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
                let snap = Arc::new(self.open.apply(s));
                compress_later(&snap);
                *st = Slot::Open { snap, _pin: Some(h), lazy: None, last_use: Instant::now() }
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
                // A snapshot still arriving from the store stays open until it has
                // settled into the cache (or its fetch failed): closed, what it fetched
                // would be thrown away, and the next start would miss again (on a slow
                // link a fill outlasts the keep-alive: lrserving's 80 MB at 100 Mbit/s).
                let arriving = lazy.as_ref().is_some_and(|l| !l.fill.failed());
                !arriving && Arc::strong_count(snap) == 1 && Arc::strong_count(&snap.source) == 1 && last_use.elapsed() >= idle
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
        let crc = thaw_engine::ws::WorkingSet::stored_crc(&dir)?;
        let mut published = self.ws_published.lock().unwrap_or_else(|p| p.into_inner());
        if *published == Some(crc) {
            return None;
        }
        *published = Some(crc);
        Some((store.clone(), id, dir))
    }

    /// The working set in `dir` (just opened) is the one its stored snapshot has.
    fn note_working_set(&self, dir: &Path) {
        *self.ws_published.lock().unwrap_or_else(|p| p.into_inner()) = thaw_engine::ws::WorkingSet::stored_crc(dir);
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
            store.remove_later(id, Duration::ZERO);
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
                    store.remove_later(sid, Duration::ZERO);
                }
            }
        }
    }
}

/// ws.lz4 beside the working set of a snapshot that came from the store (the store
/// makes clear ones only: a sealed image's needs the node key), on a thread of its
/// own: it reads and compresses the whole working set once; a snapshot that has one
/// returns at once.
fn compress_later(snap: &Arc<LoadedSnapshot>) {
    let s = snap.clone();
    let spawned = std::thread::Builder::new().name("thaw-ws-lz4".into()).spawn(move || match s.compress_working_set_if_read() {
        Ok(true) => tracing::info!(dir = %s.dir.display(), "ws.lz4 written beside the working set"),
        Ok(false) => {}
        Err(e) => warn!(dir = %s.dir.display(), error = %e, "ws.lz4 not written; restores read ws.pages"),
    });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the thread writing ws.lz4");
    }
}
