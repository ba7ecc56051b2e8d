//! Fetching a stored snapshot into a local directory: verified and atomic.
//!
//! The manifest is read first and checked against its name (the id); every
//! chunk is checked against its name as it arrives. Everything is written
//! into a temporary sibling directory that is renamed into place only once
//! complete, checked, and synced; on any error it is removed, so a reader of
//! the destination never sees half a snapshot or a byte the store corrupted.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use thaw_engine::image::Snapshot;
use thaw_engine::ws::{self, WorkingSet, TRACE_FILE};

use crate::error::{Result, StoreError};
use crate::manifest::Manifest;
use crate::remote::{sha256_hex, Remote, CONCURRENCY};

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PullReport {
    pub id: String,
    pub dir: PathBuf,
    /// Bytes of the snapshot's stored files.
    pub snapshot_bytes: u64,
    /// Requests for the snapshot's chunks (ranged reads of packs, or one per chunk
    /// of a format 1 snapshot); the manifest's is not counted.
    pub chunks_fetched: usize,
    /// Bytes read from the store (manifest + chunks).
    pub bytes_fetched: u64,
    pub seconds: f64,
}

/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// The manifest of snapshot `id`, verified against its name, with its size in the store.
pub async fn manifest(remote: &Remote, id: &str) -> Result<(Manifest, u64)> {
    let key = Remote::manifest_key(id);
    let t0 = std::time::Instant::now();
    let stored = remote.get(&key).await?;
    let got_ms = t0.elapsed().as_secs_f64() * 1e3;
    let len = stored.len() as u64;
    let m = verify_manifest(&remote.url.object_url(&key), stored, id)?;
    tracing::debug!(get_ms = got_ms, checked_ms = t0.elapsed().as_secs_f64() * 1e3, stored = len, "manifest read");
    Ok((m, len))
}

/// Manifest `stored` (as stored: JSON, or zstd-compressed from format 3 on, binary from
/// format 6 on), checked against `id`, the hash of its bytes, and parsed. `object` names where it
/// came from in errors.
pub fn verify_manifest(object: &str, stored: bytes::Bytes, id: &str) -> Result<Manifest> {
    let t0 = std::time::Instant::now();
    // Format 3 on is stored compressed (zstd's magic; JSON starts with '{'), never
    // decompressed past the cap on manifests.
    let bytes = if stored.starts_with(&ZSTD_MAGIC) {
        bytes::Bytes::from(
            unzip(&stored, crate::manifest::MAX_MANIFEST_LEN)
                .map_err(|e| StoreError::Corrupt { object: object.to_string(), detail: format!("does not decompress: {e}") })?,
        )
    } else {
        stored
    };
    let t_unzip = t0.elapsed();
    let got = sha256_hex(&bytes);
    if got != id {
        return Err(StoreError::Corrupt { object: object.to_string(), detail: format!("contents hash to {got}") });
    }
    let t_hash = t0.elapsed();
    let m = Manifest::parse(object, &bytes)?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    tracing::debug!(bytes = bytes.len(), unzip_ms = ms(t_unzip), hash_ms = ms(t_hash - t_unzip), parse_ms = ms(t0.elapsed() - t_hash), "manifest checked");
    Ok(m)
}

/// zstd frame `stored` decompressed, at most `cap` bytes, into a buffer of the size
/// its header gives (a frame that holds more than it says does not decompress):
/// `zstd::bulk::decompress` allocates its whole capacity, `cap`, first (lrserving's
/// manifest: 0.59 ms instead of 0.85).
pub fn unzip(stored: &[u8], cap: usize) -> std::io::Result<Vec<u8>> {
    let said = zstd::zstd_safe::get_frame_content_size(stored).ok().flatten();
    zstd::bulk::decompress(stored, said.filter(|&n| n <= cap as u64).map_or(cap, |n| n as usize))
}

/// What a miss fetches first: the manifest of the snapshot (verified against its
/// name) and the copy of its head pack ([`Remote::head_key`], checked against the
/// manifest's head by `lazy::open`), which brings the manifest too.
#[derive(Clone)]
pub struct MissStart {
    pub manifest: Manifest,
    /// The manifest's size in the store (and that of one in the head's copy that did
    /// not check).
    pub manifest_len: u64,
    /// Requests the manifest took: 0 when it came in the head's copy, else 1 (2 when
    /// the copy's did not check).
    pub manifest_requests: u64,
    /// The head copy, arriving (see [`HeadCopy`]).
    pub head: HeadCopy,
}

/// What a head's copy starts with since the manifest went into it: this, the
/// manifest's length as stored (u32, little-endian), the manifest as stored
/// (`snapshots/<id>.json`), then the head pack's bytes. A copy without it (stored
/// before) is the head pack's bytes alone. An older reader finds that such a copy
/// does not hash to the head pack's name and reads the head from its pack.
pub const HEAD_MAGIC: &[u8; 8] = b"thawhd01";
/// A split copy: as [`HEAD_MAGIC`]'s, but with the head pack's first bytes only (what
/// the restore reads before it starts: state.bin, ws.trace); the rest of the pack is
/// a second object, [`Remote::head_rest_key`], which a miss requests at once beside
/// it. A small first object is answered sooner (MinIO: 0.5-0.7 ms,
/// bench/results/minio-first-byte-20261207.txt), and the restore waits only for it.
/// A reader before it finds no manifest in such a copy, and a pack that does not
/// check: it reads the manifest, then the head from its pack.
pub const HEAD_SPLIT_MAGIC: &[u8; 8] = b"thawhd02";
/// A diff's split copy that carries its base's start: as [`HEAD_SPLIT_MAGIC`]'s, with
/// the first object of the base's own split copy (`heads/<base-id>`, as stored: the
/// base's manifest, state.bin and ws.trace), after its length (u32, little-endian),
/// between the diff's manifest and the pack's bytes. A miss of the diff whose cache
/// lacks the base opens the base from it at once ([`carried_start`]), instead of
/// reading the base's copy once the diff's manifest has named the base (a second round
/// trip to the store before the restore starts), and reads only the rest of the base's
/// head, beside the restore. A reader before it finds no manifest in such a copy.
pub const HEAD_BASE_MAGIC: &[u8; 8] = b"thawhd03";
const HEAD_HEADER: usize = HEAD_MAGIC.len() + 4;
/// The most bytes of a base's first object a diff's copy carries (a publisher leaves
/// out a larger one; a reader refuses a copy that announces one).
pub const MAX_CARRIED_BASE: usize = 1 << 20;

/// The head's copy as stored: [`HEAD_MAGIC`], then manifest `stored` (as stored) and
/// the head pack's bytes `pack`.
pub fn head_copy(stored: &[u8], pack: &[u8]) -> bytes::Bytes {
    copy_with(HEAD_MAGIC, stored, pack)
}

/// The head's copy split at byte `at` of the pack: the first object
/// ([`HEAD_SPLIT_MAGIC`], the manifest `stored`, the pack's first `at` bytes) and the
/// second (the rest of the pack).
pub fn head_copy_split(stored: &[u8], pack: &bytes::Bytes, at: usize) -> (bytes::Bytes, bytes::Bytes) {
    let at = at.min(pack.len());
    (copy_with(HEAD_SPLIT_MAGIC, stored, &pack[..at]), pack.slice(at..))
}

/// [`head_copy_split`] of a diff, its first object carrying `base`, the first object
/// of its base's split copy ([`HEAD_BASE_MAGIC`]).
pub fn head_copy_split_carrying(stored: &[u8], base: &[u8], pack: &bytes::Bytes, at: usize) -> (bytes::Bytes, bytes::Bytes) {
    let at = at.min(pack.len());
    let carried = [&(base.len() as u32).to_le_bytes()[..], base, &pack[..at]].concat();
    (copy_with(HEAD_BASE_MAGIC, stored, &carried), pack.slice(at..))
}

fn copy_with(magic: &[u8; 8], stored: &[u8], pack: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(HEAD_HEADER + stored.len() + pack.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&(stored.len() as u32).to_le_bytes());
    out.extend_from_slice(stored);
    out.extend_from_slice(pack);
    bytes::Bytes::from(out)
}

/// The head's copy as it arrives: read on the store's runtime, part by part, and
/// awaited only by what needs it. It starts with the snapshot's manifest
/// ([`HeadCopy::manifest`]), so a miss makes this one request before its restore
/// starts. Then the head pack, which starts with state.bin's and ws.trace's chunks
/// (`publish::plan`), so a miss takes those out of the pack's first bytes
/// ([`HeadCopy::prefix`]) and starts the restore while the rest, the working set's
/// pages, is still on the wire ([`HeadCopy::get`]); on a slow link that is most of
/// the copy's transfer. Offsets are the head pack's, after the manifest. Each
/// resolves to None where the store has no copy (published before copies, or
/// without one) or its read failed: the head is then read from its pack, after the
/// manifest, as before.
#[derive(Clone)]
pub struct HeadCopy {
    rx: tokio::sync::watch::Receiver<Arrival>,
    /// The most bytes of the head pack the read takes ([`HeadCopy::limit`]): a copy
    /// longer than the head is not read to its end, into memory.
    limit: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Whether to hash the pack as it arrives: [`UNDECIDED`] until its reader says
    /// ([`HeadCopy::hashed`], [`HeadCopy::unhashed`]).
    hashing: std::sync::Arc<std::sync::atomic::AtomicU8>,
    /// The requests made for it: 1, or 2 with the second part of a split copy
    /// (requested at once, whether or not the copy turns out split).
    requests: u64,
}

/// [`HeadCopy::hashing`]: not yet told (nothing hashed: a head checked chunk by chunk,
/// most of them, needs no hash of the pack, and hashing what arrives before the
/// manifest is checked would compete with that check on a miss's critical path).
const UNDECIDED: u8 = 0;
/// Hash the pack: what arrived so far at once, the rest as it arrives.
const HASH: u8 = 1;
/// Never hash it.
const NEVER: u8 = 2;

/// What has arrived of a head's copy.
#[derive(Default)]
pub struct Arrival {
    /// The parts so far, in order, and their bytes in all.
    parts: Vec<bytes::Bytes>,
    len: usize,
    /// Where the head pack starts in the copy, once its first bytes told: after
    /// the manifest, or at 0 in a copy without one.
    pack_at: Option<usize>,
    /// The manifest as stored, once all of it is here.
    manifest: Option<bytes::Bytes>,
    /// Whether the copy carries its base's start, once its first bytes told, and that
    /// start once all of it is here ([`HEAD_BASE_MAGIC`]).
    carries_base: Option<bool>,
    base: Option<bytes::Bytes>,
    /// Set once the read ended: the head pack's bytes and their SHA-256 (hex;
    /// hashed as they arrived; empty unless [`HeadCopy::hashed`] came before the
    /// end), or None (none, or the read failed).
    done: Option<Option<(bytes::Bytes, String)>>,
}

/// Bytes `start..end` of `parts` laid end to end (`end` within them).
fn gather(parts: &[bytes::Bytes], start: usize, end: usize) -> bytes::Bytes {
    let mut out = bytes::BytesMut::with_capacity(end.saturating_sub(start));
    for piece in pieces(parts, start, end) {
        out.extend_from_slice(piece);
    }
    out.freeze()
}

/// The slices of `parts` that hold bytes `start..end` of them laid end to end, in order.
fn pieces(parts: &[bytes::Bytes], start: usize, end: usize) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    parts.iter().filter_map(move |p| {
        let (here, from, to) = (at, start.max(at), end.min(at + p.len()));
        at += p.len();
        (from < to).then(|| &p[from - here..to - here])
    })
}

/// Where a copy's parts are, as its first bytes tell.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// The manifest's bytes (start, end; empty: none).
    manifest: (usize, usize),
    /// Those of the base's start a diff's copy carries ([`HEAD_BASE_MAGIC`]).
    base: Option<(usize, usize)>,
    /// Where the head pack starts.
    pack_at: usize,
    /// Whether the rest of the pack is in a second object.
    split: bool,
}

/// The layout of a copy of which `parts` (`len` bytes) have arrived; None while its
/// header needs more. A copy that does not start with one of the magics is the head
/// pack alone (stored before manifests went into copies).
fn layout(parts: &[bytes::Bytes], len: usize, object: &str) -> Result<Option<Layout>> {
    if len < HEAD_HEADER {
        return Ok(None);
    }
    let first = gather(parts, 0, HEAD_HEADER);
    let (split, carries) = match &first[..HEAD_MAGIC.len()] {
        m if m == HEAD_MAGIC => (false, false),
        m if m == HEAD_SPLIT_MAGIC => (true, false),
        m if m == HEAD_BASE_MAGIC => (true, true),
        _ => return Ok(Some(Layout { manifest: (0, 0), base: None, pack_at: 0, split: false })),
    };
    let corrupt = |detail: String| StoreError::Corrupt { object: object.to_string(), detail };
    let n = u32::from_le_bytes(first[HEAD_MAGIC.len()..HEAD_HEADER].try_into().expect("4 bytes")) as usize;
    if n > crate::manifest::MAX_MANIFEST_LEN {
        return Err(corrupt(format!("announces a manifest of {n} bytes, over the cap")));
    }
    let end = HEAD_HEADER + n;
    if !carries {
        return Ok(Some(Layout { manifest: (HEAD_HEADER, end), base: None, pack_at: end, split }));
    }
    if len < end + 4 {
        return Ok(None);
    }
    let b = u32::from_le_bytes(gather(parts, end, end + 4)[..].try_into().expect("4 bytes")) as usize;
    if b > MAX_CARRIED_BASE {
        return Err(corrupt(format!("announces its base's start of {b} bytes, over the cap")));
    }
    Ok(Some(Layout { manifest: (HEAD_HEADER, end), base: Some((end + 4, end + 4 + b)), pack_at: end + 4 + b, split }))
}

/// Parts of an object as they arrive, once its response begins.
type Parts = futures::stream::BoxStream<'static, Result<bytes::Bytes>>;
/// A read of an object's parts: its response awaited, then its parts.
pub type PartsRead = futures::future::BoxFuture<'static, Result<Parts>>;

/// The read of `key` part by part (see [`Remote::get_stream`]), started when polled.
fn parts_read(remote: &Remote, key: String) -> PartsRead {
    let r = remote.clone();
    Box::pin(async move { r.get_stream(&key).await })
}

impl HeadCopy {
    /// No copy (a whole fetch).
    pub fn none() -> HeadCopy {
        HeadCopy { rx: tokio::sync::watch::channel(Arrival { done: Some(None), ..Default::default() }).1, limit: Default::default(), hashing: Default::default(), requests: 0 }
    }

    /// Snapshot `id`'s copy read on the current runtime, part by part (see
    /// [`Remote::get_stream`]): [`Remote::head_key`] and, at once beside it, the second
    /// part of a split copy ([`Remote::head_rest_key`]; THAW_STORE_HEAD_SPLIT=0: not
    /// requested, the baseline of a store without split copies).
    pub fn read(remote: &Remote, id: &str) -> HeadCopy {
        let rest = (std::env::var("THAW_STORE_HEAD_SPLIT").as_deref() != Ok("0")).then(|| parts_read(remote, Remote::head_rest_key(id)));
        HeadCopy::from_split(remote.url.object_url(&Remote::head_key(id)), parts_read(remote, Remote::head_key(id)), rest)
    }

    /// The copy whose parts `parts` brings (a task of the current runtime gathers
    /// them); `object` names it in logs.
    pub fn from_parts<F, S>(object: String, parts: F) -> HeadCopy
    where
        F: std::future::Future<Output = Result<S>> + Send + 'static,
        S: futures::Stream<Item = Result<bytes::Bytes>> + Send + Unpin + 'static,
    {
        HeadCopy::from_split(object, Box::pin(async move { Ok(parts.await?.boxed()) }), None)
    }

    /// The copy whose first object's parts `parts` brings, and `rest` those of the
    /// second where the copy is split ([`HEAD_SPLIT_MAGIC`]): read at once beside the
    /// first, its parts held until the first ends, then taken as the pack's next
    /// bytes. A split copy whose second part is missing or fails gives no copy; a
    /// copy that is not split leaves `rest` unread.
    pub fn from_split(object: String, parts: PartsRead, rest: Option<PartsRead>) -> HeadCopy {
        let requests = 1 + u64::from(rest.is_some());
        // The second part's parts as they arrive, read by a task of its own so its
        // response is taken off the wire while the first part's still arrives.
        let rest = rest.map(|read| {
            let (tx, rx) = futures::channel::mpsc::unbounded::<Result<bytes::Bytes>>();
            tokio::spawn(async move {
                match read.await {
                    Ok(mut parts) => {
                        while let Some(part) = parts.next().await {
                            if tx.unbounded_send(part).is_err() {
                                return; // not split, or failed: the read is dropped
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.unbounded_send(Err(e));
                    }
                }
            });
            rx
        });
        let (tx, rx) = tokio::sync::watch::channel(Arrival::default());
        let limit = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let most = limit.clone();
        // THAW_STORE_HEAD_HASH=early: hashed from the first byte until told never (as
        // before; the baseline of bench/store_node.py +hash-early).
        let early = std::env::var("THAW_STORE_HEAD_HASH").as_deref() == Ok("early");
        let hashing = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(if early { HASH } else { UNDECIDED }));
        let hash_on = hashing.clone();
        let t0 = std::time::Instant::now();
        tokio::spawn(async move {
            let mut sha = <sha2::Sha256 as sha2::Digest>::new();
            // Every part so far (the task's own list, so hashing runs outside the
            // channel's lock), and where the pack starts once known.
            let mut held: Vec<bytes::Bytes> = Vec::new();
            let (mut len, mut shape, mut manifest_here, mut base_here) = (0usize, None::<Layout>, false, false);
            // The copy's bytes hashed so far (from the pack's start on), once told to.
            let mut hashed_to: Option<usize> = None;
            // The limit once set, on the pack's bytes (those of the copy from the pack's
            // start `p` on: the manifest is handed over whatever follows it).
            let within_limit = |len: usize, p: usize| {
                let most = most.load(std::sync::atomic::Ordering::Relaxed);
                match len.saturating_sub(p) > most {
                    true => Err(StoreError::Corrupt { object: object.clone(), detail: format!("holds more than the head's {most} bytes") }),
                    false => Ok(()),
                }
            };
            // Hash the copy's bytes from where hashing stopped (the pack's start `p` at
            // first) to `len`, if told to.
            let catch_up = |sha: &mut sha2::Sha256, hashed_to: &mut Option<usize>, held: &[bytes::Bytes], p: usize, len: usize| {
                if hash_on.load(std::sync::atomic::Ordering::Relaxed) != HASH {
                    return;
                }
                let from = hashed_to.unwrap_or(p);
                for piece in pieces(held, from, len) {
                    sha2::Digest::update(sha, piece);
                }
                *hashed_to = Some(len.max(from));
            };
            // When the response's headers, its first bytes and the manifest's last came
            // (ms after the request), and how many parts brought them: for the debug log.
            // (`rest_ms`: when a split copy went on with its second part.)
            let (mut headers_ms, mut first_ms, mut manifest_ms, mut rest_ms, mut nparts) = (None, None, None, None, 0usize);
            let ms = |t: std::time::Instant| t.elapsed().as_secs_f64() * 1e3;
            let read = async {
                let mut parts = parts.await?;
                headers_ms = Some(ms(t0));
                let mut rest = rest;
                loop {
                    let part = match parts.next().await {
                        Some(part) => part,
                        // The first object ended: a split copy goes on with the second
                        // (the pack's next bytes), if the first held the whole manifest.
                        None => match shape {
                            Some(l) if l.split && len >= l.pack_at && rest_ms.is_none() => {
                                rest_ms = Some(ms(t0));
                                match rest.take() {
                                    Some(rx) => {
                                        parts = rx.boxed();
                                        continue;
                                    }
                                    None => return Err(StoreError::Corrupt { object: object.clone(), detail: "is split, and its second part was not read".into() }),
                                }
                            }
                            _ => break,
                        },
                    };
                    let part = part.map_err(|e| match e {
                        StoreError::NotFound { object } if rest_ms.is_some() => StoreError::Corrupt { object, detail: "is missing: its head copy is split".into() },
                        e => e,
                    })?;
                    first_ms.get_or_insert_with(|| ms(t0));
                    nparts += 1;
                    len += part.len();
                    held.push(part.clone());
                    if shape.is_none() {
                        shape = layout(&held, len, &object)?;
                    }
                    if let Some(l) = shape {
                        catch_up(&mut sha, &mut hashed_to, &held, l.pack_at, len);
                    }
                    let (m0, m1) = shape.map_or((0, 0), |l| l.manifest);
                    let manifest = (shape.is_some() && !manifest_here && m1 > m0 && len >= m1).then(|| gather(&held, m0, m1));
                    if manifest.is_some() {
                        manifest_ms = Some(ms(t0));
                    }
                    manifest_here |= manifest.is_some();
                    let base = shape.and_then(|l| l.base).filter(|&(_, e)| !base_here && len >= e).map(|(b0, b1)| gather(&held, b0, b1));
                    base_here |= base.is_some();
                    tx.send_modify(|a| {
                        a.len = len;
                        a.parts.push(part);
                        a.pack_at = shape.map(|l| l.pack_at);
                        a.carries_base = shape.map(|l| l.base.is_some());
                        if manifest.is_some() {
                            a.manifest = manifest;
                        }
                        if base.is_some() {
                            a.base = base;
                        }
                    });
                    if let Some(l) = shape {
                        within_limit(len, l.pack_at)?;
                    }
                }
                Ok::<(), StoreError>(())
            };
            let ended = read.await;
            // A copy shorter than a manifest's header has none; one that ends inside
            // its header (a base's start announced, not its length) is no copy.
            let p = match shape {
                Some(l) => l.pack_at,
                None if len < HEAD_HEADER => 0,
                None => len + 1,
            };
            catch_up(&mut sha, &mut hashed_to, &held, p, len);
            let ended = ended.and_then(|()| within_limit(len, p));
            tracing::debug!(get_ms = ms(t0), ?headers_ms, ?first_ms, ?manifest_ms, ?rest_ms, parts = nparts, bytes = len, ok = ended.is_ok(), "head copy read");
            if let Err(e @ StoreError::Corrupt { .. }) = &ended {
                tracing::warn!(error = %e, "the head's copy is not used; reading the head from its pack");
            }
            tx.send_modify(|a| {
                a.pack_at = Some(p);
                a.carries_base = Some(a.base.is_some());
                a.done = Some(match ended {
                    Ok(()) if len >= p => Some((
                        match a.parts.len() {
                            1 => a.parts[0].slice(p..),
                            _ => gather(&a.parts, p, len),
                        },
                        // Whole only if hashing was on from where it started to the end.
                        match hashed_to.is_some() && hash_on.load(std::sync::atomic::Ordering::Relaxed) == HASH {
                            true => hex::encode(sha2::Digest::finalize(sha)),
                            false => String::new(),
                        },
                    )),
                    Ok(()) => {
                        tracing::warn!(object = %object, len, manifest_end = p, "the head's copy ends inside its manifest; reading the manifest and the head apart");
                        None
                    }
                    Err(StoreError::NotFound { .. }) => None,
                    Err(e) => {
                        tracing::debug!(error = %e, "reading the head copy failed; reading the head from its pack");
                        None
                    }
                });
                a.parts.clear();
            });
        });
        HeadCopy { rx, limit, hashing, requests }
    }

    /// The requests made for the copy (see [`HeadCopy::read`]).
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Never hash the pack: its reader checks it chunk by chunk instead.
    /// [`HeadCopy::get_hashed`]'s digest is then empty.
    pub fn unhashed(&self) {
        self.hashing.store(NEVER, std::sync::atomic::Ordering::Relaxed);
    }

    /// Hash the pack: what has arrived with the next part (or at the end), the rest as
    /// it arrives. [`HeadCopy::get_hashed`]'s digest is the whole pack's, or empty if
    /// the copy had ended before (the caller hashes it then): never that of a part.
    pub fn hashed(&self) {
        let _ = self.hashing.compare_exchange(UNDECIDED, HASH, std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed);
    }

    /// Take at most `n` bytes of the head pack (its size, once the manifest told it):
    /// a read that brings more stops and gives no copy.
    pub fn limit(&self, n: u64) {
        self.limit.store(usize::try_from(n).unwrap_or(usize::MAX), std::sync::atomic::Ordering::Relaxed);
    }

    /// The manifest the copy starts with, as stored (unverified), as soon as it is
    /// here; None for a copy without one (stored before), none, or a read that
    /// failed first.
    pub async fn manifest(&self) -> Option<bytes::Bytes> {
        let mut rx = self.rx.clone();
        let a = rx.wait_for(|a| a.manifest.is_some() || a.pack_at.is_some_and(|p| p <= HEAD_HEADER) || a.done.is_some()).await.ok()?;
        a.manifest.clone()
    }

    /// The base's start a diff's copy carries ([`HEAD_BASE_MAGIC`]: the first object of
    /// the base's split copy, as stored, unverified), as soon as it is here; None for a
    /// copy that carries none, none, or a read that failed first.
    pub async fn base(&self) -> Option<bytes::Bytes> {
        let mut rx = self.rx.clone();
        let a = rx.wait_for(|a| a.base.is_some() || a.carries_base == Some(false) || a.done.is_some()).await.ok()?;
        a.base.clone()
    }

    /// The head pack's first `n` bytes, as soon as they are here; None if the copy
    /// ends first (none, shorter, or its read failed).
    pub async fn prefix(&self, n: usize) -> Option<bytes::Bytes> {
        self.range(0, n).await
    }

    /// Bytes `start..end` of the head pack, as soon as they are here; None if the
    /// copy ends first (none, shorter, or its read failed).
    pub async fn range(&self, start: usize, end: usize) -> Option<bytes::Bytes> {
        let mut rx = self.rx.clone();
        let a = rx.wait_for(|a| a.pack_at.is_some_and(|p| a.len >= p + end) || a.done.is_some()).await.ok()?;
        if let Some(done) = &a.done {
            return done.as_ref().filter(|(b, _)| start <= end && b.len() >= end).map(|(b, _)| b.slice(start..end));
        }
        let p = a.pack_at.expect("waited for");
        Some(gather(&a.parts, p + start, p + end))
    }

    /// The whole head pack, once here.
    pub async fn get(&self) -> Option<bytes::Bytes> {
        self.get_hashed().await.map(|(b, _)| b)
    }

    /// The whole head pack and the SHA-256 (hex) of its bytes, once here (empty unless
    /// [`HeadCopy::hashed`] came before the copy's end).
    pub async fn get_hashed(&self) -> Option<(bytes::Bytes, String)> {
        let mut rx = self.rx.clone();
        let a = rx.wait_for(|a| a.done.is_some()).await.ok()?;
        a.done.clone().flatten()
    }
}

/// The manifest of snapshot `id` and its head copy: one request where the copy
/// brings the manifest (published since it does), else the manifest's read follows
/// the copy's first bytes (or its absence). Returns once the manifest is here; the
/// copy may still be arriving. Call it on the store's runtime (the copy's read is a
/// task of it). A manifest in the copy that does not check is not used, and neither
/// is the rest of that copy: the manifest is read, the head from its pack.
pub async fn manifest_and_head(remote: &Remote, id: &str) -> Result<MissStart> {
    let key = Remote::head_key(id);
    let mut head = HeadCopy::read(remote, id);
    let t0 = std::time::Instant::now();
    // A copy whose manifest did not check: its requests and those bytes.
    let mut spent = (0, 0);
    if let Some(stored) = head.manifest().await {
        let len = stored.len() as u64;
        let object = remote.url.object_url(&key);
        match verify_manifest(&object, stored, id) {
            Ok(manifest) => {
                tracing::debug!(ms = t0.elapsed().as_secs_f64() * 1e3, stored = len, "manifest read from the head's copy");
                return Ok(MissStart { manifest, manifest_len: len, manifest_requests: 0, head });
            }
            Err(e) => {
                tracing::warn!(error = %e, "the manifest in the head's copy does not check; reading the manifest, and the head from its pack");
                spent = (head.requests(), len);
                head = HeadCopy::none();
            }
        }
    }
    let (manifest, manifest_len) = manifest(remote, id).await?;
    Ok(MissStart { manifest, manifest_len: manifest_len + spent.1, manifest_requests: 1 + spent.0, head })
}

/// Base `id`'s start as a diff's copy carried it (`first`: the first object of the
/// base's split copy, [`HeadCopy::base`]): its manifest, checked against the id as one
/// read apart is, and its copy, whose second part ([`Remote::head_rest_key`]) is
/// requested now (the one request this start makes). None (with a warning) where it
/// does not check: the base's copy is then read from the store as for any miss. Call
/// it on the store's runtime.
pub async fn carried_start(remote: &Remote, id: &str, first: bytes::Bytes) -> Option<MissStart> {
    let object = remote.url.object_url(&Remote::head_key(id));
    if !first.starts_with(HEAD_SPLIT_MAGIC) {
        tracing::warn!(object = %object, "the base's start a diff's copy carries is not a split copy; reading the base's copy");
        return None;
    }
    let held: PartsRead = Box::pin(async move { Ok(futures::stream::iter([Ok(first)]).boxed()) });
    let mut head = HeadCopy::from_split(object.clone(), held, Some(parts_read(remote, Remote::head_rest_key(id))));
    // The first object came in the diff's copy: only the second is requested.
    head.requests = 1;
    let stored = head.manifest().await?;
    let len = stored.len() as u64;
    match verify_manifest(&object, stored, id) {
        Ok(manifest) => Some(MissStart { manifest, manifest_len: len, manifest_requests: 0, head }),
        Err(e) => {
            tracing::warn!(error = %e, "the base's start a diff's copy carries does not check; reading the base's copy");
            None
        }
    }
}

/// Fetch every file of `m` into the existing empty directory `dir` and rebuild
/// its derived files. Returns (requests, bytes) made and read: a few ranged
/// reads of packs (format 2), or one read per chunk (format 1).
pub async fn download(remote: &Remote, m: &Manifest, dir: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<(usize, u64)> {
    let mut files = HashMap::new();
    for (fi, f) in m.files.iter().enumerate() {
        let file = File::create(dir.join(&f.name)).map_err(StoreError::local(dir, format!("creating {}", f.name)))?;
        // Zero chunks stay holes.
        file.set_len(f.size).map_err(StoreError::local(dir, format!("sizing {}", f.name)))?;
        files.insert(fi, file);
    }
    let files = &files;
    let (requests, bytes) = if m.packed() {
        crate::pack::download(remote, m, dir, files, progress).await?
    } else {
        let mut wanted: HashMap<crate::manifest::ChunkHash, (u64, Vec<(usize, u64)>)> = HashMap::new();
        for (fi, f) in m.files.iter().enumerate() {
            for c in &f.chunks {
                if let Some(sha) = c.sha256 {
                    wanted.entry(sha).or_insert_with(|| (c.len, Vec::new())).1.push((fi, c.offset));
                }
            }
        }
        let fetched: Vec<u64> = futures::stream::iter(wanted)
            .map(|(sha, (len, places))| async move {
                let data = remote.get_chunk(&sha.hex(), len).await?;
                for (fi, off) in places {
                    let name = &m.files[fi].name;
                    files[&fi].write_all_at(&data, off).map_err(StoreError::local(dir, format!("writing {name}")))?;
                }
                progress(len);
                Ok::<u64, StoreError>(len)
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect()
            .await?;
        (fetched.len(), fetched.iter().sum())
    };
    for (fi, f) in files {
        f.sync_all().map_err(StoreError::local(dir, format!("syncing {}", m.files[*fi].name)))?;
    }
    derive(m, dir, true)?;
    Ok((requests, bytes))
}

/// The working set a node recorded for snapshot `id` after publishing it
/// (`ws/<id>.trace`), installed into `dir` (which holds the fetched snapshot) as
/// ws.trace + ws.pages, unless the manifest carries one. Advisory: it only says
/// which of the verified image's pages to prefetch, so one that is missing,
/// unreadable or does not match the image is skipped (the first restore then
/// records one). Returns the bytes read from the store.
pub async fn working_set(remote: &Remote, m: &Manifest, id: &str, dir: &Path) -> u64 {
    let Some(trace) = recorded_trace(remote, m, id).await else { return 0 };
    match page_reader(dir) {
        Ok(mut read) => drop(install_trace(remote, m, id, dir, &trace, &mut read, true)),
        Err(e) => tracing::warn!(error = %e, "cannot install the recorded working set"),
    }
    trace.len() as u64
}

/// Whether a fetch of `m` asks the store for a recorded working set: when the manifest
/// carries none of its own. A base never has one: it is only restored under a diff,
/// whose own working set covers the base pages it touches.
pub(crate) fn asks_recorded_trace(m: &Manifest) -> bool {
    m.file(TRACE_FILE).is_none() && !m.is_base
}

/// The bytes of `ws/<id>.trace` when [`asks_recorded_trace`] (None: there is none, or
/// it cannot be read, which is only warned about).
pub(crate) async fn recorded_trace(remote: &Remote, m: &Manifest, id: &str) -> Option<bytes::Bytes> {
    if !asks_recorded_trace(m) {
        return None;
    }
    let key = Remote::ws_key(id);
    match remote.get(&key).await {
        Ok(t) => Some(t),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => {
            tracing::warn!(object = %remote.url.object_url(&key), error = %e, "cannot read the recorded working set; the first restore records one");
            None
        }
    }
}

/// Where [`install_trace`] gets a page of pages.img: `(file page, buffer)`.
pub(crate) type PageRead<'a> = &'a mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>;

/// The pages of the snapshot in `dir` as the engine numbers them: its pages.img,
/// then, for a diff, its base's (found beside it, see `thaw_engine::layers::base_dir`).
pub(crate) fn page_files(dir: &Path) -> Result<thaw_engine::pagefiles::PageFiles> {
    let snap = Snapshot::open(dir).map_err(|source| StoreError::Image { dir: dir.to_path_buf(), source })?;
    let refused = |e: thaw_engine::layers::LayerError| StoreError::Snapshot { dir: dir.to_path_buf(), detail: e.to_string() };
    let (_, files, base) = thaw_engine::layers::page_source(dir, &snap.image, snap.pages).map_err(refused)?;
    base.wait().map_err(refused)?;
    Ok(files)
}

/// Pages read from `dir`'s snapshot (see [`page_files`]).
fn page_reader(dir: &Path) -> Result<impl FnMut(u64, &mut [u8]) -> std::io::Result<()>> {
    let pages = page_files(dir)?;
    Ok(move |fp: u64, buf: &mut [u8]| pages.read_exact_at(buf, fp * 4096))
}

/// Link `dir/base` (see `thaw_engine::layers::BASE_LINK`) to the base of a diff at `base`.
pub fn link_base(dir: &Path, base: &Path) -> Result<()> {
    std::os::unix::fs::symlink(base, dir.join(thaw_engine::layers::BASE_LINK)).map_err(StoreError::local(dir, "linking the base"))
}

/// Install `trace` (see [`recorded_trace`]) into `dir` as ws.trace + ws.pages, the
/// pages got from `read` (synced when `durable`). One that does not match the
/// image is skipped, with a warning. Returns whether it was installed.
pub(crate) fn install_trace(remote: &Remote, m: &Manifest, id: &str, dir: &Path, trace: &[u8], read: PageRead, durable: bool) -> bool {
    let installed = WorkingSet::parse(dir, trace, m.image_id)
        .map_err(|e| e.to_string())
        .and_then(|set| ws::write_from(dir, m.image_id, &set.trace, read, write_how(durable, false), None).map_err(|e| e.to_string()));
    if let Err(e) = &installed {
        tracing::warn!(object = %remote.url.object_url(&Remote::ws_key(id)), error = %e, "ignoring a recorded working set that does not match its snapshot");
        ws::invalidate(dir);
    }
    installed.is_ok()
}

/// Rebuild ws.pages (the working set's pages, copied out of the complete pages.img)
/// for the ws.trace in `dir`, when the manifest lists it as derived; synced when
/// `durable`.
pub(crate) fn derive(m: &Manifest, dir: &Path, durable: bool) -> Result<()> {
    if !m.derived.iter().any(|d| d == ws::PAGES_FILE) {
        // ws.pages came as a file: ws.lz4 (never stored) is made beside it.
        compress_ws(m, dir, durable);
        return Ok(());
    }
    let trace = std::fs::read(dir.join(TRACE_FILE)).map_err(StoreError::local(dir, "reading ws.trace"))?;
    write_ws_pages(m, dir, &trace, durable)
}

/// [`derive`] for a lazy fetch's ws.pages placeholder, once every page is here: for
/// the ws.trace in `dir` if there is one (recorded beside the snapshot, or merged by
/// a restore meanwhile), whatever the manifest lists.
pub(crate) fn derive_pages(m: &Manifest, dir: &Path, durable: bool) -> Result<()> {
    match std::fs::read(dir.join(TRACE_FILE)) {
        Ok(trace) => write_ws_pages(m, dir, &trace, durable),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::local(dir, "reading ws.trace")(e)),
    }
}

/// ws.pages for `trace` out of `dir`'s complete image.
fn write_ws_pages(m: &Manifest, dir: &Path, trace: &[u8], durable: bool) -> Result<()> {
    let wse = |source| StoreError::WorkingSet { dir: dir.to_path_buf(), source };
    let set = WorkingSet::parse(dir, trace, m.image_id).map_err(wse)?;
    ws::write_from(dir, m.image_id, &set.trace, &mut page_reader(dir)?, write_how(durable, true), None).map_err(wse)?;
    Ok(())
}

/// ws.lz4 beside a working set that arrived as files (`ws::compress_beside`; clear:
/// a sealed image's frames need the node key, see the node's slots): a failure only
/// costs its speed, so it is logged.
pub(crate) fn compress_ws(m: &Manifest, dir: &Path, durable: bool) {
    let written = match WorkingSet::load(dir, m.image_id) {
        Ok(set) => ws::compress_beside(dir, &set, None, durable),
        Err(ws::WsError::Missing { .. }) => Ok(false),
        Err(e) => Err(e),
    };
    if let Err(e) = written {
        tracing::warn!(dir = %dir.display(), error = %e, "ws.lz4 not written; restores read ws.pages");
    }
}

/// How a working set is written here: compressed (ws.lz4) only off a restore's path
/// and only when synced.
fn write_how(durable: bool, off_path: bool) -> ws::WriteHow {
    match (durable, off_path) {
        (false, _) => ws::WriteHow::Unsynced,
        (true, true) => ws::WriteHow::Durable,
        (true, false) => ws::WriteHow::DurableUncompressed,
    }
}

/// A temporary directory beside `dest` (same filesystem, so it can be renamed
/// into place), removed on drop unless kept.
pub struct TempDir {
    pub path: PathBuf,
    keep: bool,
}

impl TempDir {
    pub fn beside(dest: &Path) -> Result<TempDir> {
        let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "snapshot".into());
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let path = dest.with_file_name(format!(".{name}.partial-{}-{nanos}", std::process::id()));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(StoreError::local(parent, "creating the directory"))?;
        }
        std::fs::create_dir(&path).map_err(StoreError::local(&path, "creating a temporary directory"))?;
        Ok(TempDir { path, keep: false })
    }

    /// Check the snapshot in it, sync, and rename it to `dest` (which must not exist).
    pub fn install(mut self, dest: &Path) -> Result<()> {
        Snapshot::open(&self.path).map_err(|source| StoreError::Image { dir: dest.to_path_buf(), source })?;
        if let Ok(d) = File::open(&self.path) {
            let _ = d.sync_all();
        }
        if dest.exists() {
            return Err(StoreError::Exists { dir: dest.to_path_buf() });
        }
        std::fs::rename(&self.path, dest).map_err(StoreError::local(dest, "renaming the fetched snapshot into place"))?;
        self.keep = true;
        if let Some(parent) = dest.parent().and_then(|p| File::open(p).ok()) {
            let _ = parent.sync_all();
        }
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Fetch snapshot `id` into `dest` (which must not exist).
pub async fn pull(remote: &Remote, id: &str, dest: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<PullReport> {
    let t0 = std::time::Instant::now();
    if dest.exists() {
        return Err(StoreError::Exists { dir: dest.to_path_buf() });
    }
    let (m, mlen) = manifest(remote, id).await?;
    let tmp = TempDir::beside(dest)?;
    // A diff's base comes along, inside it: a pulled snapshot restores by itself.
    let (mut chunks, mut bytes) = (0, 0);
    if let Some(base) = &m.base {
        let (bm, blen) = manifest(remote, base).await?;
        if bm.base.is_some() {
            return Err(StoreError::BadManifest { object: remote.url.object_url(&Remote::manifest_key(base)), detail: "a base that is itself a diff".into() });
        }
        let dir = tmp.path.join(thaw_engine::layers::BASE_LINK);
        std::fs::create_dir(&dir).map_err(StoreError::local(&dir, "creating the base's directory"))?;
        (chunks, bytes) = download(remote, &bm, &dir, progress).await?;
        bytes += blen;
    }
    let (c, b) = download(remote, &m, &tmp.path, progress).await?;
    (chunks, bytes) = (chunks + c, bytes + b);
    tmp.install(dest)?;
    Ok(PullReport {
        id: id.to_string(),
        dir: dest.to_path_buf(),
        snapshot_bytes: m.total_bytes(),
        chunks_fetched: chunks,
        bytes_fetched: bytes + mlen,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy whose parts arrive when the test sends them.
    fn arriving(rt: &tokio::runtime::Runtime) -> (tokio::sync::mpsc::UnboundedSender<Result<bytes::Bytes>>, HeadCopy) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let parts = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
        let copy = rt.block_on(async { HeadCopy::from_parts("x".into(), async move { Ok(Box::pin(parts)) }) });
        (tx, copy)
    }

    /// A split copy whose two objects' parts arrive when the test sends them: the
    /// first's sender, the second's, and the copy.
    type Sender = tokio::sync::mpsc::UnboundedSender<Result<bytes::Bytes>>;
    fn arriving_split(rt: &tokio::runtime::Runtime) -> (Sender, Sender, HeadCopy) {
        let read = |rx: tokio::sync::mpsc::UnboundedReceiver<Result<bytes::Bytes>>| -> PartsRead {
            Box::pin(async move { Ok(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) }).boxed()) })
        };
        let ((tx1, rx1), (tx2, rx2)) = (tokio::sync::mpsc::unbounded_channel(), tokio::sync::mpsc::unbounded_channel());
        let copy = rt.block_on(async { HeadCopy::from_split("x".into(), read(rx1), Some(read(rx2))) });
        (tx1, tx2, copy)
    }

    #[test]
    fn a_split_copy_hands_over_its_first_part_at_once_and_the_pack_with_its_second() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let pack = bytes::Bytes::from_static(b"state.trace+pages");
        let (first, rest) = head_copy_split(b"{manifest}", &pack, 12);
        assert_eq!(&first[..HEAD_MAGIC.len()], HEAD_SPLIT_MAGIC);
        assert_eq!(rest, &b"pages"[..]);
        let (tx1, tx2, copy) = arriving_split(&rt);
        assert_eq!(copy.requests(), 2);
        // The second part arrives first: held until the first part ends.
        tx2.send(Ok(rest.slice(..2))).unwrap();
        tx1.send(Ok(first.clone())).unwrap();
        assert_eq!(rt.block_on(copy.manifest()).unwrap(), &b"{manifest}"[..]);
        copy.hashed();
        assert_eq!(rt.block_on(copy.prefix(12)).unwrap(), &b"state.trace+"[..], "the first part, before the second's end");
        drop(tx1);
        assert_eq!(rt.block_on(copy.prefix(14)).unwrap(), &b"state.trace+pa"[..], "then the second's parts, as the pack's next bytes");
        tx2.send(Ok(rest.slice(2..))).unwrap();
        drop(tx2);
        let (got, digest) = rt.block_on(copy.get_hashed()).unwrap();
        assert_eq!(got, pack);
        assert_eq!(digest, crate::remote::sha256_hex(&pack), "both parts hashed");
    }

    #[test]
    fn a_split_copy_without_its_second_part_is_no_copy_and_a_whole_one_leaves_it_unread() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let pack = bytes::Bytes::from_static(b"state.trace+pages");
        let (first, _) = head_copy_split(b"{manifest}", &pack, 12);
        for second in [Some(StoreError::NotFound { object: "x.rest".into() }), None] {
            let (tx1, tx2, copy) = arriving_split(&rt);
            tx1.send(Ok(first.clone())).unwrap();
            drop(tx1);
            match second {
                Some(e) => tx2.send(Err(e)).unwrap(),
                None => drop(tx2), // an empty second part: the copy is short
            }
            assert_eq!(rt.block_on(copy.manifest()).unwrap(), &b"{manifest}"[..], "the manifest is handed over");
            let got = rt.block_on(copy.get());
            assert!(got.as_ref().is_none_or(|g| g.len() == 12), "{got:?}");
            assert!(rt.block_on(copy.range(0, 13)).is_none(), "never bytes the store did not give");
        }
        // Read without its second part (HeadCopy::from_parts): no copy.
        let (tx, copy) = arriving(&rt);
        tx.send(Ok(first.clone())).unwrap();
        drop(tx);
        assert!(rt.block_on(copy.get()).is_none());
        // A whole copy (thawhd01) beside a second part left from a split one: its
        // pack is the first object's alone.
        let (tx1, tx2, copy) = arriving_split(&rt);
        tx2.send(Ok(bytes::Bytes::from_static(b"stale"))).unwrap();
        tx1.send(Ok(head_copy(b"{manifest}", &pack))).unwrap();
        drop(tx1);
        assert_eq!(rt.block_on(copy.get()).unwrap(), pack);
    }

    #[test]
    fn a_diffs_copy_hands_over_its_manifest_then_its_bases_start_and_counts_from_the_pack() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let pack = bytes::Bytes::from_static(b"state.trace+pages");
        let base_pack = bytes::Bytes::from_static(b"base-state+base-pages");
        let (base_first, _) = head_copy_split(b"{base}", &base_pack, 10);
        let (first, rest) = head_copy_split_carrying(b"{diff}", &base_first, &pack, 12);
        assert_eq!(&first[..HEAD_MAGIC.len()], HEAD_BASE_MAGIC);
        let (tx1, tx2, copy) = arriving_split(&rt);
        // The header, the manifest, the base's length and some of it: the manifest (not
        // before the base's length is here), then the base once all of it is.
        let m_end = HEAD_HEADER + 6;
        tx1.send(Ok(first.slice(..m_end + 6))).unwrap();
        assert_eq!(rt.block_on(copy.manifest()).unwrap(), &b"{diff}"[..]);
        tx1.send(Ok(first.slice(m_end + 6..m_end + 4 + base_first.len() - 1))).unwrap();
        let base = {
            let c = copy.clone();
            rt.spawn(async move { c.base().await })
        };
        tx1.send(Ok(first.slice(m_end + 4 + base_first.len() - 1..))).unwrap();
        assert_eq!(rt.block_on(base).unwrap().unwrap(), base_first, "the base's first object, as stored");
        copy.hashed();
        assert_eq!(rt.block_on(copy.prefix(12)).unwrap(), &b"state.trace+"[..], "offsets are the pack's");
        drop(tx1);
        tx2.send(Ok(rest)).unwrap();
        drop(tx2);
        let (got, digest) = rt.block_on(copy.get_hashed()).unwrap();
        assert_eq!((got, digest), (pack.clone(), crate::remote::sha256_hex(&pack)));
        // A copy that carries none: base() says so at once.
        let (tx1, _tx2, copy) = arriving_split(&rt);
        tx1.send(Ok(head_copy_split(b"{diff}", &pack, 12).0)).unwrap();
        assert!(rt.block_on(copy.base()).is_none());
        // A base's start over the cap, and a copy cut before the base's length: no copy.
        let over = [&HEAD_BASE_MAGIC[..], &6u32.to_le_bytes(), b"{diff}", &(MAX_CARRIED_BASE as u32 + 1).to_le_bytes(), b"x"].concat();
        for stored in [over, first[..m_end + 2].to_vec()] {
            let (tx1, tx2, copy) = arriving_split(&rt);
            tx1.send(Ok(bytes::Bytes::from(stored))).unwrap();
            drop((tx1, tx2));
            assert!(rt.block_on(copy.base()).is_none() && rt.block_on(copy.get()).is_none());
        }
    }

    #[test]
    fn unzip_sizes_its_buffer_by_the_frame_and_keeps_the_cap() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let z = zstd::bulk::compress(&data, 3).unwrap();
        let out = unzip(&z, 1 << 20).unwrap();
        assert_eq!(out, data);
        assert_eq!(out.capacity(), data.len(), "sized by the frame's header, not the cap");
        // More than the cap: refused, whatever the header says.
        assert!(unzip(&z, 1000).is_err());
        // A frame without its size in the header falls back to the cap.
        let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let unsized_frame = enc.finish().unwrap();
        assert_eq!(zstd::zstd_safe::get_frame_content_size(&unsized_frame).ok().flatten(), None);
        assert_eq!(unzip(&unsized_frame, 1 << 20).unwrap(), data);
        assert!(unzip(&unsized_frame, 1000).is_err());
    }

    #[test]
    fn a_prefix_is_handed_over_as_soon_as_it_is_here_and_the_whole_copy_at_its_end() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, copy) = arriving(&rt);
        tx.send(Ok(bytes::Bytes::from_static(b"state"))).unwrap();
        tx.send(Ok(bytes::Bytes::from_static(b".trace+"))).unwrap();
        // Told to hash after two parts came: those are hashed too.
        rt.block_on(copy.prefix(12)).unwrap();
        copy.hashed();
        // The first 8 bytes span two parts; the read has not ended (a copy without
        // a manifest, stored before: its first 12 bytes tell).
        assert_eq!(rt.block_on(copy.prefix(8)).unwrap(), &b"state.tr"[..]);
        assert_eq!(rt.block_on(copy.range(4, 7)).unwrap(), &b"e.t"[..]);
        let whole = {
            let c = copy.clone();
            rt.spawn(async move { c.get().await })
        };
        tx.send(Ok(bytes::Bytes::from_static(b"pages"))).unwrap();
        drop(tx);
        assert_eq!(rt.block_on(whole).unwrap().unwrap(), &b"state.trace+pages"[..]);
        assert_eq!(rt.block_on(copy.get_hashed()).unwrap().1, crate::remote::sha256_hex(b"state.trace+pages"), "hashed as it arrived");
        assert_eq!(rt.block_on(copy.range(3, 13)).unwrap(), &b"te.trace+p"[..]);
        assert_eq!(rt.block_on(copy.prefix(5)).unwrap(), &b"state"[..], "after the end too");
        assert!(rt.block_on(copy.prefix(100)).is_none(), "a copy shorter than the prefix asked");
    }

    #[test]
    fn a_copy_is_hashed_only_when_its_reader_asks_before_its_end() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let digest = |tell: &dyn Fn(&HeadCopy), before_end: bool| {
            let (tx, copy) = arriving(&rt);
            tx.send(Ok(bytes::Bytes::from_static(b"state.trace+"))).unwrap();
            rt.block_on(copy.prefix(12)).unwrap();
            if before_end {
                tell(&copy);
            }
            tx.send(Ok(bytes::Bytes::from_static(b"pages"))).unwrap();
            drop(tx);
            let (pack, digest) = rt.block_on(copy.get_hashed()).unwrap();
            assert_eq!(pack, &b"state.trace+pages"[..]);
            if !before_end {
                tell(&copy);
                assert_eq!(rt.block_on(copy.get_hashed()).unwrap().1, digest, "told after the end: nothing more");
            }
            digest
        };
        assert_eq!(digest(&|_| {}, true), "", "never told: not hashed");
        assert_eq!(digest(&HeadCopy::unhashed, true), "");
        assert_eq!(digest(&HeadCopy::hashed, true), crate::remote::sha256_hex(b"state.trace+pages"));
        assert_eq!(digest(&HeadCopy::hashed, false), "", "told after the end: the caller hashes it");
        // Once told never, a later ask does not start it (a part would be missing).
        assert_eq!(
            digest(
                &|c| {
                    c.unhashed();
                    c.hashed();
                },
                true
            ),
            ""
        );
    }

    #[test]
    fn a_copy_that_starts_with_the_manifest_hands_it_over_first_and_counts_from_the_pack() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, copy) = arriving(&rt);
        let stored = head_copy(b"{manifest}", b"state.trace+pages");
        // The header split across parts, the manifest's end in the same part as the pack's start.
        tx.send(Ok(stored.slice(..5))).unwrap();
        tx.send(Ok(stored.slice(5..HEAD_HEADER + 12))).unwrap();
        assert_eq!(rt.block_on(copy.manifest()).unwrap(), &b"{manifest}"[..]);
        copy.hashed();
        assert_eq!(rt.block_on(copy.prefix(2)).unwrap(), &b"st"[..], "offsets are the pack's");
        tx.send(Ok(stored.slice(HEAD_HEADER + 12..))).unwrap();
        assert_eq!(rt.block_on(copy.range(5, 11)).unwrap(), &b".trace"[..]);
        drop(tx);
        let (pack, digest) = rt.block_on(copy.get_hashed()).unwrap();
        assert_eq!(pack, &b"state.trace+pages"[..]);
        assert_eq!(digest, crate::remote::sha256_hex(b"state.trace+pages"), "the pack's bytes hashed, not the manifest's");
        assert_eq!(rt.block_on(copy.manifest()).unwrap(), &b"{manifest}"[..], "after the end too");
    }

    #[test]
    fn a_copy_without_a_manifest_is_the_pack_and_a_bad_header_is_no_copy() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        // Stored before manifests went into copies.
        let (tx, copy) = arriving(&rt);
        copy.hashed();
        tx.send(Ok(bytes::Bytes::from_static(b"state.trace+pages"))).unwrap();
        assert!(rt.block_on(copy.manifest()).is_none());
        assert_eq!(rt.block_on(copy.prefix(5)).unwrap(), &b"state"[..]);
        drop(tx);
        assert_eq!(rt.block_on(copy.get_hashed()).unwrap().1, crate::remote::sha256_hex(b"state.trace+pages"));
        // Shorter than a header.
        let (tx, copy) = arriving(&rt);
        tx.send(Ok(bytes::Bytes::from_static(b"pages"))).unwrap();
        drop(tx);
        assert!(rt.block_on(copy.manifest()).is_none());
        assert_eq!(rt.block_on(copy.get()).unwrap(), &b"pages"[..]);
        // A manifest's length over the cap, and a copy that ends inside its manifest.
        for stored in [
            [&HEAD_MAGIC[..], &u32::MAX.to_le_bytes(), b"{manifest}"].concat(),
            head_copy(b"{manifest}", b"pages")[..HEAD_HEADER + 4].to_vec(),
        ] {
            let (tx, copy) = arriving(&rt);
            tx.send(Ok(bytes::Bytes::from(stored))).unwrap();
            drop(tx);
            assert!(rt.block_on(copy.manifest()).is_none());
            assert!(rt.block_on(copy.prefix(1)).is_none() && rt.block_on(copy.get()).is_none());
        }
    }

    #[test]
    fn a_copy_longer_than_the_head_is_not_read_past_it() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, copy) = arriving(&rt);
        tx.send(Ok(head_copy(b"{manifest}", b"state"))).unwrap();
        assert_eq!(rt.block_on(copy.manifest()).unwrap(), &b"{manifest}"[..]);
        copy.limit(10);
        tx.send(Ok(bytes::Bytes::from_static(b".trac"))).unwrap();
        assert_eq!(rt.block_on(copy.prefix(10)).unwrap(), &b"state.trac"[..], "within the limit");
        // The store keeps sending: the read stops there, and there is no copy.
        tx.send(Ok(bytes::Bytes::from(vec![0u8; 1 << 20]))).unwrap();
        assert!(rt.block_on(copy.get()).is_none());
        assert!(tx.send(Ok(bytes::Bytes::from_static(b"more"))).is_err(), "the read stopped, nothing more is taken");
    }

    #[test]
    fn a_copy_whose_read_fails_or_that_is_missing_gives_nothing() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, copy) = arriving(&rt);
        tx.send(Ok(bytes::Bytes::from_static(b"state"))).unwrap();
        tx.send(Err(StoreError::NotFound { object: "x".into() })).unwrap();
        assert!(rt.block_on(copy.prefix(8)).is_none(), "ended before 8 bytes");
        assert!(rt.block_on(copy.get()).is_none(), "a read that failed half way is no copy");
        let missing = rt.block_on(async { HeadCopy::from_parts("x".into(), async { Err::<futures::stream::Empty<Result<bytes::Bytes>>, _>(StoreError::NotFound { object: "x".into() }) }) });
        assert!(rt.block_on(missing.prefix(1)).is_none() && rt.block_on(missing.get()).is_none());
        assert!(rt.block_on(HeadCopy::none().get()).is_none());
    }
}
