//! REAP working sets: the pages an invocation touched, recorded once and
//! prefetched with one large read on every later cold start.
//!
//! Two files live beside the image:
//! ```text
//! ws.trace   +0 magic "THAWWST\0" | +8 version u32 | +12 image id u32 (the state.bin CRC)
//!            +16 count u64 | entries: {vaddr u64, file_page u64 (u64::MAX = zero page)}
//!            in FAULT ORDER | crc32 u32 over everything before it
//! ws.pages   the contents of the stored (non-zero) entries, sorted by vaddr,
//!            4096 bytes each, so that contiguous addresses are contiguous in
//!            the file (one UFFDIO_COPY per run) and the whole file is read
//!            with a single O_DIRECT read.
//! ```
//! A working set is only trusted if its image id matches the image and every
//! page matches the image's CRC for that page; otherwise it is ignored (the
//! restore falls back to lazy paging) and re-recorded.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use thiserror::Error;

use crate::image::PageIndex;
use crate::seal::Sealer;
use crate::sys::PAGE_SIZE;

pub mod lz4;
pub use lz4::FILE as LZ4_FILE;

pub const TRACE_FILE: &str = "ws.trace";
/// A restore from the local disk reads a working set of at least this many bytes from
/// ws.lz4, a smaller one from ws.pages ([`WorkingSet::reads_lz4`]). Decompressing
/// costs CPU on the restore's path that reading the larger file from a fast disk does
/// not: same run, 14 restores each, page cache evicted (bench/results/ws-lz4-cpu-20261129.*),
/// time to first response as ws.lz4 / as ws.pages: helloworld (1.3 MB) pooled 2.72 /
/// 2.42 ms, sealed 4.60 / 4.32; pyaes (1.9 MB) 4.37 / 4.02, sealed 6.67 / 6.05;
/// lrserving (10.4 MB) 14.31 / 14.92, sealed 17.28 / 16.77; and a pooled helloworld
/// start's node CPU 2.6-2.7 against 1.75 ms (bench/results/issue33-cpu-20261129.txt).
/// On a disk much slower than this host's (1.5 GB/s), `THAW_WS_LZ4=1` reads ws.lz4
/// whatever the size.
pub const LZ4_READ_FROM: u64 = 4 << 20;
pub const PAGES_FILE: &str = "ws.pages";
const MAGIC: &[u8; 8] = b"THAWWST\0";
const VERSION: u32 = 1;
const ZERO: u64 = u64::MAX;
/// Refuse to parse traces larger than this (entries).
const MAX_ENTRIES: u64 = 16 << 20;

#[derive(Debug, Error)]
pub enum WsError {
    #[error("working set in {dir}: no {file}")]
    Missing { dir: PathBuf, file: &'static str },
    #[error("working set in {dir}: {file} is corrupt ({detail})")]
    Corrupt { dir: PathBuf, file: &'static str, detail: String },
    #[error("working set in {dir} was recorded for another image (id {found:#010x}, image is {want:#010x})")]
    Stale { dir: PathBuf, found: u32, want: u32 },
    #[error("working set in {dir}: {what}")]
    Io { dir: PathBuf, what: String, #[source] source: io::Error },
}

/// One touched page: its address and where its contents are in the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    pub vaddr: u64,
    /// `None`: the page was not stored (it is a zero page).
    pub file_page: Option<u64>,
}

/// A parsed trace plus the layout of ws.pages.
#[derive(Debug, Clone)]
pub struct WorkingSet {
    /// Fault order, as recorded.
    pub trace: Vec<Touch>,
    /// Stored pages sorted by vaddr: (vaddr, image file page); index = page in ws.pages.
    pub layout: Vec<(u64, u64)>,
    /// Zero pages sorted by vaddr.
    pub zeros: Vec<u64>,
    /// The checksum ws.trace ends with (0: not read from a file): what ws.lz4 names.
    pub trace_crc: u32,
}

impl WorkingSet {
    pub fn from_trace(trace: Vec<Touch>) -> WorkingSet {
        let mut layout: Vec<(u64, u64)> = trace.iter().filter_map(|t| t.file_page.map(|f| (t.vaddr, f))).collect();
        layout.sort_unstable();
        layout.dedup_by_key(|x| x.0);
        let mut zeros: Vec<u64> = trace.iter().filter(|t| t.file_page.is_none()).map(|t| t.vaddr).collect();
        zeros.sort_unstable();
        zeros.dedup();
        WorkingSet { trace, layout, zeros, trace_crc: 0 }
    }

    pub fn pages_bytes(&self) -> u64 {
        self.layout.len() as u64 * PAGE_SIZE
    }

    /// Whether the files for `dir` exist (says nothing about validity).
    pub fn exists(dir: &Path) -> bool {
        dir.join(TRACE_FILE).is_file() && dir.join(PAGES_FILE).is_file()
    }

    /// The crc of the trace in `dir` (ws.trace's last 4 bytes), unchecked and without
    /// loading it: what tells a working set recorded or extended since some point from
    /// the same one written again (a store's fill rewrites ws.trace unchanged with the
    /// ws.pages it rebuilds).
    pub fn stored_crc(dir: &Path) -> Option<u32> {
        use std::os::unix::fs::FileExt;
        let f = File::open(dir.join(TRACE_FILE)).ok()?;
        let len = f.metadata().ok()?.len();
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, len.checked_sub(4)?).ok()?;
        Some(u32::from_le_bytes(b))
    }

    /// Load and check the trace of `dir` against the image `image_id`.
    pub fn load(dir: &Path, image_id: u32) -> Result<WorkingSet, WsError> {
        let bytes = match std::fs::read(dir.join(TRACE_FILE)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(WsError::Missing { dir: dir.to_path_buf(), file: TRACE_FILE })
            }
            Err(source) => return Err(WsError::Io { dir: dir.to_path_buf(), what: "reading the trace".into(), source }),
        };
        let ws = WorkingSet::parse(dir, &bytes, image_id)?;
        let size = std::fs::metadata(dir.join(PAGES_FILE))
            .map_err(|_| WsError::Missing { dir: dir.to_path_buf(), file: PAGES_FILE })?
            .len();
        ws.check_size(dir, size)?;
        Ok(ws)
    }

    /// A ws.pages of `size` bytes is the one this trace needs, or corrupt.
    fn check_size(&self, dir: &Path, size: u64) -> Result<(), WsError> {
        if size == self.pages_bytes() {
            return Ok(());
        }
        Err(WsError::Corrupt { dir: dir.to_path_buf(), file: PAGES_FILE, detail: format!("size is {size} bytes, the trace needs {}", self.pages_bytes()) })
    }

    /// Parse and check the bytes of a trace (of the working set in `dir`, for
    /// messages) against the image `image_id`; ws.pages is not looked at.
    pub fn parse(dir: &Path, bytes: &[u8], image_id: u32) -> Result<WorkingSet, WsError> {
        let corrupt = |detail: String| WsError::Corrupt { dir: dir.to_path_buf(), file: TRACE_FILE, detail };
        if bytes.len() < 28 || &bytes[..8] != MAGIC {
            return Err(corrupt("bad magic".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(8) != VERSION {
            return Err(corrupt(format!("version {}", u32_at(8))));
        }
        let count = u64_at(16);
        if count > MAX_ENTRIES || bytes.len() as u64 != 24 + count * 16 + 4 {
            return Err(corrupt(format!("{} bytes for {count} entries", bytes.len())));
        }
        let end = bytes.len() - 4;
        if crc32fast::hash(&bytes[..end]) != u32_at(end) {
            return Err(corrupt("checksum mismatch".into()));
        }
        let found = u32_at(12);
        if found != image_id {
            return Err(WsError::Stale { dir: dir.to_path_buf(), found, want: image_id });
        }
        let trace = (0..count as usize)
            .map(|i| {
                let fp = u64_at(24 + i * 16 + 8);
                Touch { vaddr: u64_at(24 + i * 16), file_page: (fp != ZERO).then_some(fp) }
            })
            .collect();
        Ok(WorkingSet { trace_crc: u32_at(end), ..WorkingSet::from_trace(trace) })
    }

    /// Read ws.pages in one go (O_DIRECT unless `cached`) and verify every page
    /// against the image's CRCs. Returns the page-aligned contents.
    pub fn read_pages(&self, dir: &Path, index: &PageIndex, cached: bool) -> Result<(AlignedBuf, f64), WsError> {
        let t0 = Instant::now();
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true);
        if !cached {
            opts.custom_flags(libc::O_DIRECT);
        }
        let f = opts.open(dir.join(PAGES_FILE)).map_err(io_err(dir, "opening ws.pages"))?;
        let mut buf = AlignedBuf::new(self.pages_bytes() as usize);
        read_full(dir, &f, buf.as_mut(), 0)?;
        let read_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.verify(dir, index, 0, buf.as_ref())?;
        Ok((buf, read_ms))
    }

    /// Read ws.pages (`f`, see [`WorkingSet::open_pages`]) into `into` piece by
    /// piece, each checked against the image's CRCs and `open`ed (decrypted, for a
    /// sealed image) before it is handed over, so a restore installs the first pieces
    /// while the next are read. [`READ_LANES`] pieces are read at once (lane `l` reads
    /// pieces `l`, `l + lanes`, ...): one at a time, the disk served 256 KiB pieces
    /// more slowly than one read of the whole (helloworld: 2.0 against 1.4 ms). A
    /// piece that cannot be read or does not check fails, with it every piece not
    /// handed over yet (their waiters are told), and the error is returned.
    ///
    /// Where `f` has ws.lz4 ([`PagesFile`]), a piece's frames are read from there and
    /// decompressed on the lane instead; a piece whose frames do not decompress or
    /// check is read from ws.pages (and ws.lz4 removed).
    /// A sealed image's ws.lz4 is opened with `sealer`: its pieces come out clear, and
    /// `open` is not called for them.
    pub fn read_into(&self, dir: &Path, index: &PageIndex, f: &PagesFile, into: &Arriving, open: &OpenPieces, sealer: Option<&Sealer>) -> Result<(), WsError> {
        let t0 = Instant::now();
        // However this ends (a lane that panicked included), no piece is left unset: a
        // restore waiting for it would wait for ever.
        let _settled = Settled(into);
        let lanes = read_lanes().min(into.pieces());
        let lane = |l: usize| -> Result<(), WsError> {
            for k in (l..into.pieces()).step_by(lanes) {
                let at = into.start(k);
                let mut buf = AlignedBuf::new(into.piece_len(k));
                let first = at / PAGE_SIZE as usize;
                let r = (|| {
                    let usable = |z: &&lz4::Frames| z.whole_frames(at, buf.as_ref().len()) && (!z.sealed() || sealer.is_some());
                    let compressed = f.lz4.as_ref().filter(usable).and_then(|z| {
                        // Sealed frames authenticate; clear ones are checked as ws.pages is.
                        let r = z.read(at, buf.as_mut(), sealer).and_then(|n| match z.sealed() {
                            true => Ok((n, true)),
                            false => self.verify(dir, index, first, buf.as_ref()).map(|()| (n, false)).map_err(|e| e.to_string()),
                        });
                        r.inspect_err(|e| {
                            let instead = if f.image.is_some() { "the image" } else { "ws.pages" };
                            tracing::warn!(dir = %dir.display(), error = %e, instead, "a piece of ws.lz4 did not arrive or does not check; reading it instead, and removing ws.lz4");
                            let _ = std::fs::remove_file(dir.join(LZ4_FILE));
                        })
                        .ok()
                    });
                    let (n, clear) = match (compressed, f.image.as_deref()) {
                        (Some(got), _) => got,
                        (None, Some(read)) => {
                            let what = "reading the working set's pages out of the image (ws.lz4 did not bring them)";
                            self.gather(first, buf.as_mut(), read).map_err(io_err(dir, what))?;
                            self.verify(dir, index, first, buf.as_ref())?;
                            (0, false)
                        }
                        (None, None) => {
                            read_full(dir, &f.file, buf.as_mut(), at)?;
                            self.verify(dir, index, first, buf.as_ref())?;
                            (buf.as_ref().len() as u64, false)
                        }
                    };
                    into.read_bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    if clear {
                        return Ok(());
                    }
                    open(first, buf.as_mut())
                })();
                if let Err(e) = r {
                    // The pieces before this one come from the other lanes and are
                    // still installed (a lane that got here first must not fail them).
                    into.fail_from(k, e.to_string());
                    return Err(e);
                }
                into.put(k, buf, t0);
            }
            Ok(())
        };
        std::thread::scope(|s| {
            let others: Vec<_> = (1..lanes).map(|l| s.spawn(move || lane(l))).collect();
            let mine = lane(0);
            others.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(WsError::Corrupt { dir: dir.to_path_buf(), file: PAGES_FILE, detail: "its reader panicked".into() }))).fold(mine, Result::and)
        })
    }

    /// Open ws.pages for [`WorkingSet::read_into`] (O_DIRECT unless `cached`), and
    /// check it has the size the trace needs: opened right after the trace was read,
    /// a pages file that another instance replaced in between (a merge) shows here as
    /// corrupt, and the caller looks again. With it ws.lz4, if there is one for this
    /// trace, whatever the working set's size (`THAW_WS_LZ4=0`: never).
    pub fn open_pages(&self, dir: &Path, cached: bool) -> Result<PagesFile, WsError> {
        self.open_pages_with(dir, cached, None, true)
    }

    /// Whether a restore from this disk reads ws.lz4 (when one names this trace) rather
    /// than ws.pages: for a working set of [`LZ4_READ_FROM`] bytes or more
    /// (`THAW_WS_LZ4=1`: always, `=0`: never, the baselines). A working set arriving
    /// from a store is read from ws.lz4 whatever its size (its ws.pages is a placeholder).
    pub fn reads_lz4(&self) -> bool {
        match std::env::var("THAW_WS_LZ4").as_deref() {
            Ok("0") => false,
            Ok("1") => true,
            _ => self.pages_bytes() >= LZ4_READ_FROM,
        }
    }

    /// [`WorkingSet::open_pages`]; with `arrival`, while ws.lz4 is still being written by
    /// a snapshot's fill (a store's miss), with ws.pages a placeholder: ws.lz4's header read once
    /// here, each piece's frames once `arrival`'s first part says they are written
    /// ([`crate::pagefiles::PageFill::ws_lz4_upto`]); a piece whose frames do not
    /// arrive (or check) is read out of the image with its second part (the fill
    /// fetches those pages as any read of them), never from the placeholder.
    /// ws.lz4 is not even looked for unless `lz4` (see [`WorkingSet::reads_lz4`]).
    pub fn open_pages_with(&self, dir: &Path, cached: bool, arrival: Option<(crate::pagefiles::Arrival, std::sync::Arc<ImageReader>)>, lz4: bool) -> Result<PagesFile, WsError> {
        let (arrival, image) = arrival.unzip();
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true);
        if !cached {
            opts.custom_flags(libc::O_DIRECT);
        }
        let f = opts.open(dir.join(PAGES_FILE)).map_err(io_err(dir, "opening ws.pages"))?;
        self.check_size(dir, f.metadata().map_err(io_err(dir, "reading the size of ws.pages"))?.len())?;
        let lz4 = (lz4 && self.trace_crc != 0 && std::env::var("THAW_WS_LZ4").as_deref() != Ok("0"))
            .then(|| lz4::open(dir, cached, self.trace_crc, self.pages_bytes(), arrival))
            .flatten();
        Ok(PagesFile { file: f, lz4, image })
    }

    /// Whether `dir` has a ws.lz4 whose header names this working set's trace (read
    /// through the page cache), and whether its frames are sealed: a sealed snapshot
    /// arriving from a store brings one in its head instead of ws.pages (see
    /// `thaw_store::publish`).
    pub fn lz4_beside(&self, dir: &Path) -> Option<bool> {
        (self.trace_crc != 0).then(|| lz4::open(dir, true, self.trace_crc, self.pages_bytes(), None)).flatten().map(|f| f.sealed())
    }

    /// The working set's pages read out of the image's `pages` instead of ws.pages:
    /// for a snapshot arriving from a store, whose fill hands them over from memory
    /// as they arrive (ws.pages is written once the fetch completes), whole when it
    /// holds ws.pages itself (a store's format 4), else page run by page run. Checked
    /// as [`WorkingSet::read_pages`] checks them.
    pub fn assemble(&self, dir: &Path, index: &PageIndex, pages: &crate::pagefiles::PageFiles) -> Result<(AlignedBuf, f64), WsError> {
        let t0 = Instant::now();
        let mut buf = AlignedBuf::new(self.pages_bytes() as usize);
        let ioe = |source| WsError::Io { dir: dir.to_path_buf(), what: "reading the working set's pages out of the image".into(), source };
        let whole = pages.fill_working_set(&self.layout, buf.as_mut()).map_err(ioe)?;
        if !whole {
            self.gather(0, buf.as_mut(), &|buf, at| pages.read_exact_at(buf, at)).map_err(ioe)?;
        }
        let read_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.verify(dir, index, 0, buf.as_ref())?;
        Ok((buf, read_ms))
    }

    /// ws.pages' contents from its page `first` on into `buf`, read out of the image's
    /// page files with `read` (buffer, byte offset): runs of consecutive file pages
    /// in one read each.
    fn gather(&self, first: usize, buf: &mut [u8], read: &dyn Fn(&mut [u8], u64) -> io::Result<()>) -> io::Result<()> {
        let end = first + buf.len() / PAGE_SIZE as usize;
        let mut i = first;
        while i < end {
            let fp = self.layout[i].1;
            let n = self.layout[i..end].iter().enumerate().take_while(|&(k, &(_, f))| f == fp + k as u64).count();
            let at = (i - first) * PAGE_SIZE as usize;
            read(&mut buf[at..at + n * PAGE_SIZE as usize], fp * PAGE_SIZE)?;
            i += n;
        }
        Ok(())
    }

    /// Every page of `pages` (ws.pages' contents from its page `first` on) against
    /// the image's CRCs.
    fn verify(&self, dir: &Path, index: &PageIndex, first: usize, pages: &[u8]) -> Result<(), WsError> {
        for (i, page) in pages.chunks_exact(PAGE_SIZE as usize).enumerate() {
            let (vaddr, fp) = self.layout[first + i];
            if index.crcs.get(fp as usize) != Some(&crc32fast::hash(page)) {
                return Err(WsError::Corrupt {
                    dir: dir.to_path_buf(),
                    file: PAGES_FILE,
                    detail: format!("page for {vaddr:#x} does not match the image"),
                });
            }
        }
        Ok(())
    }

    /// Decrypt in place the pages [`WorkingSet::read_pages`] read from the working
    /// set of a sealed image (`ws.pages` holds copies of the sealed image pages).
    /// Pages numbered from `own_pages` on are a diff's base pages, which are clear.
    /// `pages` are ws.pages' contents from its page `first` on.
    pub fn unseal(&self, dir: &Path, sealer: &Sealer, index: &PageIndex, own_pages: u64, first: usize, pages: &mut [u8]) -> Result<(), WsError> {
        for (i, page) in pages.chunks_exact_mut(PAGE_SIZE as usize).enumerate() {
            let (vaddr, fp) = self.layout[first + i];
            if fp >= own_pages {
                continue;
            }
            let tag = index.tags.get(fp as usize).ok_or_else(|| WsError::Corrupt {
                dir: dir.to_path_buf(),
                file: PAGES_FILE,
                detail: format!("page for {vaddr:#x} has no tag in the image"),
            })?;
            if !sealer.open_page(fp, page, tag) {
                return Err(WsError::Corrupt {
                    dir: dir.to_path_buf(),
                    file: PAGES_FILE,
                    detail: format!("page for {vaddr:#x} does not authenticate under the node key"),
                });
            }
        }
        Ok(())
    }
}

/// Add the pages of `touched` that the working set of `dir` lacks (in the order
/// they were touched, after the recorded ones) and rewrite it. Returns how many
/// entries were added (0: nothing to do, files untouched).
pub fn merge(dir: &Path, image_id: u32, touched: &[Touch], pages: &crate::pagefiles::PageFiles, sealed: Option<&SealedPages<'_>>) -> Result<usize, WsError> {
    let ws = match WorkingSet::load(dir, image_id) {
        Ok(ws) => ws,
        // Dropped meanwhile (by another instance's misprediction): the next restore records.
        Err(WsError::Missing { .. }) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut known: std::collections::HashSet<u64> = ws.trace.iter().map(|t| t.vaddr).collect();
    let mut trace = ws.trace;
    let before = trace.len();
    trace.extend(touched.iter().filter(|t| known.insert(t.vaddr)).copied());
    let added = trace.len() - before;
    if added > 0 {
        write(dir, image_id, &trace, pages, sealed)?;
    }
    Ok(added)
}

/// Write the trace and the WS pages for `trace` beside the image, atomically
/// (temporary names, then rename: a reader never sees half a working set).
/// ws.lz4 then holds the pages decrypted and its frames sealed, where `sealed` gives
/// the image's sealing (a sealed image's ws.pages holds ciphertext).
pub fn write(dir: &Path, image_id: u32, trace: &[Touch], pages: &crate::pagefiles::PageFiles, sealed: Option<&SealedPages<'_>>) -> Result<WorkingSet, WsError> {
    write_from(dir, image_id, trace, &mut |fp, page| pages.read_exact_at(page, fp * PAGE_SIZE), WriteHow::Durable, sealed)
}

/// How a sealed image's pages are opened ([`write`]): its sealer, the page index
/// holding the tags, and how many of the numbered pages are its own (a diff's base
/// pages, numbered after them, are clear).
pub struct SealedPages<'a> {
    pub sealer: &'a Sealer,
    pub index: &'a PageIndex,
    pub own_pages: u64,
}

impl SealedPages<'_> {
    /// Decrypt stored page `fp` in place; false if it does not authenticate. A diff's
    /// base page is clear: checked by its CRC instead.
    fn open(&self, fp: u64, page: &mut [u8]) -> bool {
        if fp >= self.own_pages {
            return self.index.crcs.get(fp as usize) == Some(&crc32fast::hash(page));
        }
        self.index.tags.get(fp as usize).is_some_and(|tag| self.sealer.open_page(fp, page, tag))
    }
}

/// How [`write_from`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteHow {
    /// Synced, with ws.lz4 (where it pays): off a restore's path.
    Durable,
    /// Synced, without ws.lz4 (on a restore's path: compressing costs CPU there).
    DurableUncompressed,
    /// Not synced, without ws.lz4: for a directory that is thrown away after a
    /// crash, and synced before it is kept (see the store's lazy fetch).
    Unsynced,
}

/// [`write`], each page of the image got from `read(file page, buffer)`, as `how` says.
pub fn write_from(
    dir: &Path,
    image_id: u32,
    trace: &[Touch],
    read: &mut dyn FnMut(u64, &mut [u8]) -> io::Result<()>,
    how: WriteHow,
    sealed: Option<&SealedPages<'_>>,
) -> Result<WorkingSet, WsError> {
    let durable = how != WriteHow::Unsynced;
    let ws = WorkingSet::from_trace(trace.to_vec());
    let tag = tmp_tag();
    let tmp_pages = dir.join(format!("{PAGES_FILE}{tag}"));
    let tmp_trace = dir.join(format!("{TRACE_FILE}{tag}"));
    let tmp_lz4 = dir.join(format!("{LZ4_FILE}{tag}"));
    let result = (|| {
        let mut out = io::BufWriter::with_capacity(1 << 20, File::create(&tmp_pages).map_err(io_err(dir, "creating ws.pages"))?);
        let mut page = vec![0u8; PAGE_SIZE as usize];
        let mut z = (how == WriteHow::Durable).then(lz4::Writer::default);
        let mut clear = vec![0u8; PAGE_SIZE as usize];
        for &(_, fp) in &ws.layout {
            read(fp, &mut page).map_err(io_err(dir, "reading the image"))?;
            out.write_all(&page).map_err(io_err(dir, "writing ws.pages"))?;
            match (z.as_mut(), sealed) {
                (Some(w), None) => w.page(&page),
                (Some(w), Some(s)) => {
                    clear.copy_from_slice(&page);
                    if s.open(fp, &mut clear) {
                        w.page(&clear);
                    } else {
                        // ws.pages is checked page by page when read; ws.lz4 is not made.
                        z = None;
                    }
                }
                (None, _) => {}
            }
        }
        let f = out.into_inner().map_err(|e| e.into_error()).map_err(io_err(dir, "writing ws.pages"))?;
        if durable {
            f.sync_all().map_err(io_err(dir, "syncing ws.pages"))?;
        }

        let mut t = Vec::with_capacity(28 + trace.len() * 16);
        t.extend_from_slice(MAGIC);
        t.extend_from_slice(&VERSION.to_le_bytes());
        t.extend_from_slice(&image_id.to_le_bytes());
        t.extend_from_slice(&(trace.len() as u64).to_le_bytes());
        for e in trace {
            t.extend_from_slice(&e.vaddr.to_le_bytes());
            t.extend_from_slice(&e.file_page.unwrap_or(ZERO).to_le_bytes());
        }
        let crc = crc32fast::hash(&t);
        t.extend_from_slice(&crc.to_le_bytes());
        let compressed = z.and_then(|z| z.finish(crc, sealed.map(|s| s.sealer)));
        if let Some(bytes) = &compressed {
            lz4::write_tmp(&tmp_lz4, bytes, durable).map_err(io_err(dir, "writing ws.lz4"))?;
        }
        let mut tf = File::create(&tmp_trace).map_err(io_err(dir, "creating ws.trace"))?;
        tf.write_all(&t).map_err(io_err(dir, "writing ws.trace"))?;
        if durable {
            tf.sync_all().map_err(io_err(dir, "syncing ws.trace"))?;
        }
        // Pages first: a trace is only ever visible next to the pages it describes
        // (ws.lz4 names its trace: one for another trace is not used).
        std::fs::rename(&tmp_pages, dir.join(PAGES_FILE)).map_err(io_err(dir, "installing ws.pages"))?;
        match compressed {
            Some(_) => std::fs::rename(&tmp_lz4, dir.join(LZ4_FILE)).map_err(io_err(dir, "installing ws.lz4"))?,
            // A sealed one that names this very trace stays where this write could not
            // seal (no key: a store rebuilding the ws.pages of a sealed image whose
            // ws.lz4 it fetched; an image's pages never change under its id).
            None if sealed.is_none() && lz4::open(dir, true, crc, ws.pages_bytes(), None).is_some_and(|f| f.sealed()) => {}
            None => {
                let _ = std::fs::remove_file(dir.join(LZ4_FILE));
            }
        }
        std::fs::rename(&tmp_trace, dir.join(TRACE_FILE)).map_err(io_err(dir, "installing ws.trace"))?;
        Ok(crc)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp_pages);
        let _ = std::fs::remove_file(&tmp_lz4);
        let _ = std::fs::remove_file(&tmp_trace);
    }
    result.map(|crc| WorkingSet { trace_crc: crc, ..ws })
}

/// Write ws.lz4 beside the working set `ws` of `dir` from its ws.pages, where it has
/// no LZ4 frames for its trace yet (a working set that arrived as files: pulled from a
/// store, filled in by a lazy fetch, or written before ws.lz4 existed; or one that
/// arrived with a store's zstd frames, which decode at half LZ4's speed: a sealed one's
/// are kept unless `sealed` can seal others). A sealed image's
/// (`sealed`) has its pages decrypted, each checked by its tag (a diff's clear base
/// pages by their CRC), and its frames sealed; a page that does not check writes none.
/// Returns whether one was written (not where the pages do not compress: a sealed
/// image's without `sealed`). Off a restore's path: it reads and compresses the whole
/// working set.
pub fn compress_beside(dir: &Path, ws: &WorkingSet, sealed: Option<&SealedPages<'_>>, durable: bool) -> Result<bool, WsError> {
    if ws.trace_crc == 0 {
        return Ok(false);
    }
    let have = lz4::open(dir, true, ws.trace_crc, ws.pages_bytes(), None);
    if have.is_some_and(|f| f.codec() == lz4::Codec::Lz4 || (f.sealed() && sealed.is_none())) {
        return Ok(false);
    }
    let mut pages = match std::fs::read(dir.join(PAGES_FILE)) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(dir, "reading ws.pages")(e)),
    };
    if pages.len() as u64 != ws.pages_bytes() {
        return Ok(false);
    }
    let mut z = lz4::Writer::default();
    for (page, &(_, fp)) in pages.chunks_mut(PAGE_SIZE as usize).zip(&ws.layout) {
        if sealed.is_some_and(|s| !s.open(fp, page)) {
            return Ok(false);
        }
        z.page(page);
    }
    let Some(bytes) = z.finish(ws.trace_crc, sealed.map(|s| s.sealer)) else { return Ok(false) };
    install_lz4(dir, &bytes, durable)?;
    Ok(true)
}

/// Write ws.lz4's `bytes` under a temporary name and rename it into place.
fn install_lz4(dir: &Path, bytes: &[u8], durable: bool) -> Result<(), WsError> {
    let tmp = dir.join(format!("{LZ4_FILE}{}", tmp_tag()));
    let written = lz4::write_tmp(&tmp, bytes, durable).and_then(|()| std::fs::rename(&tmp, dir.join(LZ4_FILE)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io_err(dir, "writing ws.lz4"))
}

/// The suffix of a file being written here before it is renamed into place: this
/// process's and thread's, so concurrent writers never share one.
fn tmp_tag() -> String {
    format!(".tmp-{}-{:?}", std::process::id(), std::thread::current().id())
}

/// An I/O error of the working set in `dir` while doing `what`.
fn io_err(dir: &Path, what: &str) -> impl FnOnce(io::Error) -> WsError {
    let (dir, what) = (dir.to_path_buf(), what.to_string());
    move |source| WsError::Io { dir, what, source }
}

/// Remove a working set (stale, mispredicting or corrupt) so the next restore re-records.
pub fn invalidate(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(TRACE_FILE));
    let _ = std::fs::remove_file(dir.join(PAGES_FILE));
    let _ = std::fs::remove_file(dir.join(LZ4_FILE));
}

/// Fill `buf` from ws.pages (`f`, of the working set in `dir`) at byte `at`; a file
/// that ends first is corrupt.
fn read_full(dir: &Path, f: &File, buf: &mut [u8], at: usize) -> Result<(), WsError> {
    let mut done = 0;
    while done < buf.len() {
        let n = f
            .read_at(&mut buf[done..], (at + done) as u64)
            .map_err(io_err(dir, "reading ws.pages"))?;
        if n == 0 {
            return Err(WsError::Corrupt { dir: dir.to_path_buf(), file: PAGES_FILE, detail: "short read".into() });
        }
        done += n;
    }
    Ok(())
}

/// ws.pages opened for [`WorkingSet::read_into`] ([`WorkingSet::open_pages`]), and
/// ws.lz4 beside it when there is one for the same trace.
pub struct PagesFile {
    file: File,
    lz4: Option<lz4::Frames>,
    /// ws.pages is a placeholder still (a store's fill writes it once complete): a
    /// piece that ws.lz4 does not bring is read out of the image with this instead.
    image: Option<std::sync::Arc<ImageReader>>,
}

/// Reads the image's page files: into a buffer, from a byte offset (of
/// [`crate::pagefiles::PageFiles`]' numbering).
pub type ImageReader = dyn Fn(&mut [u8], u64) -> io::Result<()> + Send + Sync;

impl std::fmt::Debug for PagesFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagesFile").field("file", &self.file).field("lz4", &self.lz4).field("image", &self.image.is_some()).finish()
    }
}

impl PagesFile {
    /// Whether the pieces come from ws.lz4.
    pub fn compressed(&self) -> bool {
        self.lz4.is_some()
    }

    /// The pieces a read of `len` bytes from here arrives in ([`Arriving::new`]'s,
    /// made whole frames of ws.lz4 when it is read).
    pub fn arriving(&self, len: usize) -> Arriving {
        let a = Arriving::new(len);
        match &self.lz4 {
            Some(z) => Arriving::with_piece(len, a.piece.div_ceil(z.frame_bytes()) * z.frame_bytes()),
            None => a,
        }
    }
}

/// What [`WorkingSet::read_into`] does to each piece once checked (decrypt it, for
/// a sealed image): called with the piece's first page in ws.pages and its bytes.
pub type OpenPieces<'a> = dyn Fn(usize, &mut [u8]) -> Result<(), WsError> + Sync + 'a;

/// Bytes of ws.pages per piece when it is read piece by piece (a restore installs a
/// piece while the next is read): `THAW_WS_PIECE_KB`, else this.
const PIECE: usize = 256 << 10;
/// At most this many pieces: a larger working set has larger pieces.
const MAX_PIECES: usize = 8;
/// Pieces of ws.pages read at once (see [`WorkingSet::read_into`]).
const READ_LANES: usize = 2;

/// [`READ_LANES`], or `THAW_WS_LANES` (1-8) to measure against.
fn read_lanes() -> usize {
    std::env::var("THAW_WS_LANES").ok().and_then(|v| v.parse::<usize>().ok()).filter(|n| (1..=8).contains(n)).unwrap_or(READ_LANES)
}

/// ws.pages in memory as it is read, piece by piece ([`WorkingSet::read_into`]):
/// each piece is set once, checked; a restore waits for the piece it installs next
/// ([`Arriving::wait`]). Shared by the restores of a burst.
pub struct Arriving {
    len: usize,
    piece: usize,
    slots: Vec<std::sync::OnceLock<Result<AlignedBuf, String>>>,
    lock: std::sync::Mutex<()>,
    set: std::sync::Condvar,
    read_ms: std::sync::OnceLock<f64>,
    /// Bytes read from the disk for it (fewer than `len` from ws.lz4).
    read_bytes: std::sync::atomic::AtomicU64,
}

impl Arriving {
    /// `len` bytes to come, in pieces of [`PIECE`] bytes (`THAW_WS_PIECE_KB`; one
    /// piece, the whole file at once as before: `THAW_WS_PIECE_KB=0`), at most
    /// [`MAX_PIECES`].
    pub fn new(len: usize) -> Arriving {
        let page = PAGE_SIZE as usize;
        let asked = std::env::var("THAW_WS_PIECE_KB").ok().and_then(|v| v.parse::<usize>().ok()).map(|kb| kb << 10);
        let piece = match asked.unwrap_or(PIECE) {
            0 => len.max(page),
            p => p.max(len.div_ceil(MAX_PIECES)),
        };
        Arriving::with_piece(len, piece.div_ceil(page) * page)
    }

    fn with_piece(len: usize, piece: usize) -> Arriving {
        let n = len.div_ceil(piece).max(1);
        Arriving {
            len,
            piece,
            slots: (0..n).map(|_| std::sync::OnceLock::new()).collect(),
            lock: std::sync::Mutex::new(()),
            set: std::sync::Condvar::new(),
            read_ms: std::sync::OnceLock::new(),
            read_bytes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The whole of it, here already (read another way), in one piece.
    pub fn whole(buf: AlignedBuf, read_ms: f64) -> Arriving {
        let a = Arriving::with_piece(buf.len, buf.len.max(PAGE_SIZE as usize));
        let _ = a.read_ms.set(read_ms);
        a.read_bytes.store(buf.len as u64, std::sync::atomic::Ordering::Relaxed);
        let _ = a.slots[0].set(Ok(buf));
        a
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn pieces(&self) -> usize {
        self.slots.len()
    }

    /// Byte offset of piece `k` in ws.pages.
    pub fn start(&self, k: usize) -> usize {
        k * self.piece
    }

    pub fn piece_len(&self, k: usize) -> usize {
        self.piece.min(self.len - self.start(k))
    }

    fn put(&self, k: usize, buf: AlignedBuf, t0: Instant) {
        let _ = self.slots[k].set(Ok(buf));
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.slots.iter().all(|s| s.get().is_some()) {
            let _ = self.read_ms.set(t0.elapsed().as_secs_f64() * 1e3);
        }
        self.set.notify_all();
    }

    /// Every piece not set yet fails with `why`.
    fn fail(&self, why: String) {
        self.fail_from(0, why);
    }

    /// Piece `k` and every piece after it not set yet fail with `why`.
    fn fail_from(&self, k: usize, why: String) {
        for slot in self.slots.iter().skip(k) {
            let _ = slot.set(Err(why.clone()));
        }
        let _ = self.read_ms.set(0.0);
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.set.notify_all();
    }

    /// Piece `k`'s bytes once they are here and checked (blocks), or why they never
    /// will be.
    pub fn wait(&self, k: usize) -> Result<&[u8], &str> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = self.slots[k].get() {
                return r.as_ref().map(AlignedBuf::as_ref).map_err(String::as_str);
            }
            g = self.set.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// How long the read took, once it has ended (0 if it failed).
    pub fn read_ms(&self) -> f64 {
        self.read_ms.get().copied().unwrap_or(0.0)
    }

    /// Bytes read from the disk so far (ws.lz4's frames, or ws.pages').
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Fails every piece of an [`Arriving`] still unset when dropped.
struct Settled<'a>(&'a Arriving);

impl Drop for Settled<'_> {
    fn drop(&mut self) {
        if self.0.slots.iter().any(|s| s.get().is_none()) {
            self.0.fail("the working set's read ended before this piece".into());
        }
    }
}

/// A heap buffer whose start is page aligned (O_DIRECT needs it), in safe code:
/// over-allocate and start at the first aligned byte.
pub struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + PAGE_SIZE as usize];
        let off = raw.as_ptr().align_offset(PAGE_SIZE as usize);
        AlignedBuf { raw, off, len }
    }
    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
    pub fn as_ref(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_sorts_and_separates_zero_pages() {
        let ws = WorkingSet::from_trace(vec![
            Touch { vaddr: 0x5000, file_page: Some(9) },
            Touch { vaddr: 0x1000, file_page: Some(2) },
            Touch { vaddr: 0x3000, file_page: None },
            Touch { vaddr: 0x2000, file_page: Some(3) },
        ]);
        assert_eq!(ws.layout, vec![(0x1000, 2), (0x2000, 3), (0x5000, 9)]);
        assert_eq!(ws.zeros, vec![0x3000]);
        assert_eq!(ws.pages_bytes(), 3 * 4096);
    }

    #[test]
    fn a_local_restore_reads_frames_only_for_a_large_working_set() {
        if std::env::var_os("THAW_WS_LZ4").is_some() {
            return; // the environment decides instead
        }
        let of = |pages: u64| WorkingSet::from_trace((0..pages).map(|p| Touch { vaddr: p * PAGE_SIZE, file_page: Some(p) }).collect());
        assert!(!of(332).reads_lz4(), "helloworld's 1.3 MB: ws.pages");
        assert!(!of(LZ4_READ_FROM / PAGE_SIZE - 1).reads_lz4());
        assert!(of(LZ4_READ_FROM / PAGE_SIZE).reads_lz4());
        assert!(of(2540).reads_lz4(), "lrserving's 10.4 MB: ws.lz4");
    }

    /// A fake image of 4 pages in `dir` (page i filled with byte i+1): its bytes and the open file.
    fn fake_image(dir: &Path) -> (Vec<u8>, crate::pagefiles::PageFiles) {
        let img: Vec<u8> = (0..4u8).flat_map(|i| vec![i + 1; 4096]).collect();
        std::fs::write(dir.join("pages.img"), &img).unwrap();
        (img, File::open(dir.join("pages.img")).unwrap().into())
    }

    #[test]
    fn merge_appends_only_new_pages_and_tolerates_a_dropped_set() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (_, pages) = fake_image(dir);
        let t = |vaddr: u64, fp: Option<u64>| Touch { vaddr, file_page: fp };
        assert_eq!(merge(dir, 7, &[t(0x10000, Some(0))], &pages, None).unwrap(), 0, "no working set: nothing to extend");
        assert!(!WorkingSet::exists(dir));
        write(dir, 7, &[t(0x12000, Some(2)), t(0x20000, None)], &pages, None).unwrap();
        let added = merge(dir, 7, &[t(0x12000, Some(2)), t(0x10000, Some(0)), t(0x30000, None), t(0x10000, Some(0))], &pages, None);
        assert_eq!(added.unwrap(), 2);
        let ws = WorkingSet::load(dir, 7).unwrap();
        assert_eq!(ws.trace, vec![t(0x12000, Some(2)), t(0x20000, None), t(0x10000, Some(0)), t(0x30000, None)]);
        assert_eq!(std::fs::metadata(dir.join(PAGES_FILE)).unwrap().len(), 2 * 4096);
        assert_eq!(merge(dir, 7, &[t(0x10000, Some(0))], &pages, None).unwrap(), 0, "already there");
        assert!(matches!(merge(dir, 8, &[t(0x11000, Some(1))], &pages, None), Err(WsError::Stale { .. })));
    }

    #[test]
    fn write_load_and_detect_corruption_and_staleness() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (img, pages) = fake_image(dir);
        let mut index = PageIndex::default();
        for i in 0..4u64 {
            index.push(0x10000 + i * 4096, crc32fast::hash(&img[i as usize * 4096..(i as usize + 1) * 4096]));
        }
        let trace = vec![
            Touch { vaddr: 0x12000, file_page: Some(2) },
            Touch { vaddr: 0x10000, file_page: Some(0) },
            Touch { vaddr: 0x20000, file_page: None },
        ];
        write(dir, 0xabcd, &trace, &pages, None).unwrap();
        let ws = WorkingSet::load(dir, 0xabcd).unwrap();
        assert_eq!(ws.trace, trace);
        for cached in [true, false] {
            let (buf, _) = ws.read_pages(dir, &index, cached).unwrap();
            assert_eq!(&buf.as_ref()[..4096], &img[..4096]);
            assert_eq!(&buf.as_ref()[4096..], &img[2 * 4096..3 * 4096]);
        }
        let e = WorkingSet::load(dir, 0x1234).unwrap_err();
        assert!(matches!(e, WsError::Stale { found: 0xabcd, want: 0x1234, .. }), "{e}");
        // A WS page that no longer matches the image is rejected.
        let mut wp = std::fs::read(dir.join(PAGES_FILE)).unwrap();
        wp[10] ^= 1;
        std::fs::write(dir.join(PAGES_FILE), &wp).unwrap();
        let e = ws.read_pages(dir, &index, true).err().unwrap().to_string();
        assert!(e.ends_with("ws.pages is corrupt (page for 0x10000 does not match the image)"), "{e}");
        // A damaged trace is rejected.
        let mut t = std::fs::read(dir.join(TRACE_FILE)).unwrap();
        t[30] ^= 1;
        std::fs::write(dir.join(TRACE_FILE), &t).unwrap();
        let e = WorkingSet::load(dir, 0xabcd).unwrap_err().to_string();
        assert!(e.ends_with("ws.trace is corrupt (checksum mismatch)"), "{e}");
        invalidate(dir);
        assert!(!WorkingSet::exists(dir));
    }

    /// An image of `n` pages, each different and compressible, its page index, and the
    /// trace of all of them in reverse order.
    fn compressible_image(dir: &Path, n: u64) -> (Vec<u8>, crate::pagefiles::PageFiles, PageIndex, Vec<Touch>) {
        let img: Vec<u8> = (0..n as usize * 4096).map(|i| ((i / 4096) as u8).wrapping_mul(31) ^ ((i % 128) as u8)).collect();
        std::fs::write(dir.join("pages.img"), &img).unwrap();
        let mut index = PageIndex::default();
        for i in 0..n {
            index.push(0x10000 + i * 4096, crc32fast::hash(&img[i as usize * 4096..(i as usize + 1) * 4096]));
        }
        let trace = (0..n).rev().map(|p| Touch { vaddr: 0x10000 + p * 4096, file_page: Some(p) }).collect();
        (img, File::open(dir.join("pages.img")).unwrap().into(), index, trace)
    }

    fn read_all(ws: &WorkingSet, dir: &Path, index: &PageIndex, f: &PagesFile) -> (Vec<u8>, u64) {
        let into = f.arriving(ws.pages_bytes() as usize);
        ws.read_into(dir, index, f, &into, &|_, _| Ok(()), None).unwrap();
        ((0..into.pieces()).flat_map(|k| into.wait(k).unwrap().to_vec()).collect(), into.read_bytes())
    }

    #[test]
    fn ws_lz4_is_read_in_whole_frames_and_a_bad_frame_falls_back_to_ws_pages() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // 150 pages: two whole frames and part of a third.
        let (img, pages, index, trace) = compressible_image(dir, 150);
        let ws = write(dir, 3, &trace, &pages, None).unwrap();
        let z = std::fs::metadata(dir.join(LZ4_FILE)).expect("ws.lz4 written").len();
        assert!(z < ws.pages_bytes() / 2, "{z} bytes for {}", ws.pages_bytes());
        let ws = WorkingSet::load(dir, 3).unwrap();
        for cached in [true, false] {
            let f = ws.open_pages(dir, cached).unwrap();
            assert!(f.compressed());
            let (got, read) = read_all(&ws, dir, &index, &f);
            assert!(got == img, "cached {cached}");
            assert!(read < ws.pages_bytes() / 2, "read {read} bytes from the disk");
        }
        // A frame changed on disk: its piece comes from ws.pages, checked, and ws.lz4 goes.
        let mut b = std::fs::read(dir.join(LZ4_FILE)).unwrap();
        let last = b.len() - 100;
        b[last] ^= 0x55;
        std::fs::write(dir.join(LZ4_FILE), &b).unwrap();
        let f = ws.open_pages(dir, true).unwrap();
        assert!(f.compressed(), "its header still checks");
        let (got, _) = read_all(&ws, dir, &index, &f);
        assert!(got == img);
        assert!(!dir.join(LZ4_FILE).exists(), "removed");
        assert!(!ws.open_pages(dir, true).unwrap().compressed());
        assert!(read_all(&ws, dir, &index, &ws.open_pages(dir, true).unwrap()).0 == img);
        // One written for another trace (the working set merged since) is not used.
        write(dir, 3, &trace, &pages, None).unwrap();
        let old = std::fs::read(dir.join(LZ4_FILE)).unwrap();
        merge(dir, 3, &[Touch { vaddr: 0x900000, file_page: None }], &pages, None).unwrap();
        std::fs::write(dir.join(LZ4_FILE), &old).unwrap();
        let merged = WorkingSet::load(dir, 3).unwrap();
        assert!(!merged.open_pages(dir, true).unwrap().compressed());
        // Pages that do not compress (a sealed image's): none written, an old one removed.
        std::fs::write(dir.join("pages.img"), lz4::tests::noise(150 * 4096)).unwrap();
        let pages: crate::pagefiles::PageFiles = File::open(dir.join("pages.img")).unwrap().into();
        write(dir, 3, &trace, &pages, None).unwrap();
        assert!(!dir.join(LZ4_FILE).exists());
        // Made beside a working set that arrived as files (pulled): the same bytes.
        let (_, pages, _, _) = compressible_image(dir, 150);
        write(dir, 3, &trace, &pages, None).unwrap();
        let made = std::fs::read(dir.join(LZ4_FILE)).unwrap();
        let ws = WorkingSet::load(dir, 3).unwrap();
        assert!(!compress_beside(dir, &ws, None, false).unwrap(), "there already");
        std::fs::remove_file(dir.join(LZ4_FILE)).unwrap();
        assert!(compress_beside(dir, &ws, None, true).unwrap());
        assert!(std::fs::read(dir.join(LZ4_FILE)).unwrap() == made);
        // invalidate() removes it with the rest.
        write(dir, 3, &trace, &compressible_image(dir, 150).1, None).unwrap();
        assert!(dir.join(LZ4_FILE).exists());
        invalidate(dir);
        assert!(!dir.join(LZ4_FILE).exists());
    }

    #[test]
    fn a_sealed_working_set_that_arrived_as_files_gets_sealed_frames_made_from_its_checked_pages() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (img, _, _, trace) = compressible_image(dir, 100);
        // The image sealed as capture seals it: each page encrypted in place, its CRC
        // over the stored bytes, its tag in the index.
        let key = crate::seal::NodeKey::from_bytes([3; 32]);
        let sealer = Sealer::new(&key).unwrap();
        let mut stored = img.clone();
        let mut index = PageIndex::default();
        for (fp, page) in stored.chunks_mut(4096).enumerate() {
            let tag = sealer.seal_page(fp as u64, page);
            index.push(0x10000 + fp as u64 * 4096, crc32fast::hash(page));
            index.tags.push(tag);
        }
        std::fs::write(dir.join("pages.img"), &stored).unwrap();
        let pages: crate::pagefiles::PageFiles = File::open(dir.join("pages.img")).unwrap().into();
        // Written without its sealing (as a store writes it): ciphertext does not compress.
        write(dir, 5, &trace, &pages, None).unwrap();
        assert!(!dir.join(LZ4_FILE).exists());
        let ws = WorkingSet::load(dir, 5).unwrap();
        let sealed = SealedPages { sealer: &sealer, index: &index, own_pages: 100 };
        assert!(compress_beside(dir, &ws, Some(&sealed), true).unwrap());
        assert!(!compress_beside(dir, &ws, Some(&sealed), true).unwrap(), "there already");
        let f = ws.open_pages(dir, true).unwrap();
        assert!(f.compressed());
        let into = f.arriving(ws.pages_bytes() as usize);
        let opened = std::sync::atomic::AtomicUsize::new(0);
        let open = |_: usize, _: &mut [u8]| {
            opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        };
        ws.read_into(dir, &index, &f, &into, &open, Some(&sealer)).unwrap();
        let got: Vec<u8> = (0..into.pieces()).flat_map(|k| into.wait(k).unwrap().to_vec()).collect();
        assert!(got == img, "the pages clear, from sealed frames");
        assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 0, "clear pieces are not opened again");
        // Without the key its frames are not used: ws.pages is read (and opened).
        let into = f.arriving(ws.pages_bytes() as usize);
        ws.read_into(dir, &index, &f, &into, &open, None).unwrap();
        assert!(opened.load(std::sync::atomic::Ordering::Relaxed) > 0);
        assert!(dir.join(LZ4_FILE).exists(), "kept: not damaged, only not for this reader");
        // A page of ws.pages that does not authenticate: none made.
        std::fs::remove_file(dir.join(LZ4_FILE)).unwrap();
        let mut wp = std::fs::read(dir.join(PAGES_FILE)).unwrap();
        wp[7 * 4096 + 9] ^= 1;
        std::fs::write(dir.join(PAGES_FILE), &wp).unwrap();
        assert!(!compress_beside(dir, &ws, Some(&sealed), true).unwrap());
        assert!(!dir.join(LZ4_FILE).exists());
    }

    /// A lane whose piece fails does not fail the earlier pieces other lanes are still
    /// reading: a restore installs those (it was a race: with two lanes, the lane of
    /// the bad last piece could get there before the other had handed over the first).
    #[test]
    fn a_failed_piece_leaves_the_earlier_ones_to_their_lanes() {
        let into = Arriving::with_piece(4 * 4096, 4096);
        into.fail_from(2, "piece 2 is bad".into());
        into.put(1, AlignedBuf::new(4096), Instant::now());
        into.put(3, AlignedBuf::new(4096), Instant::now());
        assert_eq!(into.wait(1).map(<[u8]>::len), Ok(4096), "an earlier piece still arrives");
        assert_eq!(into.wait(2), Err("piece 2 is bad"));
        assert_eq!(into.wait(3), Err("piece 2 is bad"), "a later one stays failed");
        // The read ends with piece 0 never handed over: it fails then (Settled).
        into.fail("the read ended".into());
        assert_eq!(into.wait(0), Err("the read ended"));
        assert_eq!(into.wait(1).map(<[u8]>::len), Ok(4096));
    }

    #[test]
    fn a_working_set_arrives_piece_by_piece_checked_and_a_bad_piece_fails_it_from_there_on() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let img: Vec<u8> = (0..9u8).flat_map(|i| vec![i + 1; 4096]).collect();
        std::fs::write(dir.join("pages.img"), &img).unwrap();
        let pages: crate::pagefiles::PageFiles = File::open(dir.join("pages.img")).unwrap().into();
        let mut index = PageIndex::default();
        for i in 0..9u64 {
            index.push(0x10000 + i * 4096, crc32fast::hash(&img[i as usize * 4096..(i as usize + 1) * 4096]));
        }
        // Nine stored pages, recorded out of order: ws.pages holds them by address.
        let trace: Vec<Touch> = [4u64, 0, 8, 2, 6, 1, 7, 3, 5].iter().map(|&p| Touch { vaddr: 0x10000 + p * 4096, file_page: Some(p) }).collect();
        let ws = write(dir, 9, &trace, &pages, None).unwrap();
        let opened = std::sync::atomic::AtomicUsize::new(0);
        let open = |_: usize, p: &mut [u8]| {
            opened.fetch_add(p.len() / 4096, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        };
        // Pieces of 1, 2, 4 pages and of the whole; read in lanes, each handed over.
        for piece in [1usize, 2, 4, 9] {
            for cached in [true, false] {
                let into = Arriving::with_piece(9 * 4096, piece * 4096);
                opened.store(0, std::sync::atomic::Ordering::Relaxed);
                ws.read_into(dir, &index, &ws.open_pages(dir, cached).unwrap(), &into, &open, None).unwrap();
                let got: Vec<u8> = (0..into.pieces()).flat_map(|k| into.wait(k).unwrap().to_vec()).collect();
                assert_eq!(got, img, "pieces of {piece} pages, cached {cached}");
                assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 9, "every page opened once");
                assert!(into.read_ms() > 0.0);
            }
        }
        // A restore waiting for a piece is woken when it comes.
        let into = Arriving::with_piece(9 * 4096, 2 * 4096);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| into.wait(4).map(<[u8]>::to_vec));
            std::thread::sleep(std::time::Duration::from_millis(20));
            ws.read_into(dir, &index, &ws.open_pages(dir, true).unwrap(), &into, &open, None).unwrap();
            assert_eq!(waiter.join().unwrap().unwrap(), &img[8 * 4096..]);
        });
        // A page that does not match the image, in the third of five pieces: the
        // pieces before it arrive, checked; it and every later one fail, with why.
        let mut wp = std::fs::read(dir.join(PAGES_FILE)).unwrap();
        wp[4 * 4096 + 5] ^= 1;
        std::fs::write(dir.join(PAGES_FILE), &wp).unwrap();
        let into = Arriving::with_piece(9 * 4096, 2 * 4096);
        let e = ws.read_into(dir, &index, &ws.open_pages(dir, true).unwrap(), &into, &open, None).unwrap_err().to_string();
        assert!(e.ends_with("ws.pages is corrupt (page for 0x14000 does not match the image)"), "{e}");
        assert_eq!(into.wait(0).unwrap(), &img[..2 * 4096]);
        assert!(into.wait(2).unwrap_err().ends_with("does not match the image)"));
        // Later pieces fail with it, or arrived checked already on the other lane (a
        // restore installs nothing past the failed piece either way).
        for k in 3..5 {
            match into.wait(k) {
                Ok(bytes) => assert_eq!(bytes, &img[k * 2 * 4096..(k * 2 * 4096 + into.piece_len(k))], "piece {k}"),
                Err(e) => assert!(e.ends_with("does not match the image)"), "piece {k}: {e}"),
            }
        }
        // Not the size its trace says (replaced by a merge since the trace was read):
        // refused when opened, so the caller looks again; shortened after it was opened:
        // refused from the piece that ends early.
        std::fs::write(dir.join(PAGES_FILE), &img[..7 * 4096]).unwrap();
        assert!(ws.open_pages(dir, true).unwrap_err().to_string().ends_with("ws.pages is corrupt (size is 28672 bytes, the trace needs 36864)"));
        std::fs::write(dir.join(PAGES_FILE), &img).unwrap();
        let f = ws.open_pages(dir, true).unwrap();
        std::fs::OpenOptions::new().write(true).open(dir.join(PAGES_FILE)).unwrap().set_len(7 * 4096).unwrap();
        let into = Arriving::with_piece(9 * 4096, 2 * 4096);
        assert!(ws.read_into(dir, &index, &f, &into, &open, None).unwrap_err().to_string().ends_with("ws.pages is corrupt (short read)"));
        assert!(into.wait(4).is_err());
        // No ws.pages at all.
        std::fs::remove_file(dir.join(PAGES_FILE)).unwrap();
        assert!(matches!(ws.open_pages(dir, true), Err(WsError::Io { .. })));
        // A reader that panics (here: in `open`) leaves no piece unset.
        std::fs::write(dir.join(PAGES_FILE), &wp).unwrap();
        let into = Arriving::with_piece(9 * 4096, 2 * 4096);
        let boom = |first: usize, _: &mut [u8]| if first >= 4 { panic!("boom") } else { Ok(()) };
        let f = ws.open_pages(dir, true).unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ws.read_into(dir, &index, &f, &into, &boom, None)));
        assert!(caught.is_err() || caught.unwrap().is_err());
        for k in 0..into.pieces() {
            let _ = into.wait(k); // returns: no piece is left unset
        }
        assert!(into.wait(3).is_err(), "the piece whose reader panicked");
        // Read another way, whole: one piece, here at once.
        let whole = Arriving::whole(AlignedBuf::new(3 * 4096), 1.5);
        assert_eq!((whole.pieces(), whole.wait(0).unwrap().len(), whole.read_ms()), (1, 3 * 4096, 1.5));
    }
}
