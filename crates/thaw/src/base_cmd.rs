//! `thaw base build | list | rm`: the runtime bases layered snapshots sit on
//! (the engine's `layers` module does the work; this is arguments and output).

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
    }
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
