//! The runtime's live child processes, made again (see capture/tree.rs): each is
//! forked from its parent (clone3 with its pid, injected) once the parent's session,
//! process group and — for the runtime — descriptors are made, so it inherits the
//! whole descriptor table of the tree; it joins its session and group, forks its own
//! children, keeps only its descriptors at their numbers, then gets its own address
//! space, memory (installed whole from the image: a child has no page server),
//! threads, attributes and registers, like the runtime. Each stays stopped until the
//! runtime's restore is done.

use std::io;

use super::{
    clear_stub, create_threads, create_zombies, fork_traced, leave_region, push_attr_calls, push_mm_calls, push_process_calls,
    push_rlimit_calls, requeue_pending, settle_threads, stored_runs, write_runs, RestoreError,
};
use crate::image::{ChildImage, ProcessImage, VmaKind};
use crate::inject::{Call, DataArea, Injector};
use crate::pageserver::PageSource;
use crate::procfs;
use crate::sys::mem::ProcMem;
use crate::sys::ptrace::Tracee;
use crate::sys::PAGE_SIZE;

/// A process made here: its host pid and its threads, its main thread first.
pub(crate) struct Made {
    host: i32,
    tracees: Vec<Tracee>,
}

/// Kill what was made (a restore that failed).
pub(super) fn kill(made: &[Made]) {
    for m in made {
        crate::sys::ptrace::kill_and_reap(m.host, &m.tracees);
    }
}

/// Let every process made run.
pub(super) fn detach(made: &[Made]) -> Result<(), RestoreError> {
    for m in made {
        for t in m.tracees.iter().rev() {
            t.detach().map_err(|source| RestoreError::Io { pid: m.host, what: "PTRACE_DETACH (child process)".into(), source })?;
        }
    }
    Ok(())
}

/// Make every child of `img`, the process `parent` injects into (stopped in
/// `region`), and theirs.
pub(super) fn make_all(parent: &Injector<'_>, region: u64, img: &ProcessImage, source: &PageSource, made: &mut Vec<Made>) -> Result<(), RestoreError> {
    for c in &img.children {
        make(parent, region, img, c, source, made)?;
    }
    Ok(())
}

fn make(parent: &Injector<'_>, region: u64, parent_img: &ProcessImage, c: &ChildImage, source: &PageSource, made: &mut Vec<Made>) -> Result<(), RestoreError> {
    let img = &c.image;
    if img.threads.first().map(|t| t.tid) != Some(c.pid) {
        return Err(RestoreError::Incompatible(format!("child process {}: its first thread is not the process", c.pid)));
    }
    // A key keys apart what no user address reaches (see image::child_key).
    if c.key == 0 || c.key & ((1 << 48) - 1) != 0 {
        return Err(RestoreError::Incompatible(format!("child process {}: its pages' key {:#x} is not one a capture gives", c.pid, c.key)));
    }
    let ppid = parent.tracee.pid.as_raw();
    parent.tracee.trace_clones().map_err(|source| RestoreError::Io { pid: ppid, what: format!("child process {}: SETOPTIONS(TRACEFORK)", c.pid), source })?;
    let child = fork_traced(parent, region, "clone3(child)", 0, c.pid).map_err(|source| RestoreError::Inject { pid: ppid, source })?;
    let host = child.pid.as_raw();
    let at = made.len();
    made.push(Made { host, tracees: vec![child] });
    let ioe = |what: &str| {
        let what = format!("child process {}: {what}", c.pid);
        move |source| RestoreError::Io { pid: host, what, source }
    };
    let inj_err = |source| RestoreError::Inject { pid: host, source };
    child.wait_stop().map_err(ioe("wait (new process)"))?;
    let wmem = ProcMem::open(host, true).map_err(ioe("opening /proc/PID/mem"))?;
    let inj = Injector::new(child, &wmem, region).map_err(inj_err)?;

    // Its session and group, before its own children are forked into them.
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    if c.sid == c.pid {
        calls.push(Call::new("setsid", libc::SYS_setsid, &[]));
    } else if c.pgid == c.pid {
        calls.push(Call::new("setpgid", libc::SYS_setpgid, &[0, 0]));
    } else if c.pgid != parent_img.attrs.pgid {
        calls.push(Call::new("setpgid(join)", libc::SYS_setpgid, &[0, c.pgid as u64]));
    }
    // Not its own (the runtime's, which keeps the fault context alive; a grandchild's
    // parent closed it already).
    let uffd = crate::conventions::UFFD_KEEP_FD;
    if std::path::Path::new(&format!("/proc/{host}/fd/{uffd}")).exists() {
        calls.push(Call::new("close(userfaultfd)", libc::SYS_close, &[uffd]));
    }
    inj.run(&calls, &mut data).map_err(inj_err)?;
    for gc in &img.children {
        make(&inj, region, img, gc, source, made)?;
    }
    descriptors(&inj, region, host, c)?;

    // Its address space, as a stub's is made for the runtime (restore.rs).
    let stub_maps = procfs::parse_maps(&std::fs::read_to_string(format!("/proc/{host}/maps")).map_err(ioe("reading maps"))?)
        .ok_or_else(|| ioe("parsing maps")(io::ErrorKind::InvalidData.into()))?;
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    clear_stub(&mut calls, &stub_maps, img, region, &c.inherited)?;
    let opened = calls.len();
    for p in img.files.iter().map(|f| f.path.as_str()).chain([img.mm.exe.as_str()]) {
        let a = data.push_cstr(p);
        calls.push(Call::new("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, a, (libc::O_RDONLY | libc::O_CLOEXEC) as u64]));
    }
    let res = inj.run(&calls, &mut data).map_err(inj_err)?;
    let file_fds: Vec<u64> = res[opened..].iter().map(|&r| r as u64).collect();
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    for v in &img.vmas {
        let noreplace = libc::MAP_FIXED_NOREPLACE as u64;
        let (flags, fd, off) = match &v.kind {
            VmaKind::Special { .. } => continue,
            VmaKind::Anon { growsdown } => {
                let gd = if *growsdown { libc::MAP_GROWSDOWN as u64 } else { 0 };
                ((libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64 | gd | noreplace, u64::MAX, 0)
            }
            VmaKind::FileCopied { .. } => ((libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64 | noreplace, u64::MAX, 0),
            VmaKind::FilePrivate { file, offset } => (libc::MAP_PRIVATE as u64 | noreplace, file_fd(&file_fds, *file, c.pid)?, *offset),
            VmaKind::FileShared { file, offset } => (libc::MAP_SHARED as u64 | noreplace, file_fd(&file_fds, *file, c.pid)?, *offset),
            VmaKind::SharedAnon | VmaKind::Unlinked { .. } => {
                return Err(RestoreError::Incompatible(format!("child process {} maps shared memory at {:#x}, which a child cannot have", c.pid, v.start)))
            }
        };
        calls.push(Call::new("mmap", libc::SYS_mmap, &[v.start, v.end - v.start, v.prot as u64, flags, fd, off]));
        calls.extend(v.advice.iter().map(|&a| super::advice_call(v.start, v.end - v.start, a)));
    }
    // The executable it inherited, if the same, is kept (it is mapped again: the kernel
    // refuses to change an executable that is still mapped, even for itself).
    let exe_fd = if img.mm.exe == parent_img.mm.exe { u32::MAX as u64 } else { *file_fds.last().expect("exe is always opened") };
    for v in &c.inherited {
        // The leader's mapping, kept: its own protection and advice.
        calls.push(Call::new("mprotect(inherited)", libc::SYS_mprotect, &[v.start, v.end - v.start, v.prot as u64]));
        calls.extend(v.advice.iter().map(|&a| super::advice_call(v.start, v.end - v.start, a)));
    }
    push_mm_calls(&mut calls, &mut data, img, exe_fd);
    calls.extend(file_fds.iter().map(|&fd| Call::new("close(file)", libc::SYS_close, &[fd])));
    push_process_calls(&mut calls, &mut data, img, true);
    inj.run(&calls, &mut data).map_err(inj_err)?;

    // Its memory, whole (pages through /proc/PID/mem copy-on-write as the process's
    // own writes did).
    let own = img.vmas.iter().filter(|v| !matches!(v.kind, VmaKind::Special { .. } | VmaKind::FileShared { .. }));
    write_runs(host, &wmem, source, own.flat_map(|v| stored_runs(&source.index, v.start, v.end, c.key)), c.key)?;
    let mut buf = Vec::new();
    for &(start, n) in &c.from_leader {
        // The leader's image at these addresses (its own pages or its base's), inside
        // the child's own mappings (a run an image places elsewhere is refused), a
        // bounded piece at a time.
        let end = n.checked_mul(PAGE_SIZE).and_then(|len| start.checked_add(len));
        if !end.is_some_and(|end| within(&img.vmas, start, end)) {
            return Err(RestoreError::Incompatible(format!("child process {}: pages taken from the runtime at {start:#x} (+{n}) lie outside its memory", c.pid)));
        }
        for (k, piece) in (0..n).step_by(PIECE_PAGES as usize).enumerate() {
            let at = start + k as u64 * PIECE_PAGES * PAGE_SIZE;
            buf.resize(((n - piece).min(PIECE_PAGES) * PAGE_SIZE) as usize, 0);
            source.read_image(at, &mut buf).map_err(|source| RestoreError::Pages { pid: host, source })?;
            wmem.write_all_at(&buf, at).map_err(ioe(&format!("writing pages at {at:#x}")))?;
        }
    }
    create_zombies(&inj, &wmem, region, img).map_err(inj_err)?;
    let mut threads = Vec::new();
    let created = create_threads(&inj, &wmem, region, img, &mut threads);
    made[at].tracees.extend(threads.iter().copied());
    created.map_err(inj_err)?;
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    push_attr_calls(&mut calls, &mut data, img, true);
    push_rlimit_calls(&mut calls, &mut data, img);
    inj.run(&calls, &mut data).map_err(inj_err)?;
    std::fs::write(format!("/proc/{host}/oom_score_adj"), img.attrs.oom_score_adj.to_string()).map_err(ioe("writing oom_score_adj"))?;
    let all: Vec<Tracee> = made[at].tracees.clone();
    // Cleared by the credentials' change, like dumpability.
    let pdeathsig = Call::new("prctl(PR_SET_PDEATHSIG)", libc::SYS_prctl, &[libc::PR_SET_PDEATHSIG as u64, img.attrs.pdeathsig as u64]);
    settle_threads(&all, &wmem, region, img, &[pdeathsig])?;
    requeue_pending(child, &wmem, region, img, c.pid)?;
    leave_region(&all, img, region)?;
    tracing::debug!(child = c.pid, host, threads = all.len(), "child process restored");
    Ok(())
}

/// Pages read and written at a time.
const PIECE_PAGES: u64 = 256;

/// Whether `start..end` is covered by `vmas` (sorted, touching ones joined).
fn within(vmas: &[crate::image::Vma], start: u64, end: u64) -> bool {
    let mut at = start;
    for v in vmas.iter().filter(|v| v.end > start && v.start < end) {
        if v.start > at {
            return false;
        }
        at = at.max(v.end);
    }
    at >= end
}

fn file_fd(file_fds: &[u64], file: usize, pid: i32) -> Result<u64, RestoreError> {
    // The last one is the executable's.
    file_fds[..file_fds.len() - 1]
        .get(file)
        .copied()
        .ok_or_else(|| RestoreError::Incompatible(format!("child process {pid} maps file {file}, which its image does not list")))
}

/// Keep of the inherited table only the child's descriptors, each at its number:
/// every source moved above all numbers open now, everything below closed, each put
/// at its number with its close-on-exec flag, the moved ones closed.
fn descriptors(inj: &Injector<'_>, region: u64, host: i32, c: &ChildImage) -> Result<(), RestoreError> {
    let open = std::fs::read_dir(format!("/proc/{host}/fd"))
        .map_err(|source| RestoreError::Io { pid: host, what: format!("child process {}: listing descriptors", c.pid), source })?
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u64>().ok());
    let numbers = c.fds.iter().flat_map(|&(n, from, _)| [n as u64, from as u64]);
    let top = open.chain(numbers).max().map_or(0, |m| m + 1);
    let mut calls: Vec<Call> = c.fds.iter().enumerate().map(|(i, &(_, from, _))| Call::new("dup3(aside)", libc::SYS_dup3, &[from as u64, top + i as u64, 0])).collect();
    if top > 0 {
        calls.push(Call::new("close_range(inherited)", libc::SYS_close_range, &[0, top - 1, 0]));
    }
    for (i, &(n, _, cloexec)) in c.fds.iter().enumerate() {
        let flags = if cloexec { libc::O_CLOEXEC as u64 } else { 0 };
        calls.push(Call::new("dup3(own)", libc::SYS_dup3, &[top + i as u64, n as u64, flags]));
    }
    calls.push(Call::new("close_range(aside)", libc::SYS_close_range, &[top, u32::MAX as u64, 0]));
    inj.run(&calls, &mut DataArea::new(region)).map(|_| ()).map_err(|source| RestoreError::Inject { pid: host, source })
}

#[cfg(test)]
mod tests {
    use super::within;
    use crate::image::{Vma, VmaKind};

    #[test]
    fn runs_from_the_runtime_must_lie_in_the_childs_memory() {
        let v = |start: u64, end: u64| Vma { start, end, prot: 3, kind: VmaKind::Anon { growsdown: false }, advice: vec![] };
        let vmas = [v(0x1000, 0x3000), v(0x3000, 0x5000), v(0x8000, 0x9000)];
        assert!(within(&vmas, 0x1000, 0x3000));
        assert!(within(&vmas, 0x2000, 0x4000), "across two touching mappings");
        assert!(!within(&vmas, 0x4000, 0x6000), "into a hole");
        assert!(!within(&vmas, 0x0, 0x2000), "before the first");
        assert!(within(&vmas, 0x8000, 0x9000));
        assert!(!within(&vmas, 0x8000, 0xa000), "past the last");
    }
}
