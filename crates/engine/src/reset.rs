//! In-place reset: return a live restored instance to the state it was restored
//! into, so that whoever runs next sees nothing of whoever ran before.
//!
//! Tracking ([`arm`], at the end of a restore, before the process resumes): every
//! anonymous/copied range is registered with the page server's userfaultfd in
//! MISSING + WP mode and every file mapping in WP mode, on a descriptor set up
//! with WP-async; everything is then write-protected. The page server installs
//! pages write-protected (`UFFDIO_COPY_MODE_WP`), so faulting in is not writing.
//! The layout (maps), descriptor table and cwd at that point are the baseline.
//!
//! Reset ([`reset`]): what real handlers leave behind goes first (issue #30): the
//! sandbox's other processes (children, double-forked daemons) are killed, then every
//! thread is seized, the threads started since the restore end (each runs `exit`),
//! the killed children are reaped by the process itself (an injected `wait4`), and
//! POSIX timers created since are deleted. Anything we cannot put back is refused
//! with a [`ResetError`] and the instance is killed (fail closed: the caller
//! restores a fresh one). Otherwise: unmap mappings created since (the ended
//! threads' stacks among them), restore brk,
//! close new descriptors (the ended threads' and children's sockets, pipes, timerfds
//! among them), rewind file offsets, cwd, umask, a fresh /tmp; the
//! page server forgets released ranges; PAGEMAP_SCAN lists written pages, which
//! are rewritten from the image (or from the mapped file, or zero) and
//! write-protected again; every thread's registers, FPU/SIMD state and signal mask
//! are loaded from the image; detach.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;
use tracing::debug;

use crate::image::{ProcessImage, VmaKind};
use crate::inject::{self, Call, InjectError};
use crate::pageserver::{PageServerError, PageSource, Stats};
use crate::procfs::{self, MapEntry};
use crate::regs;
use crate::sys::mem::ProcMem;
use crate::sys::pagemap::Pagemap;
use crate::sys::ptrace::{self, Tracee};
use crate::sys::uffd::{self, Install};
use crate::sys::PAGE_SIZE;

#[derive(Debug, Error)]
pub enum ResetError {
    #[error("this instance is not tracked for reset: {0}")]
    NotTracked(String),
    #[error("instance {pid}: {what}")]
    Io { pid: i32, what: String, #[source] source: io::Error },
    #[error("instance {pid}: {found} threads, the snapshot had {expected} (threads started since are not reset)")]
    Threads { pid: i32, expected: usize, found: usize },
    #[error("instance {pid}: child processes were created since the restore and could not be ended: {what}")]
    Children { pid: i32, what: String },
    #[error("instance {pid}: signals are pending (thread {pending:#x}, process {shared:#x})")]
    PendingSignals { pid: i32, pending: u64, shared: u64 },
    #[error("instance {pid}: changed since the restore, and not put back by a reset: {what}")]
    Attributes { pid: i32, what: String },
    #[error("instance {pid}: the memory layout changed in a way a reset cannot rebuild: {what}")]
    Layout { pid: i32, what: String },
    #[error("instance {pid}: descriptor {fd} ({target}): {what}")]
    Fd { pid: i32, fd: i32, target: String, what: &'static str },
    #[error("instance {pid}: a written page at {addr:#x} belongs to a shared file mapping (the write reached the file)")]
    SharedWrite { pid: i32, addr: u64 },
    #[error("instance {pid}: reading image pages")]
    Pages { pid: i32, #[source] source: PageServerError },
    #[error("instance {pid}")]
    Inject { pid: i32, #[source] source: InjectError },
    #[error("instance {pid}: restoring /tmp")]
    Tmp { pid: i32, #[source] source: crate::tmpfs::TmpfsError },
}

/// What a restore recorded for later resets.
pub struct Tracking {
    /// A duplicate of the page server's userfaultfd.
    pub(crate) uffd: OwnedFd,
    /// Registered ranges: (start, end, served by the page server, image VMA index).
    pub(crate) ranges: Vec<Range>,
    /// /proc/PID/maps right after the restore, as text (a reset that finds the same
    /// text has no layout work) and parsed.
    maps_text: String,
    pub(crate) maps: Vec<MapEntry>,
    /// Address of a `syscall` instruction in the process's vDSO (for injection).
    pub(crate) syscall_insn: u64,
    /// Descriptor table right after the restore: fd -> link target.
    fds: HashMap<i32, String>,
    /// The kernel state of snapshot eventfds, epolls and signalfds right after the
    /// restore (fdinfo: counter, registrations, mask, flags): a reset refuses a change.
    fd_state: HashMap<i32, String>,
    cwd: PathBuf,
    /// Process attributes a reset does not put back, as /proc/PID/status shows them
    /// right after the restore: a difference refuses the reset.
    guarded: Vec<String>,
    /// /proc/PID/limits right after the restore: a difference puts the image's
    /// resource limits back.
    limits: String,
    /// Pages written by call after call, left writable by the resets (see [`Hot`]).
    hot: std::sync::Mutex<Hot>,
}

/// Pages every call writes: after a reset rewrites them, leaving them write-protected
/// only makes the next call take a fault on each first write (imagerotate: ~530 of
/// its ~650 minor faults a call). A page written in two calls in a row is left
/// writable by the resets that follow: the write tracking reports it written at every
/// reset (it has no write-protect bit), so every reset still rewrites it from the
/// image — what it holds never outlives a call — at the cost of rewriting it when a
/// call did not write it. Every [`RELEARN`]th reset protects everything again, so a
/// set that drifts (a function whose writes move) is learned again.
#[derive(Debug, Default)]
pub(crate) struct Hot {
    /// Runs left writable by the last reset.
    writable: Vec<(u64, u64)>,
    /// Runs written before the last reset, when it protected everything.
    last: Vec<(u64, u64)>,
    /// Resets since `writable` was chosen.
    since: u32,
}

/// Resets after which the hot pages are protected again and learned anew.
const RELEARN: u32 = 16;

impl Hot {
    /// Of the runs `written` since the last reset (sorted), those to write-protect
    /// again. `keep`: leave hot pages writable (per-invocation resets); else protect
    /// everything and forget them (a reset to a base, before another function).
    fn protect_after(&mut self, written: &[(u64, u64)], keep: bool) -> Vec<(u64, u64)> {
        if !keep {
            *self = Hot::default();
            return written.to_vec();
        }
        if !self.writable.is_empty() && self.since < RELEARN {
            self.since += 1;
            return subtract(written, &self.writable);
        }
        if self.writable.is_empty() {
            let hot = intersect(written, &self.last);
            if !hot.is_empty() {
                let protect = subtract(written, &hot);
                *self = Hot { writable: hot, last: Vec::new(), since: 0 };
                return protect;
            }
        }
        // Learning: everything protected, so the next reset sees exactly what its call wrote.
        *self = Hot { writable: Vec::new(), last: written.to_vec(), since: 0 };
        written.to_vec()
    }

    /// Pages left writable now.
    fn pages(&self) -> u64 {
        self.writable.iter().map(|(s, e)| (e - s) / PAGE_SIZE).sum()
    }
}

/// The parts of sorted, disjoint runs `a` that sorted, disjoint runs `b` also cover.
fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The parts of sorted, disjoint runs `a` that sorted, disjoint runs `b` do not cover.
fn subtract(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(s, e) in a {
        let mut at = s;
        for &(bs, be) in b.iter().filter(|&&(bs, be)| bs < e && s < be) {
            if bs > at {
                out.push((at, bs));
            }
            at = at.max(be);
        }
        if at < e {
            out.push((at, e));
        }
    }
    out
}

/// /proc/PID/status lines a reset watches: signal dispositions (ignored / caught: put
/// back from the image when changed), seccomp, no-new-privs, capabilities (a change
/// refuses the reset).
const GUARDED: [&str; 6] = ["SigIgn:", "SigCgt:", "Seccomp:", "NoNewPrivs:", "CapEff:", "CapBnd:"];

fn guarded(pid: i32) -> io::Result<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(text.lines().filter(|l| GUARDED.iter().any(|g| l.starts_with(g))).map(str::to_string).collect())
}

/// The signals (numbers) whose disposition — ignored, caught, default — differs
/// between two readings of [`GUARDED`] (SigIgn and SigCgt masks; SIGKILL and SIGSTOP
/// cannot change).
fn changed_dispositions(before: &[String], now: &[String]) -> Vec<u32> {
    let mask = |lines: &[String], key: &str| {
        lines.iter().find_map(|l| l.strip_prefix(key)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0)
    };
    let diff = (mask(before, "SigIgn:") ^ mask(now, "SigIgn:")) | (mask(before, "SigCgt:") ^ mask(now, "SigCgt:"));
    (0..64u32).filter(|b| diff & (1 << b) != 0).map(|b| b + 1).filter(|&s| s != libc::SIGKILL as u32 && s != libc::SIGSTOP as u32).collect()
}

/// Arguments for injected syscalls, laid out to be written in one go.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) bytes: Vec<u8>,
}

impl Scratch {
    /// Append `b` (16-byte aligned); returns its offset.
    pub(crate) fn push(&mut self, b: &[u8]) -> usize {
        let off = self.bytes.len();
        self.bytes.extend_from_slice(b);
        self.bytes.resize(self.bytes.len().next_multiple_of(16), 0);
        off
    }

    /// Write the arguments below the red zone of `main`'s stack (1 KiB under its stack
    /// pointer, inside a writable mapping of `maps`); returns their address. The pages
    /// written there are the caller's to put back (a reset's memory step rewrites them).
    pub(crate) fn place(&self, pid: i32, main: &Tracee, insn: u64, mem: &ProcMem, maps: &[MapEntry]) -> Result<u64, ResetError> {
        let rsp = main.get_regs().map_err(|source| ResetError::Io { pid, what: "GETREGS".into(), source })?.rsp;
        let at = (rsp - 1024 - self.bytes.len() as u64) & !15;
        if !maps.iter().any(|m| m.write && m.start <= at && at + (self.bytes.len() as u64) < m.end) {
            return Err(ResetError::Layout { pid, what: "no writable stack below the stack pointer".into() });
        }
        // Fault the pages in from inside the process first: /proc/PID/mem cannot fault
        // in a page of a userfaultfd-registered range that was never touched (EIO; a
        // JVM's primordial thread has such stack pages), but the process's own write
        // (clock_gettime's result) is served by the page server like any fault.
        // (Every page: one reported present can still refuse the write, EIO.)
        let end = at + self.bytes.len() as u64;
        let first_page = at & !(PAGE_SIZE - 1);
        for k in 0..(end - first_page).div_ceil(PAGE_SIZE) {
            let p = (first_page + k * PAGE_SIZE).max(at);
            let call = Call::new("clock_gettime(touch)", libc::SYS_clock_gettime, &[libc::CLOCK_MONOTONIC as u64, p]);
            let r = inject::single(main, insn, call).map_err(|source| ResetError::Inject { pid, source })?;
            if r < 0 {
                return Err(ResetError::Layout { pid, what: format!("touching the stack below the stack pointer failed with errno {}", -r) });
            }
        }
        mem.write_all_at(&self.bytes, at).map_err(|source| ResetError::Io { pid, what: "writing syscall arguments".into(), source })?;
        Ok(at)
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Range {
    pub(crate) start: u64,
    pub(crate) end: u64,
    vma: usize,
}

/// Figures of one reset.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResetStats {
    pub reset_ms: f64,
    /// Snapshot mappings whose protection was put back (pieces re-protected since).
    pub mappings_reprotected: u64,
    /// Pieces of the snapshot's anonymous memory unmapped since, mapped back.
    pub mappings_remapped: u64,
    /// Pages of the image installed into the memory mapped back.
    pub pages_installed: u64,
    /// Pages written call after call, rewritten but left writable (not write-protected:
    /// the next call takes no fault on them; see `Hot`).
    pub pages_left_writable: u64,
    /// Pages reported written since the last reset (or the restore).
    pub pages_written: u64,
    /// Pages rewritten from the image, the file or zeros.
    pub pages_written_back: u64,
    pub mappings_unmapped: u64,
    pub fds_closed: u64,
    /// Threads started since the restore, ended.
    pub threads_ended: u64,
    /// Other processes of the sandbox (children, daemons) killed.
    pub processes_killed: u64,
    /// POSIX timers created since the restore, deleted.
    pub timers_deleted: u64,
    /// Signal dispositions changed since the restore, put back.
    pub signals_reset: u64,
    /// Epoll registrations changed since the restore, put back (removed, re-added or
    /// modified).
    pub epoll_changes: u64,
    /// Memfds and deleted /tmp files of the snapshot a tenant wrote, rewritten with
    /// their contents.
    pub memfds_rewritten: u64,
    pub tmp_reset: bool,
    /// The tenant changed resource limits; the image's were put back.
    pub limits_reset: bool,
    pub phases: Vec<(&'static str, f64)>,
}

/// Why an instance of `img` cannot be tracked for resets, if it cannot: a writable
/// shared file mapping writes the file itself, which a reset cannot take back; writes
/// to shared anonymous memory are not seen by the private registration; a file lock
/// a call released would not be taken again; signals pending in the image would not
/// be pending again.
pub fn untrackable(img: &ProcessImage) -> Option<String> {
    img.vmas.iter().find_map(|v| match v.kind {
        VmaKind::FileShared { .. } if v.prot & libc::PROT_WRITE != 0 => Some(format!("{:#x}-{:#x} is a writable shared file mapping", v.start, v.end)),
        VmaKind::SharedAnon => Some(format!("{:#x}-{:#x} is shared anonymous memory, which a reset does not track", v.start, v.end)),
        VmaKind::Unlinked { .. } => Some(format!("{:#x}-{:#x} maps a memfd or a deleted file, which a reset does not track", v.start, v.end)),
        _ => None,
    })
    .or_else(|| {
        img.fds.iter().find_map(|r| match &r.kind {
            crate::image::FdKind::PathLocked { path, .. } => {
                Some(format!("descriptor {} holds a file lock on {path}, which a reset does not check", r.fd))
            }
            crate::image::FdKind::InFlight { .. } => {
                Some("a descriptor was in flight on a socketpair (SCM_RIGHTS), which a reset does not send again".to_string())
            }
            crate::image::FdKind::Inotify { .. } => {
                Some(format!("descriptor {} is an inotify instance, whose watches and queued events a reset does not check", r.fd))
            }
            _ => None,
        })
    })
    .or_else(|| {
        let pending = img.attrs.pending_signals.len() + img.threads.iter().map(|t| t.pending.len()).sum::<usize>();
        (pending > 0).then(|| format!("{pending} signals were pending in the snapshot, which a reset does not queue again"))
    })
    .or_else(|| {
        let n = img.attrs.zombies.len();
        (n > 0).then(|| format!("{n} zombie child processes were in the snapshot, which a reset does not recreate once waited for"))
    })
    .or_else(|| {
        let n = img.children.len();
        (n > 0).then(|| format!("{n} child processes were live in the snapshot, which a reset would kill and does not make again"))
    })
}

/// Register the restored process's memory for write tracking on the page server's
/// userfaultfd (already set up with WP-async) and write-protect it; record the
/// baseline. The process is stopped and not yet resumed; `anon` are the ranges the
/// page server serves (registered MISSING already).
pub fn arm(pid: i32, uffd_fd: &OwnedFd, img: &ProcessImage, stats: &Stats) -> Result<Tracking, ResetError> {
    let ioe = |what: String| move |source| ResetError::Io { pid, what, source };
    if let Some(why) = untrackable(img) {
        return Err(ResetError::NotTracked(why));
    }
    let mut ranges = Vec::new();
    for (i, v) in img.vmas.iter().enumerate() {
        let mode = match v.kind {
            VmaKind::Anon { .. } | VmaKind::FileCopied { .. } => uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
            VmaKind::FilePrivate { .. } => uffd::REGISTER_MODE_WP,
            // Read-only shared file mappings cannot become writable (the file was
            // opened read-only to map them, see restore.rs); writable ones and shared
            // anonymous memory: see `untrackable`.
            VmaKind::FileShared { .. } | VmaKind::SharedAnon | VmaKind::Special { .. } | VmaKind::Unlinked { .. } => continue,
        };
        uffd::register(uffd_fd.as_fd(), v.start, v.end - v.start, mode)
            .map_err(ioe(format!("UFFDIO_REGISTER(WP) {:#x}-{:#x}", v.start, v.end)))?;
        ranges.push(Range { start: v.start, end: v.end, vma: i });
    }
    for r in &ranges {
        uffd::writeprotect(uffd_fd.as_fd(), r.start, r.end - r.start, true)
            .map_err(ioe(format!("UFFDIO_WRITEPROTECT {:#x}-{:#x}", r.start, r.end)))?;
    }
    stats.wp_tracking.store(true, Ordering::Release);
    let maps_text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(ioe("reading maps".into()))?;
    let maps = procfs::parse_maps(&maps_text)
        .ok_or_else(|| ResetError::Io { pid, what: "parsing maps".into(), source: io::ErrorKind::InvalidData.into() })?;
    let syscall_insn = inject::vdso_syscall(pid, &maps)
        .map_err(ioe("reading the vDSO".into()))?
        .ok_or_else(|| ResetError::NotTracked("no syscall instruction in a vDSO".into()))?;
    let all = procfs::fds(pid).map_err(ioe("reading descriptors".into()))?;
    let fd_state = all.iter().filter_map(|f| watched_state(&f.target, &f.info).map(|s| (f.fd, s))).collect();
    let fds = all.into_iter().map(|f| (f.fd, f.target)).collect();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map_err(ioe("reading cwd".into()))?;
    let guarded = guarded(pid).map_err(ioe("reading status".into()))?;
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).map_err(ioe("reading limits".into()))?;
    let uffd = uffd_fd.try_clone().map_err(ioe("dup(userfaultfd)".into()))?;
    Ok(Tracking { uffd, ranges, maps_text, maps, syscall_insn, fds, fd_state, cwd, guarded, limits, hot: Default::default() })
}

/// Plain anonymous private memory (no name: not the heap or a stack).
fn plain_anon(x: &MapEntry) -> bool {
    x.name.is_empty() && x.inode == 0 && !x.shared
}

/// A mapping's protection as mmap/mprotect take it.
fn prot_of(m: &MapEntry) -> i32 {
    [(m.read, libc::PROT_READ), (m.write, libc::PROT_WRITE), (m.exec, libc::PROT_EXEC)].iter().filter(|(on, _)| *on).fold(0, |p, (_, bit)| p | bit)
}

/// Whether `m` (now) covers only baseline mappings of private anonymous memory under
/// write tracking, with no gap: its bounds moved because part of it (or of a
/// neighbour) changed protection, which a reset can put back.
fn reprotectable(m: &MapEntry, baseline: &[MapEntry], ranges: &[Range]) -> bool {
    if !plain_anon(m) {
        return false;
    }
    let mut at = m.start;
    for b in baseline.iter().filter(|b| b.start < m.end && m.start < b.end) {
        if b.start > at || !plain_anon(b) || !covered(b.start, b.end, ranges) {
            return false;
        }
        at = b.end;
    }
    at >= m.end
}

/// Whether tracked ranges cover `start..end` with no gap (adjacent image VMAs may
/// show as one mapping).
fn covered(start: u64, end: u64, ranges: &[Range]) -> bool {
    let mut rs: Vec<&Range> = ranges.iter().filter(|r| r.start < end && start < r.end).collect();
    rs.sort_by_key(|r| r.start);
    let mut at = start;
    for r in rs {
        if r.start > at {
            return false;
        }
        at = at.max(r.end);
    }
    at >= end
}

fn same_map(a: &MapEntry, b: &MapEntry) -> bool {
    (a.start, a.end, a.read, a.write, a.exec, a.shared, a.offset, a.inode, &a.dev, &a.name)
        == (b.start, b.end, b.read, b.write, b.exec, b.shared, b.offset, b.inode, &b.dev, &b.name)
}

/// The part of a descriptor's fdinfo that a tenant can change and a reset does not
/// put back, for the kinds where it is data (an eventfd's counter, an epoll's
/// registrations, a signalfd's mask) — `None` for other kinds.
fn watched_state(target: &str, info: &str) -> Option<String> {
    let watched = ["anon_inode:[eventfd]", "anon_inode:[eventpoll]", "anon_inode:[signalfd]"].contains(&target);
    // `pos` moves without meaning anything for these; `eventfd-id`/`mnt_id`/`ino` are identities.
    watched.then(|| {
        info.lines()
            .filter(|l| !["pos:", "mnt_id:", "ino:", "eventfd-id:"].iter().any(|p| l.starts_with(p)))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// An epoll's registrations as its fdinfo lists them: target fd -> (events, data,
/// the target file's `ino:` and `sdev:`).
fn epoll_registrations(info: &str) -> BTreeMap<i32, (u32, u64, String)> {
    info.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            if it.next()? != "tfd:" {
                return None;
            }
            let tfd = it.next()?.parse().ok()?;
            let (mut events, mut data, mut file) = (None, None, Vec::new());
            while let Some(k) = it.next() {
                match k {
                    "events:" => events = u32::from_str_radix(it.next()?, 16).ok(),
                    "data:" => data = u64::from_str_radix(it.next()?, 16).ok(),
                    f if f.starts_with("ino:") || f.starts_with("sdev:") => file.push(f),
                    _ => {}
                }
            }
            Some((tfd, (events?, data?, file.join(" "))))
        })
        .collect()
}

/// `epoll_ctl` operations that bring registrations `now` back to `before`: (op, target
/// fd, events, data). Err: a registration that cannot be put back (its target is
/// another file now; EPOLLEXCLUSIVE, which cannot be modified).
fn epoll_rewind(before: &BTreeMap<i32, (u32, u64, String)>, now: &BTreeMap<i32, (u32, u64, String)>) -> Result<Vec<(i32, i32, u32, u64)>, &'static str> {
    let mut ops = Vec::new();
    for (&tfd, (ev, data, file)) in now {
        match before.get(&tfd) {
            None => ops.push((libc::EPOLL_CTL_DEL, tfd, 0, 0)),
            Some((_, _, f)) if f != file => return Err("an epoll registration whose descriptor is another file now"),
            Some((bev, bdata, _)) if (bev, bdata) != (ev, data) => {
                if (bev | ev) & libc::EPOLLEXCLUSIVE as u32 != 0 {
                    return Err("an EPOLLEXCLUSIVE registration changed (it cannot be modified)");
                }
                ops.push((libc::EPOLL_CTL_MOD, tfd, *bev, *bdata));
            }
            Some(_) => {}
        }
    }
    for (&tfd, &(bev, bdata, _)) in before.iter().filter(|(tfd, _)| !now.contains_key(tfd)) {
        ops.push((libc::EPOLL_CTL_ADD, tfd, bev, bdata));
    }
    Ok(ops)
}

/// Put a memfd or deleted /tmp file of the snapshot (descriptor `fd`) back to its
/// `content`: rewritten through /proc/PID/fd/FD when a tenant changed it. Returns
/// whether it had changed. A memfd's seals must be the snapshot's (`seals`; they
/// cannot be taken off: one added since refuses the reset).
fn file_back(pid: i32, fd: i32, content: &[u8], seals: Option<u32>) -> Result<bool, ResetError> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let ioe = |what: &'static str| move |source| ResetError::Io { pid, what: format!("{what} memfd descriptor {fd}"), source };
    let path = format!("/proc/{pid}/fd/{fd}");
    let f = std::fs::File::open(&path).map_err(ioe("opening"))?;
    if let Some(seals) = seals {
        let now = nix::fcntl::fcntl(f.as_raw_fd(), nix::fcntl::FcntlArg::F_GET_SEALS)
            .map_err(|e| ResetError::Io { pid, what: format!("reading the seals of memfd descriptor {fd}"), source: e.into() })?;
        if now as u32 != seals {
            return Err(ResetError::Fd { pid, fd, target: format!("memfd (seals {seals:#x})"), what: "a memfd of the snapshot sealed since the restore" });
        }
    }
    let mut now = Vec::with_capacity(content.len());
    (&f).take(content.len() as u64 + 1).read_to_end(&mut now).map_err(ioe("reading"))?;
    if now == content {
        return Ok(false);
    }
    let w = std::fs::OpenOptions::new().write(true).open(&path).map_err(ioe("opening for writing"))?;
    w.set_len(content.len() as u64).and_then(|()| w.write_all_at(content, 0)).map_err(ioe("rewriting"))?;
    Ok(true)
}

/// A reset does not rewind socketpairs: one that holds unread data (the tenant's,
/// or the snapshot's, which the tenant may have read) or whose shutdown state
/// changed refuses the reset.
fn socketpairs_untouched(pid: i32, img: &ProcessImage, t: &Tracking) -> Result<(), ResetError> {
    let ends: Vec<(i32, u8, bool)> = img
        .fds
        .iter()
        .filter_map(|r| match &r.kind {
            crate::image::FdKind::SocketPair { shutdown, queued, .. } => Some((r.fd, *shutdown, !queued.is_empty())),
            _ => None,
        })
        .collect();
    if ends.is_empty() {
        return Ok(());
    }
    let socks = crate::sockdiag::unix_sockets(pid).map_err(|source| ResetError::Io { pid, what: "listing unix sockets (sock_diag)".into(), source })?;
    for (fd, shutdown, had_data) in ends {
        let target = t.fds.get(&fd).cloned().unwrap_or_default();
        let ino = crate::sockdiag::inode_of(&target);
        let now = ino.and_then(|i| socks.get(&i));
        let what = match now {
            None => "a socketpair end that cannot be inspected",
            Some(_) if had_data => "a socketpair that held data at the snapshot (not rewound)",
            Some(s) if s.rqueue > 0 || s.wqueue > 0 => "a socketpair holding data a tenant left",
            Some(s) if s.shutdown != shutdown => "a socketpair shut down since the restore",
            Some(_) => continue,
        };
        return Err(ResetError::Fd { pid, fd, target, what });
    }
    Ok(())
}

/// Kinds of descriptors a reset may close when the tenant opened them.
fn closable(target: &str) -> bool {
    target.starts_with('/')
        || ["pipe:[", "socket:[", "anon_inode:[eventfd]", "anon_inode:[eventpoll]", "anon_inode:[signalfd]", "anon_inode:[timerfd]", "anon_inode:inotify"]
            .iter()
            .any(|p| target.starts_with(p))
}

/// How long killed processes of the sandbox get to exit.
const KILL_WAIT_MS: u16 = 2000;

/// SIGKILL `others` (host pids) that are still in `pid`'s cgroup, and wait until
/// each has exited. Returns how many were killed. (Each is opened as a pidfd, then
/// checked to be in the instance's cgroup: a pid reused since the listing is never
/// signalled.)
pub(crate) fn kill_others(pid: i32, others: &[i32]) -> Result<u64, ResetError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    if others.is_empty() {
        return Ok(0);
    }
    let cgroup = |p: i32| std::fs::read_to_string(format!("/proc/{p}/cgroup"));
    let ours = cgroup(pid).map_err(|source| ResetError::Io { pid, what: "reading its cgroup".into(), source })?;
    let mut killed = Vec::new();
    for &p in others {
        let Ok(fd) = crate::sys::mem::pidfd_open(p) else { continue };
        if cgroup(p).ok().as_ref() != Some(&ours) {
            continue;
        }
        match crate::sys::mem::pidfd_kill(fd.as_fd()) {
            Ok(()) => killed.push((p, fd)),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(source) => return Err(ResetError::Io { pid, what: format!("killing process {p} of the sandbox"), source }),
        }
    }
    let deadline = Instant::now() + std::time::Duration::from_millis(KILL_WAIT_MS.into());
    for (p, fd) in &killed {
        let left = deadline.saturating_duration_since(Instant::now()).as_millis().min(u128::from(KILL_WAIT_MS)) as u16;
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::from(left)), Ok(n) if n > 0) {
            return Err(ResetError::Children { pid, what: format!("process {p} did not exit within {KILL_WAIT_MS} ms of SIGKILL") });
        }
    }
    Ok(killed.len() as u64)
}

/// Put /tmp and /dev/shm of instance `pid` back as `img` has them, if they differ;
/// whether they did.
pub(crate) fn tmp_back(pid: i32, img: &ProcessImage, t: &Tracking) -> Result<bool, ResetError> {
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    if matches!(crate::tmpfs::capture(&root), Ok(now) if now == img.tmp) {
        return Ok(false);
    }
    // /tmp is put back by unlinking and recreating its files: a descriptor of the
    // snapshot on one of them would stay on the old file (restores open it again).
    if let Some(r) = img.fds.iter().find(|r| matches!(&r.kind, crate::image::FdKind::Path { path, .. } | crate::image::FdKind::PathLocked { path, .. } if crate::tmpfs::holds(path))) {
        let target = t.fds.get(&r.fd).cloned().unwrap_or_default();
        return Err(ResetError::Fd { pid, fd: r.fd, target, what: "a descriptor of the snapshot on a file in /tmp or /dev/shm, which changed (a reset recreates those files)" });
    }
    for m in crate::tmpfs::MOUNTS {
        let dir = root.join(m.trim_start_matches('/'));
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let r = if e.file_type().map(|t| t.is_dir()).unwrap_or(false) { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.map_err(|source| ResetError::Io { pid, what: format!("removing {}", p.display()), source })?;
        }
    }
    crate::tmpfs::restore(&root, &img.tmp).map_err(|source| ResetError::Tmp { pid, source })?;
    Ok(true)
}

/// Load each thread's registers, FPU/SIMD state and signal mask from its image, then
/// let every traced thread go (the last traced first).
pub(crate) fn resume_as(by_thread: &[(Tracee, &crate::image::ThreadState)], traced: &[Tracee]) -> Result<(), (&'static str, io::Error)> {
    for (tr, st) in by_thread {
        tr.set_regs(&regs::from_array(&st.regs)).map_err(|e| ("SETREGS", e))?;
        tr.set_xstate(&st.xstate).map_err(|e| ("SETREGSET xstate", e))?;
        tr.set_sigmask(st.sigmask).map_err(|e| ("SETSIGMASK", e))?;
    }
    for tr in traced.iter().rev() {
        tr.detach().map_err(|e| ("PTRACE_DETACH", e))?;
    }
    Ok(())
}

/// Install `bytes` at `at`, pages the instance does not have (UFFDIO_COPY). Not
/// `clean`: not write-protected (written in the eyes of the write tracking), and a
/// page found there after all is written over. `clean`: write-protected (the base's
/// contents), and a page found there is left. Returns (pages installed, written).
pub(crate) fn install_run(t: &Tracking, mem: &ProcMem, at: u64, bytes: &[u8], clean: bool) -> Result<(u64, u64), (String, io::Error)> {
    let len = bytes.len() as u64;
    let (mut done, mut installed, mut written) = (0u64, 0u64, 0u64);
    // One UFFDIO_COPY must stay within one mapping (else ENOENT, read as Gone): a run
    // of consecutive pages can cross from one mapping into the next (a JVM's one-page
    // guard or polling page beside its memory). Such a run goes on page by page.
    let mut by_page = false;
    while done < len {
        let rest = &bytes[done as usize..];
        let n = if by_page { PAGE_SIZE } else { len - done };
        let copy = if clean { uffd::copy_wp } else { uffd::copy };
        match copy(t.uffd.as_fd(), at + done, rest.as_ptr(), n, false).map_err(|e| (format!("UFFDIO_COPY {:#x}", at + done), e))? {
            Install::Done => {
                installed += n / PAGE_SIZE;
                done += n;
            }
            Install::Again { copied } if copied > 0 => {
                installed += copied / PAGE_SIZE;
                done += copied;
            }
            Install::Exists if clean => done += PAGE_SIZE,
            Install::Exists => {
                mem.write_all_at(&rest[..PAGE_SIZE as usize], at + done).map_err(|e| (format!("writing {:#x}", at + done), e))?;
                written += 1;
                done += PAGE_SIZE;
            }
            Install::Gone if !by_page && n > PAGE_SIZE => by_page = true,
            other => return Err((format!("installing {:#x}", at + done), io::Error::other(format!("{other:?}")))),
        }
    }
    Ok((installed, written))
}

/// Memory a reset maps back larger than this is left to the page server, page by page
/// as it is touched, rather than installed during the reset.
const MAP_BACK_INSTALL_MAX: u64 = 64 << 20;

/// `0..n` cut into maximal runs `(start, end)`: index `k` continues the run of `k - 1`
/// when `continues(k)`.
pub(crate) fn runs(n: usize, continues: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for k in 0..n {
        match out.last_mut() {
            Some(r) if continues(k) => r.1 = k + 1,
            _ => out.push((k, k + 1)),
        }
    }
    out
}

/// Bytes of pages a reset (or an install) gathers before writing them (a bound on the
/// memory it holds at once for a function that wrote much).
pub(crate) const WRITE_BACK_BATCH: usize = 64 << 10;

/// Reset the instance `pid` (not traced, idle between invocations) to `img`.
/// `others`: the host pids of the other processes in its sandbox (all but its init
/// and itself: children it started, daemons they left), which are killed. On
/// error the process has been killed (and its threads reaped): the caller discards
/// the instance. Must run on one thread from start to end (it becomes the tracer).
/// `keep_hot`: leave the pages call after call writes writable ([`Hot`]): resets
/// between calls of one function; not before another function runs (a reset to a base).
#[allow(clippy::too_many_arguments)]
pub fn reset(pid: i32, others: &[i32], img: &ProcessImage, source: &PageSource, t: &Tracking, stats: &Stats, keep_hot: bool) -> Result<ResetStats, ResetError> {
    let mut traced = Vec::new();
    let r = reset_inner(pid, others, img, source, t, stats, keep_hot, &mut traced);
    match &r {
        Ok(_) => {}
        Err(e) => {
            debug!(pid, error = %e, "reset failed; killing the instance");
            ptrace::kill_and_reap(pid, &traced);
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn reset_inner(
    pid: i32,
    others: &[i32],
    img: &ProcessImage,
    source: &PageSource,
    t: &Tracking,
    stats: &Stats,
    keep_hot: bool,
    traced: &mut Vec<Tracee>,
) -> Result<ResetStats, ResetError> {
    let t0 = Instant::now();
    let mut out = ResetStats::default();
    let mut lap = t0;
    let mut phase = |name: &'static str, out: &mut ResetStats| {
        out.phases.push((name, lap.elapsed().as_secs_f64() * 1e3));
        lap = Instant::now();
    };
    let ioe = |what: &str| {
        let what = what.to_string();
        move |source| ResetError::Io { pid, what, source }
    };
    let inj = |source| ResetError::Inject { pid, source };

    // ---- The sandbox's other processes: killed (their exit is not reported to the
    //      instance as a signal: it is not traced yet, and SIGCHLD's default is to
    //      discard it).
    out.processes_killed = kill_others(pid, others)?;
    phase("processes", &mut out);

    // ---- Stop every thread; the image's must all be there, those started since end.
    crate::threads::seize_all(pid, traced).map_err(|e| {
        let (what, source) = e.parts();
        ResetError::Io { pid, what, source }
    })?;
    let (named, extra) = crate::threads::name_by_image(pid, traced, &img.threads).map_err(ioe("reading thread status"))?;
    let mut by_thread = Vec::with_capacity(named.len());
    let mut main_umask = img.umask;
    for (tr, image, st) in named {
        if tr.pid.as_raw() == pid {
            main_umask = st.umask;
        }
        if st.sig_pending != 0 || st.shared_pending != 0 {
            return Err(ResetError::PendingSignals { pid, pending: st.sig_pending, shared: st.shared_pending });
        }
        by_thread.push((tr, image));
    }
    if by_thread.len() != img.threads.len() || by_thread.first().is_none_or(|(tr, _)| tr.pid.as_raw() != pid) {
        return Err(ResetError::Threads { pid, expected: img.threads.len(), found: by_thread.len() });
    }
    let main = traced[0];
    let insn = t.syscall_insn;
    // Threads started since the restore: each runs exit() where it stands. What it
    // held in memory goes back with the memory below; its stack is a mapping created
    // since, unmapped below; its descriptors are the process's, closed below.
    for tr in &extra {
        tr.exit_thread(insn).map_err(ioe(&format!("ending thread {} (started since the restore)", tr.pid)))?;
        traced.retain(|x| x.pid != tr.pid);
        out.threads_ended += 1;
    }
    // Children killed above are zombies until their parent reaps them: the process
    // reaps them itself (the snapshot had no children, so any child is one). The
    // children of a thread that ended are its remaining threads' now.
    let children = |by_thread: &[(Tracee, &crate::image::ThreadState)]| -> Result<String, ResetError> {
        let mut all = Vec::new();
        for (tr, _) in by_thread {
            let list = std::fs::read_to_string(format!("/proc/{pid}/task/{}/children", tr.pid)).map_err(ioe("reading children"))?;
            all.extend(list.split_whitespace().map(str::to_string));
        }
        Ok(all.join(" "))
    };
    if out.processes_killed > 0 || !children(&by_thread)?.is_empty() {
        loop {
            let call = Call::new("wait4(killed child)", libc::SYS_wait4, &[u64::MAX, 0, (libc::WNOHANG | libc::__WALL) as u64, 0]);
            match inject::single(&main, insn, call) {
                Ok(r) if r > 0 => continue,
                Ok(_) => break,
                Err(InjectError::Syscall { err, .. }) if err.raw_os_error() == Some(libc::ECHILD) => break,
                Err(e) => return Err(inj(e)),
            }
        }
        let left = children(&by_thread)?;
        if !left.is_empty() {
            return Err(ResetError::Children { pid, what: format!("still running after the kill: {left}") });
        }
    }
    let now = guarded(pid).map_err(ioe("reading status"))?;
    // Signal dispositions a handler changed (a signal handler installed; glibc's own
    // when the first thread starts) go back to the image's; anything else guarded
    // refuses.
    let changed_signals = changed_dispositions(&t.guarded, &now);
    let dispositions = |l: &&String| l.starts_with("SigIgn:") || l.starts_with("SigCgt:");
    if now.iter().filter(|l| !dispositions(l)).ne(t.guarded.iter().filter(|l| !dispositions(l))) {
        let what: Vec<String> = now.iter().filter(|l| !t.guarded.contains(l) && !dispositions(l)).cloned().collect();
        return Err(ResetError::Attributes { pid, what: what.join(", ") });
    }
    let timers = std::fs::read_to_string(format!("/proc/{pid}/timers")).unwrap_or_default();
    if !img.attrs.posix_timers.is_empty() {
        return Err(ResetError::Attributes { pid, what: "POSIX timers of the snapshot (a reset does not rewind them)".into() });
    }
    // POSIX timers created since (the snapshot has none): deleted below, with the
    // layout's calls.
    let new_timers: Vec<u64> = timers.lines().filter_map(|l| l.strip_prefix("ID:")?.trim().parse().ok()).collect();
    phase("stop", &mut out);

    // ---- Layout: what is new goes, the rest must be exactly the baseline.
    let maps_text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(ioe("reading maps"))?;
    let maps = if maps_text == t.maps_text {
        Vec::new()
    } else {
        procfs::parse_maps(&maps_text).ok_or_else(|| ResetError::Layout { pid, what: "unparsable maps".into() })?
    };
    let mem = ProcMem::open(pid, true).map_err(ioe("opening /proc/PID/mem"))?;
    let mut calls: Vec<Call> = new_timers.iter().map(|&id| Call::new("timer_delete", libc::SYS_timer_delete, &[id])).collect();
    out.timers_deleted = new_timers.len() as u64;
    let mut brk = false;
    let mut layout_calls = false;
    let mut reprotect: Vec<&MapEntry> = Vec::new();
    let mut pieces: Vec<(u64, u64, &MapEntry)> = Vec::new();
    for m in &maps {
        if t.maps.iter().any(|b| same_map(b, m)) {
            continue;
        }
        // Heap growth is a VMA of its own (a registered VMA does not merge with an
        // unregistered one): brk takes it back, munmap would leave brk stale.
        if m.name == "[heap]" {
            brk = true;
            continue;
        }
        let overlaps = t.maps.iter().find(|b| b.start < m.end && m.start < b.end);
        match overlaps {
            None => {
                debug!(pid, start = m.start, end = m.end, name = %m.name, "unmapping a mapping created since the restore");
                calls.push(Call::new("munmap(new mapping)", libc::SYS_munmap, &[m.start, m.len()]));
                out.mappings_unmapped += 1;
            }
            // A piece of a tracked anonymous mapping whose protection changed (glibc
            // growing an arena, a JVM committing reserved memory by mprotect, a
            // tenant's guard page): the mapping's protection is put back below (the
            // pieces merge again), its written pages are rewritten in the memory step.
            Some(_) if reprotectable(m, &t.maps, &t.ranges) => {
                for b in t.maps.iter().filter(|b| b.start < m.end && m.start < b.end) {
                    if !reprotect.iter().any(|x: &&MapEntry| x.start == b.start) {
                        reprotect.push(b);
                    }
                    if (m.read, m.write, m.exec) != (b.read, b.write, b.exec) {
                        pieces.push((m.start.max(b.start), m.end.min(b.end), b));
                    }
                }
            }
            Some(b) => {
                return Err(ResetError::Layout {
                    pid,
                    what: format!("{:#x}-{:#x} {} is now {:#x}-{:#x} {}", b.start, b.end, b.name, m.start, m.end, m.name),
                })
            }
        }
    }
    // Each re-protected piece is replaced by fresh memory with the mapping's own
    // protection (mprotect back leaves a piece that no longer merges: it gained an
    // anon_vma and write-protect markers), registered with the page server again
    // below; the page server serves it from the image like the rest.
    for &(start, end, b) in &pieces {
        let prot = prot_of(b);
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | if b.flags.iter().any(|f| f == "nr") { libc::MAP_NORESERVE } else { 0 };
        calls.push(Call::new("munmap(re-protected piece)", libc::SYS_munmap, &[start, end - start]));
        calls.push(Call::new("mmap(piece back)", libc::SYS_mmap, &[start, end - start, prot as u64, flags as u64, u64::MAX, 0]));
    }
    // Tracked anonymous memory of the snapshot the tenant unmapped, wholly or in part
    // (free() of a large block malloc had mapped: a buffer its init made) is mapped
    // again where nothing is now, with its protection, and registered with the page
    // server again below: it serves the image's pages there, as after the restore.
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    if !maps.is_empty() {
        for b in t.maps.iter().filter(|b| plain_anon(b) && covered(b.start, b.end, &t.ranges)) {
            let mut at = b.start;
            let mut found = Vec::new();
            for m in maps.iter().filter(|m| m.start < b.end && b.start < m.end) {
                if m.start > at {
                    found.push((at, m.start));
                }
                at = at.max(m.end);
            }
            if at < b.end {
                found.push((at, b.end));
            }
            if found.is_empty() {
                continue;
            }
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE | if b.flags.iter().any(|f| f == "nr") { libc::MAP_NORESERVE } else { 0 };
            for &(start, end) in &found {
                debug!(pid, start, end, "mapping back snapshot memory unmapped since the restore");
                calls.push(Call::new("mmap(unmapped memory back)", libc::SYS_mmap, &[start, end - start, prot_of(b) as u64, flags as u64, u64::MAX, 0]));
            }
            gaps.extend(found);
            if !reprotect.iter().any(|x: &&MapEntry| x.start == b.start) {
                reprotect.push(b);
            }
        }
    }
    out.mappings_remapped = gaps.len() as u64;
    out.mappings_reprotected = reprotect.len() as u64;
    if let Some(b) = t
        .maps
        .iter()
        .find(|b| !maps.is_empty() && !maps.iter().any(|m| same_map(b, m)) && b.name != "[heap]" && !reprotect.iter().any(|x| x.start == b.start))
    {
        return Err(ResetError::Layout { pid, what: format!("{:#x}-{:#x} {} was unmapped or changed", b.start, b.end, b.name) });
    }
    // The heap back to the image's break. Where the tenant's free() shrank it (malloc
    // trims the top of the heap), brk grows it back as a new, unregistered mapping of
    // zeros: it is registered below, so the page server serves the image's pages there
    // again (and it merges with the rest of the heap).
    let mut regrown = None;
    if brk || !maps.is_empty() && !maps.iter().any(|m| m.name == "[heap]") && t.maps.iter().any(|b| b.name == "[heap]") {
        calls.push(Call::new("brk", libc::SYS_brk, &[img.mm.brk]));
        let heap_end = |ms: &[MapEntry]| ms.iter().filter(|m| m.name == "[heap]").map(|m| m.end).max();
        if let (Some(was), now) = (heap_end(&t.maps), heap_end(&maps)) {
            let now = now.unwrap_or_else(|| t.maps.iter().filter(|m| m.name == "[heap]").map(|m| m.start).min().unwrap_or(was));
            let end = was.min(img.mm.brk.next_multiple_of(PAGE_SIZE));
            if now < end {
                regrown = Some((now, end));
            }
        }
    }
    layout_calls |= !calls.is_empty() || !maps.is_empty();

    // ---- Descriptors: new ones closed, the snapshot's rewound; anything else refused.
    let mut fds = Vec::new();
    // (fd, reads that drain it, counter to write back)
    let mut eventfd_fixes: Vec<(i32, u64, u64)> = Vec::new();
    // Epoll registrations put back: (epoll fd, op, target fd, events, data). Removals
    // go first, before new descriptors are closed (a registration is keyed by file and
    // descriptor number).
    let mut epoll_fixes: Vec<(i32, i32, i32, u32, u64)> = Vec::new();
    for ent in std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(ioe("listing descriptors"))? {
        let ent = ent.map_err(ioe("listing descriptors"))?;
        let Ok(fd) = ent.file_name().to_string_lossy().parse::<i32>() else { continue };
        let target = std::fs::read_link(ent.path()).map_err(ioe("reading a descriptor"))?.to_string_lossy().into_owned();
        match t.fds.get(&fd) {
            Some(known) if *known == target => {
                if let Some(before) = t.fd_state.get(&fd) {
                    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).map_err(ioe("reading fdinfo"))?;
                    let now = watched_state(&target, &info);
                    if now.as_ref() != Some(before) {
                        // An eventfd whose counter alone changed gets its counter back
                        // (drained, then the restored value written); anything else refuses.
                        let count = |s: &str| procfs::fdinfo_field(s, "eventfd-count").and_then(|v| v.parse::<u64>().ok());
                        let rest = |s: &str| s.lines().filter(|l| !l.starts_with("eventfd-count:")).collect::<Vec<_>>().join("\n");
                        let settings = |s: &str| s.lines().filter(|l| !l.starts_with("tfd:")).collect::<Vec<_>>().join("\n");
                        match (now.as_deref().map(|n| (count(n), rest(n))), count(before)) {
                            // An epoll whose registrations alone changed gets them back
                            // (checked again once the calls have run).
                            _ if target == "anon_inode:[eventpoll]" && now.as_deref().map(settings) == Some(settings(before)) => {
                                let ops = epoll_rewind(&epoll_registrations(before), &epoll_registrations(now.as_deref().unwrap_or_default()))
                                    .map_err(|what| ResetError::Fd { pid, fd, target: target.clone(), what })?;
                                epoll_fixes.extend(ops.into_iter().map(|(op, tfd, ev, data)| (fd, op, tfd, ev, data)));
                            }
                            (Some((Some(have), r)), Some(want)) if r == rest(before) => {
                                let semaphore = procfs::fdinfo_field(&info, "eventfd-semaphore").as_deref() == Some("1");
                                if semaphore && have > 64 {
                                    return Err(ResetError::Fd { pid, fd, target, what: "a semaphore eventfd counted up too far to drain" });
                                }
                                eventfd_fixes.push((fd, if semaphore { have } else { u64::from(have > 0) }, want));
                            }
                            _ => return Err(ResetError::Fd { pid, fd, target, what: "changed since the restore (registrations, mask or flags)" }),
                        }
                    }
                }
            }
            Some(_) => return Err(ResetError::Fd { pid, fd, target, what: "replaced since the restore" }),
            None if closable(&target) => {
                calls.push(Call::new("close(new fd)", libc::SYS_close, &[fd as u64]));
                out.fds_closed += 1;
            }
            None => return Err(ResetError::Fd { pid, fd, target, what: "a kind a reset cannot close safely" }),
        }
        fds.push(fd);
    }
    if let Some((&fd, target)) = t.fds.iter().find(|(fd, _)| !fds.contains(fd)) {
        return Err(ResetError::Fd { pid, fd, target: target.clone(), what: "closed since the restore" });
    }
    socketpairs_untouched(pid, img, t)?;
    for r in &img.fds {
        match &r.kind {
            crate::image::FdKind::MemFd { content, seals, .. } => out.memfds_rewritten += u64::from(file_back(pid, r.fd, content, Some(*seals))?),
            crate::image::FdKind::DeletedTmp { content, .. } => out.memfds_rewritten += u64::from(file_back(pid, r.fd, content, None)?),
            _ => {}
        }
    }
    for r in &img.fds {
        if let crate::image::FdKind::Path { pos, .. } | crate::image::FdKind::PathLocked { pos, .. } | crate::image::FdKind::MemFd { pos, .. } = &r.kind {
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", r.fd)).map_err(ioe("reading fdinfo"))?;
            let now = procfs::parse_fdinfo(&info).0;
            if now != *pos {
                calls.push(Call::new("lseek", libc::SYS_lseek, &[r.fd as u64, *pos, libc::SEEK_SET as u64]));
            }
        }
    }
    if main_umask != img.umask {
        calls.push(Call::new("umask", libc::SYS_umask, &[img.umask as u64]));
    }
    // Arguments of the calls below (cwd path, itimervals, stack_ts, rlimits) go below
    // the red zone of the main thread's stack; those pages are reported written and
    // rewritten from the image in the memory step below.
    let mut scratch = Scratch::default();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map_err(ioe("reading cwd"))?;
    let cwd_at = (cwd != t.cwd).then(|| {
        let mut s = img.cwd.as_bytes().to_vec();
        s.push(0);
        scratch.push(&s)
    });
    // Interval timers (alarm() included) as restored: a tenant's alarm must not fire
    // in the next tenant's invocation.
    let timers: Vec<usize> = img.attrs.itimers.iter().map(|t| scratch.push(&t.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())).collect();
    // Every thread's signal alternate stack as in the image (none: disabled).
    let altstacks: Vec<usize> = by_thread
        .iter()
        .map(|(_, th)| {
            let ss = th.altstack.clone().unwrap_or(crate::image::AltStack { sp: 0, flags: libc::SS_DISABLE, size: 0 });
            scratch.push(&[ss.sp.to_le_bytes(), (ss.flags as i64).to_le_bytes(), ss.size.to_le_bytes()].concat())
        })
        .collect();
    // Signal dispositions as in the image (SIG_DFL where it has none).
    let sigactions: Vec<(u32, usize)> = changed_signals
        .iter()
        .map(|&sig| {
            (sig, scratch.push(&img.sigaction_words(sig).iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>()))
        })
        .collect();
    out.signals_reset = sigactions.len() as u64;
    // Eventfd counters as restored: an 8-byte buffer to read into, one per value to write.
    let drain_buf = scratch.push(&[0u8; 8]);
    let counters: Vec<usize> = eventfd_fixes.iter().map(|&(_, _, want)| scratch.push(&want.to_le_bytes())).collect();
    // struct epoll_event (packed on x86-64: u32 events, u64 data) of each ADD and MOD.
    let epoll_events: Vec<usize> = epoll_fixes.iter().map(|&(_, _, _, ev, data)| scratch.push(&[&ev.to_le_bytes()[..], &data.to_le_bytes()[..]].concat())).collect();
    // Snapshot timerfds re-armed as restored (what was left at capture, relative) and
    // their unread expirations set back, as the restore did: always, since a timer's
    // remaining time cannot be compared with a baseline.
    let timerfds: Vec<(i32, usize, u64, usize)> = img
        .fds
        .iter()
        .filter_map(|r| match &r.kind {
            crate::image::FdKind::TimerFd { value, interval, ticks, .. } => {
                let its = scratch.push(&[interval.0, interval.1, value.0, value.1].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>());
                Some((r.fd, its, *ticks, scratch.push(&ticks.to_le_bytes())))
            }
            _ => None,
        })
        .collect();
    // Resource limits, when the tenant changed any (the node may raise them back).
    let limits_now = std::fs::read_to_string(format!("/proc/{pid}/limits")).map_err(ioe("reading limits"))?;
    let rlimits: Vec<(u32, usize)> = if limits_now == t.limits {
        Vec::new()
    } else {
        img.rlimits.iter().map(|&(res, cur, max)| (res, scratch.push(&[cur.to_le_bytes(), max.to_le_bytes()].concat()))).collect()
    };
    let at = scratch.place(pid, &main, insn, &mem, &t.maps)?;
    let arg = |off: usize| at + off as u64;
    if let Some(off) = cwd_at {
        calls.push(Call::new("chdir", libc::SYS_chdir, &[arg(off)]));
    }
    for (which, &off) in timers.iter().enumerate() {
        calls.push(Call::new("setitimer", libc::SYS_setitimer, &[which as u64, arg(off), 0]));
    }
    for &(res, off) in &rlimits {
        calls.push(Call::new("prlimit64", libc::SYS_prlimit64, &[0, res as u64, arg(off), 0]));
    }
    for &(sig, off) in &sigactions {
        calls.push(Call::new("rt_sigaction", libc::SYS_rt_sigaction, &[sig as u64, arg(off), 0, 8]));
    }
    for &(fd, its, ticks, ticks_at) in &timerfds {
        calls.push(Call::new("timerfd_settime", libc::SYS_timerfd_settime, &[fd as u64, 0, arg(its), 0]));
        if ticks > 0 {
            calls.push(Call::new("ioctl(TFD_IOC_SET_TICKS)", libc::SYS_ioctl, &[fd as u64, crate::conventions::TFD_IOC_SET_TICKS, arg(ticks_at)]));
        }
    }
    for (&(fd, reads, want), &off) in eventfd_fixes.iter().zip(&counters) {
        for _ in 0..reads {
            calls.push(Call::new("read(eventfd)", libc::SYS_read, &[fd as u64, arg(drain_buf), 8]));
        }
        if want > 0 {
            calls.push(Call::new("write(eventfd)", libc::SYS_write, &[fd as u64, arg(off), 8]));
        }
    }
    let mut dels = Vec::new();
    for (&(epfd, op, tfd, _, _), &off) in epoll_fixes.iter().zip(&epoll_events) {
        let call = Call::new("epoll_ctl", libc::SYS_epoll_ctl, &[epfd as u64, op as u64, tfd as u64, if op == libc::EPOLL_CTL_DEL { 0 } else { arg(off) }]);
        if op == libc::EPOLL_CTL_DEL {
            dels.push(call);
        } else {
            calls.push(call);
        }
    }
    calls.splice(0..0, dels);
    for c in calls {
        let r = inject::single(&main, insn, c).map_err(inj)?;
        if c.nr == libc::SYS_brk && r as u64 != img.mm.brk {
            return Err(ResetError::Layout { pid, what: format!("brk({:#x}) returned {r:#x}", img.mm.brk) });
        }
        if c.nr == libc::SYS_mmap && r as u64 != c.args[0] {
            return Err(ResetError::Layout { pid, what: format!("putting memory back at {:#x} returned {r:#x}", c.args[0]) });
        }
        if c.nr != libc::SYS_brk && c.nr != libc::SYS_close && r < 0 {
            return Err(ResetError::Layout { pid, what: format!("{} failed with errno {}", c.name, -r) });
        }
    }
    let epolls: std::collections::BTreeSet<i32> = epoll_fixes.iter().map(|&(epfd, ..)| epfd).collect();
    for epfd in epolls {
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{epfd}")).map_err(ioe("reading fdinfo"))?;
        if watched_state("anon_inode:[eventpoll]", &info).as_ref() != t.fd_state.get(&epfd) {
            return Err(ResetError::Fd { pid, fd: epfd, target: "anon_inode:[eventpoll]".into(), what: "registrations not as restored after putting them back" });
        }
    }
    out.epoll_changes = epoll_fixes.len() as u64;
    for (start, end, what) in pieces
        .iter()
        .map(|&(s, e, _)| (s, e, "a re-protected piece put back"))
        .chain(gaps.iter().map(|&(s, e)| (s, e, "unmapped memory mapped back")))
        .chain(regrown.map(|(s, e)| (s, e, "the heap grown back")))
    {
        uffd::register(t.uffd.as_fd(), start, end - start, uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP)
            .and_then(|()| uffd::writeprotect(t.uffd.as_fd(), start, end - start, true))
            .map_err(ioe(&format!("UFFDIO_REGISTER {start:#x}-{end:#x} ({what})")))?;
    }
    // The image's pages of the memory mapped back and of the heap grown back, installed
    // now (clean: they are the image's): the call that freed it touches it again (a
    // malloc'd block of the init's data, freed and allocated again by each call; the
    // top of the heap that free() trimmed), and each page it found missing would be a
    // round trip to the page server on the call's path, after the reset.
    for &(start, end) in gaps.iter().chain(&regrown).filter(|(s, e)| e - s <= MAP_BACK_INSTALL_MAX) {
        let mut bytes = vec![0u8; (end - start) as usize];
        source.read_image(start, &mut bytes).map_err(|source| ResetError::Pages { pid, source })?;
        let (installed, _) = install_run(t, &mem, start, &bytes, true).map_err(|(what, source)| ResetError::Io { pid, what, source })?;
        out.pages_installed += installed;
    }
    for ((tr, _), &off) in by_thread.iter().zip(&altstacks) {
        let r = inject::single(tr, insn, Call::new("sigaltstack", libc::SYS_sigaltstack, &[arg(off), 0])).map_err(inj)?;
        if r < 0 {
            return Err(ResetError::Layout { pid, what: format!("sigaltstack failed with errno {}", -r) });
        }
    }
    out.limits_reset = !rlimits.is_empty();
    if layout_calls {
        let now = procfs::maps(pid).map_err(ioe("reading maps"))?;
        if now.len() != t.maps.len() || now.iter().zip(&t.maps).any(|(a, b)| !same_map(a, b)) {
            let first = now.iter().zip(&t.maps).find(|(a, b)| !same_map(a, b)).map(|(a, b)| {
                format!(": {:#x}-{:#x} {} is {:#x}-{:#x} {} ({} mappings, {} after the restore)", b.start, b.end, b.perms(), a.start, a.end, a.perms(), now.len(), t.maps.len())
            });
            return Err(ResetError::Layout {
                pid,
                what: format!("the layout differs from the restored one after putting it back{}", first.unwrap_or_default()),
            });
        }
    }
    phase("layout_fds", &mut out);

    // ---- /tmp and /dev/shm: as in the image.
    out.tmp_reset = tmp_back(pid, img, t)?;
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    phase("tmp", &mut out);

    // ---- Memory: the page server forgets releases; written pages are rewritten.
    stats.space_epoch.fetch_add(1, Ordering::AcqRel);
    let pm = Pagemap::open(pid).map_err(ioe("opening pagemap"))?;
    let mut files: HashMap<usize, std::fs::File> = HashMap::new();
    // The image's contents of every written page the instance has, gathered, then
    // written at once (ProcMem::write_runs); then the written runs are protected again.
    let page = PAGE_SIZE as usize;
    let mut pages: Vec<u8> = Vec::new();
    let mut runs_out: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
    let mut protect: Vec<(u64, u64)> = Vec::new();
    for r in &t.ranges {
        let mut written = Vec::new();
        pm.written(r.start, r.end, &mut written).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => ResetError::Layout { pid, what: format!("{:#x}-{:#x} lost its write tracking", r.start, r.end) },
            _ => ResetError::Io { pid, what: "PAGEMAP_SCAN".into(), source: e },
        })?;
        let v = &img.vmas[r.vma];
        for &(s, e) in &written {
            let n = ((e - s) / PAGE_SIZE) as usize;
            out.pages_written += n as u64;
            if let VmaKind::FileShared { .. } = v.kind {
                return Err(ResetError::SharedWrite { pid, addr: s });
            }
            let populated = pm.populated(s, n).map_err(ioe("reading pagemap"))?;
            // Where each page's contents come from: the image (its stored page, or
            // zeros) or the mapped file's page; None: not populated, the next touch
            // faults it in from the image (anonymous) or from the file, which is what
            // the image holds there.
            #[derive(Clone, Copy, PartialEq)]
            enum Held {
                Image,
                File,
            }
            let held = |k: usize| -> Option<Held> {
                let stored = source.index.lookup(s + k as u64 * PAGE_SIZE);
                match (&v.kind, stored, populated[k]) {
                    (_, None, false) | (VmaKind::Anon { .. } | VmaKind::FileCopied { .. }, _, false) => None,
                    (VmaKind::FilePrivate { .. }, None, true) => Some(Held::File),
                    _ => Some(Held::Image),
                }
            };
            let held: Vec<Option<Held>> = (0..n).map(held).collect();
            // Runs read at once: the image's pages (PageSource::read_image); a file's
            // page alone.
            let continues = |k: usize| held[k - 1] == held[k] && held[k] != Some(Held::File);
            for (k, l) in runs(n, continues) {
                let Some(what) = held[k] else { continue };
                let addr = s + k as u64 * PAGE_SIZE;
                let at = pages.len();
                pages.resize(at + (l - k) * page, 0);
                let buf = &mut pages[at..];
                match (what, &v.kind) {
                    (Held::Image, _) => source.read_image(addr, buf).map_err(|source| ResetError::Pages { pid, source })?,
                    (Held::File, VmaKind::FilePrivate { file, offset }) => {
                        let f = match files.entry(*file) {
                            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                            std::collections::hash_map::Entry::Vacant(slot) => {
                                let path = root.join(img.files[*file].path.trim_start_matches('/'));
                                slot.insert(std::fs::File::open(&path).map_err(ioe(&format!("opening {}", path.display())))?)
                            }
                        };
                        let at = offset + (addr - v.start);
                        let mut got = 0;
                        while got < page {
                            let n = f.read_at(&mut buf[got..], at + got as u64).map_err(ioe("reading a mapped file"))?;
                            if n == 0 {
                                break;
                            }
                            got += n;
                        }
                    }
                    _ => {}
                }
                match runs_out.last_mut() {
                    Some((a, r)) if *a + r.len() as u64 == addr => r.end = pages.len(),
                    _ => runs_out.push((addr, at..pages.len())),
                }
                out.pages_written_back += (l - k) as u64;
                if pages.len() >= WRITE_BACK_BATCH {
                    mem.write_runs(&pages, &runs_out).map_err(ioe("writing back written pages"))?;
                    pages.clear();
                    runs_out.clear();
                }
            }
            protect.push((s, e));
        }
    }
    mem.write_runs(&pages, &runs_out).map_err(ioe("writing back written pages"))?;
    protect.sort_unstable();
    let mut hot = t.hot.lock().unwrap_or_else(|p| p.into_inner());
    for (s, e) in hot.protect_after(&protect, keep_hot) {
        uffd::writeprotect(t.uffd.as_fd(), s, e - s, true).map_err(ioe(&format!("UFFDIO_WRITEPROTECT {s:#x}-{e:#x}")))?;
    }
    out.pages_left_writable = hot.pages();
    drop(hot);
    phase("memory", &mut out);

    // ---- Registers, FPU/SIMD state, signal masks; then let go.
    resume_as(&by_thread, traced).map_err(|(what, source)| ResetError::Io { pid, what: what.into(), source })?;
    phase("registers", &mut out);
    out.reset_ms = t0.elapsed().as_secs_f64() * 1e3;
    debug!(pid, ?out, "reset");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{intersect, runs, subtract, Hot, RELEARN};

    #[test]
    fn runs_cut_where_the_sequence_breaks() {
        let v = [1, 2, 3, 7, 8, 10];
        assert_eq!(runs(v.len(), |k| v[k] == v[k - 1] + 1), vec![(0, 3), (3, 5), (5, 6)]);
        assert_eq!(runs(0, |_| true), vec![]);
        assert_eq!(runs(3, |_| true), vec![(0, 3)]);
    }

    #[test]
    fn runs_intersect_and_subtract() {
        let a = [(0, 10), (20, 30), (40, 50)];
        let b = [(5, 25), (45, 60)];
        assert_eq!(intersect(&a, &b), vec![(5, 10), (20, 25), (45, 50)]);
        assert_eq!(subtract(&a, &b), vec![(0, 5), (25, 30), (40, 45)]);
        assert_eq!(subtract(&a, &[]), a.to_vec());
        assert_eq!(intersect(&a, &[]), vec![]);
    }

    #[test]
    fn pages_written_call_after_call_are_left_writable_then_learned_again() {
        let p = |a: u64, b: u64| (a * 4096, b * 4096);
        let mut h = Hot::default();
        // First reset: everything protected (nothing known).
        assert_eq!(h.protect_after(&[p(0, 4), p(10, 12)], true), vec![p(0, 4), p(10, 12)]);
        // Second: pages 2-4 and 10-12 were written again: they stay writable.
        assert_eq!(h.protect_after(&[p(2, 6), p(10, 12)], true), vec![p(4, 6)]);
        assert_eq!(h.pages(), 4);
        // Then: they show as written every time; only the others are protected.
        for _ in 0..RELEARN {
            assert_eq!(h.protect_after(&[p(2, 4), p(10, 12), p(20, 21)], true), vec![p(20, 21)]);
        }
        // Every RELEARNth reset protects everything again.
        assert_eq!(h.protect_after(&[p(2, 4), p(10, 12)], true), vec![p(2, 4), p(10, 12)]);
        assert_eq!(h.pages(), 0);
        // Not keeping (a reset to a base): everything protected, nothing kept.
        assert_eq!(h.protect_after(&[p(2, 4)], true), vec![]);
        assert_eq!(h.protect_after(&[p(2, 4)], false), vec![p(2, 4)]);
        assert_eq!(h.pages(), 0);
    }
}
