//! Repurposing (issue #30): clean instances of the runtimes' bases serve cold starts.
//!
//! With `--base-pool N` the node keeps up to N idle instances of each runtime base it
//! has (restored with write tracking, frozen). A cold start of a function that fits
//! one (Python, Node.js or Java; the base's memory class; no layers; not isolated per invocation)
//! takes a pooled instance and loads the function into it (`Instance::load_into`:
//! its code replaces /var/task, its init runs): no sandbox is built, no process
//! restored. When the keep-alive would destroy an instance that came from a base, it
//! is reset to the base instead (`Instance::reset_to_base`: nothing of the function
//! stays) and goes back to the pool if there is room. After a start that found the
//! pool empty, a base instance is restored for it in the background.
//!
//! Pooled instances count in the node's admission (a slot and their memory class)
//! like any other; one taken for a start keeps its own reservation and gives back
//! the start's. A failed load, reset or restore kills the instance (fail closed) and
//! the start goes on as without the pool (a restore of the function's snapshot).
//!
//! A function whose snapshot is a diff on the pool's base gets the diff installed
//! instead (`Instance::install_diff`: its pages and state, no init; kind
//! "repurposed-diff"); where the diff holds state an install does not give, it is
//! loaded. Loading runs its init at the start, which for a heavy import costs more
//! than restoring its snapshot (bench/repurpose.py: jsonserde 109 ms loaded, 39
//! restored). So each revision keeps what its starts cost each way ([`StartCosts`]):
//! the pool is tried first, then one restore is measured, and from then on the
//! cheaper way (a moving average) serves its cold starts.
//!
//! Every shim moves to the new /var/task when it loads a function (the old working
//! directory is on the code the function's replaced); Java's through its native library.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use thaw_engine::instance::{FunctionConfig, Instance, LoadedSnapshot};
use thaw_engine::layers::{self, BaseMeta};
use thaw_runtime::Runtime;
use tracing::{debug, info, warn};

use crate::admission::Admission;
use crate::workers::WorkerPool;

/// The pool of clean base instances, by base directory.
pub struct BasePool {
    max: usize,
    admission: Arc<Admission>,
    gauge: prometheus::IntGauge,
    runtime_dir: PathBuf,
    inner: Mutex<Inner>,
    /// Base instances restored for the pool; instances that came back to it, reset;
    /// resets to the base that were refused (the instance was discarded).
    restored: AtomicU64,
    returned: AtomicU64,
    refused: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// Opened bases (write tracking on), by directory.
    snaps: HashMap<PathBuf, Arc<LoadedSnapshot>>,
    /// Clean, frozen instances, by base directory.
    idle: HashMap<PathBuf, Vec<Instance>>,
    /// Instances being restored or reset for the pool, by base directory.
    coming: HashMap<PathBuf, usize>,
}

impl BasePool {
    pub fn new(max: usize, admission: Arc<Admission>, gauge: prometheus::IntGauge, runtime_dir: PathBuf) -> BasePool {
        BasePool { max, admission, gauge, runtime_dir, inner: Mutex::default(), restored: AtomicU64::new(0), returned: AtomicU64::new(0), refused: AtomicU64::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The base a start of `cfg` could be served from, if it fits one the node has.
    pub fn base_for(&self, cfg: &FunctionConfig, bases: &Path, isolate: bool) -> Option<BaseMeta> {
        if isolate || !matches!(cfg.runtime, Runtime::Python3 | Runtime::Nodejs20 | Runtime::Java17) || cfg.opt_dir.is_some() {
            return None;
        }
        layers::find(bases, &thaw_engine::layered::key_for(cfg)).ok().flatten()
    }

    /// A clean instance of `base`, if one is pooled, with the opened base it was
    /// restored from. Its admission reservation goes with it.
    pub fn take(&self, base: &BaseMeta) -> Option<(Instance, Arc<LoadedSnapshot>)> {
        let mut g = self.lock();
        let snap = g.snaps.get(&base.dir)?.clone();
        let inst = g.idle.get_mut(&base.dir)?.pop()?;
        self.gauge.dec();
        Some((inst, snap))
    }

    /// Whether the pool of `dir` has room for one more (counting those coming), and if
    /// so count one as coming.
    fn reserve(&self, dir: &Path) -> bool {
        let mut g = self.lock();
        let have = g.idle.get(dir).map_or(0, Vec::len) + g.coming.get(dir).copied().unwrap_or(0);
        if have >= self.max {
            return false;
        }
        *g.coming.entry(dir.to_path_buf()).or_default() += 1;
        true
    }

    /// One counted as coming to `dir` ([`BasePool::reserve`]) will not come.
    fn unreserve(g: &mut Inner, dir: &Path) {
        if let Some(n) = g.coming.get_mut(dir) {
            *n = n.saturating_sub(1);
        }
    }

    /// One coming to `dir` arrived (`Some`) or did not (`None`: its reservation is
    /// given back).
    fn arrived(&self, dir: &Path, inst: Option<Instance>, memory_mb: u64) {
        let mut g = self.lock();
        Self::unreserve(&mut g, dir);
        match inst {
            Some(i) => {
                g.idle.entry(dir.to_path_buf()).or_default().push(i);
                self.gauge.inc();
            }
            None => self.admission.release(memory_mb),
        }
    }

    /// The opened base in `dir` (write tracking on), opened once.
    fn snapshot(&self, dir: &Path) -> Result<Arc<LoadedSnapshot>, String> {
        if let Some(s) = self.lock().snaps.get(dir) {
            return Ok(s.clone());
        }
        let snap = LoadedSnapshot::open(dir).map_err(|e| crate::node::error_chain(&e))?;
        snap.set_track_writes(true);
        let snap = Arc::new(snap);
        self.lock().snaps.insert(dir.to_path_buf(), snap.clone());
        Ok(snap)
    }

    /// Restore an instance of `base` for the pool in the background (on `workers`,
    /// whose threads outlive sandboxes), if it has room and the node admits one more.
    pub fn refill(self: &Arc<Self>, base: &BaseMeta, workers: &WorkerPool) {
        let memory_mb = base.key.memory_mb;
        let Ok(runtime) = Runtime::parse(&base.key.runtime) else { return };
        if !self.reserve(&base.dir) {
            return;
        }
        if self.admission.admit(memory_mb).is_err() {
            Self::unreserve(&mut self.lock(), &base.dir);
            return;
        }
        let (pool, dir) = (self.clone(), base.dir.clone());
        let queued = workers.spawn(move || {
            let inst = pool.restore(&dir, runtime, memory_mb);
            pool.arrived(&dir, inst, memory_mb);
        });
        if queued.is_err() {
            self.arrived(&base.dir, None, memory_mb);
        }
    }

    fn restore(&self, dir: &Path, runtime: Runtime, memory_mb: u64) -> Option<Instance> {
        let restored = self.snapshot(dir).and_then(|snap| {
            let bases = dir.parent().unwrap_or(dir);
            let placeholder = layers::placeholder(bases).map_err(|e| e.to_string())?;
            let mut cfg = FunctionConfig::new(runtime, "", placeholder, self.runtime_dir.clone());
            cfg.memory_mb = memory_mb;
            Instance::restore_as(&snap, thaw_engine::pageserver::Paging::Auto, cfg.record()).map_err(|e| crate::node::error_chain(&e))
        });
        match restored {
            Ok(mut inst) => {
                let _ = inst.freeze();
                self.restored.fetch_add(1, Ordering::Relaxed);
                debug!(base = %dir.display(), "a base instance joined the pool");
                Some(inst)
            }
            Err(e) => {
                warn!(base = %dir.display(), error = %e, "restoring a base instance for the pool failed");
                None
            }
        }
    }

    /// An idle instance the keep-alive would destroy: if it came from a base and the
    /// pool has room, it is reset to the base on `workers` and pooled (None); else it
    /// is given back, for the caller to discard.
    pub fn retire(self: &Arc<Self>, inst: Instance, workers: &WorkerPool) -> Option<Instance> {
        let Some(dir) = inst.base_dir().map(Path::to_path_buf) else { return Some(inst) };
        if !self.reserve(&dir) {
            return Some(inst);
        }
        let memory_mb = inst.memory_mb();
        let (pool, at) = (self.clone(), dir.clone());
        let slot = Arc::new(Mutex::new(Some(inst)));
        let job = slot.clone();
        let queued = workers.spawn(move || {
            let dir = at;
            let Some(mut inst) = job.lock().ok().and_then(|mut g| g.take()) else { return };
            let reset = pool.snapshot(&dir).and_then(|snap| inst.reset_to_base(&snap).map_err(|e| crate::node::error_chain(&e)));
            match reset {
                Ok(st) => {
                    let _ = inst.freeze();
                    pool.returned.fetch_add(1, Ordering::Relaxed);
                    info!(base = %dir.display(), reset_ms = st.reset_ms, "an idle instance went back to its base's pool");
                    pool.arrived(&dir, Some(inst), memory_mb);
                }
                Err(e) => {
                    pool.refused.fetch_add(1, Ordering::Relaxed);
                    warn!(base = %dir.display(), error = %e, "resetting an idle instance to its base refused; discarded");
                    inst.kill();
                    pool.arrived(&dir, None, memory_mb);
                }
            }
        });
        match queued {
            Ok(()) => None,
            Err(_) => {
                Self::unreserve(&mut self.lock(), &dir);
                slot.lock().ok().and_then(|mut g| g.take())
            }
        }
    }

    /// Any one pooled instance (to make room for a start). Its reservation goes with it.
    pub fn take_any(&self) -> Option<Instance> {
        let inst = self.lock().idle.values_mut().find_map(Vec::pop)?;
        self.gauge.dec();
        Some(inst)
    }

    /// Every pooled instance, taken out (shutdown). Their reservations go with them.
    pub fn drain(&self) -> Vec<Instance> {
        let mut g = self.lock();
        let all: Vec<Instance> = g.idle.drain().flat_map(|(_, v)| v).collect();
        self.gauge.sub(all.len() as i64);
        all
    }

    /// For `thaw status`: the bound, the instances pooled and coming per base, and how
    /// many were restored for the pool, came back to it, or were refused on the way.
    pub fn status(&self) -> serde_json::Value {
        let g = self.lock();
        let per: serde_json::Map<String, serde_json::Value> = g
            .idle
            .keys()
            .chain(g.coming.keys())
            .map(|d| {
                let id = d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                (id, serde_json::json!({"idle": g.idle.get(d).map_or(0, Vec::len), "coming": g.coming.get(d).copied().unwrap_or(0)}))
            })
            .collect();
        serde_json::json!({
            "max_per_base": self.max,
            "idle": g.idle.values().map(Vec::len).sum::<usize>(),
            "bases": per,
            "restored": self.restored.load(Ordering::Relaxed),
            "returned": self.returned.load(Ordering::Relaxed),
            "resets_refused": self.refused.load(Ordering::Relaxed),
        })
    }
}

/// The cost of a revision's cold starts, by way: its diff installed into a pooled base
/// instance, the function loaded into one, or its snapshot restored (milliseconds,
/// moving averages; None: not measured; infinite: the way is not open to it).
#[derive(Debug, Default)]
pub struct StartCosts(Mutex<[Option<f64>; 3]>);

const INSTALL: usize = 0;
const LOAD: usize = 1;
const RESTORE: usize = 2;

impl StartCosts {
    fn lock(&self) -> std::sync::MutexGuard<'_, [Option<f64>; 3]> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the next cold start should be served from the pool: each way is
    /// measured once (the pool's first: installing, loading; then a restore), then
    /// whichever costs less.
    pub fn prefer_pool(&self) -> bool {
        match *self.lock() {
            [None, ..] | [_, None, _] => true,
            [.., None] => false,
            [Some(install), Some(load), Some(restore)] => install.min(load) <= restore,
        }
    }

    /// Whether a start served from the pool should install the function's diff
    /// (`can_install`: it has one on the pool's base) rather than load the function:
    /// each measured once, then the cheaper.
    pub fn pool_installs(&self, can_install: bool) -> bool {
        let mut g = self.lock();
        if !can_install {
            g[INSTALL] = Some(f64::INFINITY);
            return false;
        }
        match (g[INSTALL], g[LOAD]) {
            (None, _) => true,
            (Some(i), _) if i.is_infinite() => false,
            (_, None) => false,
            (Some(i), Some(l)) => i <= l,
        }
    }

    /// The function's diff could not be installed: the pool loads it from now on.
    pub fn install_refused(&self) {
        self.lock()[INSTALL] = Some(f64::INFINITY);
    }

    /// A start of kind `kind` (`Instance::start.kind`) took `ms`.
    pub fn note(&self, kind: &str, ms: f64) {
        let mut g = self.lock();
        let slot = match kind {
            "repurposed-diff" => &mut g[INSTALL],
            "repurposed" => &mut g[LOAD],
            k if k.starts_with("restore") => &mut g[RESTORE],
            _ => return,
        };
        *slot = Some(slot.filter(|old| old.is_finite()).map_or(ms, |old| 0.7 * old + 0.3 * ms));
    }

    /// For `thaw status` (null: not measured, or not open to it).
    pub fn status(&self) -> serde_json::Value {
        let g = self.lock();
        let ms = |v: Option<f64>| v.filter(|v| v.is_finite());
        serde_json::json!({"repurposed_diff_ms": ms(g[INSTALL]), "repurposed_ms": ms(g[LOAD]), "restore_ms": ms(g[RESTORE])})
    }
}

#[cfg(test)]
mod tests {
    use super::StartCosts;

    #[test]
    fn each_way_is_tried_once_then_the_cheapest() {
        let c = StartCosts::default();
        assert!(c.prefer_pool() && c.pool_installs(true), "nothing measured: install into a pooled instance");
        c.note("repurposed-diff", 30.0);
        assert!(c.prefer_pool() && !c.pool_installs(true), "an install measured: load into one");
        c.note("repurposed", 100.0);
        assert!(!c.prefer_pool(), "both pool ways measured: measure a restore");
        c.note("restore-prefetch", 10.0);
        assert!(!c.prefer_pool(), "a restore is cheaper");
        c.note("warm", 0.0);
        c.note("boot", 1.0);
        assert!(!c.prefer_pool(), "other kinds change nothing");
        for _ in 0..20 {
            c.note("restore-lazy", 500.0);
        }
        assert!(c.prefer_pool() && c.pool_installs(true), "restores got slower than the install, which is cheaper than a load");
    }

    #[test]
    fn a_function_without_an_installable_diff_is_loaded() {
        let c = StartCosts::default();
        assert!(c.prefer_pool());
        assert!(!c.pool_installs(false), "no diff on the pool's base: load");
        c.note("repurposed", 100.0);
        assert!(!c.prefer_pool(), "the load measured (installing is not open to it): measure a restore");
        c.note("restore-prefetch", 200.0);
        assert!(c.prefer_pool() && !c.pool_installs(true), "the load is cheaper; installing stays closed once found closed");
        let d = StartCosts::default();
        d.install_refused();
        assert!(!d.pool_installs(true), "a refused install is not tried again");
        assert_eq!(d.status()["repurposed_diff_ms"], serde_json::Value::Null);
    }
}
