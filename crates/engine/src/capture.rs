//! Capture: freeze a ready-to-invoke sandboxed process and write its image.
//!
//! Order matters: stop the threads and read their registers, then map the
//! injection's scratch region and drain the socketpairs (so descriptors in flight
//! are received and described like the others, capture/passed.rs), read what is
//! visible from the outside (/proc, memory; the region is not among the maps read
//! before it), *then* inject the syscalls that read what only the process itself
//! can report (signal handlers, tid address, brk, cwd). Injection clobbers
//! registers and takes queued messages, which is harmless because the process is
//! killed after capture.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use tracing::{debug, info};

use crate::image::{
    AltStack, Creds, FdKind, FdRecord, FileRef, ImageError, MmState, PageIndex, PendingSignal, PosixTimer, ProcAttrs, ProcessImage, Rseq, SandboxRecord,
    SigAction, SnapshotWriter, ThreadState, Vma, VmaKind, Zombie,
};
use crate::inject::{self, Call, DataArea, InjectError, Injector, REGION_LEN};
use crate::procfs::{self, MapEntry};
use crate::regs;
use crate::sockdiag;
use crate::sys::mem::ProcMem;
use crate::sys::ptrace::{self, Tracee};
use crate::sys::PAGE_SIZE;

mod fds;
mod inotify;
mod passed;
mod tree;
mod unlinked;

#[derive(Debug, Error)]
pub enum CaptureError {
    #[error("cannot capture pid {pid}: {reason}")]
    Refused { pid: i32, reason: String },
    #[error("capture of pid {pid}: {what}")]
    Io { pid: i32, what: String, #[source] source: io::Error },
    #[error("capture of pid {pid}: injecting syscalls")]
    Inject { pid: i32, #[source] source: InjectError },
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// Figures from one capture.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CaptureStats {
    pub vmas: usize,
    pub pages_stored: u64,
    pub pages_zero_skipped: u64,
    /// Private file mappings stored whole (see `VmaKind::FileCopied`).
    pub vmas_copied_whole: u64,
    /// Pages of a diff equal to its base's page at the same address (not stored); of
    /// a child process, equal to the runtime's.
    pub pages_from_base: u64,
    /// Live child processes captured with the runtime.
    pub children: u64,
    pub bytes_written: u64,
    pub capture_ms: f64,
}

const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
const PM_FILE: u64 = 1 << 61;
/// Upper bound of a single /proc/PID/mem read while dumping.
const DUMP_CHUNK_PAGES: u64 = 256;

/// Capture the process `pid` (PID 2 of its sandbox, the runtime, waiting in its
/// control-channel read) into `out`.
pub fn capture(pid: i32, sandbox: SandboxRecord, out: &Path) -> Result<(PathBuf, CaptureStats), CaptureError> {
    capture_with(pid, sandbox, out, Layer::Full)
}

/// What a capture makes (see `layers.rs`).
#[derive(Clone, Copy)]
pub enum Layer<'a> {
    /// A full image (sealed when this process holds a node key).
    Full,
    /// A base: a full image, never sealed (it holds nothing of any function).
    Base,
    /// A diff: pages equal to the base's page at the same address are not stored
    /// but taken from the base.
    Diff(&'a crate::layers::Comparer),
}

/// [`capture`] one kind of layer.
pub fn capture_with(pid: i32, sandbox: SandboxRecord, out: &Path, layer: Layer<'_>) -> Result<(PathBuf, CaptureStats), CaptureError> {
    let mut seized = Vec::new();
    let mut kids = Vec::new();
    let result = capture_inner(pid, sandbox, out, layer, &mut seized, &mut kids);
    // Whatever happened, the process is not resumed: kill it and reap the threads
    // we trace (a traced thread's exit waits for its tracer, and the leader's
    // exit waits for its threads); its child processes likewise.
    crate::sys::ptrace::kill_and_reap(pid, &seized);
    for (host, tracees) in &kids {
        crate::sys::ptrace::kill_and_reap(*host, tracees);
    }
    result
}

fn capture_inner(
    pid: i32,
    sandbox: SandboxRecord,
    out: &Path,
    layer: Layer<'_>,
    seized: &mut Vec<Tracee>,
    kids: &mut Vec<(i32, Vec<Tracee>)>,
) -> Result<(PathBuf, CaptureStats), CaptureError> {
    let t0 = Instant::now();
    let ioe = |what: &str| {
        let what = what.to_string();
        move |source| CaptureError::Io { pid, what, source }
    };
    let refuse = |reason: String| CaptureError::Refused { pid, reason };

    let tracees = seize_all(pid, seized)?;
    let status = procfs::status(pid).map_err(ioe("reading status"))?;
    let shared_pending = pending_signals(pid, &tracees[0], true, status.shared_pending).map_err(|e| e.into_capture(pid, "the process"))?;
    let timers = posix_timers(pid)?;

    let mut threads = thread_states(pid, &tracees)?;
    if threads[0].tid != MAIN_PID {
        return Err(refuse(format!("its thread group leader is pid {} in its namespace, not {MAIN_PID}", threads[0].tid)));
    }
    let (zombies, live) = children_of(pid, true)?;
    let tree = tree::seize(&live, kids)?;

    // Process state visible through /proc.
    let maps = procfs::maps(pid).map_err(ioe("reading maps"))?;
    crate::refusals::check_maps(&maps).map_err(refuse)?;
    let fields = procfs::stat(pid).map_err(ioe("reading stat"))?;
    let auxv = procfs::auxv(pid).map_err(ioe("reading auxv"))?;
    let exe = procfs::exe(pid).map_err(ioe("reading exe link"))?;
    let personality = procfs::personality(pid).map_err(ioe("reading personality"))?;
    // Descriptors in flight: every socketpair end drained first, so that what the
    // queued messages passed is received into the process and described below
    // like its own descriptors (capture/passed.rs). The region the injection needs
    // is not among `maps`, so it is not captured.
    let (region, wmem) = injection_region(&tracees[0], &maps).map_err(|source| CaptureError::Inject { pid, source })?;
    let inj = Injector::new(tracees[0], &wmem, region).map_err(|source| CaptureError::Inject { pid, source })?;
    // What only the child processes hold is copied into the leader first, then
    // drained and described with its own (capture/tree.rs).
    let handed = tree::hand_down(&inj, region, pid, &tree)?;
    let (drains, received) = passed::drain_all(&inj, region, pid)?;
    for (fd, drained) in &drains {
        if let passed::Drained::Refused(what) = drained {
            return Err(refuse(format!("descriptor {fd} is a unix socketpair end on which {what}")));
        }
    }
    // Events queued on inotify instances, read out before anything here opens or
    // lists a file they may watch (the walks of /tmp and of inotify's watched paths
    // below would queue events of our own).
    // The descriptors as they are now, those just received included.
    let list = procfs::fds(pid).map_err(ioe("listing descriptors"))?;
    let inotify_queued = inotify::read_queued(&inj, region, pid, &list)?;
    let mut fds = fds::capture_fds(pid, list, &received).map_err(|e| handed.name_copies(e))?;
    handed.check(&fds).map_err(refuse)?;
    for (fd, drained) in drains.iter() {
        if let (passed::Drained::Messages(m), Some(FdRecord { kind: FdKind::SocketPair { queued, .. }, .. })) = (drained, fds.iter_mut().find(|r| r.fd == *fd)) {
            *queued = m.iter().map(|(bytes, _)| bytes.clone()).collect();
        }
    }
    let tmp = crate::tmpfs::capture(Path::new(&format!("/proc/{pid}/root"))).map_err(|e| match e {
        crate::tmpfs::TmpfsError::Io { .. } => CaptureError::Io { pid, what: "capturing /tmp".into(), source: io::Error::other(e) },
        refusal => refuse(refusal.to_string()),
    })?;

    let (mut vmas, files) = classify_vmas(pid, &maps, &mut fds)?;
    // A mapping is made from its descriptor after the descriptors are restored, and
    // one in flight is closed by then (it is in its message).
    if let Some((v, r)) = vmas.iter().find_map(|v| match v.kind {
        VmaKind::Unlinked { fd, .. } => received.iter().find(|r| r.fd == fd).map(|r| (v, r)),
        _ => None,
    }) {
        return Err(refuse(format!(
            "descriptor {} is a unix socketpair end with a descriptor in flight (SCM_RIGHTS) of an object the process maps at {:#x}; a restore cannot map it from its message",
            r.send.0, v.start
        )));
    }
    let mem = ProcMem::open(pid, false).map_err(ioe("opening /proc/PID/mem"))?;
    let base = match layer {
        Layer::Diff(b) => Some(b),
        _ => None,
    };
    let against = base.map(|b| b as &dyn SamePage);
    let mut writer = match layer {
        Layer::Base => SnapshotWriter::create_with(out, None)?,
        _ => SnapshotWriter::create(out)?,
    };
    let mut pages = PageIndex::default();
    let (base_pages, mut stats) = match dump_pages(pid, &mem, &mut vmas, &files, against, &mut writer, &mut pages, 0) {
        Ok(x) => x,
        Err(e) => {
            writer.abandon();
            return Err(e);
        }
    };

    // State only the process can report: inject syscalls.
    let injected = match injected_state(&tracees, region, &wmem, &fds, timers) {
        Ok(x) => x,
        Err(e) => {
            writer.abandon();
            return Err(CaptureError::Inject { pid, source: e });
        }
    };
    if injected.sysv_segments > 0 {
        // Attached ones were refused with the maps; these live only in the sandbox's
        // IPC namespace, which dies with it.
        writer.abandon();
        return Err(refuse(format!(
            "it created {} System V shared memory segment(s) (shmget) that are not attached; SysV shm is not carried across a snapshot",
            injected.sysv_segments
        )));
    }
    for (fd, n, bytes) in inotify_queued {
        if n as usize > PIPE_DATA_MAX {
            writer.abandon();
            return Err(refuse(format!(
                "descriptor {fd} is an inotify instance with {n} bytes of events queued, more than a snapshot carries ({PIPE_DATA_MAX}; read them before init ends)"
            )));
        }
        // Caused again at restore from outside the process, which needs every
        // instance at its number then (one in flight is closed by then).
        if let Some(r) = fds.iter().find(|r| received.iter().any(|x| x.fd == r.fd) && matches!(r.kind, FdKind::Inotify { .. })) {
            writer.abandon();
            return Err(refuse(format!(
                "descriptor {fd} is an inotify instance with events queued while inotify instance {} is in flight (SCM_RIGHTS); its events cannot be caused again",
                r.fd
            )));
        }
        if let Some(FdRecord { kind: FdKind::Inotify { watches, queued, .. }, .. }) = fds.iter_mut().find(|r| r.fd == fd) {
            match inotify::queued(pid, fd, &bytes, watches) {
                Ok(events) => *queued = events,
                Err(e) => {
                    writer.abandon();
                    return Err(e);
                }
            }
        }
    }
    for (fd, got) in injected.socket_options {
        if let Some(FdRecord { kind: FdKind::SocketPair { options, .. }, .. }) = fds.iter_mut().find(|r| r.fd == fd) {
            *options = got;
        }
    }
    for (fd, got) in injected.pipe_sizes {
        if let Some(FdRecord { kind: FdKind::Pipe { size, .. }, .. }) = fds.iter_mut().find(|r| r.fd == fd) {
            *size = got;
        }
    }
    for (fd, bytes) in injected.pipe_data {
        if let Some(FdRecord { kind: FdKind::Pipe { buffered, .. }, .. }) = fds.iter_mut().find(|r| r.fd == fd) {
            *buffered = bytes;
        }
    }
    if !drains.is_empty() {
        // Everything queued must have been read out: a peer still charged for unread
        // data (an empty record taken for end of stream, say) would lose it.
        let socks = sockdiag::unix_sockets(pid).map_err(|source| CaptureError::Io { pid, what: "listing unix sockets (sock_diag)".into(), source })?;
        for r in &fds {
            let FdKind::SocketPair { .. } = &r.kind else { continue };
            let ino = std::fs::read_link(format!("/proc/{pid}/fd/{}", r.fd)).ok().and_then(|t| sockdiag::inode_of(&t.to_string_lossy()));
            if ino.and_then(|i| socks.get(&i)).is_none_or(|s| s.wqueue > 0) {
                writer.abandon();
                return Err(refuse(format!("descriptor {} is a unix socketpair end whose sent data could not all be read out", r.fd)));
            }
        }
    }
    // What was received out of queued messages goes back into them at restore.
    passed::wrap(&mut fds, &received);
    for (t, (tid_address, altstack)) in threads.iter_mut().zip(injected.per_thread) {
        t.tid_address = tid_address;
        t.altstack = altstack;
    }

    // A zombie recreated while SIGCHLD is ignored (or SA_NOCLDWAIT) would be reaped
    // at once: it could not be waited for after the restore.
    let sigchld_ignored = injected.sigactions.iter().any(|a| a.sig == libc::SIGCHLD as u32 && (a.handler == 1 || a.flags & libc::SA_NOCLDWAIT as u64 != 0));
    if !zombies.is_empty() && sigchld_ignored {
        writer.abandon();
        return Err(refuse(format!("{} zombie child processes while SIGCHLD is ignored (or SA_NOCLDWAIT): recreated, they would be reaped at once", zombies.len())));
    }
    // The child processes, their pages after the leader's (keyed apart: they share
    // its addresses).
    let mut numbered = 0;
    let mut children = Vec::with_capacity(tree.len());
    if !tree.is_empty() {
        // (A copy of the leader's index: made only when there are children.)
        let leader = tree::LeaderPages::new(&mem, &maps, &pages, &base_pages);
        for m in &tree {
            let parent = (injected.attrs.pgid, injected.attrs.sid);
            match tree::capture_child(m, parent, &handed, &leader, &sandbox, &mut writer, &mut pages, &mut numbered, &mut stats) {
                Ok(c) => children.push(c),
                Err(e) => {
                    writer.abandon();
                    return Err(e);
                }
            }
        }
    }
    let image = ProcessImage {
        created_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
        kernel: nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default(),
        sandbox,
        threads,
        mm: MmState { fields, brk: injected.brk, auxv, exe },
        sigactions: injected.sigactions,
        rlimits: injected.rlimits,
        creds: Creds { uid: status.uid, gid: status.gid, groups: status.groups.clone() },
        cwd: injected.cwd,
        umask: status.umask,
        personality,
        comm: std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim_end().to_string()).unwrap_or_default(),
        files,
        vmas,
        fds,
        pages,
        tmp,
        // Set by the writer when it seals the image.
        seal: None,
        base: base.map(|b| b.base_ref(&base_pages)),
        attrs: ProcAttrs {
            pending_signals: shared_pending,
            zombies,
            oom_score_adj: std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0),
            ..injected.attrs
        },
        children,
        handed_down: handed.copies(),
    };
    stats.vmas += image.vmas.len();
    let dir = writer.finish(&image)?;
    stats.capture_ms = t0.elapsed().as_secs_f64() * 1e3;
    info!(pid, dir = %dir.display(), pages = stats.pages_stored, ms = stats.capture_ms, "captured");
    Ok((dir, stats))
}

pub use crate::conventions::MAIN_PID;

/// The state of each of `tracees` (the threads of `pid`, stopped) that ptrace and
/// /proc show.
fn thread_states(pid: i32, tracees: &[Tracee]) -> Result<Vec<ThreadState>, CaptureError> {
    let ioe = |what: &str| {
        let what = what.to_string();
        move |source| CaptureError::Io { pid, what, source }
    };
    let refuse = |reason: String| CaptureError::Refused { pid, reason };
    let mut threads = Vec::with_capacity(tracees.len());
    for t in tracees {
        let tid = t.pid.as_raw();
        let tst = procfs::thread_status(pid, tid).map_err(ioe("reading thread status"))?;
        // Filters of its own would not be installed again: refused, not dropped.
        if tst.seccomp_filters > crate::conventions::SANDBOX_SECCOMP_FILTERS {
            return Err(refuse(format!(
                "thread {tid} of the process runs under {} seccomp filter(s) it installed itself (seccomp(2) or prctl(PR_SET_SECCOMP)); they are not carried across a snapshot",
                tst.seccomp_filters - crate::conventions::SANDBOX_SECCOMP_FILTERS
            )));
        }
        let pending = pending_signals(pid, t, false, tst.sig_pending).map_err(|e| e.into_capture(pid, &format!("thread {tid}")))?;
        let mut r = t.get_regs().map_err(ioe("reading registers"))?;
        regs::rewind_interrupted_syscall(&mut r);
        let rseq = t.get_rseq().map_err(ioe("reading rseq configuration"))?;
        threads.push(ThreadState {
            tid: *tst.nspid.last().unwrap_or(&tid),
            regs: regs::to_array(&r),
            xstate: t.get_xstate().map_err(ioe("reading xstate"))?,
            sigmask: t.get_sigmask().map_err(ioe("reading signal mask"))?,
            rseq: (rseq.rseq_abi_pointer != 0).then_some(Rseq {
                ptr: rseq.rseq_abi_pointer,
                len: rseq.rseq_abi_size,
                sig: rseq.signature,
            }),
            robust_list: ptrace::robust_list(tid).map_err(ioe("reading robust list"))?,
            tid_address: 0,
            altstack: None,
            comm: procfs::thread_comm(pid, tid).map_err(ioe("reading thread name"))?,
            pending,
            sched_policy: sched_policy(pid, tid).map_err(refuse)?,
        });
    }
    Ok(threads)
}

/// Thread `tid`'s scheduling policy, one a restore can set again without privilege
/// (a real-time one, which the sandbox does not allow anyway, is refused).
fn sched_policy(pid: i32, tid: i32) -> Result<i32, String> {
    let policy = procfs::thread_stat(pid, tid).map_err(|e| format!("thread {tid}'s scheduling policy cannot be read: {e}"))?.policy;
    match policy {
        libc::SCHED_OTHER | libc::SCHED_BATCH | libc::SCHED_IDLE => Ok(policy),
        other => Err(format!("thread {tid} of the process runs under real-time scheduling policy {other}, which a restore cannot set again")),
    }
}

/// The children of `pid`: its zombies (exited, not yet waited for), which the
/// restore recreates, and the host pids of its live children, captured with it
/// (capture/tree.rs). Anything else is refused, named, rather than silently dropped
/// (a restore would run without it): a stopped child, a zombie killed by a signal or
/// in another process group or session, and for the runtime (`leader`) any process
/// the init adopted (an orphan the runtime left, a daemon).
fn children_of(pid: i32, leader: bool) -> Result<(Vec<Zombie>, Vec<i32>), CaptureError> {
    let children = |p: i32| -> Vec<i32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { return Vec::new() };
        let mut out = Vec::new();
        for t in tasks.flatten() {
            let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(list.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
        }
        out
    };
    let init = if leader { procfs::status(pid).ok().map(|s| s.ppid).unwrap_or(0) } else { 0 };
    let me = procfs::proc_stat(pid).map_err(|source| CaptureError::Io { pid, what: "reading stat".into(), source })?;
    let mut zombies = Vec::new();
    let mut live = Vec::new();
    // (host pid, why it cannot be recreated).
    let mut others: Vec<(i32, &str)> = Vec::new();
    for c in children(pid) {
        let (Ok(st), Ok(status)) = (procfs::proc_stat(c), procfs::status(c)) else {
            others.push((c, "gone while listed"));
            continue;
        };
        match st.state {
            'Z' if st.exit_code & 0x7f != 0 => others.push((c, "a zombie killed by a signal")),
            'Z' if (st.pgrp, st.session) != (me.pgrp, me.session) => others.push((c, "a zombie in another process group or session")),
            'Z' => zombies.push(Zombie { pid: status.nspid.last().copied().unwrap_or(c), status: st.exit_code }),
            // (`t`, stopped by a tracer, is one seized here: a live child; another
            // tracer's would fail the seize.)
            'T' => others.push((c, "a stopped process: job control state is not carried")),
            _ => live.push(c),
        }
    }
    if init > 0 {
        others.extend(children(init).into_iter().filter(|&c| c != pid).map(|c| (c, "adopted by the init: an orphan or daemon, whose parent is gone")));
    }
    if others.is_empty() {
        zombies.sort_by_key(|z| z.pid);
        live.sort_unstable();
        return Ok((zombies, live));
    }
    others.sort_unstable();
    let named: Vec<String> = others
        .iter()
        .map(|&(c, why)| {
            let st = procfs::status(c).ok();
            let ns = st.as_ref().and_then(|s| s.nspid.last().copied()).unwrap_or(c);
            let cmd = std::fs::read(format!("/proc/{c}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string())
                .unwrap_or_default();
            let cmd = if cmd.is_empty() { procfs::thread_comm(c, c).unwrap_or_default() } else { cmd };
            format!("pid {ns} ({}, {why})", cmd.chars().take(60).collect::<String>())
        })
        .collect();
    Err(CaptureError::Refused {
        pid,
        reason: format!(
            "the instance has processes that cannot be captured: {} (start them in the handler, or wait for them before init ends)",
            named.join(", ")
        ),
    })
}

/// Stop every thread of `pid` (the leader first; see [`crate::threads::seize_all`]).
fn seize_all(pid: i32, tracees: &mut Vec<Tracee>) -> Result<Vec<Tracee>, CaptureError> {
    crate::threads::seize_all(pid, tracees).map_err(|e| {
        let (what, source) = e.parts();
        CaptureError::Io { pid, what, source }
    })?;
    Ok(tracees.clone())
}

pub use crate::conventions::HIGH_FD_BASE;

fn prot_of(m: &MapEntry) -> i32 {
    (if m.read { libc::PROT_READ } else { 0 })
        | (if m.write { libc::PROT_WRITE } else { 0 })
        | (if m.exec { libc::PROT_EXEC } else { 0 })
}

/// The madvise() advice a VMA's flags (smaps VmFlags) record and a restore must set
/// again: dc = MADV_DONTFORK, wf = MADV_WIPEONFORK, hg = MADV_HUGEPAGE,
/// nh = MADV_NOHUGEPAGE; lo = locked ([`crate::image::ADVICE_MLOCK`]).
fn advice_of(m: &MapEntry) -> Vec<i32> {
    [
        ("dc", libc::MADV_DONTFORK),
        ("wf", libc::MADV_WIPEONFORK),
        ("hg", libc::MADV_HUGEPAGE),
        ("nh", libc::MADV_NOHUGEPAGE),
        ("lo", crate::image::ADVICE_MLOCK),
    ]
        .into_iter()
        .filter(|(flag, _)| m.has_flag(flag))
        .map(|(_, advice)| advice)
        .collect()
}

/// The process's mappings as the image records them, and the files they map. A
/// mapped memfd or deleted /tmp file the process holds no descriptor of is added to
/// `fds` (see [`unlinked`]).
fn classify_vmas(pid: i32, maps: &[MapEntry], fds: &mut Vec<FdRecord>) -> Result<(Vec<Vma>, Vec<FileRef>), CaptureError> {
    let refuse = |reason: String| CaptureError::Refused { pid, reason };
    let mut unlinked = unlinked::Unlinked::new(pid, fds)?;
    let mut vmas = Vec::new();
    let mut files: Vec<FileRef> = Vec::new();
    for m in maps {
        let kind = match m.name.as_str() {
            "[vsyscall]" | "[uprobes]" => continue,
            "[vdso]" | "[vvar]" | "[vvar_vclock]" => VmaKind::Special { name: m.name.clone() },
            name if m.shared && name.starts_with("/dev/zero") => {
                if m.end - m.start > crate::image::MAX_SHARED_ANON {
                    return Err(refuse(format!(
                        "it has shared anonymous memory of {} MiB at {:#x}-{:#x}, over the {} MiB stored whole",
                        (m.end - m.start) >> 20,
                        m.start,
                        m.end,
                        crate::image::MAX_SHARED_ANON >> 20
                    )));
                }
                VmaKind::SharedAnon
            }
            _ if unlinked::is_unlinked(m) => unlinked.kind(m, fds)?,
            name if m.is_file() => {
                if name.ends_with(" (deleted)") {
                    return Err(refuse(format!("it maps a deleted file: {name}")));
                }
                if m.shared && m.write {
                    return Err(refuse(format!("it has a writable shared mapping of {name}")));
                }
                let file = match files.iter().position(|f| f.path == name) {
                    Some(i) => i,
                    None => {
                        let meta = std::fs::metadata(format!("/proc/{pid}/root{name}")).map_err(|source| {
                            CaptureError::Io { pid, what: format!("stat of mapped file {name}"), source }
                        })?;
                        files.push(FileRef::of(name, &meta));
                        files.len() - 1
                    }
                };
                if m.shared {
                    VmaKind::FileShared { file, offset: m.offset }
                } else {
                    VmaKind::FilePrivate { file, offset: m.offset }
                }
            }
            "" | "[heap]" | "[stack]" => {
                if m.shared {
                    return Err(refuse(format!("it has shared anonymous memory at {:#x}-{:#x}", m.start, m.end)));
                }
                VmaKind::Anon { growsdown: m.has_flag("gd") }
            }
            name if name.starts_with("[anon:") => VmaKind::Anon { growsdown: m.has_flag("gd") },
            name => return Err(refuse(format!("it has a mapping the engine cannot recreate: {name}"))),
        };
        vmas.push(Vma { start: m.start, end: m.end, prot: prot_of(m), kind, advice: advice_of(m) });
    }
    Ok((vmas, files))
}

/// Which pages of a VMA belong in the image, given its pagemap entry.
fn page_wanted(kind: &VmaKind, pm: u64) -> bool {
    match kind {
        VmaKind::Anon { .. } => pm & (PM_PRESENT | PM_SWAPPED) != 0,
        // Only copy-on-written (now anonymous) pages differ from the file.
        VmaKind::FilePrivate { .. } | VmaKind::Unlinked { shared: false, .. } => pm & PM_PRESENT != 0 && pm & PM_FILE == 0,
        // The whole contents (written pages and the file's own). Shared memory too:
        // a page it holds need not be mapped (pagemap says nothing of one released
        // with MADV_DONTNEED, still in the shared object).
        VmaKind::FileCopied { .. } | VmaKind::SharedAnon => true,
        // Shared memfd or deleted-file memory is its object's contents (its descriptor's).
        VmaKind::FileShared { .. } | VmaKind::Special { .. } | VmaKind::Unlinked { shared: true, .. } => false,
    }
}

/// A private file mapping with at least this share of its pages written is
/// stored whole and restored as anonymous memory ([`VmaKind::FileCopied`]):
/// restoring it as a file mapping would mean copying every written page into
/// place before the process resumes, touched or not.
const COPY_WHOLE_SHARE: f64 = 0.5;

/// Whether a private file mapping with `written` of its `npages` pages written
/// should be stored whole. Only mappings that lie inside the file qualify (a page
/// past the end of the file cannot be read, and faults there raise SIGBUS).
fn copy_whole(v: &Vma, files: &[FileRef], written: u64, npages: u64) -> Option<VmaKind> {
    let VmaKind::FilePrivate { file, offset } = v.kind else { return None };
    let file_end = files.get(file)?.size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let inside = offset + (v.end - v.start) <= file_end;
    (inside && written as f64 >= COPY_WHOLE_SHARE * npages as f64).then_some(VmaKind::FileCopied { file, offset })
}

/// A page a capture need not store: the same as one it is taken from at restore.
pub(crate) trait SamePage {
    fn same(&self, vaddr: u64, page: &[u8]) -> bool;
}

impl SamePage for crate::layers::Comparer {
    fn same(&self, vaddr: u64, page: &[u8]) -> bool {
        crate::layers::Comparer::same(self, vaddr, page)
    }
}

#[allow(clippy::too_many_arguments)]
fn dump_pages(
    pid: i32,
    mem: &ProcMem,
    vmas: &mut [Vma],
    files: &[FileRef],
    base: Option<&dyn SamePage>,
    writer: &mut SnapshotWriter,
    index: &mut PageIndex,
    key: u64,
) -> Result<(Vec<u64>, CaptureStats), CaptureError> {
    use std::os::unix::fs::FileExt;
    let ioe = |what: String| move |source| CaptureError::Io { pid, what, source };
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).map_err(ioe("opening pagemap".into()))?;
    let mut base_pages = Vec::new();
    let mut stats = CaptureStats::default();
    let mut buf = vec![0u8; (DUMP_CHUNK_PAGES * PAGE_SIZE) as usize];
    for v in vmas {
        let npages = (v.end - v.start) / PAGE_SIZE;
        let mut pm = vec![0u8; npages as usize * 8];
        pagemap.read_exact_at(&mut pm, v.start / PAGE_SIZE * 8).map_err(ioe(format!("pagemap of {:#x}", v.start)))?;
        let entry = |i: u64| u64::from_le_bytes(pm[i as usize * 8..i as usize * 8 + 8].try_into().expect("8 bytes"));
        if matches!(v.kind, VmaKind::FilePrivate { .. }) {
            let written = (0..npages).filter(|&i| page_wanted(&v.kind, entry(i))).count() as u64;
            if let Some(kind) = copy_whole(v, files, written, npages) {
                v.kind = kind;
                stats.vmas_copied_whole += 1;
            }
        }
        let is_file = matches!(v.kind, VmaKind::FilePrivate { .. } | VmaKind::Unlinked { .. });
        let mut i = 0;
        while i < npages {
            if !page_wanted(&v.kind, entry(i)) {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < npages && j - i < DUMP_CHUNK_PAGES && page_wanted(&v.kind, entry(j)) {
                j += 1;
            }
            let addr = v.start + i * PAGE_SIZE;
            let chunk = &mut buf[..((j - i) * PAGE_SIZE) as usize];
            mem.read_exact_at(chunk, addr).map_err(ioe(format!("reading memory at {addr:#x}")))?;
            for (k, page) in chunk.chunks_exact(PAGE_SIZE as usize).enumerate() {
                // Untouched-equivalent zero pages of anonymous memory need not be stored:
                // the page server maps a zero page for anything absent from the index.
                if !is_file && page.iter().all(|&b| b == 0) {
                    stats.pages_zero_skipped += 1;
                    continue;
                }
                let at = addr + k as u64 * PAGE_SIZE;
                if base.is_some_and(|b| b.same(at, page)) {
                    base_pages.push(at);
                    stats.pages_from_base += 1;
                    continue;
                }
                writer.store_page(index, at | key, page)?;
                stats.pages_stored += 1;
            }
            i = j;
        }
    }
    stats.bytes_written += stats.pages_stored * PAGE_SIZE;
    debug!(pid, pages = stats.pages_stored, zero = stats.pages_zero_skipped, from_base = stats.pages_from_base, "pages dumped");
    Ok((base_pages, stats))
}

/// A socketpair end's options, as getsockopt gave them.
type SocketOptions = Vec<(i32, Vec<u8>)>;

struct Injected {
    sigactions: Vec<SigAction>,
    /// (tid address, altstack) of each thread, in the order of the tracees.
    per_thread: Vec<(u64, Option<AltStack>)>,
    /// Bytes buffered in each non-empty pipe (by read-end descriptor).
    pipe_data: Vec<(i32, Vec<u8>)>,
    /// Each pipe end's pipe's capacity, by descriptor.
    pipe_sizes: Vec<(i32, u32)>,
    /// Each socketpair end's options ([`crate::image::SOCKET_OPTIONS`]), by descriptor.
    socket_options: Vec<(i32, SocketOptions)>,
    brk: u64,
    cwd: String,
    rlimits: Vec<(u32, u64, u64)>,
    attrs: ProcAttrs,
    /// System V shared memory segments in the process's IPC namespace.
    sysv_segments: i32,
}

/// A descriptor number above every one of `fds` and clear of the one the engine keeps
/// a restored process's userfaultfd at: for what a restore makes and closes again
/// (`FdKind::MapOnly`, `FdKind::InFlight`).
pub(super) fn unused_number(fds: &[FdRecord]) -> i32 {
    let n = fds.iter().map(|r| r.fd + 1).max().unwrap_or(0).max(4);
    if n as u64 == crate::conventions::UFFD_KEEP_FD {
        n + 1
    } else {
        n
    }
}

/// Bytes of CPU mask read (1024 CPUs).
const AFFINITY_LEN: u64 = 128;

const PR_GET_TID_ADDRESS: u64 = 40;
const SS_DISABLE: i32 = 2;
/// Most bytes a pipe may hold at capture (they travel in the injection data area).
pub(super) const PIPE_DATA_MAX: usize = 64 * 1024;
/// RLIMIT_CPU .. RLIMIT_RTTIME.
const RLIMIT_COUNT: u32 = 16;

/// Why a queue of pending signals cannot be captured.
enum PendingError {
    Io(std::io::Error),
    Refused(String),
}

impl PendingError {
    fn into_capture(self, pid: i32, whose: &str) -> CaptureError {
        match self {
            PendingError::Io(source) => CaptureError::Io { pid, what: format!("reading the pending signals of {whose}"), source },
            PendingError::Refused(why) => CaptureError::Refused { pid, reason: format!("signals are pending for {whose}: {why}") },
        }
    }
}

/// The signals queued (not yet delivered) for `t`'s thread, or for the process
/// (`shared`), whose pending set /proc reports as `mask` (bit n-1: signal n), each
/// with its siginfo, to be queued again at restore. Refused: a pending signal the
/// queue holds no siginfo for (the kernel keeps only the bit when a sender passed
/// RLIMIT_SIGPENDING), a stop or continue signal (queueing it again would stop or
/// continue the restored process at once) and a POSIX timer's signal (the timer
/// owns that queue entry: a copy would be a second one).
fn pending_signals(pid: i32, t: &Tracee, shared: bool, mask: u64) -> Result<Vec<PendingSignal>, PendingError> {
    if mask == 0 {
        return Ok(Vec::new());
    }
    const STOP_CONT: [i32; 6] = [libc::SIGSTOP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU, libc::SIGCONT, libc::SIGKILL];
    const SI_TIMER: i32 = -2;
    let queue = t.pending_signals(shared).map_err(PendingError::Io)?;
    let mut seen = 0u64;
    let mut out = Vec::with_capacity(queue.len());
    for info in queue {
        let signo = i32::from_le_bytes(info[0..4].try_into().expect("4 bytes"));
        let code = i32::from_le_bytes(info[8..12].try_into().expect("4 bytes"));
        if !(1..=64).contains(&signo) {
            return Err(PendingError::Refused(format!("a queued signal numbered {signo}")));
        }
        if STOP_CONT.contains(&signo) {
            return Err(PendingError::Refused(format!("signal {signo} (stop, continue or kill) is not restored")));
        }
        if code == SI_TIMER {
            return Err(PendingError::Refused(format!("signal {signo} of a POSIX timer is not restored")));
        }
        seen |= 1 << (signo - 1);
        out.push(PendingSignal { signo, info: info.to_vec() });
    }
    if seen != mask {
        return Err(PendingError::Refused(format!("pending set {mask:#x}, but the queue holds information for {seen:#x} only")));
    }
    tracing::debug!(pid, tid = t.pid.as_raw(), shared, signals = out.len(), "pending signals captured");
    Ok(out)
}

/// The process's POSIX timers from /proc/PID/timers, their targets as ids in the
/// instance's pid namespace (the time left is read by injection). A timer that
/// signals anything but the process or one of its threads is refused.
fn posix_timers(pid: i32) -> Result<Vec<PosixTimer>, CaptureError> {
    let refuse = |reason: String| CaptureError::Refused { pid, reason };
    let text = std::fs::read_to_string(format!("/proc/{pid}/timers")).unwrap_or_default();
    let infos = procfs::parse_timers(&text).ok_or_else(|| refuse(format!("its POSIX timers cannot be read: {}", text.trim())))?;
    let mut out = Vec::with_capacity(infos.len());
    for t in infos {
        if t.notify & !libc::SIGEV_THREAD_ID != libc::SIGEV_SIGNAL && t.notify != libc::SIGEV_NONE {
            return Err(refuse(format!("POSIX timer {} has a notification the engine does not recreate ({})", t.id, t.notify)));
        }
        let tid = if t.notify & libc::SIGEV_THREAD_ID != 0 {
            match procfs::thread_status(pid, t.target) {
                Ok(st) => *st.nspid.last().unwrap_or(&t.target),
                Err(_) => return Err(refuse(format!("POSIX timer {} signals thread {}, which is not one of the process's", t.id, t.target))),
            }
        } else if t.target != pid {
            return Err(refuse(format!("POSIX timer {} signals process {}, not the instance", t.id, t.target)));
        } else {
            0
        };
        out.push(PosixTimer { id: t.id, clockid: t.clockid, signo: t.signo, sigval: t.sigval, notify: t.notify, tid, value: (0, 0), interval: (0, 0) });
    }
    Ok(out)
}

/// Map the scratch region syscalls are injected through into the stopped `tracee`
/// (bootstrapped with the `syscall` instruction of its vDSO) and put the batch blob
/// in it: the region's address and the process's memory, open for writing.
fn injection_region(tracee: &Tracee, maps: &[MapEntry]) -> Result<(u64, ProcMem), InjectError> {
    let pid = tracee.pid.as_raw();
    // A `syscall` instruction to bootstrap with: the vDSO always has one.
    let vdso = maps.iter().find(|m| m.name == "[vdso]").ok_or(InjectError::UnexpectedStop {
        pid,
        rip: 0,
        signal: Some("no [vdso] mapping to find a syscall instruction in".into()),
    })?;
    let wmem = ProcMem::open(pid, true).map_err(|source| InjectError::Memory { pid, addr: vdso.start, source })?;
    let mut text = vec![0u8; vdso.len() as usize];
    wmem.read_exact_at(&mut text, vdso.start).map_err(|source| InjectError::Memory { pid, addr: vdso.start, source })?;
    let off = text.windows(2).position(|w| w == [0x0f, 0x05]).ok_or(InjectError::UnexpectedStop {
        pid,
        rip: vdso.start,
        signal: Some("no syscall instruction in [vdso]".into()),
    })?;
    let prot = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let region = inject::single(
        tracee,
        vdso.start + off as u64,
        Call::new("mmap", libc::SYS_mmap, &[0, REGION_LEN, prot, flags, u64::MAX, 0]),
    )? as u64;

    Injector::new(*tracee, &wmem, region)?.install_blob()?;
    Ok((region, wmem))
}

/// State only the process can report, read by syscalls injected through `region`
/// (see [`injection_region`]).
fn injected_state(
    tracees: &[Tracee],
    region: u64,
    wmem: &ProcMem,
    fds: &[FdRecord],
    mut posix_timers: Vec<PosixTimer>,
) -> Result<Injected, InjectError> {
    let inj = Injector::new(tracees[0], wmem, region)?;
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    let mut outs = Vec::new();
    for sig in 1..=64u64 {
        if sig == libc::SIGKILL as u64 || sig == libc::SIGSTOP as u64 {
            continue;
        }
        let out = data.reserve(32);
        outs.push((sig as u32, out));
        calls.push(Call::new("rt_sigaction", libc::SYS_rt_sigaction, &[sig, 0, out, 8]));
    }
    // How many bytes each pipe holds (read out below: data left in a pipe would be lost),
    // and each socketpair end's options.
    let mut pipe_checks = Vec::new();
    let mut option_reads = Vec::new();
    let mut pipe_sizes = Vec::new();
    for r in fds {
        match r.kind {
            FdKind::Pipe { write, .. } => {
                if !write {
                    let out = data.reserve(4);
                    pipe_checks.push((r.fd, out));
                    calls.push(Call::new("ioctl(FIONREAD)", libc::SYS_ioctl, &[r.fd as u64, libc::FIONREAD, out]));
                }
                pipe_sizes.push((r.fd, calls.len()));
                calls.push(Call::new("fcntl(F_GETPIPE_SZ)", libc::SYS_fcntl, &[r.fd as u64, libc::F_GETPIPE_SZ as u64]));
            }
            FdKind::SocketPair { .. } => {
                for (opt, size) in crate::image::SOCKET_OPTIONS {
                    let (out, len) = (data.reserve(size), data.push(&(size as u32).to_le_bytes()));
                    option_reads.push((r.fd, opt, out, len));
                    calls.push(Call::new("getsockopt", libc::SYS_getsockopt, &[r.fd as u64, libc::SOL_SOCKET as u64, opt as u64, out, len]));
                }
            }
            _ => {}
        }
    }
    let brk_call = calls.len();
    calls.push(Call::new("brk", libc::SYS_brk, &[0]));
    // prlimit64 on another process needs CAP_SYS_RESOURCE, so ask the process itself.
    let mut rl = Vec::new();
    for res in 0..RLIMIT_COUNT {
        let out = data.reserve(16);
        rl.push((res, out));
        calls.push(Call::new("prlimit64", libc::SYS_prlimit64, &[0, res as u64, 0, out]));
    }
    let cwd = data.reserve(4096);
    let cwd_call = calls.len();
    calls.push(Call::new("getcwd", libc::SYS_getcwd, &[cwd, 4096]));
    // Process attributes, as the process itself sees them (ids in its pid namespace).
    let attr_call = calls.len();
    let affinity = data.reserve(AFFINITY_LEN as usize);
    let subreaper = data.reserve(8);
    let pdeathsig = data.reserve(8);
    calls.extend([
        Call::new("getpriority", libc::SYS_getpriority, &[libc::PRIO_PROCESS as u64, 0]),
        Call::new("sched_getaffinity", libc::SYS_sched_getaffinity, &[0, AFFINITY_LEN, affinity]),
        Call::new("prctl(PR_GET_TIMERSLACK)", libc::SYS_prctl, &[libc::PR_GET_TIMERSLACK as u64]),
        Call::new("prctl(PR_GET_THP_DISABLE)", libc::SYS_prctl, &[libc::PR_GET_THP_DISABLE as u64]),
        Call::new("prctl(PR_GET_CHILD_SUBREAPER)", libc::SYS_prctl, &[libc::PR_GET_CHILD_SUBREAPER as u64, subreaper]),
        Call::new("prctl(PR_GET_DUMPABLE)", libc::SYS_prctl, &[libc::PR_GET_DUMPABLE as u64]),
        Call::new("getpid", libc::SYS_getpid, &[]),
        Call::new("getpgid", libc::SYS_getpgid, &[0]),
        Call::new("getsid", libc::SYS_getsid, &[0]),
        Call::new("prctl(PR_GET_PDEATHSIG)", libc::SYS_prctl, &[libc::PR_GET_PDEATHSIG as u64, pdeathsig]),
    ]);
    let itimers: Vec<u64> = (0..3u64)
        .map(|which| {
            let out = data.reserve(32);
            calls.push(Call::new("getitimer", libc::SYS_getitimer, &[which, out]));
            out
        })
        .collect();
    let timer_outs: Vec<u64> = posix_timers
        .iter()
        .map(|t| {
            let out = data.reserve(32);
            calls.push(Call::new("timer_gettime", libc::SYS_timer_gettime, &[t.id as u64, out]));
            out
        })
        .collect();
    // shmctl(SHM_INFO): struct shm_info starts with `int used_ids`.
    const SHM_INFO: u64 = 14;
    let shm_info = data.reserve(64);
    calls.push(Call::new("shmctl(SHM_INFO)", libc::SYS_shmctl, &[0, SHM_INFO, shm_info]));
    let res = inj.run(&calls, &mut data)?;
    let r = |i: usize| res[attr_call + i];
    let pipe_sizes: Vec<(i32, u32)> = pipe_sizes.iter().map(|&(fd, i)| (fd, res[i] as u32)).collect();
    let mut socket_options: Vec<(i32, SocketOptions)> = Vec::new();
    for &(fd, opt, out, len) in &option_reads {
        let value = data.bytes(out, data.u32_at(len) as usize).to_vec();
        match socket_options.last_mut() {
            Some((f, v)) if *f == fd => v.push((opt, value)),
            _ => socket_options.push((fd, vec![(opt, value)])),
        }
    }
    let itimer = |i: usize| [0, 1, 2, 3].map(|w| data.u64_at(itimers[i], w) as i64);
    for (t, &out) in posix_timers.iter_mut().zip(&timer_outs) {
        // struct itimerspec: interval {s, ns}, value {s, ns}.
        t.interval = (data.u64_at(out, 0) as i64, data.u64_at(out, 1) as i64);
        t.value = (data.u64_at(out, 2) as i64, data.u64_at(out, 3) as i64);
    }
    let attrs = ProcAttrs {
        // The raw syscall returns 20 - nice.
        nice: 20 - r(0) as i32,
        affinity: data.bytes(affinity, r(1) as usize).to_vec(),
        timer_slack_ns: r(2) as u64,
        thp_disable: r(3) != 0,
        child_subreaper: data.u32_at(subreaper) != 0,
        dumpable: r(5) as u32,
        oom_score_adj: 0,
        session_leader: r(8) == r(6),
        group_leader: r(7) == r(6),
        pgid: r(7) as i32,
        sid: r(8) as i32,
        pdeathsig: data.u32_at(pdeathsig) as i32,
        itimers: [itimer(0), itimer(1), itimer(2)],
        posix_timers,
        // Read before the injection (see capture_inner).
        pending_signals: Vec::new(),
        zombies: Vec::new(),
    };

    let u64_at = |addr: u64, i: usize| data.u64_at(addr, i);
    let mut sigactions = Vec::new();
    for (sig, out) in outs {
        let sa = SigAction { sig, handler: u64_at(out, 0), flags: u64_at(out, 1), restorer: u64_at(out, 2), mask: u64_at(out, 3) };
        // SIG_DFL with no flags and an empty mask is what a fresh process has.
        if sa.handler != 0 || sa.flags != 0 || sa.mask != 0 {
            sigactions.push(sa);
        }
    }
    // Take out what is buffered in pipes (the process is never resumed, so reading
    // it is harmless); restore writes it back into the new pipe.
    let mut pipe_data = Vec::new();
    let mut pd = DataArea::new(region);
    let mut reads = Vec::new();
    let mut outs = Vec::new();
    for (fd, out) in pipe_checks {
        let n = data.u32_at(out) as usize;
        if n > PIPE_DATA_MAX {
            return Err(InjectError::TooLarge { count: n, max: PIPE_DATA_MAX as u64 });
        }
        if n > 0 {
            let buf = pd.reserve(n);
            reads.push(Call::new("read(pipe)", libc::SYS_read, &[fd as u64, buf, n as u64]));
            outs.push((fd, buf, n));
        }
    }
    if !reads.is_empty() {
        inj.run(&reads, &mut pd)?;
        for (fd, buf, n) in outs {
            pipe_data.push((fd, pd.bytes(buf, n).to_vec()));
        }
    }
    // Per-thread attributes only each thread can report.
    let mut per_thread = Vec::with_capacity(tracees.len());
    for t in tracees {
        let ti = Injector::new(*t, wmem, region)?;
        let mut d = DataArea::new(region);
        let ss = d.reserve(24);
        let tida = d.reserve(8);
        ti.run(
            &[
                Call::new("sigaltstack", libc::SYS_sigaltstack, &[0, ss]),
                Call::new("prctl(PR_GET_TID_ADDRESS)", libc::SYS_prctl, &[PR_GET_TID_ADDRESS, tida]),
            ],
            &mut d,
        )?;
        let at = |addr: u64, i: usize| d.u64_at(addr, i);
        let ss_flags = at(ss, 1) as u32 as i32;
        let altstack = (ss_flags & SS_DISABLE == 0).then(|| AltStack { sp: at(ss, 0), flags: ss_flags, size: at(ss, 2) });
        per_thread.push((at(tida, 0), altstack));
    }
    let rlimits = rl.into_iter().map(|(res, out)| (res, u64_at(out, 0), u64_at(out, 1))).collect();
    // getcwd returns the length including the terminating NUL.
    let cwd_bytes = data.bytes(cwd, (res[cwd_call] as usize).saturating_sub(1));
    Ok(Injected {
        sigactions,
        per_thread,
        pipe_data,
        pipe_sizes,
        socket_options,
        brk: res[brk_call] as u64,
        rlimits,
        cwd: String::from_utf8_lossy(cwd_bytes).into_owned(),
        attrs,
        sysv_segments: data.u32_at(shm_info) as i32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wanted_pages_follow_the_vma_kind() {
        let anon = VmaKind::Anon { growsdown: false };
        let file = VmaKind::FilePrivate { file: 0, offset: 0 };
        assert!(page_wanted(&anon, PM_PRESENT));
        assert!(!page_wanted(&anon, 0));
        assert!(page_wanted(&file, PM_PRESENT));
        assert!(!page_wanted(&file, PM_PRESENT | PM_FILE));
        assert!(!page_wanted(&VmaKind::FileShared { file: 0, offset: 0 }, PM_PRESENT));
        assert!(page_wanted(&VmaKind::FileCopied { file: 0, offset: 0 }, 0));
    }

    #[test]
    fn mostly_written_file_mappings_are_stored_whole() {
        let files = vec![FileRef { path: "/lib/x.so".into(), size: 10 * PAGE_SIZE - 100, mtime_ns: 0 }];
        let v = |off: u64, pages: u64| Vma {
            start: 0x10000,
            end: 0x10000 + pages * PAGE_SIZE,
            prot: 1,
            kind: VmaKind::FilePrivate { file: 0, offset: off * PAGE_SIZE },
            advice: vec![],
        };
        assert_eq!(copy_whole(&v(0, 4), &files, 2, 4), Some(VmaKind::FileCopied { file: 0, offset: 0 }));
        assert_eq!(copy_whole(&v(0, 4), &files, 1, 4), None, "under half written");
        assert_eq!(copy_whole(&v(8, 2), &files, 2, 2), Some(VmaKind::FileCopied { file: 0, offset: 8 * PAGE_SIZE }));
        assert_eq!(copy_whole(&v(8, 3), &files, 3, 3), None, "reaches past the end of the file");
        let anon = Vma { kind: VmaKind::Anon { growsdown: false }, ..v(0, 4) };
        assert_eq!(copy_whole(&anon, &files, 4, 4), None);
    }
}
