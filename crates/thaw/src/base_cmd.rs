//! `thaw base build | list | rm | repurpose`: the runtime bases layered snapshots sit
//! on (the engine's `layers` module does the work; this is arguments and output).

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Subcommand;
use serde_json::json;
use thaw_engine::instance::FunctionConfig;
use thaw_engine::layered;
use thaw_engine::layers::{self, BaseMeta};
use thaw_runtime::Runtime;

#[derive(Subcommand)]
pub enum BaseCmd {
    /// Build the base of a runtime for a sandbox shape (the runtime started with an empty
    /// /var/task, captured before any function code loads), unless it exists. Prints its
    /// description as JSON. `thaw snapshot create` then captures only what a function's
    /// init adds on top of it.
    Build {
        /// Language runtime (python3, nodejs20.x or java17).
        #[arg(long, default_value = "python3")]
        runtime: String,
        /// Memory limit in MiB of the sandboxes it serves (a base serves one memory class).
        #[arg(long, default_value_t = 512)]
        memory: u64,
    },
    /// List the bases on this machine as JSON lines (id, runtime, shape, size, diffs using it).
    List,
    /// Remove a base (by id or an id prefix of at least 8 digits); refused while a diff
    /// snapshot still names it.
    Rm { id: String },
    /// Serve a sequence of calls to different functions with ONE instance of the
    /// runtime's base, repurposed between them (issue #30): the base is restored once
    /// (with write tracking); for each call to another function than the previous
    /// call's, the instance is reset to the base (nothing of the previous function
    /// stays), the function's code replaces /var/task, and the runtime loads it (its
    /// init runs then, as in a cold boot). Prints one JSON line per call: the response
    /// and the time of each step (reset_ms; code_ms, load_ms, invoke_ms and
    /// first_response_ms, their sum, for a repurposed call). Every function must fit
    /// the base: same runtime and memory class, no layers.
    Repurpose {
        /// Language runtime (python3).
        #[arg(long, default_value = "python3")]
        runtime: String,
        /// Memory limit in MiB (the base's memory class).
        #[arg(long, default_value_t = 512)]
        memory: u64,
        /// A JSON array of calls, each {"code": DIR, "handler": "module.function",
        /// "payload": EVENT}; "name" optional (the function's name, default "function").
        #[arg(long)]
        calls: PathBuf,
    },
}

/// Where the bases of a data directory live.
pub fn bases_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("bases")
}

fn describe(m: &BaseMeta) -> serde_json::Value {
    json!({
        "id": m.id, "runtime": m.key.runtime, "shims": m.key.shims, "memory_mb": m.key.memory_mb,
        "cpu_millis": m.key.cpu_millis, "format": m.key.format, "bytes": m.bytes, "stored_pages": m.stored_pages,
        "created_unix_ms": m.created_unix_ms, "dir": m.dir, "diffs": layers::users(m).len(),
    })
}

pub fn run(cmd: BaseCmd, data_dir: &Path) -> Result<()> {
    let bases = bases_dir(data_dir);
    match cmd {
        BaseCmd::Build { runtime, memory } => {
            let runtime = Runtime::parse(&runtime)?;
            layers::supported(runtime)?;
            let runtime_dir = thaw_runtime::runtimes::install_shims(data_dir)?;
            let mut cfg = FunctionConfig::new(runtime, "", bases.clone(), runtime_dir);
            cfg.memory_mb = memory;
            let meta = layered::find_or_build(&cfg, &bases, |_| eprintln!("building the {} base ({memory} MB)...", runtime.name()))?;
            println!("{}", describe(&meta));
        }
        BaseCmd::List => {
            for m in layers::list(&bases)? {
                println!("{}", describe(&m));
            }
        }
        BaseCmd::Rm { id } => {
            layers::remove(&bases, &id)?;
            eprintln!("removed base {id}");
        }
        BaseCmd::Repurpose { runtime, memory, calls } => repurpose(&runtime, memory, &calls, data_dir)?,
    }
    Ok(())
}

/// One call of `thaw base repurpose --calls`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    code: PathBuf,
    handler: String,
    #[serde(default)]
    payload: serde_json::Value,
    name: Option<String>,
}

fn repurpose(runtime: &str, memory: u64, calls: &Path, data_dir: &Path) -> Result<()> {
    use anyhow::Context;
    use thaw_engine::instance::{Instance, LoadedSnapshot};
    let text = std::fs::read_to_string(calls).with_context(|| format!("reading {}", calls.display()))?;
    let calls: Vec<Call> = serde_json::from_str(&text).with_context(|| format!("{}: expected a JSON array of {{code, handler, payload}}", calls.display()))?;
    let runtime = Runtime::parse(runtime)?;
    layers::supported(runtime)?;
    let runtime_dir = thaw_runtime::runtimes::install_shims(data_dir)?;
    let bases = bases_dir(data_dir);
    let cfg_of = |c: &Call| -> Result<FunctionConfig> {
        let code = std::fs::canonicalize(&c.code).with_context(|| format!("function code directory {}", c.code.display()))?;
        let mut cfg = FunctionConfig::new(runtime, &c.handler, code, runtime_dir.clone());
        cfg.memory_mb = memory;
        cfg.function_name = c.name.clone().unwrap_or_else(|| "function".into());
        Ok(cfg)
    };
    let mut base_cfg = FunctionConfig::new(runtime, "", layers::placeholder(&bases)?, runtime_dir.clone());
    base_cfg.memory_mb = memory;
    let meta = layered::find_or_build(&base_cfg, &bases, |_| eprintln!("building the {} base ({memory} MB)...", runtime.name()))?;
    let base = LoadedSnapshot::open(&meta.dir)?;
    base.set_track_writes(true);
    let t0 = std::time::Instant::now();
    let mut inst = Instance::restore_as(&base, thaw_engine::pageserver::Paging::Auto, base_cfg.record())?;
    eprintln!("base {} restored in {:.1} ms", meta.id, t0.elapsed().as_secs_f64() * 1e3);
    let mut serving: Option<(PathBuf, String)> = None;
    for (i, c) in calls.iter().enumerate() {
        let cfg = cfg_of(c)?;
        let mut line = json!({"call": i, "code": cfg.code_dir, "handler": cfg.handler});
        if serving.as_ref() != Some(&(cfg.code_dir.clone(), cfg.handler.clone())) {
            if serving.is_some() {
                let r = inst.reset_to_base(&base).context("resetting the instance to its base")?;
                line["reset_ms"] = json!(r.reset_ms);
            }
            serving = Some((cfg.code_dir.clone(), cfg.handler.clone()));
            let l = inst.load_into(&cfg).with_context(|| format!("loading {} into the base instance", cfg.code_dir.display()))?;
            line["code_ms"] = json!(l.code_ms);
            line["load_ms"] = json!(l.load_ms);
        }
        let t = std::time::Instant::now();
        let out = inst.invoke(&format!("repurpose-{i}"), &c.payload.to_string(), std::time::Duration::from_secs(30))?;
        let invoke_ms = t.elapsed().as_secs_f64() * 1e3;
        line["invoke_ms"] = json!(invoke_ms);
        if let Some(code_ms) = line.get("code_ms").and_then(|v| v.as_f64()) {
            line["first_response_ms"] = json!(code_ms + line["load_ms"].as_f64().unwrap_or(0.0) + invoke_ms);
        }
        line["response"] = match out {
            thaw_runtime::InvokeOutcome::Ok(s) => serde_json::from_str(&s).unwrap_or(json!(s)),
            thaw_runtime::InvokeOutcome::Error(e) => json!({"error": e}),
        };
        println!("{line}");
    }
    inst.kill();
    Ok(())
}

/// The base a snapshot of `cfg` goes on by default: the one built for its runtime and
/// sandbox shape, built now if there is none (once per runtime and memory class). None
/// for a runtime that cannot be layered, or when the base cannot be built: then the
/// snapshot is a full image, and a warning says why.
pub fn default_base(cfg: &FunctionConfig, data_dir: &Path) -> Option<BaseMeta> {
    if let Err(e) = layered::usable(cfg) {
        tracing::info!("{e}");
        return None;
    }
    let building = |_: &layers::BaseKey| {
        eprintln!(
            "building the {} base ({} MB), once per runtime and memory class: snapshots are then small diffs on it (--no-base for a full image)...",
            cfg.runtime.name(),
            cfg.memory_mb
        )
    };
    match layered::find_or_build(cfg, &bases_dir(data_dir), building) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("warning: no {} base: {:#}; making a full image", cfg.runtime.name(), anyhow::Error::from(e));
            None
        }
    }
}
