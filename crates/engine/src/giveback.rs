//! Giving back the pages an idle instance copied but holds unchanged (issue #31).
//!
//! The instances of a snapshot opened with sharing map its memory privately from
//! the snapshot's shared memory file (`sharedmem.rs`): a page an instance writes
//! becomes its own copy, the rest stay the file's, one copy for all. Much of what a
//! call writes it leaves as it found it: CPython's reference counts go up and come
//! down again. Measured after one call of Python helloworld: 196 copied pages, 92 of
//! them byte for byte the file's page. Giving back drops those copies
//! (MADV_DONTNEED, asked by the stopped instance of itself: every run in one
//! process_madvise, [`madvise_batched`]): the pages are the file's
//! again, and a later touch maps the file's page (a minor fault the page server
//! answers with UFFDIO_CONTINUE; a write then copies it again, as the first did).
//!
//! Why nothing the instance can see changes:
//! * every thread is stopped from the comparison to the madvise: a copy cannot
//!   change in between (an instance's other processes have memory of their own);
//! * only pages in the file are compared (stored image pages, put there once and
//!   never written again; with a base's file, only the base's pages), against the
//!   page at the mapping's own offset, which is what a private file mapping reads
//!   once its copy is dropped (the offset survives mremap);
//! * the page server would take the removal for the process's own release (served
//!   as zeros from then on): each range is announced first (`Stats::giving_back`),
//!   and the server, meeting its removal event, maps the image there again instead.
//!   The madvise returns only once its event was read; the engine waits until the
//!   server has taken every announced range before the instance runs again.
//!
//! On any error the instance is killed (the caller discards it): never resumed with
//! a range half given back.
//!
//! By hand: no crate knows a userfaultfd-served shared file; the pieces are ours
//! (threads, inject, the page server's address space).

use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;
use tracing::debug;

use crate::inject::{self, Call, InjectError};
use crate::pageserver::{PageSource, Stats};
use crate::procfs;
use crate::sharedmem::SharedMemory;
use crate::sys::mem::{ProcMem, IOV_MAX};
use crate::sys::pagemap::Pagemap;
use crate::sys::ptrace::{self, Tracee};
use crate::sys::PAGE_SIZE;

#[derive(Debug, Error)]
pub enum GiveBackError {
    #[error("instance {pid}: {what}")]
    Io { pid: i32, what: String, #[source] source: io::Error },
    #[error("instance {pid}: dropping the copies")]
    Inject { pid: i32, #[source] source: InjectError },
    #[error("instance {pid}: the page server did not take {left} of the ranges given back within {waited:?}")]
    NotTaken { pid: i32, left: usize, waited: Duration },
}

/// What one give-back found and did.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct GiveBackStats {
    /// Pages of the shared file's mappings the instance holds copies of.
    pub copied: u64,
    /// Of those, equal to the file's page and given back.
    pub given_back: u64,
    /// madvise calls (runs of consecutive pages).
    pub runs: u64,
    /// All runs in one process_madvise (and one more to populate them), not two
    /// injected madvise calls per run.
    pub batched: bool,
    pub ms: f64,
}

/// madvise(2): fault the range in as reads would (Linux 5.14).
const MADV_POPULATE_READ: u64 = 22;

/// process_madvise(2)'s pidfd for the calling thread's own process (Linux 6.14);
/// since Linux 6.13 a process may ask any advice of itself (MADV_DONTNEED too).
const PIDFD_SELF_THREAD: u64 = -10000i64 as u64;
/// What the kernel leaves alone below a stack pointer (the x86-64 red zone).
const RED_ZONE: u64 = 128;

/// Whether runs go in one process_madvise per kind (`THAW_GIVE_BACK_BATCH=0`: two
/// madvise calls per run, as before; the baseline of an A/B run).
fn batched_enabled() -> bool {
    std::env::var("THAW_GIVE_BACK_BATCH").as_deref() != Ok("0")
}

/// Drop every run, and map the readable ones again, with two process_madvise calls
/// the instance makes on itself (PIDFD_SELF_THREAD, up to [`IOV_MAX`] runs each),
/// not two injected madvise calls per run: each injection is a ptrace stop and wake
/// (~50 us here), so a give-back of helloworld's 77 runs took 7 ms that way. The
/// ranges (iovecs) are written below the main thread's stack pointer, past the red
/// zone, where nothing of the process lives while it is stopped (the kernel puts
/// signal frames there), and that memory is written back as it was afterwards.
/// Returns false, having changed nothing, where this cannot be done: that stack
/// memory not present (writing it would fault a page in), or a kernel that refuses
/// process_madvise on itself or MADV_DONTNEED through it; the caller then goes run
/// by run. A refusal after some runs were dropped is an error.
#[allow(clippy::too_many_arguments)]
fn madvise_batched(
    pid: i32,
    main: &Tracee,
    insn: u64,
    maps: &[procfs::MapEntry],
    regs: &libc::user_regs_struct,
    runs: &[(u64, u64, u64)],
    readable: &[bool],
    pagemap: &Pagemap,
) -> Result<bool, GiveBackError> {
    let ioe = |what: &str| {
        let what = what.to_string();
        move |source| GiveBackError::Io { pid, what, source }
    };
    let len = runs.len().min(IOV_MAX) * 16;
    let top = regs.rsp.saturating_sub(RED_ZONE) & !15;
    let at = top.saturating_sub(len as u64) & !15;
    // Anonymous memory (a thread's stack), never the shared file's mappings.
    let within = maps.iter().any(|m| m.start <= at && top <= m.end && m.read && m.write && !m.shared && m.inode == 0);
    let first = at / PAGE_SIZE * PAGE_SIZE;
    let pages = (top.div_ceil(PAGE_SIZE) * PAGE_SIZE - first) / PAGE_SIZE;
    if !within || !pagemap.present(first, pages as usize).map_err(ioe("reading pagemap"))?.iter().all(|&p| p) {
        debug!(pid, at = format_args!("{at:#x}"), "no stack memory to write the ranges to; giving back run by run");
        return Ok(false);
    }
    let mem = ProcMem::open(pid, true).map_err(ioe("opening memory for writing"))?;
    let mut kept = vec![0u8; (top - at) as usize];
    mem.read_exact_at(&mut kept, at).map_err(ioe("reading the stack"))?;
    let ask = Asking { pid, main, insn, mem: &mem, at };
    let r = (|| {
        for (i, batch) in runs.chunks(IOV_MAX).enumerate() {
            let drop = batch.iter().map(|&(s, e, _)| (s, e));
            match ask.advise(drop, libc::MADV_DONTNEED as u64, "process_madvise(MADV_DONTNEED)") {
                Ok(()) => {}
                // Refused before anything was dropped: this kernel cannot; run by run.
                Err(Refusal::Kernel(errno)) if i == 0 => {
                    debug!(pid, errno, "process_madvise on itself refused; giving back run by run");
                    return Ok(false);
                }
                Err(Refusal::Kernel(errno)) => {
                    let source = io::Error::from_raw_os_error(errno);
                    return Err(GiveBackError::Io { pid, what: "process_madvise(MADV_DONTNEED) refused midway".into(), source });
                }
                Err(Refusal::Fatal(e)) => return Err(e),
            }
            // Mapping them again is an optimisation: the page server serves whatever
            // a failed populate left to a later touch.
            let read = batch.iter().zip(&readable[i * IOV_MAX..]).filter(|&(_, &r)| r).map(|(&(s, e, _), _)| (s, e));
            match ask.advise(read, MADV_POPULATE_READ, "process_madvise(MADV_POPULATE_READ)") {
                Ok(()) => {}
                Err(Refusal::Kernel(errno)) => debug!(pid, errno, "populating the given-back pages failed; they fault in later"),
                Err(Refusal::Fatal(e)) => return Err(e),
            }
        }
        Ok(true)
    })();
    mem.write_all_at(&kept, at).map_err(ioe("writing the stack back"))?;
    r
}

/// Why an injected process_madvise did not do it all.
enum Refusal {
    /// The kernel returned this errno, having advised nothing.
    Kernel(i32),
    Fatal(GiveBackError),
}

/// A stopped instance asked to run process_madvise on itself: its thread `main`,
/// the `syscall` instruction at `insn`, and `at`, where the ranges are written.
struct Asking<'a> {
    pid: i32,
    main: &'a Tracee,
    insn: u64,
    mem: &'a ProcMem,
    at: u64,
}

impl Asking<'_> {
    /// Write `ranges` as iovecs and have the instance ask `advice` for them; Ok once
    /// every byte was advised.
    fn advise(&self, ranges: impl Iterator<Item = (u64, u64)>, advice: u64, name: &'static str) -> Result<(), Refusal> {
        let pid = self.pid;
        let mut iov = Vec::new();
        let mut total = 0u64;
        for (s, e) in ranges {
            iov.extend_from_slice(&s.to_le_bytes());
            iov.extend_from_slice(&(e - s).to_le_bytes());
            total += e - s;
        }
        if iov.is_empty() {
            return Ok(());
        }
        self.mem
            .write_all_at(&iov, self.at)
            .map_err(|source| Refusal::Fatal(GiveBackError::Io { pid, what: "writing the ranges".into(), source }))?;
        let call = Call::new(name, libc::SYS_process_madvise, &[PIDFD_SELF_THREAD, self.at, (iov.len() / 16) as u64, advice, 0]);
        match inject::single(self.main, self.insn, call) {
            Ok(n) if n as u64 == total => Ok(()),
            Ok(n) => Err(Refusal::Fatal(GiveBackError::Io {
                pid,
                what: format!("{name} advised {n} of {total} bytes"),
                source: io::ErrorKind::Other.into(),
            })),
            Err(InjectError::Syscall { err, .. }) => Err(Refusal::Kernel(err.raw_os_error().unwrap_or(libc::EINVAL))),
            Err(source) => Err(Refusal::Fatal(GiveBackError::Inject { pid, source })),
        }
    }
}

/// How long the engine waits for the page server to take the removals.
const TAKE_WAIT: Duration = Duration::from_secs(2);

/// Give back the unchanged copies instance `pid` (idle, not traced, not frozen) holds
/// of the pages of its snapshot's shared memory file (`source`'s); its page server
/// counts in `stats`. Nothing for a snapshot without one. On error the instance has
/// been killed.
pub fn give_back(pid: i32, source: &PageSource, stats: &Stats) -> Result<GiveBackStats, GiveBackError> {
    let Some(shared) = source.shared_memory(stats) else {
        return Ok(GiveBackStats::default());
    };
    let mut traced = Vec::new();
    let r = give_back_inner(pid, source, shared, stats, &mut traced);
    if let Err(e) = &r {
        debug!(pid, error = %e, "give-back failed; killing the instance");
        ptrace::kill_and_reap(pid, &traced);
        stats.giving_back.lock().expect("giving_back lock").clear();
    }
    r
}

fn give_back_inner(pid: i32, source: &PageSource, shared: &SharedMemory, stats: &Stats, traced: &mut Vec<Tracee>) -> Result<GiveBackStats, GiveBackError> {
    let t0 = Instant::now();
    let ioe = |what: &str| {
        let what = what.to_string();
        move |source| GiveBackError::Io { pid, what, source }
    };
    crate::threads::seize_all(pid, traced).map_err(|e| {
        let (what, source) = e.parts();
        GiveBackError::Io { pid, what, source }
    })?;
    let maps = procfs::maps(pid).map_err(ioe("reading maps"))?;
    let ino = shared.inode().map_err(ioe("reading the shared memory file's inode"))?;
    let pagemap = Pagemap::open(pid).map_err(ioe("opening pagemap"))?;
    let mem = ProcMem::open(pid, false).map_err(ioe("opening memory"))?;
    let mut out = GiveBackStats::default();
    // (start, end, image address of start): runs of equal pages, consecutive in the
    // process and in the file; and whether each is readable (mapped again at once).
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    let mut readable: Vec<bool> = Vec::new();
    let (mut mine, mut file) = (vec![0u8; PAGE_SIZE as usize], vec![0u8; PAGE_SIZE as usize]);
    // Private mappings of the file; not mlock'd ones (madvise refuses those).
    let of_file = |m: &&procfs::MapEntry| !m.shared && m.inode == ino && Path::new(&m.name) == shared.path() && !m.has_flag("lo");
    for m in maps.iter().filter(of_file) {
        // A run stays inside its mapping: the kernel reports a removal per mapping,
        // and the page server takes a range announced exactly.
        let first = runs.len();
        let mut copied = Vec::new();
        pagemap.copied(m.start, m.end, &mut copied).map_err(ioe("scanning pagemap"))?;
        for (s, e) in copied {
            for addr in (s..e).step_by(PAGE_SIZE as usize) {
                out.copied += 1;
                let img = m.offset + (addr - m.start);
                // Only where the file holds the image's own page (with a base's file,
                // not a diff's page: the file has the base's there).
                if !source.is_shared(img, stats) || !shared.read_page(img, &mut file).map_err(ioe("reading the shared memory file"))? {
                    continue;
                }
                mem.read_exact_at(&mut mine, addr).map_err(ioe(&format!("reading {addr:#x}")))?;
                if mine != file {
                    continue;
                }
                out.given_back += 1;
                let in_this_map = runs.len() > first;
                match runs.last_mut() {
                    Some(r) if in_this_map && r.1 == addr => r.1 += PAGE_SIZE,
                    _ => {
                        runs.push((addr, addr + PAGE_SIZE, img));
                        readable.push(m.read);
                    }
                }
            }
        }
    }
    let main = traced[0];
    // The process's own removals (read before it stopped) applied first: one still
    // queued could match a range announced below and be taken for it (that page then
    // released by ours). None comes while it is stopped.
    let settled = Instant::now();
    while stats.events.load(Ordering::Acquire) < stats.events_read.load(Ordering::Acquire) {
        if settled.elapsed() > TAKE_WAIT {
            debug!(pid, "the page server has events queued (its fault budget, most likely): nothing given back this time");
            runs.clear();
            out.given_back = 0;
            break;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    out.runs = runs.len() as u64;
    if !runs.is_empty() {
        let insn = inject::vdso_syscall(pid, &maps)
            .map_err(ioe("reading the vDSO"))?
            .ok_or_else(|| GiveBackError::Io { pid, what: "finding a syscall instruction".into(), source: io::ErrorKind::NotFound.into() })?;
        let saved = main.get_regs().map_err(ioe("GETREGS"))?;
        stats.giving_back.lock().expect("giving_back lock").extend(runs.iter().copied());
        let batched = batched_enabled() && madvise_batched(pid, &main, insn, &maps, &saved, &runs, &readable, &pagemap)?;
        if !batched {
            for (&(start, end, _), &read) in runs.iter().zip(&readable) {
                let call = Call::new("madvise(MADV_DONTNEED)", libc::SYS_madvise, &[start, end - start, libc::MADV_DONTNEED as u64]);
                inject::single(&main, insn, call).map_err(|source| GiveBackError::Inject { pid, source })?;
                // Mapped again from the file at once (read-only, shared; the page server
                // answers these minor faults now): the next call's touches of these pages
                // are no faults, its writes the kernel's copy on write, instead of a page
                // server round trip each (warm call after a give-back, helloworld: 1.6 ms
                // without this).
                if read {
                    let call = Call::new("madvise(MADV_POPULATE_READ)", libc::SYS_madvise, &[start, end - start, MADV_POPULATE_READ]);
                    inject::single(&main, insn, call).map_err(|source| GiveBackError::Inject { pid, source })?;
                }
            }
        }
        out.batched = batched;
        // Each madvise returned once its event was read; the server takes it when it
        // applies the event, which it does before serving any later fault.
        let waited = Instant::now();
        loop {
            let left = stats.giving_back.lock().expect("giving_back lock").len();
            if left == 0 {
                break;
            }
            if waited.elapsed() > TAKE_WAIT {
                return Err(GiveBackError::NotTaken { pid, left, waited: TAKE_WAIT });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        main.set_regs(&saved).map_err(ioe("SETREGS"))?;
    }
    for tr in traced.iter().rev() {
        tr.detach().map_err(ioe("PTRACE_DETACH"))?;
    }
    out.ms = t0.elapsed().as_secs_f64() * 1e3;
    debug!(pid, copied = out.copied, given_back = out.given_back, runs = out.runs, ms = out.ms, "gave back unchanged pages");
    Ok(out)
}
