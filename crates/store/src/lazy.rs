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
use crate::pack::{read_span, spans_of, Span};
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
    /// Chunks of the working set fetched with the head, by offset in pages.img:
    /// written when a read needs them or by [`RemoteFill::complete`], not before the
    /// start (the restore takes them from ws.pages; writing ~8 MB beside it slowed
    /// lrserving's restore by as much as the write took, on 2 cores).
    pending: Mutex<HashMap<u64, bytes::Bytes>>,
}

/// Fetch the head of stored snapshot `id` into the empty directory `dir`: every
/// file but pages.img complete, pages.img sparse with the head's pages in place,
/// ws.pages rebuilt. None: the snapshot has no head (format 1, or published before
/// heads), fetch it whole instead.
///
/// A diff's base must be beside it already (`thaw_engine::layers::BASE_LINK`).
///
/// A snapshot published before its working set was recorded (a node publishes what
/// it captures at once) has a working set beside it, `ws/<id>.trace`: it is read
/// with the head, and its pages follow in a few coalesced range reads, in parallel.
pub fn open(store: Arc<Store>, m: Manifest, id: &str, dir: &Path) -> Result<Option<Arc<RemoteFill>>> {
    let Some(head) = m.head else { return Ok(None) };
    let Some(file) = m.files.iter().position(|f| f.name == PAGES_FILE) else { return Ok(None) };
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
    let remote = &store.remote;
    let t0 = std::time::Instant::now();
    // 1. The head, in HEAD_READS parallel reads (one would hash it all on one core),
    //    and the working set recorded beside the snapshot, if any, at once.
    let spans: Vec<_> = spans_of(&m, |_, c| c.pack == Some(head), u64::MAX).into_iter().flat_map(|s| s.split(HEAD_READS)).collect();
    let (head_parts, recorded) =
        store.block_on(async { futures::join!(crate::pack::read_spans(remote, &spans), crate::fetch::recorded_trace(remote, &m, id)) });
    let mut reads = vec![(spans, head_parts?)];
    counters.requests.fetch_add(reads[0].0.len() as u64 + u64::from(m.file(TRACE_FILE).is_none()), Ordering::Relaxed);
    counters.bytes.fetch_add(recorded.as_ref().map_or(0, |t| t.len() as u64), Ordering::Relaxed);
    // 2. Every file but pages.img, complete.
    for (fi, off, part) in placed(&reads).filter(|(fi, _, _)| *fi != file) {
        files[fi].write_all_at(part, off).map_err(StoreError::local(dir, format!("writing {}", m.files[fi].name)))?;
    }
    // 3. The chunks of pages.img the working set (recorded, or the head's own) touches.
    let chunks = &m.files[file].chunks;
    let chunk_of = |at: u64| chunks.partition_point(|c| c.offset + c.len <= at);
    let trace = recorded.clone().or_else(|| std::fs::read(dir.join(TRACE_FILE)).ok().map(bytes::Bytes::from));
    let ws_chunks: HashSet<usize> = trace
        .as_deref()
        .and_then(|t| thaw_engine::ws::WorkingSet::parse(dir, t, m.image_id).ok())
        .map(|set| set.layout.iter().map(|&(_, fp)| chunk_of(fp * PAGE)).filter(|&i| i < chunks.len()).collect())
        .unwrap_or_default();
    // 4. Those the head lacks (a working set recorded after the publish): chunks are
    //    in address order, so few ranges once those close together are coalesced.
    let in_head: HashSet<u64> = placed(&reads).filter(|(fi, _, _)| *fi == file).map(|(_, off, _)| off).collect();
    let lacking: HashSet<u64> =
        ws_chunks.iter().map(|&i| chunks[i].offset).filter(|o| !in_head.contains(o) && state[chunk_of(*o)] == State::Absent).collect();
    let ws_spans = spans_of(&m, |fi, c| fi == file && lacking.contains(&c.offset), crate::pack::RANGE_GAP);
    if !ws_spans.is_empty() {
        let parts = store.block_on(crate::pack::read_spans(remote, &ws_spans))?;
        counters.requests.fetch_add(ws_spans.len() as u64, Ordering::Relaxed);
        reads.push((ws_spans, parts));
    }
    let t_read = t0.elapsed();
    // 5. pages.img: what the restore reads from it (copy-on-written file pages, rseq
    //    areas) now; the working set's chunks once needed, or after the start (the
    //    restore takes those from ws.pages, built from memory below).
    let mut later: Vec<(u64, bytes::Bytes)> = Vec::new();
    let span_bytes: u64 = reads.iter().flat_map(|(spans, _)| spans).map(|s| s.end - s.start).sum();
    counters.bytes.fetch_add(span_bytes, Ordering::Relaxed);
    for (_, off, part) in placed(&reads).filter(|(fi, _, _)| *fi == file) {
        let i = chunk_of(off);
        if ws_chunks.contains(&i) {
            later.push((off, part.clone()));
            state[i] = State::Pending;
        } else {
            files[file].write_all_at(part, off).map_err(StoreError::local(dir, "writing pages.img"))?;
            state[i] = State::Present;
        }
    }
    let pages = files.swap_remove(file);
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
        pending: Mutex::new(later.into_iter().collect()),
    });
    let t_written = t0.elapsed();
    // ws.pages, from the pages in memory (through the fill for any other, which
    // waits for the chunks being written); synced by `complete`, before the cache
    // keeps it.
    let in_memory: HashMap<u64, &bytes::Bytes> = placed(&reads).filter(|(fi, _, _)| *fi == file).map(|(_, off, part)| (off, part)).collect();
    let through_fill = crate::fetch::page_files(dir)?.with_fill(Some(fill.clone() as Arc<dyn PageFill>));
    let mut read = |fp: u64, buf: &mut [u8]| {
        let at = fp * PAGE;
        match chunks.get(chunk_of(at)).and_then(|c| Some((c, in_memory.get(&c.offset)?))) {
            Some((c, part)) if c.offset <= at && at + buf.len() as u64 <= c.offset + part.len() as u64 => {
                let from = (at - c.offset) as usize;
                buf.copy_from_slice(&part[from..from + buf.len()]);
                Ok(())
            }
            _ => through_fill.read_exact_at(buf, at),
        }
    };
    let derived = match &recorded {
        Some(t) => {
            crate::fetch::install_trace(&store.remote, &m, id, dir, t, &mut read, false);
            Ok(())
        }
        None => crate::fetch::derive(&m, dir, Some(&mut read), false),
    };
    derived?;
    tracing::debug!(
        requests = fill.counters.requests.load(Ordering::Relaxed),
        bytes = fill.counters.bytes.load(Ordering::Relaxed),
        read_ms = t_read.as_secs_f64() * 1e3,
        write_ms = (t_written - t_read).as_secs_f64() * 1e3,
        derive_ms = (t0.elapsed() - t_written).as_secs_f64() * 1e3,
        "snapshot head fetched"
    );
    Ok(Some(fill))
}

/// Every chunk that `reads` brought, with each place it goes: (file index, offset, bytes).
fn placed(reads: &[(Vec<Span>, Vec<Vec<bytes::Bytes>>)]) -> impl Iterator<Item = (usize, u64, &bytes::Bytes)> {
    reads
        .iter()
        .flat_map(|(spans, parts)| spans.iter().zip(parts))
        .flat_map(|(s, parts)| s.chunks.iter().zip(parts))
        .flat_map(|(c, part)| c.places.iter().map(move |&(fi, off)| (fi, off, part)))
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
        let c = self.chunks();
        let first = c.partition_point(|c| c.offset + c.len <= offset);
        let end = c.partition_point(|c| c.offset < offset + len);
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

    /// Count `requests` and `bytes` spent before the head (the manifest, a diff's base).
    pub fn count_before_head(&self, requests: u64, bytes: u64) {
        self.before_head.0.fetch_add(requests, Ordering::Relaxed);
        self.before_head.1.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (requests, bytes) this miss has fetched so far, what came before the head included.
    pub fn fetched(&self) -> (u64, u64) {
        let (r, b) = (&self.before_head.0, &self.before_head.1);
        (r.load(Ordering::Relaxed) + self.counters.requests.load(Ordering::Relaxed), b.load(Ordering::Relaxed) + self.counters.bytes.load(Ordering::Relaxed))
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
        self.failed.load(Ordering::Acquire)
    }

    /// Whether pages.img holds every page (after [`RemoteFill::complete`] succeeded).
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Fetch every chunk still missing; afterwards pages.img is complete.
    pub fn complete(&self) -> std::io::Result<()> {
        let size = self.m.files[self.file].size;
        self.ensure_with(0, size, usize::MAX)?;
        self.pages.sync_all()?;
        // The working set written unsynced at open.
        for name in [thaw_engine::ws::PAGES_FILE, thaw_engine::ws::TRACE_FILE] {
            match File::open(self.dir.join(name)) {
                Ok(f) => f.sync_all()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
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
            self.fetch(&mine)?;
        }
    }
}

impl PageFill for RemoteFill {
    fn ensure(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ensure_with(offset, len, FAULT_NEIGHBOURS)
    }
}
