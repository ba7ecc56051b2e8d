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
    let object = remote.url.object_url(&key);
    let t0 = std::time::Instant::now();
    let stored = remote.get(&key).await?;
    let got_ms = t0.elapsed().as_secs_f64() * 1e3;
    let len = stored.len() as u64;
    // Format 3 is stored compressed (zstd's magic; JSON starts with '{'), never
    // decompressed past the cap on manifests.
    let bytes = if stored.starts_with(&ZSTD_MAGIC) {
        bytes::Bytes::from(
            zstd::bulk::decompress(&stored, crate::manifest::MAX_MANIFEST_LEN)
                .map_err(|e| StoreError::Corrupt { object: object.clone(), detail: format!("does not decompress: {e}") })?,
        )
    } else {
        stored
    };
    let got = sha256_hex(&bytes);
    if got != id {
        return Err(StoreError::Corrupt { object, detail: format!("contents hash to {got}") });
    }
    let m = Manifest::parse(&object, &bytes)?;
    tracing::debug!(get_ms = got_ms, checked_ms = t0.elapsed().as_secs_f64() * 1e3, stored = len, json = bytes.len(), "manifest read");
    Ok((m, len))
}

/// What a miss fetches first: the manifest of the snapshot (verified against its
/// name) and, read beside it in parallel, the copy of its head pack
/// ([`Remote::head_key`], checked against the manifest's head by `lazy::open`).
#[derive(Clone)]
pub struct MissStart {
    pub manifest: Manifest,
    /// The manifest's size in the store.
    pub manifest_len: u64,
    /// The head copy, arriving (see [`HeadCopy`]).
    pub head: HeadCopy,
}

/// The head's copy as it arrives: read on the store's runtime beside the manifest,
/// part by part, and awaited only by what needs it. The head pack starts with
/// state.bin's and ws.trace's chunks (`publish::plan`), so a miss takes those out of
/// the copy's first bytes ([`HeadCopy::prefix`]) and starts the restore while the
/// rest, the working set's pages, is still on the wire ([`HeadCopy::get`]); on a slow
/// link that is most of the copy's transfer. Both resolve to None where the store has
/// no copy (published before copies, or without one) or its read failed: the head is
/// then read from its pack, after the manifest, as before.
#[derive(Clone)]
pub struct HeadCopy(tokio::sync::watch::Receiver<Arrival>);

/// What has arrived of a head's copy.
#[derive(Default)]
pub struct Arrival {
    /// The parts so far, in order, and their bytes in all.
    parts: Vec<bytes::Bytes>,
    len: usize,
    /// Set once the read ended: the whole copy and the SHA-256 (hex) of its bytes
    /// (hashed as they arrived), or None (none, or the read failed).
    done: Option<Option<(bytes::Bytes, String)>>,
}

impl HeadCopy {
    /// No copy (a whole fetch).
    pub fn none() -> HeadCopy {
        HeadCopy(tokio::sync::watch::channel(Arrival { done: Some(None), ..Default::default() }).1)
    }

    /// The copy of `key` read on the current runtime, part by part (see [`Remote::get_stream`]).
    pub fn read(remote: &Remote, key: String) -> HeadCopy {
        let r = remote.clone();
        HeadCopy::from_parts(async move { r.get_stream(&key).await })
    }

    /// The copy whose parts `parts` brings (a task of the current runtime gathers them).
    pub fn from_parts<F, S>(parts: F) -> HeadCopy
    where
        F: std::future::Future<Output = Result<S>> + Send + 'static,
        S: futures::Stream<Item = Result<bytes::Bytes>> + Send + Unpin + 'static,
    {
        let (tx, rx) = tokio::sync::watch::channel(Arrival::default());
        let t0 = std::time::Instant::now();
        tokio::spawn(async move {
            let mut sha = <sha2::Sha256 as sha2::Digest>::new();
            let read = async {
                let mut parts = parts.await?;
                while let Some(part) = parts.next().await {
                    let part = part?;
                    sha2::Digest::update(&mut sha, &part);
                    tx.send_modify(|a| {
                        a.len += part.len();
                        a.parts.push(part);
                    });
                }
                Ok::<(), StoreError>(())
            };
            let ended = read.await;
            tracing::debug!(get_ms = t0.elapsed().as_secs_f64() * 1e3, ok = ended.is_ok(), "head copy read");
            tx.send_modify(|a| {
                a.done = Some(match ended {
                    Ok(()) => Some((
                        match a.parts.len() {
                            1 => a.parts[0].clone(),
                            _ => bytes::Bytes::from(a.parts.concat()),
                        },
                        hex::encode(sha2::Digest::finalize(sha)),
                    )),
                    Err(StoreError::NotFound { .. }) => None,
                    Err(e) => {
                        tracing::debug!(error = %e, "reading the head copy failed; reading the head from its pack");
                        None
                    }
                });
                a.parts.clear();
            });
        });
        HeadCopy(rx)
    }

    /// The copy's first `n` bytes, as soon as they are here; None if it ends first
    /// (none, shorter, or its read failed).
    pub async fn prefix(&self, n: usize) -> Option<bytes::Bytes> {
        self.range(0, n).await
    }

    /// Bytes `start..end` of the copy, as soon as they are here; None if it ends
    /// first (none, shorter, or its read failed).
    pub async fn range(&self, start: usize, end: usize) -> Option<bytes::Bytes> {
        let mut rx = self.0.clone();
        let a = rx.wait_for(|a| a.len >= end || a.done.is_some()).await.ok()?;
        if let Some(done) = &a.done {
            return done.as_ref().filter(|(b, _)| start <= end && b.len() >= end).map(|(b, _)| b.slice(start..end));
        }
        let mut out = bytes::BytesMut::with_capacity(end.saturating_sub(start));
        let mut at = 0;
        for p in &a.parts {
            let (from, to) = (start.max(at), end.min(at + p.len()));
            if from < to {
                out.extend_from_slice(&p[from - at..to - at]);
            }
            at += p.len();
        }
        Some(out.freeze())
    }

    /// The whole copy, once here.
    pub async fn get(&self) -> Option<bytes::Bytes> {
        self.get_hashed().await.map(|(b, _)| b)
    }

    /// The whole copy and the SHA-256 (hex) of its bytes, once here.
    pub async fn get_hashed(&self) -> Option<(bytes::Bytes, String)> {
        let mut rx = self.0.clone();
        let a = rx.wait_for(|a| a.done.is_some()).await.ok()?;
        a.done.clone().flatten()
    }
}

/// The manifest of snapshot `id` and, in parallel, its head copy (one round trip
/// for both, where the head otherwise needed a second one after the manifest).
/// Returns once the manifest is here; the copy may still be arriving. Call it on
/// the store's runtime (the copy's read is a task of it).
pub async fn manifest_and_head(remote: &Remote, id: &str) -> Result<MissStart> {
    let head = HeadCopy::read(remote, Remote::head_key(id));
    let (manifest, manifest_len) = manifest(remote, id).await?;
    Ok(MissStart { manifest, manifest_len, head })
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
        let mut wanted: HashMap<String, (u64, Vec<(usize, u64)>)> = HashMap::new();
        for (fi, f) in m.files.iter().enumerate() {
            for c in &f.chunks {
                if let Some(sha) = &c.sha256 {
                    wanted.entry(sha.clone()).or_insert_with(|| (c.len, Vec::new())).1.push((fi, c.offset));
                }
            }
        }
        let fetched: Vec<u64> = futures::stream::iter(wanted)
            .map(|(sha, (len, places))| async move {
                let data = remote.get_chunk(&sha, len).await?;
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
    let (_, files) = thaw_engine::layers::page_source(dir, &snap.image, snap.pages)
        .map_err(|e| StoreError::Snapshot { dir: dir.to_path_buf(), detail: e.to_string() })?;
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
        .and_then(|set| ws::write_from(dir, m.image_id, &set.trace, read, durable).map_err(|e| e.to_string()));
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
    ws::write_from(dir, m.image_id, &set.trace, &mut page_reader(dir)?, durable).map_err(wse)?;
    Ok(())
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
        let copy = rt.block_on(async { HeadCopy::from_parts(async move { Ok(Box::pin(parts)) }) });
        (tx, copy)
    }

    #[test]
    fn a_prefix_is_handed_over_as_soon_as_it_is_here_and_the_whole_copy_at_its_end() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, copy) = arriving(&rt);
        tx.send(Ok(bytes::Bytes::from_static(b"state"))).unwrap();
        tx.send(Ok(bytes::Bytes::from_static(b".trace"))).unwrap();
        // The first 8 bytes span two parts; the read has not ended.
        assert_eq!(rt.block_on(copy.prefix(8)).unwrap(), &b"state.tr"[..]);
        assert_eq!(rt.block_on(copy.range(4, 7)).unwrap(), &b"e.t"[..]);
        let whole = {
            let c = copy.clone();
            rt.spawn(async move { c.get().await })
        };
        tx.send(Ok(bytes::Bytes::from_static(b"+pages"))).unwrap();
        drop(tx);
        assert_eq!(rt.block_on(whole).unwrap().unwrap(), &b"state.trace+pages"[..]);
        assert_eq!(rt.block_on(copy.get_hashed()).unwrap().1, crate::remote::sha256_hex(b"state.trace+pages"), "hashed as it arrived");
        assert_eq!(rt.block_on(copy.range(3, 13)).unwrap(), &b"te.trace+p"[..]);
        assert_eq!(rt.block_on(copy.prefix(5)).unwrap(), &b"state"[..], "after the end too");
        assert!(rt.block_on(copy.prefix(100)).is_none(), "a copy shorter than the prefix asked");
    }

    #[test]
    fn a_copy_whose_read_fails_or_that_is_missing_gives_nothing() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, copy) = arriving(&rt);
        tx.send(Ok(bytes::Bytes::from_static(b"state"))).unwrap();
        tx.send(Err(StoreError::NotFound { object: "x".into() })).unwrap();
        assert!(rt.block_on(copy.prefix(8)).is_none(), "ended before 8 bytes");
        assert!(rt.block_on(copy.get()).is_none(), "a read that failed half way is no copy");
        let missing = rt.block_on(async { HeadCopy::from_parts(async { Err::<futures::stream::Empty<Result<bytes::Bytes>>, _>(StoreError::NotFound { object: "x".into() }) }) });
        assert!(rt.block_on(missing.prefix(1)).is_none() && rt.block_on(missing.get()).is_none());
        assert!(rt.block_on(HeadCopy::none().get()).is_none());
    }
}
