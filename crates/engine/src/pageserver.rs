//! The userfaultfd page server: serves a restored process's anonymous memory
//! from the image.
//!
//! A node's few shared page-server threads (see [`shared`]; `THAW_PAGESERVER=thread`:
//! one thread per restored process, plus one per forked child, as before issue #33)
//! wait on the userfaultfds and the processes' pidfds. Each missing-page fault is
//! resolved from the image: the faulting address is translated through the
//! [`AddressSpace`] (which follows munmap/madvise/mremap events so that memory
//! the process released is never refilled with stale image contents), looked
//! up in the page index, read from `pages.img`, checked against its CRC and
//! installed with UFFDIO_COPY. Addresses without stored contents get a zero page.
//!
//! Invariant: if the server cannot serve a fault (read error, bad checksum,
//! unexpected ioctl failure) it kills the process. A restored process never runs
//! on memory the image did not provide.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::Path;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;
use tracing::{debug, error, warn};

use crate::image::PageIndex;
use crate::pagefiles::PageFiles;
use crate::seal::Sealer;
use crate::sys::mem;
use crate::sys::uffd::{self, Event, Install};
use crate::sys::PAGE_SIZE;
use crate::ws::{Touch, WorkingSet};

pub mod shared;

#[derive(Debug, Error)]
pub enum PageServerError {
    #[error("page at {addr:#x} (image page {file_page}) failed its checksum: the image is corrupt")]
    Checksum { addr: u64, file_page: u64 },
    #[error("page at {addr:#x} (image page {file_page}) does not authenticate under the node key: the image was tampered with")]
    Forged { addr: u64, file_page: u64 },
    #[error("reading image page {file_page} for {addr:#x}")]
    Read { addr: u64, file_page: u64, #[source] source: io::Error },
    #[error("userfaultfd {op} at {addr:#x}")]
    Uffd { op: &'static str, addr: u64, #[source] source: io::Error },
    #[error("polling the userfaultfd")]
    Poll(#[source] io::Error),
}

/// How memory is provided before the process resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Paging {
    /// Prefetch if the snapshot has a valid working set, else record one.
    Auto,
    /// Nothing up front; every first touch of a page faults and reads it.
    Lazy,
    /// Every stored page is installed before the process resumes.
    Eager,
    /// Lazy, and log the pages the first invocation touches into a working set (REAP).
    Record,
    /// Read the working set with one O_DIRECT read and install it before resuming;
    /// the rest is served lazily (REAP).
    Prefetch,
    /// Like prefetch, but the working set is read through the page cache.
    WsCached,
    /// No working-set file: several readers fetch the traced pages from the image
    /// concurrently (single-page reads) before resuming.
    Parallel,
}

impl Paging {
    pub const ALL: [&'static str; 7] = ["auto", "lazy", "eager", "record", "prefetch", "ws-cached", "parallel"];

    pub fn name(&self) -> &'static str {
        match self {
            Paging::Auto => "auto",
            Paging::Lazy => "lazy",
            Paging::Eager => "eager",
            Paging::Record => "record",
            Paging::Prefetch => "prefetch",
            Paging::WsCached => "ws-cached",
            Paging::Parallel => "parallel",
        }
    }

    /// Modes that need a recorded working set.
    pub fn needs_ws(&self) -> bool {
        matches!(self, Paging::Prefetch | Paging::WsCached | Paging::Parallel)
    }
}

impl std::str::FromStr for Paging {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => Paging::Auto,
            "lazy" => Paging::Lazy,
            "eager" => Paging::Eager,
            "record" => Paging::Record,
            "prefetch" => Paging::Prefetch,
            "ws-cached" => Paging::WsCached,
            "parallel" => Paging::Parallel,
            other => return Err(format!("unknown paging mode '{other}' (expected one of {})", Paging::ALL.join(", "))),
        })
    }
}

/// How long the server keeps polling for the next fault before it sleeps
/// (`THAW_PAGESERVER_SPIN_US`, default 200 µs).
fn spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("THAW_PAGESERVER_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
        Duration::from_micros(us)
    })
}

/// Counters shared between the server threads and the caller.
#[derive(Debug, Default)]
pub struct Stats {
    pub faults: AtomicU64,
    /// Of those, faults on the image's pages (stored or zero): what a working set can
    /// hold. A page the process released since the restore (MADV_DONTNEED, munmap and
    /// mapped again) faults in zeros and is not one: no prefetch could have spared it.
    pub image_faults: AtomicU64,
    pub zero_faults: AtomicU64,
    pub bytes_read: AtomicU64,
    pub pages_installed_upfront: AtomicU64,
    pub events: AtomicU64,
    pub error: Mutex<Option<String>>,
    /// While set, every fault is appended to `trace` (REAP record mode).
    pub recording: AtomicBool,
    pub trace: Mutex<Vec<Touch>>,
    /// Set (before the process resumes) when the served ranges are registered for
    /// userfaultfd WP-async (see `reset`): pages are installed write-protected, so
    /// that faulting a page in is not writing it.
    pub wp_tracking: AtomicBool,
    /// Set (before the process resumes) when this instance's memory areas map the
    /// snapshot's shared memory file (see `sharedmem.rs`): stored pages there are
    /// mapped with UFFDIO_CONTINUE, not copied.
    pub maps_shared_memory: AtomicBool,
    /// Set with `maps_shared_memory` when the file is the base's (see
    /// `PageSource::shared`).
    pub maps_base_file: AtomicBool,
    /// Pages mapped from the shared memory file (CONTINUE) rather than copied.
    pub pages_shared: AtomicU64,
    /// Bumped by a reset: the server forgets what the process released since the
    /// restore and serves every registered address from the image again.
    pub space_epoch: AtomicU64,
    /// Pages being given back (see `giveback.rs`): `(start, end, image address of
    /// start)` of each MADV_DONTNEED the engine makes the stopped process run. Its
    /// removal event does not release the range (the process's own would): the range
    /// is served from the image again. Each entry is taken by its event.
    pub giving_back: Mutex<Vec<(u64, u64, u64)>>,
    /// Address-space events (not faults) read from the userfaultfds; `events` counts
    /// those applied. Equal: none is waiting in a queue (a give-back waits for that).
    pub events_read: AtomicU64,
    /// CPU time the server threads of this instance spent (serving faults is work
    /// done for the instance, outside its cgroup), and how long they were held back
    /// by the instance's fault budget.
    pub cpu_ns: AtomicU64,
    pub throttled_ns: AtomicU64,
    budget: Mutex<Option<FaultBudget>>,
}

/// Bounds the CPU the page server spends on one instance (a madvise/touch loop
/// would otherwise keep a node core busy outside the instance's CPU limit): a token
/// bucket of CPU time refilled at `rate` CPU-seconds per second (a share of the
/// instance's CPU limit) holding at most one [`FAULT_WINDOW`] of it. When it runs
/// dry the server waits before serving more: the faulting threads wait too, using
/// no CPU. Spinning for the next fault is CPU spent for the instance and counts.
#[derive(Debug)]
struct FaultBudget {
    rate: f64,
    tokens_ns: f64,
    refilled: Instant,
}

/// The rate is an average over this long: a server may spend `rate * FAULT_WINDOW`
/// at once, so a lazy cold start (a burst of faults well under a second) never waits.
pub const FAULT_WINDOW: Duration = Duration::from_secs(1);
/// The server charges its CPU time to the budget every this many faults.
const CHARGE_EVERY: u32 = 32;

impl Stats {
    /// Stats whose servers may use `cores` CPUs on average (after a burst); `None`
    /// or a non-positive value: unbounded (the time is still accounted).
    pub fn with_fault_budget(cores: Option<f64>) -> Stats {
        let budget = cores
            .filter(|c| *c > 0.0)
            .map(|rate| FaultBudget { rate, tokens_ns: rate * FAULT_WINDOW.as_nanos() as f64, refilled: Instant::now() });
        Stats { budget: Mutex::new(budget), ..Default::default() }
    }

    /// Charge `cpu_ns` of server CPU time; returns how long the server must wait.
    fn charge(&self, cpu_ns: u64) -> Option<Duration> {
        self.cpu_ns.fetch_add(cpu_ns, Ordering::Relaxed);
        let mut b = self.budget.lock().expect("budget lock");
        let b = b.as_mut()?;
        let now = Instant::now();
        let burst = b.rate * FAULT_WINDOW.as_nanos() as f64;
        b.tokens_ns = (b.tokens_ns + now.duration_since(b.refilled).as_nanos() as f64 * b.rate).min(burst) - cpu_ns as f64;
        b.refilled = now;
        // Waiting out the deficit refills the bucket to zero (at most a second per step).
        (b.tokens_ns < 0.0).then(|| Duration::from_nanos((-b.tokens_ns / b.rate).min(1e9) as u64))
    }

    fn fail(&self, e: &PageServerError) {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        *self.error.lock().expect("stats lock") = Some(msg);
    }
}

/// Read-around window of lazy faults, in pages: the kernel's default for a fault
/// on a mapped file (VM_READAHEAD_PAGES, 128 KiB), independent of the host disk's
/// read_ahead_kb so that measurements compare across hosts.
pub const DEFAULT_READAROUND_PAGES: u64 = 32;

/// Default bound of the page server's CPU per instance: half the instance's own CPU
/// limit, averaged over [`FAULT_WINDOW`] (a fault storm costs the node at most 1.5x
/// the instance's limit, instead of an extra full core whatever the limit).
pub const DEFAULT_FAULT_CPU_SHARE: f64 = 0.5;

/// The image pages of one snapshot, shared by every instance restored from it.
pub struct PageSource {
    pub index: PageIndex,
    file: PageFiles,
    /// Lazy faults read the aligned window of this many stored pages around the
    /// faulting page (1 = exactly one page per fault).
    readaround: AtomicU64,
    /// The image is sealed: every page read is decrypted (and authenticated) with this.
    sealer: Option<Arc<Sealer>>,
    /// CPU the page server may spend on one instance, as a share of the instance's
    /// CPU limit (f64 bits; 0 = unbounded). See [`FaultBudget`].
    fault_cpu_share: AtomicU64,
    /// The snapshot's shared memory file (see `sharedmem.rs`): a stored page in the
    /// ranges mapped from it is put in the file and mapped, not copied.
    shared_mem: Option<crate::sharedmem::SharedMemory>,
    /// Its base's file, for all diffs on that base in this process (see
    /// `SharedMemory::base_only`): an instance maps one or the other
    /// (`Stats::maps_base_file`).
    base_mem: Option<crate::sharedmem::SharedMemory>,
}

impl PageSource {
    /// Pages are read through the page cache, as a memory file mapped by a VMM
    /// would be (the lazy baseline REAP measures): a fault that misses reads its
    /// read-around window with one request, as the kernel's filemap fault does.
    pub fn new(index: PageIndex, file: impl Into<PageFiles>) -> PageSource {
        PageSource {
            index,
            file: file.into(),
            readaround: AtomicU64::new(DEFAULT_READAROUND_PAGES),
            sealer: None,
            fault_cpu_share: AtomicU64::new(DEFAULT_FAULT_CPU_SHARE.to_bits()),
            shared_mem: None,
            base_mem: None,
        }
    }

    /// Share this snapshot's memory between its instances through `mem` (see
    /// `sharedmem.rs`).
    pub fn with_shared(mut self, mem: crate::sharedmem::SharedMemory) -> PageSource {
        if mem.base_only() {
            self.base_mem = Some(mem);
        } else {
            self.shared_mem = Some(mem);
        }
        self
    }

    /// The shared memory file an instance may map (the base's if `base_file` and there
    /// is one, else the snapshot's), and the ranges it maps from it.
    pub fn shared(&self, base_file: bool) -> Option<(&Path, &[(u64, u64)])> {
        self.file_for(base_file).map(|m| (m.path(), m.ranges()))
    }

    fn file_for(&self, base_file: bool) -> Option<&crate::sharedmem::SharedMemory> {
        if base_file { self.base_mem.as_ref().or(self.shared_mem.as_ref()) } else { self.shared_mem.as_ref().or(self.base_mem.as_ref()) }
    }

    /// Whether the base's file can be mapped (the snapshot has one).
    pub fn has_base_file(&self) -> bool {
        self.base_mem.is_some()
    }

    /// The shared memory file the instance whose page server counts in `stats` maps.
    pub fn shared_memory(&self, stats: &Stats) -> Option<&crate::sharedmem::SharedMemory> {
        if !stats.maps_shared_memory.load(Ordering::Relaxed) {
            return None;
        }
        self.file_for(stats.maps_base_file.load(Ordering::Relaxed))
    }

    /// Whether the stored page of image address `img` is served from the shared memory
    /// file (for an instance that maps it, `stats.maps_shared_memory`).
    /// With a base's file (`SharedMemory::base_only`), only the base's pages are: a
    /// diff's own pages are copied.
    pub fn is_shared(&self, img: u64, stats: &Stats) -> bool {
        self.shared_memory(stats)
            .is_some_and(|m| m.maps(img) && (!m.base_only() || self.index.lookup(img).is_some_and(|fp| fp >= self.file.own_pages())))
    }

    /// Put verified page bytes of image addresses from `img` into the shared memory file.
    fn fill_shared(&self, img: u64, file_page: u64, bytes: &[u8], stats: &Stats) -> Result<(), PageServerError> {
        let mem = self.shared_memory(stats).expect("is_shared checked");
        mem.fill(img, bytes).map_err(|source| PageServerError::Read { addr: img, file_page, source })
    }

    /// Whether the page of image address `img` is already in the shared memory file.
    fn in_shared_file(&self, img: u64, stats: &Stats) -> bool {
        self.shared_memory(stats).is_some_and(|m| m.has(img))
    }

    /// Bound the page server's CPU per instance to `share` of the instance's CPU
    /// limit (after a burst); 0 = unbounded.
    pub fn set_fault_cpu_share(&self, share: f64) {
        self.fault_cpu_share.store(share.max(0.0).to_bits(), Ordering::Relaxed);
    }

    pub fn fault_cpu_share(&self) -> f64 {
        f64::from_bits(self.fault_cpu_share.load(Ordering::Relaxed))
    }

    /// The pages of a sealed image: decrypted with `sealer` as they are read.
    pub fn sealed(mut self, sealer: Option<Arc<Sealer>>) -> PageSource {
        self.sealer = sealer;
        self
    }

    /// Check stored page `file_page` (read for `addr`) against its CRC and, for a
    /// sealed image, decrypt it in place. Every page read from the image passes here.
    pub fn open_page(&self, addr: u64, file_page: u64, page: &mut [u8]) -> Result<(), PageServerError> {
        self.verify_page(addr, file_page, page)?;
        // A diff's base is never sealed (it holds nothing of any function).
        if let Some(s) = self.sealer.as_ref().filter(|_| file_page < self.file.own_pages()) {
            if !s.open_page(file_page, page, &self.index.tags[file_page as usize]) {
                return Err(PageServerError::Forged { addr, file_page });
            }
        }
        Ok(())
    }

    /// Check stored page `file_page` against its CRC (the stored bytes; no decryption).
    pub fn verify_page(&self, addr: u64, file_page: u64, page: &[u8]) -> Result<(), PageServerError> {
        if crc32fast::hash(page) != self.index.crcs[file_page as usize] {
            return Err(PageServerError::Checksum { addr, file_page });
        }
        Ok(())
    }

    /// The ciphers of a sealed image.
    pub fn sealer(&self) -> Option<&Sealer> {
        self.sealer.as_deref()
    }

    /// Whether pages must be decrypted (they cannot be installed straight from the file).
    pub fn is_sealed(&self) -> bool {
        self.sealer.is_some()
    }

    /// Set the read-around window of lazy faults, in pages (at least 1).
    pub fn set_readaround(&self, pages: u64) {
        self.readaround.store(pages.max(1), Ordering::Relaxed);
    }

    pub fn readaround(&self) -> u64 {
        self.readaround.load(Ordering::Relaxed)
    }

    /// Read and verify the stored page `file_page` for a fault at `addr`. The
    /// first fault in a read-around window reads the whole window with one
    /// request (into the page cache and `buf`); later faults in a window this
    /// instance already read are page-cache hits. Returns the page and the bytes
    /// newly requested from the image file.
    pub fn read_for_fault<'b>(
        &self,
        addr: u64,
        file_page: u64,
        buf: &'b mut Vec<u8>,
        windows_read: &mut std::collections::HashSet<u64>,
    ) -> Result<(&'b [u8], u64), PageServerError> {
        let ra = self.readaround();
        let window = file_page / ra;
        let page = PAGE_SIZE as usize;
        if ra == 1 || !windows_read.insert(window) {
            buf.resize(page, 0);
            self.read_page(addr, file_page, &mut buf[..page])?;
            return Ok((&buf[..page], if ra == 1 { PAGE_SIZE } else { 0 }));
        }
        let first = window * ra;
        let npages = ra.min(self.index.stored_pages() - first);
        buf.resize(npages as usize * page, 0);
        self.file
            .read_exact_at(buf, first * PAGE_SIZE)
            .map_err(|source| PageServerError::Read { addr, file_page, source })?;
        let at = (file_page - first) as usize * page;
        self.open_page(addr, file_page, &mut buf[at..at + page])?;
        Ok((&buf[at..at + page], npages * PAGE_SIZE))
    }

    /// Read and verify one stored page into `buf`.
    pub fn read_page(&self, addr: u64, file_page: u64, buf: &mut [u8]) -> Result<(), PageServerError> {
        self.read_pages(addr, file_page, buf)
    }

    /// Read and verify `buf.len() / PAGE_SIZE` consecutive stored pages starting at
    /// `file_page` (which back consecutive addresses from `addr`).
    pub fn read_pages(&self, addr: u64, file_page: u64, buf: &mut [u8]) -> Result<(), PageServerError> {
        self.file
            .read_exact_at(buf, file_page * PAGE_SIZE)
            .map_err(|source| PageServerError::Read { addr, file_page, source })?;
        for (k, page) in buf.chunks_exact_mut(PAGE_SIZE as usize).enumerate() {
            self.open_page(addr + k as u64 * PAGE_SIZE, file_page + k as u64, page)?;
        }
        Ok(())
    }

    /// The image's contents of the consecutive pages from `addr` into `buf` (whole
    /// pages): stored pages read and checked, each run of consecutive stored pages at
    /// once; the pages the image has no contents for, zeros.
    pub fn read_image(&self, addr: u64, buf: &mut [u8]) -> Result<(), PageServerError> {
        let page = PAGE_SIZE as usize;
        let n = buf.len() / page;
        let at = |k: usize| addr + k as u64 * PAGE_SIZE;
        let mut k = 0;
        while k < n {
            let Some(fp) = self.index.lookup(at(k)) else {
                buf[k * page..(k + 1) * page].fill(0);
                k += 1;
                continue;
            };
            let mut l = k + 1;
            while l < n && self.index.lookup(at(l)) == Some(fp + (l - k) as u64) {
                l += 1;
            }
            self.read_pages(at(k), fp, &mut buf[k * page..l * page])?;
            k = l;
        }
        Ok(())
    }

    pub fn file(&self) -> &PageFiles {
        &self.file
    }
}

/// Where the contents of each registered address come from now: image address =
/// address + delta, or `None` for "zero" (released or never stored).
#[derive(Debug, Clone, Default)]
pub struct AddressSpace {
    spans: BTreeMap<u64, (u64, Option<i64>)>,
}

impl AddressSpace {
    /// Identity mapping for the given ranges (as captured).
    pub fn identity(ranges: &[(u64, u64)]) -> AddressSpace {
        let mut s = AddressSpace::default();
        for &(a, b) in ranges {
            s.set(a, b, Some(0));
        }
        s
    }

    /// Image address holding the contents for `addr`, if any.
    pub fn resolve(&self, addr: u64) -> Option<u64> {
        let (_, &(end, delta)) = self.spans.range(..=addr).next_back()?;
        if addr >= end {
            return None;
        }
        delta.map(|d| (addr as i64 + d) as u64)
    }

    fn split_at(&mut self, p: u64) {
        if let Some((&s, &(e, d))) = self.spans.range(..p).next_back() {
            if e > p {
                self.spans.insert(s, (p, d));
                self.spans.insert(p, (e, d));
            }
        }
    }

    fn set(&mut self, start: u64, end: u64, delta: Option<i64>) {
        if start >= end {
            return;
        }
        self.split_at(start);
        self.split_at(end);
        let inside: Vec<u64> = self.spans.range(start..end).map(|(&k, _)| k).collect();
        for k in inside {
            self.spans.remove(&k);
        }
        self.spans.insert(start, (end, delta));
    }

    /// A page at or above 64 KiB (the usual mmap_min_addr) outside every range this
    /// space has ever tracked: a userfaultfd registration cannot cover it.
    pub fn untracked_page(&self) -> Option<u64> {
        let mut cand = 0x10000;
        for (&s, &(e, _)) in &self.spans {
            if cand < s {
                return Some(cand);
            }
            cand = cand.max(e);
        }
        (cand < 0x7fff_ffff_0000).then_some(cand)
    }

    /// The range was unmapped or discarded: later faults there read zeros.
    pub fn release(&mut self, start: u64, end: u64) {
        self.set(start, end, None);
    }

    /// `[start, end)` holds the image's contents from image address `img` on.
    pub fn map(&mut self, start: u64, end: u64, img: u64) {
        self.set(start, end, Some(img as i64 - start as i64));
    }

    /// mremap moved `[from, from+len)` to `[to, to+len)`.
    pub fn remap(&mut self, from: u64, to: u64, len: u64) {
        self.split_at(from);
        self.split_at(from + len);
        let moved: Vec<(u64, u64, Option<i64>)> =
            self.spans.range(from..from + len).map(|(&s, &(e, d))| (s, e, d)).collect();
        self.release(from, from + len);
        self.set(to, to + len, None);
        let shift = to as i64 - from as i64;
        for (s, e, d) in moved {
            self.set((s as i64 + shift) as u64, (e as i64 + shift) as u64, d.map(|d| d - shift));
        }
    }
}

/// A running page server for one restored process: its own thread (and one per forked
/// child), or an entry in one of the node's shared page-server threads (see
/// [`shared`]); [`PageServer::start`] picks by `THAW_PAGESERVER`.
pub struct PageServer {
    handle: Option<Handle>,
    pub stats: Arc<Stats>,
}

enum Handle {
    Thread { stop_tx: OwnedFd, thread: JoinHandle<()> },
    Shared(shared::Registration),
}

pub(crate) struct Serve {
    uffd: OwnedFd,
    pidfd: Arc<OwnedFd>,
    source: Arc<PageSource>,
    space: AddressSpace,
    stats: Arc<Stats>,
    /// Read-around windows of the image this process has already read.
    windows_read: std::collections::HashSet<u64>,
    /// Serving a forked child: the pidfd is the restored process's, so the child's
    /// end is noticed by probing its address space (see [`CHILD_PROBE`]).
    child: bool,
    /// The address space as restored, and the reset epoch `space` belongs to.
    initial: AddressSpace,
    epoch: u64,
    /// This thread's CPU time when it was last charged, and faults served since.
    cpu_mark: u64,
    since_charge: u32,
    /// Events read but not yet served, each with the reset epoch it belongs to (kept
    /// here while the fault budget holds the instance back).
    queue: VecDeque<(u64, Event)>,
}

/// What one pass over an instance's userfaultfd did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing was pending.
    Idle,
    /// Events were read and served.
    Served,
    /// The instance's fault budget is spent: serve it again after this long (the
    /// events read so far stay queued).
    Throttled(Duration),
}

/// CPU time of the calling thread, in nanoseconds (a system call: ~0.4 µs here).
pub(crate) fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// How often a forked child's server checks that the child's address space still
/// exists (it ends when the child exits or execs, instead of living as long as the
/// instance: a fork loop would otherwise pile up one server per fork).
const CHILD_PROBE: std::time::Duration = std::time::Duration::from_millis(100);

/// Events read from a userfaultfd at once.
const READ_BATCH: usize = 64;

impl PageServer {
    /// Start serving `uffd` (already registered) for the process behind `pidfd`.
    pub fn start(
        uffd: OwnedFd,
        pidfd: OwnedFd,
        source: Arc<PageSource>,
        space: AddressSpace,
        stats: Arc<Stats>,
    ) -> io::Result<PageServer> {
        let serve = Serve {
            uffd,
            pidfd: Arc::new(pidfd),
            source,
            initial: space.clone(),
            epoch: stats.space_epoch.load(Ordering::Acquire),
            space,
            stats: stats.clone(),
            windows_read: Default::default(),
            child: false,
            cpu_mark: 0,
            since_charge: 0,
            queue: VecDeque::new(),
        };
        if let Some(pool) = shared::pool() {
            let reg = pool.add(serve)?;
            return Ok(PageServer { handle: Some(Handle::Shared(reg)), stats });
        }
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let stop_rx = Arc::new(rx);
        let thread = std::thread::Builder::new().name("thaw-pageserver".into()).spawn(move || serve.run_thread(stop_rx))?;
        Ok(PageServer { handle: Some(Handle::Thread { stop_tx: tx, thread }), stats })
    }

    /// Stop serving (the process must already be dead or about to be killed). When
    /// this returns, nothing serves the process any more and its userfaultfd is closed.
    pub fn stop(&mut self) {
        match self.handle.take() {
            Some(Handle::Thread { stop_tx, thread }) => {
                drop(stop_tx);
                let _ = thread.join();
            }
            Some(Handle::Shared(reg)) => reg.remove(),
            None => {}
        }
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Serve {
    /// Serve on a thread of its own until the process exits or `stop_rx` is closed.
    fn run_thread(mut self, stop_rx: Arc<OwnedFd>) {
        self.cpu_mark = thread_cpu_ns();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve_thread(&stop_rx)));
        self.charge();
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(&e),
            Err(_) => self.fail(&PageServerError::Poll(io::Error::other("page server panicked"))),
        }
    }

    /// The instance cannot be served: record why and kill it (a restored process never
    /// runs on memory the image did not provide).
    pub(crate) fn fail(&self, err: &PageServerError) {
        error!(error = %err, "page server failed; killing the instance it served");
        self.stats.fail(err);
        let _ = mem::pidfd_kill(self.pidfd.as_fd());
    }

    fn serve_thread(&mut self, stop_rx: &Arc<OwnedFd>) -> Result<(), PageServerError> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut buf = Vec::with_capacity((self.source.readaround() * PAGE_SIZE) as usize);
        let mut forks = Vec::new();
        loop {
            let (uffd_ready, exited, stopped) = {
                let mut fds = [
                    PollFd::new(self.uffd.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN),
                    PollFd::new(stop_rx.as_fd(), PollFlags::POLLIN),
                ];
                let timeout = if self.child { PollTimeout::from(CHILD_PROBE.as_millis() as u16) } else { PollTimeout::NONE };
                match poll(&mut fds, timeout) {
                    Ok(0) if self.child => {
                        if self.child_gone() {
                            debug!("forked child is gone; its page server ends");
                            break;
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(PageServerError::Poll(e.into())),
                }
                let r = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
                (r(0), r(1), r(2))
            };
            if stopped || exited {
                break;
            }
            if !uffd_ready {
                continue;
            }
            // Faults come in bursts: after serving one, keep polling the descriptor
            // without sleeping for a short while. A sleep/wake-up round trip costs
            // tens of microseconds per fault on a VM, more than serving the fault.
            let mut idle_since = Instant::now();
            loop {
                let step = self.drain(&mut buf, &mut forks)?;
                for child in forks.drain(..) {
                    let stop_rx = stop_rx.clone();
                    // Detached: it ends with the child (or the instance).
                    drop(std::thread::Builder::new().name("thaw-ps-child".into()).spawn(move || child.run_thread(stop_rx)).map_err(PageServerError::Poll)?);
                }
                match step {
                    Step::Idle if idle_since.elapsed() > spin() => {
                        if let Some(wait) = self.charge() {
                            self.hold_back(wait, stop_rx);
                        }
                        break;
                    }
                    Step::Idle => std::hint::spin_loop(),
                    Step::Served => idle_since = Instant::now(),
                    Step::Throttled(wait) => {
                        self.hold_back(wait, stop_rx);
                        idle_since = Instant::now();
                    }
                }
            }
        }
        Ok(())
    }

    /// Wait out the fault budget's deficit on this thread (waking early if the server
    /// is stopped or the process exits): the faulting threads wait too.
    fn hold_back(&mut self, wait: Duration, stop_rx: &OwnedFd) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let t0 = Instant::now();
        let mut fds = [PollFd::new(stop_rx.as_fd(), PollFlags::POLLIN), PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(wait.as_millis().max(1)).unwrap_or(u16::MAX);
        let _ = poll(&mut fds, PollTimeout::from(ms));
        self.stats.throttled_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.cpu_mark = thread_cpu_ns();
    }

    /// A forked child's address space is gone (it exited or exec'd).
    pub(crate) fn child_gone(&self) -> bool {
        self.space.untracked_page().is_some_and(|p| !uffd::mm_alive(self.uffd.as_fd(), p))
    }

    /// One pass: read what is pending (at most [`READ_BATCH`] events) and serve it:
    /// faults, address-space events, and forks (a forked child's server is pushed to
    /// `forks` for the caller to run). Stops early when the instance's fault budget is
    /// spent; what was read stays queued for the next pass.
    pub(crate) fn drain(&mut self, buf: &mut Vec<u8>, forks: &mut Vec<Serve>) -> Result<Step, PageServerError> {
        if self.queue.is_empty() {
            self.read_queue()?;
            if self.queue.is_empty() {
                return Ok(Step::Idle);
            }
        }
        while let Some((epoch, ev)) = self.queue.pop_front() {
            match ev {
                Event::PageFault { addr, .. } => {
                    self.fault(addr & !(PAGE_SIZE - 1), buf, forks)?;
                    if self.since_charge >= CHARGE_EVERY {
                        if let Some(wait) = self.charge() {
                            return Ok(Step::Throttled(wait));
                        }
                    }
                }
                Event::Fork { ufd } => forks.push(self.fork_child(ufd)),
                other => self.apply(epoch, other),
            }
        }
        Ok(Step::Served)
    }

    /// Account this thread's CPU time since the mark to the instance; returns how long
    /// its fault budget says to hold it back, if it is spent.
    pub(crate) fn charge(&mut self) -> Option<Duration> {
        self.charge_until(thread_cpu_ns())
    }

    /// Charge the instance this thread's CPU time from its mark to `now` (a reading of
    /// [`thread_cpu_ns`]), and mark `now`.
    pub(crate) fn charge_until(&mut self, now: u64) -> Option<Duration> {
        self.since_charge = 0;
        let used = now.saturating_sub(self.cpu_mark);
        self.cpu_mark = now;
        self.stats.charge(used)
    }

    /// Start accounting this thread's CPU time to the instance from `now`.
    pub(crate) fn mark_cpu(&mut self, now: u64) {
        self.cpu_mark = now;
    }

    /// Read the pending events, each with the reset epoch it belongs to: the epoch as it
    /// was before the read. An event of the process blocks it until it is read, and a
    /// reset bumps the epoch only after its own calls (munmap...) have returned, so an
    /// event from before a reset is read before the bump, and one from after it (the
    /// process runs again only after the bump) is read after.
    fn read_queue(&mut self) -> Result<(), PageServerError> {
        let epoch = self.stats.space_epoch.load(Ordering::Acquire);
        let mut evs = Vec::with_capacity(READ_BATCH);
        uffd::read_events(self.uffd.as_fd(), &mut evs, READ_BATCH).map_err(PageServerError::Poll)?;
        let others = evs.iter().filter(|e| !matches!(e, Event::PageFault { .. })).count();
        self.stats.events_read.fetch_add(others as u64, Ordering::Release);
        self.queue.extend(evs.into_iter().map(|ev| (epoch, ev)));
        Ok(())
    }

    /// Follow resets up to `epoch`: the address space as restored (a reset forgets what
    /// the process released before it: the memory it put back is the image's). False
    /// for an epoch older than the one followed already.
    fn follow_epoch(&mut self, epoch: u64) -> bool {
        if self.child || epoch == self.epoch {
            return true;
        }
        if epoch < self.epoch {
            return false;
        }
        self.space = self.initial.clone();
        self.epoch = epoch;
        true
    }

    /// Apply an address-space event (munmap, madvise, mremap) of reset epoch `epoch`.
    /// One from before the last reset the server followed is dropped (the reset
    /// forgot it); one after a reset the server has not followed yet follows it first
    /// (else the first fault after it would forget this release: MADV_DONTNEED'd
    /// memory served the image's contents instead of zeros).
    fn apply(&mut self, epoch: u64, ev: Event) {
        if self.follow_epoch(epoch) {
            match ev {
                Event::Remove { start, end } if self.given_back(start, end) => {}
                Event::Remove { start, end } | Event::Unmap { start, end } => self.space.release(start, end),
                Event::Remap { from, to, len } => self.space.remap(from, to, len),
                Event::Unknown(kind) => warn!(kind, "unknown userfaultfd event"),
                Event::PageFault { .. } | Event::Fork { .. } => {}
            }
        }
        // Counted once applied (a give-back waits for every event read to be).
        self.stats.events.fetch_add(1, Ordering::Release);
    }

    /// Whether `[start, end)` is a range the engine is giving back (its removal
    /// expected, see [`Stats::giving_back`]): then it maps the image again.
    fn given_back(&mut self, start: u64, end: u64) -> bool {
        // A forked child's removals are its own (it has its own memory).
        if self.child {
            return false;
        }
        let mut list = self.stats.giving_back.lock().expect("giving_back lock");
        let Some(i) = list.iter().position(|&(s, e, _)| (s, e) == (start, end)) else {
            return false;
        };
        let (_, _, img) = list.swap_remove(i);
        self.space.map(start, end, img);
        true
    }

    /// The server of a child the process forked (UFFD_EVENT_FORK: its own userfaultfd).
    fn fork_child(&mut self, ufd: i32) -> Serve {
        self.stats.events.fetch_add(1, Ordering::Relaxed);
        debug!("serving a forked child");
        Serve {
            uffd: uffd::own_fd(ufd),
            pidfd: self.pidfd.clone(),
            source: self.source.clone(),
            space: self.space.clone(),
            stats: self.stats.clone(),
            windows_read: self.windows_read.clone(),
            child: true,
            initial: self.initial.clone(),
            epoch: self.epoch,
            // Marked when it is first served (its own thread, or a shared one turning to it).
            cpu_mark: 0,
            since_charge: 0,
            queue: VecDeque::new(),
        }
    }

    fn fault(&mut self, page: u64, buf: &mut Vec<u8>, forks: &mut Vec<Serve>) -> Result<(), PageServerError> {
        self.stats.faults.fetch_add(1, Ordering::Relaxed);
        self.since_charge += 1;
        self.follow_epoch(self.stats.space_epoch.load(Ordering::Acquire));
        let wp = self.stats.wp_tracking.load(Ordering::Relaxed);
        let mut counted = false;
        // The image address of the page (None: released since the restore); resolved
        // again only after address-space events were applied (Install::Again).
        let mut img = self.space.resolve(page);
        self.stats.image_faults.fetch_add(u64::from(img.is_some()), Ordering::Relaxed);
        if self.stats.recording.load(Ordering::Relaxed) {
            if let Some(img) = img {
                let touch = Touch { vaddr: img, file_page: self.source.index.lookup(img) };
                self.stats.trace.lock().expect("trace lock").push(touch);
            }
        }
        loop {
            let stored = img.and_then(|img| self.source.index.lookup(img).map(|fp| (img, fp)));
            let r = match stored {
                Some((img, fp)) if self.source.is_shared(img, &self.stats) => {
                    // Into the shared file once, then mapped from it (the VMA keeps the file
                    // offset it was restored with, also after a mremap).
                    if !self.source.in_shared_file(img, &self.stats) {
                        let (bytes, fetched) = self.source.read_for_fault(page, fp, buf, &mut self.windows_read)?;
                        if !counted {
                            self.stats.bytes_read.fetch_add(fetched, Ordering::Relaxed);
                        }
                        self.source.fill_shared(img, fp, bytes, &self.stats)?;
                    }
                    self.stats.pages_shared.fetch_add(u64::from(!counted), Ordering::Relaxed);
                    uffd::continue_(self.uffd.as_fd(), page, PAGE_SIZE, true)
                }
                Some((_, fp)) => {
                    let (bytes, fetched) = self.source.read_for_fault(page, fp, buf, &mut self.windows_read)?;
                    if !counted {
                        self.stats.bytes_read.fetch_add(fetched, Ordering::Relaxed);
                    }
                    install(self.uffd.as_fd(), page, bytes, wp)
                }
                None => {
                    if !counted {
                        self.stats.zero_faults.fetch_add(1, Ordering::Relaxed);
                    }
                    // An image zero page is installed clean (write-protected); a page
                    // the process released since the restore (or reset) is not: its
                    // contents differ from the image, so a reset must rewrite it.
                    if wp && img.is_some() {
                        install(self.uffd.as_fd(), page, &ZERO_PAGE, true)
                    } else {
                        uffd::zeropage(self.uffd.as_fd(), page, PAGE_SIZE, true)
                    }
                }
            }
            .map_err(|source| PageServerError::Uffd { op: "install", addr: page, source })?;
            counted = true;
            match r {
                Install::Done | Install::Gone => return Ok(()),
                Install::Exists => {
                    let _ = uffd::wake(self.uffd.as_fd(), page, PAGE_SIZE);
                    return Ok(());
                }
                // A non-cooperative event is pending: read and apply the address-space
                // events first (faults stay queued), then resolve this page again.
                Install::Again { .. } => {
                    self.read_queue()?;
                    let pending: Vec<(u64, Event)> = self.queue.drain(..).collect();
                    for (epoch, ev) in pending {
                        match ev {
                            Event::PageFault { .. } => self.queue.push_back((epoch, ev)),
                            Event::Fork { ufd } => forks.push(self.fork_child(ufd)),
                            other => self.apply(epoch, other),
                        }
                    }
                    std::thread::yield_now();
                    img = self.space.resolve(page);
                }
            }
        }
    }
}

static ZERO_PAGE: [u8; PAGE_SIZE as usize] = [0; PAGE_SIZE as usize];

/// Install one page (and wake its waiters), write-protected if `wp`. A range that
/// refuses write protection (not registered for it) gets the page unprotected,
/// which only makes a later reset rewrite it.
fn install(fd: std::os::fd::BorrowedFd<'_>, page: u64, bytes: &[u8], wp: bool) -> io::Result<Install> {
    if wp {
        match uffd::copy_wp(fd, page, bytes.as_ptr(), PAGE_SIZE, true) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            other => return other,
        }
    }
    uffd::copy(fd, page, bytes.as_ptr(), PAGE_SIZE, true)
}

/// Copy `bytes` to `[dst, dst+len)` before the process runs: one UFFDIO_COPY for
/// the run, continuing past pages that are already present.
fn copy_run(uffd_fd: &OwnedFd, dst: u64, bytes: &[u8]) -> Result<u64, PageServerError> {
    let len = bytes.len() as u64;
    let mut done = 0;
    let mut installed = 0;
    while done < len {
        let r = uffd::copy(uffd_fd.as_fd(), dst + done, bytes[done as usize..].as_ptr(), len - done, false)
            .map_err(|source| PageServerError::Uffd { op: "copy", addr: dst + done, source })?;
        match r {
            Install::Done => {
                installed += len - done;
                break;
            }
            Install::Exists => done += PAGE_SIZE,
            Install::Again { copied } if copied > 0 => {
                done += copied;
                installed += copied;
            }
            other => {
                return Err(PageServerError::Uffd {
                    op: "copy",
                    addr: dst + done,
                    source: io::Error::other(format!("unexpected {other:?} before the process ran")),
                })
            }
        }
    }
    Ok(installed / PAGE_SIZE)
}

/// Install verified stored pages `bytes` (from stored page `file_page` on) at `dst`
/// before the process runs: through the shared memory file if `dst` is mapped from it,
/// else copied. Returns the pages installed.
fn install_run(uffd_fd: &OwnedFd, source: &PageSource, stats: &Stats, dst: u64, file_page: u64, bytes: &[u8]) -> Result<u64, PageServerError> {
    if source.is_shared(dst, stats) {
        source.fill_shared(dst, file_page, bytes, stats)?;
        continue_run(uffd_fd, dst, bytes.len() as u64 / PAGE_SIZE, stats)
    } else {
        copy_run(uffd_fd, dst, bytes)
    }
}

/// Map `npages` pages at `dst` from the shared memory file (UFFDIO_CONTINUE; they are
/// in it), before the process runs. Returns the pages mapped.
fn continue_run(uffd_fd: &OwnedFd, dst: u64, npages: u64, stats: &Stats) -> Result<u64, PageServerError> {
    let len = npages * PAGE_SIZE;
    let mut done = 0;
    while done < len {
        let r = uffd::continue_(uffd_fd.as_fd(), dst + done, len - done, false)
            .map_err(|source| PageServerError::Uffd { op: "continue", addr: dst + done, source })?;
        match r {
            Install::Done => done = len,
            Install::Exists => done += PAGE_SIZE,
            Install::Again { copied } if copied > 0 => done += copied,
            other => {
                return Err(PageServerError::Uffd {
                    op: "continue",
                    addr: dst + done,
                    source: io::Error::other(format!("unexpected {other:?} before the process ran")),
                })
            }
        }
    }
    stats.pages_shared.fetch_add(npages, Ordering::Relaxed);
    Ok(npages)
}

/// Figures of a working-set prefetch.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PrefetchStats {
    pub ws_pages: u64,
    pub ws_zero_pages: u64,
    pub ws_bytes: u64,
    /// Bytes this restore read from the disk for it (ws.lz4's frames are fewer than
    /// `ws_bytes`; 0 when another restore of the burst read it).
    pub disk_bytes: u64,
    pub read_ms: f64,
    pub install_ms: f64,
    pub copies: u64,
    /// The working set was installed from a copy another restore of the same burst
    /// had read (single flight): nothing was read from disk for this instance.
    pub shared: bool,
    /// Its read failed midway: only the pieces before were installed.
    pub partial: bool,
}

/// REAP prefetch: install the working set (read into `pages`, laid out by vaddr,
/// piece by piece as it arrives: each piece is installed as soon as it is here, while
/// the next is read) with one UFFDIO_COPY per contiguous run within a piece, and map
/// its zero pages. A piece that never comes (its read failed; the reader logs why)
/// ends the install there: what is installed is the image's, checked, and the page
/// server serves the rest (`PrefetchStats::partial`). The caller accounts the bytes
/// read (once per burst, see `restore::SharedWs`). `vma_starts`: sorted start
/// addresses of the VMAs; a UFFDIO_COPY must not cross one.
pub fn install_ws(
    uffd_fd: &OwnedFd,
    ws: &WorkingSet,
    pages: &crate::ws::Arriving,
    vma_starts: &[u64],
    source: &PageSource,
    stats: &Stats,
) -> Result<PrefetchStats, PageServerError> {
    let t0 = Instant::now();
    let mut ps = PrefetchStats { ws_bytes: pages.len() as u64, ..Default::default() };
    let shared = |k: usize| source.is_shared(ws.layout[k].0, stats);
    let page = PAGE_SIZE as usize;
    let mut waited = std::time::Duration::ZERO;
    for piece in 0..pages.pieces() {
        let w = Instant::now();
        let got = pages.wait(piece);
        waited += w.elapsed();
        let buf = match got {
            Ok(b) => b,
            Err(why) => {
                debug!(piece, why, "the working set's read failed; the page server serves the rest");
                ps.partial = true;
                break;
            }
        };
        let (lo, hi) = (pages.start(piece) / page, pages.start(piece) / page + buf.len() / page);
        let mut i = lo;
        while i < hi {
            let mut j = i + 1;
            while j < hi && ws.layout[j].0 == ws.layout[j - 1].0 + PAGE_SIZE && vma_starts.binary_search(&ws.layout[j].0).is_err() && shared(j) == shared(i) {
                j += 1;
            }
            let bytes = &buf[(i - lo) * page..(j - lo) * page];
            ps.ws_pages += install_run(uffd_fd, source, stats, ws.layout[i].0, ws.layout[i].1, bytes)?;
            ps.copies += 1;
            i = j;
        }
    }
    for &z in &ws.zeros {
        if uffd::zeropage(uffd_fd.as_fd(), z, PAGE_SIZE, false)
            .map_err(|source| PageServerError::Uffd { op: "zeropage", addr: z, source })?
            == Install::Done
        {
            ps.ws_zero_pages += 1;
        }
    }
    stats.pages_installed_upfront.fetch_add(ps.ws_pages + ps.ws_zero_pages, Ordering::Relaxed);
    ps.install_ms = (t0.elapsed() - waited).as_secs_f64() * 1e3;
    Ok(ps)
}

/// The `parallel` variant: `readers` threads fetch the traced pages from the
/// image with single-page reads and install them, before the process resumes.
pub fn install_parallel(
    uffd_fd: &OwnedFd,
    source: &PageSource,
    trace: &[Touch],
    readers: usize,
    stats: &Stats,
) -> Result<PrefetchStats, PageServerError> {
    let t0 = Instant::now();
    let readers = readers.max(1);
    let results: Vec<Result<(u64, u64), PageServerError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                s.spawn(move || {
                    let mut buf = vec![0u8; PAGE_SIZE as usize];
                    let (mut pages, mut zeros) = (0, 0);
                    for t in trace.iter().skip(r).step_by(readers) {
                        match t.file_page {
                            Some(fp) => {
                                source.read_page(t.vaddr, fp, &mut buf)?;
                                pages += install_run(uffd_fd, source, stats, t.vaddr, fp, &buf)?;
                            }
                            None => {
                                let r = uffd::zeropage(uffd_fd.as_fd(), t.vaddr, PAGE_SIZE, false)
                                    .map_err(|source| PageServerError::Uffd { op: "zeropage", addr: t.vaddr, source })?;
                                zeros += u64::from(r == Install::Done);
                            }
                        }
                    }
                    Ok((pages, zeros))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(PageServerError::Poll(io::Error::other("reader panicked"))))).collect()
    });
    let mut ps = PrefetchStats::default();
    for r in results {
        let (p, z) = r?;
        ps.ws_pages += p;
        ps.ws_zero_pages += z;
    }
    ps.ws_bytes = ps.ws_pages * PAGE_SIZE;
    stats.bytes_read.fetch_add(ps.ws_bytes, Ordering::Relaxed);
    stats.pages_installed_upfront.fetch_add(ps.ws_pages + ps.ws_zero_pages, Ordering::Relaxed);
    ps.install_ms = t0.elapsed().as_secs_f64() * 1e3;
    Ok(ps)
}

/// Install specific pages (page-aligned addresses) from the image before the
/// process runs; pages the image does not store become zero pages.
pub fn install_pages(uffd_fd: &OwnedFd, source: &PageSource, pages: &[u64], stats: &Stats) -> Result<(), PageServerError> {
    let mut buf = vec![0u8; PAGE_SIZE as usize];
    for &page in pages {
        let r = match source.index.lookup(page) {
            Some(fp) if source.is_shared(page, stats) => {
                source.read_page(page, fp, &mut buf)?;
                stats.bytes_read.fetch_add(PAGE_SIZE, Ordering::Relaxed);
                source.fill_shared(page, fp, &buf, stats)?;
                stats.pages_shared.fetch_add(1, Ordering::Relaxed);
                uffd::continue_(uffd_fd.as_fd(), page, PAGE_SIZE, false)
            }
            Some(fp) => {
                source.read_page(page, fp, &mut buf)?;
                stats.bytes_read.fetch_add(PAGE_SIZE, Ordering::Relaxed);
                uffd::copy(uffd_fd.as_fd(), page, buf.as_ptr(), PAGE_SIZE, false)
            }
            None => uffd::zeropage(uffd_fd.as_fd(), page, PAGE_SIZE, false),
        }
        .map_err(|source| PageServerError::Uffd { op: "install", addr: page, source })?;
        if r == Install::Done {
            stats.pages_installed_upfront.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Install every stored page that falls in `ranges` before the process runs.
/// Returns the number of pages installed.
pub fn install_all(
    uffd_fd: &OwnedFd,
    source: &PageSource,
    ranges: &[(u64, u64)],
    stats: &Stats,
) -> Result<u64, PageServerError> {
    let t0 = Instant::now();
    let map = source
        .file()
        .map(source.index.stored_pages())
        .map_err(|e| PageServerError::Read { addr: 0, file_page: 0, source: e })?;
    let mut installed = 0;
    let mut plain = Vec::new();
    for run in &source.index.runs {
        let run_end = run.vaddr + run.npages * PAGE_SIZE;
        for &(a, b) in ranges {
            let s = run.vaddr.max(a);
            let e = run_end.min(b);
            if s >= e {
                continue;
            }
            let fp = run.file_page + (s - run.vaddr) / PAGE_SIZE;
            let n = (e - s) / PAGE_SIZE;
            let stored = map.pages(fp, n);
            let bytes = if source.is_sealed() {
                // Decrypted into a private buffer: the mapping is the file, read-only.
                plain.clear();
                plain.extend_from_slice(stored);
                for (k, page) in plain.chunks_exact_mut(PAGE_SIZE as usize).enumerate() {
                    source.open_page(s + k as u64 * PAGE_SIZE, fp + k as u64, page)?;
                }
                &plain[..]
            } else {
                for (k, page) in stored.chunks_exact(PAGE_SIZE as usize).enumerate() {
                    source.verify_page(s + k as u64 * PAGE_SIZE, fp + k as u64, page)?;
                }
                stored
            };
            // `ranges` are single VMAs: the whole piece is shared or not.
            installed += install_run(uffd_fd, source, stats, s, fp, bytes)?;
        }
    }
    stats.bytes_read.fetch_add(installed * PAGE_SIZE, Ordering::Relaxed);
    stats.pages_installed_upfront.fetch_add(installed, Ordering::Relaxed);
    debug!(pages = installed, ms = t0.elapsed().as_secs_f64() * 1e3, "installed pages up front");
    Ok(installed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    /// A page source of `n` pages (page k filled with byte k) backing 0x10000.. .
    fn source(n: u64) -> (tempfile::NamedTempFile, PageSource) {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let mut index = PageIndex::default();
        for k in 0..n {
            let page = vec![k as u8; PAGE_SIZE as usize];
            f.write_all(&page).unwrap();
            index.push(0x10000 + k * PAGE_SIZE, crc32fast::hash(&page));
        }
        let file = File::open(f.path()).unwrap();
        (f, PageSource::new(index, file))
    }

    /// A server of `space` whose descriptors are placeholders: enough for what the
    /// address-space bookkeeping touches (no fault is served).
    fn bookkeeper(space: AddressSpace, stats: Arc<Stats>) -> Serve {
        let (_f, src) = source(1);
        let fd = || OwnedFd::from(File::open("/dev/null").unwrap());
        Serve {
            uffd: fd(),
            pidfd: Arc::new(fd()),
            source: Arc::new(src),
            initial: space.clone(),
            epoch: stats.space_epoch.load(Ordering::Acquire),
            space,
            stats,
            windows_read: Default::default(),
            child: false,
            cpu_mark: 0,
            since_charge: 0,
            queue: VecDeque::new(),
        }
    }

    /// Each event applies to the reset epoch it was read in: one from before a reset
    /// the server followed is dropped (the reset put that memory back), and one from
    /// after a reset the server has not followed yet follows it first (else the next
    /// fault would forget the release: the bug of 4969f3b).
    #[test]
    fn events_apply_to_the_epoch_they_were_read_in() {
        let stats = Arc::new(Stats::default());
        let mut s = bookkeeper(AddressSpace::identity(&[(0x10000, 0x20000)]), stats.clone());
        let page = |n: u64| 0x10000 + n * PAGE_SIZE;
        let released = |s: &Serve, n: u64| s.space.resolve(page(n)).is_none();
        s.apply(0, Event::Remove { start: page(0), end: page(1) });
        assert!(released(&s, 0));
        // A reset (epoch 1); an event read before it still belongs to epoch 0.
        stats.space_epoch.store(1, Ordering::Release);
        s.apply(0, Event::Unmap { start: page(1), end: page(2) });
        assert!(released(&s, 1), "read before the reset: applied to the old space");
        // An event read after the reset: the server follows the reset first.
        s.apply(1, Event::Remove { start: page(3), end: page(4) });
        assert!(!released(&s, 0) && !released(&s, 1), "the reset put back what was released before it");
        assert!(released(&s, 3), "released after the reset, before any fault: reads zeros");
        // A late event of epoch 0 after following epoch 1 is dropped.
        s.apply(0, Event::Remove { start: page(5), end: page(6) });
        assert!(!released(&s, 5));
        // A fault follows the epoch too, keeping what epoch 1 released.
        assert!(s.follow_epoch(1));
        assert!(released(&s, 3));
        assert!(!s.follow_epoch(0), "an older epoch is not followed");
        assert_eq!(stats.events.load(Ordering::Relaxed), 4);
    }

    /// A removal the engine announced as a give-back maps the image again (at the
    /// address announced, also where the process had released the page before, or
    /// where mremap moved it); any other removal still releases; each announcement is
    /// taken once.
    #[test]
    fn a_removal_announced_as_a_give_back_maps_the_image_again() {
        let stats = Arc::new(Stats::default());
        let mut s = bookkeeper(AddressSpace::identity(&[(0x10000, 0x20000)]), stats.clone());
        let page = |n: u64| 0x10000 + n * PAGE_SIZE;
        s.apply(0, Event::Remove { start: page(2), end: page(3) });
        assert_eq!(s.space.resolve(page(2)), None);
        stats.giving_back.lock().unwrap().extend([(page(1), page(3), page(1)), (page(8), page(9), page(4))]);
        s.apply(0, Event::Remove { start: page(1), end: page(3) });
        assert_eq!((s.space.resolve(page(1)), s.space.resolve(page(2))), (Some(page(1)), Some(page(2))));
        // Not announced (a different range): the process's own release.
        s.apply(0, Event::Remove { start: page(8), end: page(10) });
        assert_eq!(s.space.resolve(page(8)), None);
        s.apply(0, Event::Remove { start: page(8), end: page(9) });
        assert_eq!(s.space.resolve(page(8)), Some(page(4)), "mapped to the image address announced");
        assert!(stats.giving_back.lock().unwrap().is_empty(), "each announcement taken once");
        s.apply(0, Event::Remove { start: page(1), end: page(3) });
        assert_eq!(s.space.resolve(page(1)), None, "a later removal of the same range releases");
        // A forked child's removal is its own, even of a range announced for the process.
        let mut child = bookkeeper(AddressSpace::identity(&[(0x10000, 0x20000)]), stats.clone());
        child.child = true;
        stats.giving_back.lock().unwrap().push((page(5), page(6), page(5)));
        child.apply(0, Event::Remove { start: page(5), end: page(6) });
        assert_eq!(child.space.resolve(page(5)), None);
        assert_eq!(stats.giving_back.lock().unwrap().len(), 1, "left for the process's own server");
        // Every event applied is counted (a give-back waits until all read are).
        assert_eq!(stats.events.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn lazy_faults_read_whole_windows_once() {
        let (_f, src) = source(40);
        assert_eq!(src.readaround(), DEFAULT_READAROUND_PAGES);
        let (mut buf, mut seen) = (Vec::new(), std::collections::HashSet::new());
        let mut fault = |fp: u64| {
            let (page, fetched) = src.read_for_fault(0x10000 + fp * PAGE_SIZE, fp, &mut buf, &mut seen).unwrap();
            assert!(page.len() == PAGE_SIZE as usize && page.iter().all(|&b| b == fp as u8), "page {fp}");
            fetched
        };
        assert_eq!(fault(5), 32 * PAGE_SIZE, "first fault reads its 128 KiB window");
        assert_eq!(fault(6), 0, "same window: a page-cache hit");
        assert_eq!(fault(35), 8 * PAGE_SIZE, "the last window ends with the file");
        assert_eq!(fault(31), 0);

        src.set_readaround(1);
        let (mut buf, mut seen) = (Vec::new(), std::collections::HashSet::new());
        for fp in [5, 6, 5] {
            let (_, fetched) = src.read_for_fault(0x10000 + fp * PAGE_SIZE, fp, &mut buf, &mut seen).unwrap();
            assert_eq!(fetched, PAGE_SIZE, "one page per fault");
        }
    }

    #[test]
    fn a_corrupt_page_fails_its_fault_but_not_its_window_neighbours() {
        let (f, src) = source(4);
        let raw = std::fs::OpenOptions::new().write(true).open(f.path()).unwrap();
        raw.write_all_at(b"x", 2 * PAGE_SIZE + 7).unwrap();
        let (mut buf, mut seen) = (Vec::new(), std::collections::HashSet::new());
        assert!(src.read_for_fault(0x11000, 1, &mut buf, &mut seen).is_ok());
        let e = src.read_for_fault(0x12000, 2, &mut buf, &mut seen).unwrap_err();
        assert!(matches!(e, PageServerError::Checksum { addr: 0x12000, file_page: 2 }), "{e}");
    }

    #[test]
    fn identity_then_release_then_remap() {
        let mut s = AddressSpace::identity(&[(0x1000, 0x9000)]);
        assert_eq!(s.resolve(0x2000), Some(0x2000));
        assert_eq!(s.resolve(0x9000), None);
        assert_eq!(s.resolve(0x0), None);
        s.release(0x3000, 0x5000);
        assert_eq!(s.resolve(0x3000), None);
        assert_eq!(s.resolve(0x4fff), None);
        assert_eq!(s.resolve(0x5000), Some(0x5000));
        assert_eq!(s.resolve(0x2fff), Some(0x2fff));
        // Move [0x5000,0x7000) to 0x20000: contents follow, the source reads zero.
        s.remap(0x5000, 0x20000, 0x2000);
        assert_eq!(s.resolve(0x20000), Some(0x5000));
        assert_eq!(s.resolve(0x21000), Some(0x6000));
        assert_eq!(s.resolve(0x22000), None);
        assert_eq!(s.resolve(0x5000), None);
        assert_eq!(s.resolve(0x7000), Some(0x7000));
        // A remap whose source has a released hole keeps the hole.
        s.remap(0x2000, 0x40000, 0x3000);
        assert_eq!(s.resolve(0x40000), Some(0x2000));
        assert_eq!(s.resolve(0x41000), None);
        assert_eq!(s.resolve(0x42000), None);
    }

    #[test]
    fn paging_parses() {
        assert_eq!("lazy".parse::<Paging>().unwrap(), Paging::Lazy);
        assert_eq!("eager".parse::<Paging>().unwrap(), Paging::Eager);
        assert_eq!("ws-cached".parse::<Paging>().unwrap(), Paging::WsCached);
        assert_eq!(
            "fast".parse::<Paging>().unwrap_err(),
            "unknown paging mode 'fast' (expected one of auto, lazy, eager, record, prefetch, ws-cached, parallel)"
        );
        for name in Paging::ALL {
            assert_eq!(name.parse::<Paging>().unwrap().name(), name);
        }
    }
}
