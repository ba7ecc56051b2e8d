//! Published versions (issue #16): PublishVersion freezes the function's active
//! revision — its code, handler, memory, environment and snapshot — together with
//! its timeout and description under the next version number; invocations with that
//! qualifier are served from that revision's snapshot (Thaw snapshots every version:
//! SnapStart's `ApplyOn: PublishedVersions` is what it always does). A revision stays
//! on disk while a version points at it, after $LATEST has moved on.

use std::collections::BTreeMap;
use std::sync::Arc;

use thiserror::Error;
use tracing::{info, warn};

use super::{timestamp, FunctionSpec, Node, NodeError, Revision};
use crate::registry::{AliasRecord, RegistryError, RevisionRecord, VersionRecord};

/// A version as the node serves it.
pub(super) struct Published {
    pub(super) rec: VersionRecord,
    pub(super) rev: Arc<Revision>,
}

#[derive(Debug, Error)]
pub enum VersionError {
    #[error("Function not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Precondition(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// What GetFunction / ListVersionsByFunction report of a version.
#[derive(Debug, Clone)]
pub struct VersionView {
    pub version: VersionRecord,
    pub revision: RevisionRecord,
}

impl Node {
    /// The published versions of `name` at start-up (their revisions kept on disk).
    pub(super) fn load_versions(&self, name: &str, active: Option<&Arc<Revision>>) -> Result<BTreeMap<u64, Published>, NodeError> {
        let mut out = BTreeMap::new();
        for v in self.registry.list_versions(name)? {
            let rev = match active {
                Some(a) if a.id == v.revision => a.clone(),
                _ => match self.registry.get_revision(v.revision)? {
                    Some(r) => Arc::new(Revision::new(&r, name, &self.cfg)),
                    None => {
                        warn!(function = name, version = v.version, revision = v.revision, "version without its revision; dropped");
                        self.registry.delete_version(name, v.version)?;
                        continue;
                    }
                },
            };
            out.insert(v.version, Published { rec: v, rev });
        }
        Ok(out)
    }

    /// PublishVersion: the active revision as the next version (or the latest version
    /// again when nothing changed since it was published, as Lambda does).
    pub fn publish_version(&self, name: &str, description: Option<String>, code_sha256: Option<&str>, revision_id: Option<&str>) -> Result<VersionView, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let mut st = f.lock();
        let conflict = || VersionError::Conflict(format!("The operation cannot be performed at this time. An update is in progress for resource: {}", self.arn(name)));
        if st.building.is_some() {
            return Err(conflict());
        }
        let Some(active) = st.active.clone() else { return Err(conflict()) };
        if code_sha256.is_some_and(|c| c != st.rec.code_sha256) {
            return Err(VersionError::Precondition(format!(
                "CodeSHA256 ({}) is different from current CodeSHA256 in $LATEST ({}). Please try again with the CodeSHA256 in $LATEST.",
                code_sha256.unwrap_or_default(),
                st.rec.code_sha256
            )));
        }
        if revision_id.is_some_and(|r| r != st.rec.revision_id) {
            return Err(VersionError::Precondition(
                "The Revision Id provided does not match the latest Revision Id. Call the GetFunction/GetAlias API to retrieve the latest Revision Id".into(),
            ));
        }
        let unchanged = st.versions.values().next_back().filter(|p| {
            p.rec.revision == active.id && p.rec.timeout_s == st.rec.timeout_s && description.as_deref().is_none_or(|d| d == p.rec.description)
        });
        if let Some(p) = unchanged {
            let version = p.rec.clone();
            drop(st);
            return self.view(version);
        }
        // Never a number used before, even by a deleted version (as Lambda numbers them).
        let last = st.versions.keys().next_back().copied().unwrap_or(0).max(self.registry.last_version(name)?);
        let rec = VersionRecord {
            function: name.to_string(),
            version: last + 1,
            revision: active.id,
            description: description.unwrap_or_else(|| st.rec.description.clone()),
            timeout_s: st.rec.timeout_s,
            revision_id: uuid::Uuid::new_v4().to_string(),
            last_modified: timestamp(),
        };
        self.registry.insert_version(&rec)?;
        st.versions.insert(rec.version, Published { rec: rec.clone(), rev: active });
        drop(st);
        info!(function = name, version = rec.version, revision = rec.revision, "version published");
        self.view(rec)
    }

    fn view(&self, version: VersionRecord) -> Result<VersionView, VersionError> {
        let revision = self
            .registry
            .get_revision(version.revision)?
            .ok_or_else(|| VersionError::NotFound(format!("{}:{}", self.arn(&version.function), version.version)))?;
        Ok(VersionView { version, revision })
    }

    /// One published version.
    pub fn version(&self, name: &str, version: u64) -> Result<VersionView, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let rec = f.lock().versions.get(&version).map(|p| p.rec.clone());
        self.view(rec.ok_or_else(|| VersionError::NotFound(format!("{}:{version}", self.arn(name))))?)
    }

    /// Every published version, oldest first.
    pub fn versions(&self, name: &str) -> Result<Vec<VersionView>, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let recs: Vec<VersionRecord> = f.lock().versions.values().map(|p| p.rec.clone()).collect();
        recs.into_iter().map(|r| self.view(r)).collect()
    }

    /// DeleteFunction with a version qualifier: that version only. Its revision goes
    /// too when neither $LATEST nor another version uses it.
    pub fn delete_version(&self, name: &str, version: u64) -> Result<(), VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let mut st = f.lock();
        let users: Vec<String> =
            st.aliases.values().filter(|a| a.version == version || a.weights.contains_key(&version)).map(|a| a.name.clone()).collect();
        if !users.is_empty() {
            return Err(VersionError::Conflict(format!(
                "Unable to delete version because the following aliases reference it: [{}]",
                users.join(", ")
            )));
        }
        let p = st.versions.remove(&version).ok_or_else(|| VersionError::NotFound(format!("{}:{version}", self.arn(name))))?;
        if let Err(e) = self.registry.delete_version(name, version) {
            st.versions.insert(version, p);
            return Err(e.into());
        }
        if st.provisioned.remove(&version).is_some() {
            self.registry.put_provisioned(name, version, None)?;
        }
        let used = st.serves(&p.rev);
        if !used {
            let (stale, keep): (Vec<_>, Vec<_>) = st.idle.drain(..).partition(|i| Arc::ptr_eq(&i.rev, &p.rev));
            st.idle = keep;
            st.live -= stale.len();
            drop(st);
            self.metrics.instances_idle.sub(stale.len() as i64);
            for i in stale {
                self.discard(i.inst);
            }
            let _ = self.registry.delete_revision(p.rev.id);
            p.rev.retire();
        }
        info!(function = name, version, "version deleted");
        Ok(())
    }
}

/// A version as the cluster's registry numbered it (issue #29): its number, and the
/// code and configuration $LATEST had when it was published.
#[derive(Debug, Clone)]
pub struct VersionSpec {
    pub version: u64,
    /// Its configuration (`description` and `timeout_s` are the version's own).
    pub spec: FunctionSpec,
    /// Lambda's CodeSha256 of its bundle (base64 of the zip's SHA-256).
    pub code_sha256: String,
    /// A stored snapshot of this version another node published: a revision built for
    /// it serves from that (fetched when first needed) instead of capturing its own.
    pub snapshot: Option<String>,
}

/// How [`Node::ensure_version`] left a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionState {
    /// Published: invocations with its number are served.
    Serving,
    /// Its revision is being built (or another build of the function runs): ask again.
    Building,
    /// It needs a revision of its own: ask again with its bundle.
    NeedsCode,
}

impl Node {
    /// Make version `v.version` of `name` exist as the registry describes it, under that
    /// very number (the cluster numbers versions, not the node). Served from the active
    /// revision when that is the version's code and configuration (the common case:
    /// published right after a deploy); else from a revision built for it from `zip`
    /// (serving from `v.snapshot` when given, else its snapshot captured here) without
    /// touching $LATEST. A version the node has
    /// already is left as it is (versions do not change).
    pub async fn ensure_version(self: &Arc<Self>, name: &str, v: &VersionSpec, zip: Option<Vec<u8>>) -> Result<VersionState, super::DeployError> {
        use super::DeployError;
        let f = self.function(name).ok_or_else(|| DeployError::NotFound(self.arn(name)))?;
        let record = |revision: i64| VersionRecord {
            function: name.to_string(),
            version: v.version,
            revision,
            description: v.spec.description.clone(),
            timeout_s: v.spec.timeout_s,
            revision_id: uuid::Uuid::new_v4().to_string(),
            last_modified: timestamp(),
        };
        {
            let mut st = f.lock();
            if st.versions.contains_key(&v.version) {
                return Ok(VersionState::Serving);
            }
            if st.building.is_some() {
                return Ok(VersionState::Building);
            }
            if let Some(active) = st.active.clone() {
                let same = self.registry.get_revision(active.id)?.is_some_and(|r| {
                    r.code_sha256 == v.code_sha256
                        && r.runtime == v.spec.runtime
                        && r.handler == v.spec.handler
                        && r.memory_mb == v.spec.memory_mb
                        && r.env == v.spec.env
                        && r.layers == v.spec.layers
                });
                if same {
                    let rec = record(active.id);
                    self.registry.insert_version(&rec)?;
                    info!(function = name, version = v.version, revision = active.id, "version of the registry published from the active revision");
                    st.versions.insert(v.version, Published { rec, rev: active });
                    return Ok(VersionState::Serving);
                }
            }
        }
        let Some(zip) = zip else { return Ok(VersionState::NeedsCode) };
        let sha = crate::bundle::code_sha256(&zip);
        let size = zip.len() as u64;
        let (dir, code_bytes) = self.unpack(name, Arc::new(zip)).await?;
        self.add_layers(&dir, &v.spec.layers, code_bytes).await?;
        let mut rev = Self::revision_record(&v.spec, dir.clone(), &sha, size);
        self.adopting(&mut rev, v.snapshot.clone());
        let mut st = f.lock();
        if st.deleted || st.building.is_some() {
            let deleted = st.deleted;
            drop(st);
            let _ = std::fs::remove_dir_all(&dir);
            return if deleted { Err(DeployError::NotFound(self.arn(name))) } else { Ok(VersionState::Building) };
        }
        rev.id = match self.registry.insert_revision(&rev) {
            Ok(id) => id,
            Err(e) => {
                drop(st);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        st.building = Some(dir);
        drop(st);
        info!(function = name, version = v.version, revision = rev.id, "building a revision for a version of the registry");
        let rec = record(rev.id);
        self.spawn_build_for(f, rev, Some(rec));
        Ok(VersionState::Building)
    }

    /// The stored snapshot that published version `n` of `name` serves from (the one
    /// its revision captured and published, or adopted), if the node has the version
    /// and the snapshot is in the store.
    pub fn version_snapshot(&self, name: &str, n: u64) -> Option<String> {
        let f = self.function(name)?;
        let st = f.lock();
        st.versions.get(&n)?.rev.snapshot.stored_id()
    }
}

/// The version number an alias of `$LATEST` records.
pub const LATEST: u64 = 0;

/// At most this many extra versions in an alias's routing, as Lambda allows.
const MAX_ADDITIONAL_VERSIONS: usize = 1;

/// An alias routing to `version` and `weights` (extra versions and their shares) is
/// valid, the versions being those `exists` says are published (`arn`: the function's,
/// for the messages). Shared by the node and the cluster's registry.
pub fn check_routing(arn: &str, version: u64, weights: &BTreeMap<u64, f64>, exists: impl Fn(u64) -> bool) -> Result<(), VersionError> {
    let missing = |v: u64| VersionError::NotFound(format!("{arn}:{v}"));
    if version == LATEST {
        return match weights.is_empty() {
            true => Ok(()),
            false => Err(VersionError::Invalid("RoutingConfig is not supported for an alias of $LATEST.".into())),
        };
    }
    if !exists(version) {
        return Err(missing(version));
    }
    if weights.len() > MAX_ADDITIONAL_VERSIONS {
        return Err(VersionError::Invalid(format!("RoutingConfig may name at most {MAX_ADDITIONAL_VERSIONS} additional version.")));
    }
    for (&v, &w) in weights {
        if !(0.0..=1.0).contains(&w) || w.is_nan() {
            return Err(VersionError::Invalid(format!(
                "1 validation error detected: Value '{w}' at 'routingConfig.additionalVersionWeights' failed to satisfy constraint: Member must have value between 0.0 and 1.0"
            )));
        }
        if v == version {
            return Err(VersionError::Invalid("The additional version in RoutingConfig must differ from the alias's FunctionVersion.".into()));
        }
        if !exists(v) {
            return Err(missing(v));
        }
    }
    Ok(())
}

/// What CreateAlias / UpdateAlias ask for (fields `None` are kept by an update).
#[derive(Debug, Clone, Default)]
pub struct AliasChange {
    pub version: Option<u64>,
    pub description: Option<String>,
    pub weights: Option<BTreeMap<u64, f64>>,
    /// The precondition of an update: the alias's current RevisionId.
    pub revision_id: Option<String>,
}

/// Alias `alias` of function `name` (ARN `arn`) after `change`, from what it was
/// (`old`): created (`create`) or updated, as Lambda refuses or merges it. Its
/// routing is checked by the caller ([`check_routing`]).
pub fn changed_alias(arn: &str, name: &str, alias: &str, old: Option<AliasRecord>, change: AliasChange, create: bool) -> Result<AliasRecord, VersionError> {
    if !alias_name_ok(alias) {
        return Err(VersionError::Invalid(format!(
            "1 validation error detected: Value '{alias}' at 'name' failed to satisfy constraint: Member must satisfy regular expression pattern: (?!^[0-9]+$)([a-zA-Z0-9-_]+)"
        )));
    }
    match (old, create) {
        (Some(_), true) => Err(VersionError::Conflict(format!("Alias already exists: {arn}:{alias}"))),
        (None, false) => Err(VersionError::NotFound(format!("Alias not found: {arn}:{alias}"))),
        (Some(old), false) => {
            if change.revision_id.as_ref().is_some_and(|r| *r != old.revision_id) {
                return Err(VersionError::Precondition(
                    "The Revision Id provided does not match the latest Revision Id. Call the GetFunction/GetAlias API to retrieve the latest Revision Id".into(),
                ));
            }
            Ok(AliasRecord {
                version: change.version.unwrap_or(old.version),
                description: change.description.unwrap_or(old.description),
                weights: change.weights.unwrap_or(old.weights),
                revision_id: uuid::Uuid::new_v4().to_string(),
                ..old
            })
        }
        (None, true) => Ok(AliasRecord {
            function: name.to_string(),
            name: alias.to_string(),
            version: change.version.ok_or_else(|| VersionError::Invalid("FunctionVersion is required".into()))?,
            description: change.description.unwrap_or_default(),
            weights: change.weights.unwrap_or_default(),
            revision_id: uuid::Uuid::new_v4().to_string(),
        }),
    }
}

fn alias_name_ok(a: &str) -> bool {
    (1..=128).contains(&a.len())
        && a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !a.bytes().all(|b| b.is_ascii_digit())
}

impl Node {
    pub(super) fn load_aliases(&self, name: &str) -> Result<BTreeMap<String, AliasRecord>, NodeError> {
        Ok(self.registry.list_aliases(name)?.into_iter().map(|a| (a.name.clone(), a)).collect())
    }

    fn check_alias(&self, st: &super::FnState, name: &str, version: u64, weights: &BTreeMap<u64, f64>) -> Result<(), VersionError> {
        check_routing(&self.arn(name), version, weights, |v| st.versions.contains_key(&v))
    }

    /// CreateAlias (`create`) or UpdateAlias (fields `None` are kept).
    pub fn put_alias(&self, name: &str, alias: &str, change: AliasChange, create: bool) -> Result<AliasRecord, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let mut st = f.lock();
        let old = st.aliases.get(alias).cloned();
        let rec = changed_alias(&self.arn(name), name, alias, old, change, create)?;
        self.check_alias(&st, name, rec.version, &rec.weights)?;
        self.registry.put_alias(&rec)?;
        st.aliases.insert(alias.to_string(), rec.clone());
        Ok(rec)
    }

    pub fn alias(&self, name: &str, alias: &str) -> Result<AliasRecord, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let a = f.lock().aliases.get(alias).cloned();
        a.ok_or_else(|| VersionError::NotFound(format!("Function not found: {}:{alias}", self.arn(name))))
    }

    pub fn aliases(&self, name: &str) -> Result<Vec<AliasRecord>, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let a = f.lock().aliases.values().cloned().collect();
        Ok(a)
    }

    pub fn delete_alias(&self, name: &str, alias: &str) -> Result<(), VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let mut st = f.lock();
        if st.aliases.contains_key(alias) {
            self.registry.delete_alias(name, alias)?;
            st.aliases.remove(alias);
            // Its function URL goes with it (as in Lambda).
            if st.settings.alias_urls.remove(alias).is_some() {
                self.registry.put_settings(name, &st.settings)?;
            }
        }
        Ok(())
    }

    /// The version an invocation through `alias` runs: its version, or an additional
    /// one with its weight's probability.
    pub fn route_alias(&self, name: &str, alias: &str) -> Result<u64, VersionError> {
        let a = self.alias(name, alias)?;
        let r = (uuid::Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for (&v, &w) in &a.weights {
            acc += w;
            if r < acc {
                return Ok(v);
            }
        }
        Ok(a.version)
    }
}
