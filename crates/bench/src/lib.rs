//! `thaw bench`: the cold-start experiment harness.
//!
//! Runs sample functions under every start mode — cold boot, lazy, eager,
//! lazy-page, record, parallel, ws-cached, prefetch (REAP) and warm — with the snapshot's
//! page cache evicted before each cold start, then concurrent cold starts, and
//! writes a table, summary lines, JSON and SVG charts. See bench/README.md.

pub mod charts;
pub mod cpu;
pub mod disk;
pub mod idle;
pub mod report;
pub mod runner;
pub mod stats;

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;

pub const DEFAULT_FUNCTIONS: &str = "helloworld,pyaes,jsonserde,htmlrender,imagerotate,lrserving,multiinput";

/// Every mode, in table order. `record` feeds the record-overhead figure.
/// `lazy` reads a 128 KiB read-around window per missing fault (a mapped memory
/// file's kernel behaviour); `lazy-page` reads exactly one page per fault.
/// `*-sealed`: the same paging mode on a snapshot sealed at rest (AES-256-GCM, see
/// engine/src/seal.rs), captured and recorded like the clear one in the same run.
pub const MODES: [&str; 12] = [
    "boot",
    "lazy",
    "lazy-page",
    "eager",
    "record",
    "parallel",
    "ws-cached",
    "prefetch",
    "warm",
    "prefetch-sealed",
    "lazy-sealed",
    "prefetch-pooled",
];

/// The modes of the concurrency (burst) experiment; see bench/README.md.
pub const CONCURRENCY_MODES: [&str; 6] = ["lazy", "prefetch", "prefetch-pooled", "burst-each", "burst-shared", "burst-pooled"];

fn concurrency_mode(s: &str) -> Result<String, String> {
    let m = s.trim();
    if CONCURRENCY_MODES.contains(&m) {
        Ok(m.to_string())
    } else {
        Err(format!("unknown concurrency mode '{m}' (expected one of {})", CONCURRENCY_MODES.join(", ")))
    }
}

/// A count, where an empty value means 0 (`--concurrency ""` skips the experiment).
fn count_or_empty(s: &str) -> Result<u32, String> {
    match s.trim() {
        "" => Ok(0),
        t => t.parse().map_err(|e| format!("'{t}' is not a count: {e}")),
    }
}

#[derive(Args, Debug, Clone, Default)]
pub struct BenchArgs {
    /// Comma-separated sample functions (default: helloworld,pyaes,jsonserde,htmlrender,imagerotate,lrserving,multiinput).
    /// Node.js and Java samples are named nodejs/NAME and java/NAME (e.g. nodejs/helloworld,java/matmul).
    /// "": none (only the concurrency or the idle experiment runs).
    #[arg(long, value_delimiter = ',')]
    pub functions: Option<Vec<String>>,
    /// Runs per function and mode (default 10; --quick: 3).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Directory for the JSON and SVG results (default bench/results).
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Numbers of concurrent cold starts (default 1,2,4,8,16; --quick: 1,2,4). "" or 0: skip the experiment.
    #[arg(long, value_delimiter = ',', value_parser = count_or_empty)]
    pub concurrency: Option<Vec<u32>>,
    /// Functions for the concurrency experiment.
    #[arg(long, value_delimiter = ',', default_value = "helloworld")]
    pub concurrency_functions: Vec<String>,
    /// Modes of the concurrency experiment (default all: lazy, prefetch, prefetch-pooled,
    /// burst-each, burst-shared, burst-pooled).
    #[arg(long, value_delimiter = ',', value_parser = concurrency_mode)]
    pub concurrency_modes: Option<Vec<String>>,
    /// CI smoke: runs=3, functions helloworld,pyaes, concurrency 1,2,4 (explicit options win).
    #[arg(long)]
    pub quick: bool,
    /// Directory holding the built sample functions.
    #[arg(long, default_value = "build/samples/python")]
    pub samples: PathBuf,
    /// Memory limit of the function sandboxes, MiB.
    #[arg(long, default_value_t = 1024)]
    pub memory: u64,
    /// Size of the file for the disk bandwidth measurement, MiB (at least 256).
    #[arg(long, default_value_t = 256)]
    pub disk_file_mib: usize,
    /// Numbers of idle instances to measure cold starts beside (e.g. 0,100,500; default:
    /// skip): the idle-instances experiment (see bench/README.md). With it, `--functions ""`
    /// runs this experiment alone.
    #[arg(long, value_delimiter = ',', value_parser = count_or_empty)]
    pub idle: Option<Vec<u32>>,
    /// The function of the idle-instances experiment (its idle instances and its measured starts).
    #[arg(long, default_value = "helloworld")]
    pub idle_function: String,
    /// Open snapshots with shared memory as the node opens its local full images (the
    /// pages instances of one opened snapshot touch live once in a tmpfs file, mapped
    /// copy-on-write: engine/src/sharedmem.rs). It changes the burst-* modes, whose
    /// restores share one opened snapshot; other modes open one per restore.
    #[arg(long)]
    pub share_memory: bool,
    /// Keep the scratch directory (snapshots, copies) instead of deleting it.
    #[arg(long)]
    pub keep_work: bool,
    /// Before each restore also drop the kernel's dentry and inode caches (machine-wide:
    /// `echo 2 > /proc/sys/vm/drop_caches`), so what a restore looks up in the function's
    /// bundle (the check that it did not change) starts cold, as after a long idle.
    #[arg(long)]
    pub evict_dentries: bool,
}

/// The effective configuration after --quick and defaults.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    pub functions: Vec<String>,
    pub runs: usize,
    pub concurrency: Vec<u32>,
    pub concurrency_functions: Vec<String>,
    pub concurrency_modes: Vec<String>,
    pub memory_mb: u64,
    pub quick: bool,
    pub disk_file_mib: usize,
    pub evict_dentries: bool,
    /// Idle counts of the idle-instances experiment (empty: skipped) and its function.
    pub idle: Vec<u32>,
    pub idle_function: String,
    pub share_memory: bool,
}

impl BenchArgs {
    pub fn config(&self) -> Config {
        let functions = self.functions.clone().unwrap_or_else(|| {
            let d = if self.quick { "helloworld,pyaes" } else { DEFAULT_FUNCTIONS };
            d.split(',').map(String::from).collect()
        });
        Config {
            functions: functions.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
            runs: self.runs.unwrap_or(if self.quick { 3 } else { 10 }).max(1),
            concurrency: self
                .concurrency
                .clone()
                .unwrap_or_else(|| if self.quick { vec![1, 2, 4] } else { vec![1, 2, 4, 8, 16] })
                .into_iter()
                .filter(|n| *n > 0)
                .collect(),
            concurrency_functions: self
                .concurrency_functions
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            concurrency_modes: self
                .concurrency_modes
                .clone()
                .unwrap_or_else(|| CONCURRENCY_MODES.iter().map(|m| m.to_string()).collect()),
            memory_mb: self.memory,
            quick: self.quick,
            disk_file_mib: self.disk_file_mib.max(256),
            evict_dentries: self.evict_dentries,
            idle: self.idle.clone().unwrap_or_default(),
            idle_function: self.idle_function.trim().to_string(),
            share_memory: self.share_memory,
        }
    }
}

/// How each sample is called (handler, payload); scripts/build-samples.sh reads it too.
const MANIFEST: &str = include_str!("../../../samples/manifest.json");

/// Handler and payload (JSON text) of every sample named in the manifest.
fn manifest() -> &'static (serde_json::Value, std::collections::HashMap<String, String>) {
    static M: std::sync::OnceLock<(serde_json::Value, std::collections::HashMap<String, String>)> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let m: serde_json::Value = serde_json::from_str(MANIFEST).expect("samples/manifest.json is valid JSON");
        let payloads = m["functions"]
            .as_object()
            .expect("samples/manifest.json has a functions object")
            .iter()
            .filter_map(|(name, f)| Some((name.clone(), f.get("payload")?.to_string())))
            .collect();
        (m, payloads)
    })
}

/// Runtime, sample directory (relative to the python samples directory) and
/// handler of a function name: `name` is a Python sample, `nodejs/name` and
/// `java/name` the Node.js and Java samples (samples/manifest.json).
pub fn function_spec(function: &str) -> (&'static str, String, &'static str) {
    let (m, _) = manifest();
    let (runtime, kind, dir) = match function.split_once('/') {
        Some(("nodejs", n)) => ("nodejs20.x", "nodejs", format!("../nodejs/{n}")),
        Some(("java", n)) => ("java17", "java", format!("../java/{n}")),
        _ => ("python3", "python", function.to_string()),
    };
    let handler = m["functions"][function]["handler"].as_str().or_else(|| m["default_handler"][kind].as_str());
    (runtime, dir, handler.expect("samples/manifest.json has a default handler per runtime"))
}

/// The event each sample function is invoked with (samples/manifest.json; `{}` if none).
pub fn payload_for(function: &str) -> &'static str {
    manifest().1.get(function).map(String::as_str).unwrap_or("{}")
}

/// Run the benchmark; `data_dir` is Thaw's data directory (runtime shims).
pub fn run(args: BenchArgs, data_dir: &Path) -> Result<()> {
    let cfg = args.config();
    let results = runner::run(&cfg, &args, data_dir)?;
    report::finish(&cfg, &args.out, results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_come_from_the_manifest() {
        assert_eq!(function_spec("helloworld"), ("python3", "helloworld".to_string(), "handler.handler"));
        assert_eq!(function_spec("nodejs/jsontransform"), ("nodejs20.x", "../nodejs/jsontransform".to_string(), "index.handler"));
        assert_eq!(function_spec("java/matmul"), ("java17", "../java/matmul".to_string(), "example.MatMul::multiply"));
        assert_eq!(payload_for("java/matmul"), r#"{"n":64}"#);
        assert_eq!(payload_for("helloworld"), r#"{"name":"smoke"}"#);
        assert_eq!(payload_for("counter"), "{}");
        let lr: serde_json::Value = serde_json::from_str(payload_for("lrserving")).unwrap();
        assert_eq!(lr["x"].as_array().unwrap().len(), 20);
    }

    #[test]
    fn quick_defaults_and_overrides() {
        let c = BenchArgs { quick: true, ..Default::default() }.config();
        assert_eq!(c.functions, ["helloworld", "pyaes"]);
        assert_eq!(c.runs, 3);
        assert_eq!(c.concurrency, [1, 2, 4]);
        let c = BenchArgs { quick: true, runs: Some(2), functions: Some(vec!["helloworld".into()]), concurrency: Some(vec![1, 2]), ..Default::default() }
            .config();
        assert_eq!((c.functions.len(), c.runs, c.concurrency.len()), (1, 2, 2));
        let c = BenchArgs::default().config();
        assert_eq!(c.runs, 10);
        assert_eq!(c.functions.len(), 7);
        assert_eq!(c.concurrency, [1, 2, 4, 8, 16]);
    }
}
