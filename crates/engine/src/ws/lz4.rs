//! ws.lz4: the working set's pages compressed, frame by frame, beside ws.pages
//! (issue #33). A cold start whose page cache was evicted waits for the disk: ws.pages
//! is read here at ~1 GB/s (helloworld's 1.3 MB in 1.3 ms, read in pieces while the
//! restore installs the first ones), and a working set's pages compress to about a
//! third with LZ4, which decompresses at several GB/s on one core. So a restore reads
//! the frames of each piece and decompresses them on the reading lane instead.
//!
//! ```text
//! ws.lz4  +0 magic "THAWWSZ\0" | +8 version u32 (1 clear, 2 sealed; zstd frames: 3 clear,
//!         4 sealed) | +12 the trace's
//!         crc u32 (ws.trace's last 4 bytes) | +16 the length of ws.pages u64 |
//!         +24 frame bytes u32 | +28 frames u32 | +32 per frame: where its stored bytes
//!         end, from the data's start, u64 (sealed: then its nonce, 12 bytes, and its
//!         GCM tag, 16) | crc32 u32 over everything before it | zeros to the next
//!         multiple of 4096
//!         data: frame i = ws.pages' bytes i*F..(i+1)*F in the LZ4 block format (versions
//!         3 and 4: a zstd frame; sealed: then encrypted), back to back
//! ```
//!
//! zstd frames (versions 3 and 4) are what a snapshot store keeps
//! ([`recompress_zstd`], at publish): they are ~30% smaller than LZ4's, and on a miss the
//! link, not the decoder, is what a restore waits for. A node writes LZ4 frames for its
//! own disk, where decoding is what it waits for (zstd decodes at about half LZ4's speed).
//!
//! A sealed image's ws.pages holds ciphertext, which does not compress: its ws.lz4 holds
//! the pages decrypted (each checked by its tag first), compressed, and each frame
//! sealed with AES-256-GCM under a key of the image's own (`Sealer::seal_frame`: the
//! node key and the image's salt, a random nonce per frame), bound to where it belongs
//! (the trace's crc, ws.pages' length and the frame's number as associated data). A
//! frame that authenticates is what a holder of the node key wrote for this trace of
//! this image; its pages are handed over clear.
//!
//! Derived data, never trusted: it is used only when its header checks and names the
//! trace beside it and the length of ws.pages, and every page decompressed is checked
//! against the image's CRCs exactly as ws.pages' pages are. A piece whose frames do not
//! decompress or check is read from ws.pages instead (and ws.lz4 removed: the next write
//! of the working set makes it again). A snapshot store takes a sealed image's ws.lz4
//! into its head instead of ws.pages, whose ciphertext would not compress
//! (`thaw_store::publish`; a clear one's when asked), and a miss writes it as it
//! arrives: opened with an arrival ([`crate::pagefiles::PageFill::ws_lz4_upto`]), a
//! read waits for its frames' bytes and never reads the zeros not written yet. Not
//! written where it saves less than a quarter. `lz4_flex` (pure Rust, maintained) rather than
//! bindings to liblz4: the block format and its speed are all that is needed here.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::AlignedBuf;
use crate::pagefiles::Arrival;
use crate::seal::{Sealer, TAG_LEN};
use crate::sys::PAGE_SIZE;

pub const FILE: &str = "ws.lz4";
const MAGIC: &[u8; 8] = b"THAWWSZ\0";
const VERSION: u32 = 1;
const VERSION_SEALED: u32 = 2;
const VERSION_ZSTD: u32 = 3;
const VERSION_ZSTD_SEALED: u32 = 4;
/// zstd's level for a stored working set's frames: 3, its default (lrserving's 10.2 MB
/// working set: 2.9 MB against LZ4's 4.1 MB).
const ZSTD_LEVEL: i32 = 3;
const HEADER: usize = 32;
/// A sealed file's frames read or recompressed without the key.
const NO_KEY: &str = "ws.lz4 is sealed and no key opens it";
/// A sealed frame's nonce and tag.
type Seal = ([u8; 12], [u8; TAG_LEN]);
/// ws.pages' bytes per frame: 64 pages. A piece of a read is a whole number of frames.
pub const FRAME: usize = 256 << 10;
/// Written only when the frames take at most this share of ws.pages (3/4).
const WORTH: (usize, usize) = (3, 4);

/// How the frames are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// The LZ4 block format: what a node writes.
    Lz4,
    /// A zstd frame each: what a snapshot store keeps.
    Zstd,
}

/// An opened ws.lz4 whose header checked against the working set beside it.
pub struct Frames {
    file: File,
    /// Where the frames' data starts in the file.
    data_at: u64,
    /// Per frame, where its compressed bytes end (from `data_at`).
    ends: Vec<u64>,
    /// ws.pages' bytes per frame.
    frame: usize,
    len: u64,
    trace_crc: u32,
    /// Sealed frames' nonces and tags.
    seals: Option<Vec<Seal>>,
    codec: Codec,
    /// Still being written (a store's fill): wait for a read's bytes first.
    arrival: Option<Arrival>,
}

impl std::fmt::Debug for Frames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frames").field("frames", &self.ends.len()).field("frame", &self.frame).field("len", &self.len).field("sealed", &self.seals.is_some()).field("codec", &self.codec).field("arriving", &self.arrival.is_some()).finish()
    }
}

/// Open ws.lz4 in `dir` for a working set whose trace has the crc `trace_crc` and
/// whose ws.pages is `len` bytes long (O_DIRECT unless `cached`). `None` when there is
/// none, or it is for another trace, or its header does not check (then it is ignored;
/// ws.pages is read). `arrival`: the file is still being written (see
/// [`crate::pagefiles::PageFill::ws_lz4_upto`]): its header and table are waited for
/// here, each read's frames by [`Frames::read`].
pub fn open(dir: &Path, cached: bool, trace_crc: u32, len: u64, arrival: Option<Arrival>) -> Option<Frames> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    if !cached {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(dir.join(FILE)).ok()?;
    let size = file.metadata().ok()?.len();
    let page = PAGE_SIZE as usize;
    // The header and the table of a working set of up to 510 frames (127 MiB) are in
    // the first page; a larger one's are read whole after it.
    let here = |end: u64| arrival.as_ref().is_none_or(|a| a(end.min(size)));
    if !here(page as u64) {
        return None;
    }
    let mut first = AlignedBuf::new(page);
    let got = read_upto(&file, first.as_mut(), 0).ok()?;
    let b = &first.as_ref()[..got];
    let why = match parse_header(b, trace_crc, len) {
        Ok(Header { frames, frame, sealed, codec }) => {
            let data_at = data_start(frames, sealed);
            let whole = if data_at <= got {
                b[..data_at].to_vec()
            } else {
                if !here(data_at as u64) {
                    return None;
                }
                let mut all = AlignedBuf::new(data_at);
                if read_upto(&file, all.as_mut(), 0).ok()? < data_at {
                    return None;
                }
                all.as_ref().to_vec()
            };
            match parse_table(&whole, frames, frame, sealed, codec, size - data_at.min(size as usize) as u64) {
                Ok((ends, seals)) => return Some(Frames { file, data_at: data_at as u64, ends, frame, len, trace_crc, seals, codec, arrival }),
                Err(why) => why,
            }
        }
        Err(why) => why,
    };
    tracing::debug!(dir = %dir.display(), why, "ws.lz4 not used; ws.pages is read");
    None
}

struct Header {
    frames: usize,
    frame: usize,
    sealed: bool,
    codec: Codec,
}

/// Where the frames' data starts: after the header, the table of `frames` entries and
/// its crc, at the next page boundary.
fn data_start(frames: usize, sealed: bool) -> usize {
    (HEADER + frames * entry_len(sealed) + 4).div_ceil(PAGE_SIZE as usize) * PAGE_SIZE as usize
}

/// Decompresses frames: one decoder for a read's frames.
enum Decoder {
    Lz4,
    Zstd(zstd::bulk::Decompressor<'static>),
}

impl Decoder {
    fn new(codec: Codec) -> Result<Decoder, String> {
        Ok(match codec {
            Codec::Lz4 => Decoder::Lz4,
            Codec::Zstd => Decoder::Zstd(zstd::bulk::Decompressor::new().map_err(|e| format!("a zstd decoder: {e}"))?),
        })
    }

    /// Frame `f`'s stored bytes `stored` decompressed into `out`, which they must fill
    /// exactly.
    fn frame(&mut self, f: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
        let n = match self {
            Decoder::Lz4 => lz4_flex::block::decompress_into(stored, out).map_err(|e| e.to_string()),
            Decoder::Zstd(z) => z.decompress_to_buffer(stored, out).map_err(|e| e.to_string()),
        }
        .map_err(|e| format!("frame {f} of ws.lz4 does not decompress: {e}"))?;
        if n != out.len() {
            return Err(format!("frame {f} of ws.lz4 holds {n} bytes, not {}", out.len()));
        }
        Ok(())
    }
}

/// Sealed frame `f` (`stored`, with its nonce and tag `seal`, of the trace `trace_crc`
/// and the ws.pages of `len` bytes) opened in place with `sealer`.
fn open_sealed(sealer: &Sealer, seal: &Seal, trace_crc: u32, len: u64, f: usize, stored: &mut [u8]) -> Result<(), String> {
    let (nonce, tag) = seal;
    match sealer.open_frame(nonce, &aad(trace_crc, len, f), stored, tag) {
        true => Ok(()),
        false => Err(format!("frame {f} of ws.lz4 does not authenticate under the node key")),
    }
}

/// Bytes of a table entry.
fn entry_len(sealed: bool) -> usize {
    if sealed {
        8 + 12 + TAG_LEN
    } else {
        8
    }
}

/// What a sealed frame is bound to: where it belongs.
fn aad(trace_crc: u32, len: u64, frame: usize) -> [u8; 24] {
    let mut a = [0u8; 24];
    a[..8].copy_from_slice(MAGIC);
    a[8..12].copy_from_slice(&trace_crc.to_le_bytes());
    a[12..20].copy_from_slice(&len.to_le_bytes());
    a[20..24].copy_from_slice(&(frame as u32).to_le_bytes());
    a
}

fn parse_header(b: &[u8], trace_crc: u32, len: u64) -> Result<Header, &'static str> {
    if b.len() < HEADER || &b[..8] != MAGIC {
        return Err("bad magic");
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let (sealed, codec) = match u32_at(8) {
        VERSION => (false, Codec::Lz4),
        VERSION_SEALED => (true, Codec::Lz4),
        VERSION_ZSTD => (false, Codec::Zstd),
        VERSION_ZSTD_SEALED => (true, Codec::Zstd),
        _ => return Err("another version"),
    };
    if u32_at(12) != trace_crc {
        return Err("written for another trace");
    }
    if u64_at(16) != len {
        return Err("written for a ws.pages of another length");
    }
    let frame = u32_at(24) as usize;
    if frame == 0 || !frame.is_multiple_of(PAGE_SIZE as usize) || frame > 64 << 20 {
        return Err("bad frame size");
    }
    let frames = u32_at(28) as usize;
    if frames != (len as usize).div_ceil(frame) {
        return Err("frames do not cover ws.pages");
    }
    Ok(Header { frames, frame, sealed, codec })
}

/// The frames' ends (and seals) from the header and table `b` (at least up to its
/// crc), each frame no longer than its codec can make it and all of them within `data`
/// bytes.
fn parse_table(b: &[u8], frames: usize, frame: usize, sealed: bool, codec: Codec, data: u64) -> Result<(Vec<u64>, Option<Vec<Seal>>), &'static str> {
    let entry = entry_len(sealed);
    let end = HEADER + frames * entry;
    if b.len() < end + 4 {
        return Err("short header");
    }
    if crc32fast::hash(&b[..end]) != u32::from_le_bytes(b[end..end + 4].try_into().expect("4 bytes")) {
        return Err("header checksum mismatch");
    }
    let most = match codec {
        Codec::Lz4 => lz4_flex::block::get_maximum_output_size(frame),
        Codec::Zstd => zstd::zstd_safe::compress_bound(frame),
    } as u64;
    let mut prev = 0u64;
    let mut ends = Vec::with_capacity(frames);
    let mut seals = Vec::new();
    for i in 0..frames {
        let at = HEADER + i * entry;
        let e = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        if e < prev || e - prev > most || e > data {
            return Err("a frame out of bounds");
        }
        ends.push(e);
        prev = e;
        if sealed {
            seals.push((b[at + 8..at + 20].try_into().expect("12 bytes"), b[at + 20..at + 36].try_into().expect("16 bytes")));
        }
    }
    Ok((ends, sealed.then_some(seals)))
}

impl Frames {
    /// ws.pages' bytes per frame: a piece read from here is a whole number of them.
    pub fn frame_bytes(&self) -> usize {
        self.frame
    }

    /// Whether ws.pages' bytes `at..at + len` are whole frames (what [`Frames::read`] reads).
    pub fn whole_frames(&self, at: usize, len: usize) -> bool {
        let end = at + len;
        at.is_multiple_of(self.frame) && (end.is_multiple_of(self.frame) || end as u64 == self.len) && end as u64 <= self.len && len > 0
    }

    /// Whether its frames are sealed (they need the image's [`Sealer`]).
    pub fn sealed(&self) -> bool {
        self.seals.is_some()
    }

    /// How its frames are compressed.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// ws.pages' bytes `at..at + out.len()` (whole frames) decompressed into `out`:
    /// their frames read in one read. Returns the bytes read from the disk. Clear
    /// frames are unchecked (the caller checks the pages as ws.pages' are); sealed
    /// ones are opened with `sealer` first, and their pages come out clear.
    pub fn read(&self, at: usize, out: &mut [u8], sealer: Option<&Sealer>) -> Result<u64, String> {
        let end = at + out.len();
        if !self.whole_frames(at, out.len()) {
            return Err(format!("bytes {at}..{end} are not whole frames"));
        }
        let (f0, f1) = (at / self.frame, end.div_ceil(self.frame));
        let start = if f0 == 0 { 0 } else { self.ends[f0 - 1] };
        let stop = self.ends[f1 - 1];
        let page = PAGE_SIZE;
        if self.arrival.as_ref().is_some_and(|a| !a(self.data_at + stop)) {
            return Err("ws.lz4 did not arrive".into());
        }
        // O_DIRECT: whole pages, from a page boundary.
        let (a0, a1) = ((self.data_at + start) / page * page, (self.data_at + stop).div_ceil(page) * page);
        let mut buf = AlignedBuf::new((a1 - a0) as usize);
        let got = read_upto(&self.file, buf.as_mut(), a0).map_err(|e| format!("reading ws.lz4: {e}"))?;
        if (got as u64) < self.data_at + stop - a0 {
            return Err("ws.lz4 ends early".into());
        }
        let data = &mut buf.as_mut()[(self.data_at + start - a0) as usize..];
        let mut decoder = Decoder::new(self.codec)?;
        let mut from = 0usize;
        for (i, chunk) in out.chunks_mut(self.frame).enumerate() {
            let f = f0 + i;
            let to = (self.ends[f] - start) as usize;
            if let Some(seals) = &self.seals {
                let sealer = sealer.ok_or(NO_KEY)?;
                open_sealed(sealer, &seals[f], self.trace_crc, self.len, f, &mut data[from..to])?;
            }
            decoder.frame(f, &data[from..to], chunk)?;
            from = to;
        }
        Ok(got as u64)
    }
}

/// Read into `buf` from `at` until it is full or the file ends; the bytes read.
fn read_upto(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// ws.lz4 being made from ws.pages' pages as they are written ([`Writer::page`]).
pub struct Writer {
    frame: Vec<u8>,
    data: Vec<u8>,
    ends: Vec<u64>,
    len: u64,
}

impl Default for Writer {
    fn default() -> Writer {
        Writer { frame: Vec::with_capacity(FRAME), data: Vec::new(), ends: Vec::new(), len: 0 }
    }
}

impl Writer {
    /// The next page of ws.pages.
    pub fn page(&mut self, page: &[u8]) {
        self.frame.extend_from_slice(page);
        self.len += page.len() as u64;
        if self.frame.len() >= FRAME {
            self.seal_frame();
        }
    }

    fn seal_frame(&mut self) {
        self.data.extend_from_slice(&lz4_flex::block::compress(&self.frame));
        self.ends.push(self.data.len() as u64);
        self.frame.clear();
    }

    /// The whole file for the trace whose crc is `trace_crc`, its frames sealed with
    /// `sealer` if given (the pages written were clear), or `None` when it would not
    /// save a quarter of ws.pages (or ws.pages is empty, or no nonce could be drawn).
    pub fn finish(mut self, trace_crc: u32, sealer: Option<&Sealer>) -> Option<Vec<u8>> {
        if !self.frame.is_empty() {
            self.seal_frame();
        }
        if self.len == 0 || self.data.len() as u64 * WORTH.1 as u64 > self.len * WORTH.0 as u64 {
            return None;
        }
        let Writer { mut data, ends, len, .. } = self;
        assemble(Codec::Lz4, trace_crc, len, FRAME, &mut data, &ends, sealer)
    }
}

/// The whole file: header, table and the frames `data` (ending at `ends`, holding
/// `len` bytes of ws.pages, `frame` per frame), sealed in place with `sealer` if given.
/// `None` if no nonce could be drawn.
fn assemble(codec: Codec, trace_crc: u32, len: u64, frame: usize, data: &mut [u8], ends: &[u64], sealer: Option<&Sealer>) -> Option<Vec<u8>> {
    let mut seals = Vec::new();
    if let Some(s) = sealer {
        let mut from = 0usize;
        for (f, &end) in ends.iter().enumerate() {
            seals.push(s.seal_frame(&aad(trace_crc, len, f), &mut data[from..end as usize]).ok()?);
            from = end as usize;
        }
    }
    let version = match (codec, sealer.is_some()) {
        (Codec::Lz4, false) => VERSION,
        (Codec::Lz4, true) => VERSION_SEALED,
        (Codec::Zstd, false) => VERSION_ZSTD,
        (Codec::Zstd, true) => VERSION_ZSTD_SEALED,
    };
    let mut h = Vec::with_capacity(HEADER + ends.len() * entry_len(sealer.is_some()) + 4 + data.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&trace_crc.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&(frame as u32).to_le_bytes());
    h.extend_from_slice(&(ends.len() as u32).to_le_bytes());
    for (f, e) in ends.iter().enumerate() {
        h.extend_from_slice(&e.to_le_bytes());
        if let Some((n, t)) = seals.get(f) {
            h.extend_from_slice(n);
            h.extend_from_slice(t);
        }
    }
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h.resize(h.len().div_ceil(PAGE_SIZE as usize) * PAGE_SIZE as usize, 0);
    h.extend_from_slice(data);
    Some(h)
}

/// ws.lz4's bytes `file` (LZ4 frames, as a node writes them) with each frame compressed
/// by zstd instead: what a snapshot store keeps (see the module's doc). Sealed frames are
/// opened with `sealer` and sealed again (new nonces, bound where they were). Checks
/// the header and each frame as a read would: `Err` names what did not (a sealed file
/// without its key, a frame that does not authenticate or decompress), `Ok(None)` when
/// there is nothing to gain (already zstd, or no smaller). Not on a restore's path: it
/// decompresses and compresses the whole working set (lrserving's 10 MB: ~40 ms).
pub fn recompress_zstd(file: &[u8], sealer: Option<&Sealer>) -> Result<Option<Vec<u8>>, String> {
    if file.len() < HEADER {
        return Err("ws.lz4 is shorter than its header".into());
    }
    let trace_crc = u32::from_le_bytes(file[12..16].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(file[16..24].try_into().expect("8 bytes"));
    let Header { frames, frame, sealed, codec } = parse_header(file, trace_crc, len)?;
    if codec == Codec::Zstd {
        return Ok(None);
    }
    let data_at = data_start(frames, sealed);
    if file.len() < data_at {
        return Err("ws.lz4 is shorter than its table".into());
    }
    let (ends, seals) = parse_table(file, frames, frame, sealed, codec, (file.len() - data_at) as u64)?;
    let sealer = match (sealed, sealer) {
        (false, _) => None,
        (true, Some(s)) => Some(s),
        (true, None) => return Err(NO_KEY.into()),
    };
    let mut zip = zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(|e| format!("a zstd encoder: {e}"))?;
    let mut decoder = Decoder::new(codec)?;
    let (mut out, mut out_ends) = (Vec::new(), Vec::with_capacity(frames));
    let mut raw = vec![0u8; frame];
    let mut from = 0usize;
    for (f, &end) in ends.iter().enumerate() {
        let mut stored = file[data_at + from..data_at + end as usize].to_vec();
        if let (Some(s), Some(seals)) = (sealer, &seals) {
            open_sealed(s, &seals[f], trace_crc, len, f, &mut stored)?;
        }
        let want = frame.min((len - (f * frame) as u64) as usize);
        decoder.frame(f, &stored, &mut raw[..want])?;
        out.extend_from_slice(&zip.compress(&raw[..want]).map_err(|e| format!("compressing frame {f}: {e}"))?);
        out_ends.push(out.len() as u64);
        from = end as usize;
    }
    if out.len() >= from {
        return Ok(None);
    }
    assemble(Codec::Zstd, trace_crc, len, frame, &mut out, &out_ends, sealer).map(Some).ok_or_else(|| "no nonce could be drawn".to_string())
}

/// Write `bytes` (from [`Writer::finish`]) to `tmp`, synced if `durable`.
pub fn write_tmp(tmp: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let mut f = File::create(tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn pages(n: usize) -> Vec<u8> {
        // Compressible, and different page to page.
        (0..n * PAGE_SIZE as usize).map(|i| ((i / 4096) as u8).wrapping_mul(7) ^ ((i % 64) as u8)).collect()
    }

    fn written(dir: &Path, raw: &[u8], crc: u32) {
        std::fs::write(dir.join(FILE), frames(raw, crc, None).expect("compressible")).unwrap();
    }

    /// ws.lz4 for the pages `raw` (LZ4 frames, as a node writes them).
    fn frames(raw: &[u8], crc: u32, sealer: Option<&Sealer>) -> Option<Vec<u8>> {
        let mut w = Writer::default();
        for p in raw.chunks(PAGE_SIZE as usize) {
            w.page(p);
        }
        w.finish(crc, sealer)
    }

    #[test]
    fn frames_read_back_as_the_pages_in_any_whole_frame_range() {
        let d = tempfile::tempdir().unwrap();
        // 2.5 frames: the last one short.
        let raw = pages(160);
        written(d.path(), &raw, 7);
        let lz4 = std::fs::read(d.path().join(FILE)).unwrap();
        let zstd = recompress_zstd(&lz4, None).unwrap().expect("smaller");
        assert!(zstd.len() < lz4.len(), "{} vs {}", zstd.len(), lz4.len());
        assert_eq!(recompress_zstd(&zstd, None).unwrap(), None, "already zstd");
        for (codec, file) in [(Codec::Lz4, &lz4), (Codec::Zstd, &zstd)] {
            std::fs::write(d.path().join(FILE), file).unwrap();
            for cached in [true, false] {
                let z = open(d.path(), cached, 7, raw.len() as u64, None).expect("opens");
                assert_eq!(z.codec(), codec);
                for (at, end) in [(0, raw.len()), (0, FRAME), (FRAME, 2 * FRAME), (2 * FRAME, raw.len()), (FRAME, raw.len())] {
                    let mut out = AlignedBuf::new(end - at);
                    z.read(at, out.as_mut(), None).unwrap();
                    assert!(out.as_ref() == &raw[at..end], "{codec:?} {at}..{end}");
                }
                let mut out = vec![0u8; 4096];
                assert!(z.read(4096, &mut out, None).is_err(), "not a frame's start");
            }
        }
    }

    #[test]
    fn a_damaged_zstd_frame_or_a_sealed_file_without_its_key_is_an_error_never_a_panic() {
        let d = tempfile::tempdir().unwrap();
        let raw = pages(160);
        written(d.path(), &raw, 7);
        let lz4 = std::fs::read(d.path().join(FILE)).unwrap();
        let mut zstd = recompress_zstd(&lz4, None).unwrap().expect("smaller");
        // A byte of the first frame's data changed: zstd's own checks (or the length)
        // refuse it, or it decodes to other bytes (the caller's CRCs refuse those).
        let z = open(d.path(), true, 7, raw.len() as u64, None).unwrap();
        let at = z.data_at as usize + 20;
        zstd[at] ^= 0x5a;
        std::fs::write(d.path().join(FILE), &zstd).unwrap();
        let z = open(d.path(), true, 7, raw.len() as u64, None).expect("the header is intact");
        let mut out = vec![0u8; FRAME];
        match z.read(0, &mut out, None) {
            Ok(_) => assert!(out != raw[..FRAME], "a changed byte changes the output"),
            Err(e) => assert!(e.contains("frame 0"), "{e}"),
        }
        // Sealed: recompressed only with the key, and then sealed again.
        let key = crate::seal::NodeKey::from_bytes([3; 32]);
        let sealer = Sealer::new(&key).unwrap();
        let sealed = frames(&raw, 7, Some(&sealer)).unwrap();
        assert!(recompress_zstd(&sealed, None).unwrap_err().contains("no key"));
        let other = Sealer::new(&key).unwrap();
        assert!(recompress_zstd(&sealed, Some(&other)).unwrap_err().contains("does not authenticate"));
        let sealed_zstd = recompress_zstd(&sealed, Some(&sealer)).unwrap().expect("smaller");
        std::fs::write(d.path().join(FILE), &sealed_zstd).unwrap();
        let z = open(d.path(), true, 7, raw.len() as u64, None).unwrap();
        assert!(z.sealed() && z.codec() == Codec::Zstd);
        let mut all = AlignedBuf::new(raw.len());
        assert!(z.read(0, all.as_mut(), None).unwrap_err().contains("no key"));
        assert!(z.read(0, all.as_mut(), Some(&other)).unwrap_err().contains("does not authenticate"));
        z.read(0, all.as_mut(), Some(&sealer)).unwrap();
        assert!(all.as_ref() == &raw[..]);
        // Cut short: refused, not read past.
        assert!(recompress_zstd(&lz4[..lz4.len() - 10], None).is_err());
        assert!(recompress_zstd(&lz4[..20], None).is_err());
    }

    #[test]
    fn frames_still_arriving_are_read_once_written_and_never_before() {
        let d = tempfile::tempdir().unwrap();
        let raw = pages(160);
        written(d.path(), &raw, 7);
        let file = std::fs::read(d.path().join(FILE)).unwrap();
        // Written up to `upto` (as a store's fill would), the rest zeros.
        let upto = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (u, a) = (upto.clone(), asked.clone());
        let arrival: Arrival = std::sync::Arc::new(move |end| {
            a.lock().unwrap().push(end);
            end <= u.load(std::sync::atomic::Ordering::SeqCst)
        });
        let show = |n: usize| {
            let mut partial = file[..n].to_vec();
            partial.resize(file.len(), 0);
            std::fs::write(d.path().join(FILE), &partial).unwrap();
            upto.store(n as u64, std::sync::atomic::Ordering::SeqCst);
        };
        show(0);
        assert!(open(d.path(), true, 7, raw.len() as u64, Some(arrival.clone())).is_none(), "no header yet: not opened");
        show(PAGE_SIZE as usize);
        let z = open(d.path(), true, 7, raw.len() as u64, Some(arrival)).expect("the header is here");
        // The first frame's bytes written, the second's not: the first reads, the
        // second is refused (never read as the zeros the file holds there).
        show(z.data_at as usize + z.ends[0] as usize);
        let mut out = AlignedBuf::new(FRAME);
        z.read(0, out.as_mut(), None).unwrap();
        assert_eq!(out.as_ref(), &raw[..FRAME]);
        assert_eq!(z.read(FRAME, out.as_mut(), None).unwrap_err(), "ws.lz4 did not arrive");
        assert_eq!(*asked.lock().unwrap().last().unwrap(), z.data_at + z.ends[1], "asked for exactly the frame's end");
        show(file.len());
        z.read(FRAME, out.as_mut(), None).unwrap();
        assert_eq!(out.as_ref(), &raw[FRAME..2 * FRAME]);
    }

    #[test]
    fn another_trace_or_length_or_a_bad_header_is_not_used() {
        let d = tempfile::tempdir().unwrap();
        let raw = pages(70);
        written(d.path(), &raw, 7);
        assert!(open(d.path(), true, 8, raw.len() as u64, None).is_none(), "another trace");
        assert!(open(d.path(), true, 7, raw.len() as u64 - 4096, None).is_none(), "another length");
        let mut b = std::fs::read(d.path().join(FILE)).unwrap();
        b[HEADER] ^= 1;
        std::fs::write(d.path().join(FILE), &b).unwrap();
        assert!(open(d.path(), true, 7, raw.len() as u64, None).is_none(), "its checksum");
        std::fs::write(d.path().join(FILE), &b[..100]).unwrap();
        assert!(open(d.path(), true, 7, raw.len() as u64, None).is_none(), "cut short");
    }

    #[test]
    fn a_damaged_frame_is_an_error_or_other_bytes_never_a_panic() {
        let d = tempfile::tempdir().unwrap();
        let raw = pages(64);
        written(d.path(), &raw, 1);
        let mut b = std::fs::read(d.path().join(FILE)).unwrap();
        let at = PAGE_SIZE as usize + 40;
        b[at] ^= 0xff;
        std::fs::write(d.path().join(FILE), &b).unwrap();
        let z = open(d.path(), true, 1, raw.len() as u64, None).expect("the header is intact");
        let mut out = vec![0u8; raw.len()];
        match z.read(0, &mut out, None) {
            Ok(_) => assert!(out != raw, "a changed byte changes the output"),
            Err(e) => assert!(e.contains("frame 0"), "{e}"),
        }
    }

    /// `n` bytes no compressor shrinks (xorshift).
    pub(crate) fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn incompressible_pages_are_not_written() {
        assert!(frames(&noise(8 * 4096), 0, None).is_none());
        assert!(Writer::default().finish(0, None).is_none(), "nothing to write");
    }

    #[test]
    fn sealed_frames_open_only_with_the_image_key_and_where_they_belong() {
        let d = tempfile::tempdir().unwrap();
        let raw = pages(130);
        let key = crate::seal::NodeKey::from_bytes([7; 32]);
        let sealer = Sealer::new(&key).unwrap();
        let file = frames(&raw, 9, Some(&sealer)).expect("compressible");
        std::fs::write(d.path().join(FILE), &file).unwrap();
        let z = open(d.path(), true, 9, raw.len() as u64, None).expect("opens");
        assert!(z.sealed());
        let mut out = AlignedBuf::new(raw.len());
        z.read(0, out.as_mut(), Some(&sealer)).unwrap();
        assert!(out.as_ref() == &raw[..]);
        assert!(z.read(0, out.as_mut(), None).unwrap_err().contains("no key"));
        // Another image's key (same node key, another salt) opens nothing.
        let other = Sealer::new(&key).unwrap();
        assert!(z.read(0, out.as_mut(), Some(&other)).unwrap_err().contains("does not authenticate"));
        // The header rewritten to name another trace (its crc32 fixed: no secret
        // needed): the frames are bound to the trace they were written for.
        let mut moved = file.clone();
        moved[12..16].copy_from_slice(&10u32.to_le_bytes());
        let crc_at = HEADER + z.ends.len() * entry_len(true);
        let crc = crc32fast::hash(&moved[..crc_at]);
        moved[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(d.path().join(FILE), &moved).unwrap();
        let z2 = open(d.path(), true, 10, raw.len() as u64, None).expect("the header checks");
        assert!(z2.read(0, out.as_mut(), Some(&sealer)).unwrap_err().contains("does not authenticate"));
        // A frame given another frame's seal does not authenticate either.
        let mut swapped = file.clone();
        let (a, b, n) = (HEADER + 8, HEADER + entry_len(true) + 8, 12 + TAG_LEN);
        let first: Vec<u8> = swapped[a..a + n].to_vec();
        swapped.copy_within(b..b + n, a);
        swapped[b..b + n].copy_from_slice(&first);
        let crc = crc32fast::hash(&swapped[..crc_at]);
        swapped[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(d.path().join(FILE), &swapped).unwrap();
        let z3 = open(d.path(), true, 9, raw.len() as u64, None).expect("the header checks");
        let mut one = AlignedBuf::new(FRAME);
        assert!(z3.read(0, one.as_mut(), Some(&sealer)).is_err());
    }
}
