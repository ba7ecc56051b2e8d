//! Command-line front ends of the cluster crate (`thaw sim`).

use std::path::PathBuf;

use clap::Args;

use crate::placement::{Policy, DEFAULT_LOAD_FACTOR};
use crate::ring::DEFAULT_VNODES;
use crate::sim::{self, Costs, SimConfig, SimError, TraceKind};

/// `thaw sim`: replay a trace through the placement policy over simulated nodes.
#[derive(Args, Debug)]
#[command(long_about = "Simulate a Thaw cluster: the gateway's placement code (the same functions) routes every \
invocation of a trace to one of N simulated nodes, each with warm instances and an LRU snapshot cache. Prints the \
cold-start cache hit ratio, bytes fetched from the snapshot store, start-up latency percentiles and the busiest \
node's load over the mean.\n\nStart-up costs default to measured figures: warm ~1 ms (thaw bench warm invokes), \
local restore ~7 ms (REAP prefetch restore_ms medians 5.0-7.5 ms), remote restore ~20 ms (restore after fetching \
a few MiB from the store; a stand-in until the store's own figure).\n\n--compare runs every policy at each of \
--node-counts and writes JSON + an SVG chart into --out.")]
pub struct SimArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// Functions in the synthetic trace (the thesis trace always has 4).
    #[arg(long, default_value_t = 10_000)]
    pub functions: usize,
    /// Each node's snapshot cache, as a fraction of the bytes of all functions' snapshots.
    #[arg(long, default_value_t = 0.05)]
    pub cache_fraction: f64,
    /// Placement policy: random, least-loaded, hash (plain consistent hashing) or thaw.
    #[arg(long, default_value = "thaw")]
    pub policy: Policy,
    /// Trace: azure (synthetic, Zipf + diurnal + bursts) or thesis (de Jesus' 4-function trace).
    #[arg(long, default_value = "azure")]
    pub trace: TraceKind,
    /// Simulated seconds.
    #[arg(long, default_value_t = 600.0)]
    pub duration: f64,
    /// Leading simulated seconds that run but are not counted (caches fill).
    #[arg(long, default_value_t = 200.0)]
    pub warmup: f64,
    /// Mean invocations per second per node (azure trace).
    #[arg(long, default_value_t = 10.0)]
    pub rate_per_node: f64,
    /// Zipf exponent of function popularity (azure trace).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// Seconds an idle instance stays warm (Knative's default scale-down window: 60 s).
    #[arg(long, default_value_t = 60.0)]
    pub keep_alive: f64,
    /// Load bound factor c: a node at ceil(c * mean + ...) invocations takes no more (thaw policy).
    #[arg(long, default_value_t = DEFAULT_LOAD_FACTOR)]
    pub load_factor: f64,
    /// Virtual nodes per node on the consistent-hashing ring.
    #[arg(long, default_value_t = DEFAULT_VNODES)]
    pub vnodes: u32,
    /// Start-up cost of a warm invocation, ms.
    #[arg(long, default_value_t = 1.0)]
    pub warm_ms: f64,
    /// Start-up cost of a restore from the node's snapshot cache, ms.
    #[arg(long, default_value_t = 7.0)]
    pub local_ms: f64,
    /// Start-up cost of a restore that fetches the snapshot from the store, ms.
    #[arg(long, default_value_t = 20.0)]
    pub remote_ms: f64,
    /// Seed of the trace and of random choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Run every policy at each of --node-counts; write JSON + SVG into --out.
    #[arg(long)]
    pub compare: bool,
    /// Node counts for --compare.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    pub node_counts: Vec<usize>,
    /// Output directory for --compare.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
}

impl SimArgs {
    pub fn config(&self) -> SimConfig {
        SimConfig {
            nodes: self.nodes,
            functions: if self.trace == TraceKind::Thesis { 4 } else { self.functions },
            cache_fraction: self.cache_fraction,
            policy: self.policy,
            trace: self.trace,
            duration_s: if self.trace == TraceKind::Thesis { 1800.0 } else { self.duration },
            warmup_s: if self.trace == TraceKind::Thesis { 0.0 } else { self.warmup },
            rate_per_node: self.rate_per_node,
            zipf: self.zipf,
            keep_alive_s: self.keep_alive,
            load_factor: self.load_factor,
            vnodes: self.vnodes,
            costs: Costs { warm_ms: self.warm_ms, local_ms: self.local_ms, remote_ms: self.remote_ms },
            seed: self.seed,
        }
    }
}

/// Runs `thaw sim`; `stamp` names the --compare output files. Returns what to print.
pub fn sim(args: &SimArgs, stamp: &str) -> Result<String, SimError> {
    let cfg = args.config();
    if args.compare {
        let reports = sim::compare(&cfg, &args.node_counts, |r| {
            tracing::info!(nodes = r.nodes, policy = %r.policy, hit_ratio = r.hit_ratio, "simulated");
            eprint!("{}", sim::table(std::slice::from_ref(r)).lines().nth(1).map(|l| format!("{l}\n")).unwrap_or_default());
        })?;
        let (json, svg) = sim::write_comparison(&args.out, stamp, &reports)?;
        if args.json {
            return Ok(serde_json::to_string_pretty(&reports).expect("reports serialise") + "\n");
        }
        return Ok(format!("{}wrote {} and {}\n", sim::table(&reports), json.display(), svg.display()));
    }
    cfg.validate()?;
    let trace = sim::Trace::generate(&cfg);
    let report = sim::simulate(&cfg, &trace)?;
    Ok(if args.json {
        serde_json::to_string_pretty(&report).expect("report serialises") + "\n"
    } else {
        sim::table(std::slice::from_ref(&report))
    })
}
