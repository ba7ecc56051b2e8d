//! A few [`Prepared`] sandboxes per shape, kept ready by one long-lived thread, so a
//! restore does not pay for creating its sandbox.
//!
//! A shape is everything of a [`SandboxSpec`] but its id, code directory and
//! environment (a restore's environment comes from its image). [`SandboxPool::take`]
//! hands out a ready sandbox of the spec's shape, or `None` (the caller spawns one as
//! before) and remembers the shape, so the next cold start of it finds one. A known
//! shape that runs dry (a burst) gets one more kept ready per miss, up to
//! `BURST_GROWTH` times the base size, and goes back to the base size after a minute
//! without misses. The
//! refill thread prepares one sandbox at a time, off every caller's critical path;
//! shapes unused for a while are forgotten and their sandboxes removed.
//!
//! The pool's thread is the parent of every sandbox it prepared, including those
//! handed out and running: its exit kills them (PR_SET_PDEATHSIG). Keep the pool
//! alive (an `Arc`) as long as any sandbox taken from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::prepared::Prepared;
use crate::{Sandbox, SandboxSpec};

/// Shapes remembered at most (the least recently used is forgotten first).
const MAX_SHAPES: usize = 16;
/// A shape not taken from for this long is forgotten.
const IDLE_TTL: Duration = Duration::from_secs(600);
/// The refill waits until no sandbox has been taken for this long: preparing one
/// takes a few milliseconds of CPU that the cold starts of a burst need more.
const REFILL_QUIET: Duration = Duration::from_millis(20);
/// A shape whose cold starts find the pool empty (a burst) gets one more sandbox
/// kept ready per miss, up to this many times `per_shape`; ...
const BURST_GROWTH: usize = 8;
/// ... and back to `per_shape` once it has had no miss for this long.
const SHRINK_AFTER: Duration = Duration::from_secs(60);
/// Longest pause after failed preparations of a shape.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Counters of a pool, for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// `take` calls that got a prepared sandbox.
    pub hits: u64,
    /// `take` calls that found none ready.
    pub misses: u64,
    /// Sandboxes prepared, and preparations that failed.
    pub prepared: u64,
    pub failures: u64,
    /// Sandboxes ready now, over all shapes.
    pub ready: usize,
    pub shapes: usize,
}

struct Slot {
    key: String,
    template: SandboxSpec,
    ready: Vec<Prepared>,
    want: usize,
    last_use: Instant,
    last_miss: Option<Instant>,
    failures: u32,
    retry_at: Option<Instant>,
}

struct State {
    slots: Vec<Slot>,
    stop: bool,
    /// When a sandbox was last taken (see [`REFILL_QUIET`]).
    last_take: Option<Instant>,
    /// Sandboxes of forgotten shapes, removed by the refill thread (removing one kills
    /// and reaps it, which `take`'s caller must not wait for).
    graveyard: Vec<Prepared>,
}

struct Inner {
    state: Mutex<State>,
    /// Wakes the refill thread (a shape wants more) and `wait_ready` callers.
    changed: Condvar,
    per_shape: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    prepared: AtomicU64,
    failures: AtomicU64,
    next_id: AtomicU64,
    /// `pool-<pid>-<pool number>`: the prepared sandboxes' ids start with it.
    prefix: String,
}

/// Prepared sandboxes by shape; see the module documentation.
pub struct SandboxPool {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The shape of `spec`: what a prepared sandbox must match.
fn shape_key(spec: &SandboxSpec) -> String {
    let mut s = spec.clone();
    s.id.clear();
    s.code_dir.clear();
    s.opt_dir = None;
    s.env.clear();
    format!("{s:?}")
}

impl SandboxPool {
    /// A pool keeping `per_shape` sandboxes ready for each shape it has been asked for.
    pub fn new(per_shape: usize) -> std::io::Result<SandboxPool> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State { slots: Vec::new(), stop: false, last_take: None, graveyard: Vec::new() }),
            changed: Condvar::new(),
            per_shape,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            prepared: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            prefix: {
                static POOLS: AtomicU64 = AtomicU64::new(0);
                format!("pool-{}-{}", std::process::id(), POOLS.fetch_add(1, Ordering::Relaxed))
            },
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new().name("thaw-sbx-pool".into()).spawn(move || worker.refill())?;
        Ok(SandboxPool { inner, thread: Mutex::new(Some(thread)) })
    }

    /// A ready sandbox of `spec`'s shape, or `None` (the shape is then kept ready
    /// from now on).
    pub fn take(&self, spec: &SandboxSpec) -> Option<Prepared> {
        let key = shape_key(spec);
        let mut st = self.inner.lock();
        let per_shape = self.inner.per_shape;
        if st.stop {
            return None;
        }
        let known = st.slots.iter().any(|s| s.key == key);
        let slot = st.slot(&key, spec, per_shape);
        slot.last_use = Instant::now();
        let got = slot.ready.pop();
        if got.is_none() && known {
            // A burst outran the pool: keep more ready for the next one.
            slot.want = (slot.want + 1).min(per_shape.max(1) * BURST_GROWTH);
            slot.last_miss = Some(Instant::now());
        }
        st.last_take = Some(Instant::now());
        drop(st);
        self.inner.changed.notify_all();
        let counter = if got.is_some() { &self.inner.hits } else { &self.inner.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        got
    }

    /// Keep at least `n` sandboxes of `spec`'s shape ready (e.g. ahead of an expected
    /// burst) and wait up to `timeout` until they are, or until a preparation of the
    /// shape fails (the pool then backs off; waiting on would only wait that out).
    /// Returns how many are ready.
    pub fn fill(&self, spec: &SandboxSpec, n: usize, timeout: Duration) -> usize {
        let key = shape_key(spec);
        let deadline = Instant::now() + timeout;
        let mut st = self.inner.lock();
        let per_shape = self.inner.per_shape;
        let slot = st.slot(&key, spec, per_shape);
        slot.want = slot.want.max(n);
        slot.last_use = Instant::now();
        self.inner.changed.notify_all();
        loop {
            let slot = st.slots.iter().find(|s| s.key == key);
            let ready = slot.map_or(0, |s| s.ready.len());
            let failing = slot.is_some_and(|s| s.retry_at.is_some());
            let now = Instant::now();
            if ready >= n || now >= deadline || st.stop || failing {
                return ready;
            }
            st = self.inner.changed.wait_timeout(st, deadline - now).expect("pool lock").0;
        }
    }

    /// What the ids of this pool's sandboxes start with (`pool-<pid>-<n>`; a node's
    /// sweep of stale sandboxes reads the pid from it).
    pub fn id_prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub fn stats(&self) -> PoolStats {
        let st = self.inner.lock();
        PoolStats {
            hits: self.inner.hits.load(Ordering::Relaxed),
            misses: self.inner.misses.load(Ordering::Relaxed),
            prepared: self.inner.prepared.load(Ordering::Relaxed),
            failures: self.inner.failures.load(Ordering::Relaxed),
            ready: st.slots.iter().map(|s| s.ready.len()).sum(),
            shapes: st.slots.len(),
        }
    }
}

impl std::fmt::Debug for SandboxPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxPool").field("per_shape", &self.inner.per_shape).field("stats", &self.stats()).finish()
    }
}

impl SandboxPool {
    /// Stop preparing and remove the sandboxes still prepared. The thread ends, and
    /// with it every sandbox taken from the pool that is still running (call it when
    /// they are gone, e.g. at shutdown). Later `take`s find nothing. Idempotent.
    pub fn shutdown(&self) {
        self.inner.lock().stop = true;
        self.inner.changed.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for SandboxPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl State {
    /// The slot of `key`, created (forgetting the least recently used shape beyond
    /// [`MAX_SHAPES`]) if new.
    fn slot(&mut self, key: &str, spec: &SandboxSpec, want: usize) -> &mut Slot {
        if let Some(i) = self.slots.iter().position(|s| s.key == key) {
            return &mut self.slots[i];
        }
        if self.slots.len() >= MAX_SHAPES {
            let lru = (0..self.slots.len()).min_by_key(|&i| self.slots[i].last_use).expect("non-empty");
            let gone = self.slots.swap_remove(lru);
            self.graveyard.extend(gone.ready);
        }
        self.slots.push(Slot {
            key: key.to_string(),
            template: spec.clone(),
            ready: Vec::new(),
            want,
            last_use: Instant::now(),
            last_miss: None,
            failures: 0,
            retry_at: None,
        });
        self.slots.last_mut().expect("just pushed")
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The refill thread: prepare one sandbox at a time for a shape short of its
    /// target; forget idle shapes; sleep when there is nothing to do.
    fn refill(&self) {
        let mut st = self.lock();
        loop {
            if st.stop {
                break;
            }
            let now = Instant::now();
            // Removing a sandbox kills and reaps it: never while holding the lock.
            let mut surplus: Vec<Prepared> = std::mem::take(&mut st.graveyard);
            let (idle, kept): (Vec<Slot>, Vec<Slot>) =
                std::mem::take(&mut st.slots).into_iter().partition(|s| now.duration_since(s.last_use) >= IDLE_TTL);
            st.slots = kept;
            surplus.extend(idle.into_iter().flat_map(|s| s.ready));
            let per_shape = self.per_shape;
            for s in st.slots.iter_mut().filter(|s| s.want > per_shape && s.last_miss.is_some_and(|t| now.duration_since(t) > SHRINK_AFTER)) {
                s.want = per_shape;
                s.last_miss = None;
                while s.ready.len() > per_shape {
                    surplus.extend(s.ready.pop());
                }
            }
            if !surplus.is_empty() {
                drop(st);
                drop(surplus);
                st = self.lock();
                continue;
            }
            if let Some(quiet_at) = st.last_take.map(|t| t + REFILL_QUIET).filter(|&t| t > now) {
                st = self.changed.wait_timeout(st, quiet_at - now).expect("pool lock").0;
                continue;
            }
            let next = st
                .slots
                .iter()
                .filter(|s| s.ready.len() < s.want && s.retry_at.is_none_or(|t| t <= now))
                .min_by_key(|s| s.ready.len())
                .map(|s| (s.key.clone(), s.template.clone()));
            let Some((key, mut spec)) = next else {
                let nap = st.slots.iter().filter_map(|s| s.retry_at).min().map_or(Duration::from_secs(5), |t| t.saturating_duration_since(now));
                st = self.changed.wait_timeout(st, nap.max(Duration::from_millis(1))).expect("pool lock").0;
                continue;
            };
            drop(st);
            spec.id = format!("{}-{}", self.prefix, self.next_id.fetch_add(1, Ordering::Relaxed));
            let made = Sandbox::prepare(&spec);
            st = self.lock();
            let slot = st.slots.iter_mut().find(|s| s.key == key);
            let mut orphan = None;
            match (made, slot) {
                (Ok(p), Some(slot)) => {
                    self.prepared.fetch_add(1, Ordering::Relaxed);
                    slot.failures = 0;
                    slot.retry_at = None;
                    slot.ready.push(p);
                }
                (Ok(p), None) => orphan = Some(p), // the shape was forgotten meanwhile
                (Err(e), slot) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    if let Some(slot) = slot {
                        slot.failures += 1;
                        let backoff = Duration::from_millis(100).saturating_mul(1 << slot.failures.min(9)).min(MAX_BACKOFF);
                        slot.retry_at = Some(Instant::now() + backoff);
                        tracing::warn!(error = %e, cause = ?std::error::Error::source(&e), failures = slot.failures, retry_in = ?backoff,
                            "cannot prepare a sandbox; cold starts of this shape create their own meanwhile");
                    }
                }
            }
            self.changed.notify_all();
            if orphan.is_some() {
                drop(st);
                drop(orphan);
                st = self.lock();
            }
        }
        // Remove what is still prepared while this thread (their parent) is alive.
        let slots = std::mem::take(&mut st.slots);
        let graveyard = std::mem::take(&mut st.graveyard);
        drop(st);
        drop((slots, graveyard));
    }
}
