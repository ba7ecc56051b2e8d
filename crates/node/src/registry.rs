//! The node's persistent registry (embedded SQLite): functions, their code
//! revisions with the snapshot built from each, and queued asynchronous events.
//!
//! A *revision* is one deployed bundle + the configuration baked into its
//! snapshot (handler, memory, environment). A function row points at its
//! `latest` revision (what GetFunction reports) and its `active` one (what
//! invocations are served from; it lags while a new revision builds).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, Row};
use thaw_engine::seal::{self, NodeKey};
use thiserror::Error;

mod layers;
pub use layers::LayerVersionRecord;

#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("opening the registry database {path}")]
    Open { path: PathBuf, #[source] source: rusqlite::Error },
    #[error("registry query failed: {what}")]
    Query { what: &'static str, #[source] source: rusqlite::Error },
    #[error("function {0} already exists")]
    Exists(String),
    #[error("corrupt registry row for {what}: {detail}")]
    Corrupt { what: String, detail: String },
    #[error("sealing an environment: {0}")]
    Seal(String),
}

fn q(what: &'static str) -> impl FnOnce(rusqlite::Error) -> RegistryError {
    move |source| RegistryError::Query { what, source }
}

/// One function as stored (Lambda's configuration fields plus our pointers).
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionRecord {
    pub name: String,
    /// Runtime as the user gave it (e.g. "python3.12").
    pub runtime: String,
    pub role: String,
    pub handler: String,
    pub description: String,
    pub timeout_s: u64,
    pub memory_mb: u64,
    pub env: BTreeMap<String, String>,
    pub state: String,
    pub state_reason: Option<String>,
    pub state_reason_code: Option<String>,
    pub last_update_status: String,
    pub last_update_status_reason: Option<String>,
    pub last_update_status_reason_code: Option<String>,
    pub last_modified: String,
    pub revision_id: String,
    pub code_sha256: String,
    pub code_size: u64,
    pub latest_revision: Option<i64>,
    pub active_revision: Option<i64>,
    /// The layer versions (ARNs) extracted under /opt, in order (Lambda's `Layers`).
    pub layers: Vec<String>,
}

/// A function's settings that are not baked into its snapshot: reserved concurrency
/// (Put/Get/DeleteFunctionConcurrency) and tags (Tag/Untag/ListTags).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FunctionSettings {
    pub reserved_concurrency: Option<u32>,
    pub tags: BTreeMap<String, String>,
    /// The function URL of $LATEST, if one was created (CreateFunctionUrlConfig).
    pub url: Option<UrlConfig>,
    /// The function URLs of aliases (CreateFunctionUrlConfig with an alias qualifier).
    pub alias_urls: BTreeMap<String, UrlConfig>,
    /// `SnapStart.ApplyOn` as the user set it (`None`: never set, reported "None").
    /// Thaw snapshots every version whatever it says.
    pub snap_start: Option<String>,
}

/// A function URL's configuration (`api/url.rs` serves it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UrlConfig {
    /// `NONE` or `AWS_IAM`.
    pub auth_type: String,
    /// Lambda's `Cors` object as given (AllowOrigins, AllowMethods, ...).
    pub cors: Option<serde_json::Value>,
    pub creation_time: String,
    pub last_modified_time: String,
}

/// The tag by which a function asks for isolation between invocations: with the
/// value `invocation` (request isolation, as in Groundhog), the node resets an instance in place after every invocation (or
/// discards it when the reset cannot prove the state restored).
pub const ISOLATION_TAG: &str = "thaw:isolation";

impl FunctionSettings {
    pub fn isolation(&self) -> bool {
        self.tags.get(ISOLATION_TAG).is_some_and(|v| v == "invocation")
    }

    /// The URL of `alias` (`None`: $LATEST's), if it has one.
    pub fn url_of(&self, alias: Option<&str>) -> Option<&UrlConfig> {
        match alias {
            None => self.url.as_ref(),
            Some(a) => self.alias_urls.get(a),
        }
    }

    /// Remove and return the URL of `alias` (`None`: $LATEST's).
    pub fn take_url(&mut self, alias: Option<&str>) -> Option<UrlConfig> {
        match alias {
            None => self.url.take(),
            Some(a) => self.alias_urls.remove(a),
        }
    }

    /// Set the URL of `alias` (`None`: $LATEST's).
    pub fn set_url(&mut self, alias: Option<&str>, url: UrlConfig) {
        match alias {
            None => self.url = Some(url),
            Some(a) => {
                self.alias_urls.insert(a.to_string(), url);
            }
        }
    }
}

/// One deployed bundle and its snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionRecord {
    pub id: i64,
    pub function: String,
    pub code_sha256: String,
    pub code_size: u64,
    /// Directory holding `code/` and `snapshot/`.
    pub dir: PathBuf,
    /// Lambda runtime name the revision was built for (e.g. "nodejs20.x").
    pub runtime: String,
    pub handler: String,
    pub memory_mb: u64,
    pub env: BTreeMap<String, String>,
    /// "building", "ready" or "failed".
    pub status: String,
    pub error: Option<String>,
    pub snapshot_bytes: Option<u64>,
    /// Id of the snapshot in the node's snapshot store, once published (#13).
    pub snapshot_id: Option<String>,
    /// `snapshot_id` was published by another node (a cluster's builder) and adopted
    /// here: this node never deletes or replaces it.
    pub snapshot_adopted: bool,
    /// The layer versions (ARNs) extracted into `dir/opt`, in order.
    pub layers: Vec<String>,
}

/// A published version: an immutable pointer to a revision (code, handler, memory,
/// environment and its snapshot) plus the settings that are not in the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionRecord {
    pub function: String,
    pub version: u64,
    pub revision: i64,
    pub description: String,
    pub timeout_s: u64,
    pub revision_id: String,
    pub last_modified: String,
}

/// An alias: a name for a version, optionally sending a weighted share of the calls
/// to other versions (`RoutingConfig.AdditionalVersionWeights`).
#[derive(Debug, Clone, PartialEq)]
pub struct AliasRecord {
    pub function: String,
    pub name: String,
    pub version: u64,
    pub description: String,
    pub weights: BTreeMap<u64, f64>,
    pub revision_id: String,
}

/// A queued asynchronous (InvocationType=Event) invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub id: String,
    pub function: String,
    /// The published version to run (None: $LATEST), resolved when the event was queued.
    pub version: Option<u64>,
    /// The qualifier the event was sent with (an alias, a version, or none), which the
    /// function sees in its invoked ARN.
    pub qualifier: Option<String>,
    pub payload: Vec<u8>,
    pub attempts: u32,
    pub next_attempt_ms: i64,
}

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS functions (
    name TEXT PRIMARY KEY,
    runtime TEXT NOT NULL,
    role TEXT NOT NULL,
    handler TEXT NOT NULL,
    description TEXT NOT NULL,
    timeout_s INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    env_json TEXT NOT NULL,
    state TEXT NOT NULL,
    state_reason TEXT,
    state_reason_code TEXT,
    last_update_status TEXT NOT NULL,
    last_update_status_reason TEXT,
    last_update_status_reason_code TEXT,
    last_modified TEXT NOT NULL,
    revision_id TEXT NOT NULL,
    code_sha256 TEXT NOT NULL,
    code_size INTEGER NOT NULL,
    latest_revision INTEGER,
    active_revision INTEGER,
    layers_json TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS revisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    function TEXT NOT NULL,
    code_sha256 TEXT NOT NULL,
    code_size INTEGER NOT NULL,
    dir TEXT NOT NULL,
    handler TEXT NOT NULL,
    memory_mb INTEGER NOT NULL,
    env_json TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    snapshot_bytes INTEGER,
    runtime TEXT NOT NULL DEFAULT 'python3.12',
    snapshot_id TEXT,
    layers_json TEXT NOT NULL DEFAULT '[]',
    snapshot_adopted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS function_settings (
    name TEXT PRIMARY KEY,
    reserved_concurrency INTEGER,
    tags_json TEXT NOT NULL,
    url_json TEXT,
    alias_urls_json TEXT NOT NULL DEFAULT '{}',
    snap_start TEXT
);
CREATE TABLE IF NOT EXISTS versions (
    function TEXT NOT NULL,
    version INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    description TEXT NOT NULL,
    timeout_s INTEGER NOT NULL,
    revision_id TEXT NOT NULL,
    last_modified TEXT NOT NULL,
    PRIMARY KEY (function, version)
);
CREATE TABLE IF NOT EXISTS version_counters (
    function TEXT PRIMARY KEY,
    last INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS aliases (
    function TEXT NOT NULL,
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    description TEXT NOT NULL,
    weights_json TEXT NOT NULL,
    revision_id TEXT NOT NULL,
    PRIMARY KEY (function, name)
);
CREATE TABLE IF NOT EXISTS provisioned (
    function TEXT NOT NULL,
    version INTEGER NOT NULL,
    requested INTEGER NOT NULL,
    last_modified TEXT NOT NULL,
    PRIMARY KEY (function, version)
);
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY,
    function TEXT NOT NULL,
    payload BLOB NOT NULL,
    attempts INTEGER NOT NULL,
    next_attempt_ms INTEGER NOT NULL,
    version INTEGER,
    qualifier TEXT,
    sealed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS events_due ON events(next_attempt_ms);
";

const FN_COLS: &str = "name, runtime, role, handler, description, timeout_s, memory_mb, env_json, state, state_reason, \
    state_reason_code, last_update_status, last_update_status_reason, last_update_status_reason_code, last_modified, \
    revision_id, code_sha256, code_size, latest_revision, active_revision, layers_json";
const REV_COLS: &str =
    "id, function, code_sha256, code_size, dir, handler, memory_mb, env_json, status, error, snapshot_bytes, runtime, snapshot_id, layers_json, snapshot_adopted";

/// A list of layer ARNs as stored (`layers_json`); a corrupt list reads as none.
fn layers_from(json: String) -> Vec<String> {
    serde_json::from_str(&json).unwrap_or_default()
}

fn layers_json(layers: &[String]) -> String {
    serde_json::to_string(layers).expect("strings serialize")
}

/// The purpose an event's payload is sealed for (`seal::seal_bytes`, bound to its id).
const EVENTS: &[u8] = b"thaw events v1";

/// Whether a queued event's stored payload could be read, or why not.
pub type Opened = Result<(), String>;

/// Environment values are secrets: with a node key they are stored sealed
/// (`seal::seal_value`, AES-256-GCM), never in clear in the database or its WAL.
fn env_from(key: Option<&NodeKey>, stored: &str, what: &str) -> Result<BTreeMap<String, String>, RegistryError> {
    let corrupt = |detail: String| RegistryError::Corrupt { what: what.to_string(), detail };
    let plain;
    let json = if stored.starts_with("v1:") {
        let key = key.ok_or_else(|| corrupt("the environment is sealed and the node has no node key".into()))?;
        plain = seal::open_value(key, stored)
            .ok_or_else(|| corrupt(format!("the environment does not open with node key {}", key.id())))?;
        std::str::from_utf8(&plain).map_err(|e| corrupt(e.to_string()))?
    } else {
        stored
    };
    serde_json::from_str(json).map_err(|e| corrupt(e.to_string()))
}

fn env_json(key: Option<&NodeKey>, env: &BTreeMap<String, String>) -> Result<String, RegistryError> {
    let json = serde_json::to_string(env).expect("a string map serializes");
    match key {
        Some(k) if !env.is_empty() => seal::seal_value(k, json.as_bytes()).map_err(|e| RegistryError::Seal(e.to_string())),
        _ => Ok(json),
    }
}

fn function_row(r: &Row<'_>) -> rusqlite::Result<(FunctionRecord, String)> {
    Ok((
        FunctionRecord {
            name: r.get(0)?,
            runtime: r.get(1)?,
            role: r.get(2)?,
            handler: r.get(3)?,
            description: r.get(4)?,
            timeout_s: r.get(5)?,
            memory_mb: r.get(6)?,
            env: BTreeMap::new(),
            state: r.get(8)?,
            state_reason: r.get(9)?,
            state_reason_code: r.get(10)?,
            last_update_status: r.get(11)?,
            last_update_status_reason: r.get(12)?,
            last_update_status_reason_code: r.get(13)?,
            last_modified: r.get(14)?,
            revision_id: r.get(15)?,
            code_sha256: r.get(16)?,
            code_size: r.get(17)?,
            latest_revision: r.get(18)?,
            active_revision: r.get(19)?,
            layers: layers_from(r.get(20)?),
        },
        r.get(7)?,
    ))
}

fn revision_row(r: &Row<'_>) -> rusqlite::Result<(RevisionRecord, String)> {
    Ok((
        RevisionRecord {
            id: r.get(0)?,
            function: r.get(1)?,
            code_sha256: r.get(2)?,
            code_size: r.get(3)?,
            dir: PathBuf::from(r.get::<_, String>(4)?),
            handler: r.get(5)?,
            memory_mb: r.get(6)?,
            env: BTreeMap::new(),
            status: r.get(8)?,
            error: r.get(9)?,
            snapshot_bytes: r.get(10)?,
            runtime: r.get(11)?,
            snapshot_id: r.get(12)?,
            layers: layers_from(r.get(13)?),
            snapshot_adopted: r.get(14)?,
        },
        r.get(7)?,
    ))
}

pub struct Registry {
    conn: Mutex<Connection>,
    /// Seals stored environment values and event payloads (the process's node key at open).
    key: Option<Arc<NodeKey>>,
}

impl Registry {
    /// Open (creating if needed) the registry at `path`.
    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        let conn = Connection::open(path).map_err(|source| RegistryError::Open { path: path.to_path_buf(), source })?;
        Self::init(conn, path)
    }

    /// A registry that lives in memory (tests).
    pub fn open_in_memory() -> Result<Registry, RegistryError> {
        let conn = Connection::open_in_memory()
            .map_err(|source| RegistryError::Open { path: PathBuf::from(":memory:"), source })?;
        Self::init(conn, Path::new(":memory:"))
    }

    fn init(conn: Connection, path: &Path) -> Result<Registry, RegistryError> {
        let open = |source| RegistryError::Open { path: path.to_path_buf(), source };
        conn.execute_batch(SCHEMA).map_err(open)?;
        conn.execute_batch(layers::SCHEMA).map_err(open)?;
        // Columns added since a registry was first written: registries written before
        // revisions recorded their runtime held Python functions only.
        for (table, column, ddl) in [
            ("revisions", "runtime", "ALTER TABLE revisions ADD COLUMN runtime TEXT NOT NULL DEFAULT 'python3.12';"),
            ("function_settings", "url_json", "ALTER TABLE function_settings ADD COLUMN url_json TEXT;"),
            ("function_settings", "alias_urls_json", "ALTER TABLE function_settings ADD COLUMN alias_urls_json TEXT NOT NULL DEFAULT '{}';"),
            ("function_settings", "snap_start", "ALTER TABLE function_settings ADD COLUMN snap_start TEXT;"),
            ("revisions", "snapshot_id", "ALTER TABLE revisions ADD COLUMN snapshot_id TEXT;"),
            ("events", "version", "ALTER TABLE events ADD COLUMN version INTEGER;"),
            ("events", "qualifier", "ALTER TABLE events ADD COLUMN qualifier TEXT;"),
            ("functions", "layers_json", "ALTER TABLE functions ADD COLUMN layers_json TEXT NOT NULL DEFAULT '[]';"),
            ("revisions", "layers_json", "ALTER TABLE revisions ADD COLUMN layers_json TEXT NOT NULL DEFAULT '[]';"),
            ("revisions", "snapshot_adopted", "ALTER TABLE revisions ADD COLUMN snapshot_adopted INTEGER NOT NULL DEFAULT 0;"),
            ("events", "sealed", "ALTER TABLE events ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;"),
        ] {
            let present: i64 = conn
                .query_row("SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name=?2", [table, column], |r| r.get(0))
                .map_err(open)?;
            if present == 0 {
                conn.execute_batch(ddl).map_err(open)?;
            }
        }
        // Deleted rows (old environments among them) are overwritten, not left in free pages.
        conn.execute_batch("PRAGMA secure_delete = ON;").map_err(open)?;
        Ok(Registry { conn: Mutex::new(conn), key: seal::node_key() })
    }

    /// Seal environment values with `key` instead of the process's node key.
    pub fn with_key(mut self, key: Option<Arc<NodeKey>>) -> Registry {
        self.key = key;
        self
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent (it has its own transactions).
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Insert a new function; `Exists` if the name is taken.
    pub fn insert_function(&self, f: &FunctionRecord) -> Result<(), RegistryError> {
        let c = self.conn();
        let n = c
            .execute(
                &format!("INSERT OR IGNORE INTO functions ({FN_COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21)"),
                params![
                    f.name, f.runtime, f.role, f.handler, f.description, f.timeout_s, f.memory_mb, env_json(self.key.as_deref(), &f.env)?,
                    f.state, f.state_reason, f.state_reason_code, f.last_update_status, f.last_update_status_reason,
                    f.last_update_status_reason_code, f.last_modified, f.revision_id, f.code_sha256, f.code_size,
                    f.latest_revision, f.active_revision, layers_json(&f.layers)
                ],
            )
            .map_err(q("insert function"))?;
        if n == 0 {
            return Err(RegistryError::Exists(f.name.clone()));
        }
        Ok(())
    }

    /// Overwrite an existing function's row.
    pub fn update_function(&self, f: &FunctionRecord) -> Result<(), RegistryError> {
        self.conn()
            .execute(
                "UPDATE functions SET runtime=?2, role=?3, handler=?4, description=?5, timeout_s=?6, memory_mb=?7, env_json=?8, \
                 state=?9, state_reason=?10, state_reason_code=?11, last_update_status=?12, last_update_status_reason=?13, \
                 last_update_status_reason_code=?14, last_modified=?15, revision_id=?16, code_sha256=?17, code_size=?18, \
                 latest_revision=?19, active_revision=?20, layers_json=?21 WHERE name=?1",
                params![
                    f.name, f.runtime, f.role, f.handler, f.description, f.timeout_s, f.memory_mb, env_json(self.key.as_deref(), &f.env)?,
                    f.state, f.state_reason, f.state_reason_code, f.last_update_status, f.last_update_status_reason,
                    f.last_update_status_reason_code, f.last_modified, f.revision_id, f.code_sha256, f.code_size,
                    f.latest_revision, f.active_revision, layers_json(&f.layers)
                ],
            )
            .map_err(q("update function"))?;
        Ok(())
    }

    pub fn get_function(&self, name: &str) -> Result<Option<FunctionRecord>, RegistryError> {
        let c = self.conn();
        let row = c
            .query_row(&format!("SELECT {FN_COLS} FROM functions WHERE name=?1"), [name], function_row)
            .optional()
            .map_err(q("get function"))?;
        row.map(|(mut f, env)| {
            f.env = env_from(self.key.as_deref(), &env, &f.name)?;
            Ok(f)
        })
        .transpose()
    }

    /// All functions, ordered by name.
    pub fn list_functions(&self) -> Result<Vec<FunctionRecord>, RegistryError> {
        let c = self.conn();
        let mut st = c.prepare(&format!("SELECT {FN_COLS} FROM functions ORDER BY name")).map_err(q("list functions"))?;
        let rows = st.query_map([], function_row).map_err(q("list functions"))?;
        let mut out = Vec::new();
        for r in rows {
            let (mut f, env) = r.map_err(q("list functions"))?;
            f.env = env_from(self.key.as_deref(), &env, &f.name)?;
            out.push(f);
        }
        Ok(out)
    }

    /// Delete a function with its revisions and queued events; returns the revisions' directories.
    pub fn delete_function(&self, name: &str) -> Result<Option<Vec<PathBuf>>, RegistryError> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(q("delete function"))?;
        let dirs: Vec<PathBuf> = {
            let mut st = tx.prepare("SELECT dir FROM revisions WHERE function=?1").map_err(q("delete function"))?;
            let rows = st.query_map([name], |r| r.get::<_, String>(0)).map_err(q("delete function"))?;
            rows.collect::<Result<Vec<_>, _>>().map_err(q("delete function"))?.into_iter().map(PathBuf::from).collect()
        };
        let n = tx.execute("DELETE FROM functions WHERE name=?1", [name]).map_err(q("delete function"))?;
        tx.execute("DELETE FROM revisions WHERE function=?1", [name]).map_err(q("delete function"))?;
        tx.execute("DELETE FROM events WHERE function=?1", [name]).map_err(q("delete function"))?;
        tx.execute("DELETE FROM function_settings WHERE name=?1", [name]).map_err(q("delete function"))?;
        tx.execute("DELETE FROM versions WHERE function=?1", [name]).map_err(q("delete function"))?;
        tx.execute("DELETE FROM version_counters WHERE function=?1", [name]).map_err(q("delete function"))?;
        tx.execute("DELETE FROM aliases WHERE function=?1", [name]).map_err(q("delete function"))?;
        tx.execute("DELETE FROM provisioned WHERE function=?1", [name]).map_err(q("delete function"))?;
        tx.commit().map_err(q("delete function"))?;
        Ok((n > 0).then_some(dirs))
    }

    /// A function's settings outside its snapshot (defaults if none were stored).
    pub fn get_settings(&self, name: &str) -> Result<FunctionSettings, RegistryError> {
        let c = self.conn();
        type Row = (Option<u32>, String, Option<String>, Option<String>, String);
        let row: Option<Row> = c
            .query_row(
                "SELECT reserved_concurrency, tags_json, url_json, snap_start, alias_urls_json FROM function_settings WHERE name=?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()
            .map_err(q("get settings"))?;
        let Some((reserved_concurrency, tags, url, snap_start, alias_urls)) = row else { return Ok(FunctionSettings::default()) };
        let corrupt = |what: &str, e: serde_json::Error| RegistryError::Corrupt { what: format!("{what} of {name}"), detail: e.to_string() };
        let tags = serde_json::from_str(&tags).map_err(|e| corrupt("tags", e))?;
        let url = url.map(|u| serde_json::from_str(&u)).transpose().map_err(|e| corrupt("URL config", e))?;
        let alias_urls = serde_json::from_str(&alias_urls).map_err(|e| corrupt("alias URL configs", e))?;
        Ok(FunctionSettings { reserved_concurrency, tags, url, alias_urls, snap_start })
    }

    pub fn put_settings(&self, name: &str, s: &FunctionSettings) -> Result<(), RegistryError> {
        let tags = serde_json::to_string(&s.tags).expect("a string map serializes");
        let url = s.url.as_ref().map(|u| serde_json::to_string(u).expect("a URL config serializes"));
        let alias_urls = serde_json::to_string(&s.alias_urls).expect("URL configs serialize");
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO function_settings (name, reserved_concurrency, tags_json, url_json, snap_start, alias_urls_json) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![name, s.reserved_concurrency, tags, url, s.snap_start, alias_urls],
            )
            .map_err(q("put settings"))?;
        Ok(())
    }

    /// Insert a revision (its `id` is ignored) and return the new id.
    pub fn insert_revision(&self, r: &RevisionRecord) -> Result<i64, RegistryError> {
        let c = self.conn();
        c.execute(
            "INSERT INTO revisions (function, code_sha256, code_size, dir, handler, memory_mb, env_json, status, error, snapshot_bytes, runtime, snapshot_id, layers_json, snapshot_adopted) \
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14)",
            params![
                r.function, r.code_sha256, r.code_size, r.dir.to_string_lossy(), r.handler, r.memory_mb, env_json(self.key.as_deref(), &r.env)?,
                r.status, r.error, r.snapshot_bytes, r.runtime, r.snapshot_id, layers_json(&r.layers), r.snapshot_adopted
            ],
        )
        .map_err(q("insert revision"))?;
        Ok(c.last_insert_rowid())
    }

    /// Record the outcome of a revision's build.
    pub fn finish_revision(&self, id: i64, status: &str, error: Option<&str>, snapshot_bytes: Option<u64>) -> Result<(), RegistryError> {
        self.conn()
            .execute(
                "UPDATE revisions SET status=?2, error=?3, snapshot_bytes=?4 WHERE id=?1",
                params![id, status, error, snapshot_bytes],
            )
            .map_err(q("finish revision"))?;
        Ok(())
    }

    /// Record where revision `id`'s snapshot is stored (None: only on this node's disk),
    /// published by this node.
    pub fn set_snapshot_id(&self, id: i64, snapshot_id: Option<&str>) -> Result<(), RegistryError> {
        self.conn()
            .execute("UPDATE revisions SET snapshot_id=?2, snapshot_adopted=0 WHERE id=?1", params![id, snapshot_id])
            .map_err(q("record snapshot id"))?;
        Ok(())
    }

    /// Record that revision `id` serves from `snapshot_id`, published by another node.
    pub fn set_adopted_snapshot(&self, id: i64, snapshot_id: &str) -> Result<(), RegistryError> {
        self.conn()
            .execute("UPDATE revisions SET snapshot_id=?2, snapshot_adopted=1 WHERE id=?1", params![id, snapshot_id])
            .map_err(q("record adopted snapshot id"))?;
        Ok(())
    }

    pub fn get_revision(&self, id: i64) -> Result<Option<RevisionRecord>, RegistryError> {
        let c = self.conn();
        let row = c
            .query_row(&format!("SELECT {REV_COLS} FROM revisions WHERE id=?1"), [id], revision_row)
            .optional()
            .map_err(q("get revision"))?;
        row.map(|(mut r, env)| {
            r.env = env_from(self.key.as_deref(), &env, &format!("revision {}", r.id))?;
            Ok(r)
        })
        .transpose()
    }

    /// Revisions of `function` other than `keep` (candidates for garbage collection).
    pub fn other_revisions(&self, function: &str, keep: &[i64]) -> Result<Vec<(i64, PathBuf)>, RegistryError> {
        let c = self.conn();
        let mut st = c.prepare("SELECT id, dir FROM revisions WHERE function=?1 ORDER BY id").map_err(q("list revisions"))?;
        let rows = st
            .query_map([function], |r| Ok((r.get::<_, i64>(0)?, PathBuf::from(r.get::<_, String>(1)?))))
            .map_err(q("list revisions"))?;
        let all = rows.collect::<Result<Vec<_>, _>>().map_err(q("list revisions"))?;
        Ok(all.into_iter().filter(|(id, _)| !keep.contains(id)).collect())
    }

    /// Record a published version, and raise the function's highest version number
    /// ever published (which survives deleting that version, as Lambda's does).
    pub fn insert_version(&self, v: &VersionRecord) -> Result<(), RegistryError> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(q("insert version"))?;
        tx.execute(
            "INSERT INTO versions (function, version, revision, description, timeout_s, revision_id, last_modified) \
             VALUES (?1,?2,?3,?4,?5,?6,?7)",
            params![v.function, v.version, v.revision, v.description, v.timeout_s, v.revision_id, v.last_modified],
        )
        .map_err(q("insert version"))?;
        tx.execute(
            "INSERT INTO version_counters (function, last) VALUES (?1, ?2) \
             ON CONFLICT(function) DO UPDATE SET last = max(last, excluded.last)",
            params![v.function, v.version],
        )
        .map_err(q("insert version"))?;
        tx.commit().map_err(q("insert version"))
    }

    /// The highest version number `function` ever published (0: none; registries from
    /// before the counter existed report 0 and rely on the versions still present).
    pub fn last_version(&self, function: &str) -> Result<u64, RegistryError> {
        self.conn()
            .query_row("SELECT last FROM version_counters WHERE function=?1", [function], |r| r.get(0))
            .optional()
            .map(|v| v.unwrap_or(0))
            .map_err(q("last version"))
    }

    /// A function's published versions, oldest first.
    pub fn list_versions(&self, function: &str) -> Result<Vec<VersionRecord>, RegistryError> {
        let c = self.conn();
        let mut st = c
            .prepare("SELECT function, version, revision, description, timeout_s, revision_id, last_modified FROM versions WHERE function=?1 ORDER BY version")
            .map_err(q("list versions"))?;
        let rows = st
            .query_map([function], |r| {
                Ok(VersionRecord {
                    function: r.get(0)?,
                    version: r.get(1)?,
                    revision: r.get(2)?,
                    description: r.get(3)?,
                    timeout_s: r.get(4)?,
                    revision_id: r.get(5)?,
                    last_modified: r.get(6)?,
                })
            })
            .map_err(q("list versions"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(q("list versions"))
    }

    /// Insert or replace an alias.
    pub fn put_alias(&self, a: &AliasRecord) -> Result<(), RegistryError> {
        let weights: BTreeMap<String, f64> = a.weights.iter().map(|(v, w)| (v.to_string(), *w)).collect();
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO aliases (function, name, version, description, weights_json, revision_id) VALUES (?1,?2,?3,?4,?5,?6)",
                params![a.function, a.name, a.version, a.description, serde_json::to_string(&weights).expect("serializable"), a.revision_id],
            )
            .map_err(q("put alias"))?;
        Ok(())
    }

    pub fn list_aliases(&self, function: &str) -> Result<Vec<AliasRecord>, RegistryError> {
        let c = self.conn();
        let mut st = c
            .prepare("SELECT function, name, version, description, weights_json, revision_id FROM aliases WHERE function=?1 ORDER BY name")
            .map_err(q("list aliases"))?;
        let rows = st
            .query_map([function], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?, r.get(3)?, r.get::<_, String>(4)?, r.get(5)?)))
            .map_err(q("list aliases"))?;
        let mut out = vec![];
        for row in rows {
            let (function, name, version, description, weights, revision_id) = row.map_err(q("list aliases"))?;
            let w: BTreeMap<String, f64> = serde_json::from_str(&weights)
                .map_err(|e| RegistryError::Corrupt { what: format!("alias {function}:{name}"), detail: e.to_string() })?;
            let weights = w.into_iter().filter_map(|(k, v)| Some((k.parse().ok()?, v))).collect();
            out.push(AliasRecord { function, name, version, description, weights, revision_id });
        }
        Ok(out)
    }

    /// Provisioned concurrency per version: (version, requested, last modified).
    pub fn list_provisioned(&self, function: &str) -> Result<Vec<(u64, usize, String)>, RegistryError> {
        let c = self.conn();
        let mut st = c.prepare("SELECT version, requested, last_modified FROM provisioned WHERE function=?1").map_err(q("list provisioned"))?;
        let rows = st.query_map([function], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as usize, r.get(2)?))).map_err(q("list provisioned"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(q("list provisioned"))
    }

    /// Set (`Some`) or remove provisioned concurrency of a version.
    pub fn put_provisioned(&self, function: &str, version: u64, requested: Option<(usize, &str)>) -> Result<(), RegistryError> {
        let c = self.conn();
        match requested {
            Some((n, at)) => c.execute(
                "INSERT OR REPLACE INTO provisioned (function, version, requested, last_modified) VALUES (?1,?2,?3,?4)",
                params![function, version, n as i64, at],
            ),
            None => c.execute("DELETE FROM provisioned WHERE function=?1 AND version=?2", params![function, version]),
        }
        .map_err(q("put provisioned"))?;
        Ok(())
    }

    pub fn delete_alias(&self, function: &str, name: &str) -> Result<(), RegistryError> {
        self.conn().execute("DELETE FROM aliases WHERE function=?1 AND name=?2", [function, name]).map_err(q("delete alias"))?;
        Ok(())
    }

    pub fn delete_version(&self, function: &str, version: u64) -> Result<(), RegistryError> {
        self.conn().execute("DELETE FROM versions WHERE function=?1 AND version=?2", params![function, version]).map_err(q("delete version"))?;
        Ok(())
    }

    pub fn delete_revision(&self, id: i64) -> Result<(), RegistryError> {
        self.conn().execute("DELETE FROM revisions WHERE id=?1", [id]).map_err(q("delete revision"))?;
        Ok(())
    }

    /// Queue `e`. Its payload is the caller's data: with a node key it is stored sealed
    /// (bound to the event's id), never in clear in the database or its WAL.
    pub fn enqueue_event(&self, e: &EventRecord) -> Result<(), RegistryError> {
        let payload = match &self.key {
            Some(k) => seal::seal_bytes(k, EVENTS, e.id.as_bytes(), &e.payload).map_err(|e| RegistryError::Seal(e.to_string()))?,
            None => e.payload.clone(),
        };
        self.conn()
            .execute(
                "INSERT INTO events (id, function, payload, attempts, next_attempt_ms, version, qualifier, sealed) VALUES (?1,?2,?3,?4,?5,?6,?7,?8)",
                params![e.id, e.function, payload, e.attempts, e.next_attempt_ms, e.version, e.qualifier, self.key.is_some()],
            )
            .map_err(q("enqueue event"))?;
        Ok(())
    }

    /// Events whose next attempt is due at `now_ms`, oldest first, each with its payload
    /// opened, or why it cannot be (a sealed payload without the node key that sealed
    /// it, or damaged): such an event fails its attempts (see events.rs) instead of
    /// holding up the queue.
    pub fn due_events(&self, now_ms: i64, limit: usize) -> Result<Vec<(EventRecord, Opened)>, RegistryError> {
        let c = self.conn();
        let mut st = c
            .prepare(
                "SELECT id, function, payload, attempts, next_attempt_ms, version, qualifier, sealed FROM events WHERE next_attempt_ms <= ?1 \
                 ORDER BY next_attempt_ms LIMIT ?2",
            )
            .map_err(q("due events"))?;
        let rows = st
            .query_map(params![now_ms, limit as i64], |r| {
                Ok((
                    EventRecord {
                        id: r.get(0)?,
                        function: r.get(1)?,
                        payload: r.get(2)?,
                        attempts: r.get(3)?,
                        next_attempt_ms: r.get(4)?,
                        version: r.get(5)?,
                        qualifier: r.get(6)?,
                    },
                    r.get::<_, bool>(7)?,
                ))
            })
            .map_err(q("due events"))?;
        let rows = rows.collect::<Result<Vec<_>, _>>().map_err(q("due events"))?;
        Ok(rows.into_iter().map(|(e, sealed)| if sealed { self.open_event(e) } else { (e, Ok(())) }).collect())
    }

    fn open_event(&self, mut e: EventRecord) -> (EventRecord, Opened) {
        let opened = match &self.key {
            None => Err("its payload is sealed and the node has no node key (started with --no-encryption?)".to_string()),
            Some(k) => match seal::open_bytes(k, EVENTS, e.id.as_bytes(), &e.payload) {
                Some(plain) => {
                    e.payload = plain;
                    Ok(())
                }
                None => Err(format!("its payload does not open with node key {} (another key, or damaged)", k.id())),
            },
        };
        if opened.is_err() {
            e.payload.clear();
        }
        (e, opened)
    }

    /// Time of the earliest queued event, if any.
    pub fn next_event_ms(&self) -> Result<Option<i64>, RegistryError> {
        self.conn()
            .query_row("SELECT MIN(next_attempt_ms) FROM events", [], |r| r.get(0))
            .map_err(q("next event"))
    }

    pub fn pending_events(&self) -> Result<u64, RegistryError> {
        self.conn().query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0)).map_err(q("count events"))
    }

    pub fn reschedule_event(&self, id: &str, attempts: u32, next_attempt_ms: i64) -> Result<(), RegistryError> {
        self.conn()
            .execute("UPDATE events SET attempts=?2, next_attempt_ms=?3 WHERE id=?1", params![id, attempts, next_attempt_ms])
            .map_err(q("reschedule event"))?;
        Ok(())
    }

    /// Whether `e`, as read by `due_events`, is still in the queue as read (same attempt
    /// count) and due at `now_ms`. A listing read before an attempt finished is stale
    /// once that attempt has rescheduled or deleted the event.
    pub fn event_still_due(&self, e: &EventRecord, now_ms: i64) -> Result<bool, RegistryError> {
        self.conn()
            .query_row(
                "SELECT COUNT(*) FROM events WHERE id=?1 AND attempts=?2 AND next_attempt_ms <= ?3",
                params![e.id, e.attempts, now_ms],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(q("check event"))
    }

    pub fn delete_event(&self, id: &str) -> Result<(), RegistryError> {
        self.conn().execute("DELETE FROM events WHERE id=?1", [id]).map_err(q("delete event"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(name: &str) -> FunctionRecord {
        FunctionRecord {
            name: name.into(),
            runtime: "python3.12".into(),
            role: "arn:aws:iam::000000000000:role/r".into(),
            handler: "handler.handler".into(),
            description: String::new(),
            timeout_s: 3,
            memory_mb: 128,
            env: BTreeMap::from([("A".to_string(), "1".to_string())]),
            state: "Pending".into(),
            state_reason: Some("The function is being created.".into()),
            state_reason_code: Some("Creating".into()),
            last_update_status: "InProgress".into(),
            last_update_status_reason: None,
            last_update_status_reason_code: None,
            last_modified: "2024-05-01T12:00:00.000+0000".into(),
            revision_id: "r1".into(),
            code_sha256: "abc".into(),
            code_size: 10,
            layers: vec!["arn:aws:lambda:local:000000000000:layer:l:1".into()],
            latest_revision: None,
            active_revision: None,
        }
    }

    #[test]
    fn functions_round_trip() {
        let reg = Registry::open_in_memory().unwrap();
        let mut f = func("b");
        reg.insert_function(&f).unwrap();
        reg.insert_function(&func("a")).unwrap();
        assert!(matches!(reg.insert_function(&f), Err(RegistryError::Exists(n)) if n == "b"));
        assert_eq!(reg.get_function("b").unwrap(), Some(f.clone()));
        f.state = "Active".into();
        f.active_revision = Some(7);
        reg.update_function(&f).unwrap();
        assert_eq!(reg.get_function("b").unwrap().unwrap().active_revision, Some(7));
        let names: Vec<_> = reg.list_functions().unwrap().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(reg.get_function("zz").unwrap().is_none());
    }

    #[test]
    fn a_registry_without_revision_runtimes_is_migrated() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE revisions (id INTEGER PRIMARY KEY AUTOINCREMENT, function TEXT NOT NULL, code_sha256 TEXT NOT NULL, \
             code_size INTEGER NOT NULL, dir TEXT NOT NULL, handler TEXT NOT NULL, memory_mb INTEGER NOT NULL, env_json TEXT NOT NULL, \
             status TEXT NOT NULL, error TEXT, snapshot_bytes INTEGER); \
             INSERT INTO revisions (function, code_sha256, code_size, dir, handler, memory_mb, env_json, status) \
             VALUES ('f', 'x', 1, '/tmp/r', 'h.h', 128, '{}', 'ready');",
        )
        .unwrap();
        let reg = Registry::init(conn, Path::new(":memory:")).unwrap();
        let got = reg.get_revision(1).unwrap().unwrap();
        assert_eq!((got.runtime.as_str(), got.snapshot_id), ("python3.12", None));
        reg.set_snapshot_id(1, Some("abc")).unwrap();
        assert_eq!(reg.get_revision(1).unwrap().unwrap().snapshot_id.as_deref(), Some("abc"));
    }

    #[test]
    fn revisions_and_delete() {
        let reg = Registry::open_in_memory().unwrap();
        reg.insert_function(&func("f")).unwrap();
        let rev = RevisionRecord {
            id: 0,
            function: "f".into(),
            code_sha256: "x".into(),
            code_size: 1,
            dir: "/tmp/r1".into(),
            runtime: "java17".into(),
            handler: "h.h".into(),
            memory_mb: 128,
            env: BTreeMap::new(),
            status: "building".into(),
            error: None,
            snapshot_bytes: None,
            snapshot_id: None,
            snapshot_adopted: false,
            layers: vec!["arn:aws:lambda:local:000000000000:layer:l:2".into()],
        };
        let a = reg.insert_revision(&rev).unwrap();
        let b = reg.insert_revision(&RevisionRecord { dir: "/tmp/r2".into(), snapshot_id: Some("s".into()), snapshot_adopted: true, ..rev.clone() }).unwrap();
        assert!(reg.get_revision(b).unwrap().unwrap().snapshot_adopted, "another node's snapshot, adopted");
        reg.set_snapshot_id(b, Some("t")).unwrap();
        assert!(!reg.get_revision(b).unwrap().unwrap().snapshot_adopted, "one this node published is its own");
        reg.set_adopted_snapshot(b, "u").unwrap();
        let got = reg.get_revision(b).unwrap().unwrap();
        assert_eq!((got.snapshot_id.as_deref(), got.snapshot_adopted), (Some("u"), true));
        assert_ne!(a, b);
        reg.finish_revision(a, "ready", None, Some(4096)).unwrap();
        let got = reg.get_revision(a).unwrap().unwrap();
        assert_eq!((got.status.as_str(), got.snapshot_bytes, got.runtime.as_str()), ("ready", Some(4096), "java17"));
        assert_eq!(got.layers, rev.layers);
        assert_eq!(reg.other_revisions("f", &[b]).unwrap(), vec![(a, PathBuf::from("/tmp/r1"))]);
        reg.enqueue_event(&EventRecord { id: "e".into(), function: "f".into(), version: Some(3), qualifier: Some("live".into()), payload: b"{}".to_vec(), attempts: 0, next_attempt_ms: 5 })
            .unwrap();
        let dirs = reg.delete_function("f").unwrap().unwrap();
        assert_eq!(dirs.len(), 2);
        assert_eq!(reg.pending_events().unwrap(), 0);
        assert!(reg.delete_function("f").unwrap().is_none());
    }

    #[test]
    fn events_queue() {
        let reg = Registry::open_in_memory().unwrap();
        for (id, t, version, q) in [("late", 100, None, None), ("early", 10, Some(2), Some("live"))] {
            reg.enqueue_event(&EventRecord { id: id.into(), function: "f".into(), version, qualifier: q.map(String::from), payload: b"1".to_vec(), attempts: 0, next_attempt_ms: t })
                .unwrap();
        }
        assert_eq!(reg.next_event_ms().unwrap(), Some(10));
        let due: Vec<_> = reg.due_events(50, 10).unwrap().into_iter().map(|(e, _)| e.id).collect();
        assert_eq!(due, ["early"]);
        reg.reschedule_event("early", 1, 200).unwrap();
        let due: Vec<_> = reg.due_events(1000, 10).unwrap().into_iter().map(|(e, _)| (e.id, e.attempts, e.version, e.qualifier)).collect();
        assert_eq!(
            due,
            [("late".to_string(), 0, None, None), ("early".to_string(), 1, Some(2), Some("live".to_string()))],
            "the version and qualifier are kept"
        );
        reg.delete_event("late").unwrap();
        assert_eq!(reg.pending_events().unwrap(), 1);
    }

    #[test]
    fn persists_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        Registry::open(&path).unwrap().insert_function(&func("p")).unwrap();
        assert_eq!(Registry::open(&path).unwrap().get_function("p").unwrap(), Some(func("p")));
    }

    #[test]
    fn environment_values_are_sealed_on_disk_and_open_only_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        let key = Arc::new(NodeKey::generate().unwrap());
        let mut f = func("s");
        f.env = BTreeMap::from([("DB_PASSWORD".to_string(), "TOPSECRET-4711".to_string())]);
        let reg = Registry::open(&path).unwrap().with_key(Some(key.clone()));
        reg.insert_function(&f).unwrap();
        assert_eq!(reg.get_function("s").unwrap(), Some(f.clone()));
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            assert!(!bytes.windows(14).any(|w| w == b"TOPSECRET-4711"), "the secret is in clear on disk");
        }
        drop(reg);
        assert_eq!(Registry::open(&path).unwrap().with_key(Some(key.clone())).get_function("s").unwrap(), Some(f));
        let e = Registry::open(&path).unwrap().with_key(None).get_function("s").unwrap_err().to_string();
        assert!(e.contains("sealed and the node has no node key"), "{e}");
        let other = Arc::new(NodeKey::generate().unwrap());
        let e = Registry::open(&path).unwrap().with_key(Some(other)).get_function("s").unwrap_err().to_string();
        assert!(e.contains("does not open with node key"), "{e}");
        // Rows written in clear before the node had a key still read.
        let plain = Registry::open(&path).unwrap().with_key(None);
        plain.insert_function(&func("old")).unwrap();
        assert_eq!(Registry::open(&path).unwrap().with_key(Some(key)).get_function("old").unwrap(), Some(func("old")));
    }

    #[test]
    fn event_payloads_are_sealed_on_disk_and_open_only_with_the_key_as_their_own_event() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        let key = Arc::new(NodeKey::generate().unwrap());
        let event = |id: &str, payload: &[u8]| EventRecord {
            id: id.into(),
            function: "f".into(),
            version: None,
            qualifier: None,
            payload: payload.to_vec(),
            attempts: 0,
            next_attempt_ms: 5,
        };
        let ev = event("e1", br#"{"card": "TOPSECRET-4711"}"#);
        let reg = Registry::open(&path).unwrap().with_key(Some(key.clone()));
        reg.enqueue_event(&ev).unwrap();
        assert_eq!(reg.due_events(10, 10).unwrap(), vec![(ev.clone(), Ok(()))]);
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            assert!(!bytes.windows(14).any(|w| w == b"TOPSECRET-4711"), "the payload is in clear on disk");
        }
        // Without the key, or with another: listed with why, its payload empty.
        let (e, why) = Registry::open(&path).unwrap().with_key(None).due_events(10, 10).unwrap().remove(0);
        assert!(e.payload.is_empty() && why.unwrap_err().contains("sealed and the node has no node key"));
        let other = Arc::new(NodeKey::generate().unwrap());
        let (_, why) = Registry::open(&path).unwrap().with_key(Some(other)).due_events(10, 10).unwrap().remove(0);
        assert!(why.unwrap_err().contains("does not open with node key"));
        // A payload moved to another event does not open there.
        reg.enqueue_event(&event("e2", b"{}")).unwrap();
        reg.conn().execute("UPDATE events SET payload=(SELECT payload FROM events WHERE id='e1') WHERE id='e2'", []).unwrap();
        let due = reg.due_events(10, 10).unwrap();
        assert_eq!(due.iter().map(|(e, why)| (e.id.as_str(), why.is_ok())).collect::<Vec<_>>(), [("e1", true), ("e2", false)]);
        // Events queued in clear (before the node had a key) still read.
        Registry::open(&path).unwrap().with_key(None).enqueue_event(&event("old", b"plain")).unwrap();
        let due = reg.due_events(10, 10).unwrap();
        assert_eq!(due[2], (event("old", b"plain"), Ok(())));
    }

    #[test]
    fn settings_round_trip_and_go_with_the_function() {
        let reg = Registry::open_in_memory().unwrap();
        reg.insert_function(&func("s")).unwrap();
        assert_eq!(reg.get_settings("s").unwrap(), FunctionSettings::default());
        let url = UrlConfig { auth_type: "NONE".into(), cors: None, creation_time: "t".into(), last_modified_time: "t".into() };
        let set = FunctionSettings {
            reserved_concurrency: Some(3),
            tags: BTreeMap::from([("team".to_string(), "a".to_string())]),
            url: Some(url.clone()),
            alias_urls: BTreeMap::from([("live".to_string(), UrlConfig { auth_type: "AWS_IAM".into(), ..url })]),
            snap_start: Some("PublishedVersions".into()),
        };
        reg.put_settings("s", &set).unwrap();
        assert_eq!(reg.get_settings("s").unwrap(), set);
        reg.delete_function("s").unwrap();
        assert_eq!(reg.get_settings("s").unwrap(), FunctionSettings::default());
    }
}
