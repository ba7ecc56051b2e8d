//! The runtime's live child processes (a worker pool forked at import, a helper it
//! started), captured with it: each is stopped like the runtime, its memory stored
//! after the runtime's in the same pages file (keyed apart: a forked child shares
//! its parent's addresses), its state read the same way (capture.rs), and its
//! descriptors described as the leader's.
//!
//! Descriptors are what joins the processes of a tree (the pipe between a parent and
//! its worker), so they are captured as one table: every open file a child holds is
//! either one the leader holds too (kcmp across the two processes) or is copied into
//! the leader (an injected pidfd_getfd, before the socketpairs are drained), where it
//! is described, drained and restored like the leader's own. A child's descriptors
//! are then numbers of the leader's table; the restore forks each child from the
//! leader once that table is made, and the child keeps what is its own
//! (restore/children.rs).

use super::{children_of, classify_vmas, dump_pages, injected_state, injection_region, pending_signals, posix_timers, thread_states, CaptureError, CaptureStats, SamePage};
use crate::image::{ChildImage, Creds, FdKind, FdRecord, MmState, PageIndex, ProcAttrs, ProcessImage, SandboxRecord, SnapshotWriter, VmaKind};
use crate::inject::{Call, DataArea, Injector};
use crate::procfs::{self, MapEntry};
use crate::sys::mem::ProcMem;
use crate::sys::ptrace::Tracee;

/// A live process below the runtime, stopped.
pub(super) struct Member {
    host: i32,
    /// Its pid in the sandbox.
    ns: i32,
    tracees: Vec<Tracee>,
    children: Vec<Member>,
}

/// Stop every thread of the live processes `live` (host pids, children of one
/// process) and, below each, of theirs; `kids` keeps what was stopped, to be killed
/// and reaped whatever happens.
pub(super) fn seize(live: &[i32], kids: &mut Vec<(i32, Vec<Tracee>)>) -> Result<Vec<Member>, CaptureError> {
    let mut out = Vec::with_capacity(live.len());
    for &host in live {
        let mut tracees = Vec::new();
        let seized = crate::threads::seize_all(host, &mut tracees);
        kids.push((host, tracees.clone()));
        seized.map_err(|e| {
            let (what, source) = e.parts();
            CaptureError::Io { pid: host, what: format!("child process: {what}"), source }
        })?;
        let ns = procfs::status(host)
            .map_err(|source| CaptureError::Io { pid: host, what: "reading a child process's status".into(), source })?
            .nspid
            .last()
            .copied()
            .unwrap_or(host);
        // Its zombies are read with its state; its live children are members too.
        let (_, below) = children_of(host, false)?;
        let children = seize(&below, kids)?;
        out.push(Member { host, ns, tracees, children });
    }
    Ok(out)
}

/// The least number a copy takes in the leader (clear of the standard descriptors
/// and of the runtime's own low numbers, which the capture reads by number).
const COPY_MIN: u64 = 200;

/// A process's descriptors: (number, the leader's number, close-on-exec).
type Table = Vec<(i32, i32, bool)>;

/// What [`hand_down`] did: each member's descriptors as the leader's numbers, and the
/// copies it made there.
pub(super) struct Handed {
    /// (host pid, pid in the sandbox, [(number, leader's number, close-on-exec)]).
    tables: Vec<(i32, i32, Table)>,
    /// (copy in the leader, the member's pid in the sandbox, its number there).
    copies: Vec<(i32, i32, i32)>,
}

impl Handed {
    pub(super) fn copies(&self) -> Vec<i32> {
        self.copies.iter().map(|c| c.0).collect()
    }

    fn table(&self, host: i32) -> Table {
        self.tables.iter().find(|t| t.0 == host).map(|t| t.2.clone()).unwrap_or_default()
    }

    /// A refusal of the leader's descriptors that names a copy names what it is a copy of.
    pub(super) fn name_copies(&self, e: CaptureError) -> CaptureError {
        match e {
            CaptureError::Refused { pid, reason } if !self.copies.is_empty() => {
                let named: Vec<String> = self.copies.iter().map(|(c, ns, fd)| format!("{c} is descriptor {fd} of child process {ns}")).collect();
                CaptureError::Refused { pid, reason: format!("{reason} (descriptors copied from child processes for the capture: {})", named.join(", ")) }
            }
            e => e,
        }
    }

    /// What a copy cannot be: an epoll set registers descriptors by the child's
    /// numbers, which are not the leader's.
    pub(super) fn check(&self, fds: &[FdRecord]) -> Result<(), String> {
        for &(copy, ns, fd) in &self.copies {
            if let Some(FdRecord { kind: FdKind::Epoll { .. }, .. }) = fds.iter().find(|r| r.fd == copy) {
                return Err(format!("descriptor {fd} of child process {ns} is an epoll set of its own; one in a child process is not carried across a snapshot"));
            }
        }
        Ok(())
    }
}

/// Every member's descriptors as numbers of the leader's table: one whose open file
/// the leader holds (kcmp, from here) is that number; any other is copied into the
/// leader (pidfd_open and pidfd_getfd, injected through `inj`, the leader stopped in
/// `region`) at a number from [`COPY_MIN`], once per open file (a second member's
/// descriptor of the same open file is the first copy's number).
pub(super) fn hand_down(inj: &Injector<'_>, region: u64, leader: i32, tree: &[Member]) -> Result<Handed, CaptureError> {
    let mut handed = Handed { tables: Vec::new(), copies: Vec::new() };
    let mut members = Vec::new();
    flatten(tree, &mut members);
    let inj_err = |source| CaptureError::Inject { pid: leader, source };
    for m in members {
        let io = |what: &str| {
            let what = format!("child process {}: {what}", m.ns);
            move |source| CaptureError::Io { pid: m.host, what, source }
        };
        let own = procfs::fds(leader).map_err(io("listing the leader's descriptors"))?;
        let list = procfs::fds(m.host).map_err(io("listing descriptors"))?;
        let mut table = Vec::with_capacity(list.len());
        // Descriptors of this member to copy, by number (the first of each open file).
        let mut pending: Vec<i32> = Vec::new();
        // (number, index into pending) for those that wait for a copy.
        let mut waiting = Vec::new();
        for f in &list {
            if f.fd as u64 == crate::conventions::UFFD_KEEP_FD && f.target == "anon_inode:[userfaultfd]" {
                // The restore's userfaultfd, inherited from a restored runtime.
                continue;
            }
            let cloexec = f.flags & libc::O_CLOEXEC as u32 != 0;
            let same = |pa: i32, a: i32| crate::sys::kcmp::same_file_in(pa, a, m.host, f.fd).map_err(io(&format!("comparing descriptor {} (kcmp)", f.fd)));
            let mut found = None;
            for g in own.iter().filter(|g| g.target == f.target) {
                if same(leader, g.fd)? {
                    found = Some(g.fd);
                    break;
                }
            }
            if let Some(of) = found {
                table.push((f.fd, of, cloexec));
                continue;
            }
            let mut earlier = None;
            for (i, &p) in pending.iter().enumerate() {
                if list.iter().any(|g| g.fd == p && g.target == f.target) && same(m.host, p)? {
                    earlier = Some(i);
                    break;
                }
            }
            let i = earlier.unwrap_or_else(|| {
                pending.push(f.fd);
                pending.len() - 1
            });
            waiting.push((f.fd, i, cloexec));
        }
        if !pending.is_empty() {
            let mut data = DataArea::new(region);
            let pidfd = inj.run(&[Call::new("pidfd_open(child)", libc::SYS_pidfd_open, &[m.ns as u64, 0])], &mut data).map_err(inj_err)?[0] as u64;
            let mut data = DataArea::new(region);
            let calls: Vec<Call> = pending.iter().map(|&fd| Call::new("pidfd_getfd", libc::SYS_pidfd_getfd, &[pidfd, fd as u64, 0])).collect();
            let got = inj.run(&calls, &mut data);
            let mut data = DataArea::new(region);
            let got = match got {
                Ok(got) => got,
                Err(e) => {
                    let _ = inj.run(&[Call::new("close(pidfd)", libc::SYS_close, &[pidfd])], &mut data);
                    return Err(inj_err(e));
                }
            };
            let mut calls: Vec<Call> = got.iter().map(|&n| Call::new("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[n as u64, libc::F_DUPFD_CLOEXEC as u64, COPY_MIN])).collect();
            calls.extend(got.iter().map(|&n| Call::new("close(copy)", libc::SYS_close, &[n as u64])));
            calls.push(Call::new("close(pidfd)", libc::SYS_close, &[pidfd]));
            let moved = inj.run(&calls, &mut data).map_err(inj_err)?;
            for (i, &fd) in pending.iter().enumerate() {
                handed.copies.push((moved[i] as i32, m.ns, fd));
            }
            for (fd, i, cloexec) in waiting {
                table.push((fd, moved[i] as i32, cloexec));
            }
        }
        table.sort_unstable();
        tracing::debug!(leader, child = m.ns, descriptors = table.len(), copied = pending.len(), "child process's descriptors handed down");
        handed.tables.push((m.host, m.ns, table));
    }
    Ok(handed)
}

fn flatten<'a>(tree: &'a [Member], out: &mut Vec<&'a Member>) {
    for m in tree {
        out.push(m);
        flatten(&m.children, out);
    }
}

/// The leader's memory as its image has it: a child's page equal to the leader's at
/// the same address, which the image holds (stored, or taken from its base), is
/// taken from there at restore (what a forked child has not written since).
pub(super) struct LeaderPages<'a> {
    mem: &'a ProcMem,
    /// Its mappings (a child's shared mapping of the same object at the same place is
    /// inherited).
    maps: &'a [MapEntry],
    /// The leader's stored pages (a copy: the children's are added to the index).
    index: PageIndex,
    base_pages: &'a [u64],
}

impl<'a> LeaderPages<'a> {
    pub(super) fn new(mem: &'a ProcMem, maps: &'a [MapEntry], index: &PageIndex, base_pages: &'a [u64]) -> LeaderPages<'a> {
        LeaderPages { mem, maps, index: index.clone(), base_pages }
    }

    /// Whether `m`, a shared mapping of a child, is the leader's mapping of the same
    /// object at the same place.
    fn maps_same(&self, m: &MapEntry) -> bool {
        m.shared
            && self.maps.iter().any(|l| {
                l.shared && (l.start, l.end, l.offset, &l.dev, l.inode, &l.name) == (m.start, m.end, m.offset, &m.dev, m.inode, &m.name)
            })
    }
}

impl SamePage for LeaderPages<'_> {
    fn same(&self, vaddr: u64, page: &[u8]) -> bool {
        if self.index.lookup(vaddr).is_none() && self.base_pages.binary_search(&vaddr).is_err() {
            return false;
        }
        let mut theirs = vec![0u8; page.len()];
        self.mem.read_exact_at(&mut theirs, vaddr).is_ok() && theirs == page
    }
}

/// The image of member `m` (and of its children), its pages appended to `index` under
/// its key (the `numbered`th member in pre-order), those equal to the `leader`'s not.
/// `parent`: its parent's process group and session in the sandbox.
#[allow(clippy::too_many_arguments)]
pub(super) fn capture_child(
    m: &Member,
    parent: (i32, i32),
    handed: &Handed,
    leader: &LeaderPages<'_>,
    sandbox: &SandboxRecord,
    writer: &mut SnapshotWriter,
    index: &mut PageIndex,
    numbered: &mut usize,
    stats: &mut CaptureStats,
) -> Result<ChildImage, CaptureError> {
    let (pid, ns) = (m.host, m.ns);
    let ioe = |what: &str| {
        let what = format!("child process {ns}: {what}");
        move |source| CaptureError::Io { pid, what, source }
    };
    let refuse = |reason: String| CaptureError::Refused { pid, reason: format!("child process {ns} (pid {ns} in the sandbox): {reason}") };
    let relabel = |e: CaptureError| match e {
        CaptureError::Refused { reason, .. } => refuse(reason),
        e => e,
    };
    let status = procfs::status(pid).map_err(ioe("reading status"))?;
    let shared_pending = pending_signals(pid, &m.tracees[0], true, status.shared_pending).map_err(|e| e.into_capture(pid, "the process")).map_err(relabel)?;
    let timers = posix_timers(pid).map_err(relabel)?;
    let threads = thread_states(pid, &m.tracees).map_err(relabel)?;
    let (zombies, _) = children_of(pid, false).map_err(relabel)?;
    let maps = procfs::maps(pid).map_err(ioe("reading maps"))?;
    crate::refusals::check_maps(&maps).map_err(refuse)?;
    let fields = procfs::stat(pid).map_err(ioe("reading stat"))?;
    let auxv = procfs::auxv(pid).map_err(ioe("reading auxv"))?;
    let exe = procfs::exe(pid).map_err(ioe("reading exe link"))?;
    let personality = procfs::personality(pid).map_err(ioe("reading personality"))?;
    let mut unlinked = Vec::new();
    let (vmas, files) = classify_vmas(pid, &maps, &mut unlinked).map_err(relabel)?;
    // Shared memory (anonymous, a memfd's or a deleted file's) that is the leader's
    // mapping of the same object at the same place is kept across the fork at restore;
    // any other cannot be made again in a child.
    let (inherited, mut vmas): (Vec<_>, Vec<_>) = vmas.into_iter().partition(|v| {
        matches!(v.kind, VmaKind::SharedAnon | VmaKind::Unlinked { shared: true, .. }) && maps.iter().any(|m| (m.start, m.end) == (v.start, v.end) && leader.maps_same(m))
    });
    if let Some(v) = vmas.iter().find(|v| matches!(v.kind, VmaKind::SharedAnon | VmaKind::Unlinked { .. })) {
        return Err(refuse(format!(
            "it maps shared memory or a memfd at {:#x}-{:#x} that is not the runtime's mapping of it at the same place (or a private memfd mapping); such memory is not carried across a snapshot in a child",
            v.start, v.end
        )));
    }
    let key = crate::image::child_key(*numbered);
    *numbered += 1;
    let mem = ProcMem::open(pid, false).map_err(ioe("opening /proc/PID/mem"))?;
    let (same, st) = dump_pages(pid, &mem, &mut vmas, &files, Some(leader), writer, index, key).map_err(relabel)?;
    stats.pages_stored += st.pages_stored;
    stats.pages_zero_skipped += st.pages_zero_skipped;
    stats.pages_from_base += st.pages_from_base;
    stats.vmas_copied_whole += st.vmas_copied_whole;
    stats.bytes_written += st.bytes_written;
    stats.vmas += vmas.len();
    stats.children += 1;
    let (region, wmem) = injection_region(&m.tracees[0], &maps).map_err(|source| CaptureError::Inject { pid, source })?;
    let injected = injected_state(&m.tracees, region, &wmem, &[], timers).map_err(|source| CaptureError::Inject { pid, source })?;
    let (pgid, sid) = (injected.attrs.pgid, injected.attrs.sid);
    if sid != ns && sid != parent.1 {
        return Err(refuse(format!("it is in session {sid}, neither its own nor its parent's ({}); a restore cannot join it again", parent.1)));
    }
    let sigchld_ignored = injected.sigactions.iter().any(|a| a.sig == libc::SIGCHLD as u32 && (a.handler == 1 || a.flags & libc::SA_NOCLDWAIT as u64 != 0));
    if !zombies.is_empty() && sigchld_ignored {
        return Err(refuse(format!("{} zombie child processes while SIGCHLD is ignored (or SA_NOCLDWAIT)", zombies.len())));
    }
    let mut threads = threads;
    for (t, (tid_address, altstack)) in threads.iter_mut().zip(injected.per_thread) {
        t.tid_address = tid_address;
        t.altstack = altstack;
    }
    let mut children = Vec::with_capacity(m.children.len());
    for c in &m.children {
        children.push(capture_child(c, (pgid, sid), handed, leader, sandbox, writer, index, numbered, stats)?);
    }
    let image = ProcessImage {
        created_unix_ms: 0,
        kernel: String::new(),
        sandbox: sandbox.clone(),
        threads,
        mm: MmState { fields, brk: injected.brk, auxv, exe },
        sigactions: injected.sigactions,
        rlimits: injected.rlimits,
        creds: Creds { uid: status.uid, gid: status.gid, groups: status.groups.clone() },
        cwd: injected.cwd,
        umask: status.umask,
        personality,
        comm: procfs::thread_comm(pid, pid).unwrap_or_default(),
        files,
        vmas,
        fds: Vec::new(),
        pages: PageIndex::default(),
        tmp: Vec::new(),
        attrs: ProcAttrs {
            pending_signals: shared_pending,
            zombies,
            oom_score_adj: std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0),
            ..injected.attrs
        },
        seal: None,
        base: None,
        children,
        handed_down: Vec::new(),
    };
    tracing::debug!(child = ns, pid, vmas = image.vmas.len(), threads = image.threads.len(), "child process captured");
    Ok(ChildImage { pid: ns, pgid, sid, key, fds: handed.table(pid), from_leader: crate::image::page_runs(&same), inherited, image: Box::new(image) })
}
