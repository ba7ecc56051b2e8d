//! `thaw sim`: trace-driven simulation of snapshot placement over 10..1,000 nodes.
//!
//! The simulator drives the gateway's own [`Placer`] (the same functions, not a copy)
//! with an invocation trace and models, per node:
//!
//! - **instances**: an invocation runs on the chosen node for its duration plus its
//!   start-up cost; afterwards its instance stays idle ("warm") for `keep_alive_s`
//!   and serves a later invocation of the same function on that node at `warm_ms`;
//! - **a snapshot cache**: an LRU over snapshot bytes, `cache_fraction` of the bytes of
//!   all functions' snapshots. A cold start whose snapshot is cached is a *hit*
//!   (local restore, `local_ms`); otherwise a *miss* fetches the snapshot from the
//!   store (`remote_ms`, its bytes counted in `store_bytes`) and caches it.
//!
//! Not modelled: CPU contention and queueing on a node (the load bound is what keeps
//! nodes even), the memory held by idle instances, network topology, node failures.
//! Invocations in the first `warmup_s` run but are not counted, so the figures describe
//! a cluster in steady state rather than one starting with empty caches.
//!
//! Traces ([`TraceKind`]):
//! - `azure`: Azure-Functions-like synthetic trace: `functions` functions whose
//!   popularity follows a Zipf law (exponent `zipf`), a diurnal swing of the total rate
//!   (±50 % over a "day" compressed to the trace length), and bursts (a function gets
//!   tens of invocations within a second or two, as queue- and timer-triggered
//!   functions do). Durations and snapshot sizes are log-normal per function.
//! - `thesis`: the 4-function cold-start trace of de Jesus' thesis (In-Vitro,
//!   30 minutes, one call every other minute per function, sizes = the functions'
//!   average memory), see ../shared/readings/orchestration.md §2.1.
//!
//! Start-up costs default to figures measured on this project's machines (see
//! [`Costs`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hash::{hash_pair, hash_str, Rng};
use crate::placement::{Loads, Placer, Policy, Request, DEFAULT_LOAD_FACTOR};
use crate::ring::{Ring, DEFAULT_VNODES};

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid simulation parameter: {0}")]
    Invalid(String),
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("drawing chart {path}: {msg}")]
    Chart { path: PathBuf, msg: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceKind {
    Azure,
    Thesis,
}

impl std::str::FromStr for TraceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<TraceKind, String> {
        match s {
            "azure" => Ok(TraceKind::Azure),
            "thesis" => Ok(TraceKind::Thesis),
            _ => Err(format!("unknown trace {s:?} (expected azure or thesis)")),
        }
    }
}

/// Start-up cost of an invocation by how its instance was obtained, in milliseconds.
///
/// Defaults: `warm` ~1 ms is the warm invocation overhead of `thaw bench` (handler-only
/// invokes of the Python samples: 0.2-2.1 ms median); `local` ~7 ms is a REAP prefetch
/// restore from the node's disk (restore_ms medians 5.0-7.5 ms, bench/results/
/// reap-20261122T020035Z.txt); `remote` ~20 ms is a restore whose snapshot (a few MiB of
/// working set + state) must first be fetched from the snapshot store on a local
/// network: the lazy-from-cold-disk time to first response of the same samples
/// (~20 ms) taken as a stand-in until the store (#13) publishes its own figure.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Costs {
    pub warm_ms: f64,
    pub local_ms: f64,
    pub remote_ms: f64,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs { warm_ms: 1.0, local_ms: 7.0, remote_ms: 20.0 }
    }
}

/// Parameters of one simulation run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimConfig {
    pub nodes: usize,
    pub functions: usize,
    pub cache_fraction: f64,
    pub policy: Policy,
    pub trace: TraceKind,
    /// Trace length, seconds of simulated time.
    pub duration_s: f64,
    /// Leading part of the trace that runs but is not counted.
    pub warmup_s: f64,
    /// Mean invocation rate per node (azure trace), per second: the total rate is
    /// `rate_per_node * nodes`, so nodes carry the same load at every cluster size.
    pub rate_per_node: f64,
    /// Zipf exponent of function popularity (azure trace).
    pub zipf: f64,
    /// How long an idle instance stays warm (Knative's default scale-to-zero window
    /// is 60 s, the thesis's setting).
    pub keep_alive_s: f64,
    pub load_factor: f64,
    pub vnodes: u32,
    pub costs: Costs,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            nodes: 100,
            functions: 10_000,
            cache_fraction: 0.05,
            policy: Policy::Thaw,
            trace: TraceKind::Azure,
            duration_s: 600.0,
            warmup_s: 200.0,
            rate_per_node: 10.0,
            zipf: 1.0,
            keep_alive_s: 60.0,
            load_factor: DEFAULT_LOAD_FACTOR,
            vnodes: DEFAULT_VNODES,
            costs: Costs::default(),
            seed: 1,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Invalid(m.to_string()));
        if self.nodes == 0 || self.nodes > 100_000 {
            return bad("--nodes must be in 1..=100000");
        }
        if self.functions == 0 || self.functions > 1_000_000 {
            return bad("--functions must be in 1..=1000000");
        }
        if !(self.cache_fraction >= 0.0 && self.cache_fraction <= 1.0) {
            return bad("--cache-fraction must be in [0, 1]");
        }
        if !(self.duration_s > 0.0 && self.warmup_s >= 0.0 && self.warmup_s < self.duration_s) {
            return bad("need --duration > 0 and 0 <= --warmup < --duration");
        }
        if !(self.rate_per_node > 0.0 && self.rate_per_node * self.nodes as f64 <= 1e6) {
            return bad("--rate-per-node must be > 0, and the total rate at most 1e6/s");
        }
        if !(self.zipf >= 0.0 && self.zipf <= 5.0) {
            return bad("--zipf must be in [0, 5]");
        }
        if self.keep_alive_s.is_nan() || self.keep_alive_s < 0.0 || self.load_factor.is_nan() || self.load_factor < 1.0 {
            return bad("need --keep-alive >= 0 and --load-factor >= 1");
        }
        let c = self.costs;
        if !(c.warm_ms >= 0.0 && c.local_ms >= 0.0 && c.remote_ms >= 0.0) {
            return bad("start-up costs must be >= 0 ms");
        }
        Ok(())
    }
}

/// One function of a trace.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub key: u64,
    pub snapshot_bytes: u64,
    pub duration_ms: f64,
}

/// Functions and their invocations, sorted by time.
#[derive(Debug, Clone)]
pub struct Trace {
    pub functions: Vec<Function>,
    /// (seconds since start, function index)
    pub arrivals: Vec<(f64, u32)>,
}

impl Trace {
    pub fn generate(cfg: &SimConfig) -> Trace {
        match cfg.trace {
            TraceKind::Azure => azure(cfg),
            TraceKind::Thesis => thesis(cfg.seed),
        }
    }

    pub fn total_snapshot_bytes(&self) -> u64 {
        self.functions.iter().map(|f| f.snapshot_bytes).sum()
    }
}

fn lognormal(rng: &mut Rng, median: f64, sigma: f64, lo: f64, hi: f64) -> f64 {
    (median * (sigma * rng.normal()).exp()).clamp(lo, hi)
}

fn azure(cfg: &SimConfig) -> Trace {
    let rate = cfg.rate_per_node * cfg.nodes as f64;
    let mut rng = Rng::new(cfg.seed);
    let functions: Vec<Function> = (0..cfg.functions)
        .map(|i| {
            let name = format!("fn-{i:06}");
            Function {
                key: hash_str(&name),
                name,
                // Python/Node.js snapshots here are 5-13 MiB of pages; JVMs and data-heavy
                // functions are larger: median 32 MiB, long tail to 1 GiB.
                snapshot_bytes: lognormal(&mut rng, 32.0 * MIB, 0.8, 4.0 * MIB, 1024.0 * MIB) as u64,
                // Azure 2019: half of the functions run < 1 s on average.
                // Azure Functions 2019 (Shahrad et al., ATC'20): about half of the
                // functions run < 1 s on average, 96 % < 60 s: median 1 s, long tail.
                duration_ms: lognormal(&mut rng, 1000.0, 1.2, 2.0, 60_000.0),
            }
        })
        .collect();
    // Zipf popularity over a random permutation (rank is independent of the name).
    let mut order: Vec<u32> = (0..cfg.functions as u32).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut cum = Vec::with_capacity(order.len());
    let mut acc = 0.0;
    for rank in 0..order.len() {
        acc += 1.0 / ((rank + 1) as f64).powf(cfg.zipf);
        cum.push(acc);
    }
    let pick = |rng: &mut Rng| order[cum.partition_point(|&c| c < rng.f64() * acc).min(order.len() - 1)];

    // 80 % of the invocations arrive as a diurnal Poisson stream (rate thinned from the
    // peak), 20 % in bursts of ~40 invocations within ~2 s.
    let day = cfg.duration_s;
    let diurnal = |t: f64| 1.0 + 0.5 * (std::f64::consts::TAU * t / day).sin();
    let base = 0.8 * rate;
    let peak = 1.5 * base;
    let mut arrivals = Vec::with_capacity((rate * cfg.duration_s * 1.05) as usize);
    let mut t = 0.0;
    loop {
        t += rng.exp(1.0 / peak);
        if t >= cfg.duration_s {
            break;
        }
        if rng.f64() * 1.5 < diurnal(t) {
            arrivals.push((t, pick(&mut rng)));
        }
    }
    let burst_size = 40.0;
    let burst_rate = 0.2 * rate / burst_size;
    let mut t = 0.0;
    loop {
        t += rng.exp(1.0 / burst_rate);
        if t >= cfg.duration_s {
            break;
        }
        let f = pick(&mut rng);
        let n = 1 + rng.exp(burst_size - 1.0) as usize;
        let span = 0.5 + 2.0 * rng.f64();
        for _ in 0..n {
            let at = t + span * rng.f64();
            if at < cfg.duration_s {
                arrivals.push((at, f));
            }
        }
    }
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    Trace { functions, arrivals }
}

fn thesis(seed: u64) -> Trace {
    // (name, duration ms, average memory MB, first minute): In-Vitro cold_start trace.
    const FNS: [(&str, f64, u64, u32); 4] = [
        ("cartservice", 100.0, 120, 2),
        ("trace-func-go", 500.0, 176, 2),
        ("video-processing-python-100", 250.0, 170, 7),
        ("video-processing-python-10", 125.0, 112, 7),
    ];
    let mut rng = Rng::new(seed);
    let functions = FNS
        .iter()
        .map(|&(name, d, mb, _)| Function {
            name: name.to_string(),
            key: hash_str(name),
            snapshot_bytes: mb * 1024 * 1024,
            duration_ms: d,
        })
        .collect();
    let mut arrivals = Vec::new();
    for (i, &(_, _, _, first)) in FNS.iter().enumerate() {
        for minute in (first..=30).step_by(2) {
            // One call somewhere in the minute (the loader's exponential IAT).
            arrivals.push(((minute - 1) as f64 * 60.0 + 60.0 * rng.f64(), i as u32));
        }
    }
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    Trace { functions, arrivals }
}

/// Invocations in flight per node, with an O(1) least-loaded lookup (nodes bucketed by load).
struct LoadIndex {
    load: Vec<u32>,
    total: u64,
    buckets: Vec<Vec<u32>>,
    pos: Vec<usize>,
}

impl LoadIndex {
    fn new(n: usize) -> LoadIndex {
        LoadIndex { load: vec![0; n], total: 0, buckets: vec![(0..n as u32).collect()], pos: (0..n).collect() }
    }

    fn shift(&mut self, node: usize, up: bool) {
        let l = self.load[node] as usize;
        let b = &mut self.buckets[l];
        let p = self.pos[node];
        b.swap_remove(p);
        if p < b.len() {
            self.pos[b[p] as usize] = p;
        }
        let nl = if up { l + 1 } else { l - 1 };
        if nl >= self.buckets.len() {
            self.buckets.push(Vec::new());
        }
        self.pos[node] = self.buckets[nl].len();
        self.buckets[nl].push(node as u32);
        self.load[node] = nl as u32;
        if up {
            self.total += 1;
        } else {
            self.total -= 1;
        }
    }
}

impl Loads for LoadIndex {
    fn len(&self) -> usize {
        self.load.len()
    }
    fn load(&self, node: usize) -> u32 {
        self.load[node]
    }
    fn total(&self) -> u64 {
        self.total
    }
    fn least_loaded(&self, rng: &mut Rng) -> usize {
        let b = self.buckets.iter().find(|b| !b.is_empty()).expect("at least one node");
        b[rng.below(b.len() as u64) as usize] as usize
    }
}

/// A node's snapshot cache: LRU by bytes.
#[derive(Default)]
struct Lru {
    used: u64,
    stamp: u64,
    entries: HashMap<u32, (u64, u64)>, // function -> (bytes, stamp)
    order: BTreeMap<u64, u32>,         // stamp -> function
}

impl Lru {
    fn touch(&mut self, f: u32) -> bool {
        let Some(e) = self.entries.get_mut(&f) else { return false };
        self.order.remove(&e.1);
        self.stamp += 1;
        e.1 = self.stamp;
        self.order.insert(self.stamp, f);
        true
    }

    /// Inserts `f`, evicting least recently used entries; returns the evicted ones.
    /// A snapshot larger than the whole cache is not cached (restored from the store).
    fn insert(&mut self, f: u32, bytes: u64, cap: u64, evicted: &mut Vec<u32>) -> bool {
        if bytes > cap {
            return false;
        }
        while self.used + bytes > cap {
            let (_, victim) = self.order.pop_first().expect("used > 0 implies entries");
            let (b, _) = self.entries.remove(&victim).expect("order and entries agree");
            self.used -= b;
            evicted.push(victim);
        }
        self.stamp += 1;
        self.entries.insert(f, (bytes, self.stamp));
        self.order.insert(self.stamp, f);
        self.used += bytes;
        true
    }
}

/// Figures of one run (the counted part of the trace).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimReport {
    pub policy: Policy,
    pub trace: TraceKind,
    pub nodes: usize,
    pub functions: usize,
    pub cache_fraction: f64,
    pub cache_bytes_per_node: u64,
    pub invocations: u64,
    /// Served by an idle warm instance.
    pub warm: u64,
    pub cold_starts: u64,
    /// Cold starts whose snapshot was in the node's cache.
    pub hits: u64,
    /// hits / cold_starts: the cold-start cache hit ratio.
    pub hit_ratio: f64,
    /// Bytes fetched from the snapshot store.
    pub store_bytes: u64,
    /// Start-up latency over all invocations (warm ones included).
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    /// Start-up latency of cold starts only.
    pub cold_p50_ms: f64,
    pub cold_p99_ms: f64,
    /// Busiest node's busy time (start-up + execution) over the nodes' mean.
    pub max_load_over_mean: f64,
    /// Largest number of invocations in flight on one node, and the largest mean.
    pub peak_node_load: u32,
    /// Distinct nodes a function ran on, mean over the functions that ran.
    pub nodes_per_function: f64,
    pub config: SimConfig,
}

fn percentile(sorted: &[f32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[i])
}

/// Runs one simulation of `trace` under `cfg` (its trace fields are ignored).
pub fn simulate(cfg: &SimConfig, trace: &Trace) -> Result<SimReport, SimError> {
    cfg.validate()?;
    let n = cfg.nodes;
    let names: Vec<String> = (0..n).map(|i| format!("node-{i:04}")).collect();
    let placer = Placer::new(cfg.policy, Ring::new(&names, cfg.vnodes), cfg.load_factor);
    let mut rng = Rng::new(hash_pair(cfg.seed, 0x5eed));
    let cap = (cfg.cache_fraction * trace.total_snapshot_bytes() as f64) as u64;
    let nf = trace.functions.len();

    let mut loads = LoadIndex::new(n);
    let mut caches: Vec<Lru> = (0..n).map(|_| Lru::default()).collect();
    let mut cached_on: Vec<Vec<usize>> = vec![Vec::new(); nf];
    // Idle instances per function and node: expiry times, ascending (pushed in time order).
    let mut idle: Vec<HashMap<u32, Vec<f64>>> = vec![HashMap::new(); nf];
    // Completions: (end time bits, node, function); times are >= 0 so bits order like f64.
    let mut running: BinaryHeap<Reverse<(u64, u32, u32)>> = BinaryHeap::new();
    let mut busy_ms = vec![0.0f64; n];
    let mut ran_on: Vec<Vec<u32>> = vec![Vec::new(); nf];

    let (mut invocations, mut warm, mut cold, mut hits, mut store_bytes) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut lat: Vec<f32> = Vec::with_capacity(trace.arrivals.len());
    let mut cold_lat: Vec<f32> = Vec::new();
    let mut peak = 0u32;
    let (mut warm_nodes, mut evicted) = (Vec::new(), Vec::new());

    for &(t, f) in &trace.arrivals {
        let fi = f as usize;
        while let Some(&Reverse((end, node, g))) = running.peek() {
            let end = f64::from_bits(end);
            if end > t {
                break;
            }
            running.pop();
            loads.shift(node as usize, false);
            idle[g as usize].entry(node).or_default().push(end + cfg.keep_alive_s);
        }
        let ids = &mut idle[fi];
        warm_nodes.clear();
        if cfg.policy == Policy::Thaw {
            // Nodes with a live idle instance, most recently idle first.
            let mut live: Vec<(f64, u32)> = Vec::new();
            ids.retain(|&node, exp| {
                let gone = exp.partition_point(|&e| e <= t);
                exp.drain(..gone);
                if let Some(&last) = exp.last() {
                    live.push((last, node));
                }
                !exp.is_empty()
            });
            live.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            warm_nodes.extend(live.iter().map(|&(_, node)| node as usize));
        }
        let req = Request { key: trace.functions[fi].key, warm: &warm_nodes, cached: &cached_on[fi] };
        let node = placer.place(&req, &loads, &mut rng).expect("nodes > 0").node;

        let func = &trace.functions[fi];
        let warm_here = match ids.get_mut(&(node as u32)) {
            Some(exp) => {
                let gone = exp.partition_point(|&e| e <= t);
                exp.drain(..gone);
                exp.pop().is_some()
            }
            None => false,
        };
        let startup = if warm_here {
            if t >= cfg.warmup_s {
                warm += 1;
            }
            cfg.costs.warm_ms
        } else {
            let hit = caches[node].touch(f);
            if !hit {
                evicted.clear();
                if caches[node].insert(f, func.snapshot_bytes, cap, &mut evicted) {
                    cached_on[fi].push(node);
                }
                for &v in &evicted {
                    cached_on[v as usize].retain(|&x| x != node);
                }
            }
            let ms = if hit { cfg.costs.local_ms } else { cfg.costs.remote_ms };
            if t >= cfg.warmup_s {
                cold += 1;
                if hit {
                    hits += 1;
                } else {
                    store_bytes += func.snapshot_bytes;
                }
                cold_lat.push(ms as f32);
            }
            ms
        };
        loads.shift(node, true);
        let end = t + (startup + func.duration_ms) / 1000.0;
        running.push(Reverse((end.to_bits(), node as u32, f)));
        if t >= cfg.warmup_s {
            invocations += 1;
            lat.push(startup as f32);
            busy_ms[node] += startup + func.duration_ms;
            peak = peak.max(loads.load[node]);
            if !ran_on[fi].contains(&(node as u32)) {
                ran_on[fi].push(node as u32);
            }
        }
    }

    lat.sort_by(f32::total_cmp);
    cold_lat.sort_by(f32::total_cmp);
    let mean_busy = busy_ms.iter().sum::<f64>() / n as f64;
    let max_busy = busy_ms.iter().copied().fold(0.0, f64::max);
    let ran: Vec<usize> = ran_on.iter().map(Vec::len).filter(|&l| l > 0).collect();
    Ok(SimReport {
        policy: cfg.policy,
        trace: cfg.trace,
        nodes: n,
        functions: nf,
        cache_fraction: cfg.cache_fraction,
        cache_bytes_per_node: cap,
        invocations,
        warm,
        cold_starts: cold,
        hits,
        hit_ratio: if cold > 0 { hits as f64 / cold as f64 } else { 0.0 },
        store_bytes,
        p50_ms: percentile(&lat, 0.50),
        p99_ms: percentile(&lat, 0.99),
        mean_ms: if lat.is_empty() { 0.0 } else { lat.iter().map(|&x| f64::from(x)).sum::<f64>() / lat.len() as f64 },
        cold_p50_ms: percentile(&cold_lat, 0.50),
        cold_p99_ms: percentile(&cold_lat, 0.99),
        max_load_over_mean: if mean_busy > 0.0 { max_busy / mean_busy } else { 0.0 },
        peak_node_load: peak,
        nodes_per_function: if ran.is_empty() { 0.0 } else { ran.iter().sum::<usize>() as f64 / ran.len() as f64 },
        config: cfg.clone(),
    })
}

/// Every policy at every node count; the policies at one node count replay the same trace.
pub fn compare(base: &SimConfig, node_counts: &[usize], mut progress: impl FnMut(&SimReport)) -> Result<Vec<SimReport>, SimError> {
    let mut out = Vec::new();
    for &nodes in node_counts {
        let at = SimConfig { nodes, ..base.clone() };
        at.validate()?;
        let trace = Trace::generate(&at);
        for policy in Policy::ALL {
            let cfg = SimConfig { nodes, policy, ..base.clone() };
            let r = simulate(&cfg, &trace)?;
            progress(&r);
            out.push(r);
        }
    }
    Ok(out)
}

/// Writes `<dir>/sim-<stamp>.json` and `<dir>/sim-<stamp>.svg`; returns their paths.
pub fn write_comparison(dir: &Path, stamp: &str, reports: &[SimReport]) -> Result<(PathBuf, PathBuf), SimError> {
    std::fs::create_dir_all(dir).map_err(|source| SimError::Write { path: dir.to_path_buf(), source })?;
    let json = dir.join(format!("sim-{stamp}.json"));
    let body = serde_json::json!({ "stamp": stamp, "runs": reports });
    let text = serde_json::to_string_pretty(&body).expect("reports serialise");
    std::fs::write(&json, text).map_err(|source| SimError::Write { path: json.clone(), source })?;
    let svg = dir.join(format!("sim-{stamp}.svg"));
    crate::chart::comparison(&svg, reports).map_err(|msg| SimError::Chart { path: svg.clone(), msg })?;
    Ok((json, svg))
}

/// One line per run, for the terminal.
pub fn table(reports: &[SimReport]) -> String {
    let mut s = format!(
        "{:>6} {:<13} {:>9} {:>9} {:>8} {:>10} {:>7} {:>7} {:>9} {:>8}\n",
        "nodes", "policy", "invokes", "cold", "hit %", "store GiB", "p50 ms", "p99 ms", "max/mean", "nodes/fn"
    );
    for r in reports {
        s += &format!(
            "{:>6} {:<13} {:>9} {:>9} {:>8.1} {:>10.1} {:>7.1} {:>7.1} {:>9.2} {:>8.1}\n",
            r.nodes,
            r.policy.name(),
            r.invocations,
            r.cold_starts,
            100.0 * r.hit_ratio,
            r.store_bytes as f64 / (1024.0 * MIB),
            r.p50_ms,
            r.p99_ms,
            r.max_load_over_mean,
            r.nodes_per_function
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recent_and_bypasses_oversized() {
        let mut c = Lru::default();
        let mut ev = Vec::new();
        assert!(c.insert(1, 40, 100, &mut ev));
        assert!(c.insert(2, 40, 100, &mut ev));
        assert!(c.touch(1));
        assert!(c.insert(3, 40, 100, &mut ev));
        assert_eq!(ev, vec![2]);
        assert!(!c.insert(4, 101, 100, &mut ev));
        assert!(c.touch(1) && c.touch(3) && !c.touch(2));
        assert_eq!(c.used, 80);
    }

    #[test]
    fn load_index_tracks_least_loaded() {
        let mut l = LoadIndex::new(3);
        l.shift(0, true);
        l.shift(2, true);
        l.shift(2, true);
        let mut rng = Rng::new(1);
        assert_eq!(l.least_loaded(&mut rng), 1);
        assert_eq!((l.total(), l.load(2)), (3, 2));
        l.shift(2, false);
        l.shift(2, false);
        for _ in 0..20 {
            assert_ne!(l.least_loaded(&mut rng), 0);
        }
    }

    #[test]
    fn thesis_trace_has_54_invocations() {
        let t = Trace::generate(&SimConfig { trace: TraceKind::Thesis, ..SimConfig::default() });
        assert_eq!(t.functions.len(), 4);
        assert_eq!(t.arrivals.len(), 54);
        assert!(t.arrivals.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn bad_parameters_are_refused() {
        let trace = Trace::generate(&SimConfig { trace: TraceKind::Thesis, ..SimConfig::default() });
        let err = simulate(&SimConfig { nodes: 0, ..SimConfig::default() }, &trace).unwrap_err();
        assert_eq!(err.to_string(), "invalid simulation parameter: --nodes must be in 1..=100000");
        let err = simulate(&SimConfig { cache_fraction: 1.5, ..SimConfig::default() }, &trace).unwrap_err();
        assert_eq!(err.to_string(), "invalid simulation parameter: --cache-fraction must be in [0, 1]");
    }
}
