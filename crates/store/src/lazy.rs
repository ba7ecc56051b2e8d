//! Working set first (issue #28): a restore that misses the cache starts after two
//! reads — the manifest and the snapshot's head pack (state.bin, ws.trace, the
//! working set's pages, the copy-on-written file pages; see `publish::Plan::head`)
//! — instead of after the whole image. The rest of pages.img stays a hole until a
//! fault needs it: [`RemoteFill`], the engine's `PageFill` for this snapshot, reads
//! the chunk a fault falls in from its pack (one request in flight per chunk,
//! neighbours that are missing too come along), checks it against its hash and
//! writes it into the file; [`RemoteFill::complete`] fetches everything left (for
//! the cache) once the restore no longer waits.
//!
//! A fetch that fails (store down, a corrupt pack) fails the read: the page server
//! kills the instance, which never runs on a page the image did not provide.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use thaw_engine::image::PAGES_FILE;
use thaw_engine::ws::TRACE_FILE;
use thaw_engine::pagefiles::PageFill;

use crate::error::{Result, StoreError};
use crate::manifest::Manifest;
use crate::pack::{read_span, spans_of, Check, Span};
use crate::Store;

/// Chunks a fault may bring along with its own (missing neighbours in the same
/// pack, read in the same request).
const FAULT_NEIGHBOURS: usize = 16;
const PAGE: u64 = 4096;
/// Parallel reads of the head (each checks its chunks' hashes as it arrives).
const HEAD_READS: usize = 2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Absent,
    Fetching,
    /// Fetched with the head, held in memory (`RemoteFill::pending`) until written.
    Pending,
    Present,
}

/// Whether a miss starts from the snapshot's head (the default) or fetches it
/// whole first (`THAW_STORE_FETCH=whole`, as before heads; kept to measure against).
pub fn enabled() -> bool {
    std::env::var("THAW_STORE_FETCH").as_deref() != Ok("whole")
}

/// What a lazy fetch read, for `--stats`.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

/// pages.img of a snapshot arriving from the store.
pub struct RemoteFill {
    store: Arc<Store>,
    m: Manifest,
    /// Index of pages.img in `m.files`.
    file: usize,
    pages: File,
    dir: PathBuf,
    state: Mutex<Vec<State>>,
    changed: Condvar,
    pub counters: Counters,
    /// A fetch failed (the store down, a corrupt pack): an instance may have been
    /// killed for a page it could not have. Never reset.
    failed: AtomicBool,
    /// Every chunk is in pages.img.
    complete: AtomicBool,
    /// Requests and bytes spent before the head (the manifest, a diff's base).
    before_head: (AtomicU64, AtomicU64),
    /// What had been fetched when the first response came back.
    at_first_response: Mutex<Option<(u64, u64)>>,
    /// Chunks of pages.img fetched with the head (or with a recorded working set), by
    /// offset: handed to reads from memory ([`PageFill::copy`]; the restore assembles
    /// its working set from them) and written when a read needs them in the file or by
    /// [`RemoteFill::complete`], not before the start (writing ~8 MB beside it slowed
    /// lrserving's restore by as much as the write took, on 2 cores).
    pending: Mutex<HashMap<u64, bytes::Bytes>>,
    /// ws.pages is a placeholder that [`RemoteFill::complete`] writes.
    deferred_ws: bool,
    /// The stored ws.pages (format 4) of the head's trace, arriving with the head.
    ws: Mutex<HeldWs>,
    /// Index of ws.pages in `m.files`, when stored.
    ws_file: Option<usize>,
    /// A diff's base arriving lazily too (see [`LazyBase`]).
    base: Option<BaseLink>,
    /// ws.lz4 stored (format 5), written as the head's pages arrive.
    lz4: Option<Lz4Arrival>,
    /// It is for the working set the restore uses (not one recorded after the publish).
    lz4_brings: bool,
}

/// ws.lz4 as it arrives with the head (format 5): each chunk written to its file as
/// soon as it is here and checked by its hash, so the restore reads its first frames
/// while the last are still on the wire ([`PageFill::ws_lz4_upto`]).
struct Lz4Arrival {
    /// Its index in `m.files`.
    index: usize,
    file: File,
    size: u64,
    written: Mutex<Lz4Written>,
    changed: Condvar,
}

#[derive(Default)]
struct Lz4Written {
    /// Byte ranges written, sorted and merged.
    ranges: Vec<(u64, u64)>,
    /// Set once its arrival is over: written whole (`true`) or not (a read failed).
    ended: Option<bool>,
}

impl Lz4Written {
    /// Bytes written from the file's start on, without a gap.
    fn prefix(&self) -> u64 {
        self.ranges.first().filter(|r| r.0 == 0).map_or(0, |r| r.1)
    }

    fn covers(&self, from: u64, to: u64) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= from && to <= b)
    }

    fn add(&mut self, from: u64, to: u64) {
        self.ranges.push((from, to));
        self.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for &(a, b) in &self.ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.ranges = merged;
    }
}

impl Lz4Arrival {
    /// Write `part` (a chunk checked by its hash) at `off`, unless written already.
    fn write(&self, off: u64, part: &[u8]) -> bool {
        let end = off + part.len() as u64;
        if self.written.lock().unwrap_or_else(|p| p.into_inner()).covers(off, end) {
            return true;
        }
        if self.file.write_all_at(part, off).is_err() {
            return false;
        }
        self.written.lock().unwrap_or_else(|p| p.into_inner()).add(off, end);
        self.changed.notify_all();
        true
    }

    /// Its arrival is over: written whole (`ok`, or every byte of it was already, each
    /// chunk checked, before a later read failed) or not.
    fn end(&self, ok: bool, dir: &Path) {
        let ok = ok || self.written.lock().unwrap_or_else(|p| p.into_inner()).prefix() >= self.size;
        if !ok {
            tracing::warn!(dir = %dir.display(), "ws.lz4 did not arrive; the restore reads what it lacks out of the image");
            // Never cached half written (a reader that has it open reads on; what it
            // lacks, it reads out of the image).
            let _ = std::fs::remove_file(dir.join(thaw_engine::ws::LZ4_FILE));
        }
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        w.ended.get_or_insert(ok);
        drop(w);
        self.changed.notify_all();
    }

    /// Wait until bytes `0..end` are written (`true`) or its arrival is over without
    /// them (`false`).
    fn wait_upto(&self, end: u64) -> bool {
        let end = end.min(self.size);
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if w.prefix() >= end {
                return true;
            }
            // Over and whole: the chunks not written are zeros (not stored).
            if let Some(ok) = w.ended {
                return ok;
            }
            w = self.changed.wait(w).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wait until its arrival is over: whether it was written whole.
    fn wait_end(&self) -> bool {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match w.ended {
                Some(ok) => return ok,
                None => w = self.changed.wait(w).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

/// A base arriving from the store under the diffs that missed it: its head (state.bin,
/// the copy-on-written file pages) fetched before their restores start, the pages
/// their working sets do not hold fetched as faults need them, the rest by
/// [`RemoteFill::complete`]. Shared by every diff of it that misses meanwhile
/// ([`crate::open_miss`]) and moved into the cache once complete
/// ([`crate::settle_base`]). Its scratch directory goes with the last diff using it.
pub struct LazyBase {
    pub id: String,
    pub fill: Arc<RemoteFill>,
}

impl Drop for LazyBase {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.fill.dir);
    }
}

/// A diff's link to its lazily arriving base: the combined numbering of the engine's
/// `PageFiles` (the diff's pages, then the base's) is split at `own_bytes`.
struct BaseLink {
    base: Arc<LazyBase>,
    own_bytes: u64,
    /// This diff's miss opened the base: its fetches count as this miss's.
    counted: bool,
}

/// ws.pages as a miss holds it (format 4): fetched with the head, handed whole to the
/// restore assembling its working set ([`PageFill::working_set`]), and the source of
/// pages.img's chunks of working-set pages, built from it instead of fetched.
enum HeldWs {
    /// Not stored, or not usable (its trace did not parse, its read failed).
    None,
    /// Arriving with the head's pages, for the trace of this layout.
    Fetching(Vec<(u64, u64)>),
    Here {
        /// The trace's layout (`WorkingSet::layout`) these pages are for.
        layout: Vec<(u64, u64)>,
        /// Image file page -> its page in ws.pages.
        index: HashMap<u64, usize>,
        /// ws.pages' stored chunks: (offset, bytes); zero chunks are absent. Its
        /// length is the layout's pages (checked at open against the manifest's).
        parts: Vec<(u64, bytes::Bytes)>,
    },
}

impl HeldWs {
    fn held(layout: Vec<(u64, u64)>, parts: Vec<(u64, bytes::Bytes)>) -> HeldWs {
        let index = layout.iter().enumerate().map(|(i, &(_, fp))| (fp, i)).collect();
        HeldWs::Here { layout, index, parts }
    }

    /// Copy bytes `at..at + buf.len()` of ws.pages into `buf` (zeros where no part is).
    fn read(parts: &[(u64, bytes::Bytes)], at: u64, buf: &mut [u8]) {
        buf.fill(0);
        let end = at + buf.len() as u64;
        for (off, part) in parts {
            let (from, to) = (at.max(*off), end.min(off + part.len() as u64));
            if from < to {
                buf[(from - at) as usize..(to - at) as usize].copy_from_slice(&part[(from - off) as usize..(to - off) as usize]);
            }
        }
    }
}

/// Fetch the head of stored snapshot `id` into the empty directory `dir` and return
/// as soon as the restore can start: state.bin and ws.trace complete, pages.img
/// sparse, ws.pages a placeholder of its size. The head's pages (the working set's,
/// the copy-on-written file pages, the rseq areas) are still arriving, in parallel
/// reads started with the first one: the fill keeps them in memory, and a read of
/// them (the engine assembling the working set, `ws_from_image`) waits for them.
/// So the restore of the process state runs beside their transfer and checking.
/// ws.pages is written by [`RemoteFill::complete`]. None: the snapshot has no head
/// (format 1, or published before heads), fetch it whole instead.
///
/// A diff's base must be beside it already (`thaw_engine::layers::BASE_LINK`):
/// complete in the cache, or arriving lazily too (`base`: the fill serves the base's
/// pages from it; `bool`: this miss opened it and counts its fetches).
///
/// A head with ws.lz4 (format 5) instead of ws.pages is checked chunk by chunk and
/// handed over piece by piece as it arrives: ws.lz4 written to its file, the restore
/// reading each piece of the working set once its frames are there
/// ([`PageFill::ws_lz4_upto`]; with the node key, sealed), and pages.img's copies of
/// those pages follow with the rest.
///
/// A snapshot published before its working set was recorded (a node publishes what
/// it captures at once) has a working set beside it, `ws/<id>.trace`: it is read
/// with the head, and its pages follow in a few coalesced range reads, in parallel.
///
/// `head_copy`: the head pack's copy, read beside the manifest
/// ([`crate::fetch::MissStart`]). state.bin and ws.trace come out of its first bytes,
/// each chunk checked by its hash, as soon as those are here: this returns without
/// waiting for the rest of the copy (the working set's pages), which the fill takes
/// from it once here, if it has the head's size and checks by the pack's name (hashed
/// as it arrives). A copy that is missing or fails a check is not used:
/// the head is read from its pack.
pub fn open(store: Arc<Store>, m: Manifest, id: &str, dir: &Path, head_copy: crate::fetch::HeadCopy, base: Option<(Arc<LazyBase>, bool)>) -> Result<Option<Arc<RemoteFill>>> {
    let t_called = std::time::Instant::now();
    let Some(head) = m.head else { return Ok(None) };
    let Some(file) = m.files.iter().position(|f| f.name == PAGES_FILE) else { return Ok(None) };
    // ws.pages stored (format 4): read with the head's pages, not waited for.
    let wsf = m.files.iter().position(|f| f.name == thaw_engine::ws::PAGES_FILE);
    // ws.lz4 stored (format 5, a sealed image's): read with the head's pages too, and
    // written to its file as it arrives; the restore's working-set read waits for it.
    let lz4f = m.files.iter().position(|f| f.name == thaw_engine::ws::LZ4_FILE);
    let later = |fi: usize| Manifest::read_after_start(&m.files[fi].name);
    // Every file but pages.img must be in the head: one read brings it all.
    let elsewhere = m.files.iter().enumerate().any(|(fi, f)| fi != file && f.chunks.iter().any(|c| c.sha256.is_some() && c.pack != Some(head)));
    if elsewhere {
        return Ok(None);
    }
    let mut files = Vec::new();
    for f in &m.files {
        let h = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(dir.join(&f.name))
            .map_err(StoreError::local(dir, format!("creating {}", f.name)))?;
        h.set_len(f.size).map_err(StoreError::local(dir, format!("sizing {}", f.name)))?;
        files.push(h);
    }
    let counters = Counters::default();
    let mut state: Vec<State> =
        m.files[file].chunks.iter().map(|c| if c.sha256.is_none() { State::Present } else { State::Absent }).collect();
    let chunks = &m.files[file].chunks;
    let chunk_of = |at: u64| chunks.partition_point(|c| c.offset + c.len <= at);
    let remote = &store.remote;
    let t0 = std::time::Instant::now();
    // 1. The head: its files (state.bin, ws.trace; its start) waited for, its pages
    //    (the rest) read beside them and after: HEAD_READS parallel reads when large
    //    (each decompresses its chunks as it arrives, on a thread of its own). When
    //    these reads cover the head's pack, as they do unless the head holds chunks
    //    no file uses, the pages are checked at once by the pack's name (the hash of
    //    its stored bytes: a third of hashing every decompressed chunk) before any is
    //    used; else each chunk by its own hash.
    let first = spans_of(&m, |fi, c| !later(fi) && c.pack == Some(head), u64::MAX);
    let head_pages = spans_of(&m, |fi, c| later(fi) && c.pack == Some(head), u64::MAX);
    let large = head_pages.iter().map(|s| s.end - s.start).sum::<u64>() > 1 << 20;
    let head_pages: Vec<Span> = head_pages.into_iter().flat_map(|s| s.split(if large { HEAD_READS } else { 1 })).collect();
    for i in span_chunks(&head_pages, file).map(|(_, off)| chunk_of(off)) {
        state[i] = State::Fetching;
    }
    let head_pack = m.packs[head as usize].clone();
    // The copy is read into memory: never past the head's size.
    head_copy.limit(head_pack.size);
    // A head without ws.pages (format 5: ws.lz4, or no working set) is checked chunk by
    // chunk, each piece handed over as soon as it is (the copy-on-written pages the
    // restore writes first, then ws.lz4's frames, which it installs as they come):
    // its bytes are mostly ws.lz4's, whose chunks are as many bytes to hash as the
    // pack. ws.pages, compressed about threefold in its pack, is held whole (HeldWs)
    // and checked by the pack's name. `THAW_STORE_HEAD_STREAM=pack`: as before.
    // (`THAW_STORE_HEAD_STREAM=0` waits for the whole copy: nothing early either.)
    let early = wsf.is_none() && !matches!(std::env::var("THAW_STORE_HEAD_STREAM").as_deref(), Ok("pack" | "0"));
    let whole = crate::pack::covers(first.iter().chain(&head_pages), head_pack.size)
        && !early
        && std::env::var("THAW_STORE_HEAD_CHECK").as_deref() != Ok("chunks");
    let pages_check = if whole { Check::Pack } else { Check::Chunks };
    match pages_check {
        // Its pages checked chunk by chunk, state.bin and ws.trace too: the pack's
        // hash would be work for nothing.
        Check::Chunks => head_copy.unhashed(),
        // Checked by the pack's name: hashed as it arrives from now on.
        Check::Pack => head_copy.hashed(),
    }
    let copy_object = remote.url.object_url(&crate::Remote::head_key(id));
    // state.bin and ws.trace, each chunk checked by its hash: out of the head copy's
    // first bytes as soon as those are here, while the rest is still arriving (the
    // restore starts beside it; THAW_STORE_HEAD_STREAM=0 waits for the whole copy, as
    // before: the baseline of bench/store.py), else read from the pack.
    let first_end = first.iter().map(|s| s.end).max().unwrap_or(0);
    let streamed = std::env::var("THAW_STORE_HEAD_STREAM").as_deref() != Ok("0");
    let copy_start = store.block_on(async {
        match streamed {
            true => head_copy.prefix(first_end as usize).await,
            false => head_copy.get().await,
        }
    });
    // The copy's reads (two where the second part of a split copy was asked for) count
    // once some of it is here, whether or not it is used (a read that found none is not
    // counted); its bytes as they are taken from it.
    let copy_read = copy_start.as_ref().map_or((0, 0), |c| (head_copy.requests(), c.len() as u64));
    let copy_start = copy_start.filter(|c| streamed || fits_head(c, &head_pack, &copy_object));
    let from_copy = copy_start.as_ref().and_then(|c| match crate::pack::slice_spans(&copy_object, c, &first, Check::Chunks) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "the head's copy does not check; reading the head from its pack");
            None
        }
    });
    // The copy's bytes counted already (its first ones, or all of it when waited for).
    let pages_from = copy_start.filter(|_| from_copy.is_some()).map(|c| (head_copy, c.len() as u64));
    // Started before the first files' reads (when those go to the store, in parallel).
    let (early_tx, mut early_rx) = tokio::sync::mpsc::unbounded_channel();
    let pages_read = store.spawn(read_head_pages(remote.clone(), pages_from, head_pages.clone(), pages_check, head_pack.clone(), copy_object, early.then_some(early_tx)));
    let first_reads = if from_copy.is_some() { 0 } else { first.len() as u64 };
    let (first_read, recorded) = match from_copy {
        Some(r) => (Ok(r), store.block_on(crate::fetch::recorded_trace(remote, &m, id))),
        None => store.block_on(async { futures::join!(crate::pack::read_spans_as(remote, &first, Check::Chunks), crate::fetch::recorded_trace(remote, &m, id)) }),
    };
    let first_read = first_read?;
    // The first reads' stored bytes, for the check of the whole head.
    let first_stored: Vec<(u64, bytes::Bytes)> = first.iter().zip(&first_read).map(|(s, r)| (s.start, r.0.clone())).collect();
    let first_parts: Vec<Vec<bytes::Bytes>> = first_read.into_iter().map(|r| r.1).collect();
    let first_bytes = if first_reads > 0 { first.iter().map(|s| s.end - s.start).sum::<u64>() } else { 0 };
    counters.requests.fetch_add(copy_read.0 + first_reads + u64::from(crate::fetch::asks_recorded_trace(&m)), Ordering::Relaxed);
    counters.bytes.fetch_add(copy_read.1 + recorded.as_ref().map_or(0, |t| t.len() as u64) + first_bytes, Ordering::Relaxed);
    // 2. Every file but pages.img, complete.
    for (s, parts) in first.iter().zip(&first_parts) {
        for (c, part) in s.chunks.iter().zip(parts) {
            for &(fi, off) in c.places.iter().filter(|(fi, _)| !later(*fi)) {
                files[fi].write_all_at(part, off).map_err(StoreError::local(dir, format!("writing {}", m.files[fi].name)))?;
            }
        }
    }
    // 3. The working set (recorded beside the snapshot, or the head's own): ws.trace,
    //    and ws.pages as a placeholder of its size until `complete` writes it.
    let mut deferred_ws = false;
    let mut held_ws = HeldWs::None;
    let trace = match &recorded {
        Some(t) => Some(t.clone()),
        None => std::fs::read(dir.join(TRACE_FILE)).ok().map(bytes::Bytes::from),
    };
    let set = trace.as_deref().map(|t| (t, thaw_engine::ws::WorkingSet::parse(dir, t, m.image_id)));
    let ws_chunks: HashSet<usize> = match set {
        Some((t, Ok(set))) => {
            if recorded.is_some() {
                std::fs::write(dir.join(TRACE_FILE), t).map_err(StoreError::local(dir, "writing ws.trace"))?;
            }
            let placeholder = File::create(dir.join(thaw_engine::ws::PAGES_FILE)).map_err(StoreError::local(dir, "creating ws.pages"))?;
            placeholder.set_len(set.pages_bytes()).map_err(StoreError::local(dir, "sizing ws.pages"))?;
            deferred_ws = true;
            if let (Some(w), None) = (wsf, &recorded) {
                if m.files[w].size == set.pages_bytes() {
                    let arriving = span_chunks(&head_pages, w).next().is_some();
                    // Every page of it zeros (no stored chunk): nothing to wait for.
                    held_ws = if arriving { HeldWs::Fetching(set.layout.clone()) } else { HeldWs::held(set.layout.clone(), Vec::new()) };
                }
            }
            if !matches!(held_ws, HeldWs::None) {
                // The head's ws.pages brings them: nothing more to read.
                HashSet::new()
            } else if recorded.is_none() && lz4f.is_some() {
                // A sealed image's head brings ws.lz4, which the restore reads them
                // from with the node key: pages.img's copies follow with the rest.
                HashSet::new()
            } else {
                set.layout.iter().map(|&(_, fp)| chunk_of(fp * PAGE)).filter(|&i| i < chunks.len()).collect()
            }
        }
        Some((_, Err(e))) => {
            let object = if recorded.is_some() { remote.url.object_url(&crate::Remote::ws_key(id)) } else { remote.url.object_url(&crate::Remote::manifest_key(id)) };
            tracing::warn!(object = %object, error = %e, "ignoring a recorded working set that does not match its snapshot; the first restore records one");
            thaw_engine::ws::invalidate(dir);
            HashSet::new()
        }
        None => HashSet::new(),
    };
    // 4. Those the head lacks (a working set recorded after the publish): chunks are
    //    in address order, so few ranges once those close together are coalesced.
    let lacking: HashSet<u64> = ws_chunks.iter().filter(|&&i| state[i] == State::Absent).map(|&i| chunks[i].offset).collect();
    let ws_spans = spans_of(&m, |fi, c| fi == file && lacking.contains(&c.offset), crate::pack::RANGE_GAP);
    for i in span_chunks(&ws_spans, file).map(|(_, off)| chunk_of(off)) {
        state[i] = State::Fetching;
    }
    let ws_read = (!ws_spans.is_empty()).then(|| store.spawn(crate::pack::read_spans_owned(remote.clone(), ws_spans.clone(), Check::Chunks)));
    let t_first = t0.elapsed();
    let lz4 = match lz4f {
        Some(i) => Some(Lz4Arrival {
            index: i,
            file: files[i].try_clone().map_err(StoreError::local(dir, "opening ws.lz4"))?,
            size: m.files[i].size,
            written: Default::default(),
            changed: Condvar::new(),
        }),
        None => None,
    };
    let pages = files.swap_remove(file);
    let own_bytes = m.files[file].size;
    let fill = Arc::new(RemoteFill {
        store: store.clone(),
        m: m.clone(),
        file,
        pages,
        dir: dir.to_path_buf(),
        state: Mutex::new(state),
        changed: Condvar::new(),
        counters,
        failed: AtomicBool::new(false),
        complete: AtomicBool::new(false),
        before_head: Default::default(),
        at_first_response: Mutex::new(None),
        pending: Mutex::new(HashMap::new()),
        deferred_ws,
        ws: Mutex::new(held_ws),
        ws_file: wsf,
        base: base.map(|(base, counted)| BaseLink { base, own_bytes, counted }),
        lz4,
        lz4_brings: lz4f.is_some() && recorded.is_none(),
    });
    let whole_check = whole.then(|| (first_stored, head_pack.name.clone(), remote.url.object_url(&crate::pack::pack_key(&head_pack.name))));
    let f = fill.clone();
    store.spawn(async move {
        // Pieces handed over as they arrive, until the read ends (it holds the sender).
        while let Some((piece, parts)) = early_rx.recv().await {
            let f = f.clone();
            let _ = tokio::task::spawn_blocking(move || f.piece_arrived(&piece, &parts)).await;
        }
        let got = pages_read.await.unwrap_or_else(|e| HeadPages { reads: Err(StoreError::Task { detail: e.to_string() }), checked: true, requests: 0, bytes: 0 });
        // Counted before the pages are handed over (the first response may follow).
        f.counters.requests.fetch_add(got.requests, Ordering::Relaxed);
        f.counters.bytes.fetch_add(got.bytes, Ordering::Relaxed);
        let reads = match (got.reads, got.checked, whole_check) {
            (Ok(reads), false, Some((mut stored, name, object))) => {
                stored.extend(head_pages.iter().zip(&reads).map(|(s, r)| (s.start, r.0.clone())));
                match tokio::task::spawn_blocking(move || crate::pack::whole_digest(stored)).await {
                    Ok(digest) if digest == name => Ok(reads),
                    Ok(digest) => Err(StoreError::Corrupt { object, detail: format!("its bytes hash to {digest}") }),
                    Err(e) => Err(StoreError::Task { detail: e.to_string() }),
                }
            }
            (reads, _, _) => reads,
        };
        f.arrived(&head_pages, reads.map(|reads| reads.into_iter().map(|r| r.1).collect()), t0, true);
    });
    if let Some(read) = ws_read {
        let f = fill.clone();
        store.spawn(async move {
            let got = read.await.unwrap_or_else(|e| Err(StoreError::Task { detail: e.to_string() }));
            f.arrived(&ws_spans, got.map(|reads| reads.into_iter().map(|r| r.1).collect()), t0, false);
        });
    }
    tracing::debug!(requests = fill.counters.requests.load(Ordering::Relaxed), ms = t_first.as_secs_f64() * 1e3, files_ms = (t0 - t_called).as_secs_f64() * 1e3, "snapshot state fetched; its pages follow");
    if std::env::var("THAW_STORE_HEAD").as_deref() == Ok("wait") {
        // The baseline of bench/store.py: the restore starts once the whole head is here.
        fill.wait_arrivals();
    }
    Ok(Some(fill))
}

/// The head's pages as [`read_head_pages`] got them, and what that cost.
struct HeadPages {
    /// Per span: its bytes as stored, and its chunks' (decompressed).
    reads: Result<Vec<(bytes::Bytes, Vec<bytes::Bytes>)>>,
    /// Checked already (out of a copy checked whole by the pack's name, or chunk by
    /// chunk); else the caller checks the whole pack by its name.
    checked: bool,
    requests: u64,
    bytes: u64,
}

/// Whether `copy` has the head pack's size (else it is not used).
fn fits_head(copy: &bytes::Bytes, head: &crate::manifest::PackRef, object: &str) -> bool {
    let fits = copy.len() as u64 == head.size;
    if !fits {
        tracing::warn!(object = %object, len = copy.len(), head = head.size, "the head's copy is not the head's size; reading the head from its pack");
    }
    fits
}

/// The head's pages (`spans`), from its copy (`copy`: with the bytes of it counted
/// already) where there is one that checks, else read from its pack (those reads
/// checked as `check` says: by chunk here, or by the caller by the whole pack's name).
async fn read_head_pages(remote: crate::Remote, copy: Option<(crate::fetch::HeadCopy, u64)>, spans: Vec<Span>, check: Check, head: crate::manifest::PackRef, object: String, early: Option<Pieces>) -> HeadPages {
    if let Some((copy, counted)) = copy {
        match pages_as_they_arrive(&copy, &spans, check, &head, &object, early).await {
            Ok(reads) => return HeadPages { reads: Ok(reads), checked: true, requests: 0, bytes: head.size.saturating_sub(counted) },
            Err(e) => tracing::warn!(error = %e, "the head's copy does not check; reading the head from its pack"),
        }
    }
    let reads = crate::pack::read_spans_owned(remote, spans.clone(), check).await;
    let (requests, bytes) = match &reads {
        Ok(_) => (spans.len() as u64, spans.iter().map(|s| s.end - s.start).sum::<u64>()),
        Err(_) => (0, 0),
    };
    HeadPages { reads, checked: check == Check::Chunks, requests, bytes }
}

/// Stored bytes of the head's copy decompressed at a time, as they arrive.
const PIECE: u64 = 256 << 10;

/// Where [`pages_as_they_arrive`] hands each piece of the head over as soon as it is
/// checked chunk by chunk (to [`RemoteFill::piece_arrived`]).
type Pieces = tokio::sync::mpsc::UnboundedSender<(Span, Vec<bytes::Bytes>)>;

/// `spans` out of the head's copy as it arrives: each span's chunks decompressed in
/// pieces of about [`PIECE`] bytes as soon as a piece is here (one piece at a time
/// per span, so at most [`HEAD_READS`] threads beside the restore), so that little is
/// left to do when the last byte arrives (a copy that is all here already, waited for
/// with `THAW_STORE_HEAD_STREAM=0`, is taken the same way). Checked chunk by chunk
/// (`Check::Chunks`), each piece goes to `early` as soon as it is; by the pack's name
/// (`Check::Pack`; the copy is hashed as it arrives), nothing is handed over before
/// the whole copy is here and checked.
async fn pages_as_they_arrive(copy: &crate::fetch::HeadCopy, spans: &[Span], check: Check, head: &crate::manifest::PackRef, object: &str, early: Option<Pieces>) -> Result<Vec<(bytes::Bytes, Vec<bytes::Bytes>)>> {
    let task = |e: tokio::task::JoinError| StoreError::Task { detail: e.to_string() };
    let ended = |what: &str| StoreError::Corrupt { object: object.to_string(), detail: format!("its read ended before {what}") };
    let reads: Vec<_> = spans
        .iter()
        .map(|s| {
            let (copy, s, o, early) = (copy.clone(), s.clone(), object.to_string(), early.clone().filter(|_| check == Check::Chunks));
            tokio::spawn(async move {
                let pieces = ((s.end - s.start) / PIECE).max(1) as usize;
                let mut chunks = Vec::with_capacity(s.chunks.len());
                for piece in s.split(pieces) {
                    let Some(data) = copy.range(piece.start as usize, piece.end as usize).await else { return Ok(None) };
                    let o = o.clone();
                    let (piece, got) = tokio::task::spawn_blocking(move || {
                        let got = crate::pack::check_span(&o, &piece, data, check);
                        (piece, got)
                    })
                    .await
                    .map_err(task)?;
                    let got = got?;
                    if let Some(tx) = &early {
                        // Checked chunk by chunk: handed over now. A receiver gone is a
                        // fill given up; the rest is read to its end all the same.
                        let _ = tx.send((piece, got.clone()));
                    }
                    chunks.extend(got);
                }
                Ok::<_, StoreError>(Some(chunks))
            })
        })
        .collect();
    let mut parts = Vec::with_capacity(spans.len());
    for r in reads {
        parts.push(r.await.map_err(task)??.ok_or_else(|| ended("the head's end"))?);
    }
    let (whole, mut digest) = copy.get_hashed().await.ok_or_else(|| ended("its end"))?;
    if whole.len() as u64 != head.size {
        return Err(StoreError::Corrupt { object: object.to_string(), detail: format!("holds {} bytes, the head {}", whole.len(), head.size) });
    }
    if check == Check::Pack && digest.is_empty() {
        // The copy had ended before it was told to hash.
        digest = crate::remote::sha256_hex(&whole);
    }
    if check == Check::Pack && digest != head.name {
        return Err(StoreError::Corrupt { object: object.to_string(), detail: format!("its bytes hash to {digest}, not the head's {}", head.name) });
    }
    Ok(spans.iter().zip(parts).map(|(s, chunks)| (whole.slice(s.start as usize..s.end as usize), chunks)).collect())
}

/// The (file index, offset) places in pages.img (`file`) of the chunks `spans` read.
fn span_chunks(spans: &[Span], file: usize) -> impl Iterator<Item = (usize, u64)> + '_ {
    spans.iter().flat_map(|s| &s.chunks).flat_map(|c| c.places.iter().copied()).filter(move |(fi, _)| *fi == file)
}

impl RemoteFill {
    /// Write pending chunks `idx` (marked Fetching by the caller) into pages.img;
    /// one that cannot be written is fetched again when needed.
    fn write_pending(&self, idx: &[usize]) {
        let mut written = Vec::with_capacity(idx.len());
        let mut result = Ok(());
        for &i in idx {
            let off = self.chunks()[i].offset;
            let part = self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&off);
            match part.map(|p| self.pages.write_all_at(&p, off)) {
                Some(Ok(())) => written.push(i),
                Some(Err(e)) => result = Err(e),
                None => {}
            }
        }
        if let Err(e) = result {
            tracing::warn!(dir = %self.dir.display(), error = %e, "writing fetched pages; they are fetched again when needed");
        }
        self.settle(idx, &written);
    }

    /// Chunks `idx` (marked Fetching) end up Present if in `done`, else Absent (to be
    /// fetched when needed): none stays Fetching, a waiter would wait forever.
    fn settle(&self, idx: &[usize], done: &[usize]) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for &i in idx {
            st[i] = State::Absent;
        }
        for &i in done {
            st[i] = State::Present;
        }
        self.changed.notify_all();
    }

    fn chunks(&self) -> &[crate::manifest::Chunk] {
        &self.m.files[self.file].chunks
    }

    /// The chunks of pages.img overlapping bytes `offset..offset + len`.
    fn overlapping(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        let first = self.chunk_index(offset);
        let end = self.chunks().partition_point(|c| c.offset < offset + len);
        first..end.max(first)
    }

    /// Fetch chunks `idx` (marked Fetching by the caller), one request per pack range.
    fn fetch(&self, idx: &[usize]) -> std::io::Result<()> {
        tracing::debug!(chunks = idx.len(), first_offset = self.chunks()[idx[0]].offset, "fetching pages on demand");
        let want: HashSet<u64> = idx.iter().map(|&i| self.chunks()[i].offset).collect();
        let spans = spans_of(&self.m, |fi, c| fi == self.file && want.contains(&c.offset), 0);
        let mut done = Vec::new();
        let mut result = Ok(());
        for s in &spans {
            let parts = match self.store.block_on(read_span(&self.store.remote, s)) {
                Ok(p) => p,
                Err(e) => {
                    result = Err(std::io::Error::other(format!("fetching pages of {} from the store: {e}", self.dir.display())));
                    break;
                }
            };
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            self.counters.bytes.fetch_add(s.end - s.start, Ordering::Relaxed);
            for (c, part) in s.chunks.iter().zip(&parts) {
                for &(_, off) in c.places.iter().filter(|(fi, _)| *fi == self.file) {
                    if let Err(e) = self.pages.write_all_at(part, off) {
                        result = Err(e);
                        break;
                    }
                    done.push(self.chunks().partition_point(|c| c.offset < off));
                }
            }
            if result.is_err() {
                break;
            }
        }
        self.settle(idx, &done);
        if let Err(e) = &result {
            tracing::warn!(dir = %self.dir.display(), error = %e, "fetching pages on demand failed");
            self.failed.store(true, Ordering::Release);
        }
        result
    }

    /// The background reads of `spans` (chunks of pages.img, marked Fetching) are
    /// done: their chunks are kept in memory (Pending), or, if the read failed, left to
    /// be fetched when needed (Absent; a store that is down fails that fetch, and the
    /// instance that needed the page is killed). Chunks handed over before, as they
    /// arrived ([`RemoteFill::piece_arrived`]), are left as they are. ws.lz4's arrival
    /// ends here.
    /// `counted`: their bytes came with a request counted already (the head's copy).
    fn arrived(&self, spans: &[Span], got: Result<Vec<Vec<bytes::Bytes>>>, t0: std::time::Instant, counted: bool) {
        let wsf = self.ws_file;
        let ws_here = matches!(*self.ws.lock().unwrap_or_else(|p| p.into_inner()), HeldWs::Fetching(_))
            && spans.iter().flat_map(|s| &s.chunks).any(|c| c.places.iter().any(|(fi, _)| Some(*fi) == wsf));
        let lz4_here = self.lz4.as_ref().filter(|z| spans.iter().flat_map(|s| &s.chunks).any(|c| c.places.iter().any(|(fi, _)| *fi == z.index)));
        let idx = self.still_fetching(span_chunks(spans, self.file).map(|(_, off)| off));
        match got {
            Ok(parts) => {
                if !counted {
                    self.counters.requests.fetch_add(spans.len() as u64, Ordering::Relaxed);
                    self.counters.bytes.fetch_add(spans.iter().map(|s| s.end - s.start).sum(), Ordering::Relaxed);
                }
                let mut ws_parts = Vec::new();
                let mut lz4_ok = true;
                for (s, parts) in spans.iter().zip(&parts) {
                    lz4_ok &= self.take_parts(s, parts, &idx, Some(&mut ws_parts));
                }
                if let Some(z) = lz4_here {
                    z.end(lz4_ok, &self.dir);
                }
                if ws_here {
                    let mut ws = self.ws.lock().unwrap_or_else(|p| p.into_inner());
                    if let HeldWs::Fetching(layout) = std::mem::replace(&mut *ws, HeldWs::None) {
                        *ws = HeldWs::held(layout, ws_parts);
                    }
                }
                self.mark(&idx, State::Pending);
                tracing::debug!(requests = spans.len(), chunks = idx.len(), ms = t0.elapsed().as_secs_f64() * 1e3, "snapshot pages arrived");
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "fetching the head's pages failed; each is fetched again when needed");
                if let Some(z) = lz4_here {
                    z.end(false, &self.dir);
                }
                if ws_here {
                    *self.ws.lock().unwrap_or_else(|p| p.into_inner()) = HeldWs::None;
                }
                self.mark(&idx, State::Absent);
            }
        }
    }

    /// A piece of the head's pages, here and each of its chunks checked by its hash
    /// while the rest is still arriving ([`pages_as_they_arrive`]): its chunks of
    /// pages.img are handed to reads (Pending) and its ws.lz4 written at once, so the
    /// restore installs what it needs first without waiting for the head's last byte.
    fn piece_arrived(&self, span: &Span, parts: &[bytes::Bytes]) {
        let idx = self.still_fetching(span_chunks(std::slice::from_ref(span), self.file).map(|(_, off)| off));
        if !self.take_parts(span, parts, &idx, None) {
            tracing::warn!(dir = %self.dir.display(), "writing ws.lz4 as it arrives failed; the rest of the head decides");
        }
        self.mark(&idx, State::Pending);
    }

    /// The indices of the chunks of pages.img at `offsets` that are still Fetching.
    fn still_fetching(&self, offsets: impl Iterator<Item = u64>) -> Vec<usize> {
        let idx: Vec<usize> = offsets.map(|off| self.chunk_index(off)).collect();
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        idx.into_iter().filter(|&i| st[i] == State::Fetching).collect()
    }

    /// Take span `s`'s chunks (`parts`, checked): those of pages.img among chunks `idx`
    /// into `pending`, ws.pages' into `ws_parts`, ws.lz4's written to its file (false:
    /// one could not be).
    fn take_parts(&self, s: &Span, parts: &[bytes::Bytes], idx: &[usize], mut ws_parts: Option<&mut Vec<(u64, bytes::Bytes)>>) -> bool {
        let idx: HashSet<usize> = idx.iter().copied().collect();
        let mut lz4_ok = true;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for (c, part) in s.chunks.iter().zip(parts) {
            for &(fi, off) in &c.places {
                if fi == self.file {
                    if idx.contains(&self.chunk_index(off)) {
                        pending.insert(off, part.clone());
                    }
                } else if Some(fi) == self.ws_file {
                    if let Some(w) = ws_parts.as_deref_mut() {
                        w.push((off, part.clone()));
                    }
                } else if let Some(z) = self.lz4.as_ref().filter(|z| z.index == fi) {
                    lz4_ok &= z.write(off, part);
                }
            }
        }
        lz4_ok
    }

    /// Chunks `idx` become `to`; their waiters are told.
    fn mark(&self, idx: &[usize], to: State) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for &i in idx {
            st[i] = to;
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Build chunks `idx` of pages.img (marked Fetching) that hold working-set pages
    /// only from the ws.pages held in memory, checked against their hashes and written;
    /// they end Present. Returns those it could not build.
    fn build_from_ws(&self, idx: Vec<usize>) -> Vec<usize> {
        let ws = self.ws.lock().unwrap_or_else(|p| p.into_inner());
        let HeldWs::Here { index, parts, .. } = &*ws else { return idx };
        let (mut built, mut rest) = (Vec::new(), Vec::new());
        for i in idx {
            let c = &self.chunks()[i];
            let pages: Option<Vec<usize>> = (c.offset / PAGE..(c.offset + c.len) / PAGE).map(|fp| index.get(&fp).copied()).collect();
            let ok = pages.is_some_and(|pages| {
                let mut buf = vec![0u8; c.len as usize];
                for (k, wp) in pages.iter().enumerate() {
                    HeldWs::read(parts, *wp as u64 * PAGE, &mut buf[k * PAGE as usize..(k + 1) * PAGE as usize]);
                }
                c.sha256 == Some(crate::manifest::ChunkHash::of(&buf)) && self.pages.write_all_at(&buf, c.offset).is_ok()
            });
            if ok { built.push(i) } else { rest.push(i) }
        }
        drop(ws);
        if !built.is_empty() {
            self.settle(&built, &built);
        }
        rest
    }

    /// Wait until no read started at open is in flight.
    fn wait_arrivals(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.contains(&State::Fetching) {
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        drop(st);
        self.wait_lz4();
    }

    /// Wait for ws.lz4's arrival to be over, if one is stored: whether it was written whole.
    fn wait_lz4(&self) -> bool {
        self.lz4.as_ref().is_some_and(Lz4Arrival::wait_end)
    }

    /// The index of the chunk of pages.img at byte `offset`.
    fn chunk_index(&self, offset: u64) -> usize {
        self.chunks().partition_point(|c| c.offset + c.len <= offset)
    }

    /// Count `requests` and `bytes` spent before the head (the manifest, a diff's base).
    pub fn count_before_head(&self, requests: u64, bytes: u64) {
        self.before_head.0.fetch_add(requests, Ordering::Relaxed);
        self.before_head.1.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (requests, bytes) this miss has fetched so far, what came before the head included.
    pub fn fetched(&self) -> (u64, u64) {
        let (r, b) = (&self.before_head.0, &self.before_head.1);
        let (br, bb) = match &self.base {
            Some(l) if l.counted => l.base.fill.fetched(),
            _ => (0, 0),
        };
        (br + r.load(Ordering::Relaxed) + self.counters.requests.load(Ordering::Relaxed), bb + b.load(Ordering::Relaxed) + self.counters.bytes.load(Ordering::Relaxed))
    }

    /// The base arriving lazily under this diff, if it does.
    pub fn lazy_base(&self) -> Option<&Arc<LazyBase>> {
        self.base.as_ref().map(|l| &l.base)
    }

    /// Where this snapshot is assembled.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Note what was fetched by the time the first response came back. Whether
    /// this was the first response.
    pub fn first_response(&self) -> bool {
        let mut first = self.at_first_response.lock().unwrap_or_else(|p| p.into_inner());
        let was = first.is_none();
        if was {
            *first = Some(self.fetched());
        }
        was
    }

    /// What [`RemoteFill::first_response`] noted.
    pub fn at_first_response(&self) -> Option<(u64, u64)> {
        *self.at_first_response.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a fetch has failed (see [`RemoteFill::complete`]).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire) || self.base.as_ref().is_some_and(|l| l.base.fill.failed())
    }

    /// Whether pages.img holds every page (after [`RemoteFill::complete`] succeeded).
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Fetch every chunk still missing; afterwards pages.img is complete (and a lazily
    /// arriving base's, first: this diff's ws.pages is built from both). A failure
    /// marks the fill failed ([`RemoteFill::failed`]): it will not complete.
    pub fn complete(&self) -> std::io::Result<()> {
        let r = self.complete_inner();
        if r.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        r
    }

    fn complete_inner(&self) -> std::io::Result<()> {
        if let Some(l) = &self.base {
            l.base.fill.complete()?;
        }
        let size = self.m.files[self.file].size;
        self.ensure_with(0, size, usize::MAX)?;
        self.pages.sync_all()?;
        *self.ws.lock().unwrap_or_else(|p| p.into_inner()) = HeldWs::None;
        // ws.pages, a placeholder until now, from the complete image (for the trace
        // there now: a restore may have merged its misses into it meanwhile).
        if self.deferred_ws {
            crate::fetch::derive_pages(&self.m, &self.dir, true).map_err(std::io::Error::other)?;
        }
        // The working set written unsynced at open.
        for name in [thaw_engine::ws::PAGES_FILE, thaw_engine::ws::TRACE_FILE] {
            match File::open(self.dir.join(name)) {
                Ok(f) => f.sync_all()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        crate::fetch::compress_ws(&self.m, &self.dir, true);
        self.complete.store(true, Ordering::Release);
        Ok(())
    }

    fn ensure_with(&self, offset: u64, len: u64, neighbours: usize) -> std::io::Result<()> {
        let range = self.overlapping(offset, len);
        loop {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if range.clone().all(|i| st[i] == State::Present) {
                return Ok(());
            }
            let pending: Vec<usize> = range.clone().filter(|&i| st[i] == State::Pending).collect();
            if !pending.is_empty() {
                for &i in &pending {
                    st[i] = State::Fetching;
                }
                drop(st);
                self.write_pending(&pending);
                continue;
            }
            let mut mine: Vec<usize> = range.clone().filter(|&i| st[i] == State::Absent).collect();
            // Missing neighbours after the last one come along in the same read, as
            // long as they follow it in its pack.
            if let Some(&last) = mine.last() {
                let c = self.chunks();
                let mut prev = last;
                for i in last + 1..st.len() {
                    let (p, n) = (&c[prev], &c[i]);
                    let follows = n.pack.is_some() && n.pack == p.pack && n.at.zip(p.at).is_some_and(|(a, b)| a == b + p.stored_len());
                    if mine.len() >= neighbours.saturating_add(1) || st[i] != State::Absent || !follows {
                        break;
                    }
                    mine.push(i);
                    prev = i;
                }
            }
            for &i in &mine {
                st[i] = State::Fetching;
            }
            if mine.is_empty() {
                // Another thread is fetching what we need: wait for it.
                let _st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            drop(st);
            // Chunks of working-set pages come from ws.pages when it is here.
            let mine = self.build_from_ws(mine);
            if !mine.is_empty() {
                self.fetch(&mine)?;
            }
        }
    }
}

impl PageFill for RemoteFill {
    fn brings_ws_lz4(&self) -> bool {
        self.lz4_brings
    }

    fn ws_lz4_upto(&self, end: u64) -> bool {
        self.lz4.as_ref().is_some_and(|z| z.wait_upto(end))
    }

    fn ensure(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let (own, base) = self.split(offset, len);
        if let Some((b, at, n)) = base {
            b.ensure(at, n)?;
        }
        match own {
            Some(n) => self.ensure_with(offset, n, FAULT_NEIGHBOURS),
            None => Ok(()),
        }
    }

    // A diff's ws.pages holds its base's working-set pages too.
    fn working_set(&self, layout: &[(u64, u64)], buf: &mut [u8]) -> std::io::Result<bool> {
        // Wait for the head's reads: `arrived` sets `ws`, then takes the state lock to
        // notify `changed` (locks in the order state, then ws).
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while matches!(*self.ws.lock().unwrap_or_else(|p| p.into_inner()), HeldWs::Fetching(_)) {
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        drop(st);
        let ws = self.ws.lock().unwrap_or_else(|p| p.into_inner());
        match &*ws {
            HeldWs::Here { layout: held, parts, .. } if held.as_slice() == layout && buf.len() as u64 == layout.len() as u64 * PAGE => {
                HeldWs::read(parts, 0, buf);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn copy(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<bool> {
        match self.split(offset, buf.len() as u64) {
            (Some(_), None) => self.own_copy(offset, buf),
            (None, Some((b, at, _))) => b.copy(at, buf),
            // Across the two files: read them after `ensure`.
            _ => Ok(false),
        }
    }
}

impl RemoteFill {
    /// Bytes `offset..offset + len` of the combined numbering: how many of them are
    /// this snapshot's own (from `offset`), and where the rest is in the lazily
    /// arriving base (its fill, offset, length).
    fn split(&self, offset: u64, len: u64) -> (Option<u64>, Option<(&RemoteFill, u64, u64)>) {
        let Some(l) = &self.base else { return (Some(len), None) };
        let end = offset + len;
        let own = (offset < l.own_bytes).then(|| end.min(l.own_bytes) - offset);
        let from = offset.max(l.own_bytes);
        let base = (end > from).then(|| (&*l.base.fill, from - l.own_bytes, end - from));
        (own, base)
    }

    /// [`PageFill::copy`] of bytes of this snapshot's own pages.img.
    fn own_copy(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<bool> {
        let range = self.overlapping(offset, buf.len() as u64);
        let parts: Vec<(u64, bytes::Bytes)> = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            // Wait for the reads in flight (the head's pages arriving).
            while range.clone().any(|i| st[i] == State::Fetching) {
                st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if range.is_empty() || !range.clone().all(|i| st[i] == State::Pending) {
                return Ok(false);
            }
            let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let got: Option<Vec<_>> = range.clone().map(|i| pending.get(&self.chunks()[i].offset).map(|b| (self.chunks()[i].offset, b.clone()))).collect();
            match got {
                Some(g) => g,
                None => return Ok(false),
            }
        };
        let end = offset + buf.len() as u64;
        for (at, part) in parts {
            let (from, to) = (offset.max(at), end.min(at + part.len() as u64));
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(&part[(from - at) as usize..(to - at) as usize]);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two chunks of ws.lz4 in a head pack, stored raw, and the manifest naming them.
    fn head_of_two() -> (Manifest, Vec<u8>, Vec<Vec<u8>>) {
        let parts: Vec<Vec<u8>> = (0..2u8).map(|k| (0..PIECE as usize).map(|i| (i % 251) as u8 ^ k).collect()).collect();
        let pack = parts.concat();
        let chunk = |k: usize| {
            serde_json::json!({"offset": k as u64 * PIECE, "len": PIECE, "sha256": crate::remote::sha256_hex(&parts[k]), "pack": 0, "at": k as u64 * PIECE})
        };
        let m = serde_json::from_value(serde_json::json!({
            "format": 5, "image_format": 1, "image_id": 1, "head": 0, "derived": [],
            "packs": [{"name": crate::remote::sha256_hex(&pack), "size": pack.len()}],
            "files": [{"name": thaw_engine::ws::LZ4_FILE, "size": pack.len(), "chunks": [chunk(0), chunk(1)]}],
        }))
        .unwrap();
        (m, pack, parts)
    }

    #[test]
    fn a_piece_checked_by_its_chunks_is_handed_over_before_the_rest_arrives() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (m, pack, parts) = head_of_two();
        let spans = spans_of(&m, |_, _| true, u64::MAX);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<crate::error::Result<bytes::Bytes>>();
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
        let copy = rt.block_on(async { crate::fetch::HeadCopy::from_parts("head".into(), async move { Ok(Box::pin(stream)) }) });
        let (early_tx, mut early_rx) = tokio::sync::mpsc::unbounded_channel();
        let object = "s3://b/head".to_string();
        let read = {
            let (copy, spans, head) = (copy.clone(), spans.clone(), m.packs[0].clone());
            rt.spawn(async move { pages_as_they_arrive(&copy, &spans, Check::Chunks, &head, &object, Some(early_tx)).await })
        };
        // The first chunk here, the second not yet: the first is handed over.
        tx.send(Ok(bytes::Bytes::from(pack[..PIECE as usize].to_vec()))).unwrap();
        let (piece, got) = rt.block_on(early_rx.recv()).expect("the first piece, before the rest");
        assert_eq!((piece.start, piece.end, got.len()), (0, PIECE, 1));
        assert_eq!(got[0], parts[0]);
        assert!(!read.is_finished(), "the read goes on");
        // The second chunk arrives corrupt: never handed over, and the read fails.
        let mut bad = pack[PIECE as usize..].to_vec();
        bad[7] ^= 1;
        tx.send(Ok(bytes::Bytes::from(bad))).unwrap();
        drop(tx);
        let e = rt.block_on(read).unwrap().unwrap_err().to_string();
        assert!(e.contains("hashes to"), "{e}");
        assert!(rt.block_on(early_rx.recv()).is_none(), "nothing more handed over");
    }

    #[test]
    fn ws_lz4_waiters_see_its_written_prefix_and_its_end() {
        let d = tempfile::tempdir().unwrap();
        let file = File::create(d.path().join("ws.lz4")).unwrap();
        let z = Arc::new(Lz4Arrival { index: 0, file, size: 300, written: Default::default(), changed: Condvar::new() });
        assert!(z.write(100, &[1; 100]));
        {
            let w = z.written.lock().unwrap();
            assert_eq!((w.prefix(), w.covers(100, 200), w.covers(0, 10)), (0, true, false), "a gap at the start");
        }
        let waiter = {
            let z = z.clone();
            std::thread::spawn(move || z.wait_upto(200))
        };
        assert!(z.write(0, &[2; 100]));
        assert!(waiter.join().unwrap(), "0..200 written");
        assert_eq!(z.written.lock().unwrap().prefix(), 200);
        // The rest never comes: a waiter for it is told so once the arrival ends.
        let waiter = {
            let z = z.clone();
            std::thread::spawn(move || z.wait_upto(300))
        };
        z.end(false, d.path());
        assert!(!waiter.join().unwrap());
        assert!(!z.wait_end());
        assert!(z.wait_upto(150), "what was written stays readable");
        // All of it written before a later read failed: whole all the same.
        let file = File::create(d.path().join("ws.lz4")).unwrap();
        let z = Lz4Arrival { index: 0, file, size: 100, written: Default::default(), changed: Condvar::new() };
        assert!(z.write(0, &[3; 100]));
        z.end(false, d.path());
        assert!(z.wait_end() && d.path().join("ws.lz4").exists(), "kept");
    }
}
