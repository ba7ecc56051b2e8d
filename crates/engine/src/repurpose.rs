//! Repurposing by diff (issue #30): a clean instance of a runtime's base becomes an
//! instance of a function whose snapshot is a diff on that base, with no new sandbox,
//! no process rebuilt and no init run.
//!
//! A clean base instance (restored from the base with write tracking, or reset to it:
//! see `reset.rs`) holds the base's memory: the pages it faulted in, the rest served
//! by its page server from the base. A diff's image says of every page whether it is
//! the base's ([`crate::image::BaseRef::runs`]), its own (stored) or zero (see
//! `layers.rs`). [`install`] turns the instance into what a restore of the diff gives:
//! - **layout**: every mapping of the base must be in the diff's image, the same or
//!   (anonymous memory) grown at its end; the diff's other mappings are created
//!   (anonymous memory, or a private or read-only mapping of a file of the sandbox,
//!   checked as a restore checks it) and the heap moves to the diff's break by `brk`;
//! - **memory**: every page whose contents differ between the base and the diff (the
//!   diff's own pages; the base's pages the diff has as zero), and every page the
//!   instance wrote since its restore or reset (a runtime's own threads run on), is
//!   written now, whether
//!   the instance had faulted it in (written through /proc/PID/mem) or not (installed,
//!   UFFDIO_COPY). Every page the page server may still serve later, from the base, is
//!   then the same in both;
//! - **process state**: signal dispositions, cwd (the new code mount), umask,
//!   personality, resource limits, /tmp, and every thread's registers, FPU/SIMD state
//!   and signal mask, as the diff's image has them.
//!
//! Epoll registrations its init added (libuv's) are added too, file offsets it moved
//! (a JVM reading its runtime's jar) are moved, files it opened (the function's jars)
//! are opened at the same descriptors. What no call puts back must already be the
//! diff's: its threads, its other descriptors, credentials, timers and attributes (a
//! function whose init opened a socket, started a thread or armed a timer is refused).
//! Every page written is written in the eyes of
//! the write tracking (none is installed write-protected), so a later reset to the
//! base ([`crate::reset::reset`]) takes all of it back, and the diff's new mappings
//! are "created since" and go.
//!
//! [`plan`] works out what to do from the two images alone, before anything changes
//! (the caller asks it before it replaces the instance's code). Its refusal, and
//! [`InstallError::Refused`] from [`install`], come before anything changed: the
//! instance is still a clean base instance (it can load the function instead). After
//! any other error it is half-changed and has been killed.

use std::io;
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;
use tracing::debug;

use crate::image::{FdKind, FdRecord, PageIndex, ProcessImage, VmaKind};
use crate::inject::{self, Call, InjectError};
use crate::pageserver::{PageServerError, PageSource};
use crate::procfs;
use crate::reset::{install_run, runs, ResetError, Scratch, Tracking};
use crate::sys::mem::ProcMem;
use crate::sys::pagemap::Pagemap;
use crate::sys::ptrace::{self, Tracee};
use crate::sys::PAGE_SIZE;
use crate::ws::WorkingSet;

#[derive(Debug, Error)]
pub enum InstallError {
    /// Nothing changed: the instance is still a clean instance of its base.
    #[error("the function's snapshot cannot be installed into an instance of its base: {0}")]
    Refused(String),
    #[error("instance {pid}: {what}")]
    Io { pid: i32, what: String, #[source] source: io::Error },
    #[error("instance {pid}: installing the function's snapshot: {what}")]
    Failed { pid: i32, what: String },
    #[error("instance {pid}: reading the function's pages")]
    Pages { pid: i32, #[source] source: PageServerError },
    #[error("instance {pid}")]
    Inject { pid: i32, #[source] source: InjectError },
    #[error(transparent)]
    Reset(#[from] ResetError),
}

/// Figures of one [`install`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct InstallStats {
    pub install_ms: f64,
    /// Pages written over pages the instance had (/proc/PID/mem).
    pub pages_written: u64,
    /// Pages installed where the instance had none yet (UFFDIO_COPY).
    pub pages_installed: u64,
    /// Pages the instance wrote since its restore or reset (its runtime's own threads),
    /// given the diff's contents too.
    pub pages_written_since: u64,
    /// Pages of the diff's working set the instance lacked, installed (the base's).
    pub ws_pages_installed: u64,
    /// Mappings of the diff the base lacks, created (the heap's growth among them).
    pub mappings_created: u64,
    pub phases: Vec<(&'static str, f64)>,
}

/// What backs a range of a live restored process, as far as its layout goes: a
/// restore maps a file mapping stored whole (`FileCopied`) as anonymous memory.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Backing {
    Anon { growsdown: bool },
    File { path: String, offset: u64, shared: bool },
    Special(String),
}

/// A mapping of an image as a live restored process has it (adjacent anonymous
/// mappings of one protection are one).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seg {
    start: u64,
    end: u64,
    prot: i32,
    backing: Backing,
    advice: Vec<i32>,
}

const ANON: Backing = Backing::Anon { growsdown: false };

fn segments(img: &ProcessImage) -> Result<Vec<Seg>, String> {
    let mut out: Vec<Seg> = Vec::new();
    for v in &img.vmas {
        let path = |file: usize| img.files.get(file).map(|f| f.path.clone()).unwrap_or_default();
        let backing = match &v.kind {
            VmaKind::Anon { growsdown } => Backing::Anon { growsdown: *growsdown },
            VmaKind::FileCopied { .. } => ANON,
            VmaKind::FilePrivate { file, offset } => Backing::File { path: path(*file), offset: *offset, shared: false },
            VmaKind::FileShared { file, offset } if v.prot & libc::PROT_WRITE == 0 => Backing::File { path: path(*file), offset: *offset, shared: true },
            VmaKind::Special { name } => Backing::Special(name.clone()),
            other => return Err(format!("{:#x}-{:#x} is {other:?}", v.start, v.end)),
        };
        match out.last_mut() {
            Some(l) if l.end == v.start && l.prot == v.prot && l.backing == ANON && backing == ANON && l.advice == v.advice => l.end = v.end,
            _ => out.push(Seg { start: v.start, end: v.end, prot: v.prot, backing, advice: v.advice.clone() }),
        }
    }
    Ok(out)
}

/// What [`install`] does, worked out from the two images alone ([`plan`]).
#[derive(Debug, Default)]
pub struct Plan {
    /// The base's anonymous memory (the page server serves what is missing there).
    served: Vec<(u64, u64)>,
    /// The diff's anonymous memory.
    diff_anon: Vec<(u64, u64)>,
    /// The diff's mappings the base lacks.
    new: Vec<Seg>,
    /// Anonymous mappings of the base grown at their end: the growth (start, end, prot).
    grown: Vec<(u64, u64, i32)>,
    /// Pieces of the base's anonymous memory whose protection the diff changed.
    reprotect: Vec<(u64, u64, i32)>,
    /// The diff's break, when it is not the base's.
    brk: Option<u64>,
    /// Pages whose contents differ (the diff's: its stored page, or zeros).
    writes: Vec<u64>,
    /// Signals whose action differs: (signal, the diff's action words; zeros: default).
    sigactions: Vec<(u32, [u64; 4])>,
    /// Epoll registrations to change: (epoll fd, op, target fd, events, data), removals first.
    epoll: Vec<(i32, i32, i32, u32, u64)>,
    /// File offsets to move: (fd, offset).
    seeks: Vec<(i32, u64)>,
    /// Files its init opened: (fd, path, open flags, offset).
    opens: Vec<(i32, String, i32, u64)>,
}

/// A descriptor's kind, for messages.
fn kind_name(k: &FdKind) -> String {
    format!("{k:?}").split([' ', '(', '{']).next().unwrap_or_default().to_string()
}

/// Descriptors as far as an install goes: pipes and socketpairs named by the order
/// they appear in (their identities are the capture's), epoll registrations and file
/// offsets left out (an install changes them).
fn canonical_fds(fds: &[FdRecord]) -> Vec<FdRecord> {
    let mut ids: std::collections::HashMap<(bool, u64), u64> = Default::default();
    let mut name = |pipe: bool, id: &mut u64| {
        let n = ids.len() as u64;
        *id = *ids.entry((pipe, *id)).or_insert(n);
    };
    fds.iter()
        .map(|r| {
            let mut r = r.clone();
            match &mut r.kind {
                FdKind::Pipe { pipe, .. } => name(true, pipe),
                FdKind::SocketPair { pair, .. } => name(false, pair),
                FdKind::Epoll { items, .. } => items.clear(),
                FdKind::Path { pos, .. } => *pos = 0,
                _ => {}
            }
            r
        })
        .collect()
}

fn page_up(a: u64) -> u64 {
    a.next_multiple_of(PAGE_SIZE)
}

/// Work out how to turn a clean instance of `base` into one of `diff` (whose merged
/// page index is `index`), or say why it cannot be (`InstallError::Refused`).
pub fn plan(base: &ProcessImage, diff: &ProcessImage, index: &PageIndex) -> Result<Plan, InstallError> {
    plan_of(base, diff, index).map_err(InstallError::Refused)
}

fn plan_of(base: &ProcessImage, diff: &ProcessImage, index: &PageIndex) -> Result<Plan, String> {
    if diff.base.is_none() {
        return Err("it is a full image, not a diff".into());
    }
    let same_threads = diff.threads.len() == base.threads.len()
        && diff.threads.iter().zip(&base.threads).all(|(d, b)| {
            (d.tid, &d.rseq, d.robust_list, d.tid_address, &d.altstack, &d.comm) == (b.tid, &b.rseq, b.robust_list, b.tid_address, &b.altstack, &b.comm)
        });
    if !same_threads {
        return Err(format!("its threads are not the base's ({} threads, the base has {})", diff.threads.len(), base.threads.len()));
    }
    if diff.threads.iter().any(|t| !t.pending.is_empty()) {
        return Err("signals were pending when it was captured".into());
    }
    if !diff.children.is_empty() {
        return Err(format!("it had {} live child processes when it was captured", diff.children.len()));
    }
    // The base's descriptors, as the base has them (but for what an install changes);
    // those its init opened on top must be files, opened again here.
    let common: Vec<FdRecord> = diff.fds.iter().filter(|r| base.fds.iter().any(|b| b.fd == r.fd)).cloned().collect();
    if canonical_fds(&common) != canonical_fds(&base.fds) {
        return Err("its descriptors are not the base's (its init closed or replaced some)".into());
    }
    if diff.attrs != base.attrs || diff.creds != base.creds || diff.comm != base.comm {
        return Err("its credentials, timers or process attributes are not the base's".into());
    }
    let (m, n) = (&diff.mm, &base.mm);
    if (&m.fields, &m.auxv, &m.exe) != (&n.fields, &n.auxv, &n.exe) {
        return Err("its memory descriptor (code, stack, arguments, auxv) is not the base's".into());
    }
    let mut p = Plan::default();
    let pairs = || diff.fds.iter().filter_map(|d| base.fds.iter().find(|b| b.fd == d.fd).map(|b| (d, b)));
    for d in diff.fds.iter().filter(|d| !base.fds.iter().any(|b| b.fd == d.fd)) {
        match &d.kind {
            FdKind::Path { path, flags, pos } => p.opens.push((d.fd, path.clone(), *flags, *pos)),
            other => return Err(format!("its init opened descriptor {} ({}), which an install does not open", d.fd, kind_name(other))),
        }
    }
    // Epoll registrations its init added (libuv's, say), removed or changed.
    for (d, b) in pairs() {
        if let (FdKind::Epoll { items: want, .. }, FdKind::Epoll { items: have, .. }) = (&d.kind, &b.kind) {
            for &(tfd, ..) in have.iter().filter(|h| !want.iter().any(|w| w.0 == h.0)) {
                p.epoll.push((d.fd, libc::EPOLL_CTL_DEL, tfd, 0, 0));
            }
            for &(tfd, events, data) in want {
                match have.iter().find(|h| h.0 == tfd) {
                    None => p.epoll.push((d.fd, libc::EPOLL_CTL_ADD, tfd, events, data)),
                    Some(h) if (h.1, h.2) != (events, data) => p.epoll.push((d.fd, libc::EPOLL_CTL_MOD, tfd, events, data)),
                    Some(_) => {}
                }
            }
        }
    }
    p.epoll.sort_by_key(|e| e.1 != libc::EPOLL_CTL_DEL);
    // File offsets its init moved (a JVM reading its runtime's jar).
    for (d, b) in pairs() {
        if let (FdKind::Path { pos, .. }, FdKind::Path { pos: was, .. }) = (&d.kind, &b.kind) {
            if pos != was {
                p.seeks.push((d.fd, *pos));
            }
        }
    }
    for sig in (1..=64u32).filter(|&s| s != libc::SIGKILL as u32 && s != libc::SIGSTOP as u32) {
        let (b, d) = (base.sigaction_words(sig), diff.sigaction_words(sig));
        // A reset to the base puts back an action whose disposition changed (ignored,
        // caught, default: see reset.rs); one caught by another handler it would not see.
        let caught = |w: [u64; 4]| w[0] > 1;
        if b != d && caught(b) && caught(d) {
            return Err(format!("signal {sig} is caught by another action than the base's"));
        }
        if b != d {
            p.sigactions.push((sig, d));
        }
    }

    // ---- Layout.
    let (a, b) = (segments(base)?, segments(diff)?);
    let anon = |segs: &[Seg]| segs.iter().filter(|x| matches!(x.backing, Backing::Anon { .. })).map(|x| (x.start, x.end)).collect();
    (p.served, p.diff_anon) = (anon(&a), anon(&b));
    let describe = |x: &Seg| format!("{:#x}-{:#x} ({:?}, prot {})", x.start, x.end, x.backing, x.prot);
    for (i, s) in a.iter().enumerate() {
        let over: Vec<&Seg> = b.iter().filter(|x| x.start < s.end && s.start < x.end).collect();
        let Some(first) = over.first() else { return Err(format!("the base's {} is not in its image", describe(s))) };
        if s.backing != ANON {
            // Files, stacks and the kernel's mappings: exactly the same.
            if over.len() != 1 || *first != s {
                return Err(format!("the base's {} is {} in its image", describe(s), describe(first)));
            }
            continue;
        }
        // Anonymous memory: the same range, in pieces of other protections perhaps
        // (mprotect: V8's heap and code spaces), grown at its end perhaps.
        let next_base = a.get(i + 1).map_or(u64::MAX, |y| y.start);
        let prev_anon_end = i.checked_sub(1).map(|k| &a[k]).filter(|y| y.backing == ANON && y.end == s.start).map(|y| y.end);
        if first.start < s.start && prev_anon_end != Some(s.start) {
            return Err(format!("the base's {} grew at its start to {}", describe(s), describe(first)));
        }
        let mut at = first.start;
        for x in &over {
            if x.backing != ANON || x.advice != s.advice || x.start != at {
                return Err(format!("the base's {} is {} in its image", describe(s), describe(x)));
            }
            at = x.end;
            let (lo, hi) = (x.start.max(s.start), x.end.min(s.end));
            if x.prot != s.prot {
                p.reprotect.push((lo, hi, x.prot));
            }
            // Beyond the base's end and before its next mapping: grown.
            let (glo, ghi) = (x.start.max(s.end), x.end.min(next_base));
            if glo < ghi {
                p.grown.push((glo, ghi, x.prot));
            }
        }
        if at < s.end {
            return Err(format!("part of the base's {} is not in its image", describe(s)));
        }
    }
    for x in b.iter().filter(|x| !a.iter().any(|s| s.start < x.end && x.start < s.end)) {
        if let Backing::Special(name) = &x.backing {
            return Err(format!("it has a {name} mapping the base lacks"));
        }
        p.new.push(x.clone());
    }
    // The heap: brk moves the break and grows (or shrinks within a page) the heap's
    // mapping; its growth is not mapped otherwise.
    if m.brk != n.brk {
        let (from, to) = (page_up(n.brk), page_up(m.brk));
        if to < from {
            return Err("its heap is smaller than the base's".into());
        }
        if to > from {
            let before = (p.grown.len(), p.new.len());
            p.grown.retain(|g| (g.0, g.1) != (from, to));
            p.new.retain(|x| !(x.start == from && x.end == to && x.backing == ANON));
            if (p.grown.len(), p.new.len()) == before {
                return Err("its heap's growth is not a mapping of its own in its image".into());
            }
        }
        p.brk = Some(m.brk);
    }

    // ---- Memory: the diff's own pages, and the base's pages the diff has as zeros.
    for r in &diff.pages.runs {
        p.writes.extend((0..r.npages).map(|k| r.vaddr + k * PAGE_SIZE));
    }
    for r in &base.pages.runs {
        for addr in (0..r.npages).map(|k| r.vaddr + k * PAGE_SIZE) {
            if index.lookup(addr).is_some() {
                continue;
            }
            match b.iter().find(|x| x.start <= addr && addr < x.end).map(|x| &x.backing) {
                Some(Backing::Anon { .. }) => p.writes.push(addr),
                _ => return Err(format!("its page at {addr:#x} is a mapped file's, where the base has a page of its own")),
            }
        }
    }
    p.writes.sort_unstable();
    p.writes.dedup();
    Ok(p)
}

/// Make the clean base instance `pid` (not traced, idle; restored from `base` with
/// write tracking `t`, or reset to it) an instance of the diff `diff` on that base,
/// whose pages `source` serves, as `plan` ([`plan`] of the two) says (see the module
/// docs). The function's code must already be at /var/task. Must run on one thread from start to end (it becomes
/// the tracer).
///
/// `ws`: the diff's working set and its pages (in its layout's order), when it has
/// one: those of its pages in the base's memory that the instance lacks are installed
/// too (clean: they are the base's), so the first call does not fault them in.
pub fn install(
    pid: i32,
    base: &ProcessImage,
    diff: &ProcessImage,
    source: &PageSource,
    t: &Tracking,
    plan: &Plan,
    ws: Option<(&WorkingSet, &[u8])>,
) -> Result<InstallStats, InstallError> {
    let t0 = Instant::now();
    // The files the diff maps and the base does not must be those it captured.
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    for x in &plan.new {
        let Backing::File { path, .. } = &x.backing else { continue };
        let Some(f) = diff.files.iter().find(|f| f.path == *path) else { continue };
        if !std::fs::metadata(root.join(path.trim_start_matches('/'))).is_ok_and(|m| f.unchanged(&m)) {
            return Err(InstallError::Refused(format!("{path} changed since the snapshot was taken")));
        }
    }
    let mut traced = Vec::new();
    let r = install_traced(pid, base, diff, source, t, plan, ws, &mut traced, t0);
    match &r {
        Ok(_) => {}
        Err(InstallError::Refused(why)) => {
            debug!(pid, why, "the diff was not installed; the base instance is unchanged");
            for tr in traced.iter().rev() {
                let _ = tr.detach();
            }
        }
        Err(e) => {
            debug!(pid, error = %e, "installing a diff failed; killing the instance");
            ptrace::kill_and_reap(pid, &traced);
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn install_traced(
    pid: i32,
    base: &ProcessImage,
    diff: &ProcessImage,
    source: &PageSource,
    t: &Tracking,
    plan: &Plan,
    ws: Option<(&WorkingSet, &[u8])>,
    traced: &mut Vec<Tracee>,
    t0: Instant,
) -> Result<InstallStats, InstallError> {
    let mut out = InstallStats::default();
    let mut lap = t0;
    let mut phase = |name: &'static str, out: &mut InstallStats| {
        out.phases.push((name, lap.elapsed().as_secs_f64() * 1e3));
        lap = Instant::now();
    };
    let ioe = |what: &str| {
        let what = what.to_string();
        move |source| InstallError::Io { pid, what, source }
    };
    let inj = |source| InstallError::Inject { pid, source };
    let failed = |what: String| InstallError::Failed { pid, what };

    // ---- Stop every thread: the diff's, and no other.
    crate::threads::seize_all(pid, traced).map_err(|e| {
        let (what, source) = e.parts();
        InstallError::Io { pid, what, source }
    })?;
    let (named, extra) = crate::threads::name_by_image(pid, traced, &diff.threads).map_err(ioe("reading thread status"))?;
    if let Some(tr) = extra.first() {
        return Err(InstallError::Refused(format!("thread {} is not in the function's image (a clean base instance runs only the base's threads)", tr.pid)));
    }
    let mut by_thread = Vec::with_capacity(named.len());
    for (tr, image, st) in named {
        if st.sig_pending != 0 || st.shared_pending != 0 {
            return Err(InstallError::Refused("signals are pending in the instance".into()));
        }
        by_thread.push((tr, image));
    }
    if by_thread.len() != diff.threads.len() {
        return Err(InstallError::Refused(format!("the instance runs {} threads, the function's image has {}", traced.len(), diff.threads.len())));
    }
    let main = traced[0];
    if main.pid.as_raw() != pid {
        return Err(InstallError::Refused("the instance's first thread is not its leader".into()));
    }
    // Pages written since the instance was restored or reset (its runtime's threads,
    // its answer to the restore notice): they are not the base's image, so they take
    // the diff's contents too.
    let pm = Pagemap::open(pid).map_err(ioe("opening pagemap"))?;
    let within = |ranges: &[(u64, u64)], a: u64| ranges.iter().any(|&(s, e)| s <= a && a < e);
    let mut since = Vec::new();
    let mut written_since = Vec::new();
    for r in &t.ranges {
        since.clear();
        pm.written(r.start, r.end, &mut since).map_err(ioe("PAGEMAP_SCAN"))?;
        for &(s, e) in &since {
            for addr in (s..e).step_by(PAGE_SIZE as usize) {
                let stored = source.index.lookup(addr);
                if stored.is_none() && !within(&plan.diff_anon, addr) {
                    return Err(InstallError::Refused(format!("the instance wrote {addr:#x}, a page of a mapped file the function has as the file's")));
                }
                written_since.push(addr);
            }
        }
    }
    out.pages_written_since = written_since.len() as u64;
    phase("stop", &mut out);

    // ---- /tmp and /dev/shm as the diff has them.
    crate::reset::tmp_back(pid, diff, t)?;

    // ---- Layout and process state, by calls the process makes.
    let mut scratch = Scratch::default();
    let cstr = |s: &str| [s.as_bytes(), &[0]].concat();
    let paths: Vec<Option<usize>> =
        plan.new.iter().map(|x| if let Backing::File { path, .. } = &x.backing { Some(scratch.push(&cstr(path))) } else { None }).collect();
    let actions: Vec<(u32, usize)> =
        plan.sigactions.iter().map(|(sig, w)| (*sig, scratch.push(&w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()))).collect();
    let cwd = scratch.push(&cstr(&diff.cwd));
    let opened: Vec<usize> = plan.opens.iter().map(|(_, path, ..)| scratch.push(&cstr(path))).collect();
    // struct epoll_event (packed on x86-64: u32 events, u64 data).
    let events: Vec<usize> = plan.epoll.iter().map(|&(.., ev, data)| scratch.push(&[&ev.to_le_bytes()[..], &data.to_le_bytes()[..]].concat())).collect();
    let limits: Vec<(u32, usize)> = if diff.rlimits == base.rlimits {
        Vec::new()
    } else {
        diff.rlimits.iter().map(|&(res, cur, max)| (res, scratch.push(&[cur.to_le_bytes(), max.to_le_bytes()].concat()))).collect()
    };
    let mem = ProcMem::open(pid, true).map_err(ioe("opening /proc/PID/mem"))?;
    let insn = t.syscall_insn;
    let at = scratch.place(pid, &main, insn, &mem, &t.maps)?;
    let arg = |off: usize| at + off as u64;
    let run = |c: Call| -> Result<i64, InstallError> {
        let r = inject::single(&main, insn, c).map_err(inj)?;
        if r < 0 && c.nr != libc::SYS_brk {
            return Err(InstallError::Failed { pid, what: format!("{} failed with errno {}", c.name, -r) });
        }
        Ok(r)
    };
    if let Some(brk) = plan.brk {
        let r = run(Call::new("brk", libc::SYS_brk, &[brk]))?;
        if r as u64 != brk {
            return Err(failed(format!("brk({brk:#x}) returned {r:#x}")));
        }
        out.mappings_created += u64::from(page_up(brk) > page_up(base.mm.brk));
    }
    let noreplace = libc::MAP_FIXED_NOREPLACE as u64;
    let anon = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64 | noreplace;
    let mapped = |start: u64, r: i64| if r as u64 == start { Ok(()) } else { Err(failed(format!("mapping {start:#x} returned {r:#x}"))) };
    for (x, path) in plan.new.iter().zip(&paths) {
        let len = x.end - x.start;
        match (&x.backing, path) {
            (Backing::File { offset, shared, .. }, Some(p)) => {
                let flags = if *shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } as u64 | noreplace;
                let fd = run(Call::new("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, arg(*p), (libc::O_RDONLY | libc::O_CLOEXEC) as u64]))? as u64;
                let r = run(Call::new("mmap(file)", libc::SYS_mmap, &[x.start, len, x.prot as u64, flags, fd, *offset]));
                run(Call::new("close", libc::SYS_close, &[fd]))?;
                mapped(x.start, r?)?;
            }
            (Backing::Anon { growsdown }, _) => {
                let gd = if *growsdown { libc::MAP_GROWSDOWN as u64 } else { 0 };
                mapped(x.start, run(Call::new("mmap(anon)", libc::SYS_mmap, &[x.start, len, x.prot as u64, anon | gd, u64::MAX, 0]))?)?;
            }
            _ => return Err(failed(format!("{:#x}-{:#x} cannot be mapped", x.start, x.end))),
        }
        for &advice in &x.advice {
            run(crate::restore::advice_call(x.start, len, advice))?;
        }
        out.mappings_created += 1;
    }
    for &(start, end, prot) in &plan.reprotect {
        run(Call::new("mprotect", libc::SYS_mprotect, &[start, end - start, prot as u64]))?;
    }
    for &(start, end, prot) in &plan.grown {
        mapped(start, run(Call::new("mmap(growth)", libc::SYS_mmap, &[start, end - start, prot as u64, anon, u64::MAX, 0]))?)?;
        out.mappings_created += 1;
    }
    for &(sig, off) in &actions {
        run(Call::new("rt_sigaction", libc::SYS_rt_sigaction, &[sig as u64, arg(off), 0, 8]))?;
    }
    for (&(epfd, op, tfd, ..), &off) in plan.epoll.iter().zip(&events) {
        let ev = if op == libc::EPOLL_CTL_DEL { 0 } else { arg(off) };
        run(Call::new("epoll_ctl", libc::SYS_epoll_ctl, &[epfd as u64, op as u64, tfd as u64, ev]))?;
    }
    for ((fd, _, flags, pos), &off) in plan.opens.iter().zip(&opened) {
        let f = (flags & !(libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL)) as u64;
        let got = run(Call::new("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, arg(off), f]))?;
        if got != *fd as i64 {
            run(Call::new("dup3", libc::SYS_dup3, &[got as u64, *fd as u64, (flags & libc::O_CLOEXEC) as u64]))?;
            run(Call::new("close", libc::SYS_close, &[got as u64]))?;
        }
        run(Call::new("lseek", libc::SYS_lseek, &[*fd as u64, *pos, libc::SEEK_SET as u64]))?;
    }
    for &(fd, pos) in &plan.seeks {
        run(Call::new("lseek", libc::SYS_lseek, &[fd as u64, pos, libc::SEEK_SET as u64]))?;
    }
    // Always: /var/task is a new mount, and the old cwd is on the one it replaced.
    run(Call::new("chdir", libc::SYS_chdir, &[arg(cwd)]))?;
    if diff.umask != base.umask {
        run(Call::new("umask", libc::SYS_umask, &[diff.umask as u64]))?;
    }
    if diff.personality != base.personality {
        run(Call::new("personality", libc::SYS_personality, &[diff.personality as u64]))?;
    }
    for &(res, off) in &limits {
        run(Call::new("prlimit64", libc::SYS_prlimit64, &[0, res as u64, arg(off), 0]))?;
    }
    phase("layout", &mut out);

    // ---- Memory: each page that differs, and the pages the arguments above took.
    let mut writes = plan.writes.clone();
    writes.extend(written_since);
    let first = at & !(PAGE_SIZE - 1);
    let scratch_pages = (at + scratch.bytes.len() as u64 - first).div_ceil(PAGE_SIZE);
    writes.extend((0..scratch_pages).map(|k| first + k * PAGE_SIZE));
    writes.sort_unstable();
    writes.dedup();
    // Missing pages of the base's anonymous memory are the page server's: installed
    // (a write through /proc/PID/mem would fault there and fail).
    let served = |a: u64| within(&plan.served, a);
    let page = PAGE_SIZE as usize;
    // Read run by run into one buffer; the pieces the instance has (or that no page
    // server serves) are written together (ProcMem::write_runs), the others installed.
    let mut buf: Vec<u8> = Vec::new();
    let mut direct_runs: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
    // Runs of consecutive addresses: the diff's contents there read at once.
    for (i, j) in runs(writes.len(), |k| writes[k] == writes[k - 1] + PAGE_SIZE) {
        let (addr, n) = (writes[i], j - i);
        let start = buf.len();
        buf.resize(start + n * page, 0);
        source.read_image(addr, &mut buf[start..]).map_err(|source| InstallError::Pages { pid, source })?;
        let present = pm.present(addr, n).map_err(ioe("reading pagemap"))?;
        let direct = |k: usize| present[k] || !served(addr + k as u64 * PAGE_SIZE);
        for (k, l) in runs(n, |k| direct(k) == direct(k - 1)) {
            let at = addr + k as u64 * PAGE_SIZE;
            let bytes = start + k * page..start + l * page;
            if direct(k) {
                direct_runs.push((at, bytes));
                out.pages_written += (l - k) as u64;
            } else {
                let (installed, written) = install_run(t, &mem, at, &buf[bytes], false).map_err(|(what, source)| InstallError::Io { pid, what, source })?;
                out.pages_installed += installed;
                out.pages_written += written;
            }
        }
        if buf.len() >= crate::reset::WRITE_BACK_BATCH {
            mem.write_runs(&buf, &direct_runs).map_err(ioe("writing the diff's pages"))?;
            buf.clear();
            direct_runs.clear();
        }
    }
    mem.write_runs(&buf, &direct_runs).map_err(ioe("writing the diff's pages"))?;
    phase("memory", &mut out);

    // ---- The working set's pages the instance lacks in the base's memory: the base's
    //      (the diff's own were written above), installed clean.
    if let Some((ws, bytes)) = ws.filter(|(ws, bytes)| bytes.len() >= ws.layout.len() * page) {
        let lay = &ws.layout;
        for (k, l) in runs(lay.len(), |i| lay[i].0 == lay[i - 1].0 + PAGE_SIZE) {
            let present = pm.present(lay[k].0, l - k).map_err(ioe("reading pagemap"))?;
            let wanted = |i: usize| !present[i - k] && served(lay[i].0);
            for (i, e) in runs(l - k, |i| wanted(k + i) == wanted(k + i - 1)).into_iter().map(|(i, e)| (k + i, k + e)) {
                if wanted(i) {
                    let (installed, _) = install_run(t, &mem, lay[i].0, &bytes[i * page..e * page], true).map_err(|(what, source)| {
                        let at = lay[i].0;
                        let live = procfs::maps(pid).ok().and_then(|ms| ms.into_iter().find(|m| m.start <= at && at < m.end));
                        InstallError::Io { pid, what: format!("{what} (working set; live mapping {live:?})"), source }
                    })?;
                    out.ws_pages_installed += installed;
                }
            }
        }
        phase("working_set", &mut out);
    }

    // ---- Registers, FPU/SIMD state, signal masks; then let go.
    crate::reset::resume_as(&by_thread, traced).map_err(|(what, source)| InstallError::Io { pid, what: what.into(), source })?;
    phase("registers", &mut out);
    out.install_ms = t0.elapsed().as_secs_f64() * 1e3;
    debug!(pid, ?out, "diff installed");
    Ok(out)
}

