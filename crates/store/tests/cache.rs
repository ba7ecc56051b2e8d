//! The node cache: LRU against a reference model, pinning, bypass of
//! oversized snapshots, single flight, the byte bound under churn, restart
//! after kill -9, purge and failed fetches. (The S3 store as the cache's
//! source is tested with a real MinIO in crates/thaw/tests/store_protocol.rs.)

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use thaw_store::cache::{dir_bytes, Cache, Source, SourceError};

/// A source of fake snapshots: `id` is `name-SIZE`, fetched as one file of SIZE bytes.
#[derive(Default)]
struct Fake {
    fetches: AtomicUsize,
    delay_ms: u64,
    fail: std::sync::atomic::AtomicBool,
    /// Called in the middle of every fetch (after the file is written).
    during: Option<Box<dyn Fn() + Send + Sync>>,
}

fn size_of(id: &str) -> u64 {
    id.rsplit('-').next().unwrap().parse().unwrap()
}

impl Source for Fake {
    fn size(&self, id: &str) -> Result<u64, SourceError> {
        Ok(size_of(id))
    }
    fn fetch(&self, id: &str, dir: &Path) -> Result<(), SourceError> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        std::fs::write(dir.join("pages.img"), vec![7u8; size_of(id) as usize])?;
        if let Some(f) = &self.during {
            f();
        }
        std::thread::sleep(Duration::from_millis(self.delay_ms));
        if self.fail.load(Ordering::SeqCst) {
            return Err("the store is down".into());
        }
        Ok(())
    }
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("thaw-cache-").tempdir().unwrap()
}

fn tmp_is_empty(root: &Path) -> bool {
    std::fs::read_dir(root.join("tmp")).unwrap().next().is_none()
}

#[test]
fn eviction_follows_lru_exactly() {
    let t = tmpdir();
    let cache = Cache::open(t.path(), 3000).unwrap();
    let src = Fake::default();
    let mut model: VecDeque<&str> = VecDeque::new(); // least recently used first
    let script = ["a-1000", "b-1000", "c-1000", "a-1000", "d-1000", "b-1000", "a-1000", "c-1000", "e-1000", "e-1000", "d-1000"];
    for id in script {
        drop(cache.get(id, &src).unwrap());
        if let Some(i) = model.iter().position(|x| *x == id) {
            model.remove(i);
        } else if model.len() == 3 {
            model.pop_front();
        }
        model.push_back(id);
        assert_eq!(cache.lru_order(), model.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "after {id}");
        for gone in script.iter().filter(|s| !model.contains(s)) {
            assert!(!t.path().join("entries").join(gone).exists(), "{gone} evicted but still on disk");
        }
    }
    let st = cache.stats();
    assert_eq!((st.used_bytes, st.entries, st.hits), (3000, 3, 3));
}

#[test]
fn pinned_entries_are_never_evicted_and_without_room_a_snapshot_is_served_uncached() {
    let t = tmpdir();
    let cache = Cache::open(t.path(), 2000).unwrap();
    let src = Fake::default();
    let a = cache.get("a-1000", &src).unwrap();
    let b = cache.get("b-1000", &src).unwrap();
    let c = cache.get("c-1000", &src).unwrap();
    assert!(!c.cached(), "no unpinned victim: served uncached");
    assert_eq!(std::fs::read(c.dir().join("pages.img")).unwrap().len(), 1000);
    assert!(cache.contains("a-1000") && cache.contains("b-1000"));
    let cdir = c.dir().to_path_buf();
    drop(c);
    assert!(!cdir.exists(), "the uncached copy goes with its handle");
    drop(b);
    let c = cache.get("c-1000", &src).unwrap();
    assert!(c.cached());
    assert!(cache.contains("a-1000") && !cache.contains("b-1000"), "b (unpinned) evicted, a (pinned) kept");
    assert!(a.dir().join("pages.img").is_file());
    assert_eq!(cache.stats().bypassed, 1);
}

#[test]
fn a_snapshot_larger_than_the_cache_is_served_without_caching() {
    let t = tmpdir();
    let cache = Cache::open(t.path(), 3000).unwrap();
    let src = Fake::default();
    let keep = cache.get("small-1000", &src).unwrap();
    drop(keep);
    let big = cache.get("big-5000", &src).unwrap();
    assert!(!big.cached());
    assert_eq!(std::fs::metadata(big.dir().join("pages.img")).unwrap().len(), 5000);
    assert!(cache.contains("small-1000"), "nothing evicted for a snapshot that cannot fit anyway");
    drop(big);
    assert!(tmp_is_empty(t.path()));
    assert_eq!(cache.stats().used_bytes, 1000);
}

#[test]
fn concurrent_requests_for_one_snapshot_fetch_it_once() {
    let t = tmpdir();
    let cache = Cache::open(t.path(), 10_000).unwrap();
    let src = Fake { delay_ms: 300, ..Default::default() };
    let dirs: Vec<PathBuf> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (cache, src) = (cache.clone(), &src);
                s.spawn(move || {
                    let h = cache.get("one-1000", src).unwrap();
                    assert!(h.cached());
                    h.dir().to_path_buf()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(src.fetches.load(Ordering::SeqCst), 1);
    assert!(dirs.iter().all(|d| *d == dirs[0]));
    let st = cache.stats();
    assert_eq!((st.misses, st.hits, st.pinned), (1, 7, 0));
}

#[test]
fn the_byte_bound_holds_under_churn() {
    let t = tmpdir();
    const MAX: u64 = 4000;
    let cache = Cache::open(t.path(), MAX).unwrap();
    let entries = t.path().join("entries");
    let check = {
        let (cache, entries) = (cache.clone(), entries.clone());
        move || {
            let st = cache.stats();
            assert!(st.used_bytes + st.reserved_bytes <= MAX, "{st:?}");
            if let Ok(n) = dir_bytes(&entries) {
                assert!(n <= MAX, "{n} bytes in entries/");
            }
        }
    };
    let src = Fake { during: Some(Box::new(check.clone())), ..Default::default() };
    let ids: Vec<String> = (0..10).map(|i| format!("s{i}-{}", 500 + 137 * i)).collect();
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let (cache, src, ids, check) = (cache.clone(), &src, &ids, check.clone());
            s.spawn(move || {
                let mut x = w * 7919 + 1;
                let mut held = Vec::new();
                for _ in 0..150 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let h = cache.get(&ids[(x >> 33) as usize % ids.len()], src).unwrap();
                    assert_eq!(std::fs::metadata(h.dir().join("pages.img")).unwrap().len(), size_of(h.id()));
                    held.push(h);
                    if held.len() > (x >> 40) as usize % 3 {
                        held.remove(0);
                    }
                    check();
                }
            });
        }
    });
    check();
    let st = cache.stats();
    assert!(st.evictions > 10 && st.hits > 10, "{st:?}");
    assert_eq!((st.pinned, st.reserved_bytes), (0, 0));
    assert_eq!(dir_bytes(&entries).unwrap(), st.used_bytes, "index matches the disk");
}

#[test]
fn purge_removes_an_entry_once_unpinned() {
    let t = tmpdir();
    let cache = Cache::open(t.path(), 10_000).unwrap();
    let src = Fake::default();
    let h = cache.get("bad-1000", &src).unwrap();
    cache.purge("bad-1000");
    assert!(h.dir().join("pages.img").is_file(), "still in use");
    drop(h);
    assert!(!cache.contains("bad-1000") && !t.path().join("entries/bad-1000").exists());
    drop(cache.get("bad-1000", &src).unwrap());
    assert_eq!(src.fetches.load(Ordering::SeqCst), 2, "fetched again after the purge");
}

#[test]
fn a_failed_fetch_leaves_nothing_and_releases_its_reservation() {
    let t = tmpdir();
    let cache = Cache::open(t.path(), 10_000).unwrap();
    let src = Fake::default();
    src.fail.store(true, Ordering::SeqCst);
    let e = cache.get("x-1000", &src).err().unwrap();
    assert_eq!(format!("{e}: {}", std::error::Error::source(&e).unwrap()), "snapshot cache: fetching x-1000: the store is down");
    assert!(tmp_is_empty(t.path()) && !cache.contains("x-1000"));
    assert_eq!(cache.stats().reserved_bytes, 0);
    src.fail.store(false, Ordering::SeqCst);
    assert!(cache.get("x-1000", &src).unwrap().cached(), "recovers once the source does");
    assert!(cache.get("../etc", &src).is_err());
}

/// The child side of `restart_after_kill_9`: fetch into the cache and hang
/// half way, until killed. A no-op in a normal run.
fn kill9_child() {
    let Some(root) = std::env::var_os("THAW_CACHE_KILL9_ROOT") else { return };
    let cache = Cache::open(Path::new(&root), 10_000).unwrap();
    let src = Fake::default();
    drop(cache.get("done-1000", &src).unwrap());
    let hang = Fake { during: Some(Box::new(|| std::thread::sleep(Duration::from_secs(600)))), ..Default::default() };
    let _ = cache.get("partial-3000", &hang);
    unreachable!("killed while fetching");
}

#[test]
fn restart_after_kill_9_during_a_download() {
    kill9_child();
    let t = tmpdir();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "restart_after_kill_9_during_a_download", "--nocapture", "--test-threads=1"])
        .env("THAW_CACHE_KILL9_ROOT", t.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the child is in the middle of the second download.
    let t0 = std::time::Instant::now();
    loop {
        let partial = std::fs::read_dir(t.path().join("tmp")).ok().into_iter().flatten().flatten()
            .any(|e| e.path().join("pages.img").is_file() && e.file_name().to_string_lossy().starts_with("partial-3000"));
        if partial {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the child never started its download");
        assert!(child.try_wait().unwrap().is_none(), "the child exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Another process opening the cache meanwhile (a second `thaw snapshot restore`)
    // leaves the live download alone.
    drop(Cache::open(t.path(), 10_000).unwrap());
    assert!(!tmp_is_empty(t.path()), "a live process's download was removed");
    assert!(child.try_wait().unwrap().is_none(), "the child died");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let cache = Cache::open(t.path(), 10_000).unwrap();
    assert!(tmp_is_empty(t.path()), "the interrupted download is gone");
    assert_eq!(cache.lru_order(), vec!["done-1000".to_string()]);
    assert_eq!(cache.stats().used_bytes, 1000, "index rebuilt from the disk");
    let src = Fake::default();
    assert!(cache.get("done-1000", &src).unwrap().cached());
    assert_eq!(src.fetches.load(Ordering::SeqCst), 0, "a hit after the restart");
}

#[test]
fn the_lru_order_survives_a_restart() {
    let t = tmpdir();
    let src = Fake::default();
    {
        let cache = Cache::open(t.path(), 10_000).unwrap();
        for id in ["a-100", "b-100", "c-100", "a-100"] {
            drop(cache.get(id, &src).unwrap());
        }
    }
    let cache = Cache::open(t.path(), 10_000).unwrap();
    assert_eq!(cache.lru_order(), vec!["b-100", "c-100", "a-100"]);
    // Reopened smaller: the least recently used go first.
    drop(cache);
    let cache = Cache::open(t.path(), 250).unwrap();
    assert_eq!(cache.lru_order(), vec!["c-100", "a-100"]);
}
