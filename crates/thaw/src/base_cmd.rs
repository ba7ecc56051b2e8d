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
    /// init runs then, as in a cold boot) or, for a function given by its snapshot (a
    /// diff on the base), the diff's pages and state are installed (its init does not
    /// run again). Prints one JSON line per call: the response and the time of each
    /// step (reset_ms; how, code_ms, load_ms, invoke_ms and first_response_ms, their
    /// sum, for a repurposed call; the first line also base_restore_ms, base_paging and
    /// base_phases: the base's restore). Every function must fit the base: same runtime
    /// and memory class, no layers. Writes are tracked (for the resets and installs)
    /// unless the calls are all to one function given by code and handler.
    Repurpose {
        /// Language runtime (python3).
        #[arg(long, default_value = "python3")]
        runtime: String,
        /// Memory limit in MiB (the base's memory class).
        #[arg(long, default_value_t = 512)]
        memory: u64,
        /// A JSON array of calls, each {"code": DIR, "handler": "module.function",
        /// "payload": EVENT}, or {"snapshot": DIR, "payload": EVENT} for a function
        /// snapshotted as a diff on the base: its pages and state are installed into
        /// the instance and its init does not run again (loaded from its code instead
        /// when the diff holds state an install does not give: "install_refused" says
        /// why); "name" optional (the function's name, default "function").
        #[arg(long)]
        calls: PathBuf,
        /// Before the first invocation of each function installed from its snapshot,
        /// write DIR/state-CALL.json: the instance's layout, page contents, registers,
        /// descriptors and signal state as named facts, to compare with those of a
        /// fresh restore of the snapshot (`thaw snapshot restore --dump-state`).
        #[arg(long, value_name = "DIR")]
        dump_state: Option<PathBuf>,
        /// Restore the base into a sandbox prepared beforehand (as `thaw snapshot
        /// restore --prepared-sandbox`): base_restore_ms then leaves its preparation out
        /// (reported as base_sandbox_prepare_ms).
        #[arg(long)]
        prepared_sandbox: bool,
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
        BaseCmd::Repurpose { runtime, memory, calls, dump_state, prepared_sandbox } => repurpose(&runtime, memory, &calls, dump_state.as_deref(), prepared_sandbox, data_dir)?,
    }
    Ok(())
}

/// One call of `thaw base repurpose --calls`: a function given by its code and
/// handler (loaded into the base instance), or by its snapshot, a diff on the base
/// (installed into it; loaded from the code and handler the snapshot records when the
/// diff cannot be installed).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    code: Option<PathBuf>,
    handler: Option<String>,
    snapshot: Option<PathBuf>,
    #[serde(default)]
    payload: serde_json::Value,
    name: Option<String>,
}

fn repurpose(runtime: &str, memory: u64, calls: &Path, dump_state: Option<&Path>, prepared_sandbox: bool, data_dir: &Path) -> Result<()> {
    use anyhow::Context;
    use thaw_engine::instance::{Instance, InstanceError, LoadedSnapshot};
    use thaw_engine::repurpose::InstallError;
    let text = std::fs::read_to_string(calls).with_context(|| format!("reading {}", calls.display()))?;
    let calls: Vec<Call> =
        serde_json::from_str(&text).with_context(|| format!("{}: expected a JSON array of {{code, handler, payload}} or {{snapshot, payload}}", calls.display()))?;
    let runtime = Runtime::parse(runtime)?;
    layers::supported(runtime)?;
    let runtime_dir = thaw_runtime::runtimes::install_shims(data_dir)?;
    let bases = bases_dir(data_dir);
    let mut diffs: std::collections::HashMap<PathBuf, LoadedSnapshot> = Default::default();
    for c in &calls {
        match (&c.snapshot, &c.code, &c.handler) {
            (Some(dir), None, None) if !diffs.contains_key(dir) => {
                let snap = LoadedSnapshot::open(dir).with_context(|| format!("opening snapshot {}", dir.display()))?;
                diffs.insert(dir.clone(), snap);
            }
            (Some(_), None, None) | (None, Some(_), Some(_)) => {}
            _ => anyhow::bail!("each call names its function by \"snapshot\", or by \"code\" and \"handler\""),
        }
    }
    let cfg_of = |c: &Call| -> Result<FunctionConfig> {
        let (code, handler) = match (&c.snapshot, &c.code, &c.handler) {
            (Some(dir), _, _) => (diffs[dir].image.sandbox.code_dir.clone(), diffs[dir].image.sandbox.handler.clone()),
            (_, Some(code), Some(handler)) => (code.clone(), handler.clone()),
            _ => unreachable!("checked above"),
        };
        let code = std::fs::canonicalize(&code).with_context(|| format!("function code directory {}", code.display()))?;
        let mut cfg = FunctionConfig::new(runtime, &handler, code, runtime_dir.clone());
        cfg.memory_mb = memory;
        cfg.function_name = c.name.clone().unwrap_or_else(|| "function".into());
        Ok(cfg)
    };
    let mut base_cfg = FunctionConfig::new(runtime, "", layers::placeholder(&bases)?, runtime_dir.clone());
    base_cfg.memory_mb = memory;
    let meta = layered::find_or_build(&base_cfg, &bases, |_| eprintln!("building the {} base ({memory} MB)...", runtime.name()))?;
    let mut base = LoadedSnapshot::open(&meta.dir)?;
    // Writes are tracked for a reset (another function follows) or an install (it
    // rewrites what the instance wrote); one function loaded once needs neither, and
    // tracking would slow its load (bench/layers.py's base-import: SnapFaaS's "base only").
    let one_load = calls.iter().all(|c| c.snapshot.is_none() && (&c.code, &c.handler) == (&calls[0].code, &calls[0].handler));
    base.set_track_writes(!one_load);
    let prepare_ms = if prepared_sandbox { crate::prepare_one_sandbox(&mut base)? } else { 0.0 };
    let t0 = std::time::Instant::now();
    let mut inst = Instance::restore_as(&base, thaw_engine::pageserver::Paging::Auto, base_cfg.record())?;
    let base_restore_ms = t0.elapsed().as_secs_f64() * 1e3;
    eprintln!("base {} restored in {base_restore_ms:.1} ms", meta.id);
    let mut serving: Option<(PathBuf, String, Option<PathBuf>)> = None;
    for (i, c) in calls.iter().enumerate() {
        let cfg = cfg_of(c)?;
        let mut line = json!({"call": i, "code": cfg.code_dir, "handler": cfg.handler});
        if i == 0 {
            line["base_restore_ms"] = json!(base_restore_ms);
            line["base_paging"] = json!(inst.paging_mode().map(|m| m.name()));
            line["base_phases"] = json!(inst.start.phases);
            line["tracks_writes"] = json!(!one_load);
            line["base_prepared_sandbox"] = json!(inst.start.prepared_sandbox);
            line["base_sandbox_prepare_ms"] = json!(prepare_ms);
        }
        let function = (cfg.code_dir.clone(), cfg.handler.clone(), c.snapshot.clone());
        if serving.as_ref() != Some(&function) {
            if serving.is_some() {
                let r = inst.reset_to_base(&base).context("resetting the instance to its base")?;
                line["reset_ms"] = json!(r.reset_ms);
            }
            serving = Some(function);
            let installed = match c.snapshot.as_ref().map(|dir| (dir, &diffs[dir])) {
                Some((dir, diff)) => match inst.install_diff(diff, &base) {
                    Ok(l) => {
                        inst.set_function_name(&cfg.function_name);
                        line["snapshot"] = json!(dir);
                        line["phases"] = json!(inst.start.phases);
                        if let Some(d) = dump_state {
                            crate::dump_state_of(&mut inst, diff, d, i)?;
                        }
                        Some(l)
                    }
                    Err(InstanceError::Install(InstallError::Refused(why))) => {
                        line["install_refused"] = json!(why);
                        None
                    }
                    Err(e) => return Err(anyhow::Error::from(e).context(format!("installing {} into the base instance", dir.display()))),
                },
                None => None,
            };
            let l = match installed {
                Some(l) => l,
                None => inst.load_into(&cfg).with_context(|| format!("loading {} into the base instance", cfg.code_dir.display()))?,
            };
            line["how"] = json!(inst.start.kind);
            line["code_ms"] = json!(l.code_ms);
            line["load_ms"] = json!(l.load_ms);
        }
        let t = std::time::Instant::now();
        let faults = |inst: &Instance| inst.page_stats().page_faults + inst.page_stats().zero_faults;
        let before = faults(&inst);
        let out = inst.invoke(&format!("repurpose-{i}"), &c.payload.to_string(), std::time::Duration::from_secs(30))?;
        let invoke_ms = t.elapsed().as_secs_f64() * 1e3;
        line["invoke_ms"] = json!(invoke_ms);
        line["invoke_page_faults"] = json!(faults(&inst) - before);
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
