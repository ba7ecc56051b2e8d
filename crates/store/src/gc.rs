//! Garbage collection of packs (and format 1 chunks) no manifest references.
//! "Object" below is either: `packs/<sha>` or `chunks/<sha>` (and, collected the same
//! way, a base's manifest no diff names, and a recorded working set, `ws/<id>.trace`,
//! or a head's copy, `heads/<id>` and `heads/<id>.rest`, whose snapshot is gone).
//!
//! Two phases, so that a publish in flight never loses an object:
//! 1. A run *condemns* the unreferenced chunks older than the grace period and
//!    records them with the time of the listing in `gc/condemned.json`.
//!    Chunks an in-flight publisher uploaded are younger than the grace
//!    period, so they are not condemned.
//! 2. A later run, at least the grace period after that, deletes the condemned
//!    chunks that are still unreferenced and were not written again since.
//!
//! A publisher skips uploading chunks the store has, except condemned ones,
//! which it uploads again (refreshing their time). A publisher that skipped a
//! chunk before it was condemned finishes (writes its manifest) within the
//! grace period, so the deleting run sees the manifest and keeps the chunk.
//! Assumption: a publish takes less than the grace period (default 1 hour).
//! Manifests are not deleted here, but for those of bases (`is_base`) that no
//! manifest names any more, which go through the same two phases (a publisher
//! of a diff on a condemned base writes its manifest again); deleting a
//! snapshot = deleting its manifest, after which its chunks become orphans.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::fetch::manifest;
use crate::remote::{is_sha256_hex, Remote};

pub const CONDEMNED_KEY: &str = "gc/condemned.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Condemned {
    at_unix_ms: u64,
    /// Keys (`packs/<sha>`, `chunks/<sha>`); a bare hash, as written before packs, is a chunk.
    chunks: Vec<String>,
}

/// The collected prefixes.
const COLLECTED: [&str; 2] = ["chunks", "packs"];

#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub manifests: usize,
    /// Objects (packs and format 1 chunks) in the store.
    pub chunks: usize,
    pub referenced_chunks: usize,
    /// Objects deleted by this run (condemned by an earlier one).
    pub deleted: usize,
    pub deleted_bytes: u64,
    /// Unreferenced objects this run condemned (deleted by a run one grace period later).
    pub condemned: usize,
    /// The previous condemnation is younger than the grace period: nothing was
    /// deleted or condemned; run again after this many seconds.
    pub wait_seconds: Option<f64>,
    /// Bytes of all packs and chunks in the store after this run.
    pub store_bytes: u64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

async fn read_condemned(remote: &Remote) -> Result<Option<Condemned>> {
    match remote.get(CONDEMNED_KEY).await {
        Ok(b) => Ok(serde_json::from_slice(&b).map_err(|e| {
            tracing::warn!("ignoring unreadable {}: {e}", remote.url.object_url(CONDEMNED_KEY));
        }).ok()),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A condemned entry as a key.
fn as_key(entry: String) -> String {
    if is_sha256_hex(&entry) {
        Remote::chunk_key(&entry)
    } else {
        entry
    }
}

/// The objects (keys) the collector has condemned (a publisher uploads these again).
pub async fn condemned(remote: &Remote) -> Result<HashSet<String>> {
    Ok(read_condemned(remote).await?.map(|c| c.chunks.into_iter().map(as_key).collect()).unwrap_or_default())
}

/// Every object (key) referenced by a manifest, and how many manifests there are;
/// and, collected like objects, the manifests of bases no manifest names any more and
/// the recorded working sets (`ws/<id>.trace`) and head copies (`heads/<id>`, `heads/<id>.rest`) of snapshots whose manifest is gone
/// (with their metadata). A manifest that cannot be read or verified stops the
/// collection: what it references is unknown.
pub async fn referenced(remote: &Remote) -> Result<(HashSet<String>, usize, Vec<(String, object_store::ObjectMeta)>)> {
    let mut refs = HashSet::new();
    let (mut bases, mut named) = (Vec::new(), HashSet::new());
    let list = remote.list("snapshots").await?;
    for (key, _) in &list {
        let Some(id) = key.strip_prefix("snapshots/").and_then(|k| k.strip_suffix(".json")).filter(|i| is_sha256_hex(i)) else {
            tracing::warn!("ignoring {} (not a manifest name)", remote.url.object_url(key));
            continue;
        };
        let (m, _) = manifest(remote, id).await?;
        if m.is_base {
            bases.push(id.to_string());
        }
        named.extend(m.base.clone());
        if m.packed() {
            refs.extend(m.packs.iter().map(|p| crate::pack::pack_key(&p.name)));
        } else {
            refs.extend(m.unique_chunks().into_iter().map(|(s, _)| Remote::chunk_key(&s)));
        }
    }
    let mut unnamed: Vec<_> = list
        .iter()
        .filter(|(key, _)| bases.iter().any(|b| *key == Remote::manifest_key(b) && !named.contains(b)))
        .cloned()
        .collect();
    let ids: HashSet<&str> = list.iter().filter_map(|(k, _)| k.strip_prefix("snapshots/")?.strip_suffix(".json")).collect();
    unnamed.extend(remote.list("ws").await?.into_iter().filter(|(key, _)| {
        key.strip_prefix("ws/").and_then(|k| k.strip_suffix(".trace")).is_none_or(|id| !ids.contains(id))
    }));
    unnamed.extend(remote.list("heads").await?.into_iter().filter(|(key, _)| key.strip_prefix("heads/").is_none_or(|k| !ids.contains(k.strip_suffix(".rest").unwrap_or(k)))));
    Ok((refs, list.len(), unnamed))
}

pub async fn gc(remote: &Remote, grace: Duration) -> Result<GcReport> {
    let prev = read_condemned(remote).await?;
    let now = SystemTime::now();
    if let Some(p) = &prev {
        let age = Duration::from_millis(unix_ms(now).saturating_sub(p.at_unix_ms));
        if age < grace {
            return Ok(GcReport { wait_seconds: Some((grace - age).as_secs_f64()), ..Default::default() });
        }
    }
    // Manifests are listed before objects: an object written after the manifest
    // listing is younger than the grace period, so it is not condemned.
    let (refs, manifests, unnamed_bases) = referenced(remote).await?;
    let mut objects = Vec::new();
    for dir in COLLECTED {
        objects.extend(remote.list(dir).await?);
    }
    // A base no diff names is collected like an object (its packs after it).
    objects.extend(unnamed_bases);
    let mut report = GcReport { manifests, chunks: objects.len(), ..Default::default() };
    let mut deleted = HashSet::new();
    if let Some(p) = &prev {
        let due: HashSet<String> = p.chunks.iter().cloned().map(as_key).collect();
        for (key, meta) in &objects {
            // Written again since it was condemned (by a publisher): keep. Times
            // from the store have 1 s resolution.
            let rewritten = unix_ms(meta.last_modified.into()) + 1000 >= p.at_unix_ms;
            if due.contains(key) && !refs.contains(key) && !rewritten {
                remote.delete(key).await?;
                report.deleted += 1;
                report.deleted_bytes += meta.size;
                deleted.insert(key.clone());
            }
        }
    }
    let cutoff = unix_ms(now).saturating_sub(grace.as_millis() as u64 + 1000);
    let condemn: Vec<String> = objects
        .iter()
        .filter(|(key, meta)| !refs.contains(key) && !deleted.contains(key) && unix_ms(meta.last_modified.into()) < cutoff)
        .map(|(key, _)| key.clone())
        .collect();
    report.referenced_chunks = objects.iter().filter(|(k, _)| refs.contains(k)).count();
    report.condemned = condemn.len();
    report.store_bytes = objects.iter().filter(|(k, _)| !deleted.contains(k)).map(|(_, m)| m.size).sum();
    if condemn.is_empty() {
        if prev.is_some() {
            remote.delete(CONDEMNED_KEY).await?;
        }
    } else {
        let c = Condemned { at_unix_ms: unix_ms(now), chunks: condemn };
        remote.put(CONDEMNED_KEY, Bytes::from(serde_json::to_vec(&c).expect("serializes"))).await?;
    }
    Ok(report)
}
