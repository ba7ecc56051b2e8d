//! `thaw`: the command-line front end of the Thaw snapshot engine.
//!
//! Thin by design: argument parsing, output formatting and exit codes live
//! here; everything else is in the `thaw-engine`, `thaw-sandbox` and
//! `thaw-runtime` crates.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use thaw_engine::instance::{FunctionConfig, Instance, InstanceError, LoadedSnapshot};
use thaw_engine::pageserver::Paging;
use thaw_runtime::{InvokeOutcome, Runtime};

mod base_cmd;
mod memory_cmd;
mod store_cmd;

/// Lambda's limit for a synchronous request payload.
const MAX_PAYLOAD: usize = 6 * 1024 * 1024;

#[derive(Parser)]
#[command(name = "thaw", version, about = "Thaw: serverless functions frozen to disk as memory snapshots and thawed on demand.",
    long_about = "Thaw runs functions in process sandboxes, captures a ready-to-invoke instance (runtime started, \
function module imported) to an on-disk image, and starts later instances by restoring that image with its memory \
served lazily by a userfaultfd page server.\n\nMust run as root. Exit codes: 0 success; 1 the invocation failed: \
the function returned an error (printed as JSON on stdout), crashed or timed out (message on stderr); 2 anything \
else failed, including the function's init (message on stderr).")]
struct Cli {
    /// Directory for Thaw's own files (runtime shims). Env: THAW_DATA_DIR.
    #[arg(long, global = true, env = "THAW_DATA_DIR", default_value = "/var/lib/thaw")]
    data_dir: PathBuf,
    /// Log filter, e.g. "info" or "thaw_engine=debug". Env: THAW_LOG.
    #[arg(long, global = true, env = "THAW_LOG", default_value = "warn")]
    log: String,
    /// Node key file (64 hex digits, mode 0600) that seals snapshots at rest (AES-256-GCM)
    /// and opens sealed ones. Default: THAW_NODE_KEY if set, else DATA_DIR/node.key if it
    /// exists (`thaw serve` creates it). Without a key, snapshots are written in clear.
    #[arg(long, global = true, env = "THAW_KEY_FILE", value_name = "PATH")]
    key_file: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum BundleCmd {
    /// Put a function's zip into the store (bundles/<sha256>.zip; once) and print the
    /// `code:` block a ThawFunction names it with. The agents (`thaw serve --cluster
    /// --snapshot-store` on the same store) fetch it from there and check its SHA-256.
    Push(store_cmd::BundlePushArgs),
}

#[derive(Subcommand)]
enum Cmd {
    /// Cold boot: sandbox + runtime start + function init, then invoke once.
    Boot {
        #[command(flatten)]
        func: FunctionArgs,
        #[command(flatten)]
        inv: InvokeArgs,
    },
    /// Create, restore and inspect snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Build, list and remove runtime bases (layered snapshots: a base per runtime, a diff per function).
    #[command(subcommand)]
    Base(base_cmd::BaseCmd),
    /// Function code bundles in a snapshot store, for ThawFunctions (the cluster's registry).
    #[command(subcommand)]
    Bundle(BundleCmd),
    /// Run the node: a Lambda-compatible HTTP API serving functions from snapshots.
    Serve(thaw_node::cli::ServeArgs),
    /// Show a running node's functions, instances and snapshot cache.
    Status(thaw_node::cli::StatusArgs),
    /// Cold-start experiments: boot vs lazy/eager/REAP restores vs warm; table, JSON and SVG charts.
    Bench(thaw_bench::BenchArgs),
    /// Simulate placement over 10..1,000 nodes: hit ratio, store bytes, p50/p99, load balance per policy.
    Sim(thaw_cluster::cli::SimArgs),
    /// Cluster gateway: Lambda API + SigV4; Invoke forwarded to the agent placement picks, functions in the registry (ThawFunctions).
    Gateway(thaw_cluster::gateway::GatewayArgs),
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Boot the function until it is ready to invoke, then capture it into OUT. For a
    /// runtime that can be layered (Python, Node.js, Java) the snapshot is a diff on the
    /// runtime's base for its memory class (DATA_DIR/bases; built first if missing, once,
    /// as `thaw base build` does): the base is restored, the function's init runs in it,
    /// and only the pages that differ from the base are stored. If the base cannot be
    /// built or used for a reason other than the function's own init, a full image is
    /// made instead, with a warning saying why. --no-base always makes a full image.
    Create {
        #[command(flatten)]
        func: FunctionArgs,
        /// Snapshot directory to create (must not exist).
        #[arg(long)]
        out: PathBuf,
        /// Make a full image: no base is built or used.
        #[arg(long)]
        no_base: bool,
    },
    /// Restore an instance from SNAPDIR and invoke it.
    ///
    /// The function's bundle must be the one captured: it is checked beside the restore
    /// (a walk of its files' metadata), and the restored process is not told it was
    /// restored, nor invoked, before the check passed; a changed bundle fails with exit
    /// code 2. THAW_CODE_CHECK=before checks before the restore starts; =unchecked skips
    /// the check (only to measure what it costs).
    ///
    /// SNAPDIR may be a stored snapshot, s3://BUCKET/PREFIX/ID. One missing from the node
    /// cache (DATA_DIR/snapshot-cache) starts after its manifest and head (state, working
    /// set, pages written before resume) arrived; the pages it faults on are fetched as it
    /// runs, the rest afterwards, into the cache. THAW_STORE_FETCH=whole fetches all of it
    /// first. --stats reports store.requests_before_first_response and
    /// store.bytes_fetched_before_first_response.
    Restore {
        /// Snapshot directory made by `thaw snapshot create`, or a stored snapshot
        /// s3://BUCKET/PREFIX/ID (a cache miss starts once the head is fetched; store from AWS_* env).
        snapdir: PathBuf,
        /// Byte bound of the snapshot cache (DATA_DIR/snapshot-cache) for s3:// snapshots.
        #[arg(long, default_value_t = 10 << 30)]
        cache_max_bytes: u64,
        #[command(flatten)]
        inv: InvokeArgs,
        /// How memory reaches the restored process. lazy: each page is read from the image on
        /// first touch (baseline; see --readaround-kb). eager: every page is installed before resuming. record: lazy,
        /// and the pages the first invocation touches become the snapshot's working set (REAP).
        /// prefetch: the working set is read with one O_DIRECT read and installed before
        /// resuming, the rest is lazy. ws-cached: prefetch through the page cache. parallel:
        /// several readers fetch the traced pages from the image. auto: prefetch if the
        /// snapshot has a working set, else record.
        #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<Paging>())]
        paging: Paging,
        /// Share of the touched pages a prefetch restore may need beyond the working set
        /// before the working set counts as unrepresentative and is re-recorded.
        #[arg(long, default_value_t = 0.25, value_parser = thaw_node::cli::parse_share)]
        reprofile_threshold: f64,
        /// Keep the working set exactly as recorded (REAP): by default a prefetch restore adds
        /// the pages it had to fault in (below the threshold) to the working set.
        #[arg(long)]
        no_ws_merge: bool,
        /// Read-around window of a lazy fault that misses, in KiB: the aligned window of the
        /// image holding the page is read with one request (the kernel's read-around for a
        /// mapped file, 128 KiB by default); only the faulting page is installed. 4 = one page
        /// per fault.
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(4..=65536))]
        readaround_kb: u64,
        /// CPU the page server may spend on this instance's page faults, as a share of its
        /// CPU limit averaged over a second; 0 = unbounded. Faults beyond it wait.
        #[arg(long, default_value_t = thaw_engine::pageserver::DEFAULT_FAULT_CPU_SHARE, value_parser = thaw_node::cli::parse_share)]
        fault_cpu_share: f64,
        /// Number of invocations to run on the restored instance (the same payload each time).
        #[arg(long, default_value_t = 1)]
        invocations: u32,
        /// Reset the instance in place between invocations (each sees the state it was
        /// restored into, nothing of the previous one). A reset that cannot prove the
        /// state restored discards the instance and restores a fresh one. `--stats`
        /// reports reset_ms and the pages written back per invocation.
        #[arg(long)]
        reset: bool,
        /// After the last invocation (and, with --reset, a reset after it), count the
        /// occurrences of this string in the idle instance's memory, read from outside,
        /// and report them in `--stats` as memory_matches (an isolation check).
        #[arg(long, value_name = "STRING")]
        search_memory: Option<String>,
        /// Before each invocation (right after the restore, then after each reset or
        /// the invocation before), write the idle instance's state into
        /// DIR/state-N.json: its layout, a hash of every page, every thread's
        /// registers, its descriptors and signal state, as named facts. Two such files
        /// compare key by key (a differential check: a reset instance against a fresh
        /// restore).
        #[arg(long, value_name = "DIR")]
        dump_state: Option<PathBuf>,
        /// After the invocations, reset the idle instance this many times in a row
        /// (nothing runs in between: no-op resets) and report each in `--stats`
        /// (noop_resets); the instance then answers once more to show it still works.
        #[arg(long, default_value_t = 0, requires = "reset")]
        noop_resets: u32,
        /// Map the pages of a layered snapshot from a shared memory file, as a process
        /// restoring many instances does (see `thaw snapshot memory`); one restore gains
        /// nothing from it but pays for filling the file.
        #[arg(long)]
        share_memory: bool,
        /// Between invocations, give back the pages the instance copied from the shared
        /// memory and holds unchanged, as `thaw serve` does with idle instances (see
        /// `thaw snapshot memory --give-back`). `--stats` reports give_backs; with
        /// --dump-state the state is also written just before each give-back
        /// (state-N-before-give-back.json: a give-back changes nothing it records).
        #[arg(long, requires = "share_memory", conflicts_with = "reset")]
        give_back: bool,
        /// Restore in a sandbox prepared beforehand (as `thaw serve --sandbox-pool` does):
        /// the sandbox is built before the restore starts and not counted in its time;
        /// the restore attaches the function's code to it. `--stats` reports
        /// prepared_sandbox and sandbox_prepare_ms.
        #[arg(long)]
        prepared_sandbox: bool,
        /// Restore over the function bundle at this directory instead of where the
        /// snapshot was captured (the same bundle unpacked elsewhere, e.g. on another
        /// machine, with its files' times kept: `cp -a`, `rsync -a`, or a zip unpacked
        /// by `thaw serve`). Refused unless its fingerprint (names, sizes, times, modes)
        /// is the captured one.
        #[arg(long, value_name = "DIR")]
        code: Option<PathBuf>,
    },
    /// Print a summary of a snapshot as JSON; of a stored one (s3://BUCKET/PREFIX/ID),
    /// its manifest, verified against its id, as JSON (whatever format it is stored in).
    Inspect {
        /// A snapshot directory, or s3://BUCKET/PREFIX/ID.
        snapdir: PathBuf,
        /// Also list every memory area and stored page run.
        #[arg(long)]
        verbose: bool,
        #[command(flatten)]
        store: store_cmd::StoreArgs,
    },
    /// Drop a snapshot's files from the page cache (for cold-start measurements).
    Evict { snapdir: PathBuf },
    /// Restore N instances of each SNAPDIR in one process, invoke each once, keep them
    /// all alive and print what they cost the host as JSON: per-instance RSS, PSS, USS
    /// and anonymous memory (smaps_rollup), cgroup charge, the shared memory files'
    /// bytes (counted once), and the drop in MemAvailable.
    Memory(memory_cmd::MemoryArgs),
    /// Publish a snapshot to an S3-compatible store (s3://BUCKET/PREFIX): content-addressed
    /// chunks the store lacks, then the manifest. Prints a JSON report, then the stored
    /// snapshot's s3://BUCKET/PREFIX/ID as the last line.
    Push(store_cmd::PushArgs),
    /// Fetch a stored snapshot (s3://BUCKET/PREFIX/ID) into a new directory, verified.
    Pull(store_cmd::PullArgs),
    /// Delete a stored snapshot (its manifest; `gc` then collects the chunks only it used).
    Rm(store_cmd::RmArgs),
    /// Delete chunks of a store that no snapshot references (two runs a grace period apart).
    Gc(store_cmd::GcArgs),
}

#[derive(Args)]
struct FunctionArgs {
    /// Directory with the function's code (becomes /var/task, read-only).
    #[arg(long)]
    code: PathBuf,
    /// Handler as module.function (Lambda convention).
    #[arg(long)]
    handler: String,
    /// Language runtime.
    #[arg(long, default_value = "python3")]
    runtime: String,
    /// Memory limit in MiB (cgroup).
    #[arg(long, default_value_t = 512)]
    memory: u64,
    /// Function name reported to the handler's context.
    #[arg(long, default_value = "function")]
    name: String,
    /// Environment variable for the function, KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_kv)]
    env: Vec<(String, String)>,
}

#[derive(Args)]
struct InvokeArgs {
    /// The event, as JSON text; "@FILE" reads it from FILE.
    #[arg(long, default_value = "{}")]
    payload: String,
    /// Invocation timeout in seconds (1 to 900, as Lambda allows).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=900))]
    timeout: u64,
    /// Write timings and paging figures as JSON to FILE.
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Do not copy the function's log to stderr.
    #[arg(long)]
    quiet: bool,
}


fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("expected KEY=VALUE, got '{s}'"))
}

/// `snapshot restore --code DIR`: the check that restores snapshot `snapdir` over the
/// bundle at `dir`, refused unless that bundle is the one the snapshot captured (a
/// snapshot with layers keeps its /opt where it was captured).
fn code_elsewhere(snapdir: &std::path::Path, dir: &std::path::Path) -> Result<thaw_engine::fingerprint::CodeCheck> {
    let image = thaw_engine::image::Snapshot::open(snapdir)?.image;
    let opt_dir = image.sandbox.opt_dir.clone();
    let fingerprint = thaw_engine::fingerprint::of_bundle(dir, opt_dir.as_deref()).with_context(|| format!("reading the function bundle {}", dir.display()))?;
    if fingerprint != image.sandbox.code_fingerprint {
        bail!(
            "the function bundle {} is not the one the snapshot captured ({}): its files' names, sizes, times or modes differ (copy it with its times: cp -a, rsync -a)",
            dir.display(),
            image.sandbox.code_dir.display()
        );
    }
    Ok(thaw_engine::fingerprint::CodeCheck::Known { code_dir: dir.to_path_buf(), opt_dir, fingerprint })
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("__sandbox-init") {
        thaw_sandbox::sandbox_init_main();
    }
    // Everything thaw writes (snapshots, the registry, keys, caches) is private to
    // root whatever the caller's umask; what a sandbox must read is given its mode
    // explicitly (runtime shims, unpacked bundles, the sandbox's own root).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a log file or journal gets plain text to grep.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("thaw: error: {e:#}");
            ExitCode::from(if function_failed(&e) { 1 } else { 2 })
        }
    }
}

/// `--prepared-sandbox`: a pool of one for `snap`, its sandbox made now, before the
/// restore measured after it takes it. Returns how long the preparation took, ms.
fn prepare_one_sandbox(snap: &mut LoadedSnapshot) -> Result<f64> {
    let t = Instant::now();
    snap.sandboxes = Some(std::sync::Arc::new(thaw_sandbox::SandboxPool::new(1).context("starting the sandbox pool thread")?));
    if snap.prepare_sandboxes(1, Duration::from_secs(30)) < 1 {
        bail!("the sandbox could not be prepared (see the log)");
    }
    Ok(ms(t.elapsed()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn function_config(cli_data: &std::path::Path, f: &FunctionArgs) -> Result<FunctionConfig> {
    let runtime = Runtime::parse(&f.runtime)?;
    runtime.check_handler(&f.handler)?;
    let code = std::fs::canonicalize(&f.code).with_context(|| format!("function code directory {}", f.code.display()))?;
    if !code.is_dir() {
        bail!("function code {} is not a directory", code.display());
    }
    std::fs::create_dir_all(cli_data).with_context(|| format!("creating data directory {}", cli_data.display()))?;
    let runtime_dir = thaw_runtime::runtimes::install_shims(cli_data)?;
    let mut cfg = FunctionConfig::new(runtime, &f.handler, code, runtime_dir);
    cfg.memory_mb = f.memory;
    cfg.function_name = f.name.clone();
    cfg.env = f.env.clone();
    Ok(cfg)
}

fn load_payload(p: &str) -> Result<String> {
    let text = match p.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).with_context(|| format!("reading payload file {file}"))?,
        None => p.to_string(),
    };
    if text.len() > MAX_PAYLOAD {
        bail!("payload is {} bytes; the limit is {MAX_PAYLOAD} bytes", text.len());
    }
    serde_json::from_str::<serde_json::Value>(&text).context("payload is not valid JSON")?;
    Ok(text)
}

/// Print an outcome; returns whether it was a success.
fn emit(out: &InvokeOutcome) -> bool {
    match out {
        InvokeOutcome::Ok(json) => {
            println!("{json}");
            true
        }
        InvokeOutcome::Error(e) => {
            println!("{}", serde_json::to_string(e).expect("serializable"));
            false
        }
    }
}

fn write_stats(path: &Option<PathBuf>, v: serde_json::Value) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_vec_pretty(&v)?).with_context(|| format!("writing stats to {}", p.display()))?;
    }
    Ok(())
}

/// Whether an error is a failed invocation (exit 1: the function crashed or timed
/// out) rather than anything else (exit 2). A page server that failed under the
/// instance is the platform's failure.
fn function_failed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<InstanceError>(),
            Some(InstanceError::Invoke { page_server: None, .. })
        )
    })
}

/// Install this process's node key (see `--key-file`); `thaw serve` creates the
/// default key file unless it runs with `--no-encryption`.
fn install_node_key(cli: &Cli) -> Result<()> {
    use thaw_engine::seal::{self, NodeKey};
    let serving = match &cli.cmd {
        Cmd::Serve(a) if a.no_encryption => return Ok(()),
        Cmd::Serve(_) => true,
        _ => false,
    };
    let key = if let Some(k) = NodeKey::from_env()? {
        Some(k)
    } else if let Some(path) = &cli.key_file {
        Some(NodeKey::load_or_create(path)?)
    } else {
        let path = cli.data_dir.join("node.key");
        if serving {
            std::fs::create_dir_all(&cli.data_dir).with_context(|| format!("creating data directory {}", cli.data_dir.display()))?;
            Some(NodeKey::load_or_create(&path)?)
        } else if path.exists() {
            Some(NodeKey::read_file(&path)?)
        } else {
            None
        }
    };
    if let Some(k) = &key {
        tracing::info!(key_id = k.id(), "snapshots are sealed with the node key");
    }
    seal::install(key.map(std::sync::Arc::new));
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    install_node_key(&cli)?;
    match cli.cmd {
        Cmd::Serve(args) => {
            let beside = if args.cluster {
                let Some(node) = args.node_name.clone().filter(|n| !n.is_empty()) else {
                    bail!("--cluster needs --node-name (or THAW_NODE_NAME): the Kubernetes Node this agent runs on");
                };
                Some(thaw_cluster::agent::beside(node, args.agent_endpoint.clone(), args.kubeconfig.clone()))
            } else {
                None
            };
            thaw_node::cli::serve_with(args, &cli.data_dir, beside)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status(args) => {
            thaw_node::cli::status(args, &cli.data_dir)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench(args) => {
            thaw_bench::run(args, &cli.data_dir)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Sim(args) => {
            let stamp = thaw_bench::report::utc_stamp(std::time::SystemTime::now()).0;
            print!("{}", thaw_cluster::cli::sim(&args, &stamp)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Gateway(args) => {
            thaw_cluster::gateway::run(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Boot { func, inv } => {
            let payload = load_payload(&inv.payload)?;
            let cfg = function_config(&cli.data_dir, &func)?;
            let t0 = Instant::now();
            let mut inst = Instance::boot(&cfg)?;
            let t1 = Instant::now();
            let out = inst.invoke("boot-1", &payload, Duration::from_secs(inv.timeout));
            let first = ms(t1.elapsed());
            let total = ms(t0.elapsed());
            print_logs(&mut inst, inv.quiet);
            let start = inst.start.clone();
            let mem_peak = inst.memory_peak_bytes();
            inst.kill();
            let out = out?;
            write_stats(
                &inv.stats,
                json!({"mode": "boot", "sandbox_ms": start.sandbox_ms, "init_ms": start.init_ms,
                       "first_invoke_ms": first, "total_ms": total, "memory_peak_bytes": mem_peak}),
            )?;
            Ok(if emit(&out) { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Cmd::Snapshot(SnapshotCmd::Create { func, out, no_base }) => {
            let cfg = function_config(&cli.data_dir, &func)?;
            if !cfg.runtime.snapshots() {
                bail!(
                    "{} functions cannot be snapshotted yet: the bootstrap runs as a second process beside the Runtime API bridge, connected over TCP, and the engine restores neither. `thaw run` and `thaw serve` run them by cold boot.",
                    cfg.runtime.name()
                );
            }
            let t0 = Instant::now();
            let base = if no_base { None } else { base_cmd::default_base(&cfg, &cli.data_dir) };
            if let Some(base) = base {
                match thaw_engine::layered::create_diff(&cfg, &base, &out) {
                    Ok(c) => {
                        let mut v = json!({"snapshot": c.dir, "base": base.id, "create_ms": ms(t0.elapsed()), "capture": c.stats});
                        if let Some(why) = &c.full_image {
                            eprintln!("note: a full image rather than a diff on base {}: {why}", base.id);
                            v["base"] = serde_json::Value::Null;
                            v["full_image_because"] = why.as_str().into();
                        }
                        println!("{}", serde_json::to_string(&v)?);
                        return Ok(ExitCode::SUCCESS);
                    }
                    Err(e @ (InstanceError::Init(_) | InstanceError::InitOutOfMemory { .. })) => return Err(e.into()),
                    Err(e) => eprintln!("warning: no diff on base {}: {:#}; making a full image", base.id, anyhow::Error::from(e)),
                }
            }
            let inst = Instance::boot_for_snapshot(&cfg)?;
            let boot_ms = ms(t0.elapsed());
            let (dir, stats) = inst.capture(&out)?;
            println!(
                "{}",
                serde_json::to_string(&json!({"snapshot": dir, "base": null, "boot_ms": boot_ms, "capture": stats}))?
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Snapshot(SnapshotCmd::Restore { snapdir, cache_max_bytes, inv, paging, invocations, reprofile_threshold, no_ws_merge, readaround_kb, fault_cpu_share, reset, search_memory, dump_state, noop_resets, share_memory, give_back, prepared_sandbox, code }) => {
            let payload = load_payload(&inv.payload)?;
            if invocations == 0 {
                bail!("--invocations must be at least 1");
            }
            let t0 = Instant::now();
            let cpu0 = process_cpu_ms();
            let mut fetched = store_cmd::resolve(&snapdir, &cli.data_dir, cache_max_bytes)?;
            let check = match code {
                Some(dir) => code_elsewhere(fetched.dir(), &dir)?,
                None => thaw_engine::fingerprint::CodeCheck::from_env().map_err(anyhow::Error::msg)?,
            };
            let mut snap = LoadedSnapshot::open_filled(fetched.dir(), share_memory, check, fetched.fill())?;
            snap.reprofile_threshold = reprofile_threshold;
            snap.set_track_writes(reset);
            snap.merge_misses = !no_ws_merge;
            snap.source.set_readaround(readaround_kb / 4);
            snap.source.set_fault_cpu_share(fault_cpu_share);
            let open_ms = ms(t0.elapsed());
            let mut prepare_ms = 0.0;
            if let (Some(pool), false) = (fetched.sandboxes(), prepared_sandbox) {
                // Prepared during the fetch: what is left of the wait counts as restore time.
                snap.sandboxes = Some(pool);
                snap.prepare_sandboxes(1, Duration::from_secs(5));
            } else if prepared_sandbox {
                prepare_ms = prepare_one_sandbox(&mut snap)?;
            }
            let mut inst = Instance::restore(&snap, paging)?;
            let restore_ms = ms(t0.elapsed()) - prepare_ms;
            let mut times = Vec::new();
            let mut first_stats = None;
            let mut cpu_first = 0.0;
            let mut ok = true;
            let mut resets = Vec::new();
            let mut give_backs = Vec::new();
            for i in 0..invocations {
                if give_back && i > 0 {
                    if let Some(d) = &dump_state {
                        dump_state_of(&mut inst, &snap, d, format!("{i}-before-give-back"))?;
                    }
                    give_backs.push(inst.give_back().context("giving back unchanged pages")?);
                }
                if reset && i > 0 {
                    let t = Instant::now();
                    match inst.reset(&snap) {
                        Ok(st) => {
                            let mut r = reset_json(&st);
                            r["invocation"] = json!(i + 1);
                            resets.push(r);
                        }
                        Err(e) => {
                            // Fail closed: discard, and serve the next invocation from a fresh restore.
                            let reason = format!("{:#}", anyhow::Error::from(e));
                            tracing::warn!(error = %reason, "reset refused; restoring a fresh instance");
                            inst.kill();
                            inst = Instance::restore(&snap, paging)?;
                            resets.push(json!({"invocation": i + 1, "reset_ms": null, "discarded": reason, "restore_ms": ms(t.elapsed())}));
                        }
                    }
                }
                if let Some(d) = &dump_state {
                    dump_state_of(&mut inst, &snap, d, i)?;
                }
                let t = Instant::now();
                let out = inst.invoke(&format!("restore-{}", i + 1), &payload, Duration::from_secs(inv.timeout));
                times.push(ms(t.elapsed()));
                if first_stats.is_none() {
                    first_stats = Some(inst.page_stats());
                    fetched.first_response();
                    cpu_first = process_cpu_ms() - cpu0;
                }
                let (live, success) = report(inst, out, inv.quiet)?;
                inst = live;
                ok &= success;
            }
            let mut noop = Vec::new();
            let mut matches = None;
            if reset && (noop_resets > 0 || search_memory.is_some()) {
                for _ in 0..noop_resets.max(1) {
                    match inst.reset(&snap) {
                        Ok(st) => {
                            let mut r = reset_json(&st);
                            r["after_restore_ms"] = json!(st.phases.iter().find(|p| p.0 == "after_restore").map(|p| p.1));
                            noop.push(r);
                        }
                        Err(e) => {
                            inst.kill();
                            return Err(anyhow::Error::from(e).context("a reset with nothing run since the previous one failed"));
                        }
                    }
                }
                if let Some(s) = &search_memory {
                    matches = Some(inst.count_in_memory(s.as_bytes())?);
                }
                if noop_resets > 0 {
                    let out = inst.invoke("restore-after-noop-resets", &payload, Duration::from_secs(inv.timeout));
                    let (live, success) = report(inst, out, inv.quiet)?;
                    inst = live;
                    ok &= success;
                }
            }
            if let (Some(s), false) = (&search_memory, reset) {
                matches = Some(inst.count_in_memory(s.as_bytes())?);
            }
            let total = restore_ms + times[0];
            let first = first_stats.unwrap_or_default();
            let all = inst.page_stats();
            let start = inst.start.clone();
            let mode = inst.paging_mode().unwrap_or(paging);
            let prefetch = inst.prefetch_stats();
            let recorded = inst.recorded_pages();
            let mem_peak = inst.memory_peak_bytes();
            inst.kill();
            drop(snap);
            let store_stats = fetched.finish();
            write_stats(
                &inv.stats,
                json!({"mode": mode.name(), "requested_mode": paging.name(), "prefetch": prefetch, "recorded_pages": recorded,
                       "memory_peak_bytes": mem_peak, "store": store_stats,
                       "open_ms": open_ms, "sandbox_ms": start.sandbox_ms, "restore_ms": restore_ms,
                       "prepared_sandbox": start.prepared_sandbox, "sandbox_prepare_ms": prepare_ms,
                       "first_invoke_ms": times[0], "total_ms": total, "invocations_ms": times, "resets": resets, "give_backs": give_backs,
                       "cpu_ms_before_first_response": cpu_first,
                       "noop_resets": noop, "memory_matches": matches,
                       "page_faults": first.page_faults, "zero_faults": first.zero_faults,
                       "bytes_read_from_image": first.bytes_read_from_image,
                       "pages_installed_upfront": first.pages_installed_upfront,
                       "page_faults_all": all.page_faults, "bytes_read_from_image_all": all.bytes_read_from_image,
                       "server_cpu_ms": all.server_cpu_ms, "throttled_ms": all.throttled_ms,
                       "phases_ms": phases_ms(&start.phases)}),
            )?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Cmd::Snapshot(SnapshotCmd::Inspect { snapdir, store, .. }) if snapdir.to_str().is_some_and(|s| s.starts_with("s3://")) => {
            store_cmd::inspect(snapdir.to_str().expect("checked"), &store)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Snapshot(SnapshotCmd::Inspect { snapdir, verbose, .. }) => {
            let s = thaw_engine::image::Snapshot::open(&snapdir)?;
            let img = &s.image;
            let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
            for m in &img.vmas {
                use thaw_engine::image::VmaKind;
                let k = match m.kind {
                    VmaKind::Anon { .. } => "anon",
                    VmaKind::FilePrivate { .. } => "file_private",
                    VmaKind::FileCopied { .. } => "file_copied",
                    VmaKind::FileShared { .. } => "file_shared",
                    VmaKind::Special { .. } => "special",
                    VmaKind::SharedAnon => "shared_anon",
                    VmaKind::Unlinked { .. } => "unlinked",
                };
                *kinds.entry(k).or_default() += 1;
            }
            let v = json!({
                "dir": s.dir, "format_version": thaw_engine::image::FORMAT_VERSION, "kernel": img.kernel,
                "created_unix_ms": img.created_unix_ms, "sandbox": img.sandbox, "exe": img.mm.exe, "cwd": img.cwd,
                "threads": img.threads.len(), "vmas": img.vmas.len(), "vma_kinds": kinds, "files": img.files.len(),
                "stored_pages": img.pages.stored_pages(), "page_runs": img.pages.runs.len(),
                "stored_bytes": img.pages.stored_pages() * 4096, "fds": fds_summary(&img.fds), "sigactions": img.sigactions.len(),
                "sealed_with_key": img.seal.as_ref().map(|s| &s.key_id),
            });
            let layers = thaw_engine::layers::LayerSizes::of(img);
            let mut v = v;
            // Live child processes (and theirs): where each is in the process tree, what
            // it holds, how many of the stored pages are its own.
            fn children(img: &thaw_engine::image::ProcessImage, index: &thaw_engine::image::PageIndex) -> serde_json::Value {
                json!(img.children.iter().map(|c| json!({
                    "pid": c.pid, "pgid": c.pgid, "sid": c.sid, "exe": c.image.mm.exe, "threads": c.image.threads.len(),
                    "vmas": c.image.vmas.len(), "descriptors": c.fds.len(), "inherited_shared_mappings": c.inherited.len(),
                    "stored_pages": index.runs.iter().filter(|r| r.vaddr & !((1u64 << 48) - 1) == c.key).map(|r| r.npages).sum::<u64>(),
                    "pages_from_runtime": c.from_leader.iter().map(|r| r.1).sum::<u64>(),
                    "children": children(&c.image, index),
                })).collect::<Vec<_>>())
            }
            v["children"] = children(img, &img.pages);
            v["handed_down"] = json!(img.handed_down);
            v["base"] = json!(layers.base);
            v["diff_bytes"] = json!(layers.diff_bytes);
            v["base_bytes"] = json!(layers.base_bytes);
            v["full_equivalent_bytes"] = json!(layers.full_equivalent_bytes);
            v["pages_by_source"] = json!({"diff": layers.pages_from_diff, "base": layers.pages_from_base, "zero": layers.pages_zero});
            if verbose {
                v["vma_list"] = json!(img.vmas.iter().map(|m| format!("{:#x}-{:#x} prot={} {:?}", m.start, m.end, m.prot, m.kind)).collect::<Vec<_>>());
                v["page_run_list"] = json!(img.pages.runs.iter().map(|r| format!("{:#x} x{} @{}", r.vaddr, r.npages, r.file_page)).collect::<Vec<_>>());
                v["registers"] = json!(format!("{:x?}", img.threads[0].regs));
                v["file_list"] = json!(img.files);
            }
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Snapshot(SnapshotCmd::Memory(a)) => memory_cmd::run(a).map(|()| ExitCode::SUCCESS),
        Cmd::Base(cmd) => base_cmd::run(cmd, &cli.data_dir).map(|()| ExitCode::SUCCESS),
        Cmd::Bundle(BundleCmd::Push(a)) => store_cmd::bundle_push(a).map(|()| ExitCode::SUCCESS),
        Cmd::Snapshot(SnapshotCmd::Push(a)) => store_cmd::push(a).map(|()| ExitCode::SUCCESS),
        Cmd::Snapshot(SnapshotCmd::Pull(a)) => store_cmd::pull(a).map(|()| ExitCode::SUCCESS),
        Cmd::Snapshot(SnapshotCmd::Rm(a)) => store_cmd::rm(a).map(|()| ExitCode::SUCCESS),
        Cmd::Snapshot(SnapshotCmd::Gc(a)) => store_cmd::gc(a).map(|()| ExitCode::SUCCESS),
        Cmd::Snapshot(SnapshotCmd::Evict { snapdir }) => {
            thaw_bench::runner::evict_dir(&snapdir)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Print the function's logs and the outcome of an invocation; returns the instance
/// and whether the function succeeded. A failed invocation kills the instance.
fn report(mut inst: Instance, out: Result<InvokeOutcome, InstanceError>, quiet: bool) -> Result<(Instance, bool)> {
    print_logs(&mut inst, quiet);
    match out {
        Ok(o) => Ok((inst, emit(&o))),
        Err(e) => {
            inst.kill();
            Err(e.into())
        }
    }
}

fn print_logs(inst: &mut Instance, quiet: bool) {
    let logs = inst.take_logs();
    if !quiet && !logs.is_empty() {
        for line in logs.lines() {
            eprintln!("[function] {line}");
        }
    }
}

/// A reset's figures for --stats: every field of ResetStats, its phases as a map.
fn reset_json(st: &thaw_engine::reset::ResetStats) -> serde_json::Value {
    let mut v = serde_json::to_value(st).unwrap_or_else(|_| json!({}));
    if let Some(o) = v.as_object_mut() {
        o.remove("phases");
        o.insert("phases_ms".into(), json!(phases_ms(&st.phases)));
    }
    v
}

/// Phase timings as `--stats` writes them: an object of milliseconds by phase name.
fn phases_ms(phases: &[(&'static str, f64)]) -> serde_json::Map<String, serde_json::Value> {
    phases.iter().map(|(k, v)| (k.to_string(), json!(v))).collect()
}

/// CPU time (user + system) this process has used, in ms: `thaw snapshot restore`'s
/// own share of a cold start (the fetch, the restore, the page server), not the
/// instance's.
fn process_cpu_ms() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).map_or(0.0, |t| t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6)
}

/// The image's descriptors for `snapshot inspect`: as recorded, but the bytes a
/// descriptor carries (a memfd's or deleted file's contents, what waited in a pipe or
/// on a socketpair) as their length, not as the bytes themselves.
fn fds_summary(fds: &[thaw_engine::image::FdRecord]) -> serde_json::Value {
    let mut v = serde_json::to_value(fds).unwrap_or_default();
    for r in v.as_array_mut().into_iter().flatten() {
        for kind in r["kind"].as_object_mut().into_iter().flat_map(|k| k.values_mut()) {
            for field in ["content", "buffered"] {
                if let Some(n) = kind.get(field).and_then(|b| b.as_array()).map(Vec::len) {
                    kind[field] = json!({"bytes": n});
                }
            }
            if let Some(q) = kind.get("queued").and_then(|b| b.as_array()).map(|q| q.iter().map(|m| m.as_array().map_or(0, Vec::len)).collect::<Vec<_>>()) {
                kind["queued"] = json!({"messages_bytes": q});
            }
        }
    }
    v
}

/// `--dump-state`: write `dir/state-I.json`, the idle instance's layout, page contents,
/// registers, descriptors and signal state as named facts (`snap`: the snapshot its
/// memory comes from).
fn dump_state_of(inst: &mut Instance, snap: &LoadedSnapshot, dir: &std::path::Path, i: impl std::fmt::Display) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let facts = inst.inspect(snap).context("reading the instance's state (--dump-state)")?;
    let path = dir.join(format!("state-{i}.json"));
    std::fs::write(&path, serde_json::to_vec(&facts)?).with_context(|| format!("writing {}", path.display()))
}
