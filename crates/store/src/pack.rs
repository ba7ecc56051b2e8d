//! Packs (issue #28): the store's chunks travel in a few large objects.
//!
//! A store of one object per 8 KiB chunk made a cold restore of a 5.5 MB
//! snapshot cost 682 requests and one of lrserving ~8,400: per-request latency,
//! not bandwidth, was 93–99% of a miss. Now a publish puts the chunks the store
//! lacks, in file order, into packs of about [`PACK_TARGET`] bytes
//! (`packs/<sha256 of the pack>`), and the manifest says where each chunk is
//! (pack, offset). A fetch reads each pack it needs in one ranged GET (ranges of
//! one pack closer than [`RANGE_GAP`] are coalesced), and checks every chunk
//! against its own hash, so a corrupt pack is refused by the chunk it damaged.
//!
//! Dedup stays by chunk hash: before packing, the publisher reads the newest
//! [`INDEX_MANIFESTS`] manifests of the store and reuses the place of every chunk
//! they hold (unless the collector condemned its pack). A snapshot whose contents
//! are already stored (same [`Manifest::content_digest`]) is not published again:
//! its packs are checked (HEAD) and repaired from the local files if damaged.
//! Publishers racing on an empty store pack the same chunks the same way, so they
//! write the same packs and the same manifest.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};

use crate::error::{Result, StoreError};
use crate::fetch::manifest;
use crate::manifest::{ChunkHash, Manifest, PackRef, MANIFEST_FORMAT, MANIFEST_FORMAT_COMPACT, MANIFEST_FORMAT_COMPRESSED};
use crate::publish::Plan;
use crate::remote::{is_sha256_hex, sha256_hex, Remote};

/// Bytes of new chunks per pack (a pack closes at the first chunk past it).
pub const PACK_TARGET: u64 = 8 << 20;
/// The newest manifests a publisher reads to find chunks the store has.
pub const INDEX_MANIFESTS: usize = 32;
/// Ranges of one pack closer than this are fetched in one request.
pub const RANGE_GAP: u64 = 1 << 20;
/// Packs uploaded at once (each is held in memory while it is sent).
const PACK_CONCURRENCY: usize = 4;

pub fn pack_key(name: &str) -> String {
    format!("packs/{name}")
}

/// Where the store has a chunk: (pack, offset in it, compressed length if compressed).
type Place = (PackRef, u64, Option<u64>);

/// Where each member of a pack is: (offset, compressed length if compressed).
type Layout = Vec<(u64, Option<u64>)>;

/// zstd's level for chunks: 3 (its default) stores lrserving's pages in 0.29 of
/// their size and decompresses at well over the speed of a 10 Gbit link; level 1
/// saves little time for 3% more bytes (measured on 8 KiB chunks of pages.img).
const ZSTD_LEVEL: i32 = 3;

/// A manifest's bytes as stored: from format 3 on compressed with zstd (its id stays
/// the hash of its bytes, JSON or binary; lrserving's 1.2 MB JSON manifest is stored
/// in ~0.4 MB, and it is read before anything else on every miss), earlier formats as
/// they are. Format 7's compact tables are mostly hashes: compressed only where that
/// saves an eighth, else a miss would decompress it for little.
pub fn stored_manifest(m: &Manifest, bytes: Vec<u8>) -> Bytes {
    if m.format >= MANIFEST_FORMAT_COMPRESSED {
        if let Ok(z) = zstd::bulk::compress(&bytes, ZSTD_LEVEL) {
            if m.format < MANIFEST_FORMAT_COMPACT || z.len() <= bytes.len() - bytes.len() / 8 {
                return Bytes::from(z);
            }
        }
    }
    Bytes::from(bytes)
}

/// Whether publishes compress chunks (format 3). `THAW_STORE_FORMAT=2` stores them
/// raw, in format 2, as before compression (kept to measure against).
fn compressing() -> bool {
    std::env::var("THAW_STORE_FORMAT").as_deref() != Ok("2")
}

/// A chunk's bytes as stored: compressed when that saves at least an eighth.
fn compress(zip: &mut zstd::bulk::Compressor<'static>, raw: &[u8]) -> Option<Vec<u8>> {
    let z = zip.compress(raw).ok()?;
    (z.len() < raw.len() - raw.len() / 8).then_some(z)
}

/// What a packed publish did.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub id: String,
    pub manifest_len: u64,
    /// Chunks put into new packs, and their bytes.
    pub chunks_uploaded: usize,
    pub chunk_bytes_uploaded: u64,
    pub packs: usize,
    pub packs_uploaded: usize,
    /// Bytes sent (packs, the head's copy and the manifest).
    pub bytes_uploaded: u64,
    /// Bytes of the head's copy under the snapshot's id (`Remote::head_key`).
    pub head_copy_bytes: u64,
    /// Requests made to the store.
    pub requests: u64,
}

/// The chunks the newest manifests of the store hold, and the stored snapshot with
/// the same contents as `digest`, if any.
async fn index(remote: &Remote, digest: &str, condemned: &HashSet<String>, requests: &AtomicU64) -> Result<(HashMap<ChunkHash, Place>, Option<(String, Manifest)>)> {
    let mut list = remote.list("snapshots").await?;
    requests.fetch_add(1, Relaxed);
    list.sort_by_key(|o| std::cmp::Reverse(o.1.last_modified));
    let ids: Vec<String> = list
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("snapshots/").and_then(|k| k.strip_suffix(".json")).filter(|i| is_sha256_hex(i)).map(String::from))
        .take(INDEX_MANIFESTS)
        .collect();
    requests.fetch_add(ids.len() as u64, Relaxed);
    let got: Vec<Option<(String, Manifest)>> = futures::stream::iter(ids)
        .map(|id| async move {
            match manifest(remote, &id).await {
                Ok((m, _)) => Ok(Some((id, m))),
                // Deleted meanwhile, or unreadable: it just does not help.
                Err(StoreError::NotFound { .. }) => Ok(None),
                Err(e @ StoreError::Remote { .. }) => Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring an unreadable manifest while looking for stored chunks");
                    Ok(None)
                }
            }
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    let mut places = HashMap::new();
    let mut same = None;
    for (id, m) in got.into_iter().flatten().filter(|(_, m)| m.packed()) {
        if same.is_none() && m.content_digest() == digest && m.packs.iter().all(|p| !condemned.contains(&pack_key(&p.name))) {
            same = Some((id, m));
            continue;
        }
        for c in m.files.iter().flat_map(|f| &f.chunks) {
            if let (Some(sha), Some(p), Some(at)) = (c.sha256, c.pack, c.at) {
                let pack = &m.packs[p as usize];
                if !condemned.contains(&pack_key(&pack.name)) {
                    places.entry(sha).or_insert_with(|| (pack.clone(), at, c.zlen));
                }
            }
        }
    }
    Ok((places, same))
}

/// The bytes of new pack `members` (indexes into `plan.uploads`), back to back, each
/// compressed where that pays; and where each member is: (offset, compressed length).
fn assemble(plan: &Plan, members: &[usize]) -> Result<(Bytes, Layout)> {
    let mut b = BytesMut::with_capacity(members.iter().map(|&i| plan.uploads[i].len as usize).sum());
    let mut layout = Vec::with_capacity(members.len());
    let mut zip = compressing().then(|| zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()).flatten();
    for &i in members {
        let u = &plan.uploads[i];
        let raw = plan.read(u)?;
        let at = b.len() as u64;
        let tried = !(plan.ws_lz4_packed_raw && u.file == thaw_engine::ws::LZ4_FILE);
        match zip.as_mut().filter(|_| tried).and_then(|z| compress(z, &raw)) {
            Some(z) => {
                layout.push((at, Some(z.len() as u64)));
                b.extend_from_slice(&z);
            }
            None => {
                layout.push((at, None));
                b.extend_from_slice(&raw);
            }
        }
    }
    Ok((b.freeze(), layout))
}

/// Whether the store has `pack`, whole, and the collector did not condemn it (a
/// condemned pack is put again rather than relied on).
async fn stored_whole(remote: &Remote, pack: &PackRef, condemned: &HashSet<String>, requests: &AtomicU64) -> Result<bool> {
    let key = pack_key(&pack.name);
    if condemned.contains(&key) {
        return Ok(false);
    }
    requests.fetch_add(1, Relaxed);
    Ok(remote.head(&key).await?.is_some_and(|m| m.size == pack.size))
}

/// The chunks of `plan` the store lacks (`stored` says which it has), in plan
/// order (file order), cut into packs of about `target` bytes: indexes into
/// `plan.uploads`.
pub fn new_packs(plan: &Plan, stored: impl Fn(&ChunkHash) -> bool, target: u64) -> Vec<Vec<usize>> {
    let mut packs: Vec<Vec<usize>> = Vec::new();
    let mut fill = target;
    // `plan.last` after the others: on-demand reads of the others coalesce, and a miss
    // never reads these (it builds them from ws.pages).
    let last: HashSet<usize> = plan.last.iter().copied().collect();
    let order = (0..plan.uploads.len()).filter(|i| !last.contains(i)).chain(plan.last.iter().copied());
    for i in order {
        let u = &plan.uploads[i];
        if stored(&u.sha256) {
            continue;
        }
        if fill >= target {
            packs.push(Vec::new());
            fill = 0;
        }
        packs.last_mut().expect("a pack was opened").push(i);
        fill += u.len;
    }
    packs
}

/// The packs a publish of `plan` stores when the store has the chunks `stored` says:
/// the head first (a pack of its own, whatever of it the store has elsewhere: one
/// read starts a restore), then the other chunks the store lacks.
pub fn packs_to_store(plan: &Plan, stored: impl Fn(&ChunkHash) -> bool) -> Vec<Vec<usize>> {
    let head_set: HashSet<ChunkHash> = plan.head.iter().map(|&i| plan.uploads[i].sha256).collect();
    let mut packs = new_packs(plan, |sha| stored(sha) || head_set.contains(sha), PACK_TARGET);
    if !plan.head.is_empty() {
        packs.insert(0, plan.head.clone());
    }
    packs
}

/// Build new pack `members` of `plan` and store it (unless the store has it, whole
/// and not condemned). Returns the pack, whether it was sent, its layout and bytes.
pub async fn store_pack(
    remote: &Remote,
    plan: &Plan,
    members: &[usize],
    condemned: &HashSet<String>,
    requests: &AtomicU64,
) -> Result<(PackRef, bool, Layout, Bytes)> {
    let (data, layout) = assemble(plan, members)?;
    let pack = PackRef { name: sha256_hex(&data), size: data.len() as u64 };
    if stored_whole(remote, &pack, condemned, requests).await? {
        return Ok((pack, false, layout, data));
    }
    requests.fetch_add(1, Relaxed);
    remote.put(&pack_key(&pack.name), data.clone()).await?;
    Ok((pack, true, layout, data))
}

/// Whether a publish also stores a copy of the head under the snapshot's id
/// ([`Remote::head_key`]; the default). `THAW_STORE_HEAD_COPY=0` leaves it out:
/// the baseline of bench/store.py, where a miss reads the head after the manifest.
fn copying_head() -> bool {
    std::env::var("THAW_STORE_HEAD_COPY").as_deref() != Ok("0")
}

/// Whether the head's copy starts with the manifest (the default);
/// `THAW_STORE_HEAD_MANIFEST=0` stores the pack alone, as before (bench/store.py's
/// baseline `remote-cold-manifest-apart`).
fn copy_holds_manifest() -> bool {
    std::env::var("THAW_STORE_HEAD_MANIFEST").as_deref() != Ok("0")
}

/// Whether a head's copy is split where the files a restore waits for end (the
/// default; `THAW_STORE_HEAD_SPLIT=0`: one object, as before, the baseline of
/// bench/store_node.py `+copy-whole`).
fn splitting_head() -> bool {
    std::env::var("THAW_STORE_HEAD_SPLIT").as_deref() != Ok("0")
}

/// The head's copy of manifest `m` (`stored` as stored) and its head pack `pack`, as
/// this version writes it: the first object, and the second of a split copy; a diff's
/// first object carries `base`, its base's start ([`carried_base`]).
fn head_copy_objects(m: &Manifest, stored: &[u8], pack: &Bytes, base: Option<&Bytes>) -> (Bytes, Option<Bytes>) {
    let Some(at) = m.head_first_end().filter(|_| splitting_head()) else { return (crate::fetch::head_copy(stored, pack), None) };
    let (first, rest) = match base {
        Some(b) => crate::fetch::head_copy_split_carrying(stored, b, pack, at as usize),
        None => crate::fetch::head_copy_split(stored, pack, at as usize),
    };
    (first, Some(rest))
}

/// What a diff's split copy carries of its base (see `fetch::HEAD_BASE_MAGIC`): the
/// first object of the base's split copy in the store, read now (one request), when
/// it is one of at most `fetch::MAX_CARRIED_BASE` bytes; else (no diff, copies not
/// split, `THAW_STORE_HEAD_BASE=0`, the base's copy missing, whole or larger) None.
async fn carried_base(remote: &Remote, m: &Manifest, requests: &AtomicU64) -> Option<Bytes> {
    let base = m.base.as_ref().filter(|_| splitting_head() && std::env::var("THAW_STORE_HEAD_BASE").as_deref() != Ok("0"))?;
    requests.fetch_add(1, Relaxed);
    match remote.get(&Remote::head_key(base)).await {
        Ok(b) if b.starts_with(crate::fetch::HEAD_SPLIT_MAGIC) && b.len() <= crate::fetch::MAX_CARRIED_BASE => Some(b),
        Ok(b) => {
            tracing::debug!(base = %base, bytes = b.len(), "the base's copy is not split or too large to carry; its diffs' misses read it apart");
            None
        }
        Err(e) => {
            tracing::debug!(base = %base, error = %e, "the base's copy was not read; its diffs' misses read it apart");
            None
        }
    }
}

/// Store snapshot `id`'s head copy: a split one's second part first, so that a first
/// part in the store has its second. Returns the bytes written.
async fn put_head_copy(remote: &Remote, id: &str, (first, rest): (Bytes, Option<Bytes>), requests: &AtomicU64) -> Result<u64> {
    let mut bytes = first.len() as u64;
    if let Some(rest) = rest {
        bytes += rest.len() as u64;
        requests.fetch_add(1, Relaxed);
        remote.put(&Remote::head_rest_key(id), rest).await?;
    }
    requests.fetch_add(1, Relaxed);
    remote.put(&Remote::head_key(id), first).await?;
    Ok(bytes)
}

/// Stored snapshot `id`'s head copy written as this version writes it (starting with
/// the manifest: a miss then reads it with the copy; split, a diff's carrying its
/// base's start; whole with THAW_STORE_HEAD_SPLIT=0) where it is missing, lacks its
/// second part, or was written otherwise. Returns the bytes written (0: already so).
async fn refresh_head_copy(remote: &Remote, id: &str, m: &Manifest, requests: &AtomicU64) -> Result<u64> {
    let Some(head) = m.head.filter(|_| copying_head() && copy_holds_manifest()) else { return Ok(0) };
    let key = Remote::head_key(id);
    let split = m.head_first_end().is_some() && splitting_head();
    let base = match split {
        true => carried_base(remote, m, requests).await,
        false => None,
    };
    let magic = match (split, &base) {
        (true, Some(_)) => crate::fetch::HEAD_BASE_MAGIC,
        (true, None) => crate::fetch::HEAD_SPLIT_MAGIC,
        (false, _) => crate::fetch::HEAD_MAGIC,
    };
    requests.fetch_add(1, Relaxed);
    match remote.get_range(&key, 0..magic.len() as u64).await {
        // Written so (a split copy with its second part).
        Ok(first) if first[..] == magic[..] => {
            if !split {
                return Ok(0);
            }
            requests.fetch_add(1, Relaxed);
            if remote.head(&Remote::head_rest_key(id)).await?.is_some() {
                return Ok(0);
            }
        }
        Ok(_) | Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let pack = m.packs.get(head as usize).ok_or_else(|| StoreError::BadManifest { object: remote.url.object_url(&Remote::manifest_key(id)), detail: "its head is no pack".into() })?;
    requests.fetch_add(2, Relaxed);
    let (pk, mk) = (pack_key(&pack.name), Remote::manifest_key(id));
    let (data, stored) = futures::try_join!(remote.get(&pk), remote.get(&mk))?;
    let got = sha256_hex(&data);
    if got != pack.name {
        return Err(StoreError::Corrupt { object: remote.url.object_url(&pk), detail: format!("its bytes hash to {got}") });
    }
    let bytes = put_head_copy(remote, id, head_copy_objects(m, &stored, &data, base.as_ref()), requests).await?;
    tracing::info!(snapshot = id, bytes, "the head's copy rewritten as this version writes it");
    Ok(bytes)
}

/// Publish `plan` in packs: the chunks the store lacks go into new packs, then the
/// manifest (the commit point). `progress(bytes)` gets each new chunk's length once
/// its pack is stored.
pub async fn publish(remote: &Remote, plan: &Plan, condemned: &HashSet<String>, progress: &(dyn Fn(u64) + Sync)) -> Result<Published> {
    let requests = AtomicU64::new(0);
    let digest = plan.manifest.content_digest();
    let (places, same) = index(remote, &digest, condemned, &requests).await?;
    if let Some((id, m)) = same {
        let repaired = repair(remote, plan, &m, condemned, &requests).await?;
        // A base the collector condemned (no diff named it): written again, so it
        // is kept for the diff being published on it.
        let key = Remote::manifest_key(&id);
        if condemned.contains(&key) {
            requests.fetch_add(1, Relaxed);
            remote.put(&key, stored_manifest(&m, m.to_bytes())).await?;
        }
        // A push of a snapshot stored before its head copy held the manifest brings the
        // copy up to date (best effort: the snapshot is whole without it).
        let copied = refresh_head_copy(remote, &id, &m, &requests).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the head's copy was not rewritten; misses of this snapshot read its manifest apart");
            0
        });
        return Ok(Published {
            id,
            packs: m.packs.len(),
            packs_uploaded: repaired.len(),
            bytes_uploaded: repaired.iter().sum::<u64>() + copied,
            head_copy_bytes: copied,
            requests: requests.into_inner(),
            ..Default::default()
        });
    }
    let new_packs = packs_to_store(plan, |sha| places.contains_key(sha));
    let has_head = !plan.head.is_empty();
    let requests_ref = &requests;
    let stored: Vec<(usize, PackRef, bool, Layout, Option<Bytes>)> = futures::stream::iter(new_packs.iter().enumerate())
        .map(|(n, members)| async move {
            let (pack, sent, layout, data) = store_pack(remote, plan, members, condemned, requests_ref).await?;
            for &i in members {
                progress(plan.uploads[i].len);
            }
            // The head's bytes, for its copy under the snapshot's id.
            let data = (n == 0 && has_head).then_some(data);
            Ok::<_, StoreError>((n, pack, sent, layout, data))
        })
        .buffer_unordered(PACK_CONCURRENCY)
        .try_collect()
        .await?;
    let mut new_refs: Vec<Option<(PackRef, Layout)>> = vec![None; new_packs.len()];
    let mut uploaded = (0, 0u64);
    let mut head_data = None;
    for (n, pack, sent, layout, data) in stored {
        if sent {
            uploaded = (uploaded.0 + 1, uploaded.1 + pack.size);
        }
        head_data = head_data.or(data);
        new_refs[n] = Some((pack, layout));
    }
    // Where every stored chunk is.
    let mut at_of: HashMap<ChunkHash, Place> = HashMap::new();
    for (members, stored) in new_packs.iter().zip(&new_refs) {
        let (pack, layout) = stored.as_ref().expect("every pack was stored");
        for (&i, &(at, zlen)) in members.iter().zip(layout) {
            at_of.entry(plan.uploads[i].sha256).or_insert((pack.clone(), at, zlen));
        }
    }
    let mut m = plan.manifest.clone();
    // Format 7 (binary, compact tables, see manifest.rs); format 6
    // (`THAW_STORE_MANIFEST=6`, the baseline: fixed records). As JSON
    // (`THAW_STORE_MANIFEST=json`, the older baseline): format 4 only where it stores
    // ws.pages, 5 where ws.lz4, so older readers read the rest.
    let ws_stored = m.file(thaw_engine::ws::PAGES_FILE).is_some();
    let lz4_stored = m.file(thaw_engine::ws::LZ4_FILE).is_some();
    let asked = std::env::var("THAW_STORE_MANIFEST").unwrap_or_default();
    let json = asked == "json";
    m.format = match (compressing(), json, ws_stored, lz4_stored) {
        (true, false, ..) if asked == "6" => crate::manifest::MANIFEST_FORMAT_BINARY,
        (true, false, ..) => MANIFEST_FORMAT_COMPACT,
        (true, true, _, true) => MANIFEST_FORMAT,
        (true, true, true, false) => crate::manifest::MANIFEST_FORMAT_WS_PAGES,
        (true, true, false, false) => MANIFEST_FORMAT_COMPRESSED,
        (false, ..) => crate::manifest::MANIFEST_FORMAT_PACKS,
    };
    if has_head {
        // Pack 0, so every chunk in it is placed there.
        let (head, _) = new_refs[0].clone().expect("the head was stored");
        m.packs.push(head);
        m.head = Some(0);
    }
    let mut pack_index: BTreeMap<String, u32> = m.packs.iter().enumerate().map(|(n, p)| (p.name.clone(), n as u32)).collect();
    for c in m.files.iter_mut().flat_map(|f| &mut f.chunks) {
        let Some(sha) = &c.sha256 else { continue };
        let (pack, at, zlen) = at_of.get(sha).cloned().or_else(|| places.get(sha).cloned()).expect("every chunk is placed");
        let n = match pack_index.get(&pack.name) {
            Some(&n) => n,
            None => {
                let n = m.packs.len() as u32;
                pack_index.insert(pack.name.clone(), n);
                m.packs.push(pack);
                n
            }
        };
        (c.pack, c.at, c.zlen) = (Some(n), Some(at), zlen);
    }
    let bytes = m.to_bytes();
    let id = sha256_hex(&bytes);
    let stored = stored_manifest(&m, bytes);
    let manifest_len = stored.len() as u64;
    // The head's copy, which starts with the manifest (so a miss reads both in one
    // request), written once the manifest (the commit point) is: a copy in the store
    // names a committed snapshot. A reader that finds no copy reads the manifest, then
    // the head from its pack, as one without copies does. THAW_STORE_HEAD_MANIFEST=0:
    // the copy holds the pack alone, written beside the manifest (as before; the
    // baseline of bench/store.py).
    // Split where the files the restore waits for end (see `fetch::HEAD_SPLIT_MAGIC`).
    let with_manifest = copy_holds_manifest();
    let head_data = head_data.filter(|_| copying_head());
    let manifest_key = Remote::manifest_key(&id);
    let copied = match (head_data, with_manifest) {
        (Some(d), true) => {
            let base = carried_base(remote, &m, &requests).await;
            let objects = head_copy_objects(&m, &stored, &d, base.as_ref());
            remote.put(&manifest_key, stored).await?;
            put_head_copy(remote, &id, objects, &requests).await?
        }
        (Some(d), false) => {
            let head_key = Remote::head_key(&id);
            let bytes = d.len() as u64;
            requests.fetch_add(1, Relaxed);
            futures::try_join!(remote.put(&manifest_key, stored), remote.put(&head_key, d))?;
            bytes
        }
        (None, _) => remote.put(&manifest_key, stored).await.map(|()| 0)?,
    };
    // Chunks the store did not have (the head may repeat some it had elsewhere).
    let new_chunks: Vec<u64> =
        new_packs.iter().flatten().map(|&i| &plan.uploads[i]).filter(|u| !places.contains_key(&u.sha256)).map(|u| u.len).collect();
    Ok(Published {
        id,
        manifest_len,
        chunks_uploaded: new_chunks.len(),
        chunk_bytes_uploaded: new_chunks.iter().sum(),
        packs: m.packs.len(),
        packs_uploaded: uploaded.0,
        bytes_uploaded: uploaded.1 + manifest_len + copied,
        head_copy_bytes: copied,
        requests: requests.into_inner() + 1,
    })
}

/// Check (HEAD) the packs of `m`, a stored manifest of `plan`'s contents, and put
/// back any that is missing, of the wrong size or condemned, when the local
/// snapshot holds all of it. Returns the bytes of each pack sent.
async fn repair(remote: &Remote, plan: &Plan, m: &Manifest, condemned: &HashSet<String>, requests: &AtomicU64) -> Result<Vec<u64>> {
    let mut sent = Vec::new();
    let local: HashMap<ChunkHash, usize> = plan.uploads.iter().enumerate().map(|(i, u)| (u.sha256, i)).collect();
    for (n, pack) in m.packs.iter().enumerate() {
        if stored_whole(remote, pack, condemned, requests).await? {
            continue;
        }
        let key = pack_key(&pack.name);
        // Rebuild it from the chunks the manifest places in it, if they tile it.
        let mut parts: Vec<(u64, usize, u64)> = m
            .files
            .iter()
            .flat_map(|f| &f.chunks)
            .filter(|c| c.pack == Some(n as u32))
            .filter_map(|c| Some((c.at?, *local.get(c.sha256.as_ref()?)?, c.stored_len())))
            .collect();
        parts.sort_unstable();
        parts.dedup();
        let mut end = 0;
        let tiles = parts.iter().all(|&(at, _, stored)| {
            let ok = at == end;
            end = at + stored;
            ok
        }) && end == pack.size;
        if !tiles {
            return Err(StoreError::Corrupt {
                object: remote.url.object_url(&key),
                detail: "damaged, and it holds chunks this snapshot does not have: publish the snapshots that share it again".into(),
            });
        }
        let (data, _) = assemble(plan, &parts.iter().map(|&(_, i, _)| i).collect::<Vec<_>>())?;
        if sha256_hex(&data) != pack.name {
            return Err(StoreError::Snapshot { dir: plan.dir.clone(), detail: format!("rebuilding pack {} gave other bytes", pack.name) });
        }
        requests.fetch_add(1, Relaxed);
        sent.push(data.len() as u64);
        remote.put(&key, data).await?;
        tracing::info!(object = %remote.url.object_url(&key), "repaired a damaged pack");
    }
    Ok(sent)
}

/// Where a chunk's bytes go: (file index in the manifest, offset in the file).
pub(crate) type Places = Vec<(usize, u64)>;
/// A chunk in a span.
#[derive(Clone, Debug)]
pub(crate) struct SpanChunk {
    /// Offset in the pack, and length there.
    pub(crate) at: u64,
    pub(crate) stored: u64,
    /// Its length once decompressed, if stored compressed.
    pub(crate) unzipped: Option<u64>,
    pub(crate) sha: ChunkHash,
    /// Where its bytes go.
    pub(crate) places: Places,
}

/// One ranged read of a pack and the chunks in it.
#[derive(Clone)]
pub(crate) struct Span {
    pub(crate) pack: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) chunks: Vec<SpanChunk>,
}

impl Span {
    /// This span cut into at most `n` reads of about equal size, at chunk boundaries
    /// (read in parallel: the hashing of each part runs beside the others).
    pub(crate) fn split(self, n: usize) -> Vec<Span> {
        let size = self.end - self.start;
        let per = size.div_ceil(n.max(1) as u64).max(1);
        let mut out: Vec<Span> = Vec::new();
        for c in self.chunks {
            match out.last_mut() {
                Some(s) if s.end - s.start < per => {
                    s.end = c.at + c.stored;
                    s.chunks.push(c);
                }
                _ => out.push(Span { pack: self.pack.clone(), start: c.at, end: c.at + c.stored, chunks: vec![c] }),
            }
        }
        out
    }
}

/// Spans up to this size are checked on the task that read them; larger ones on a
/// blocking thread, so that the runtime's two threads stay free to receive what
/// other reads bring (a miss's state waited behind the checking of the head's pages).
const CHECK_INLINE: u64 = 64 << 10;

/// How the chunks a span brings are checked.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Check {
    /// Each against its hash (after decompression).
    Chunks,
    /// Not one by one: the caller checks the whole pack against its name
    /// ([`whole_digest`]) before anything uses them. Hashing the stored (compressed)
    /// bytes once costs a third of hashing every decompressed chunk.
    Pack,
}

/// Read span `s` and return each of its chunks' bytes, checked against its hash.
pub(crate) async fn read_span(remote: &Remote, s: &Span) -> Result<Vec<Bytes>> {
    Ok(read_span_as(remote, s, Check::Chunks).await?.1)
}

/// Read span `s`: its bytes as stored, and each of its chunks' bytes (decompressed),
/// checked as `check` says.
pub(crate) async fn read_span_as(remote: &Remote, s: &Span, check: Check) -> Result<(Bytes, Vec<Bytes>)> {
    let key = pack_key(&s.pack);
    let data = read_range(remote, &key, s.start..s.end).await?;
    let object = remote.url.object_url(&key);
    let parts = if s.end - s.start <= CHECK_INLINE {
        check_span(&object, s, data.clone(), check)
    } else {
        let (s, stored) = (s.clone(), data.clone());
        tokio::task::spawn_blocking(move || check_span(&object, &s, stored, check)).await.map_err(|e| StoreError::Task { detail: e.to_string() })?
    };
    Ok((data, parts?))
}

/// Whether `spans` (reads of one pack of `size` bytes, in any order, possibly
/// overlapping) cover every byte of it, so [`whole_digest`] can check them at once.
pub(crate) fn covers<'a>(spans: impl IntoIterator<Item = &'a Span>, size: u64) -> bool {
    let mut r: Vec<(u64, u64)> = spans.into_iter().map(|s| (s.start, s.end)).collect();
    r.sort_unstable();
    let mut at = 0;
    for (start, end) in r {
        if start > at {
            return false;
        }
        at = at.max(end);
    }
    at == size
}

/// The SHA-256 (hex) of a pack from the bytes of reads covering it ([`covers`]):
/// (offset in the pack, bytes) in any order, overlaps hashed once.
pub(crate) fn whole_digest(mut parts: Vec<(u64, Bytes)>) -> String {
    use sha2::Digest;
    parts.sort_unstable_by_key(|p| p.0);
    let mut h = sha2::Sha256::new();
    let mut at = 0u64;
    for (start, b) in parts {
        let end = start + b.len() as u64;
        if end > at {
            h.update(&b[at.saturating_sub(start) as usize..]);
            at = end;
        }
    }
    hex::encode(h.finalize())
}

/// The chunks of span `s` in `data` (its bytes, read from `object`): decompressed
/// when stored so, each checked against its hash unless `check` leaves that to the caller.
pub(crate) fn check_span(object: &str, s: &Span, data: Bytes, check: Check) -> Result<Vec<Bytes>> {
    // One context for the span's chunks (making one per chunk costs more than the
    // decompression of an 8 KiB chunk).
    let mut unzip = None;
    s.chunks
        .iter()
        .map(|SpanChunk { at, stored, unzipped, sha, .. }| {
            let part = data.slice((at - s.start) as usize..(at - s.start + stored) as usize);
            let part = match unzipped {
                // Never more than the manifest says (a hostile pack cannot make us allocate more).
                Some(len) => {
                    let corrupt = |e: std::io::Error| StoreError::Corrupt { object: object.to_string(), detail: format!("the chunk at {at} does not decompress: {e}") };
                    let d = match &mut unzip {
                        Some(d) => d,
                        None => unzip.insert(zstd::bulk::Decompressor::new().map_err(corrupt)?),
                    };
                    Bytes::from(d.decompress(&part, *len as usize).map_err(corrupt)?)
                }
                None => part,
            };
            if check == Check::Pack {
                return Ok(part);
            }
            let got = ChunkHash::of(&part);
            if got != *sha {
                return Err(StoreError::Corrupt { object: object.to_string(), detail: format!("the chunk at {at} hashes to {got}, not {sha}") });
            }
            Ok(part)
        })
        .collect()
}

/// [`read_span_as`] of `spans` out of `pack`, the whole pack's bytes already here
/// (the head's copy, read from `object`): no request.
pub(crate) fn slice_spans(object: &str, pack: &Bytes, spans: &[Span], check: Check) -> Result<Vec<(Bytes, Vec<Bytes>)>> {
    spans
        .iter()
        .map(|s| {
            if s.start > s.end || s.end > pack.len() as u64 {
                return Err(StoreError::Corrupt { object: object.to_string(), detail: format!("holds {} bytes, a read wants {}..{}", pack.len(), s.start, s.end) });
            }
            let data = pack.slice(s.start as usize..s.end as usize);
            Ok((data.clone(), check_span(object, s, data, check)?))
        })
        .collect()
}

/// [`read_span_as`] of every span at once, each a task of its own.
pub(crate) async fn read_spans_as(remote: &Remote, spans: &[Span], check: Check) -> Result<Vec<(Bytes, Vec<Bytes>)>> {
    let tasks: Vec<_> = spans
        .iter()
        .map(|s| {
            let (remote, s) = (remote.clone(), s.clone());
            tokio::spawn(async move { read_span_as(&remote, &s, check).await })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.map_err(|e| StoreError::Task { detail: e.to_string() })??);
    }
    Ok(out)
}

/// [`read_spans_as`] of owned arguments (for a task of its own).
pub(crate) async fn read_spans_owned(remote: Remote, spans: Vec<Span>, check: Check) -> Result<Vec<(Bytes, Vec<Bytes>)>> {
    read_spans_as(&remote, &spans, check).await
}

/// The reads that fetch every stored chunk of `m` (format 2): per pack, the chunks'
/// ranges, coalesced across gaps under [`RANGE_GAP`].
fn spans(m: &Manifest) -> Vec<Span> {
    spans_of(m, |_, _| true, RANGE_GAP)
}

/// The reads that fetch the chunks of `m` that `wanted(file index, chunk)` picks,
/// ranges of one pack less than `gap` apart coalesced.
pub(crate) fn spans_of(m: &Manifest, wanted: impl Fn(usize, &crate::manifest::Chunk) -> bool, gap: u64) -> Vec<Span> {
    let mut by_pack: BTreeMap<u32, BTreeMap<u64, SpanChunk>> = BTreeMap::new();
    for (fi, f) in m.files.iter().enumerate() {
        for c in f.chunks.iter().filter(|c| wanted(fi, c)) {
            if let (Some(sha), Some(p), Some(at)) = (c.sha256, c.pack, c.at) {
                by_pack
                    .entry(p)
                    .or_default()
                    .entry(at)
                    .or_insert_with(|| SpanChunk { at, stored: c.stored_len(), unzipped: c.zlen.map(|_| c.len), sha, places: Vec::new() })
                    .places
                    .push((fi, c.offset));
            }
        }
    }
    let mut out: Vec<Span> = Vec::new();
    for (p, chunks) in by_pack {
        let name = &m.packs[p as usize].name;
        for (at, c) in chunks {
            let end = at + c.stored;
            match out.last_mut() {
                Some(s) if s.pack == *name && at <= s.end.saturating_add(gap) => {
                    s.end = s.end.max(end);
                    s.chunks.push(c);
                }
                _ => out.push(Span { pack: name.clone(), start: at, end, chunks: vec![c] }),
            }
        }
    }
    out
}

/// Fetch the stored chunks of `m` (format 2) into `files` (by file index), each
/// checked against its hash. Returns (requests, bytes read).
pub async fn download(remote: &Remote, m: &Manifest, dir: &Path, files: &HashMap<usize, File>, progress: &(dyn Fn(u64) + Sync)) -> Result<(usize, u64)> {
    let got: Vec<u64> = futures::stream::iter(spans(m))
        .map(|s| async move {
            // Each read a task of its own, so their decompression and hashing run in parallel.
            let (r, span) = (remote.clone(), s.clone());
            let parts = tokio::spawn(async move { read_span(&r, &span).await })
                .await
                .map_err(|e| StoreError::Task { detail: e.to_string() })??;
            for (c, part) in s.chunks.iter().zip(&parts) {
                for (fi, off) in &c.places {
                    files[fi].write_all_at(part, *off).map_err(StoreError::local(dir, format!("writing {}", m.files[*fi].name)))?;
                }
                progress(part.len() as u64);
            }
            Ok::<u64, StoreError>(s.end - s.start)
        })
        .buffer_unordered(crate::remote::CONCURRENCY)
        .try_collect()
        .await?;
    Ok((got.len(), got.iter().sum()))
}

/// Bytes `range` of pack object `key`; a pack too short for it is corrupt.
async fn read_range(remote: &Remote, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
    let want = range.end - range.start;
    let truncated = |detail: String| StoreError::Corrupt { object: remote.url.object_url(key), detail };
    match remote.get_range(key, range.clone()).await {
        Ok(b) if b.len() as u64 == want => Ok(b),
        Ok(b) => Err(truncated(format!("{} bytes, expected {want} from offset {}", b.len(), range.start))),
        Err(e @ StoreError::NotFound { .. }) => Err(e),
        // A range past the end of a truncated object is refused by the server.
        Err(e) => match remote.head(key).await {
            Ok(Some(meta)) if meta.size < range.end => Err(truncated(format!("{} bytes, expected at least {}", meta.size, range.end))),
            _ => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Chunk, FileEntry};

    #[test]
    fn reads_that_cover_a_pack_check_it_whole_by_its_name() {
        let pack: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let span = |start: u64, end: u64| Span { pack: "p".into(), start, end, chunks: vec![] };
        let part = |start: usize, end: usize| (start as u64, Bytes::copy_from_slice(&pack[start..end]));
        // Out of order and overlapping (a chunk both files use is read twice): hashed once, in order.
        assert!(covers(&[span(6000, 10_000), span(0, 4000), span(3000, 7000)], 10_000));
        assert_eq!(whole_digest(vec![part(6000, 10_000), part(0, 4000), part(3000, 7000)]), sha256_hex(&pack));
        assert!(!covers(&[span(0, 4000), span(4001, 10_000)], 10_000), "a gap");
        assert!(!covers(&[span(0, 4000)], 10_000), "short");
        assert!(!covers(&[span(100, 10_000)], 10_000), "the start missing");
        let mut bad = part(6000, 10_000);
        bad.1 = Bytes::from(vec![0u8; 4000]);
        assert_ne!(whole_digest(vec![bad, part(0, 6000)]), sha256_hex(&pack), "a changed byte changes the digest");
    }

    #[test]
    fn a_span_splits_at_chunk_boundaries_into_parts_of_about_equal_size() {
        let chunk = |at: u64| SpanChunk { at, stored: 100, unzipped: None, sha: ChunkHash::of(&at.to_le_bytes()), places: vec![(0, at)] };
        let s = Span { pack: "p".into(), start: 0, end: 1000, chunks: (0..10).map(|i| chunk(i * 100)).collect() };
        let parts = s.split(3);
        assert_eq!(parts.iter().map(|p| (p.start, p.end, p.chunks.len())).collect::<Vec<_>>(), [(0, 400, 4), (400, 800, 4), (800, 1000, 2)]);
        let one = Span { pack: "p".into(), start: 0, end: 100, chunks: vec![chunk(0)] };
        assert_eq!(one.split(4).len(), 1, "a chunk is never cut");
    }

    #[test]
    fn spans_coalesce_near_ranges_of_one_pack_and_split_far_ones() {
        let h = |s: &str| sha256_hex(s.as_bytes());
        let packs = vec![PackRef { name: h("p0"), size: 4 << 20 }, PackRef { name: h("p1"), size: 4096 }];
        let placed = |off, len, sha: &str, p, at| Chunk { pack: Some(p), at: Some(at), ..Chunk::new(off, len, Some(ChunkHash::of(sha.as_bytes()))) };
        let m = Manifest {
            format: MANIFEST_FORMAT,
            image_format: thaw_engine::image::FORMAT_VERSION,
            image_id: 1,
            packs,
            head: None,
            files: vec![FileEntry {
                name: "pages.img".into(),
                size: 5 * 4096,
                chunks: vec![
                    placed(0, 4096, "a", 0, 0),
                    placed(4096, 4096, "b", 0, 8192),
                    placed(8192, 4096, "c", 0, 3 << 20),
                    placed(12288, 4096, "a", 0, 0),
                    placed(16384, 4096, "d", 1, 0),
                ],
            }],
            derived: vec![],
            base: None,
            is_base: false,
            sandbox: None,
        };
        let s = spans(&m);
        let shape: Vec<(u64, u64, usize)> = s.iter().map(|s| (s.start, s.end, s.chunks.len())).collect();
        assert_eq!(shape, [(0, 12288, 2), (3 << 20, (3 << 20) + 4096, 1), (0, 4096, 1)]);
        assert_eq!(s[0].chunks[0].places, [(0, 0), (0, 12288)], "a chunk used twice is read once and written twice");
    }
}
