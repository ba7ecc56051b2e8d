//! The node's core: functions in memory (mirrored to the [`Registry`]), their
//! revisions and snapshots, and the per-function pools of instances.
//!
//! Invariants:
//! - Every instance counts in its function's `live` and in the node's [`Admission`]
//!   (one slot plus its revision's memory size) from the moment its start is
//!   reserved until it is handed to a worker to be killed. Reservations fail
//!   (TooManyRequests) at the per-function limit, or at the node's instance limit or
//!   memory budget once no idle instance of another function is left to evict;
//!   nothing queues.
//! - An instance serves one invocation at a time: it is either owned by a
//!   `Lease` (busy) or sits in its function's `idle` list.
//! - Idle instances always belong to the function's active revision; switching
//!   revision discards the idle ones, busy ones of an old revision are discarded
//!   when they come back.
//! - A revision's directory (code + snapshot) is removed when the revision is
//!   retired *and* the last instance using it is gone (`Drop for Revision`).
//! - Sandboxes are only created and killed on the long-lived worker threads.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::admission::{Admission, Refused};
use thaw_engine::instance::{FunctionConfig, Instance, InstanceError, LoadedSnapshot};
use thaw_engine::pageserver::Paging;
use thaw_runtime::{ChannelError, FunctionError, InvokeOutcome, Runtime};
use thiserror::Error;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::registry::{FunctionRecord, FunctionSettings, Registry, RegistryError, RevisionRecord};

mod settings;
mod layer_versions;
pub use layer_versions::{LayerError, PublishLayer};
mod provisioned;
mod update;
mod versions;
mod snapstore;
pub mod layered;
pub use snapstore::{SnapStoreError, SnapshotStore};
use snapstore::SnapshotSlot;
pub use settings::{check_tags, AccountSettings, SettingsError};
pub use update::ConfigChange;
pub use provisioned::ProvisionedView;
pub use versions::{VersionError, VersionView, LATEST};
use crate::workers::{WorkerError, WorkerPool};

/// How long a function's init may take while its snapshot is built.
pub const INIT_TIMEOUT: Duration = Duration::from_secs(60);
/// The account of function and role ARNs (a node, and the cluster's gateways, serve one).
pub const ACCOUNT: &str = "000000000000";

/// Node-wide settings.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// `<data_dir>/node`: registry, credentials, revisions.
    pub state_dir: PathBuf,
    /// Runtime shims (from `thaw_runtime::runtimes::install_shims`).
    pub runtime_dir: PathBuf,
    pub region: String,
    pub account: String,
    pub keep_alive: Duration,
    pub max_per_function: usize,
    pub max_instances: usize,
    /// Sum of the memory sizes of all live instances may not exceed this (MiB).
    pub memory_budget_mb: u64,
    pub instance_workers: usize,
    pub build_workers: usize,
    /// How restored instances get their memory; the one place to change the mode.
    pub paging: Paging,
    pub event_retry_delay: Duration,
    pub event_max_retries: u32,
    pub event_concurrency: usize,
    /// Freeze idle instances (cgroup freezer) between invocations, as Lambda does.
    pub freeze_idle: bool,
    /// CPU the page server may spend per instance, as a share of its CPU limit (0: unbounded).
    pub fault_cpu_share: f64,
    /// Where snapshots are published and fetched from (`--snapshot-store`), with this
    /// node's cache of them; None: snapshots stay in the revisions' directories.
    pub snapshot_store: Option<Arc<SnapshotStore>>,
    /// Bases for layered snapshots (None: every snapshot is a full image).
    pub bases: Option<layered::Bases>,
    /// Sandboxes prepared ahead of restores (`--sandbox-pool`; None: each restore
    /// creates its own).
    pub sandbox_pool: Option<Arc<thaw_sandbox::SandboxPool>>,
}

#[derive(Debug, Error)]
pub enum NodeError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Workers(#[from] WorkerError),
    #[error("creating the node directory {path}")]
    Dir { path: PathBuf, #[source] source: std::io::Error },
}

/// Why an invocation could not be run (as opposed to a function that ran and failed).
#[derive(Debug, Error)]
pub enum InvokeError {
    #[error("Function not found: {0}")]
    NotFound(String),
    #[error("The operation cannot be performed at this time. The function is currently in the following state: {state}")]
    NotReady { state: String },
    #[error("Rate Exceeded.")]
    Throttled { reason: &'static str },
    #[error("Rate Exceeded: the node's memory budget is used up ({used_mb} of {budget_mb} MB committed to live instances, {need_mb} MB needed) and no idle instance is left to evict")]
    MemoryBudget { need_mb: u64, used_mb: u64, budget_mb: u64 },
    #[error("no instance could be started for {function}")]
    Start { function: String, #[source] source: Box<InstanceError> },
    #[error(transparent)]
    Workers(#[from] WorkerError),
    #[error("the node is shutting down")]
    ShuttingDown,
}

/// Errors of deploy operations (create, update, delete).
#[derive(Debug, Error)]
pub enum DeployError {
    #[error("Function already exist: {0}")]
    Exists(String),
    #[error("Function not found: {0}")]
    NotFound(String),
    #[error("The operation cannot be performed at this time. An update is in progress for resource: {0}")]
    InProgress(String),
    #[error(transparent)]
    Bundle(#[from] crate::bundle::BundleError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("unpacking the bundle")]
    Join(#[source] tokio::task::JoinError),
    #[error("The Revision Id provided does not match the latest Revision Id. Call the GetFunction/GetAlias API to retrieve the latest Revision Id")]
    RevisionMismatch,
    #[error("copying the code of {name} for its new configuration")]
    Copy { name: String, #[source] source: std::io::Error },
    #[error(transparent)]
    Layer(#[from] LayerError),
}

/// A validated deployment (code + configuration baked into the snapshot).
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    pub name: String,
    pub runtime: String,
    pub role: String,
    pub handler: String,
    pub description: String,
    pub timeout_s: u64,
    pub memory_mb: u64,
    pub env: BTreeMap<String, String>,
    /// Layer version ARNs, extracted in this order under /opt.
    pub layers: Vec<String>,
}

/// One deployed revision, shared by its instances.
pub struct Revision {
    pub id: i64,
    pub dir: PathBuf,
    boot: FunctionConfig,
    snapshot: SnapshotSlot,
    pub snapshot_bytes: AtomicU64,
    retired: AtomicBool,
}

/// Most idle instances one start may evict to make room.
const MAX_EVICTIONS_PER_START: usize = 64;

impl Revision {
    /// The memory size of this revision's instances (MiB).
    pub fn memory_mb(&self) -> u64 {
        self.boot.memory_mb
    }

    fn new(rec: &RevisionRecord, name: &str, cfg: &NodeConfig) -> Revision {
        let runtime = crate::runtimes::engine_runtime(&rec.runtime).unwrap_or(Runtime::Python3);
        let mut boot = FunctionConfig::new(runtime, &rec.handler, rec.dir.join("code"), cfg.runtime_dir.clone());
        boot.memory_mb = rec.memory_mb;
        boot.function_name = name.to_string();
        boot.opt_dir = (!rec.layers.is_empty()).then(|| rec.dir.join("opt"));
        boot.env = rec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        // Reserved keys (the API refuses them from users): the node's region, as Lambda sets it.
        boot.env.push(("AWS_REGION".into(), cfg.region.clone()));
        boot.env.push(("AWS_DEFAULT_REGION".into(), cfg.region.clone()));
        boot.init_timeout = INIT_TIMEOUT;
        let bundle = snapstore::BundlePrint::new(boot.code_dir.clone(), boot.opt_dir.clone());
        Revision {
            id: rec.id,
            dir: rec.dir.clone(),
            boot,
            snapshot: SnapshotSlot::new(
                rec.dir.join("snapshot"),
                rec.snapshot_id.clone(),
                rec.snapshot_adopted,
                cfg.snapshot_store.clone(),
                snapstore::OpenSettings { fault_cpu_share: cfg.fault_cpu_share, sandboxes: cfg.sandbox_pool.clone() },
                bundle,
            ),
            snapshot_bytes: AtomicU64::new(rec.snapshot_bytes.unwrap_or(0)),
            retired: AtomicBool::new(false),
        }
    }

    fn snapshot_dir(&self) -> PathBuf {
        self.dir.join("snapshot")
    }

    /// The opened snapshot (opened, or fetched from the store, on first use; shared
    /// afterwards). Blocks: call from worker threads.
    fn loaded(&self) -> Result<Arc<LoadedSnapshot>, String> {
        self.snapshot.get()
    }

    pub fn snapshot_bytes(&self) -> u64 {
        self.snapshot_bytes.load(Ordering::Acquire)
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }
}

impl Drop for Revision {
    fn drop(&mut self) {
        if self.retired.load(Ordering::Acquire) {
            self.snapshot.retire();
            match std::fs::remove_dir_all(&self.dir) {
                Ok(()) => debug!(dir = %self.dir.display(), "removed retired revision"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn!(dir = %self.dir.display(), error = %e, "removing a retired revision"),
            }
        }
    }
}

/// `a: b: c` for an error and its sources.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

struct Idle {
    inst: Instance,
    rev: Arc<Revision>,
    since: Instant,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FunctionCounters {
    pub invocations: u64,
    pub errors: u64,
    pub starts_warm: u64,
    pub starts_cold: u64,
    pub events_done: u64,
    pub events_dropped: u64,
    pub peak_instances: usize,
    /// In-place resets after an invocation (`thaw:isolation=invocation`), and resets refused
    /// (the instance was discarded instead).
    pub resets: u64,
    pub resets_refused: u64,
}

struct FnState {
    rec: FunctionRecord,
    active: Option<Arc<Revision>>,
    idle: Vec<Idle>,
    live: usize,
    busy: usize,
    /// Directory of the revision being built, if any.
    building: Option<PathBuf>,
    deleted: bool,
    counters: FunctionCounters,
    /// Reserved concurrency and tags (see `node/settings.rs`).
    settings: FunctionSettings,
    /// Published versions and aliases (see `node/versions.rs`).
    versions: BTreeMap<u64, versions::Published>,
    aliases: BTreeMap<String, crate::registry::AliasRecord>,
    /// Provisioned concurrency per version (see `node/provisioned.rs`).
    provisioned: BTreeMap<u64, provisioned::Provisioned>,
}

pub struct Function {
    pub name: String,
    st: Mutex<FnState>,
}

impl Function {
    fn lock(&self) -> MutexGuard<'_, FnState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An instance checked out for one invocation.
pub struct Lease {
    inst: Instance,
    rev: Arc<Revision>,
    /// Reset the instance in place after the invocation (tag `thaw:isolation=invocation`).
    isolate: bool,
    /// "warm", "boot", "restore-lazy", ...
    pub kind: &'static str,
    /// Time to get the instance ready (0 for warm).
    pub start_ms: f64,
}

/// How a function invocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The handler raised (instance kept).
    Handled,
    Timeout,
    OutOfMemory,
    Crash,
    ResponseTooLarge,
}

impl ErrorKind {
    pub fn label(&self) -> &'static str {
        match self {
            ErrorKind::Handled => "function_error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::OutOfMemory => "oom",
            ErrorKind::Crash => "crash",
            ErrorKind::ResponseTooLarge => "response_too_large",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Ok(String),
    Error(FunctionError, ErrorKind),
}

/// The result of running one invocation.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub request_id: String,
    pub outcome: Outcome,
    pub logs: String,
    pub start_kind: &'static str,
    pub start_ms: f64,
    pub invoke_ms: f64,
    pub memory_mb: u64,
    pub max_memory_used_mb: u64,
}

/// Lambda's limit for a synchronous response.
pub const MAX_RESPONSE: usize = 6 * 1024 * 1024;

pub struct Node {
    pub cfg: NodeConfig,
    pub registry: Registry,
    pub metrics: Metrics,
    instance_workers: WorkerPool,
    build_workers: WorkerPool,
    functions: Mutex<HashMap<String, Arc<Function>>>,
    admission: Admission,
    shutting_down: AtomicBool,
    builds: AtomicUsize,
    /// Serialises reserved-concurrency changes (the sum over functions is checked).
    reserving: Mutex<()>,
    pub events_wake: Notify,
    pub started: Instant,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Lambda's LastModified format.
pub fn timestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3f+0000").to_string()
}

impl Node {
    /// Open the registry under `cfg.state_dir`, load the functions and resume interrupted builds.
    pub fn start(cfg: NodeConfig) -> Result<Arc<Node>, NodeError> {
        let revisions = cfg.state_dir.join("revisions");
        std::fs::create_dir_all(&revisions).map_err(|source| NodeError::Dir { path: revisions.clone(), source })?;
        let registry = Registry::open(&cfg.state_dir.join("registry.sqlite"))?;
        let node = Arc::new(Node {
            instance_workers: WorkerPool::new("instance", cfg.instance_workers)?,
            admission: Admission::new(cfg.max_instances, cfg.memory_budget_mb),
            build_workers: WorkerPool::new("build", cfg.build_workers)?,
            cfg,
            registry,
            metrics: Metrics::new(),
            functions: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            builds: AtomicUsize::new(0),
            reserving: Mutex::new(()),
            events_wake: Notify::new(),
            started: Instant::now(),
        });
        node.load()?;
        Ok(node)
    }

    fn load(self: &Arc<Self>) -> Result<(), NodeError> {
        for mut rec in self.registry.list_functions()? {
            let active = match rec.active_revision {
                Some(id) => self.registry.get_revision(id)?.map(|r| Arc::new(Revision::new(&r, &rec.name, &self.cfg))),
                None => None,
            };
            let mut resume = None;
            if let Some(latest) = rec.latest_revision.filter(|l| Some(*l) != rec.active_revision) {
                match self.registry.get_revision(latest)? {
                    Some(r) if r.status == "building" => resume = Some(r),
                    _ => {}
                }
            }
            let versions = self.load_versions(&rec.name, active.as_ref())?;
            let keep: Vec<i64> = [rec.active_revision, resume.as_ref().map(|r| r.id)]
                .into_iter()
                .flatten()
                .chain(versions.values().map(|p| p.rec.revision))
                .collect();
            for (id, dir) in self.registry.other_revisions(&rec.name, &keep)? {
                self.forget_stored(id);
                let _ = std::fs::remove_dir_all(&dir);
                self.registry.delete_revision(id)?;
            }
            if resume.is_none() && rec.last_update_status == "InProgress" {
                // The build it waited for is gone; report it failed rather than pending forever.
                rec.last_update_status = "Failed".into();
                rec.last_update_status_reason = Some("The node restarted while the update was in progress.".into());
                rec.last_update_status_reason_code = Some("InternalError".into());
                if active.is_none() {
                    rec.state = "Failed".into();
                    rec.state_reason = rec.last_update_status_reason.clone();
                    rec.state_reason_code = Some("InternalError".into());
                }
                self.registry.update_function(&rec)?;
            }
            if let Some(a) = &active {
                self.metrics.snapshot_bytes.add(a.snapshot_bytes() as i64);
            }
            let name = rec.name.clone();
            let f = Arc::new(Function {
                name: name.clone(),
                st: Mutex::new(FnState {
                    rec,
                    active,
                    idle: Vec::new(),
                    live: 0,
                    busy: 0,
                    building: resume.as_ref().map(|r| r.dir.clone()),
                    deleted: false,
                    counters: FunctionCounters::default(),
                    settings: self.registry.get_settings(&name)?,
                    versions,
                    aliases: self.load_aliases(&name)?,
                    provisioned: self.load_provisioned(&name)?,
                }),
            });
            self.functions_map().insert(name.clone(), f.clone());
            if let Some(r) = resume {
                info!(function = %name, revision = r.id, "resuming an interrupted build");
                self.spawn_build(f, r);
            }
        }
        self.metrics.events_pending.set(self.registry.pending_events()? as i64);
        self.publish_pending();
        self.take_bundle_prints();
        Ok(())
    }

    /// Fingerprint the bundle of every revision that serves, on a thread of its own,
    /// so the first cold start of each after a restart finds it taken (issue #35).
    fn take_bundle_prints(&self) {
        let revs: Vec<Arc<Revision>> = self
            .functions_map()
            .values()
            .flat_map(|f| {
                let st = f.lock();
                st.active.iter().chain(st.versions.values().map(|p| &p.rev)).filter(|r| r.boot.runtime.snapshots()).cloned().collect::<Vec<_>>()
            })
            .collect();
        if revs.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new().name("thaw-bundle-prints".into()).spawn(move || {
            let t0 = Instant::now();
            for r in &revs {
                if let Err(e) = r.snapshot.bundle.take() {
                    warn!(revision = r.id, error = %e, "cannot fingerprint a revision's bundle; its snapshot will not open");
                }
            }
            debug!(revisions = revs.len(), ms = t0.elapsed().as_secs_f64() * 1e3, "bundles fingerprinted");
        });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start fingerprinting bundles; each is fingerprinted when first opened");
        }
    }

    fn functions_map(&self) -> MutexGuard<'_, HashMap<String, Arc<Function>>> {
        self.functions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn function(&self, name: &str) -> Option<Arc<Function>> {
        self.functions_map().get(name).cloned()
    }

    pub fn arn(&self, name: &str) -> String {
        format!("arn:aws:lambda:{}:{}:function:{name}", self.cfg.region, self.cfg.account)
    }

    /// Whether `name` can take invocations now (exists and has an active revision).
    pub fn check_invocable(&self, name: &str) -> Result<(), InvokeError> {
        let f = self.function(name).ok_or_else(|| InvokeError::NotFound(self.arn(name)))?;
        let st = f.lock();
        match st.active {
            Some(_) => Ok(()),
            None => Err(InvokeError::NotReady { state: st.rec.state.clone() }),
        }
    }

    /// The stored snapshot the function's active revision serves from, and whether
    /// another node published it (adopted). None: not active yet, or not stored.
    pub fn active_snapshot(&self, name: &str) -> Option<(String, bool)> {
        let f = self.function(name)?;
        let st = f.lock();
        let rev = st.active.as_ref()?;
        Some((rev.snapshot.stored_id()?, rev.snapshot.adopted()))
    }

    /// The function's active revision, serving from an adopted snapshot, serves from
    /// `id` from now on (its builder published it again, e.g. with the working set its
    /// first invocation recorded, and deletes the old one): the next open fetches `id`;
    /// the snapshot open now stays until unused. Whether anything changed.
    pub fn readopt(&self, name: &str, id: &str) -> bool {
        let Some(f) = self.function(name) else { return false };
        let st = f.lock();
        let Some(rev) = st.active.as_ref().filter(|r| r.snapshot.adopted() && r.snapshot.stored_id().as_deref() != Some(id)) else { return false };
        rev.snapshot.set_stored(id.to_string());
        if let Err(e) = self.registry.set_adopted_snapshot(rev.id, id) {
            warn!(function = %name, error = %error_chain(&e), "recording an adopted snapshot");
        }
        true
    }

    pub fn record(&self, name: &str) -> Option<FunctionRecord> {
        self.function(name).map(|f| f.lock().rec.clone())
    }

    /// All function records, by name.
    pub fn records(&self) -> Vec<FunctionRecord> {
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        let mut out: Vec<FunctionRecord> = fs.iter().map(|f| f.lock().rec.clone()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn new_revision_dir(&self, name: &str) -> PathBuf {
        self.cfg.state_dir.join("revisions").join(format!("{name}-{}", uuid::Uuid::new_v4().simple()))
    }

    /// Unpack `zip` into a new revision directory (off the async threads).
    async fn unpack(&self, name: &str, zip: Arc<Vec<u8>>) -> Result<(PathBuf, u64), DeployError> {
        let dir = self.new_revision_dir(name);
        let d = dir.clone();
        let res = tokio::task::spawn_blocking(move || crate::bundle::extract(&zip, &d.join("code"))).await.map_err(DeployError::Join)?;
        match res {
            Ok(n) => Ok((dir, n)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e.into())
            }
        }
    }

    /// Revision `rev` serves from stored snapshot `adopt` (another node's), if the node
    /// has a store.
    fn adopting(&self, rev: &mut RevisionRecord, adopt: Option<String>) {
        if let Some(id) = adopt.filter(|_| self.cfg.snapshot_store.is_some()) {
            (rev.snapshot_id, rev.snapshot_adopted) = (Some(id), true);
        }
    }

    fn revision_record(spec: &FunctionSpec, dir: PathBuf, sha: &str, size: u64) -> RevisionRecord {
        RevisionRecord {
            id: 0,
            function: spec.name.clone(),
            code_sha256: sha.to_string(),
            code_size: size,
            dir,
            runtime: spec.runtime.clone(),
            handler: spec.handler.clone(),
            memory_mb: spec.memory_mb,
            env: spec.env.clone(),
            status: "building".into(),
            error: None,
            snapshot_bytes: None,
            snapshot_id: None,
            snapshot_adopted: false,
            layers: spec.layers.clone(),
        }
    }

    /// Give the revision in `dir` (code in `dir/code`, `code_bytes` of it) its `opt/`:
    /// `layers` resolved and extracted in order. `dir` is removed on failure.
    async fn add_layers(&self, dir: &Path, layers: &[String], code_bytes: u64) -> Result<(), DeployError> {
        if layers.is_empty() {
            return Ok(());
        }
        let res = match self.resolve_layers(layers) {
            Ok(recs) => self.materialize_layers(recs, dir.join("opt"), code_bytes).await,
            Err(e) => Err(e),
        };
        res.map_err(|e| {
            let _ = std::fs::remove_dir_all(dir);
            e.into()
        })
    }

    /// Copy the `opt/` of revision `from` (if it has one) into the new revision `dir`
    /// (its layers unchanged). `dir` is removed on failure.
    async fn copy_layers(&self, name: &str, from: Option<i64>, dir: &Path) -> Result<(), DeployError> {
        let Some(src) = from.and_then(|id| self.registry.get_revision(id).ok().flatten()).map(|r| r.dir.join("opt")) else {
            return Ok(());
        };
        if !src.is_dir() {
            return Ok(());
        }
        let dst = dir.join("opt");
        let copied = tokio::task::spawn_blocking(move || crate::bundle::overlay_tree(&src, &dst)).await.map_err(DeployError::Join)?;
        copied.map(|_| ()).map_err(|source| {
            let _ = std::fs::remove_dir_all(dir);
            DeployError::Copy { name: name.to_string(), source }
        })
    }

    /// CreateFunction: unpack, register as Pending, build the snapshot in the background.
    pub async fn create_function(self: &Arc<Self>, spec: FunctionSpec, zip: Vec<u8>) -> Result<FunctionRecord, DeployError> {
        self.create_function_adopting(spec, zip, None).await
    }

    /// [`Node::create_function`] serving from `adopt`, a stored snapshot another node
    /// published of this very function (same bundle and configuration: a cluster's
    /// builder), instead of capturing one: the build fetches and opens it, and
    /// captures only if it does not serve here (another bundle, a store down). The
    /// node never deletes or replaces an adopted snapshot. Without a store, `adopt`
    /// is ignored.
    pub async fn create_function_adopting(self: &Arc<Self>, spec: FunctionSpec, zip: Vec<u8>, adopt: Option<String>) -> Result<FunctionRecord, DeployError> {
        if self.function(&spec.name).is_some() {
            return Err(DeployError::Exists(spec.name));
        }
        let sha = crate::bundle::code_sha256(&zip);
        let size = zip.len() as u64;
        let (dir, code_bytes) = self.unpack(&spec.name, Arc::new(zip)).await?;
        self.add_layers(&dir, &spec.layers, code_bytes).await?;
        let mut rev = Self::revision_record(&spec, dir.clone(), &sha, size);
        self.adopting(&mut rev, adopt);
        let rec = FunctionRecord {
            name: spec.name.clone(),
            runtime: spec.runtime.clone(),
            role: spec.role.clone(),
            handler: spec.handler.clone(),
            description: spec.description.clone(),
            timeout_s: spec.timeout_s,
            memory_mb: spec.memory_mb,
            env: spec.env.clone(),
            state: "Pending".into(),
            state_reason: Some("The function is being created.".into()),
            state_reason_code: Some("Creating".into()),
            last_update_status: "InProgress".into(),
            last_update_status_reason: Some("The function is being created.".into()),
            last_update_status_reason_code: Some("Creating".into()),
            last_modified: timestamp(),
            revision_id: uuid::Uuid::new_v4().to_string(),
            code_sha256: sha,
            code_size: size,
            latest_revision: None,
            active_revision: None,
            layers: spec.layers.clone(),
        };
        let f = {
            let mut map = self.functions_map();
            if map.contains_key(&spec.name) {
                drop(map);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(DeployError::Exists(spec.name));
            }
            let f = Arc::new(Function {
                name: spec.name.clone(),
                st: Mutex::new(FnState {
                    rec: rec.clone(),
                    active: None,
                    idle: Vec::new(),
                    live: 0,
                    busy: 0,
                    building: Some(dir.clone()),
                    deleted: false,
                    counters: FunctionCounters::default(),
                    settings: FunctionSettings::default(),
                    versions: BTreeMap::new(),
                    aliases: BTreeMap::new(),
                    provisioned: BTreeMap::new(),
                }),
            });
            map.insert(spec.name.clone(), f.clone());
            f
        };
        let persisted = (|| {
            rev.id = self.registry.insert_revision(&rev)?;
            let mut st = f.lock();
            st.rec.latest_revision = Some(rev.id);
            self.registry.insert_function(&st.rec)?;
            Ok::<_, RegistryError>(st.rec.clone())
        })();
        match persisted {
            Ok(rec) => {
                info!(function = %spec.name, revision = rev.id, "function created; building its snapshot");
                self.spawn_build(f, rev);
                Ok(rec)
            }
            Err(e) => {
                self.functions_map().remove(&spec.name);
                let _ = std::fs::remove_dir_all(&dir);
                Err(e.into())
            }
        }
    }

    /// UpdateFunctionCode: unpack, mark InProgress, build; the old revision serves meanwhile.
    pub async fn update_code(self: &Arc<Self>, name: &str, zip: Vec<u8>) -> Result<FunctionRecord, DeployError> {
        self.update_code_adopting(name, zip, None).await
    }

    /// [`Node::update_code`] serving the new revision from `adopt`, a stored snapshot
    /// of it another node published (see [`Node::create_function_adopting`]).
    pub async fn update_code_adopting(self: &Arc<Self>, name: &str, zip: Vec<u8>, adopt: Option<String>) -> Result<FunctionRecord, DeployError> {
        let f = self.function(name).ok_or_else(|| DeployError::NotFound(self.arn(name)))?;
        if f.lock().building.is_some() {
            return Err(DeployError::InProgress(self.arn(name)));
        }
        let sha = crate::bundle::code_sha256(&zip);
        let size = zip.len() as u64;
        let (dir, _) = self.unpack(name, Arc::new(zip)).await?;
        let latest = {
            let st = f.lock();
            st.rec.latest_revision.or(st.rec.active_revision)
        };
        self.copy_layers(name, latest, &dir).await?;
        self.start_revision(f, dir, sha, size, adopt, |_| {})
    }

    /// Register a new revision of `f` (its code unpacked in `dir`, its configuration
    /// the current one changed by `change`) and build its snapshot in the background;
    /// the active revision keeps serving until the new one is ready. `dir` is removed
    /// on failure.
    /// `adopt`: serve it from this stored snapshot another node published (see
    /// [`Node::create_function_adopting`]).
    fn start_revision(
        self: &Arc<Self>,
        f: Arc<Function>,
        dir: PathBuf,
        sha: String,
        size: u64,
        adopt: Option<String>,
        change: impl FnOnce(&mut FunctionSpec),
    ) -> Result<FunctionRecord, DeployError> {
        let name = f.name.as_str();
        let mut st = f.lock();
        if st.deleted {
            drop(st);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(DeployError::NotFound(self.arn(name)));
        }
        if st.building.is_some() {
            drop(st);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(DeployError::InProgress(self.arn(name)));
        }
        let mut spec = FunctionSpec {
            name: name.to_string(),
            runtime: st.rec.runtime.clone(),
            role: st.rec.role.clone(),
            handler: st.rec.handler.clone(),
            description: st.rec.description.clone(),
            timeout_s: st.rec.timeout_s,
            memory_mb: st.rec.memory_mb,
            env: st.rec.env.clone(),
            layers: st.rec.layers.clone(),
        };
        change(&mut spec);
        let mut rev = Self::revision_record(&spec, dir.clone(), &sha, size);
        self.adopting(&mut rev, adopt);
        let res = self.registry.insert_revision(&rev);
        let id = match res {
            Ok(id) => id,
            Err(e) => {
                drop(st);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        rev.id = id;
        let prev = st.rec.clone();
        st.rec.runtime = spec.runtime;
        st.rec.role = spec.role;
        st.rec.handler = spec.handler;
        st.rec.description = spec.description;
        st.rec.timeout_s = spec.timeout_s;
        st.rec.memory_mb = spec.memory_mb;
        st.rec.env = spec.env;
        st.rec.layers = spec.layers;
        st.rec.code_sha256 = sha;
        st.rec.code_size = size;
        st.rec.latest_revision = Some(id);
        st.rec.last_modified = timestamp();
        st.rec.revision_id = uuid::Uuid::new_v4().to_string();
        st.rec.last_update_status = "InProgress".into();
        st.rec.last_update_status_reason = Some("The function is being updated.".into());
        st.rec.last_update_status_reason_code = None;
        if st.active.is_none() {
            st.rec.state = "Pending".into();
            st.rec.state_reason = Some("The function is being created.".into());
            st.rec.state_reason_code = Some("Creating".into());
        }
        if let Err(e) = self.registry.update_function(&st.rec) {
            st.rec = prev;
            drop(st);
            let _ = self.registry.delete_revision(id);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
        st.building = Some(dir);
        let rec = st.rec.clone();
        drop(st);
        info!(function = %name, revision = id, "function updated; building its snapshot");
        self.spawn_build(f.clone(), rev);
        Ok(rec)
    }

    /// DeleteFunction: forget it, discard its idle instances, remove its files when unused.
    pub fn delete_function(&self, name: &str) -> Result<(), DeployError> {
        let f = self.functions_map().remove(name).ok_or_else(|| DeployError::NotFound(self.arn(name)))?;
        let (idle, active, building) = {
            let mut st = f.lock();
            st.deleted = true;
            let idle: Vec<Idle> = st.idle.drain(..).collect();
            st.live -= idle.len();
            for p in std::mem::take(&mut st.versions).into_values() {
                p.rev.retire();
            }
            (idle, st.active.take(), st.building.clone())
        };
        self.metrics.instances_idle.sub(idle.len() as i64);
        for i in idle {
            self.discard(i.inst);
        }
        let dirs = self.registry.delete_function(name)?.unwrap_or_default();
        if let Some(a) = &active {
            self.metrics.snapshot_bytes.sub(a.snapshot_bytes() as i64);
            a.retire();
        }
        for d in dirs {
            if Some(&d) != active.as_ref().map(|a| &a.dir) && Some(&d) != building.as_ref() {
                let _ = std::fs::remove_dir_all(&d);
            }
        }
        self.metrics.events_pending.set(self.registry.pending_events().unwrap_or(0) as i64);
        info!(function = %name, "function deleted");
        Ok(())
    }

    fn spawn_build(self: &Arc<Self>, f: Arc<Function>, rev: RevisionRecord) {
        let node = self.clone();
        self.builds.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            node.build(f, rev).await;
            node.builds.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Boot the revision once, capture it, and make it the active one.
    async fn build(self: &Arc<Self>, f: Arc<Function>, rec: RevisionRecord) {
        let rev = Arc::new(Revision::new(&rec, &f.name, &self.cfg));
        let t0 = Instant::now();
        let job_rev = rev.clone();
        let bases = self.cfg.bases.clone();
        let (node, rev_id) = (self.clone(), rec.id);
        let result = self
            .build_workers
            .run(move || -> Result<(u64, Option<String>), InstanceError> {
                if job_rev.snapshot.adopted() {
                    let id = job_rev.snapshot.stored_id().unwrap_or_default();
                    match job_rev.loaded() {
                        Ok(snap) => {
                            let bytes = dir_size(&snap.dir);
                            snap.prepare_sandboxes(0, Duration::ZERO);
                            node.metrics.snapshot_builds.with_label_values(&["adopted"]).inc();
                            info!(snapshot = %id, ms = t0.elapsed().as_secs_f64() * 1e3, "serving the stored snapshot another node published: no capture");
                            return Ok((bytes, None));
                        }
                        Err(e) => {
                            warn!(snapshot = %id, error = %e, "the stored snapshot another node published does not serve here; capturing one");
                            job_rev.snapshot.unadopt();
                            let _ = node.registry.set_snapshot_id(rev_id, None);
                        }
                    }
                }
                if !job_rev.boot.runtime.snapshots() {
                    // A custom runtime: boot once so an init error fails the deploy, as
                    // for the others; its instances are cold-booted (see `start_instance`).
                    Instance::boot(&job_rev.boot)?.kill();
                    info!(boot_ms = t0.elapsed().as_secs_f64() * 1e3, runtime = job_rev.boot.runtime.name(), "init checked; this runtime is served by cold boots (no snapshot)");
                    return Ok((0, None));
                }
                let snapdir = job_rev.snapshot_dir();
                let _ = std::fs::remove_dir_all(&snapdir);
                let (dir, stats) = layered::capture(&job_rev.boot, &snapdir, bases.as_ref())?;
                node.metrics.snapshot_builds.with_label_values(&["captured"]).inc();
                let bytes = dir_size(&dir);
                info!(boot_capture_ms = t0.elapsed().as_secs_f64() * 1e3, pages = stats.pages_stored, bytes, "snapshot captured");
                let stored = job_rev.snapshot.publish().and_then(|r| {
                    r.inspect_err(|e| warn!(error = %error_chain(e), "publishing the snapshot failed; it serves from this node's disk and is published at the next start"))
                        .ok()
                });
                // Open it here so the first invocation does not pay for it, and have its
                // sandboxes prepared (if the node keeps a pool) so its first cold start
                // takes one.
                match job_rev.loaded() {
                    Ok(snap) => drop(snap.prepare_sandboxes(0, Duration::ZERO)),
                    Err(e) => warn!(error = %e, "opening the new snapshot"),
                }
                Ok((bytes, stored))
            })
            .await;
        let result = match result {
            Ok(r) => r.map_err(|e| {
                let code = if matches!(e, InstanceError::Init(_)) { "FunctionError" } else { "InternalError" };
                let reason = match &e {
                    InstanceError::Init(fe) => format!("{}: {}", fe.error_type, fe.error_message),
                    other => error_chain(other),
                };
                (code, reason)
            }),
            Err(e) => Err(("InternalError", error_chain(&e))),
        };
        let mut st = f.lock();
        st.building = None;
        if st.deleted {
            rev.retire();
            return;
        }
        match result {
            Ok((bytes, stored)) => {
                let _ = self.registry.finish_revision(rec.id, "ready", None, Some(bytes));
                if let Some(id) = &stored {
                    let _ = self.registry.set_snapshot_id(rec.id, Some(id));
                }
                rev.snapshot_bytes.store(bytes, Ordering::Release);
                st.rec.state = "Active".into();
                st.rec.state_reason = None;
                st.rec.state_reason_code = None;
                st.rec.last_update_status = "Successful".into();
                st.rec.last_update_status_reason = None;
                st.rec.last_update_status_reason_code = None;
                st.rec.active_revision = Some(rec.id);
                self.metrics.snapshot_bytes.add(bytes as i64);
                let old = st.active.replace(rev);
                // The old revision's idle instances go, unless a published version still
                // serves from it (its revision then stays).
                let old = old.filter(|o| !st.versions.values().any(|p| Arc::ptr_eq(&p.rev, o)));
                let (stale, keep): (Vec<Idle>, Vec<Idle>) = st.idle.drain(..).partition(|i| old.as_ref().is_some_and(|o| Arc::ptr_eq(&i.rev, o)));
                st.idle = keep;
                st.live -= stale.len();
                if let Err(e) = self.registry.update_function(&st.rec) {
                    warn!(function = %f.name, error = %error_chain(&e), "persisting the function");
                }
                drop(st);
                self.metrics.instances_idle.sub(stale.len() as i64);
                for i in stale {
                    self.discard(i.inst);
                }
                if let Some(old) = old {
                    self.metrics.snapshot_bytes.sub(old.snapshot_bytes() as i64);
                    let _ = self.registry.delete_revision(old.id);
                    old.retire();
                }
                info!(function = %f.name, revision = rec.id, ms = t0.elapsed().as_secs_f64() * 1e3, "function active");
            }
            Err((code, reason)) => {
                let _ = self.registry.finish_revision(rec.id, "failed", Some(&reason), None);
                st.rec.last_update_status = "Failed".into();
                st.rec.last_update_status_reason = Some(reason.clone());
                st.rec.last_update_status_reason_code = Some(code.into());
                if st.active.is_none() {
                    st.rec.state = "Failed".into();
                    st.rec.state_reason = Some(reason.clone());
                    st.rec.state_reason_code = Some(code.into());
                }
                if let Err(e) = self.registry.update_function(&st.rec) {
                    warn!(function = %f.name, error = %error_chain(&e), "persisting the function");
                }
                drop(st);
                let _ = self.registry.delete_revision(rec.id);
                rev.retire();
                warn!(function = %f.name, revision = rec.id, reason = %reason, "build failed");
            }
        }
    }

    fn update_alive_gauge(&self) {
        self.metrics.instances_alive.set(self.admission.instances() as i64);
        self.metrics.memory_committed.set((self.admission.memory_mb() << 20) as i64);
    }

    /// Kill an instance on a worker thread (inline if the pool is gone) and release its slot.
    fn discard(&self, inst: Instance) {
        self.admission.release(inst.memory_mb());
        self.update_alive_gauge();
        let slot = Arc::new(Mutex::new(Some(inst)));
        let s2 = slot.clone();
        let queued = self.instance_workers.spawn(move || {
            if let Some(i) = s2.lock().ok().and_then(|mut g| g.take()) {
                i.kill();
            }
        });
        if queued.is_err() {
            if let Some(i) = slot.lock().ok().and_then(|mut g| g.take()) {
                i.kill();
            }
        }
    }

    /// Take one idle instance of another function (the least recently used) to free a node slot.
    fn evict_one_idle(&self, except: &str) -> bool {
        let fs: Vec<Arc<Function>> = self.functions_map().values().filter(|f| f.name != except).cloned().collect();
        let mut best: Option<(Arc<Function>, Instant)> = None;
        for f in fs {
            let st = f.lock();
            let held = provisioned::protected(&st);
            if let Some(oldest) = st.idle.iter().zip(&held).find(|(_, h)| !**h).map(|(i, _)| i.since) {
                if best.as_ref().is_none_or(|(_, t)| oldest < *t) {
                    drop(st);
                    best = Some((f, oldest));
                }
            }
        }
        let Some((f, _)) = best else { return false };
        let victim = {
            let mut st = f.lock();
            let held = provisioned::protected(&st);
            let Some(at) = held.iter().position(|h| !h) else { return false };
            st.live -= 1;
            st.idle.remove(at)
        };
        self.metrics.instances_idle.dec();
        debug!(function = %f.name, "evicting an idle instance to make room");
        self.discard(victim.inst);
        true
    }

    /// Get an instance: a warm one, or reserve a slot and restore one.
    /// An instance of `f`'s `version`: a warm one, else a new one restored (or, with
    /// `boot`, cold-booted: the retry of a call whose restored instance lost its memory).
    pub async fn acquire(&self, f: &Arc<Function>, version: Option<u64>, boot: bool) -> Result<Lease, InvokeError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(InvokeError::ShuttingDown);
        }
        let mut evicted = 0;
        let (rev, isolate) = loop {
            let mut st = f.lock();
            if st.deleted {
                return Err(InvokeError::NotFound(self.arn(&f.name)));
            }
            let rev = match version {
                None => st.active.clone().ok_or_else(|| InvokeError::NotReady { state: st.rec.state.clone() })?,
                Some(v) => st.versions.get(&v).map(|p| p.rev.clone()).ok_or_else(|| InvokeError::NotFound(format!("{}:{v}", self.arn(&f.name))))?,
            };
            let isolate = st.settings.isolation();
            if st.settings.reserved_concurrency.is_some_and(|r| st.busy >= r as usize) {
                return Err(InvokeError::Throttled { reason: "ReservedFunctionConcurrentInvocationLimitExceeded" });
            }
            // A custom runtime's version is in its bootstrap's environment from its boot
            // on: its warm instances serve that version only. A shim takes it per call.
            let fits = |i: &Idle| Arc::ptr_eq(&i.rev, &rev) && (rev.boot.runtime.snapshots() || i.inst.function_version() == version_label(version));
            if let Some(idle) = st.idle.iter().rposition(fits).filter(|_| !boot).map(|at| st.idle.remove(at)) {
                st.busy += 1;
                st.counters.starts_warm += 1;
                drop(st);
                self.metrics.instances_idle.dec();
                self.metrics.starts.with_label_values(&["warm"]).inc();
                return Ok(Lease { inst: idle.inst, rev: idle.rev, kind: "warm", start_ms: 0.0, isolate });
            }
            if st.live >= self.cfg.max_per_function {
                return Err(InvokeError::Throttled { reason: "ReservedFunctionConcurrentInvocationLimitExceeded" });
            }
            let need_mb = rev.memory_mb();
            if let Err(refused) = self.admission.admit(need_mb) {
                drop(st);
                // Idle instances of other functions make room, least recently used first
                // (as many as the memory needs; each eviction frees a slot and memory).
                let hopeless = matches!(refused, Refused::Memory { budget_mb, .. } if need_mb > budget_mb);
                if !hopeless && evicted < MAX_EVICTIONS_PER_START && self.evict_one_idle(&f.name) {
                    evicted += 1;
                    continue;
                }
                return Err(match refused {
                    Refused::Instances { .. } => InvokeError::Throttled { reason: "ConcurrentInvocationLimitExceeded" },
                    Refused::Memory { need_mb, used_mb, budget_mb } => InvokeError::MemoryBudget { need_mb, used_mb, budget_mb },
                });
            }
            st.live += 1;
            st.busy += 1;
            st.counters.starts_cold += 1;
            st.counters.peak_instances = st.counters.peak_instances.max(st.live);
            break (rev, isolate);
        };
        self.update_alive_gauge();
        let t0 = Instant::now();
        let name = f.name.clone();
        let paging = self.cfg.paging;
        let job_rev = rev.clone();
        let started = self
            .instance_workers
            .run(move || -> (Result<Instance, InstanceError>, bool) { start_instance(&job_rev, paging, &name, version, isolate, boot) })
            .await;
        let start_ms = t0.elapsed().as_secs_f64() * 1e3;
        let failure = match started {
            Ok((Ok(inst), fell_back)) => {
                if fell_back {
                    self.metrics.restore_fallbacks.inc();
                }
                let kind = inst.start.kind;
                self.metrics.starts.with_label_values(&[kind]).inc();
                self.metrics.start_seconds.with_label_values(&[kind]).observe(start_ms / 1e3);
                if self.cfg.sandbox_pool.is_some() && kind != "boot" {
                    let outcome = if inst.start.prepared_sandbox { "prepared" } else { "created" };
                    self.metrics.restore_sandboxes.with_label_values(&[outcome]).inc();
                }
                return Ok(Lease { inst, rev, kind, start_ms, isolate });
            }
            Ok((Err(e), _)) => InvokeError::Start { function: f.name.clone(), source: Box::new(e) },
            Err(e) => InvokeError::Workers(e),
        };
        {
            let mut st = f.lock();
            st.live -= 1;
            st.busy -= 1;
        }
        self.admission.release(rev.memory_mb());
        self.update_alive_gauge();
        warn!(function = %f.name, error = %error_chain(&failure), "no instance could be started");
        Err(failure)
    }

    /// Return an instance after an invocation: keep it warm if healthy, else discard it.
    pub fn release(&self, f: &Arc<Function>, lease: Lease, healthy: bool) {
        let mut st = f.lock();
        st.busy -= 1;
        let current = st.active.as_ref().is_some_and(|a| Arc::ptr_eq(a, &lease.rev)) || st.versions.values().any(|p| Arc::ptr_eq(&p.rev, &lease.rev));
        if healthy && current && !st.deleted && !self.shutting_down.load(Ordering::Acquire) {
            st.idle.push(Idle { inst: lease.inst, rev: lease.rev, since: Instant::now() });
            drop(st);
            self.metrics.instances_idle.inc();
            return;
        }
        st.live -= 1;
        drop(st);
        self.discard(lease.inst);
    }

    /// Run one invocation of `name` (sync API and event dispatcher share this).
    ///
    /// Runs as its own task, so a caller that goes away (client disconnect) cannot
    /// strand an instance or its slot half-way through.
    pub async fn invoke(self: &Arc<Self>, name: &str, request_id: &str, payload: String) -> Result<Invocation, InvokeError> {
        self.invoke_version(name, InvokeTarget::latest(), request_id, payload).await
    }

    /// [`Node::invoke`] of the version `target` names, reporting the qualifier it was called with.
    pub async fn invoke_version(self: &Arc<Self>, name: &str, target: InvokeTarget, request_id: &str, payload: String) -> Result<Invocation, InvokeError> {
        let (node, name, rid) = (self.clone(), name.to_string(), request_id.to_string());
        match tokio::spawn(async move { node.invoke_inner(&name, target, &rid, payload).await }).await {
            Ok(r) => r,
            Err(e) => Err(InvokeError::Start {
                function: request_id.to_string(),
                source: Box::new(InstanceError::Io(std::io::Error::other(format!("invoke task failed: {e}")))),
            }),
        }
    }

    async fn invoke_inner(&self, name: &str, target: InvokeTarget, request_id: &str, payload: String) -> Result<Invocation, InvokeError> {
        let f = self.function(name).ok_or_else(|| InvokeError::NotFound(self.arn(name)))?;
        let version = target.version;
        let (timeout_s, memory_mb) = {
            let st = f.lock();
            match version.and_then(|v| st.versions.get(&v)) {
                Some(p) => (p.rec.timeout_s, p.rev.memory_mb()),
                None => (st.rec.timeout_s, st.rec.memory_mb),
            }
        };
        // The platform could not give a restored instance its memory (its page server
        // failed: the snapshot's store went down mid-fetch, say). Not the function's
        // fault: the call runs again, once, on a cold boot.
        // Shared, not copied: only the rare retry needs it a second time.
        let payload = Arc::new(payload);
        let mut ran = self.run_once(&f, name, &target, request_id, payload.clone(), timeout_s, false).await?;
        if ran.0.kind != "boot" && matches!(&ran.1, Err(InstanceError::Invoke { page_server: Some(_), .. })) {
            if let Err(e) = &ran.1 {
                warn!(function = %name, request_id, error = %error_chain(e), "a restored instance lost its memory; retrying the call on a cold boot");
            }
            self.metrics.restore_fallbacks.inc();
            self.release(&f, ran.0, false);
            ran = self.run_once(&f, name, &target, request_id, payload, timeout_s, true).await?;
        }
        let (lease, result, invoke_ms, oom, logs, mem, reset) = ran;
        // A snapshot still arriving from the store fetches the rest now.
        lease.rev.snapshot.responded();
        self.metrics.invoke_seconds.with_label_values(&[]).observe(invoke_ms / 1e3);
        let (outcome, healthy) = match result {
            Ok(InvokeOutcome::Ok(text)) if text.len() > MAX_RESPONSE => (
                Outcome::Error(
                    FunctionError {
                        error_type: "Function.ResponseSizeTooLarge".into(),
                        error_message: format!(
                            "Response payload size exceeded maximum allowed payload size ({MAX_RESPONSE} bytes)."
                        ),
                        stack_trace: vec![],
                    },
                    ErrorKind::ResponseTooLarge,
                ),
                true,
            ),
            Ok(InvokeOutcome::Ok(text)) => (Outcome::Ok(text), true),
            Ok(InvokeOutcome::Error(e)) => (Outcome::Error(e, ErrorKind::Handled), true),
            Err(e) => {
                let (kind, err) = classify_failure(&e, oom, request_id, timeout_s, memory_mb);
                warn!(function = %name, request_id, kind = kind.label(), error = %error_chain(&e), "invocation failed; discarding the instance");
                (Outcome::Error(err, kind), false)
            }
        };
        let start_kind = lease.kind;
        let start_ms = lease.start_ms;
        if let Some(ok) = reset {
            let mut st = f.lock();
            if ok {
                st.counters.resets += 1;
            } else {
                st.counters.resets_refused += 1;
            }
            drop(st);
            self.metrics.resets.with_label_values(&[if ok { "done" } else { "refused" }]).inc();
        }
        self.release(&f, lease, healthy && reset != Some(false));
        let label = match &outcome {
            Outcome::Ok(_) => "ok",
            Outcome::Error(_, k) => k.label(),
        };
        self.metrics.invocations.with_label_values(&[name, label]).inc();
        {
            let mut st = f.lock();
            st.counters.invocations += 1;
            if label != "ok" {
                st.counters.errors += 1;
            }
        }
        if label != "ok" {
            self.metrics.errors.with_label_values(&[name, label]).inc();
        }
        debug!(function = %name, request_id, start = start_kind, invoke_ms, outcome = label, "invoked");
        if !logs.is_empty() {
            debug!(function = %name, request_id, logs = %logs.trim_end(), "function output");
        }
        Ok(Invocation {
            request_id: request_id.to_string(),
            outcome,
            logs,
            start_kind,
            start_ms,
            invoke_ms,
            memory_mb,
            max_memory_used_mb: mem.div_ceil(1 << 20),
        })
    }

    /// Take an instance (see [`Node::acquire`]) and run one invocation on it.
    #[allow(clippy::too_many_arguments)]
    async fn run_once(&self, f: &Arc<Function>, name: &str, target: &InvokeTarget, request_id: &str, payload: Arc<String>, timeout_s: u64, boot: bool) -> Result<Ran, InvokeError> {
        let version = target.version;
        let mut lease = self.acquire(f, version, boot).await?;
        // Per call, never from the image: versions share snapshots and warm instances.
        lease.inst.set_function_version(&target.version_label());
        lease.inst.set_function_arn(&target.invoked_arn(&self.arn(name)));
        let rid = request_id.to_string();
        let timeout = Duration::from_secs(timeout_s);
        let freeze = self.cfg.freeze_idle;
        let reserved_mb = lease.inst.memory_mb();
        let joined = tokio::task::spawn_blocking(move || {
            let mut lease = lease;
            let t = Instant::now();
            let r = lease.inst.invoke(&rid, &payload, timeout);
            let invoke_ms = t.elapsed().as_secs_f64() * 1e3;
            let oom = r.is_err() && lease.inst.oom_killed();
            let logs = lease.inst.take_logs();
            let mem = lease.inst.memory_peak_bytes().unwrap_or(0);
            // Isolation: nothing of this invocation may reach the next one. A reset the
            // engine cannot prove complete kills the instance (it is then discarded and
            // the next call restores a fresh one).
            let reset = (lease.isolate && r.is_ok()).then(|| {
                let done = lease.rev.loaded().map_err(|e| e.to_string()).and_then(|snap| lease.inst.reset(&snap).map_err(|e| error_chain(&e)));
                if let Err(e) = &done {
                    warn!(error = %e, "reset after the invocation refused; discarding the instance");
                }
                done.is_ok()
            });
            // Idle from here on: its threads and children stop until the next invoke
            // thaws it (~0.2 ms each way, measured). A failed freeze leaves it running.
            if freeze && r.is_ok() && reset != Some(false) {
                if let Err(e) = lease.inst.freeze() {
                    warn!(error = %error_chain(&e), "cannot freeze the idle instance; it keeps running");
                }
            }
            (lease, r, invoke_ms, oom, logs, mem, reset)
        })
        .await;
        match joined {
            Ok(v) => Ok(v),
            Err(e) => {
                // The blocking task panicked: the instance is lost with it; free its slot.
                let mut st = f.lock();
                st.busy -= 1;
                st.live -= 1;
                drop(st);
                self.admission.release(reserved_mb);
                self.update_alive_gauge();
                Err(InvokeError::Start {
                    function: name.to_string(),
                    source: Box::new(InstanceError::Io(std::io::Error::other(format!("invoke task failed: {e}")))),
                })
            }
        }
    }

    pub fn note_event(&self, name: &str, done: bool) {
        if let Some(f) = self.function(name) {
            let mut st = f.lock();
            if done {
                st.counters.events_done += 1;
            } else {
                st.counters.events_dropped += 1;
            }
        }
    }

    /// Destroy instances idle for longer than the keep-alive.
    pub fn reap_idle(self: &Arc<Self>) {
        if self.cfg.snapshot_store.is_some() {
            self.settle_lazy_snapshots();
            self.publish_working_sets();
        }
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        for f in fs {
            let expired: Vec<Idle> = {
                let mut st = f.lock();
                let keep = self.cfg.keep_alive;
                let mut held = provisioned::protected(&st).into_iter();
                let (old, fresh): (Vec<Idle>, Vec<Idle>) =
                    st.idle.drain(..).partition(|i| !held.next().unwrap_or(false) && i.since.elapsed() >= keep);
                st.idle = fresh;
                st.live -= old.len();
                old
            };
            if !expired.is_empty() {
                debug!(function = %f.name, n = expired.len(), "keep-alive expired");
                self.metrics.instances_idle.sub(expired.len() as i64);
                for i in expired {
                    self.discard(i.inst);
                }
            }
            if self.cfg.snapshot_store.is_some() {
                // Unpin cached snapshots nothing has used for a keep-alive period (after
                // publishing any working set a restore recorded in them).
                let st = f.lock();
                for rev in st.active.iter().chain(st.versions.values().map(|p| &p.rev)) {
                    if rev.snapshot.close_if_unused(self.cfg.keep_alive) {
                        debug!(function = %f.name, revision = rev.id, "closed an unused stored snapshot");
                    }
                }
            }
        }
    }

    /// Stop taking invocations and kill every idle instance (in-flight ones are discarded as they finish).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        for f in fs {
            let idle: Vec<Idle> = {
                let mut st = f.lock();
                let v: Vec<Idle> = st.idle.drain(..).collect();
                st.live -= v.len();
                v
            };
            self.metrics.instances_idle.sub(idle.len() as i64);
            for i in idle {
                self.discard(i.inst);
            }
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    pub fn instances_alive(&self) -> usize {
        self.admission.instances()
    }

    pub fn builds_running(&self) -> usize {
        self.builds.load(Ordering::Acquire)
    }

    /// Wait for the kill jobs and builds to finish, then stop the worker threads.
    pub fn finish_shutdown(&self) {
        self.build_workers.shutdown();
        self.instance_workers.shutdown();
    }

    /// The `/thaw/status` document.
    pub fn status(&self) -> serde_json::Value {
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        let mut funcs: Vec<serde_json::Value> = fs
            .iter()
            .map(|f| {
                let st = f.lock();
                let snap = st.active.as_ref().filter(|a| a.boot.runtime.snapshots()).map(|a| {
                    serde_json::json!({
                        "revision": a.id,
                        "dir": a.dir.join("snapshot"),
                        "bytes": a.snapshot_bytes(),
                        "loaded": a.snapshot.is_open(),
                        "stored": a.snapshot.stored_id(),
                        "fetch": a.snapshot.fetch_status(),
                    })
                });
                serde_json::json!({
                    "name": f.name,
                    "state": st.rec.state,
                    "last_update_status": st.rec.last_update_status,
                    "state_reason": st.rec.state_reason,
                    "memory_mb": st.rec.memory_mb,
                    "timeout_s": st.rec.timeout_s,
                    "instances": {"live": st.live, "busy": st.busy, "idle": st.idle.len()},
                    "building": st.building.is_some(),
                    "snapshot": snap,
                    "cold_start": if st.active.as_ref().is_some_and(|a| !a.boot.runtime.snapshots()) { "boot" } else { "restore" },
                    "counters": st.counters,
                })
            })
            .collect();
        funcs.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        serde_json::json!({
            "node": {
                "pid": std::process::id(),
                "uptime_s": self.started.elapsed().as_secs_f64(),
                "state_dir": self.cfg.state_dir,
                "instances_alive": self.instances_alive(),
                "max_instances": self.cfg.max_instances,
                "memory_committed_mb": self.admission.memory_mb(),
                "memory_budget_mb": self.admission.budget_mb(),
                "max_per_function": self.cfg.max_per_function,
                "keep_alive_s": self.cfg.keep_alive.as_secs_f64(),
                "paging": self.cfg.paging,
                "builds_running": self.builds_running(),
                "shutting_down": self.is_shutting_down(),
            },
            "events": {"pending": self.registry.pending_events().unwrap_or(0)},
            "snapshot_store": self.cfg.snapshot_store.as_ref().map(|s| s.status()),
            "bases": self.cfg.bases.as_ref().map(layered::describe),
            "sandbox_pool": self.cfg.sandbox_pool.as_ref().map(|p| p.stats()),
            "functions": funcs,
        })
    }
}

/// What an invocation runs and how it was named: the version (`None`: $LATEST) and
/// the qualifier the caller used (`None`: an unqualified call), which the function sees
/// in `context.function_version`, `AWS_LAMBDA_FUNCTION_VERSION` and
/// `context.invoked_function_arn`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InvokeTarget {
    pub version: Option<u64>,
    pub qualifier: Option<String>,
}

impl InvokeTarget {
    /// An unqualified call: $LATEST, the unqualified ARN.
    pub fn latest() -> InvokeTarget {
        InvokeTarget::default()
    }

    /// "$LATEST" or the version's number.
    pub fn version_label(&self) -> String {
        version_label(self.version)
    }

    /// The ARN the caller invoked: `base` with the qualifier it used, if any.
    pub fn invoked_arn(&self, base: &str) -> String {
        qualified(base, self.qualifier.as_deref())
    }
}

/// `base` with `:qualifier` when there is one (an ARN, or a function URL's name).
pub fn qualified(base: &str, qualifier: Option<&str>) -> String {
    match qualifier {
        Some(q) => format!("{base}:{q}"),
        None => base.to_string(),
    }
}

/// What [`Node::run_once`] gives: the lease, the outcome, invoke ms, whether the
/// instance was OOM-killed, its logs, its peak memory, and whether it was reset.
type Ran = (Lease, Result<InvokeOutcome, InstanceError>, f64, bool, String, u64, Option<bool>);

/// Lambda's name of a version (`None`: $LATEST).
pub fn version_label(version: Option<u64>) -> String {
    version.map_or_else(|| thaw_runtime::LATEST_VERSION.to_string(), |v| v.to_string())
}

/// Restore an instance (falling back to a cold boot). Runs on an instance worker.
/// The invoked ARN and the version are set by each invocation (`invoke_inner`).
/// `cold_boot`: boot without trying the snapshot (not counted as a fallback).
fn start_instance(rev: &Revision, paging: Paging, name: &str, version: Option<u64>, isolate: bool, cold_boot: bool) -> (Result<Instance, InstanceError>, bool) {
    let snap = if rev.boot.runtime.snapshots() && !cold_boot { Some(rev.loaded()) } else { None };
    match snap {
        None => {}
        Some(Ok(snap)) => {
            snap.set_track_writes(isolate);
            match Instance::restore(&snap, paging) {
                Ok(mut inst) => {
                    inst.set_function_name(name);
                    return (Ok(inst), false);
                }
                Err(e) => warn!(function = name, revision = rev.id, error = %error_chain(&e), "restore failed; falling back to a cold boot"),
            }
        }
        Some(Err(e)) => warn!(function = name, revision = rev.id, error = %e, "snapshot unavailable; falling back to a cold boot"),
    }
    let mut boot = rev.boot.clone();
    boot.function_version = version_label(version);
    let r = Instance::boot(&boot).map(|mut i| {
        i.set_function_name(name);
        i
    });
    (r, !cold_boot)
}

/// Map a broken instance to Lambda's error object.
fn classify_failure(e: &InstanceError, oom: bool, request_id: &str, timeout_s: u64, memory_mb: u64) -> (ErrorKind, FunctionError) {
    let fe = |t: &str, m: String| FunctionError { error_type: t.into(), error_message: m, stack_trace: vec![] };
    if matches!(e, InstanceError::Invoke { source: ChannelError::Timeout(_), .. }) {
        let ts = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
        return (
            ErrorKind::Timeout,
            fe("Sandbox.Timedout", format!("{ts} {request_id} Task timed out after {timeout_s}.00 seconds")),
        );
    }
    if oom {
        return (
            ErrorKind::OutOfMemory,
            fe(
                "Runtime.OutOfMemory",
                format!("RequestId: {request_id} Error: Runtime exited with error: signal: killed (the function exceeded its memory limit of {memory_mb} MB)"),
            ),
        );
    }
    let detail = match e {
        InstanceError::Invoke { exit: Some(x), .. } => format!("exited ({x})"),
        _ => "failed".to_string(),
    };
    (ErrorKind::Crash, fe("Runtime.ExitError", format!("RequestId: {request_id} Error: Runtime {detail}: {}", error_chain(e))))
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// Current time in ms (for the event queue).
pub fn clock_ms() -> i64 {
    now_ms()
}
