//! The node's snapshot cache: a directory of fetched snapshots bounded in bytes.
//!
//! ```text
//! ROOT/entries/<id>/   complete, verified snapshots (renamed in whole)
//! ROOT/tmp/            installs in progress and uncached (bypass) copies, named by their process:
//!                      those of processes gone are removed at open
//! ```
//! - **Bound.** Installed bytes plus the reservations of installs in flight
//!   never exceed `max_bytes`. An install reserves an upper bound of its size
//!   first ([`Source::size`]), evicting as needed, and settles to the real size
//!   once installed.
//! - **Eviction: LRU** by last use (a use = a [`Cache::get`]), over unpinned
//!   entries only. The last-use order survives restarts: each use sets the
//!   entry directory's mtime, and [`Cache::open`] orders by it.
//! - **Pinning.** A [`Handle`] pins its entry until dropped (a lazily restored
//!   instance reads its pages until it dies). If the room needed cannot be
//!   made from unpinned entries, or a snapshot is larger than the whole cache,
//!   it is fetched into ROOT/tmp and served uncached (removed when the handle
//!   drops) rather than failing.
//! - **Atomic installs.** A fetch writes into ROOT/tmp; only a complete,
//!   verified snapshot is renamed into entries/. A crash (kill -9) leaves at
//!   most a temporary directory, removed at the next open, which rebuilds the
//!   index from entries/.
//! - **Single flight.** Concurrent gets of one missing snapshot fetch it once;
//!   the others wait for that install (and fetch themselves only if it failed).
//! - **Purge.** [`Cache::purge`] removes an entry found bad (once unpinned).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::SystemTime;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CacheError {
    #[error("snapshot cache {root}: {what}")]
    Io { root: PathBuf, what: String, #[source] source: std::io::Error },
    #[error("snapshot cache {root}: invalid snapshot id '{id}'")]
    BadId { root: PathBuf, id: String },
    #[error("snapshot cache: fetching {id}")]
    Fetch { id: String, #[source] source: Box<dyn std::error::Error + Send + Sync> },
}

type Result<T> = std::result::Result<T, CacheError>;
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Where missing snapshots come from.
pub trait Source: Send + Sync {
    /// An upper bound of the bytes snapshot `id` takes on disk.
    fn size(&self, id: &str) -> std::result::Result<u64, SourceError>;
    /// Write snapshot `id` into the empty directory `dir`, verified.
    fn fetch(&self, id: &str, dir: &Path) -> std::result::Result<(), SourceError>;
}

/// A complete snapshot directory moved into the cache (renamed file by file, or
/// copied across file systems); what `Source::fetch` leaves of it is removed by the
/// caller.
pub struct Adopt {
    pub dir: PathBuf,
}

impl Source for Adopt {
    fn size(&self, _id: &str) -> std::result::Result<u64, SourceError> {
        Ok(dir_bytes(&self.dir)?)
    }

    fn fetch(&self, _id: &str, dest: &Path) -> std::result::Result<(), SourceError> {
        each_entry(&self.dir, dest, |e, to| {
            if std::fs::rename(e.path(), to).is_err() {
                // Another file system (or a directory entry): copy, leaving the original.
                if e.file_type()?.is_dir() {
                    return Err(std::io::Error::other(format!("unexpected directory {} in a snapshot", e.path().display())));
                }
                std::fs::copy(e.path(), to)?;
            }
            Ok(())
        })
    }
}

/// A complete snapshot directory linked into the cache: its files hard-linked
/// (symbolic links copied), so that it stays whole where it is (a base that diffs
/// still being assembled name there, see `crate::settle_base`).
pub struct Link {
    pub dir: PathBuf,
}

impl Source for Link {
    fn size(&self, _id: &str) -> std::result::Result<u64, SourceError> {
        Ok(dir_bytes(&self.dir)?)
    }

    fn fetch(&self, _id: &str, dest: &Path) -> std::result::Result<(), SourceError> {
        each_entry(&self.dir, dest, |e, to| match std::fs::read_link(e.path()) {
            Ok(target) => std::os::unix::fs::symlink(target, to),
            Err(_) => std::fs::hard_link(e.path(), to),
        })
    }
}

/// `put(entry, its place in dest)` for each entry of directory `dir`.
fn each_entry(dir: &Path, dest: &Path, put: impl Fn(&std::fs::DirEntry, &Path) -> std::io::Result<()>) -> std::result::Result<(), SourceError> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        put(&e, &dest.join(e.file_name()))?;
    }
    Ok(())
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    last_use: u64,
    pins: usize,
    purge: bool,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    used: u64,
    reserved: u64,
    inflight: HashSet<String>,
    tick: u64,
}

/// Figures of the cache, for `thaw status` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub max_bytes: u64,
    pub used_bytes: u64,
    pub reserved_bytes: u64,
    pub entries: usize,
    pub pinned: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub bypassed: u64,
}

pub struct Cache {
    root: PathBuf,
    max_bytes: u64,
    inner: Mutex<Inner>,
    changed: Condvar,
    seq: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    bypassed: AtomicU64,
}

/// A snapshot served from the cache; keeps it pinned until dropped.
pub struct Handle {
    cache: Arc<Cache>,
    id: String,
    dir: PathBuf,
    cached: bool,
}

impl Handle {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// False: served uncached (too large, or no room); the copy goes with the handle.
    pub fn cached(&self) -> bool {
        self.cached
    }
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A second pin of this entry (None for a snapshot served uncached: its copy
    /// goes with this handle).
    pub fn pin_again(&self) -> Option<Handle> {
        if !self.cached {
            return None;
        }
        self.cache.lock().entries.get_mut(&self.id)?.pins += 1;
        Some(Handle { cache: self.cache.clone(), id: self.id.clone(), dir: self.dir.clone(), cached: true })
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.cached {
            self.cache.unpin(&self.id);
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Bytes of the files in `dir` (apparent sizes; holes counted, so an upper bound of the disk used).
pub fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let md = e.metadata()?;
        n += if md.is_dir() { dir_bytes(&e.path())? } else { md.len() };
    }
    Ok(n)
}

/// Remove the entries of `dir` whose owner, the process `pid_of` finds in the
/// name, is gone (a name without a pid is nobody's).
fn remove_orphans(dir: &Path, pid_of: impl Fn(&str) -> Option<i32>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if pid_of(&name).is_none_or(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
        }
    }
    Ok(())
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Cache {
    /// Open (or create) the cache at `root`: drop leftovers of interrupted
    /// installs and rebuild the index from the complete entries, evicting the
    /// least recently used if they exceed `max_bytes`.
    pub fn open(root: &Path, max_bytes: u64) -> Result<Arc<Cache>> {
        let ioe = |what: &str| {
            let (root, what) = (root.to_path_buf(), what.to_string());
            move |source| CacheError::Io { root, what, source }
        };
        // Installs of processes that are gone (a crash, kill -9); those of live ones
        // sharing the root (another `thaw snapshot restore`) are theirs to finish.
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(ioe("creating tmp/"))?;
        remove_orphans(&tmp, |name| name.rsplit('.').nth(1).and_then(|p| p.parse().ok())).map_err(ioe("listing tmp/"))?;
        let entries_dir = root.join("entries");
        std::fs::create_dir_all(&entries_dir).map_err(ioe("creating entries/"))?;
        let mut found = Vec::new();
        for e in std::fs::read_dir(&entries_dir).map_err(ioe("listing entries/"))? {
            let e = e.map_err(ioe("listing entries/"))?;
            let id = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if !valid_id(&id) || !path.is_dir() {
                tracing::warn!("snapshot cache: removing stray {}", path.display());
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
                continue;
            }
            let bytes = dir_bytes(&path).map_err(ioe("sizing an entry"))?;
            let mtime = e.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((mtime, id, bytes));
        }
        found.sort();
        let mut inner = Inner::default();
        for (_, id, bytes) in found {
            inner.tick += 1;
            inner.used += bytes;
            inner.entries.insert(id, Entry { bytes, last_use: inner.tick, pins: 0, purge: false });
        }
        let cache = Arc::new(Cache {
            root: root.to_path_buf(),
            max_bytes,
            inner: Mutex::new(inner),
            changed: Condvar::new(),
            seq: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            bypassed: AtomicU64::new(0),
        });
        {
            let mut g = cache.lock();
            cache.make_room(&mut g, 0);
        }
        Ok(cache)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry_dir(&self, id: &str) -> PathBuf {
        self.root.join("entries").join(id)
    }

    fn tmp_dir(&self, id: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.root.join("tmp").join(format!("{id}.{}.{n}", std::process::id()))
    }

    pub fn stats(&self) -> CacheStats {
        let g = self.lock();
        CacheStats {
            max_bytes: self.max_bytes,
            used_bytes: g.used,
            reserved_bytes: g.reserved,
            entries: g.entries.len(),
            pinned: g.entries.values().filter(|e| e.pins > 0).count(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bypassed: self.bypassed.load(Ordering::Relaxed),
        }
    }

    /// Ids in the cache, least recently used first.
    pub fn lru_order(&self) -> Vec<String> {
        let g = self.lock();
        let mut v: Vec<(&u64, &String)> = g.entries.iter().map(|(k, e)| (&e.last_use, k)).collect();
        v.sort();
        v.into_iter().map(|(_, k)| k.clone()).collect()
    }

    /// Whether `id` is cached (no side effects: does not count as a use).
    pub fn contains(&self, id: &str) -> bool {
        self.lock().entries.contains_key(id)
    }

    /// A new empty directory, `ROOT/lazy/<pid>-<id>-<n>`, where a snapshot arriving
    /// piecemeal is assembled (see `lazy.rs`) before it is adopted (see [`Adopt`]).
    /// Directories of processes that are gone are removed first (a process that
    /// died left its own behind; several processes may share the cache's root).
    pub fn scratch_dir(&self, id: &str) -> Result<PathBuf> {
        if !valid_id(id) {
            return Err(CacheError::BadId { root: self.root.clone(), id: id.to_string() });
        }
        let ioe = |what: &str| {
            let (root, what) = (self.root.clone(), what.to_string());
            move |source| CacheError::Io { root, what, source }
        };
        let root = self.root.join("lazy");
        std::fs::create_dir_all(&root).map_err(ioe("creating lazy/"))?;
        remove_orphans(&root, |name| name.split('-').next().and_then(|p| p.parse().ok())).map_err(ioe("listing lazy/"))?;
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("{}-{id}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(ioe("creating a scratch directory"))?;
        Ok(dir)
    }

    /// Evict unpinned entries, least recently used first, until `need` more
    /// bytes fit. Returns whether they do.
    fn make_room(&self, g: &mut Inner, need: u64) -> bool {
        while g.used + g.reserved + need > self.max_bytes {
            let victim = g.entries.iter().filter(|(_, e)| e.pins == 0).min_by_key(|(_, e)| e.last_use).map(|(k, _)| k.clone());
            let Some(id) = victim else { return false };
            let e = g.entries.remove(&id).expect("present");
            g.used -= e.bytes;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            self.remove_entry_dir(&id);
        }
        true
    }

    /// Remove an entry's directory: renamed out of entries/ first (so a restart
    /// never sees half of it), then deleted.
    fn remove_entry_dir(&self, id: &str) {
        let doomed = self.tmp_dir(&format!("evicted-{id}"));
        match std::fs::rename(self.entry_dir(id), &doomed) {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&doomed);
            }
            Err(e) => tracing::warn!("snapshot cache: removing {}: {e}", self.entry_dir(id).display()),
        }
    }

    fn touch(&self, g: &mut Inner, id: &str) {
        g.tick += 1;
        let t = g.tick;
        if let Some(e) = g.entries.get_mut(id) {
            e.last_use = t;
        }
        // Persist the order for the next open (best effort).
        if let Ok(f) = std::fs::File::open(self.entry_dir(id)) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    fn unpin(&self, id: &str) {
        let mut g = self.lock();
        let Some(e) = g.entries.get_mut(id) else { return };
        e.pins -= 1;
        if e.pins == 0 {
            if e.purge {
                let e = g.entries.remove(id).expect("present");
                g.used -= e.bytes;
                self.remove_entry_dir(id);
            } else if let Ok(now) = dir_bytes(&self.entry_dir(id)) {
                // Restores rewrite the working set in place: account for its size now.
                let old = std::mem::replace(&mut e.bytes, now);
                g.used = g.used - old + now;
                self.make_room(&mut g, 0);
            }
        }
        self.changed.notify_all();
    }

    /// Remove `id` (found bad by its user): now if unpinned, else when the last handle drops.
    pub fn purge(&self, id: &str) {
        let mut g = self.lock();
        let Some(e) = g.entries.get_mut(id) else { return };
        if e.pins > 0 {
            e.purge = true;
        } else {
            let e = g.entries.remove(id).expect("present");
            g.used -= e.bytes;
            self.remove_entry_dir(id);
        }
    }

    /// Snapshot `id`, from the cache or fetched from `source` into it.
    pub fn get(self: &Arc<Self>, id: &str, source: &dyn Source) -> Result<Handle> {
        if !valid_id(id) {
            return Err(CacheError::BadId { root: self.root.clone(), id: id.to_string() });
        }
        let mut g = self.lock();
        loop {
            if let Some(e) = g.entries.get_mut(id) {
                if !e.purge {
                    e.pins += 1;
                    self.touch(&mut g, id);
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Handle { cache: self.clone(), id: id.to_string(), dir: self.entry_dir(id), cached: true });
                }
            }
            if !g.inflight.contains(id) {
                break;
            }
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        g.inflight.insert(id.to_string());
        drop(g);
        let result = self.install(id, source);
        let mut g = self.lock();
        g.inflight.remove(id);
        self.changed.notify_all();
        drop(g);
        result
    }

    fn install(self: &Arc<Self>, id: &str, source: &dyn Source) -> Result<Handle> {
        let fetch_err = |source| CacheError::Fetch { id: id.to_string(), source };
        let size = source.size(id).map_err(fetch_err)?;
        let reserved = {
            let mut g = self.lock();
            let fits = size <= self.max_bytes && self.make_room(&mut g, size);
            if fits {
                g.reserved += size;
            }
            fits
        };
        let tmp = self.tmp_dir(id);
        let ioe = |what: &str| {
            let (root, what) = (self.root.clone(), what.to_string());
            move |source| CacheError::Io { root, what, source }
        };
        let fetched = std::fs::create_dir(&tmp)
            .map_err(ioe("creating a temporary directory"))
            .and_then(|()| source.fetch(id, &tmp).map_err(fetch_err))
            .and_then(|()| dir_bytes(&tmp).map_err(ioe("sizing a fetched snapshot")));
        let mut g = self.lock();
        if reserved {
            g.reserved -= size;
        }
        let bytes = match fetched {
            Ok(b) => b,
            Err(e) => {
                drop(g);
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        if !reserved || (bytes > size && !self.make_room(&mut g, bytes)) {
            // Too large for the cache, or no room while everything is pinned.
            self.bypassed.fetch_add(1, Ordering::Relaxed);
            return Ok(Handle { cache: self.clone(), id: id.to_string(), dir: tmp, cached: false });
        }
        if let Err(e) = std::fs::rename(&tmp, self.entry_dir(id)) {
            drop(g);
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(ioe("installing a fetched snapshot")(e));
        }
        g.used += bytes;
        g.entries.insert(id.to_string(), Entry { bytes, last_use: 0, pins: 1, purge: false });
        self.touch(&mut g, id);
        Ok(Handle { cache: self.clone(), id: id.to_string(), dir: self.entry_dir(id), cached: true })
    }
}
