//! Publishing a snapshot directory: cut it into chunks, upload the chunks the
//! store lacks, then write the manifest (the commit point). This module plans
//! the chunks (and uploads them as objects of their own, format 1); `pack.rs`
//! puts the new ones into packs (format 2, the default).
//!
//! Chunking. state.bin and ws.trace are cut into 1 MiB pieces (they change
//! with every capture, nothing to share). pages.img is cut by *virtual
//! address*: one chunk holds the stored pages of one aligned
//! [`PAGE_WINDOW`]-byte window of the address space (pages.img is in address
//! order, so that is a contiguous byte range). A page that changes between two
//! versions of a function then only changes the chunk of its own window, and a
//! page added or removed elsewhere shifts nothing (fixed offsets in the file
//! would shift every later chunk). Measured on two versions of the Python
//! sample that differ in two lines (5.4 MB of pages, captured without ASLR and
//! with a fixed hash seed; 154 of 1323 pages differ, spread over the heap):
//! both versions together take 1.12/1.18/1.27/1.38/1.54x the bytes of one at
//! windows of 4/8/16/32/64 KiB. 8 KiB keeps two versions well within 1.3x at
//! half the objects of per-page chunks (~1 object per 8 KiB stored). A chunk
//! of zeros is not stored. ws.pages is not stored at all (see manifest.rs).

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use thaw_engine::image::{Snapshot, PAGES_FILE, STATE_FILE};
use thaw_engine::ws::{WorkingSet, TRACE_FILE};

use crate::error::{Result, StoreError};
use crate::manifest::{Chunk, FileEntry, Manifest, MANIFEST_FORMAT_CHUNKS};
use crate::remote::{sha256_hex, Remote, CONCURRENCY};

/// Bytes of address space per pages.img chunk.
pub const PAGE_WINDOW: u64 = 8 << 10;
/// Chunk size of the other files.
pub const FILE_CHUNK: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// A snapshot cut into chunks, ready to upload.
#[derive(Debug, Clone)]
pub struct Plan {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub manifest_bytes: Vec<u8>,
    /// SHA-256 of the manifest: the snapshot's id.
    pub id: String,
    /// The distinct stored chunks: (file, offset, len, sha). ws.trace is held in memory.
    pub uploads: Vec<Upload>,
    /// What a restore reads before the process resumes, in that order (indexes into
    /// `uploads`): state.bin, ws.trace, the chunks of the working set's pages in the
    /// order the trace first touched them, then those of the pages written before
    /// resume (private file mappings, rseq areas). Stored as a pack of its own (the head),
    /// so a restore that misses the cache starts after one read.
    pub head: Vec<usize>,
    ws_trace: Option<Bytes>,
    /// A diff's base, where it is (to be published first, see [`Plan::set_base`]).
    pub base_dir: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Upload {
    pub file: &'static str,
    pub offset: u64,
    pub len: u64,
    pub sha256: String,
}

/// What a push did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PushReport {
    pub url: String,
    pub id: String,
    /// Bytes of the snapshot's stored files.
    pub snapshot_bytes: u64,
    pub chunks: usize,
    pub zero_chunks: usize,
    /// Chunks the store did not have (put into new packs, or objects of format 1).
    pub chunks_uploaded: usize,
    /// Packs the manifest names, and how many of them this push sent.
    pub packs: usize,
    pub packs_uploaded: usize,
    /// Requests made to the store.
    pub requests: u64,
    /// Bytes sent to the store (packs or chunks it did not have, plus the manifest).
    pub bytes_uploaded: u64,
    /// Chunk bytes the store already had.
    pub bytes_deduplicated: u64,
    pub seconds: f64,
    /// A diff's base, pushed first (its requests and bytes are counted above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

fn cut_fixed(f: &File, size: u64) -> std::io::Result<Vec<(u64, u64, Option<String>)>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < size {
        let len = FILE_CHUNK.min(size - off);
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, off)?;
        out.push((off, len, chunk_name(&buf)));
        off += len;
    }
    Ok(out)
}

fn chunk_name(data: &[u8]) -> Option<String> {
    (!data.iter().all(|&b| b == 0)).then(|| sha256_hex(data))
}

/// [`plan`] of the snapshot in `dir` and, for a diff, of its base (marked as one:
/// it is pushed first and the diff names it, see `Store::push`).
pub fn plan_layered(dir: &Path) -> Result<(Plan, Option<Plan>)> {
    let snap = plan(dir)?;
    let Some(base_dir) = snap.base_dir.clone() else { return Ok((snap, None)) };
    let mut base = plan(&base_dir)?;
    if base.base_dir.is_some() {
        return Err(StoreError::Snapshot { dir: base_dir, detail: "a base that is itself a diff".into() });
    }
    base.mark_base();
    Ok((snap, Some(base)))
}

/// Cut the snapshot in `dir` into chunks and build its manifest (reads every byte once).
pub fn plan(dir: &Path) -> Result<Plan> {
    let snap = Snapshot::open(dir).map_err(|e| StoreError::Snapshot { dir: dir.to_path_buf(), detail: format!("{e}") })?;
    let base_dir = snap.image.base.as_ref().map(|b| thaw_engine::layers::base_dir(dir, b));
    let io = |what: &str| StoreError::local(dir, what.to_string());
    let mut files = Vec::new();

    let state = File::open(dir.join(STATE_FILE)).map_err(io("opening state.bin"))?;
    let size = state.metadata().map_err(io("reading state.bin"))?.len();
    files.push((STATE_FILE, size, cut_fixed(&state, size).map_err(io("reading state.bin"))?));

    // pages.img by address window. Runs are sorted by address and pages.img is
    // in the same order; check rather than assume.
    let mut runs = snap.image.pages.runs.clone();
    runs.sort_by_key(|r| r.file_page);
    let mut cuts: Vec<(u64, u64)> = Vec::new(); // (first file page, pages)
    let mut last_window = None;
    for r in &runs {
        for i in 0..r.npages {
            let window = (r.vaddr + i * PAGE) / PAGE_WINDOW;
            let fp = r.file_page + i;
            match cuts.last_mut() {
                Some((start, n)) if last_window == Some(window) && *start + *n == fp => *n += 1,
                _ => cuts.push((fp, 1)),
            }
            last_window = Some(window);
        }
    }
    let mut page_chunks = Vec::with_capacity(cuts.len());
    let mut buf = Vec::new();
    for (fp, n) in cuts {
        buf.resize((n * PAGE) as usize, 0);
        snap.pages.read_exact_at(&mut buf, fp * PAGE).map_err(io("reading pages.img"))?;
        page_chunks.push((fp * PAGE, n * PAGE, chunk_name(&buf)));
    }
    let pages_size = snap.image.pages.stored_pages() * PAGE;
    files.push((PAGES_FILE, pages_size, page_chunks));

    // The working set, if there is one and it belongs to this image.
    let mut ws_trace = None;
    let mut ws_pages: Vec<u64> = Vec::new();
    if WorkingSet::exists(dir) {
        match WorkingSet::load(dir, snap.id) {
            Ok(set) => {
                // Stored pages in the order the trace first touched them.
                let mut seen = HashSet::new();
                ws_pages = set.trace.iter().filter_map(|t| t.file_page).filter(|fp| seen.insert(*fp)).collect();
                let t = std::fs::read(dir.join(TRACE_FILE)).map_err(io("reading ws.trace"))?;
                let chunks = t
                    .chunks(FILE_CHUNK as usize)
                    .enumerate()
                    .map(|(i, c)| (i as u64 * FILE_CHUNK, c.len() as u64, chunk_name(c)))
                    .collect();
                files.push((TRACE_FILE, t.len() as u64, chunks));
                ws_trace = Some(Bytes::from(t));
            }
            Err(e) => tracing::warn!("publishing {} without its working set: {e}", dir.display()),
        }
    }

    let mut uploads = Vec::new();
    let mut seen = HashSet::new();
    let mut entries = Vec::new();
    for (name, size, chunks) in files {
        let mut list = Vec::with_capacity(chunks.len());
        for (offset, len, sha) in chunks {
            if let Some(s) = &sha {
                if seen.insert(s.clone()) {
                    uploads.push(Upload { file: name, offset, len, sha256: s.clone() });
                }
            }
            list.push(Chunk::new(offset, len, sha));
        }
        entries.push(FileEntry { name: name.to_string(), size, chunks: list });
    }
    // The head: chunks of state.bin and ws.trace, of the working set's pages (trace
    // order), of the copy-on-written pages of private file mappings and of the rseq
    // areas (both written before resume). pages.img chunks tile the file in offset
    // order.
    let upload_of: std::collections::HashMap<&str, usize> = uploads.iter().enumerate().map(|(i, u)| (u.sha256.as_str(), i)).collect();
    let mut head = Vec::new();
    let mut in_head = HashSet::new();
    let mut add = |sha: &Option<String>, head: &mut Vec<usize>| {
        if let Some(&i) = sha.as_deref().and_then(|s| upload_of.get(s)) {
            if in_head.insert(i) {
                head.push(i);
            }
        }
    };
    for e in entries.iter().filter(|e| e.name != PAGES_FILE) {
        for c in &e.chunks {
            add(&c.sha256, &mut head);
        }
    }
    if let Some(pages) = entries.iter().find(|e| e.name == PAGES_FILE) {
        let chunk_at = |fp: u64| {
            let off = fp * PAGE;
            let i = pages.chunks.partition_point(|c| c.offset + c.len <= off);
            pages.chunks.get(i)
        };
        // What a restore writes before resume: the copy-on-written file pages and each
        // thread's rseq area.
        let cow = thaw_engine::restore::file_cow_runs(&snap.image, &snap.image.pages).flat_map(|(_, fp, n)| fp..fp + n);
        let rseq: Vec<u64> = thaw_engine::restore::rseq_pages(&snap.image).into_iter().filter_map(|vaddr| snap.image.pages.lookup(vaddr)).collect();
        for fp in ws_pages.iter().copied().chain(cow).chain(rseq) {
            if let Some(c) = chunk_at(fp) {
                add(&c.sha256, &mut head);
            }
        }
    }
    let derived = if ws_trace.is_some() { vec![thaw_engine::ws::PAGES_FILE.to_string()] } else { vec![] };
    let manifest = Manifest {
        format: MANIFEST_FORMAT_CHUNKS,
        packs: vec![],
        head: None,
        image_format: thaw_engine::image::FORMAT_VERSION,
        image_id: snap.id,
        files: entries,
        derived,
        base: None,
        is_base: false,
    };
    let manifest_bytes = manifest.to_bytes();
    let id = sha256_hex(&manifest_bytes);
    Ok(Plan { dir: dir.to_path_buf(), manifest, manifest_bytes, id, uploads, head, ws_trace, base_dir })
}

impl Plan {
    /// Mark this snapshot as the base of diffs (collected once none names it).
    pub fn mark_base(&mut self) {
        self.manifest.is_base = true;
        self.manifest_bytes = self.manifest.to_bytes();
        self.id = sha256_hex(&self.manifest_bytes);
    }

    /// Name stored snapshot `id` as the base of this diff.
    pub fn set_base(&mut self, id: &str) {
        self.manifest.base = Some(id.to_string());
        self.manifest_bytes = self.manifest.to_bytes();
        self.id = sha256_hex(&self.manifest_bytes);
    }

    /// The bytes of upload `u`, checked against its name (the files must not
    /// change between planning and uploading).
    pub(crate) fn read(&self, u: &Upload) -> Result<Bytes> {
        let data = if u.file == TRACE_FILE {
            let t = self.ws_trace.as_ref().expect("planned with a trace");
            t.slice(u.offset as usize..(u.offset + u.len) as usize)
        } else {
            let f = File::open(self.dir.join(u.file)).map_err(StoreError::local(&self.dir, format!("opening {}", u.file)))?;
            let mut buf = vec![0u8; u.len as usize];
            f.read_exact_at(&mut buf, u.offset).map_err(StoreError::local(&self.dir, format!("reading {}", u.file)))?;
            Bytes::from(buf)
        };
        if sha256_hex(&data) != u.sha256 {
            return Err(StoreError::Snapshot {
                dir: self.dir.clone(),
                detail: format!("{} changed while it was being published (offset {})", u.file, u.offset),
            });
        }
        Ok(data)
    }
}

/// Format 1 (`THAW_STORE_FORMAT=1`, kept to measure against): upload
/// `plan.uploads[i]` as an object of its own unless the store has it already (same
/// name = same bytes; a stored object of the wrong size is replaced, and so is one
/// the collector condemned). Returns the bytes sent.
pub async fn upload_one(remote: &Remote, plan: &Plan, i: usize, condemned: &HashSet<String>) -> Result<u64> {
    let u = &plan.uploads[i];
    let key = Remote::chunk_key(&u.sha256);
    if !condemned.contains(&key) {
        if let Some(meta) = remote.head(&key).await? {
            if meta.size == u.len {
                return Ok(0);
            }
        }
    }
    let data = plan.read(u)?;
    remote.put(&key, data).await?;
    Ok(u.len)
}

/// Upload chunks `which` of `plan` with bounded parallelism; `progress` gets
/// each chunk's planned length once it is in the store. Returns (chunks sent, bytes sent).
pub async fn upload(
    remote: &Remote,
    plan: &Plan,
    which: std::ops::Range<usize>,
    condemned: &HashSet<String>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(usize, u64)> {
    let sent: Vec<u64> = futures::stream::iter(which)
        .map(|i| async move {
            let n = upload_one(remote, plan, i, condemned).await?;
            progress(plan.uploads[i].len);
            Ok::<u64, StoreError>(n)
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    Ok((sent.iter().filter(|&&n| n > 0).count(), sent.iter().sum()))
}

/// Write the manifest: from now on the snapshot exists.
pub async fn commit(remote: &Remote, plan: &Plan) -> Result<()> {
    remote.put(&Remote::manifest_key(&plan.id), Bytes::from(plan.manifest_bytes.clone())).await
}
