//! A function instance: a sandboxed runtime process plus its control channel,
//! started by a cold boot or restored from a snapshot, and able to be captured.
//!
//! This is the seam the node (and the one-shot CLI) drive: `boot`, `restore`,
//! `invoke`, `capture`, `kill`. A microVM backend would implement the same verbs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use thaw_runtime::{Channel, ChannelError, InvokeOutcome, InvokeRequest, Runtime, RuntimeError, LATEST_VERSION};
use thaw_sandbox::{Entry, Limits, Sandbox, SandboxError, SandboxPool, SandboxSpec};
use thiserror::Error;
use tracing::{info, warn};

use crate::capture::{self, CaptureError, CaptureStats};
use crate::image::{ImageError, SandboxRecord, Snapshot};
use crate::fingerprint::{self, CodeCheck, Verdict};
use crate::inject;
use crate::pageserver::{PageServer, PageSource, Paging, Stats};
use crate::pageserver::PrefetchStats;
use crate::restore::{self, Prefill, RestoreError, SharedWs};
use crate::ws::{self, WorkingSet, WsError};

#[derive(Debug, Error)]
pub enum InstanceError {
    #[error("creating the sandbox")]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("function init failed: {}: {}", .0.error_type, .0.error_message)]
    Init(thaw_runtime::FunctionError),
    #[error("after-restore hook failed: {}: {}", .0.error_type, .0.error_message)]
    AfterRestore(thaw_runtime::FunctionError),
    #[error("the instance did not become ready")]
    NotReady(#[source] ChannelError),
    #[error("function init ran out of memory: the instance was killed at its {memory_mb} MB limit (raise --memory / MemorySize)")]
    InitOutOfMemory { memory_mb: u64, #[source] source: ChannelError },
    #[error("invocation failed{}{}", .exit.as_ref().map(|e| format!(" (instance {e})")).unwrap_or_default(), .page_server.as_ref().map(|e| format!(" (page server: {e})")).unwrap_or_default())]
    Invoke { exit: Option<String>, page_server: Option<String>, #[source] source: ChannelError },
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("the sandbox did not hand over its {0}")]
    MissingFd(&'static str),
    #[error("I/O setting up the instance")]
    Io(#[source] std::io::Error),
    #[error("freezing or thawing the idle instance")]
    Freezer(#[source] Box<thaw_sandbox::CgroupError>),
    #[error("reset failed; the instance was discarded")]
    Reset(#[from] crate::reset::ResetError),
    #[error(transparent)]
    Install(#[from] crate::repurpose::InstallError),
    #[error("inspecting the instance")]
    Inspect(#[from] crate::inspect::InspectError),
    #[error("giving back unchanged pages failed; the instance was discarded")]
    GiveBack(#[from] crate::giveback::GiveBackError),
    #[error(transparent)]
    Layer(#[from] Box<crate::layers::LayerError>),
}

impl From<crate::layers::LayerError> for InstanceError {
    fn from(e: crate::layers::LayerError) -> InstanceError {
        InstanceError::Layer(Box::new(e))
    }
}

/// What is needed to cold-boot a function.
#[derive(Debug, Clone)]
pub struct FunctionConfig {
    pub function_name: String,
    /// `AWS_LAMBDA_FUNCTION_VERSION` of a booted instance ("$LATEST" or a published
    /// version's number). A restored instance is told its version with each invocation
    /// ([`Instance::set_function_version`]): snapshots are shared between versions.
    pub function_version: String,
    pub runtime: Runtime,
    pub handler: String,
    pub code_dir: PathBuf,
    /// Directory holding the runtime shims (see `thaw_runtime::runtimes::install_shims`).
    pub runtime_dir: PathBuf,
    /// The function's layers, extracted in order, mounted at `/opt` (None: no layers).
    pub opt_dir: Option<PathBuf>,
    pub memory_mb: u64,
    pub cpu_millis: u64,
    pub pids_max: u64,
    pub tmp_size_mb: u64,
    pub env: Vec<(String, String)>,
    pub init_timeout: Duration,
}

impl FunctionConfig {
    pub fn new(runtime: Runtime, handler: &str, code_dir: PathBuf, runtime_dir: PathBuf) -> FunctionConfig {
        FunctionConfig {
            function_name: "function".into(),
            function_version: LATEST_VERSION.into(),
            runtime,
            handler: handler.into(),
            code_dir,
            runtime_dir,
            opt_dir: None,
            memory_mb: 512,
            cpu_millis: 1000,
            pids_max: 256,
            tmp_size_mb: 64,
            env: Vec::new(),
            init_timeout: Duration::from_secs(60),
        }
    }

    pub fn record(&self) -> SandboxRecord {
        SandboxRecord {
            runtime: self.runtime.name().into(),
            handler: self.handler.clone(),
            code_dir: self.code_dir.clone(),
            runtime_dir: Some(self.runtime_dir.clone()),
            opt_dir: self.opt_dir.clone(),
            memory_mb: self.memory_mb,
            cpu_millis: self.cpu_millis,
            pids_max: self.pids_max,
            tmp_size_mb: self.tmp_size_mb,
            uid: 65534,
            gid: 65534,
            restore_notice: true,
            code_fingerprint: String::new(),
        }
    }
}

/// `<kind>-<our pid>-<start time>-<counter>`: the pid lets a later process
/// recognise leftovers of a dead one; the start time keeps a reused pid from
/// colliding with them.
fn unique_id(kind: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        let spec = SandboxSpec::default();
        let removed = thaw_sandbox::sweep_stale(&spec.run_dir, &spec.cgroup_root);
        if removed > 0 {
            info!(removed, "cleaned up sandboxes left by processes that died");
        }
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64 % 1_000_000_000).unwrap_or(0)
    });
    format!("{kind}-{}-{start}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn spec_for(rec: &SandboxRecord, kind: &str) -> SandboxSpec {
    let (init_exe, init_args) = thaw_sandbox::init_exe::default_init();
    SandboxSpec {
        id: unique_id(kind),
        init_exe,
        init_args,
        code_dir: rec.code_dir.clone(),
        runtime_dir: rec.runtime_dir.clone(),
        opt_dir: rec.opt_dir.clone(),
        tmp_size_mb: rec.tmp_size_mb,
        limits: Limits { memory_mb: rec.memory_mb, cpu_millis: rec.cpu_millis, pids_max: rec.pids_max },
        uid: rec.uid,
        gid: rec.gid,
        ..SandboxSpec::default()
    }
}

/// Start preparing, in `pool`, a sandbox for a restore of a snapshot whose sandbox
/// record is `rec`, before the snapshot is open (its record known early, e.g. from a
/// store's manifest while the rest arrives). Returns at once; a later
/// [`LoadedSnapshot::prepare_sandboxes`] waits for it, and a restore takes it only if
/// the snapshot's own record has the same shape.
pub fn prepare_restore_sandbox(pool: &SandboxPool, rec: &SandboxRecord) {
    pool.fill(&spec_for(rec, "restore"), 1, Duration::ZERO);
}

/// A restore's sandbox: a prepared one from `pool` if it has one of `spec`'s shape
/// (`extra` are binds beyond the shape: this snapshot's shared memory file), else a
/// new one. Also returns the pool when its sandbox was used (the instance keeps it).
fn stub_sandbox(
    pool: Option<&Arc<SandboxPool>>,
    mut spec: SandboxSpec,
    extra: &[PathBuf],
    entry: Entry,
) -> Result<(Sandbox, Option<Arc<SandboxPool>>), SandboxError> {
    if let Some(prepared) = pool.and_then(|p| p.take(&spec)) {
        let id = prepared.id().to_string();
        match prepared.start(&spec.code_dir, spec.opt_dir.as_deref(), extra, &entry) {
            Ok(sb) => return Ok((sb, pool.cloned())),
            Err(e) => warn!(sandbox = id, error = %e, cause = ?std::error::Error::source(&e), "a prepared sandbox did not start; creating one"),
        }
    }
    spec.ro_binds.extend_from_slice(extra);
    Ok((Sandbox::spawn(&spec, entry)?, None))
}

/// How a working set's pages are opened for its ws.lz4 (`ws::write`): a sealed
/// image's are decrypted there, its frames sealed.
fn sealed_pages(source: &PageSource) -> Option<ws::SealedPages<'_>> {
    source.sealer().map(|sealer| ws::SealedPages { sealer, index: &source.index, own_pages: source.file().own_pages() })
}

/// Set to "1" in the environment of an instance booted to be captured.
pub const SNAPSHOT_ENV: &str = "THAW_SNAPSHOT";
/// Set to "1" in the environment of a runtime booted as a base: it starts, says
/// `ready` with `"base": true` and waits for `load` before importing any function.
pub const BASE_ENV: &str = "THAW_BASE";

/// Times a reset lists the sandbox again for processes forked while the others were
/// being killed.
const LEFTOVER_ROUNDS: usize = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Boot {
    Plain,
    ForSnapshot,
    Base,
}

/// A snapshot opened once and shared by every instance restored from it.
pub struct LoadedSnapshot {
    pub dir: PathBuf,
    pub image: crate::image::ProcessImage,
    pub source: Arc<PageSource>,
    pub region: u64,
    /// Identity of the image; working sets must carry the same.
    pub id: u32,
    /// Share of a prefetch restore's touched pages allowed outside the working set
    /// before it is considered unrepresentative and re-recorded (REAP's misprediction).
    pub reprofile_threshold: f64,
    /// After a prefetch restore's first response, add the pages it had to fault in
    /// (below the threshold) to the working set, so it converges on what restores
    /// need (a JVM touches other pages once minutes have passed since the capture).
    /// Off: the working set stays what the recording invocation touched (REAP).
    pub merge_misses: bool,
    /// Reader threads of the `parallel` variant.
    pub parallel_readers: usize,
    /// Concurrent restores share one read of the working set (on by default; off:
    /// each restore reads it itself, as REAP does).
    pub single_flight: bool,
    /// The next restores map the base's shared memory file rather than this
    /// snapshot's (see `sharedmem.rs`; default: `sharedmem::base_files_default`).
    base_file: std::sync::atomic::AtomicBool,
    /// Arm write tracking (userfaultfd WP-async) on restored instances so they can be
    /// reset in place. Off by default: it costs every restore ~1.5 ms and the first
    /// invocation a write-protect fault per page it writes (measured, helloworld).
    /// Atomic: a node switches it when a function asks for isolation (see
    /// [`LoadedSnapshot::set_track_writes`]).
    track_writes: std::sync::atomic::AtomicBool,
    /// The working set in memory while a burst of restores is installing it.
    ws_flight: std::sync::Mutex<std::sync::Weak<SharedWs>>,
    /// Restores of this snapshot under way (waiting at the restore gate or restoring),
    /// and the working set they keep in memory meanwhile: the restore gate lets a burst
    /// in by waves, and the wave after the first would otherwise find the bytes freed
    /// and read them again. The last restore out lets them go.
    restores_under_way: std::sync::atomic::AtomicUsize,
    ws_held: std::sync::Mutex<Option<Arc<SharedWs>>>,
    /// Restores take their sandbox from this pool when it has one of their shape
    /// (see `thaw_sandbox::SandboxPool`); `None`: each restore creates its own.
    pub sandboxes: Option<Arc<SandboxPool>>,
    /// Whether the function's files are those captured (perhaps still being checked).
    code_verdict: Arc<Verdict>,
    /// A diff's: that its base is the one it was captured against (see
    /// [`crate::layers::BaseCheck`]), checked beside the first restore.
    base_check: crate::layers::BaseCheck,
    /// Take the working set's pages out of the image (through its fill) instead of
    /// reading ws.pages: set for a snapshot arriving from a store (`open_filled` with
    /// a fill). The fill hands them over from memory as they arrive, so the restore
    /// of the process state runs beside their fetch; ws.pages is written once the
    /// fetch completes. (Reading a ws.pages written a moment before with O_DIRECT also
    /// waited for its write-back: lrserving 11-17 ms for 7.9 MB.)
    pub ws_from_image: bool,
    /// Read the working set's files through the page cache (never O_DIRECT): they were
    /// written a moment ago by a store's fetch (a sealed snapshot's ws.lz4, in its head).
    ws_cached: bool,
}

impl LoadedSnapshot {
    /// Make the next restores of this snapshot map its base's shared memory file (`true`:
    /// the base's pages once for every function on it, the diff's own pages copied
    /// into each instance) or the snapshot's own (the diff's pages shared among its
    /// instances too). Instances restored already keep theirs.
    pub fn set_base_file(&self, on: bool) {
        self.base_file.store(on, Ordering::Relaxed);
    }

    /// Whether the next restores map the base's shared memory file (when the snapshot
    /// has one: a restore falls back to its own file, see `restore_into`).
    pub fn uses_base_file(&self) -> bool {
        self.base_file.load(Ordering::Relaxed)
    }

    /// Arm write tracking on instances restored from now on (they can then be reset).
    pub fn set_track_writes(&self, on: bool) {
        self.track_writes.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn tracks_writes(&self) -> bool {
        self.track_writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Open a snapshot, its bundle checked beside the restores ([`CodeCheck::Beside`]).
    pub fn open(dir: &Path) -> Result<LoadedSnapshot, InstanceError> {
        Self::open_checked(dir, false, CodeCheck::Beside)
    }

    /// [`LoadedSnapshot::open`]; with `share_memory`, the instances restored from a
    /// layered snapshot map the pages they do not write from one shared copy (see
    /// `sharedmem.rs`). Worth it for a process that restores many instances; a single
    /// restore only pays for filling the copy.
    pub fn open_with(dir: &Path, share_memory: bool) -> Result<LoadedSnapshot, InstanceError> {
        Self::open_checked(dir, share_memory, CodeCheck::Beside)
    }

    /// [`LoadedSnapshot::open_with`], making sure the function's files are those the
    /// image captured as `check` says. A bundle found changed before the snapshot
    /// opens refuses it; one found changed beside the restores refuses each of them.
    pub fn open_checked(dir: &Path, share_memory: bool, check: CodeCheck) -> Result<LoadedSnapshot, InstanceError> {
        Self::open_filled(dir, share_memory, check, None)
    }

    /// [`LoadedSnapshot::open_checked`] of a snapshot whose pages.img may not hold
    /// every page yet: `fill` is asked for each range before it is read (see
    /// [`crate::pagefiles::PageFill`]). State, working set and the rest of the
    /// directory must be complete.
    pub fn open_filled(dir: &Path, share_memory: bool, check: CodeCheck, fill: Option<Arc<dyn crate::pagefiles::PageFill>>) -> Result<LoadedSnapshot, InstanceError> {
        let Snapshot { dir, mut image, pages, id, sealer } = Snapshot::open(dir)?;
        // Captured over other paths (another node unpacked the same bundle elsewhere)
        // and the bundle at the known paths has the fingerprint the image recorded:
        // restored over the known paths. The process sees /var/task and /opt either way.
        if let CodeCheck::Known { code_dir, opt_dir, fingerprint } = &check {
            let elsewhere = *code_dir != image.sandbox.code_dir || *opt_dir != image.sandbox.opt_dir;
            if elsewhere && *fingerprint == image.sandbox.code_fingerprint && opt_dir.is_some() == image.sandbox.opt_dir.is_some() {
                tracing::debug!(captured = %image.sandbox.code_dir.display(), here = %code_dir.display(), "the snapshot's bundle is here under another path");
                (image.sandbox.code_dir, image.sandbox.opt_dir) = (code_dir.clone(), opt_dir.clone());
            }
        }
        let (code, opt) = (&image.sandbox.code_dir, image.sandbox.opt_dir.as_deref());
        let recorded = &image.sandbox.code_fingerprint;
        let code_verdict = match check {
            CodeCheck::Unchecked => Verdict::given(Ok(())),
            CodeCheck::Known { code_dir, opt_dir, fingerprint } if code_dir == *code && opt_dir.as_deref() == opt => {
                Verdict::given(if fingerprint == *recorded { Ok(()) } else { Err(fingerprint::changed_message(code)) })
            }
            CodeCheck::Beside => Verdict::beside(code.clone(), opt.map(Path::to_path_buf), recorded.clone()),
            CodeCheck::Before | CodeCheck::Known { .. } => Verdict::given(fingerprint::check(code, opt, recorded)),
        };
        if let Some(Err(e)) = code_verdict.given_now() {
            return Err(RestoreError::Incompatible(e).into());
        }
        let region = restore::choose_region(&image)?;
        let (index, files, base_check) = crate::layers::page_source(&dir, &image, pages)?;
        let fresh = fill.is_some();
        let files = files.with_fill(fill);
        let mut source = PageSource::new(index, files).sealed(sealer);
        if share_memory && image.base.is_none() {
            tracing::debug!(dir = %dir.display(), "not a layered snapshot: its instances do not share memory");
        }
        if share_memory && image.base.is_some() {
            // Both files: the snapshot's and its base's; each restore maps one.
            for base_file in [false, true] {
                if let Some(mem) = crate::sharedmem::SharedMemory::create(&image, &source.index, base_file) {
                    source = source.with_shared(mem);
                }
            }
        }
        let source = Arc::new(source);
        // A head that brings ws.lz4 (a sealed snapshot's: its ws.pages would be
        // ciphertext, which does not compress): the working set is read from it as it
        // arrives, not assembled out of the image.
        let brings_lz4 = fresh && source.file().fill_brings_ws_lz4();
        Ok(LoadedSnapshot {
            dir,
            image,
            source,
            region,
            id,
            reprofile_threshold: 0.25,
            merge_misses: true,
            parallel_readers: 4,
            single_flight: true,
            base_file: std::sync::atomic::AtomicBool::new(crate::sharedmem::base_files_default()),
            track_writes: std::sync::atomic::AtomicBool::new(false),
            ws_flight: Default::default(),
            restores_under_way: Default::default(),
            ws_held: Default::default(),
            sandboxes: None,
            code_verdict,
            base_check,
            ws_from_image: fresh && !brings_lz4,
            ws_cached: fresh,
        })
    }

    /// Write ws.lz4 beside this snapshot's working set where it has none for its trace
    /// (one that arrived as files: from a store, or written before ws.lz4 existed), a
    /// sealed image's with its frames sealed. Off a restore's path (it reads and
    /// compresses the whole working set): a node calls it from a thread of its own.
    pub fn compress_working_set(&self) -> Result<bool, WsError> {
        self.compress_ws(false)
    }

    /// [`LoadedSnapshot::compress_working_set`] only where this snapshot's restores read
    /// ws.lz4 ([`WorkingSet::reads_lz4`]: a working set of `ws::LZ4_READ_FROM` bytes or
    /// more); a smaller one is read from ws.pages, and its frames (a store's zstd ones
    /// rewritten as LZ4, say) would be made for nobody. What a node and `thaw snapshot
    /// pull` call once a snapshot arrived.
    pub fn compress_working_set_if_read(&self) -> Result<bool, WsError> {
        self.compress_ws(true)
    }

    fn compress_ws(&self, only_if_read: bool) -> Result<bool, WsError> {
        let ws = match WorkingSet::load(&self.dir, self.id) {
            Ok(ws) => ws,
            Err(WsError::Missing { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        if only_if_read && !ws.reads_lz4() {
            return Ok(false);
        }
        ws::compress_beside(&self.dir, &ws, sealed_pages(&self.source).as_ref(), true)
    }

    /// Wait until the bundle is known to be the one captured (see [`CodeCheck`]), and a
    /// diff's base the one it was captured against (see [`crate::layers::BaseCheck`]).
    pub fn code_checked(&self) -> Result<(), InstanceError> {
        self.code_verdict.wait().map_err(RestoreError::Incompatible)?;
        Ok(self.base_check.wait()?)
    }

    /// Have `n` sandboxes for this snapshot's restores prepared in its pool
    /// ([`LoadedSnapshot::sandboxes`]), waiting up to `timeout`; returns how many are
    /// ready (0 without a pool). For a node expecting a burst, and for benchmarks.
    pub fn prepare_sandboxes(&self, n: usize, timeout: Duration) -> usize {
        match &self.sandboxes {
            Some(pool) => pool.fill(&spec_for(&self.image.sandbox, "restore"), n, timeout),
            None => 0,
        }
    }

    /// Whether this snapshot keeps its working set in memory (only while restores of
    /// it are under way: a burst's waves share one read; then it is let go).
    pub fn holds_working_set(&self) -> bool {
        self.ws_held.lock().expect("working-set hold lock").is_some()
    }

    /// Whether a working set has been recorded for this snapshot (not yet validated).
    pub fn has_working_set(&self) -> bool {
        WorkingSet::exists(&self.dir)
    }

    /// The mode `Auto` stands for right now.
    pub fn resolve(&self, paging: Paging) -> Paging {
        match paging {
            Paging::Auto if self.has_working_set() => Paging::Prefetch,
            Paging::Auto => Paging::Record,
            other => other,
        }
    }

    /// Ask the kernel to start reading the copy-on-written file pages (which every
    /// restore installs before resuming) while the sandbox is being created.
    fn readahead_file_pages(&self) {
        use crate::image::VmaKind;
        let index = &self.source.index;
        for v in self.image.vmas.iter().filter(|v| matches!(v.kind, VmaKind::FilePrivate { .. })) {
            let first = index.runs.partition_point(|r| r.vaddr + r.npages * 4096 <= v.start);
            for r in index.runs[first..].iter().take_while(|r| r.vaddr < v.end) {
                self.source.file().willneed(r.file_page, r.npages);
            }
        }
    }

    /// The working set's pages, in its layout's order, opened (decrypted when sealed),
    /// and how long reading them took.
    fn ws_pages(&self, ws: &WorkingSet, cached: bool) -> Result<(ws::AlignedBuf, f64), WsError> {
        let t = Instant::now();
        let (mut buf, mut read_ms) = if self.ws_from_image {
            ws.assemble(&self.dir, &self.source.index, self.source.file())?
        } else {
            ws.read_pages(&self.dir, &self.source.index, cached)?
        };
        if let Some(sealer) = self.source.sealer() {
            // Decrypting is part of reading a sealed working set (once per burst).
            ws.unseal(&self.dir, sealer, &self.source.index, self.source.file().own_pages(), 0, buf.as_mut())?;
            read_ms = t.elapsed().as_secs_f64() * 1e3;
        }
        Ok((buf, read_ms))
    }

    /// Read the working set's pages from ws.pages into `job`'s, piece by piece (each
    /// checked and, sealed, decrypted before a restore installs it). A read that fails
    /// is logged, the working set removed (the next restore records one) and let go
    /// of by this snapshot; the restores installing it get the rest from the page
    /// server.
    fn read_ws(&self, job: WsRead) {
        let ws = &job.shared.ws;
        let (sealer, own) = (self.source.sealer(), self.source.file().own_pages());
        let open = |first: usize, pages: &mut [u8]| match sealer {
            Some(s) => ws.unseal(&self.dir, s, &self.source.index, own, first, pages),
            None => Ok(()),
        };
        if let Err(e) = ws.read_into(&self.dir, &self.source.index, &job.file, &job.shared.pages, &open, sealer) {
            warn!(error = %e, "ignoring the working set: what was read is installed, the page server serves the rest, the next restore re-records");
            ws::invalidate(&self.dir);
            let mut flight = self.ws_flight.lock().expect("working-set flight lock");
            if flight.upgrade().is_some_and(|f| Arc::ptr_eq(&f, &job.shared)) {
                *flight = std::sync::Weak::new();
            }
            let mut held = self.ws_held.lock().expect("working-set hold lock");
            if held.as_ref().is_some_and(|h| Arc::ptr_eq(h, &job.shared)) {
                *held = None;
            }
        }
    }

    /// Load what `paging` needs before the process resumes. A missing, stale or
    /// corrupt working set is logged and removed, and the restore degrades to
    /// record mode (lazy paging that records a fresh working set). The working set's
    /// pages are left to read (the [`WsRead`] returned, [`LoadedSnapshot::read_ws`]):
    /// a restore installs them piece by piece as they arrive.
    fn prefill(&self, paging: Paging) -> (Prefill, Paging, Option<WsRead>) {
        match paging {
            Paging::Lazy | Paging::Record | Paging::Auto => (Prefill::None, paging, None),
            Paging::Eager => (Prefill::Eager, paging, None),
            Paging::Prefetch | Paging::WsCached | Paging::Parallel => {
                // One read per burst: concurrent restores of this snapshot wait for the
                // first one's read and install the same bytes.
                let mut flight = self.ws_flight.lock().expect("working-set flight lock");
                if paging != Paging::Parallel && self.single_flight {
                    let held = || self.ws_held.lock().expect("working-set hold lock").clone();
                    if let Some(shared) = flight.upgrade().or_else(held) {
                        return (Prefill::Ws { shared, reader: false }, paging, None);
                    }
                }
                let cached = paging == Paging::WsCached || self.ws_cached;
                let load = || {
                    WorkingSet::load(&self.dir, self.id).and_then(|ws| {
                        if paging == Paging::Parallel {
                            return Ok((Prefill::Parallel { trace: ws.trace, readers: self.parallel_readers }, None));
                        }
                        if self.ws_from_image {
                            // Out of the image a store fill hands over: whole, at once.
                            let (buf, read_ms) = self.ws_pages(&ws, cached)?;
                            let shared = Arc::new(SharedWs { ws, pages: ws::Arriving::whole(buf, read_ms) });
                            return Ok((Prefill::Ws { shared, reader: true }, None));
                        }
                        // ws.lz4 arriving from a store: each piece read once its frames
                        // are written (the restore goes on meanwhile, and installs the
                        // first pieces while the last are on the wire).
                        let arriving = self.source.file().ws_lz4_arrival().map(|a| {
                            let source = self.source.clone();
                            let image: Arc<ws::ImageReader> = Arc::new(move |buf, at| source.file().read_exact_at(buf, at));
                            (a, image)
                        });
                        let lz4 = arriving.is_some() || ws.reads_lz4();
                        let file = ws.open_pages_with(&self.dir, cached, arriving, lz4)?;
                        let pages = file.arriving(ws.pages_bytes() as usize);
                        let shared = Arc::new(SharedWs { ws, pages });
                        Ok((Prefill::Ws { shared: shared.clone(), reader: true }, Some(WsRead { shared, file })))
                    })
                };
                // A working set being replaced (recorded or merged by another instance)
                // can show a new pages file next to the old trace for a moment: look
                // again before calling it corrupt.
                let mut loaded = load();
                for _ in 0..2 {
                    if !matches!(loaded, Err(WsError::Corrupt { .. })) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    loaded = load();
                }
                match loaded {
                    Ok((p, read)) => {
                        if let Prefill::Ws { shared, .. } = &p {
                            *flight = Arc::downgrade(shared);
                            if self.single_flight {
                                *self.ws_held.lock().expect("working-set hold lock") = Some(shared.clone());
                            }
                        }
                        (p, paging, read)
                    }
                    Err(e) => {
                        if !matches!(e, WsError::Missing { .. }) {
                            warn!(error = %e, "ignoring the working set; restoring lazily and re-recording");
                            ws::invalidate(&self.dir);
                        }
                        (Prefill::None, Paging::Record, None)
                    }
                }
            }
        }
    }
}

/// The working set's pages still to read, by the restore that read its trace (see
/// [`LoadedSnapshot::read_ws`]).
struct WsRead {
    shared: Arc<SharedWs>,
    /// ws.pages, opened (and its size checked) with the trace; ws.lz4 with it.
    file: ws::PagesFile,
}

/// A restore of a snapshot under way: the last one to finish lets go of the working
/// set the snapshot holds for the restores of a burst (`LoadedSnapshot::ws_held`).
struct UnderWay<'a>(&'a LoadedSnapshot);

impl<'a> UnderWay<'a> {
    fn enter(snap: &'a LoadedSnapshot) -> UnderWay<'a> {
        snap.restores_under_way.fetch_add(1, Ordering::AcqRel);
        UnderWay(snap)
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        let mut held = self.0.ws_held.lock().expect("working-set hold lock");
        if self.0.restores_under_way.fetch_sub(1, Ordering::AcqRel) == 1 {
            *held = None;
        }
    }
}

/// How an instance came to be, with its start-up timings (milliseconds).
#[derive(Debug, Clone, Serialize)]
pub struct StartInfo {
    pub kind: &'static str,
    pub sandbox_ms: f64,
    /// Boot: runtime start + function init. Restore: rebuilding the process.
    pub init_ms: f64,
    pub phases: Vec<(&'static str, f64)>,
    /// A restore's CPU milliseconds on the restoring thread: `sandbox` (creating it, or
    /// taking a prepared one; the sandbox's init process spends its own, see
    /// [`Instance::sandbox_init_pid`]), then each of `phases`' steps. Empty otherwise.
    pub phases_cpu: Vec<(&'static str, f64)>,
    /// The sandbox came prepared from a pool (see `thaw_sandbox::SandboxPool`).
    pub prepared_sandbox: bool,
}

/// Page-server figures of a restored instance.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PageStats {
    pub page_faults: u64,
    pub zero_faults: u64,
    pub bytes_read_from_image: u64,
    pub pages_installed_upfront: u64,
    /// CPU time the page server spent serving this instance, and how long its fault
    /// budget held the server back (see `pageserver::FaultBudget`).
    pub server_cpu_ms: f64,
    pub throttled_ms: f64,
    /// Pages mapped from the snapshot's shared memory file instead of copied (see `sharedmem.rs`).
    pub pages_shared: u64,
}

pub struct Instance {
    sandbox: Sandbox,
    channel: Channel,
    pageserver: Option<PageServer>,
    page_stats: Option<Arc<Stats>>,
    record: SandboxRecord,
    memory_mb: u64,
    function_name: String,
    /// Version reported in the context and `AWS_LAMBDA_FUNCTION_VERSION`.
    function_version: String,
    /// This execution environment's log stream (with the version of each call).
    log_stream: LogStream,
    /// ARN reported in the context (`None`: a local ARN built from the name).
    function_arn: Option<String>,
    pub start: StartInfo,
    paging: Option<PagingState>,
    /// Frozen by [`Instance::freeze`] (idle); thawed by the next invoke.
    frozen: bool,
    /// Write tracking of a restored instance, for in-place resets.
    tracking: Option<crate::reset::Tracking>,
    /// Identity of the snapshot this instance was restored from.
    image_id: Option<u32>,
    /// Restored from a runtime's base: it can become an instance of any function of
    /// that base (see [`Instance::load_into`]).
    base: Option<BaseInstance>,
    /// The pool whose thread is the parent of this instance's sandbox init (it must
    /// outlive the sandbox); last, so it is dropped after the sandbox.
    _sandbox_pool: Option<Arc<SandboxPool>>,
}

/// What an instance restored from a runtime's base keeps to be repurposed (issue #30).
#[derive(Debug)]
struct BaseInstance {
    key: crate::layers::BaseKey,
    /// The base's directory.
    dir: PathBuf,
    /// The base's runtime asked to be told it is a restored clone.
    restore_notice: bool,
    /// A function is loaded (or its load failed): reset it to the base before another.
    loaded: bool,
}

/// Figures of one [`Instance::load_into`], in milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LoadIntoStats {
    /// Replacing the code at /var/task.
    pub code_ms: f64,
    /// The runtime loading the function (its init).
    pub load_ms: f64,
    pub total_ms: f64,
}

/// An execution environment's log stream, named as Lambda names it:
/// `YYYY/MM/DD/[VERSION]ID`, the day the instance started (UTC) and 32 hex digits of
/// its own. The version is the one each call runs.
struct LogStream {
    day: String,
    id: String,
}

impl LogStream {
    fn new() -> LogStream {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let (y, m, d) = civil_from_days((secs / 86_400) as i64);
        let mut b = [0u8; 16];
        if getrandom::fill(&mut b).is_err() {
            b[..8].copy_from_slice(&secs.to_le_bytes());
        }
        LogStream { day: format!("{y:04}/{m:02}/{d:02}"), id: b.iter().map(|x| format!("{x:02x}")).collect() }
    }

    fn name(&self, version: &str) -> String {
        format!("{}/[{version}]{}", self.day, self.id)
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`; a date library for one conversion is not worth a dependency).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Per-instance REAP bookkeeping of a restored instance.
struct PagingState {
    mode: Paging,
    dir: PathBuf,
    image_id: u32,
    source: Arc<PageSource>,
    threshold: f64,
    merge_misses: bool,
    prefetch: Option<PrefetchStats>,
    first_done: bool,
    writer: Option<std::thread::JoinHandle<()>>,
    recorded: Option<usize>,
}

impl PagingState {
    /// Stop recording and hand the trace so far to a background writer, which stores
    /// it as the snapshot's working set (the caller is not delayed).
    fn write_recorded(&mut self, stats: &Stats) {
        stats.recording.store(false, Ordering::Relaxed);
        let trace = std::mem::take(&mut *stats.trace.lock().expect("trace lock"));
        self.recorded = Some(trace.len());
        let (dir, id, source) = (self.dir.clone(), self.image_id, self.source.clone());
        self.writer = std::thread::Builder::new()
            .name("thaw-ws-writer".into())
            .spawn(move || match ws::write(&dir, id, &trace, source.file(), sealed_pages(&source).as_ref()) {
                Ok(w) => info!(dir = %dir.display(), pages = w.layout.len(), zero = w.zeros.len(), "working set recorded"),
                Err(e) => warn!(error = %e, "writing the working set failed"),
            })
            .ok();
    }
}

impl Instance {
    /// Cold boot: new sandbox, start the runtime, import the function, wait for READY.
    pub fn boot(cfg: &FunctionConfig) -> Result<Instance, InstanceError> {
        Self::boot_inner(cfg, Boot::Plain)
    }

    /// Cold-boot an instance that is going to be captured. The runtime is told so
    /// (`THAW_SNAPSHOT=1`) and warms up its own invocation paths before READY,
    /// which restored instances then inherit; a plain cold boot skips that work,
    /// which would only delay its first response.
    pub fn boot_for_snapshot(cfg: &FunctionConfig) -> Result<Instance, InstanceError> {
        Self::boot_inner(cfg, Boot::ForSnapshot)
    }

    /// Boot `cfg`'s runtime as a base (see `layers.rs`): in a sandbox whose
    /// /var/task is `placeholder` (empty), with no function environment, started and
    /// waiting for [`Instance::load_function`]. Only runtimes whose shim can wait so
    /// are accepted.
    pub fn boot_base(cfg: &FunctionConfig, placeholder: &Path) -> Result<Instance, InstanceError> {
        let mut base_cfg = FunctionConfig::new(cfg.runtime, "", placeholder.to_path_buf(), cfg.runtime_dir.clone());
        base_cfg.function_name = String::new();
        base_cfg.memory_mb = cfg.memory_mb;
        base_cfg.cpu_millis = cfg.cpu_millis;
        base_cfg.pids_max = cfg.pids_max;
        base_cfg.tmp_size_mb = cfg.tmp_size_mb;
        base_cfg.init_timeout = cfg.init_timeout;
        Self::boot_inner(&base_cfg, Boot::Base)
    }

    fn boot_inner(cfg: &FunctionConfig, how: Boot) -> Result<Instance, InstanceError> {
        if how != Boot::Base {
            cfg.runtime.check_handler(&cfg.handler)?;
        }
        let t0 = Instant::now();
        let mut record = cfg.record();
        let mut spec = spec_for(&record, "boot");
        spec.env = cfg.runtime.env(&cfg.handler, &cfg.function_name, &cfg.function_version, cfg.memory_mb, &cfg.env);
        spec.env.retain(|(k, _)| k != SNAPSHOT_ENV && k != BASE_ENV);
        if how != Boot::Plain {
            spec.env.push((SNAPSHOT_ENV.into(), "1".into()));
        }
        if how == Boot::Base {
            spec.env.push((BASE_ENV.into(), "1".into()));
        }
        let mut sandbox = Sandbox::spawn(&spec, Entry::Exec { argv: cfg.runtime.argv() })?;
        let sandbox_ms = t0.elapsed().as_secs_f64() * 1e3;
        let control = sandbox.take_control().ok_or(InstanceError::MissingFd("control channel"))?;
        let log = sandbox.take_log().ok_or(InstanceError::MissingFd("log pipe"))?;
        let mut channel = Channel::new(control, log).map_err(InstanceError::Io)?;
        match channel.wait_ready_as(cfg.init_timeout) {
            Ok(r) if how == Boot::Base && !r.base => {
                let _ = sandbox.kill();
                return Err(crate::layers::LayerError::Unsupported {
                    runtime: cfg.runtime.name().into(),
                    why: "its shim loaded a function instead of waiting as a base",
                }
                .into());
            }
            Ok(r) => record.restore_notice = r.restore_notice,
            Err(ChannelError::Init(e)) => return Err(InstanceError::Init(e)),
            Err(e) if sandbox.cgroup().oom_killed() => {
                return Err(InstanceError::InitOutOfMemory { memory_mb: cfg.memory_mb, source: e })
            }
            Err(e) => return Err(InstanceError::NotReady(e)),
        }
        let init_ms = t0.elapsed().as_secs_f64() * 1e3 - sandbox_ms;
        info!(id = sandbox.id(), sandbox_ms, init_ms, "booted");
        Ok(Instance {
            frozen: false,
            log_stream: LogStream::new(),
            sandbox,
            channel,
            pageserver: None,
            page_stats: None,
            record,
            memory_mb: cfg.memory_mb,
            function_name: cfg.function_name.clone(),
            function_version: cfg.function_version.clone(),
            function_arn: None,
            start: StartInfo { kind: "boot", sandbox_ms, init_ms, phases: vec![], phases_cpu: vec![], prepared_sandbox: false },
            paging: None,
            tracking: None,
            image_id: None,
            base: None,
            _sandbox_pool: None,
        })
    }

    /// Restore a new instance from a snapshot. Must be called on a long-lived thread
    /// (it becomes the sandbox's parent and, during restore, its tracer).
    ///
    /// With a working-set mode, the working set is read on a helper thread while
    /// the sandbox is being created, so its I/O overlaps sandbox set-up.
    pub fn restore(snap: &LoadedSnapshot, paging: Paging) -> Result<Instance, InstanceError> {
        Self::restore_as(snap, paging, snap.image.sandbox.clone())
    }

    /// [`Instance::restore`] into a sandbox made from `record` instead of the
    /// snapshot's own: a base restored for a function (its code at /var/task).
    pub fn restore_as(snap: &LoadedSnapshot, paging: Paging, record: SandboxRecord) -> Result<Instance, InstanceError> {
        let t0 = Instant::now();
        let _under_way = UnderWay::enter(snap);
        // A few restores at a time, in arrival order (see restore/gate.rs).
        let permit = restore::gate::global().map(|g| g.enter());
        let gate_ms = permit.as_ref().map_or(0.0, |p| p.waited.as_secs_f64() * 1e3);
        let cpu0 = crate::pageserver::thread_cpu_ns();
        let mut sandbox_cpu_ms = 0.0;
        let requested = snap.resolve(paging);
        let spec = spec_for(&record, "restore");
        // Only this snapshot's file: the other files there hold other functions' memory.
        let base_file = snap.uses_base_file();
        let extra: Vec<PathBuf> =
            snap.source.shared(base_file).filter(|_| !snap.tracks_writes()).map(|(file, _)| file.to_path_buf()).into_iter().collect();
        let entry = Entry::Stub { addr: snap.region, len: inject::REGION_LEN as usize, blob: inject::BLOB.to_vec() };
        let mut pool_used = None;
        let (mut sandbox, mut restored, mode) = std::thread::scope(|s| -> Result<_, InstanceError> {
            // The working set first, so its read has the disk to itself: handed over as
            // soon as its pages are on their way, then read piece by piece while the
            // restore installs what is here.
            let (handed, prefilled) = std::sync::mpsc::sync_channel(1);
            let loader = s.spawn(move || {
                let (prefill, mode, read) = snap.prefill(requested);
                let _ = handed.send((prefill, mode));
                if let Some(read) = read {
                    snap.read_ws(read);
                }
                snap.readahead_file_pages();
            });
            let sandbox = stub_sandbox(snap.sandboxes.as_ref(), spec, &extra, entry);
            let mut mode = requested;
            let mut sandbox = match sandbox {
                Ok((sb, pool)) => {
                    pool_used = pool;
                    sb
                }
                Err(e) => {
                    let _ = loader.join();
                    return Err(e.into());
                }
            };
            let pidfd = sandbox.pidfd().try_clone_to_owned().map_err(InstanceError::Io)?;
            sandbox_cpu_ms = crate::pageserver::thread_cpu_ns().saturating_sub(cpu0) as f64 / 1e6;
            let restored = restore::restore_into(sandbox.pid(), &pidfd, snap.region, &snap.image, snap.source.clone(), snap.tracks_writes(), base_file, || {
                let (prefill, m) = prefilled.recv().unwrap_or((Prefill::None, Paging::Record));
                mode = m;
                // Faults are logged while recording, and after a prefetch whose misses are merged.
                let prefetching = matches!(m, Paging::Prefetch | Paging::WsCached | Paging::Parallel);
                (prefill, m == Paging::Record || (prefetching && snap.merge_misses))
            });
            match restored {
                Ok(r) => Ok((sandbox, r, mode)),
                Err(e) => {
                    let _ = sandbox.kill();
                    // A diff's base pages that fail their CRCs because the base is another
                    // one: say that (its check, beside the restore, knows), not "corrupt".
                    snap.base_check.wait()?;
                    Err(e.into())
                }
            }
        })?;
        drop(permit);
        if gate_ms > 0.0 {
            restored.phases.insert(0, ("gate", gate_ms));
        }
        // Nothing of the function runs before its files are known to be the captured
        // ones, and a diff's base its own (both checks went on beside the restore).
        let tc = Instant::now();
        if let Err(e) = snap.code_checked() {
            let _ = sandbox.kill();
            return Err(e);
        }
        restored.phases.push(("code_check_wait", tc.elapsed().as_secs_f64() * 1e3));
        let control = sandbox.take_control().ok_or(InstanceError::MissingFd("control channel"))?;
        let log = sandbox.take_log().ok_or(InstanceError::MissingFd("log pipe"))?;
        let mut channel = Channel::new(control, log).map_err(InstanceError::Io)?;
        // A restored clone reseeds its randomness and runs after-restore hooks first
        // (unless its runtime said at capture it has nothing to reseed or run).
        let th = Instant::now();
        if record.restore_notice {
            match channel.restored(Duration::from_secs(30)) {
                Ok(()) => {}
                Err(ChannelError::Init(e)) => return Err(InstanceError::AfterRestore(e)),
                Err(e) => return Err(InstanceError::NotReady(e)),
            }
        }
        let tracking = restored.tracking.take();
        restored.phases.push(("after_restore", th.elapsed().as_secs_f64() * 1e3));
        let base = crate::layers::meta_of(&snap.dir).map(|m| BaseInstance { key: m.key, dir: m.dir, restore_notice: record.restore_notice, loaded: false });
        let total_ms = t0.elapsed().as_secs_f64() * 1e3;
        let sandbox_ms = total_ms - restored.phases.iter().map(|p| p.1).sum::<f64>();
        let kind = match mode {
            Paging::Prefetch | Paging::WsCached | Paging::Parallel => "restore-prefetch",
            Paging::Eager => "restore-eager",
            _ => "restore-lazy",
        };
        info!(id = sandbox.id(), total_ms, sandbox_ms, phases = ?restored.phases, mode = mode.name(), "restored");
        Ok(Instance {
            frozen: false,
            log_stream: LogStream::new(),
            sandbox,
            channel,
            pageserver: Some(restored.pageserver),
            page_stats: Some(restored.stats),
            memory_mb: record.memory_mb,
            record,
            function_name: "function".into(),
            function_version: LATEST_VERSION.into(),
            function_arn: None,
            start: StartInfo {
                kind,
                sandbox_ms,
                init_ms: total_ms - sandbox_ms,
                phases: restored.phases,
                phases_cpu: std::iter::once(("sandbox", sandbox_cpu_ms)).chain(restored.phases_cpu).collect(),
                prepared_sandbox: pool_used.is_some(),
            },
            paging: Some(PagingState {
                mode,
                dir: snap.dir.clone(),
                image_id: snap.id,
                source: snap.source.clone(),
                threshold: snap.reprofile_threshold,
                merge_misses: snap.merge_misses,
                prefetch: restored.prefetch,
                first_done: false,
                writer: None,
                recorded: None,
            }),
            tracking,
            image_id: Some(snap.id),
            base,
            _sandbox_pool: pool_used,
        })
    }

    /// Return this restored instance, idle between invocations, to the state it was
    /// restored into (see `reset.rs`), then tell the runtime as after a restore (it
    /// reseeds its randomness). `snap` must be the snapshot it was restored from.
    ///
    /// On `Err` the instance is dead (fail closed): `kill` it and restore a fresh one.
    /// THAW_RESET_HOT=0: every written page is write-protected again (the baseline of
    /// bench/isolation.py's comparison).
    pub fn reset(&mut self, snap: &LoadedSnapshot) -> Result<crate::reset::ResetStats, InstanceError> {
        self.reset_keeping(snap, std::env::var("THAW_RESET_HOT").as_deref() != Ok("0"))
    }

    /// [`Instance::reset`]; `keep_hot`: leave the pages call after call writes writable
    /// (rewritten at each reset all the same: `reset::Hot`).
    fn reset_keeping(&mut self, snap: &LoadedSnapshot, keep_hot: bool) -> Result<crate::reset::ResetStats, InstanceError> {
        let t0 = Instant::now();
        // A frozen instance cannot reach a ptrace stop.
        self.thaw()?;
        let (Some(tracking), Some(stats)) = (self.tracking.as_ref(), self.page_stats.as_ref()) else {
            let why = crate::reset::untrackable(&snap.image).unwrap_or_else(|| "it was not restored with write tracking".into());
            return Err(crate::reset::ResetError::NotTracked(why).into());
        };
        if self.image_id != Some(snap.id) {
            let _ = self.sandbox.kill();
            return Err(crate::reset::ResetError::NotTracked("it was restored from another snapshot".into()).into());
        }
        // The sandbox's processes but its init and the instance: what the tenant started.
        let (main, init) = (self.sandbox.pid(), self.sandbox.init_pid());
        let mut list_others = || -> Result<Vec<i32>, InstanceError> {
            match self.sandbox.cgroup().pids() {
                Ok(p) => Ok(p.into_iter().filter(|&p| p != main && p != init).collect()),
                Err(e) => {
                    let _ = self.sandbox.kill();
                    Err(crate::reset::ResetError::Children { pid: main, what: format!("listing the sandbox's processes: {e}") }.into())
                }
            }
        };
        let others = list_others()?;
        let mut st = crate::reset::reset(main, &others, &snap.image, &snap.source, tracking, stats, keep_hot)?;
        // A process forked while the others were being killed (a daemon's second fork)
        // was not in the listing: list again until none is left, so the next call
        // never sees one.
        for _ in 0..LEFTOVER_ROUNDS {
            let late = list_others()?;
            if late.is_empty() {
                break;
            }
            st.processes_killed += crate::reset::kill_others(main, &late)?;
        }
        let _ = self.channel.take_logs();
        // Whatever the previous tenant left on the control channel is dropped (and any
        // frame it could still produce lacks the next request's nonce).
        if let Err(e) = self.channel.discard_pending() {
            let _ = self.sandbox.kill();
            return Err(InstanceError::NotReady(e));
        }
        if let Some(ms) = self.restore_notice()? {
            st.phases.push(("after_restore", ms));
        }
        st.reset_ms = t0.elapsed().as_secs_f64() * 1e3;
        info!(id = self.sandbox.id(), reset_ms = st.reset_ms, pages_written_back = st.pages_written_back, "reset");
        Ok(st)
    }

    /// Reset an instance restored from a runtime's base (see [`Instance::load_into`]) back
    /// to the base's clean state: whatever the function it served left is taken back as
    /// by [`Instance::reset`], and the base's runtime is told it is a restored clone
    /// again (it reseeds). `base` is the snapshot it was restored from. It can then load
    /// another function. Fails closed like a reset (the instance is killed).
    pub fn reset_to_base(&mut self, base: &LoadedSnapshot) -> Result<crate::reset::ResetStats, InstanceError> {
        let Some(b) = &self.base else {
            return Err(crate::layers::LayerError::Refused("the instance was not restored from a base".into()).into());
        };
        self.record.restore_notice = b.restore_notice;
        // Another function comes next: nothing of this one's stays writable.
        let st = self.reset_keeping(base, false)?;
        if let Some(b) = &mut self.base {
            b.loaded = false;
        }
        Ok(st)
    }

    /// Make this clean instance of a runtime's base (restored from the base with write
    /// tracking, or reset to it by [`Instance::reset_to_base`]) an instance of `cfg`
    /// (issue #30, repurposing): `cfg`'s code replaces what is at /var/task and the
    /// runtime loads the function (its init runs now, as a cold boot's would). A cold
    /// start with no new sandbox and no process rebuilt. Refused for a function of
    /// another base (runtime, shims, memory class) and for one with layers (/opt).
    /// If the function's init fails the instance stays, to be reset to the base; if the
    /// code cannot be replaced it is killed.
    pub fn load_into(&mut self, cfg: &FunctionConfig) -> Result<LoadIntoStats, InstanceError> {
        let t0 = Instant::now();
        let refused = |why: String| -> InstanceError { crate::layers::LayerError::Refused(why).into() };
        let Some(b) = &self.base else { return Err(refused("the instance was not restored from a base".into())) };
        if b.loaded {
            return Err(refused("the instance serves a function already: reset it to its base first".into()));
        }
        let key = crate::layers::BaseKey::of(&cfg.record());
        if key != b.key {
            return Err(refused(format!("its base was built for {:?}, the function needs {:?}", b.key, key)));
        }
        if cfg.opt_dir.is_some() {
            return Err(refused("a function with layers (/opt) is not loaded into a base instance yet".into()));
        }
        cfg.runtime.check_handler(&cfg.handler)?;
        self.thaw()?;
        if let Err(e) = self.sandbox.replace_code(&cfg.code_dir) {
            let _ = self.sandbox.kill();
            return Err(e.into());
        }
        let code_ms = t0.elapsed().as_secs_f64() * 1e3;
        if let Some(b) = &mut self.base {
            b.loaded = true;
        }
        self.no_working_set_of_the_base();
        self.record.code_dir = cfg.code_dir.clone();
        self.function_version = cfg.function_version.clone();
        // THAW_LOAD_SERVE=0: load as for a capture (the runtime compacts its heap
        // first), the baseline of bench/repurpose.py.
        self.load_as(cfg, std::env::var("THAW_LOAD_SERVE").as_deref() != Ok("0"))?;
        let total_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.start = StartInfo {
            kind: "repurposed",
            sandbox_ms: 0.0,
            init_ms: total_ms,
            phases: vec![("code", code_ms), ("load", total_ms - code_ms)],
            phases_cpu: vec![],
            prepared_sandbox: false,
        };
        info!(id = self.sandbox.id(), function = %cfg.function_name, code_ms, total_ms, "function loaded into a base instance");
        Ok(LoadIntoStats { code_ms, load_ms: total_ms - code_ms, total_ms })
    }

    /// Make this clean instance of a runtime's base (see [`Instance::load_into`]) an
    /// instance of the function whose snapshot `diff` is a diff on that base (issue
    /// #30, repurposing by diff): the function's code replaces /var/task and the diff's
    /// pages and process state are installed (see `repurpose.rs`). The function's init
    /// does not run again: this is a restore of the diff with no sandbox and no process
    /// made. `base` is the snapshot the instance was restored from.
    ///
    /// Refused (`InstanceError::Install(InstallError::Refused)`, or a layer refusal)
    /// when the diff is on another base or holds state an install does not give; the
    /// instance is then still a clean base instance ([`Instance::load_into`] can load
    /// the function instead). After any other error it is dead: kill it.
    pub fn install_diff(&mut self, diff: &LoadedSnapshot, base: &LoadedSnapshot) -> Result<LoadIntoStats, InstanceError> {
        let t0 = Instant::now();
        let refused = |why: String| -> InstanceError { crate::layers::LayerError::Refused(why).into() };
        let Some(b) = &self.base else { return Err(refused("the instance was not restored from a base".into())) };
        if b.loaded {
            return Err(refused("the instance serves a function already: reset it to its base first".into()));
        }
        if self.image_id != Some(base.id) || diff.image.base.as_ref().map(|r| r.state_crc) != Some(base.id) {
            return Err(refused("the function's snapshot is not a diff on this instance's base".into()));
        }
        let key = crate::layers::BaseKey::of(&diff.image.sandbox);
        if key != b.key {
            return Err(refused(format!("its base was built for {:?}, the function needs {:?}", b.key, key)));
        }
        if diff.image.sandbox.opt_dir.is_some() {
            return Err(refused("a function with layers (/opt) is not installed into a base instance yet".into()));
        }
        if self.tracking.is_none() {
            return Err(refused("the instance was not restored with write tracking (it could not be reset to its base)".into()));
        }
        diff.code_checked()?;
        // Refused here, before anything changes, when the images do not allow it.
        let plan = crate::repurpose::plan(&base.image, &diff.image, &diff.source.index)?;
        self.thaw()?;
        let record = diff.image.sandbox.clone();
        if let Err(e) = self.sandbox.replace_code(&record.code_dir) {
            let _ = self.sandbox.kill();
            return Err(e.into());
        }
        let code_ms = t0.elapsed().as_secs_f64() * 1e3;
        // The pages the function's first call touched (its working set, if recorded):
        // those the instance lacks are installed too, so the call does not fault them in.
        let ws = WorkingSet::load(&diff.dir, diff.id).and_then(|ws| diff.ws_pages(&ws, true).map(|(buf, _)| (ws, buf))).ok();
        let tracking = self.tracking.as_ref().expect("checked above");
        let ws = ws.as_ref().map(|(ws, buf)| (ws, buf.as_ref()));
        let st = match crate::repurpose::install(self.sandbox.pid(), &base.image, &diff.image, &diff.source, tracking, &plan, ws) {
            Ok(st) => st,
            Err(e @ crate::repurpose::InstallError::Refused(_)) => return Err(e.into()),
            Err(e) => {
                let _ = self.sandbox.kill();
                return Err(e.into());
            }
        };
        if let Some(b) = &mut self.base {
            b.loaded = true;
        }
        self.no_working_set_of_the_base();
        let _ = self.channel.take_logs();
        self.record = record;
        self.function_version = LATEST_VERSION.into();
        let mut phases = vec![("code", code_ms)];
        phases.extend(st.phases.iter().copied());
        if let Some(ms) = self.restore_notice()? {
            phases.push(("after_restore", ms));
        }
        let total_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.start = StartInfo { kind: "repurposed-diff", sandbox_ms: 0.0, init_ms: total_ms, phases, phases_cpu: vec![], prepared_sandbox: false };
        info!(id = self.sandbox.id(), diff = %diff.dir.display(), code_ms, total_ms, pages_written = st.pages_written, pages_installed = st.pages_installed,
            "function's diff installed into a base instance");
        Ok(LoadIntoStats { code_ms, load_ms: total_ms - code_ms, total_ms })
    }

    /// Tell the runtime it is a restored clone (it reseeds its randomness and runs its
    /// after-restore hooks), if its image asked to be told; how long that took.
    fn restore_notice(&mut self) -> Result<Option<f64>, InstanceError> {
        if !self.record.restore_notice {
            return Ok(None);
        }
        let th = Instant::now();
        match self.channel.restored(Duration::from_secs(30)) {
            Ok(()) => Ok(Some(th.elapsed().as_secs_f64() * 1e3)),
            Err(ChannelError::Init(e)) => Err(InstanceError::AfterRestore(e)),
            Err(e) => Err(InstanceError::NotReady(e)),
        }
    }

    /// A base instance now serving a function: what it faults in from here on is the
    /// function's, not the base's. A recording instance's trace so far (its restore
    /// and the runtime's after-restore hooks) is the base's working set; nothing later
    /// is recorded, and a prefetching instance's misses do not extend it.
    fn no_working_set_of_the_base(&mut self) {
        if let (Some(p), Some(stats)) = (self.paging.as_mut(), self.page_stats.as_ref()) {
            if !p.first_done && p.mode == Paging::Record {
                p.write_recorded(stats);
            }
            p.first_done = true;
            stats.recording.store(false, Ordering::Relaxed);
            stats.trace.lock().expect("trace lock").clear();
        }
    }

    /// The idle instance's layout, page contents, registers, descriptors and signal
    /// state as named facts (see `inspect.rs`), for differential checks: after a reset
    /// they must be a fresh restore's. `snap` must be the snapshot it was restored from.
    pub fn inspect(&mut self, snap: &LoadedSnapshot) -> Result<std::collections::BTreeMap<String, String>, InstanceError> {
        // A frozen instance cannot reach a ptrace stop.
        self.thaw()?;
        Ok(crate::inspect::state(self.sandbox.pid(), &snap.source)?)
    }

    /// How many times `needle` occurs in the instance's readable memory, read from
    /// outside through /proc/PID/mem while it is idle (an isolation check: after a
    /// reset, nothing a previous invocation planted may be found). A page that
    /// cannot be read is one of a userfaultfd range never touched since the restore
    /// (/proc/PID/mem cannot fault those in): it holds nothing anyone wrote, so it
    /// is skipped alone (read as zeros), never its whole mapping.
    pub fn count_in_memory(&self, needle: &[u8]) -> Result<u64, InstanceError> {
        const CHUNK: usize = 64 << 10;
        let pid = self.sandbox.pid();
        let maps = crate::procfs::maps(pid).map_err(InstanceError::Io)?;
        let mem = crate::sys::mem::ProcMem::open(pid, false).map_err(InstanceError::Io)?;
        let page = crate::sys::PAGE_SIZE as usize;
        let mut n = 0;
        for m in maps.iter().filter(|m| m.read && !m.name.starts_with("[v")) {
            let mut buf = vec![0u8; m.len() as usize];
            if mem.read_exact_at(&mut buf, m.start).is_err() {
                for (i, chunk) in buf.chunks_mut(CHUNK).enumerate() {
                    let at = m.start + (i * CHUNK) as u64;
                    if mem.read_exact_at(chunk, at).is_err() {
                        for (j, p) in chunk.chunks_mut(page).enumerate() {
                            if mem.read_exact_at(p, at + (j * page) as u64).is_err() {
                                p.fill(0);
                            }
                        }
                    }
                }
            }
            n += buf.windows(needle.len()).filter(|w| *w == needle).count() as u64;
        }
        Ok(n)
    }

    /// Host pid of the instance's process (PID 1 of its sandbox).
    pub fn pid(&self) -> i32 {
        self.sandbox.pid()
    }

    /// Host pid of the instance's sandbox init (its namespace's reaper).
    pub fn sandbox_init_pid(&self) -> i32 {
        self.sandbox.init_pid()
    }

    /// The directory of the runtime base this instance was restored from, if it was
    /// (it can then be repurposed: [`Instance::load_into`], [`Instance::reset_to_base`]).
    pub fn base_dir(&self) -> Option<&Path> {
        self.base.as_ref().map(|b| b.dir.as_path())
    }

    /// Name reported to the function in its context (restored instances default to "function").
    pub fn set_function_name(&mut self, name: &str) {
        self.function_name = name.to_string();
    }

    /// ARN reported to the function in its context (`context.invoked_function_arn`):
    /// with the qualifier the caller used, if any.
    pub fn set_function_arn(&mut self, arn: &str) {
        self.function_arn = Some(arn.to_string());
    }

    /// Version the next invocations report (`context.function_version` and the
    /// runtime's `AWS_LAMBDA_FUNCTION_VERSION`): "$LATEST" or a published version's
    /// number. Sent with each invocation, so an instance restored from a snapshot that
    /// several versions share never reports the version the image was captured as.
    pub fn set_function_version(&mut self, version: &str) {
        self.function_version = version.to_string();
    }

    /// The version this instance reports.
    pub fn function_version(&self) -> &str {
        &self.function_version
    }

    /// Stop every process of the idle instance (cgroup freezer) until the next invoke,
    /// so background threads and children burn no CPU between invocations. On error
    /// the instance is left running (and still usable).
    pub fn freeze(&mut self) -> Result<(), InstanceError> {
        self.sandbox.cgroup().freeze().map_err(|e| InstanceError::Freezer(Box::new(e)))?;
        self.frozen = true;
        Ok(())
    }

    /// Give back the pages this idle instance copied from its snapshot's shared memory
    /// and holds unchanged (see `giveback.rs`): they are shared with its other
    /// instances again. Nothing to do (all zeros) for an instance that maps no shared
    /// memory, tracks writes for resets or is recording its working set. A frozen
    /// instance is thawed for it and frozen again. On error the instance was killed:
    /// discard it.
    pub fn give_back(&mut self) -> Result<crate::giveback::GiveBackStats, InstanceError> {
        let (Some(stats), Some(paging)) = (&self.page_stats, &self.paging) else {
            return Ok(Default::default());
        };
        let (stats, source) = (stats.clone(), paging.source.clone());
        // (No shared memory file: `shared_memory` is None unless the instance maps one.)
        if source.shared_memory(&stats).is_none() || self.tracking.is_some() || stats.recording.load(Ordering::Acquire) {
            return Ok(Default::default());
        }
        let was_frozen = self.frozen;
        self.thaw()?;
        let out = crate::giveback::give_back(self.sandbox.pid(), &source, &stats)?;
        if was_frozen {
            self.freeze()?;
        }
        Ok(out)
    }

    /// Let a frozen instance run again (done by [`Instance::invoke`] itself).
    pub fn thaw(&mut self) -> Result<(), InstanceError> {
        if self.frozen {
            self.sandbox.cgroup().thaw().map_err(|e| InstanceError::Freezer(Box::new(e)))?;
            self.frozen = false;
        }
        Ok(())
    }

    /// The instance's memory size (its cgroup limit), MiB.
    pub fn memory_mb(&self) -> u64 {
        self.memory_mb
    }

    /// Whether the instance is frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Whether the sandbox's memory limit killed something (check after a failed invoke).
    pub fn oom_killed(&self) -> bool {
        self.sandbox.cgroup().oom_killed()
    }

    /// Current memory charged to the sandbox's cgroup, in bytes.
    pub fn memory_usage_bytes(&self) -> Option<u64> {
        self.sandbox.cgroup().memory_usage_bytes().ok()
    }

    /// Most memory the sandbox's cgroup has been charged since it was created (the
    /// process's pages and the page cache it caused), in bytes; the current usage
    /// where the kernel keeps no peak.
    pub fn memory_peak_bytes(&self) -> Option<u64> {
        let cg = self.sandbox.cgroup();
        cg.memory_peak_bytes().or_else(|_| cg.memory_usage_bytes()).ok()
    }

    /// Invoke once. A function error is an `Ok(InvokeOutcome::Error)`; an `Err`
    /// means the instance is unusable (timed out, crashed) and should be discarded.
    pub fn invoke(&mut self, request_id: &str, payload: &str, timeout: Duration) -> Result<InvokeOutcome, InstanceError> {
        self.thaw()?;
        let mut req = InvokeRequest::new(request_id.into(), payload.into(), &self.function_name, self.memory_mb, timeout);
        if let Some(arn) = &self.function_arn {
            req.invoked_function_arn = arn.clone();
        }
        req.function_version = self.function_version.clone();
        req.log_stream_name = self.log_stream.name(&self.function_version);
        let out = self.channel.invoke(&req, timeout);
        if out.is_ok() {
            self.after_first_response();
        }
        out.map_err(|source| {
            // Give a crashed process a moment to be reapable so the error can say how it ended.
            let mut exit = None;
            if matches!(source, ChannelError::Closed { .. }) {
                for _ in 0..50 {
                    if let Ok(Some(st)) = self.sandbox.wait_exit() {
                        let oom = if self.oom_killed() {
                            format!(", out of memory at its {} MB limit", self.memory_mb)
                        } else {
                            String::new()
                        };
                        exit = Some(format!("{st:?}{oom}"));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            InstanceError::Invoke {
                exit,
                page_server: self.page_stats.as_ref().and_then(|s| s.error.lock().expect("stats lock").clone()),
                source,
            }
        })
    }

    /// REAP bookkeeping once the first response is back: a recording instance
    /// hands its trace to a background writer (the response is not delayed); a
    /// prefetching instance checks how many pages it needed beyond its working set.
    fn after_first_response(&mut self) {
        let (Some(p), Some(stats)) = (self.paging.as_mut(), self.page_stats.as_ref()) else { return };
        if p.first_done {
            return;
        }
        p.first_done = true;
        match p.mode {
            Paging::Record => p.write_recorded(stats),
            Paging::Prefetch | Paging::WsCached | Paging::Parallel => {
                stats.recording.store(false, Ordering::Relaxed);
                let missed = std::mem::take(&mut *stats.trace.lock().expect("trace lock"));
                // Faults on the image's pages only: one on a page released since the
                // restore is fresh memory, which no working set can hold (counted, a
                // function that frees and reuses large buffers, Node.js imageresize,
                // looked unrepresentative at every call and re-recorded forever).
                let misses = stats.image_faults.load(Ordering::Relaxed);
                let ws = p.prefetch.map(|x| x.ws_pages + x.ws_zero_pages).unwrap_or(0);
                let share = misses as f64 / (misses + ws).max(1) as f64;
                if share > p.threshold {
                    warn!(dir = %p.dir.display(), misses, ws_pages = ws, share, threshold = p.threshold,
                        "working set does not represent this invocation; it will be re-recorded on the next restore");
                    ws::invalidate(&p.dir);
                } else if p.merge_misses && !missed.is_empty() {
                    let (dir, id, source) = (p.dir.clone(), p.image_id, p.source.clone());
                    p.writer = std::thread::Builder::new()
                        .name("thaw-ws-merge".into())
                        .spawn(move || match ws::merge(&dir, id, &missed, source.file(), sealed_pages(&source).as_ref()) {
                            Ok(0) => {}
                            Ok(added) => info!(dir = %dir.display(), added, "working set extended by the pages this restore faulted in"),
                            Err(e) => warn!(error = %e, "extending the working set failed"),
                        })
                        .ok();
                }
            }
            _ => {}
        }
    }

    /// The paging mode this instance actually runs with (after `auto` and fallbacks).
    pub fn paging_mode(&self) -> Option<Paging> {
        self.paging.as_ref().map(|p| p.mode)
    }

    /// Working-set prefetch figures of this instance, if it prefetched.
    pub fn prefetch_stats(&self) -> Option<PrefetchStats> {
        self.paging.as_ref().and_then(|p| p.prefetch)
    }

    /// Pages recorded by a recording instance (after its first response).
    pub fn recorded_pages(&self) -> Option<usize> {
        self.paging.as_ref().and_then(|p| p.recorded)
    }

    /// Wait for background work (working-set writing) to finish.
    pub fn finish_background(&mut self) {
        if let Some(w) = self.paging.as_mut().and_then(|p| p.writer.take()) {
            let _ = w.join();
        }
    }

    /// Logs the function wrote since the last call.
    pub fn take_logs(&mut self) -> String {
        self.channel.take_logs()
    }

    pub fn page_stats(&self) -> PageStats {
        match &self.page_stats {
            Some(s) => PageStats {
                page_faults: s.faults.load(Ordering::Relaxed),
                zero_faults: s.zero_faults.load(Ordering::Relaxed),
                bytes_read_from_image: s.bytes_read.load(Ordering::Relaxed),
                pages_installed_upfront: s.pages_installed_upfront.load(Ordering::Relaxed),
                server_cpu_ms: s.cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
                throttled_ms: s.throttled_ns.load(Ordering::Relaxed) as f64 / 1e6,
                pages_shared: s.pages_shared.load(Ordering::Relaxed),
            },
            None => PageStats::default(),
        }
    }

    /// Capture this (booted, ready, never invoked) instance into `out`. The
    /// instance is consumed: after capture no process of it is left.
    pub fn capture(self, out: &Path) -> Result<(PathBuf, CaptureStats), InstanceError> {
        self.capture_as(out, capture::Layer::Full)
    }

    /// [`Instance::capture`] as a base or a diff (see `layers.rs`).
    pub fn capture_as(mut self, out: &Path, layer: capture::Layer<'_>) -> Result<(PathBuf, CaptureStats), InstanceError> {
        let mut record = self.record.clone();
        record.code_fingerprint =
            crate::fingerprint::of_bundle(&record.code_dir, record.opt_dir.as_deref()).map_err(InstanceError::Io)?;
        let result = capture::capture_with(self.sandbox.pid(), record, out, layer);
        if let Err(e) = self.sandbox.kill() {
            warn!(error = %e, "cleaning up the captured sandbox");
        }
        Ok(result?)
    }

    /// Tell an instance of a base (booted with [`Instance::boot_base`], or restored
    /// from a base into `cfg`'s sandbox) which function it is: the runtime takes
    /// `cfg`'s environment and runs the function's init, as a boot would.
    pub fn load_function(&mut self, cfg: &FunctionConfig) -> Result<(), InstanceError> {
        self.load_as(cfg, false)
    }

    /// [`Instance::load_function`]; `serve`: the instance serves next, it is not
    /// captured (see `Channel::load`).
    fn load_as(&mut self, cfg: &FunctionConfig, serve: bool) -> Result<(), InstanceError> {
        cfg.runtime.check_handler(&cfg.handler)?;
        let mut env = cfg.runtime.env(&cfg.handler, &cfg.function_name, &cfg.function_version, cfg.memory_mb, &cfg.env);
        env.retain(|(k, _)| k != SNAPSHOT_ENV && k != BASE_ENV);
        env.push((SNAPSHOT_ENV.into(), "1".into()));
        match self.channel.load(&env, serve, cfg.init_timeout) {
            Ok(r) => {
                self.record.restore_notice = r.restore_notice;
                self.record.handler = cfg.handler.clone();
                self.function_name = cfg.function_name.clone();
                Ok(())
            }
            Err(ChannelError::Init(e)) => Err(InstanceError::Init(e)),
            Err(e) if self.sandbox.cgroup().oom_killed() => Err(InstanceError::InitOutOfMemory { memory_mb: cfg.memory_mb, source: e }),
            Err(e) => Err(InstanceError::NotReady(e)),
        }
    }

    /// Kill the instance and clean up its sandbox (waits for a working-set writer).
    pub fn kill(mut self) {
        self.finish_background();
        self.channel.shutdown();
        if let Err(e) = self.sandbox.kill() {
            warn!(error = %e, "killing sandbox");
        }
        if let Some(mut ps) = self.pageserver.take() {
            ps.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_streams_are_named_as_lambda_names_them() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_417), (2025, 11, 25));
        let s = LogStream::new();
        let name = s.name("7");
        let (day, rest) = name.split_at(10);
        assert!(day.len() == 10 && day.chars().filter(|c| *c == '/').count() == 2, "{name}");
        assert!(rest.starts_with("/[7]") && rest.len() == 4 + 32 && rest[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
        assert_ne!(s.name("1"), LogStream::new().name("1"), "each environment has its own stream");
    }
}
