//! Running the measurements: snapshots, interleaved cold starts, concurrency.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thaw_engine::fingerprint::{self, CodeCheck};
use thaw_engine::instance::{FunctionConfig, Instance, LoadedSnapshot};
use thaw_engine::pageserver::Paging;
use thaw_engine::seal::{self, NodeKey};
use thaw_engine::ws::{self, WorkingSet};
use thaw_runtime::{InvokeOutcome, Runtime};

use crate::{disk, payload_for, BenchArgs, Config, MODES};

/// Every invocation uses the same request id, so functions that echo it (the
/// Node.js samples do) return identical results in every mode.
const REQUEST_ID: &str = "bench";

const TIMEOUT: Duration = Duration::from_secs(120);
const WS_FILES: [&str; 2] = [ws::TRACE_FILE, ws::PAGES_FILE];

/// The prepared sandboxes of the `*-pooled` modes. Its thread is the parent of every
/// sandbox taken from it, so it lives as long as the process.
fn sandbox_pool() -> Result<Arc<thaw_sandbox::SandboxPool>> {
    static POOL: std::sync::OnceLock<Arc<thaw_sandbox::SandboxPool>> = std::sync::OnceLock::new();
    if let Some(p) = POOL.get() {
        return Ok(p.clone());
    }
    let pool = Arc::new(thaw_sandbox::SandboxPool::new(1).context("starting the sandbox pool thread")?);
    Ok(POOL.get_or_init(|| pool).clone())
}

/// Attach the pool to `loaded` and wait until `n` of its sandboxes are prepared: a
/// node that keeps a pool has them ready before the cold starts it measures.
fn use_pool(loaded: &mut LoadedSnapshot, n: usize) -> Result<()> {
    loaded.sandboxes = Some(sandbox_pool()?);
    let ready = loaded.prepare_sandboxes(n, Duration::from_secs(60));
    if ready < n {
        bail!("only {ready} of {n} prepared sandboxes became ready (see the log for why)");
    }
    Ok(())
}

/// One measured start of one function in one mode.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunRecord {
    pub function: String,
    pub mode: String,
    pub run: usize,
    /// Restore of the process state: opening the snapshot + sandbox + rebuilding the
    /// process until it resumes. Boot: sandbox + runtime start + import. Warm: 0.
    pub restore_ms: f64,
    pub open_ms: f64,
    pub sandbox_ms: f64,
    pub phases_ms: BTreeMap<String, f64>,
    /// Round trip of the first invocation (warm: of the second one).
    pub first_invoke_ms: f64,
    /// restore_ms + first_invoke_ms.
    pub ttfr_ms: f64,
    /// Faults served by the page server during the (measured) invocation and before.
    pub page_faults: u64,
    /// Bytes read from the image (lazy faults, eager install, working set).
    pub bytes_read: u64,
    pub pages_installed_upfront: u64,
    pub ws_pages: Option<u64>,
    pub ws_bytes: Option<u64>,
    pub ws_read_ms: Option<f64>,
    pub ws_install_ms: Option<f64>,
    /// Pages recorded by a record-mode run.
    pub recorded_pages: Option<usize>,
    /// The engine dropped the working set after this run (misprediction); it was put back.
    pub ws_invalidated: bool,
    /// Peak memory charged to the instance's cgroup up to the measured response, bytes.
    pub mem_peak: Option<u64>,
    /// CPU time to the first response: the harness's (the node's side: open, sandbox,
    /// restore, page server; see `crate::cpu`) and the instance's, ms.
    #[serde(default)]
    pub node_cpu_ms: Option<f64>,
    #[serde(default)]
    pub instance_cpu_ms: Option<f64>,
    /// Where the node's side of a restore spends CPU (issue #33): the restoring thread
    /// per step (`sandbox`, then the restore's phases), and the sandbox's init process
    /// (building the sandbox: its mounts, cgroup, the stub), ms.
    #[serde(default)]
    pub phases_cpu_ms: BTreeMap<String, f64>,
    #[serde(default)]
    pub sandbox_init_cpu_ms: Option<f64>,
}

/// One instance of a concurrent cold-start trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConcRecord {
    pub function: String,
    pub mode: String,
    pub n: u32,
    pub rep: usize,
    pub instance: u32,
    pub restore_ms: f64,
    pub first_invoke_ms: f64,
    pub ttfr_ms: f64,
    pub page_faults: u64,
    /// Bytes this instance read from its working-set file (0 when it installed the
    /// copy another restore of the burst had read).
    #[serde(default)]
    pub ws_bytes_read: u64,
    /// CPU time of the trial's harness (the node's side) divided by the burst's size,
    /// and this instance's own to its first response, ms.
    #[serde(default)]
    pub node_cpu_ms: f64,
    #[serde(default)]
    pub instance_cpu_ms: f64,
}

pub struct Results {
    pub runs: Vec<RunRecord>,
    pub concurrency: Vec<ConcRecord>,
    /// The idle-instances experiment (`crate::idle`).
    pub idle: Vec<crate::idle::IdleRecord>,
    pub disk_mib_s: Vec<f64>,
    pub snapshot_bytes: BTreeMap<String, u64>,
    pub started: std::time::SystemTime,
    /// Run metadata taken when the run started (git commit, load average, ...).
    pub meta: serde_json::Value,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The engine's paging mode of a bench mode (`*-sealed` and `*-pooled` modes page as
/// their base).
fn paging(mode: &str) -> Result<Paging> {
    match mode.trim_end_matches("-sealed").trim_end_matches("-pooled") {
        "lazy-page" => Ok(Paging::Lazy),
        m => m.parse::<Paging>().map_err(|e| anyhow!("{e}")),
    }
}

/// Write back and drop every file of a snapshot directory from the page cache.
pub fn evict_dir(dir: &Path) -> Result<()> {
    for ent in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = ent?.path();
        if p.is_file() {
            let f = File::open(&p).with_context(|| format!("opening {}", p.display()))?;
            let _ = f.sync_all();
            thaw_engine::sys::mem::fadvise_dontneed(&f);
        }
    }
    Ok(())
}

/// Drop the kernel's dentry and inode caches (machine-wide).
fn evict_dentries() -> Result<()> {
    std::fs::write("/proc/sys/vm/drop_caches", "2").context("dropping the dentry and inode caches (/proc/sys/vm/drop_caches)")
}

/// How the bench's restores check the function's bundle: as a node does (the
/// fingerprint taken once, when the function was deployed, here when it was prepared),
/// unless `THAW_CODE_CHECK` names another way (`beside`: as `thaw snapshot restore`;
/// `before`; `unchecked`: the baseline of what checking costs).
fn code_check(cfg: &FunctionConfig) -> Result<CodeCheck> {
    match std::env::var("THAW_CODE_CHECK").as_deref() {
        Err(_) | Ok("") | Ok("known") => Ok(CodeCheck::Known {
            code_dir: cfg.code_dir.clone(),
            opt_dir: cfg.opt_dir.clone(),
            fingerprint: fingerprint::of_bundle(&cfg.code_dir, cfg.opt_dir.as_deref())
                .with_context(|| format!("fingerprinting {}", cfg.code_dir.display()))?,
        }),
        Ok(_) => CodeCheck::from_env().map_err(anyhow::Error::msg),
    }
}

/// `--share-memory`: snapshots are opened with shared memory.
static SHARE_MEMORY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn open_snapshot(dir: &Path, check: &CodeCheck) -> Result<LoadedSnapshot> {
    let share = SHARE_MEMORY.load(std::sync::atomic::Ordering::Relaxed);
    Ok(LoadedSnapshot::open_checked(dir, share, check.clone())?)
}

fn copy_synced(from: &Path, to: &Path) -> Result<()> {
    let tmp = to.with_extension("bench-tmp");
    std::fs::copy(from, &tmp).with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, to)?;
    Ok(())
}

/// Put the reference working set (recorded once) into `snap`.
fn install_ws(golden: &Path, snap: &Path) -> Result<()> {
    for f in WS_FILES {
        copy_synced(&golden.join(f), &snap.join(f))?;
    }
    Ok(())
}

/// The function's result as JSON; a function error or a broken instance is an error.
fn outcome(r: Result<InvokeOutcome, thaw_engine::instance::InstanceError>) -> Result<Value> {
    match r {
        Ok(InvokeOutcome::Ok(s)) => serde_json::from_str(&s).with_context(|| format!("function result is not JSON: {s}")),
        Ok(InvokeOutcome::Error(e)) => bail!("the function failed: {}: {}", e.error_type, e.error_message),
        Err(e) => Err(anyhow::Error::new(e).context("invocation failed")),
    }
}

/// Abort if a mode's result differs from the reference (all modes must agree).
fn check_output(reference: &Value, got: &Value, function: &str, mode: &str) -> Result<()> {
    if reference != got {
        bail!(
            "{function}: the {mode} result differs from the reference result — modes disagree\n  reference: {}\n  {mode}: {}",
            truncate(&reference.to_string()),
            truncate(&got.to_string())
        );
    }
    Ok(())
}

fn truncate(s: &str) -> String {
    if s.len() > 400 {
        format!("{}…", &s[..s.char_indices().take_while(|(i, _)| *i < 400).last().map(|(i, _)| i).unwrap_or(0)])
    } else {
        s.to_string()
    }
}

/// The paging mode that ran must be the one asked for (no silent fallback to record).
fn check_mode(inst: &Instance, asked: Paging) -> Result<()> {
    let ran = inst.paging_mode();
    if ran != Some(asked) {
        bail!(
            "asked for paging mode {} but the restore ran {} (working set missing or invalid?) — aborting rather than mislabel the measurement",
            asked.name(),
            ran.map(|m| m.name()).unwrap_or("none")
        );
    }
    Ok(())
}

pub(crate) struct Prepared {
    pub(crate) name: String,
    payload: &'static str,
    pub(crate) snap: PathBuf,
    pub(crate) golden: PathBuf,
    /// The same function captured sealed at rest (the `*-sealed` modes), and its working set.
    sealed_snap: PathBuf,
    sealed_golden: PathBuf,
    cfg: FunctionConfig,
    reference: Value,
    /// Drop the dentry and inode caches before each restore (`--evict-dentries`).
    evict_dentries: bool,
    /// How restores check the bundle (see [`code_check`]).
    code_check: CodeCheck,
}

fn prepare(cfg: &Config, args: &BenchArgs, data_dir: &Path, work: &Path, name: &str, key: &Arc<NodeKey>) -> Result<Prepared> {
    let (runtime, rel, handler) = crate::function_spec(name);
    let code = std::fs::canonicalize(args.samples.join(&rel))
        .with_context(|| format!("sample {name} not found under {} (run scripts/build-samples.sh)", args.samples.display()))?;
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let runtime_dir = thaw_runtime::runtimes::install_shims(data_dir)?;
    let mut fcfg = FunctionConfig::new(Runtime::parse(runtime)?, handler, code, runtime_dir);
    fcfg.memory_mb = cfg.memory_mb;
    fcfg.function_name = name.to_string();
    let dir = work.join(name);
    std::fs::create_dir_all(&dir)?;
    let t = Instant::now();
    // The node key decides whether a capture is sealed: none for the clear snapshot,
    // the run's key for the sealed one (which stays installed to open it).
    seal::install(None);
    let (snap, golden, reference) = snapshot_and_ws(&fcfg, &dir, "", name)?;
    seal::install(Some(key.clone()));
    let (sealed_snap, sealed_golden, sealed_reference) = snapshot_and_ws(&fcfg, &dir, "-sealed", name)?;
    check_output(&reference, &sealed_reference, name, "record (sealed)")?;
    if thaw_engine::image::Snapshot::open(&sealed_snap)?.image.seal.is_none() {
        bail!("{name}: the snapshot for the sealed modes was not sealed");
    }
    eprintln!("bench: {name}: snapshots (clear and sealed) + working sets ready ({:.0} ms)", ms(t.elapsed()));
    Ok(Prepared {
        name: name.to_string(),
        payload: payload_for(name),
        snap,
        golden,
        sealed_snap,
        sealed_golden,
        reference,
        evict_dentries: cfg.evict_dentries,
        code_check: code_check(&fcfg)?,
        cfg: fcfg,
    })
}

/// Capture `dir/snap{suffix}` and record its reference working set (kept in
/// `dir/ws-golden{suffix}`) with the first invocation of a fresh restore.
fn snapshot_and_ws(fcfg: &FunctionConfig, dir: &Path, suffix: &str, name: &str) -> Result<(PathBuf, PathBuf, Value)> {
    let snap = dir.join(format!("snap{suffix}"));
    let inst = Instance::boot_for_snapshot(fcfg).with_context(|| format!("{name}: cold boot for the snapshot"))?;
    inst.capture(&snap).with_context(|| format!("{name}: capturing the snapshot"))?;
    // Record the reference working set with the first invocation of a fresh restore.
    evict_dir(&snap)?;
    let loaded = open_snapshot(&snap, &CodeCheck::Beside)?;
    let mut inst = Instance::restore(&loaded, Paging::Record)?;
    if let Err(e) = check_mode(&inst, Paging::Record) {
        inst.kill();
        return Err(e);
    }
    let out = inst.invoke(REQUEST_ID, payload_for(name), TIMEOUT);
    let _ = inst.take_logs();
    inst.finish_background();
    inst.kill();
    let reference = outcome(out).with_context(|| format!("{name}: first invocation (recording the working set)"))?;
    if !WorkingSet::exists(&snap) {
        bail!("{name}: recording did not leave a working set in {}", snap.display());
    }
    let golden = dir.join(format!("ws-golden{suffix}"));
    std::fs::create_dir_all(&golden)?;
    for f in WS_FILES {
        copy_synced(&snap.join(f), &golden.join(f))?;
    }
    Ok((snap, golden, reference))
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

fn boot_once(p: &Prepared, run: usize) -> Result<(RunRecord, Value)> {
    let mut inst = Instance::boot(&p.cfg)?;
    let t = Instant::now();
    let out = inst.invoke(REQUEST_ID, p.payload, TIMEOUT);
    let first = ms(t.elapsed());
    let _ = inst.take_logs();
    let start = inst.start.clone();
    let mem_peak = inst.memory_peak_bytes();
    inst.kill();
    let v = outcome(out)?;
    let restore_ms = start.sandbox_ms + start.init_ms;
    Ok((
        RunRecord {
            function: p.name.clone(),
            mode: "boot".into(),
            run,
            restore_ms,
            sandbox_ms: start.sandbox_ms,
            first_invoke_ms: first,
            ttfr_ms: restore_ms + first,
            mem_peak,
            ..Default::default()
        },
        v,
    ))
}

/// Evict, open, restore in `mode`, invoke once (twice for warm). Runs on the calling thread.
fn restore_once(p: &Prepared, snap: &Path, mode: &str, run: usize) -> Result<(RunRecord, Value)> {
    let warm = mode == "warm";
    let asked = if warm { Paging::Lazy } else { paging(mode)? };
    evict_dir(snap)?;
    if p.evict_dentries {
        evict_dentries()?;
    }
    let t0 = Instant::now();
    let cpu0 = crate::cpu::process_ms();
    let mut loaded = open_snapshot(snap, &p.code_check)?;
    // Every run uses the reference working set as recorded (REAP); misses are not merged.
    loaded.merge_misses = false;
    if mode == "lazy-page" {
        loaded.source.set_readaround(1);
    }
    let open_ms = ms(t0.elapsed());
    if mode.ends_with("-pooled") {
        // Not part of the cold start: the pool prepares sandboxes ahead of need.
        use_pool(&mut loaded, 1)?;
    }
    let mut inst = Instance::restore(&loaded, asked)?;
    let r = (|| -> Result<(RunRecord, Value)> {
        check_mode(&inst, asked)?;
        let t = Instant::now();
        let out = inst.invoke(REQUEST_ID, p.payload, TIMEOUT);
        let first = ms(t.elapsed());
        let node_cpu = crate::cpu::process_ms() - cpu0;
        let instance_cpu = crate::cpu::task_ms(inst.pid());
        let init_cpu = crate::cpu::task_ms(inst.sandbox_init_pid());
        let mut v = outcome(out)?;
        let before = inst.page_stats();
        let mut rec = RunRecord {
            function: p.name.clone(),
            mode: mode.into(),
            run,
            open_ms,
            sandbox_ms: inst.start.sandbox_ms,
            phases_ms: inst.start.phases.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            restore_ms: open_ms + inst.start.sandbox_ms + inst.start.init_ms,
            first_invoke_ms: first,
            page_faults: before.page_faults,
            bytes_read: before.bytes_read_from_image,
            pages_installed_upfront: before.pages_installed_upfront,
            node_cpu_ms: (!warm).then_some(node_cpu),
            instance_cpu_ms: instance_cpu.filter(|_| !warm),
            phases_cpu_ms: inst.start.phases_cpu.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            sandbox_init_cpu_ms: init_cpu.filter(|_| !warm),
            ..Default::default()
        };
        rec.ttfr_ms = rec.restore_ms + first;
        if let Some(pf) = inst.prefetch_stats() {
            rec.ws_pages = Some(pf.ws_pages);
            rec.ws_bytes = Some(pf.ws_bytes);
            rec.ws_read_ms = Some(pf.read_ms);
            rec.ws_install_ms = Some(pf.install_ms);
        }
        if warm {
            let t = Instant::now();
            let out = inst.invoke(REQUEST_ID, p.payload, TIMEOUT);
            let second = ms(t.elapsed());
            v = outcome(out)?;
            let after = inst.page_stats();
            rec.restore_ms = 0.0;
            rec.first_invoke_ms = second;
            rec.ttfr_ms = second;
            rec.page_faults = after.page_faults - before.page_faults;
            rec.bytes_read = after.bytes_read_from_image - before.bytes_read_from_image;
        }
        rec.mem_peak = inst.memory_peak_bytes();
        let _ = inst.take_logs();
        Ok((rec, v))
    })();
    inst.finish_background();
    let r = rec_recorded(&inst, r);
    inst.kill();
    r
}

fn rec_recorded(inst: &Instance, r: Result<(RunRecord, Value)>) -> Result<(RunRecord, Value)> {
    r.map(|(mut rec, v)| {
        rec.recorded_pages = inst.recorded_pages();
        (rec, v)
    })
}

fn one_mode(p: &Prepared, mode: &str, run: usize) -> Result<(RunRecord, Value)> {
    match mode {
        "boot" => boot_once(p, run),
        "record" => {
            // A fresh working set is recorded by this run; the reference one goes back afterwards.
            ws::invalidate(&p.snap);
            let r = restore_once(p, &p.snap, mode, run);
            if r.is_ok() && !WorkingSet::exists(&p.snap) {
                bail!("{}: the record run did not write a working set", p.name);
            }
            install_ws(&p.golden, &p.snap)?;
            r
        }
        "parallel" | "ws-cached" | "prefetch" | "prefetch-pooled" => with_ws(p, &p.snap, &p.golden, mode, run),
        "prefetch-sealed" => with_ws(p, &p.sealed_snap, &p.sealed_golden, mode, run),
        "lazy-sealed" => restore_once(p, &p.sealed_snap, mode, run),
        _ => restore_once(p, &p.snap, mode, run),
    }
}

/// A run of a mode that installs the reference working set of `snap` (from `golden`).
fn with_ws(p: &Prepared, snap: &Path, golden: &Path, mode: &str, run: usize) -> Result<(RunRecord, Value)> {
    if !WorkingSet::exists(snap) {
        install_ws(golden, snap)?;
    }
    let r = restore_once(p, snap, mode, run);
    let invalidated = !WorkingSet::exists(snap);
    if invalidated {
        eprintln!("bench: {}: the engine dropped the working set after a {mode} run (misprediction); putting it back", p.name);
        install_ws(golden, snap)?;
    }
    r.map(|(mut rec, v)| {
        rec.ws_invalidated = invalidated;
        (rec, v)
    })
}

/// Copy the snapshot `snap` into `to` (a new directory) with the working set of `golden`.
pub(crate) fn copy_snapshot(snap: &Path, golden: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for ent in std::fs::read_dir(snap)? {
        let src = ent?.path();
        if src.is_file() {
            copy_synced(&src, &to.join(src.file_name().expect("file name")))?;
        }
    }
    install_ws(golden, to)
}

/// Open `dir` (a copy of `p`'s snapshot) once for many restores, as the node holds a
/// function's opened snapshot: the reference working set, read once per burst.
pub(crate) fn open_for_burst(dir: &Path, p: &Prepared) -> Result<LoadedSnapshot> {
    let mut l = open_snapshot(dir, &p.code_check)?;
    l.merge_misses = false;
    Ok(l)
}

/// Invoke `inst` with `p`'s payload and check the result against the reference.
pub(crate) fn invoke_checked(inst: &mut Instance, p: &Prepared, mode: &str) -> Result<()> {
    let v = outcome(inst.invoke(REQUEST_ID, p.payload, TIMEOUT))?;
    let _ = inst.take_logs();
    check_output(&p.reference, &v, &p.name, mode)
}

/// One measured cold start of `p` in a restore `mode` of the main experiment, its
/// result checked against the reference.
pub(crate) fn measure(p: &Prepared, mode: &str, run: usize) -> Result<RunRecord> {
    let (rec, v) = one_mode(p, mode, run)?;
    check_output(&p.reference, &v, &p.name, mode)?;
    Ok(rec)
}

/// Concurrent cold starts of copies of one function's snapshot.
fn concurrency(p: &Prepared, cfg: &Config, work: &Path) -> Result<Vec<ConcRecord>> {
    let max = cfg.concurrency.iter().copied().max().unwrap_or(0);
    let base = work.join(&p.name).join("copies");
    let mut copies = Vec::new();
    for i in 0..max {
        let d = base.join(format!("c{i}"));
        copy_snapshot(&p.snap, &p.golden, &d)?;
        copies.push(d);
    }
    let reps = cfg.runs;
    let mut out = Vec::new();
    for &n in &cfg.concurrency {
        for rep in 0..reps {
            // lazy / prefetch: N copies of the snapshot (N different functions' worth of
            // files); burst-*: N restores of ONE snapshot through one opened snapshot,
            // as the node serves a burst of one function, with each restore reading
            // the working set itself (today's REAP) or one read shared by the burst;
            // burst-pooled: shared, with sandboxes prepared by a pool beforehand;
            // prefetch-pooled: N different functions' files, sandboxes from the pool.
            let mut modes: Vec<&'static str> =
                crate::CONCURRENCY_MODES.iter().copied().filter(|m| cfg.concurrency_modes.iter().any(|c| c == m)).collect();
            let k = rep as usize % modes.len().max(1);
            modes.rotate_left(k);
            for mode in modes {
                let burst = mode.starts_with("burst-");
                let asked = if burst { Paging::Prefetch } else { paging(mode)? };
                let shared = if burst {
                    let mut l = open_for_burst(&copies[0], p)?;
                    l.single_flight = mode != "burst-each";
                    if mode == "burst-pooled" {
                        use_pool(&mut l, n as usize)?;
                    }
                    Some(Arc::new(l))
                } else {
                    if mode == "prefetch-pooled" {
                        // The copies share one shape: have N sandboxes of it ready.
                        use_pool(&mut open_snapshot(&copies[0], &p.code_check)?, n as usize)?;
                    }
                    None
                };
                for d in &copies[..n as usize] {
                    if asked.needs_ws() && !WorkingSet::exists(d) {
                        install_ws(&p.golden, d)?;
                    }
                    evict_dir(d)?;
                }
                let go = Arc::new(Barrier::new(n as usize + 1));
                let done = Arc::new(Barrier::new(n as usize + 1));
                let handles: Vec<_> = (0..n)
                    .map(|i| {
                        let (go, done) = (go.clone(), done.clone());
                        let dir = copies[i as usize].clone();
                        let (payload, name, reference) = (p.payload, p.name.clone(), p.reference.clone());
                        let shared = shared.clone();
                        let check = p.code_check.clone();
                        std::thread::spawn(move || -> Result<ConcRecord> {
                            go.wait();
                            let t0 = Instant::now();
                            let r = (|| -> Result<(ConcRecord, Instance)> {
                                let loaded = match shared {
                                    Some(l) => l,
                                    None => {
                                        let mut l = open_snapshot(&dir, &check)?;
                                        l.merge_misses = false;
                                        if mode == "prefetch-pooled" {
                                            l.sandboxes = Some(sandbox_pool()?);
                                        }
                                        Arc::new(l)
                                    }
                                };
                                let mut inst = Instance::restore(&loaded, asked)?;
                                let restore_ms = ms(t0.elapsed());
                                if let Err(e) = check_mode(&inst, asked) {
                                    inst.kill();
                                    return Err(e);
                                }
                                let t = Instant::now();
                                let res = inst.invoke(REQUEST_ID, payload, TIMEOUT);
                                let first = ms(t.elapsed());
                                let ttfr = ms(t0.elapsed());
                                let instance_cpu_ms = crate::cpu::task_ms(inst.pid()).unwrap_or(f64::NAN);
                                let checked = outcome(res).and_then(|v| check_output(&reference, &v, &name, mode));
                                if let Err(e) = checked {
                                    inst.kill();
                                    return Err(e);
                                }
                                let rec = ConcRecord {
                                    function: name.clone(),
                                    mode: mode.into(),
                                    n,
                                    rep,
                                    instance: i,
                                    restore_ms,
                                    first_invoke_ms: first,
                                    ttfr_ms: ttfr,
                                    page_faults: inst.page_stats().page_faults,
                                    ws_bytes_read: inst.prefetch_stats().filter(|p| !p.shared).map(|p| p.ws_bytes).unwrap_or(0),
                                    node_cpu_ms: 0.0,
                                    instance_cpu_ms,
                                };
                                Ok((rec, inst))
                            })();
                            done.wait();
                            let (rec, inst) = r?;
                            inst.kill();
                            Ok(rec)
                        })
                    })
                    .collect();
                let cpu0 = crate::cpu::process_ms();
                go.wait();
                done.wait();
                let node_cpu = (crate::cpu::process_ms() - cpu0) / f64::from(n);
                // Once every restore of the burst is done, nothing of its working set stays.
                if let Some(l) = shared.as_ref().filter(|l| l.holds_working_set()) {
                    bail!("{}: the opened snapshot still holds its working set after a {mode} burst of {n}", l.dir.display());
                }
                let mut trial = Vec::new();
                for h in handles {
                    let mut rec = h.join().map_err(|_| anyhow!("a concurrency thread panicked"))??;
                    rec.node_cpu_ms = node_cpu;
                    trial.push(rec);
                }
                let avg = trial.iter().map(|r| r.ttfr_ms).sum::<f64>() / trial.len() as f64;
                let mx = trial.iter().map(|r| r.ttfr_ms).fold(0.0, f64::max);
                eprintln!("bench: {} concurrency N={n} rep {}/{reps} {mode}: avg {avg:.1} ms, max {mx:.1} ms", p.name, rep + 1);
                out.extend(trial);
            }
        }
    }
    Ok(out)
}

pub fn run(cfg: &Config, args: &BenchArgs, data_dir: &Path) -> Result<Results> {
    if cfg.functions.is_empty() && cfg.idle.is_empty() && (cfg.concurrency.is_empty() || cfg.concurrency_functions.is_empty()) {
        bail!("no functions to run (--functions, or --concurrency with --concurrency-functions, or --idle)");
    }
    SHARE_MEMORY.store(cfg.share_memory, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::SystemTime::now();
    let meta = crate::report::meta(cfg, started);
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let work = args.out.join(format!(".work-{}", std::process::id()));
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let r = run_in(cfg, args, data_dir, &work, started).map(|mut r| {
        r.meta = meta;
        r
    });
    if args.keep_work {
        eprintln!("bench: scratch directory kept: {}", work.display());
    } else if let Err(e) = std::fs::remove_dir_all(&work) {
        eprintln!("bench: warning: removing {}: {e}", work.display());
    }
    r
}

fn run_in(cfg: &Config, args: &BenchArgs, data_dir: &Path, work: &Path, started: std::time::SystemTime) -> Result<Results> {
    // Disk bandwidth for large reads, measured on the file system holding the snapshots.
    let bw_file = work.join("disk-bandwidth.bin");
    eprintln!("bench: disk: writing a {} MiB file for the O_DIRECT bandwidth measurement", cfg.disk_file_mib);
    disk::make_file(&bw_file, cfg.disk_file_mib << 20)?;
    let mut disk_mib_s = Vec::new();
    for _ in 0..5 {
        disk_mib_s.push(disk::read_bandwidth(&bw_file)?);
    }
    let _ = std::fs::remove_file(&bw_file);
    eprintln!(
        "bench: disk: O_DIRECT sequential 16 MiB reads: {}",
        disk_mib_s.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ") + " MiB/s"
    );

    let mut names: Vec<String> = cfg.functions.clone();
    for f in &cfg.concurrency_functions {
        if !cfg.concurrency.is_empty() && !names.contains(f) {
            names.push(f.clone());
        }
    }
    if !cfg.idle.is_empty() && !names.contains(&cfg.idle_function) {
        names.push(cfg.idle_function.clone());
    }
    let mut prepared = Vec::new();
    let mut snapshot_bytes = BTreeMap::new();
    let key = Arc::new(NodeKey::generate().context("generating the run's node key for the sealed modes")?);
    for name in &names {
        let p = prepare(cfg, args, data_dir, work, name, &key)?;
        snapshot_bytes.insert(name.clone(), dir_bytes(&p.snap));
        prepared.push(p);
    }

    let mut runs = Vec::new();
    for p in prepared.iter().filter(|p| cfg.functions.contains(&p.name)) {
        for run in 0..cfg.runs {
            // Interleave: every run goes through all modes, starting at a different one.
            let mut line = Vec::new();
            for k in 0..MODES.len() {
                let mode = MODES[(k + run) % MODES.len()];
                let (rec, v) = one_mode(p, mode, run).with_context(|| format!("{} in mode {mode}, run {}", p.name, run + 1))?;
                check_output(&p.reference, &v, &p.name, mode)?;
                line.push((mode, rec.ttfr_ms, rec.page_faults));
                runs.push(rec);
            }
            line.sort_by_key(|(m, _, _)| MODES.iter().position(|x| x == m));
            eprintln!(
                "bench: {} run {}/{}: {}",
                p.name,
                run + 1,
                cfg.runs,
                line.iter().map(|(m, t, f)| format!("{m} {t:.1}ms/{f}pf")).collect::<Vec<_>>().join("  ")
            );
        }
        for mode in MODES {
            let v: Vec<f64> = runs.iter().filter(|r| r.function == p.name && r.mode == mode).map(|r| r.ttfr_ms).collect();
            eprintln!("bench: {} {mode}: time to first response median {:.1} ms", p.name, crate::stats::median(&v).unwrap_or(f64::NAN));
        }
    }

    let mut conc = Vec::new();
    if !cfg.concurrency.is_empty() {
        for p in prepared.iter().filter(|p| cfg.concurrency_functions.contains(&p.name)) {
            conc.extend(concurrency(p, cfg, work)?);
        }
    }
    let mut idle = Vec::new();
    if let Some(p) = prepared.iter().find(|p| p.name == cfg.idle_function).filter(|_| !cfg.idle.is_empty()) {
        idle = crate::idle::run(p, &cfg.idle, cfg.runs, work)?;
    }
    Ok(Results { runs, concurrency: conc, idle, disk_mib_s, snapshot_bytes, started, meta: Value::Null })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_restore_mode_names_a_paging_mode() {
        for mode in MODES.iter().filter(|m| !["boot", "warm"].contains(m)) {
            assert!(paging(mode).is_ok(), "{mode}");
        }
        assert_eq!(paging("prefetch-sealed").unwrap(), Paging::Prefetch);
        assert_eq!(paging("lazy-sealed").unwrap(), Paging::Lazy);
    }
}
