//! Publishing a snapshot directory: cut it into chunks, upload the chunks the
//! store lacks, then write the manifest (the commit point). This module plans
//! the chunks (and uploads them as objects of their own, format 1); `pack.rs`
//! puts the new ones into packs (format 2, the default).
//!
//! Chunking. state.bin and ws.trace are cut into 1 MiB pieces (they change
//! with every capture, nothing to share). pages.img is cut by *content*
//! ([`Chunking::DEFAULT`]): FastCDC (the `fastcdc` crate, 2020 variant) at 16 KiB
//! on average, every cut moved up to a page boundary (a fault needs one chunk),
//! after the file is split where the head's pages (what a restore reads before
//! resume) begin and end, so the head holds nothing else. A page that changes
//! changes the chunk it is in; pages added or removed shift nothing beyond the
//! chunks around them (the content resynchronizes the cuts). A chunk of zeros is
//! not stored. ws.pages (format 4) is cut into 1 MiB pieces, in the head: a miss
//! installs the working set from a few large chunks, which compress better and
//! decompress faster than the hundreds of small ones its pages are in pages.img. The
//! pages.img chunks that hold only working-set pages (cut apart from the others) are
//! packed last, and a miss builds them from ws.pages (see `lazy.rs`).
//! `THAW_STORE_WS=derived` stores no ws.pages (format 3, the baseline).
//!
//! Measured (bench/chunking.py, bench/results/chunking-20261125T190731Z: two
//! versions of a function captured with the same layout; stored = compressed
//! chunks; the head = its pages.img bytes):
//!
//! | lrserving | chunks | manifest (zstd) | parse | head raw / stored | helloworld 2 vs 1 |
//! |---|---|---|---|---|---|
//! | 8 KiB address windows (before) | 8,535 | 426 KB | 1.9 ms | 12.9 / 3.9 MB | 1.22x |
//! | CDC 8 KiB | 6,633 | 341 KB | 1.5 ms | 8.3 / 2.5 MB | 1.27x |
//! | **CDC 16 KiB** | 4,403 | 228 KB | 1.0 ms | 8.3 / 2.5 MB | 1.32x |
//! | CDC 64 KiB | 2,829 | 146 KB | 0.6 ms | 8.3 / 2.5 MB | 1.43x |
//! | CDC 64 KiB, head mixed in | 745 | 39 KB | 0.2 ms | 42.7 / 10.3 MB | 1.76x |
//!
//! Keeping the head apart is what shrinks it (a third less to fetch, decompress
//! and hash before the start); the average size trades dedup between versions
//! (changes are pages rewritten in place, spread over the heap: smaller chunks
//! share more) against the manifest, which every miss reads first. 16 KiB keeps
//! both near the smaller sizes' (lrserving's two versions share almost nothing at
//! any size: 1.94x to 2.0x). `THAW_STORE_CHUNKS=window` (and formats 1 and 2) cut
//! by address window as before, to measure against.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use thaw_engine::image::{Snapshot, PAGES_FILE, STATE_FILE};
use thaw_engine::ws::lz4::Codec;
use thaw_engine::ws::{WorkingSet, TRACE_FILE};

use crate::error::{Result, StoreError};
use crate::manifest::{Chunk, ChunkHash, FileEntry, Manifest, MANIFEST_FORMAT_CHUNKS};
use crate::remote::{sha256_hex, Remote, CONCURRENCY};

/// Chunk size of the files other than pages.img.
pub const FILE_CHUNK: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// How pages.img is cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunking {
    /// One chunk per aligned window of this many bytes of address space (before
    /// content-defined chunks; `THAW_STORE_CHUNKS=window`, and formats 1 and 2).
    Window(u64),
    /// Content-defined (FastCDC 2020) with this average size in bytes, every cut
    /// rounded up to a page. `head_gap`: Some(g) splits pages.img where the head (the
    /// pages a restore reads before resume) begins and ends, counting gaps of at most
    /// g pages between head pages as head, so the head brings little the restore does
    /// not read; None mixes them (fewer chunks, a larger head).
    Cdc { avg: u32, head_gap: Option<u64> },
}

impl Chunking {
    /// What a publish uses (see the module's doc for the measurement behind it).
    pub const DEFAULT: Chunking = Chunking::Cdc { avg: 16 << 10, head_gap: Some(0) };
    /// The address windows of formats 1 and 2.
    pub const WINDOWS: Chunking = Chunking::Window(8 << 10);

    /// [`Chunking::DEFAULT`], or [`Chunking::WINDOWS`] where `THAW_STORE_FORMAT`
    /// asks for format 1 or 2 or `THAW_STORE_CHUNKS=window` for windows (kept to
    /// measure against).
    pub fn from_env() -> Chunking {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        if matches!(var("THAW_STORE_FORMAT").as_str(), "1" | "2") || var("THAW_STORE_CHUNKS") == "window" {
            Chunking::WINDOWS
        } else {
            Chunking::DEFAULT
        }
    }
}

/// pages.img by address window: (first file page, pages) per chunk. Runs are
/// sorted by address and pages.img is in the same order; check rather than assume.
fn cut_windows(pages: &thaw_engine::image::PageIndex, window: u64) -> Vec<(u64, u64)> {
    let mut runs = pages.runs.clone();
    runs.sort_by_key(|r| r.file_page);
    let mut cuts: Vec<(u64, u64)> = Vec::new();
    let mut last_window = None;
    for r in &runs {
        for i in 0..r.npages {
            let w = (r.vaddr + i * PAGE) / window;
            let fp = r.file_page + i;
            match cuts.last_mut() {
                Some((start, n)) if last_window == Some(w) && *start + *n == fp => *n += 1,
                _ => cuts.push((fp, 1)),
            }
            last_window = Some(w);
        }
    }
    cuts
}

/// Whether a publish stores ws.pages (format 4). `THAW_STORE_WS=derived` (and formats
/// 1 and 2) leave it to the reader to rebuild, as format 3 did (kept to measure against).
pub fn stores_ws_pages() -> bool {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    !matches!(var("THAW_STORE_FORMAT").as_str(), "1" | "2") && var("THAW_STORE_WS") != "derived"
}

/// `pages` and the gaps of at most `gap` pages between them.
fn with_gaps(pages: &[u64], gap: u64) -> HashSet<u64> {
    let mut sorted = pages.to_vec();
    sorted.sort_unstable();
    let mut out: HashSet<u64> = sorted.iter().copied().collect();
    for w in sorted.windows(2) {
        if w[1] - w[0] - 1 <= gap {
            out.extend(w[0] + 1..w[1]);
        }
    }
    out
}

/// pages.img (`data`) by content: (first file page, pages) per chunk. The file is
/// first split where a page's `class` changes (what a restore reads first, what
/// else); each piece is cut by FastCDC (min avg/4, max 4 avg), each cut moved up to
/// the next page boundary (a page never spans two chunks, so a fault needs one).
fn cut_content(data: &[u8], avg: u32, class: impl Fn(u64) -> u8) -> Vec<(u64, u64)> {
    let pages = data.len() as u64 / PAGE;
    let mut out = Vec::new();
    let mut first = 0;
    while first < pages {
        let inside = class(first);
        let end = (first + 1..pages).find(|&p| class(p) != inside).unwrap_or(pages);
        let piece = &data[(first * PAGE) as usize..(end * PAGE) as usize];
        let cdc = fastcdc::v2020::FastCDC::new(piece, avg / 4, avg, avg * 4);
        let mut at = 0;
        while at < piece.len() {
            let (_, cut) = cdc.cut(at, piece.len() - at);
            let cut = cut.max(at + 1).next_multiple_of(PAGE as usize).min(piece.len());
            out.push((first + (at as u64) / PAGE, (cut - at) as u64 / PAGE));
            at = cut;
        }
        first = end;
    }
    out
}

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
    /// so a restore that misses the cache starts after one read. With ws.pages stored
    /// (format 4): state.bin, ws.trace, ws.pages, then the pages written before resume.
    pub head: Vec<usize>,
    /// Chunks packed after every other (indexes into `uploads`): pages.img's chunks of
    /// working-set pages only, which a miss builds from ws.pages instead of reading.
    pub last: Vec<usize>,
    ws_trace: Option<Bytes>,
    ws_pages: Option<Bytes>,
    /// ws.lz4 stored in place of ws.pages (format 5): a sealed image's, or a clear
    /// one's with a large working set ([`CLEAR_WS_LZ4_FROM`]).
    ws_lz4: Option<Bytes>,
    /// ws.lz4's chunks go into their pack as they are (its frames zstd or sealed).
    pub ws_lz4_packed_raw: bool,
    /// A diff's base, where it is (to be published first, see [`Plan::set_base`]).
    pub base_dir: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Upload {
    pub file: &'static str,
    pub offset: u64,
    pub len: u64,
    pub sha256: ChunkHash,
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
    /// Bytes sent to the store (packs or chunks it did not have, the head's copy,
    /// the manifest).
    pub bytes_uploaded: u64,
    /// Of those, the copy of the head pack under the snapshot's id, which a miss
    /// reads beside the manifest (`Remote::head_key`); a pull does not read it.
    pub head_copy_bytes: u64,
    /// Chunk bytes the store already had.
    pub bytes_deduplicated: u64,
    pub seconds: f64,
    /// A diff's base, pushed first (its requests and bytes are counted above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

fn cut_fixed(f: &File, size: u64) -> std::io::Result<Vec<(u64, u64, Option<ChunkHash>)>> {
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

/// `data` (a file held in memory) in [`FILE_CHUNK`] pieces: (offset, length, name).
fn cut_bytes(data: &[u8]) -> Vec<(u64, u64, Option<ChunkHash>)> {
    cut_bytes_by(data, FILE_CHUNK)
}

/// The ws.lz4 a store keeps: the node's LZ4 frames `lz4` recompressed with zstd
/// (`thaw_engine::ws::lz4::recompress_zstd`; a sealed image's opened and sealed again
/// with its `sealer`, which opening the snapshot needed anyway), ~30% fewer bytes for a
/// miss to fetch. Where that cannot be done (a frame that does not check) the LZ4 frames
/// are stored as they are, and a miss reads those. `THAW_STORE_WS_CODEC=lz4`: always
/// as they are (the baseline).
fn stored_frames(dir: &Path, lz4: Vec<u8>, sealer: Option<&thaw_engine::seal::Sealer>) -> (Vec<u8>, Codec) {
    if std::env::var("THAW_STORE_WS_CODEC").as_deref() == Ok("lz4") {
        return (lz4, Codec::Lz4);
    }
    match thaw_engine::ws::lz4::recompress_zstd(&lz4, sealer) {
        Ok(Some(z)) => {
            tracing::debug!(dir = %dir.display(), lz4 = lz4.len(), zstd = z.len(), "the working set's frames recompressed for the store");
            (z, Codec::Zstd)
        }
        Ok(None) => (lz4, Codec::Lz4),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "the working set is stored as LZ4 frames, not zstd: {e}");
            (lz4, Codec::Lz4)
        }
    }
}

/// A clear image's working set of at least this many bytes is stored as ws.lz4 (zstd
/// frames), a smaller one as ws.pages. A miss holds ws.pages whole, checked by the
/// head pack's hash, and decompresses it once all of it is here; it installs ws.lz4's
/// frames as they arrive, beside the transfer. For a small working set the first costs
/// less (no file written and read back); for a large one the second overlaps most of
/// the decompression with the transfer. Node, loopback, 5 runs, remote cold ms
/// (bench/results/store-node-clear-ws-20261129.txt): helloworld (1.3 MB of working set)
/// 10.3 as ws.pages vs 11.5 as ws.lz4, pyaes (1.9 MB) 19.8 vs 20.7, lrserving (10.4 MB)
/// 41.1 vs 34.7.
pub const CLEAR_WS_LZ4_FROM: u64 = 4 << 20;

/// Whether a clear image's working set of `bytes` is stored as ws.lz4 rather than
/// ws.pages: [`CLEAR_WS_LZ4_FROM`], or `THAW_STORE_CLEAR_WS=lz4|pages` (the second the
/// baseline: ws.pages whatever its size, as before).
fn clear_ws_lz4(bytes: u64) -> bool {
    match std::env::var("THAW_STORE_CLEAR_WS").as_deref() {
        Ok("lz4") => true,
        Ok("pages") => false,
        _ => bytes >= CLEAR_WS_LZ4_FROM,
    }
}

/// ws.lz4's pieces: a miss writes each as soon as it is here and checked, and the
/// restore installs the frames in it, so smaller than other files' (the first
/// frames wait for one piece, not for a MiB).
const WS_LZ4_CHUNK: u64 = 256 << 10;

/// `data` in pieces of `size` bytes: (offset, length, name).
fn cut_bytes_by(data: &[u8], size: u64) -> Vec<(u64, u64, Option<ChunkHash>)> {
    data.chunks(size as usize).enumerate().map(|(i, c)| (i as u64 * size, c.len() as u64, chunk_name(c))).collect()
}

fn chunk_name(data: &[u8]) -> Option<ChunkHash> {
    (!data.iter().all(|&b| b == 0)).then(|| ChunkHash::of(data))
}

/// [`plan`] of the snapshot in `dir` and, for a diff, of its base (marked as one:
/// it is pushed first and the diff names it, see `Store::push`).
pub fn plan_layered(dir: &Path) -> Result<(Plan, Option<Plan>)> {
    let snap = plan(dir)?;
    let Some(base_dir) = snap.base_dir.clone() else { return Ok((snap, None)) };
    // Without its working set: a base's is its node's own record of restoring it (for
    // repurposing, recorded whenever a base instance is first used), and the base's
    // stored id, the hash of its manifest, must not change with it, or diffs pushed
    // before and after would name two bases.
    let mut base = plan_inner(&base_dir, Chunking::from_env(), false)?;
    if base.base_dir.is_some() {
        return Err(StoreError::Snapshot { dir: base_dir, detail: "a base that is itself a diff".into() });
    }
    base.mark_base();
    Ok((snap, Some(base)))
}

/// Cut the snapshot in `dir` into chunks and build its manifest (reads every byte once).
pub fn plan(dir: &Path) -> Result<Plan> {
    plan_with(dir, Chunking::from_env())
}

/// [`plan`], with pages.img cut as `chunking` says.
pub fn plan_with(dir: &Path, chunking: Chunking) -> Result<Plan> {
    plan_inner(dir, chunking, true)
}

/// [`plan_with`], with the snapshot's working set or without it (`with_ws`).
fn plan_inner(dir: &Path, chunking: Chunking, with_ws: bool) -> Result<Plan> {
    let snap = Snapshot::open(dir).map_err(|e| StoreError::Snapshot { dir: dir.to_path_buf(), detail: format!("{e}") })?;
    let base_dir = snap.image.base.as_ref().map(|b| thaw_engine::layers::base_dir(dir, b));
    let io = |what: &str| StoreError::local(dir, what.to_string());
    let mut files = Vec::new();

    let state = File::open(dir.join(STATE_FILE)).map_err(io("opening state.bin"))?;
    let size = state.metadata().map_err(io("reading state.bin"))?.len();
    files.push((STATE_FILE, size, cut_fixed(&state, size).map_err(io("reading state.bin"))?));

    // The pages a restore reads before the process resumes: the working set's, in
    // the order the trace first touched them, then the copy-on-written pages of
    // private file mappings and each thread's rseq area (written before resume).
    let mut ws_trace = None;
    let mut ws_pages = None;
    let mut ws_lz4 = None;
    let mut ws_lz4_packed_raw = false;
    let mut head_pages: Vec<u64> = Vec::new();
    if with_ws && WorkingSet::exists(dir) {
        match WorkingSet::load(dir, snap.id) {
            Ok(set) => {
                head_pages = set.trace.iter().filter_map(|t| t.file_page).collect();
                let t = std::fs::read(dir.join(TRACE_FILE)).map_err(io("reading ws.trace"))?;
                files.push((TRACE_FILE, t.len() as u64, cut_bytes(&t)));
                ws_trace = Some(Bytes::from(t));
                // A sealed image's ws.pages is ciphertext, which does not compress: its
                // ws.lz4 (the pages decrypted, compressed, each frame sealed) goes
                // instead, ws.pages derived by the reader; a miss writes its frames as
                // they arrive and the restore installs them as they do. Never a clear
                // ws.lz4 of a sealed image (it would hold its pages in clear). A clear
                // image stores whichever a miss starts from sooner ([`clear_ws_lz4`]).
                // (`THAW_STORE_SEALED_WS=pages`: ws.pages, the baseline.)
                let sealed = snap.image.seal.is_some();
                let lz4 = set.lz4_beside(dir) == Some(sealed)
                    && match sealed {
                        true => std::env::var("THAW_STORE_SEALED_WS").as_deref() != Ok("pages"),
                        false => clear_ws_lz4(set.pages_bytes()),
                    };
                if stores_ws_pages() && matches!(chunking, Chunking::Cdc { .. }) {
                    if lz4 {
                        let z = std::fs::read(dir.join(thaw_engine::ws::LZ4_FILE)).map_err(io("reading ws.lz4"))?;
                        let (z, codec) = stored_frames(dir, z, snap.sealer.as_deref());
                        // zstd frames, or sealed ones (ciphertext): nothing for the
                        // pack's compressor to gain (~10 ms of lrserving's push).
                        ws_lz4_packed_raw = codec == Codec::Zstd || sealed;
                        files.push((thaw_engine::ws::LZ4_FILE, z.len() as u64, cut_bytes_by(&z, WS_LZ4_CHUNK)));
                        ws_lz4 = Some(Bytes::from(z));
                    } else {
                        let p = std::fs::read(dir.join(thaw_engine::ws::PAGES_FILE)).map_err(io("reading ws.pages"))?;
                        if p.len() as u64 != set.pages_bytes() {
                            return Err(StoreError::Snapshot { dir: dir.to_path_buf(), detail: "ws.pages changed while it was being published".into() });
                        }
                        files.push((thaw_engine::ws::PAGES_FILE, p.len() as u64, cut_bytes(&p)));
                        ws_pages = Some(Bytes::from(p));
                    }
                }
            }
            Err(e) => tracing::warn!("publishing {} without its working set: {e}", dir.display()),
        }
    }
    // With ws.pages (or ws.lz4) stored, the working set's pages in pages.img are not in the head.
    let ws_page_set: HashSet<u64> = if ws_pages.is_some() || ws_lz4.is_some() { head_pages.drain(..).collect() } else { HashSet::new() };
    head_pages.extend(thaw_engine::restore::file_cow_runs(&snap.image, &snap.image.pages).flat_map(|(_, fp, n)| fp..fp + n));
    head_pages.extend(thaw_engine::restore::rseq_pages(&snap.image).into_iter().filter_map(|vaddr| snap.image.pages.lookup(vaddr)));
    let mut seen = HashSet::new();
    head_pages.retain(|fp| seen.insert(*fp));

    let pages_size = snap.image.pages.stored_pages() * PAGE;
    let page_chunks = match chunking {
        Chunking::Window(w) => {
            let mut buf = Vec::new();
            let mut chunks = Vec::new();
            for (fp, n) in cut_windows(&snap.image.pages, w) {
                buf.resize((n * PAGE) as usize, 0);
                snap.pages.read_exact_at(&mut buf, fp * PAGE).map_err(io("reading pages.img"))?;
                chunks.push((fp * PAGE, n * PAGE, chunk_name(&buf)));
            }
            chunks
        }
        Chunking::Cdc { avg, head_gap } => {
            let mut data = vec![0u8; pages_size as usize];
            snap.pages.read_exact_at(&mut data, 0).map_err(io("reading pages.img"))?;
            // Cut apart: the head's pages, the working set's (when ws.pages is stored), the rest.
            let apart = head_gap.map_or_else(HashSet::new, |g| with_gaps(&head_pages, g));
            let ws_list: Vec<u64> = ws_page_set.iter().copied().collect();
            let ws_apart = head_gap.map_or_else(HashSet::new, |g| with_gaps(&ws_list, g));
            let class = |p: u64| if apart.contains(&p) { 2 } else { u8::from(ws_apart.contains(&p)) };
            let bytes = |fp: u64, n: u64| &data[(fp * PAGE) as usize..((fp + n) * PAGE) as usize];
            cut_content(&data, avg, class).into_iter().map(|(fp, n)| (fp * PAGE, n * PAGE, chunk_name(bytes(fp, n)))).collect()
        }
    };
    files.insert(1, (PAGES_FILE, pages_size, page_chunks));

    let mut uploads = Vec::new();
    let mut seen = HashSet::new();
    let mut entries = Vec::new();
    for (name, size, chunks) in files {
        let mut list = Vec::with_capacity(chunks.len());
        for (offset, len, sha) in chunks {
            if let Some(s) = sha {
                if seen.insert(s) {
                    uploads.push(Upload { file: name, offset, len, sha256: s });
                }
            }
            list.push(Chunk::new(offset, len, sha));
        }
        entries.push(FileEntry { name: name.to_string(), size, chunks: list });
    }
    // The head: chunks of state.bin and ws.trace; of the copy-on-written pages of
    // private file mappings and of the rseq areas (both written before resume, so
    // first: a miss hands over each piece of the head as it arrives, and the restore
    // writes these before it installs the working set); then of the working set's
    // pages (ws.lz4 or ws.pages; else pages.img's, in trace order, before those).
    // pages.img chunks tile the file in offset order.
    let upload_of: std::collections::HashMap<ChunkHash, usize> = uploads.iter().enumerate().map(|(i, u)| (u.sha256, i)).collect();
    let mut head = Vec::new();
    let mut in_head = HashSet::new();
    let mut add = |sha: &Option<ChunkHash>, head: &mut Vec<usize>| {
        if let Some(&i) = sha.as_ref().and_then(|s| upload_of.get(s)) {
            if in_head.insert(i) {
                head.push(i);
            }
        }
    };
    let ws_file = |name: &str| name == thaw_engine::ws::PAGES_FILE || name == thaw_engine::ws::LZ4_FILE;
    for e in entries.iter().filter(|e| e.name != PAGES_FILE && !ws_file(&e.name)) {
        for c in &e.chunks {
            add(&c.sha256, &mut head);
        }
    }
    let mut last = Vec::new();
    if let Some(pages) = entries.iter().find(|e| e.name == PAGES_FILE) {
        let chunk_at = |fp: u64| {
            let off = fp * PAGE;
            let i = pages.chunks.partition_point(|c| c.offset + c.len <= off);
            pages.chunks.get(i)
        };
        for &fp in &head_pages {
            if let Some(c) = chunk_at(fp) {
                add(&c.sha256, &mut head);
            }
        }
        for e in entries.iter().filter(|e| ws_file(&e.name)) {
            for c in &e.chunks {
                add(&c.sha256, &mut head);
            }
        }
        // Chunks of working-set pages only (ws.pages or ws.lz4 holds them): last.
        let mut in_last = HashSet::new();
        for c in &pages.chunks {
            let only_ws = (c.offset / PAGE..(c.offset + c.len) / PAGE).all(|p| ws_page_set.contains(&p));
            if let Some(&i) = c.sha256.as_ref().and_then(|s| upload_of.get(s)) {
                if only_ws && !in_head.contains(&i) && in_last.insert(i) {
                    last.push(i);
                }
            }
        }
    }
    let derived = if ws_trace.is_some() && ws_pages.is_none() { vec![thaw_engine::ws::PAGES_FILE.to_string()] } else { vec![] };
    let manifest = Manifest {
        // Set by the publisher (format 1, or that of its packs).
        format: MANIFEST_FORMAT_CHUNKS,
        packs: vec![],
        head: None,
        image_format: thaw_engine::image::FORMAT_VERSION,
        image_id: snap.id,
        files: entries,
        derived,
        base: None,
        is_base: false,
        sandbox: Some(snap.image.sandbox.clone()),
    };
    let manifest_bytes = manifest.to_bytes();
    let id = sha256_hex(&manifest_bytes);
    Ok(Plan { dir: dir.to_path_buf(), manifest, manifest_bytes, id, uploads, head, last, ws_trace, ws_pages, ws_lz4, ws_lz4_packed_raw, base_dir })
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
    pub fn read(&self, u: &Upload) -> Result<Bytes> {
        let held = match u.file {
            TRACE_FILE => self.ws_trace.as_ref(),
            thaw_engine::ws::PAGES_FILE => self.ws_pages.as_ref(),
            thaw_engine::ws::LZ4_FILE => self.ws_lz4.as_ref(),
            _ => None,
        };
        let data = if let Some(t) = held {
            t.slice(u.offset as usize..(u.offset + u.len) as usize)
        } else {
            let f = File::open(self.dir.join(u.file)).map_err(StoreError::local(&self.dir, format!("opening {}", u.file)))?;
            let mut buf = vec![0u8; u.len as usize];
            f.read_exact_at(&mut buf, u.offset).map_err(StoreError::local(&self.dir, format!("reading {}", u.file)))?;
            Bytes::from(buf)
        };
        if ChunkHash::of(&data) != u.sha256 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Pseudo-random pages (xorshift): content without repeats, like a heap's.
    fn noise(pages: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(pages * PAGE as usize);
        while out.len() < pages * PAGE as usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    fn tiles(cuts: &[(u64, u64)], pages: u64) {
        let mut at = 0;
        for &(fp, n) in cuts {
            assert_eq!(fp, at, "cuts tile the file: {cuts:?}");
            assert!(n > 0);
            at += n;
        }
        assert_eq!(at, pages);
    }

    #[test]
    fn a_clear_working_set_is_stored_as_frames_from_the_threshold_on() {
        if std::env::var_os("THAW_STORE_CLEAR_WS").is_some() {
            return; // the environment decides instead
        }
        assert!(!clear_ws_lz4(332 * PAGE), "helloworld's working set stays ws.pages");
        assert!(!clear_ws_lz4(CLEAR_WS_LZ4_FROM - PAGE));
        assert!(clear_ws_lz4(CLEAR_WS_LZ4_FROM));
        assert!(clear_ws_lz4(2540 * PAGE), "lrserving's is stored as ws.lz4");
    }

    #[test]
    fn content_cuts_tile_the_file_on_page_boundaries_and_keep_the_head_apart() {
        let data = noise(600, 7);
        let apart: HashSet<u64> = (100..130).chain(131..132).chain(400..600).collect();
        let cuts = cut_content(&data, 64 << 10, |p| u8::from(apart.contains(&p)));
        tiles(&cuts, 600);
        for &(fp, n) in &cuts {
            let inside = apart.contains(&fp);
            assert!((fp..fp + n).all(|p| apart.contains(&p) == inside), "chunk {fp}+{n} mixes head and other pages");
        }
        // Content-defined: about the average asked for (600 pages, 2.3 MiB, at 64 KiB).
        let outside: Vec<_> = cuts.iter().filter(|(fp, _)| !apart.contains(fp)).collect();
        assert!(outside.len() >= 4 && outside.iter().all(|&&(_, n)| n <= 64), "{cuts:?}");
        tiles(&cut_content(&[], 64 << 10, |_| 0), 0);
        tiles(&cut_content(&data[..PAGE as usize], 64 << 10, |_| 0), 1);
    }

    #[test]
    fn pages_inserted_early_change_only_the_chunks_around_them() {
        let data = noise(1000, 3);
        let name = |d: &[u8], cuts: Vec<(u64, u64)>| -> HashSet<Option<ChunkHash>> {
            cuts.into_iter().map(|(fp, n)| chunk_name(&d[(fp * PAGE) as usize..((fp + n) * PAGE) as usize])).collect()
        };
        let before = name(&data, cut_content(&data, 32 << 10, |_| 0));
        // Three new pages near the start (an address window scheme would keep the
        // later chunks too; fixed offsets would shift every one).
        let mut grown = data[..50 * PAGE as usize].to_vec();
        grown.extend(noise(3, 99));
        grown.extend_from_slice(&data[50 * PAGE as usize..]);
        let after = name(&grown, cut_content(&grown, 32 << 10, |_| 0));
        let changed = after.difference(&before).count();
        assert!(changed <= 3, "{changed} of {} chunks changed", after.len());
        assert!(after.len() > 60, "{} chunks", after.len());
    }
}
