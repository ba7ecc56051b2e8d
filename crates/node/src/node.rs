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
pub use layer_versions::{LayerArns, LayerError, PublishLayer};
mod provisioned;
mod update;
mod deploy;
mod invoke;
mod lifecycle;
mod versions;
mod snapstore;
mod slot;
mod repurpose;
pub mod layered;
pub use snapstore::{SnapStoreError, SnapshotStore};
use slot::SnapshotSlot;
pub use settings::{changed_url, check_tags, AccountSettings, SettingsError};
pub use update::ConfigChange;
pub use provisioned::ProvisionedView;
pub use versions::{changed_alias, check_routing, AliasChange, VersionError, VersionSpec, VersionState, VersionView, LATEST};
use crate::workers::{WorkerError, WorkerPool};

/// With `--shared-memory-file auto`, a function's instances map their base's memory
/// file while it has at most this many (see `thaw_engine::sharedmem`): measured, a
/// file per snapshot costs less from about four instances of one function on.
pub const AUTO_BASE_FILE_UP_TO: usize = 2;
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
    /// `--shared-memory-file auto`: a function's first [`AUTO_BASE_FILE_UP_TO`] live
    /// instances map their base's memory file, later ones their snapshot's.
    pub shared_memory_auto: bool,
    /// Give back the unchanged pages of instances idle this long (see
    /// `thaw_engine::giveback`); None: never.
    pub give_back_after: Option<Duration>,
    /// CPU the page server may spend per instance, as a share of its CPU limit (0: unbounded).
    pub fault_cpu_share: f64,
    /// Where snapshots are published and fetched from (`--snapshot-store`), with this
    /// node's cache of them; None: snapshots stay in the revisions' directories.
    pub snapshot_store: Option<Arc<SnapshotStore>>,
    /// Bases for layered snapshots (None: every snapshot is a full image).
    pub bases: Option<layered::Bases>,
    /// Clean instances of each base kept to serve cold starts by loading a function
    /// into one (repurposing, issue #30); 0: none. Needs `bases`.
    pub base_pool: usize,
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
    /// What its cold starts cost, by way (see `repurpose::StartCosts`).
    start_costs: repurpose::StartCosts,
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
        let bundle = slot::BundlePrint::new(boot.code_dir.clone(), boot.opt_dir.clone());
        Revision {
            id: rec.id,
            dir: rec.dir.clone(),
            boot,
            snapshot: SnapshotSlot::new(
                rec.dir.join("snapshot"),
                rec.snapshot_id.clone(),
                rec.snapshot_adopted,
                cfg.snapshot_store.clone(),
                slot::OpenSettings { fault_cpu_share: cfg.fault_cpu_share, sandboxes: cfg.sandbox_pool.clone() },
                bundle,
            ),
            snapshot_bytes: AtomicU64::new(rec.snapshot_bytes.unwrap_or(0)),
            retired: AtomicBool::new(false),
            start_costs: repurpose::StartCosts::default(),
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
    /// Its unchanged pages were given back since its last invocation.
    given_back: bool,
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
    /// Give-backs of idle instances' unchanged pages (`--give-back-after`) and the
    /// pages they gave back.
    pub give_backs: u64,
    pub pages_given_back: u64,
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

impl FnState {
    /// Whether `rev` is still served: the active revision or a published version's.
    fn serves(&self, rev: &Arc<Revision>) -> bool {
        self.active.as_ref().is_some_and(|a| Arc::ptr_eq(a, rev)) || self.versions.values().any(|p| Arc::ptr_eq(&p.rev, rev))
    }
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
    admission: Arc<Admission>,
    /// Clean instances of the runtimes' bases that cold starts load functions into
    /// (`--base-pool`, see `repurpose.rs`).
    base_pool: Option<Arc<repurpose::BasePool>>,
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
        st.active.as_ref().is_some_and(|rev| self.readopt_rev(name, rev, id))
    }

    /// [`Node::readopt`] for published version `n`'s revision.
    pub fn readopt_version(&self, name: &str, n: u64, id: &str) -> bool {
        let Some(f) = self.function(name) else { return false };
        let st = f.lock();
        st.versions.get(&n).is_some_and(|p| self.readopt_rev(name, &p.rev, id))
    }

    fn readopt_rev(&self, name: &str, rev: &Revision, id: &str) -> bool {
        if !rev.snapshot.adopted() || rev.snapshot.stored_id().as_deref() == Some(id) {
            return false;
        }
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

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// Current time in ms (for the event queue).
pub fn clock_ms() -> i64 {
    now_ms()
}
