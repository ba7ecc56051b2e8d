//! Restore: rebuild a process from an image inside a fresh sandbox.
//!
//! 1. The sandbox starts a *stub* (our own binary, PID 2 of a new pid
//!    namespace, under the sandbox's reaping init) that maps the injection region
//!    at an address free in the image's layout and waits; the sandbox seizes it
//!    with ptrace from the restoring thread.
//! 2. Batch A, injected into the stub: unmap everything of the stub's own,
//!    move the vDSO/vvar to where the image had them, create the userfaultfd,
//!    open the mapped files.
//! 3. Batch B: map every VMA of the image at its address, set the mm fields
//!    (PR_SET_MM_MAP), thread attributes (tid address, robust list, rseq),
//!    signal handlers, cwd, umask, descriptors, then drop to the image's
//!    credentials.
//! 4. From the node: take the userfaultfd out with pidfd_getfd, register the
//!    anonymous ranges, write copy-on-written file pages, install pages up
//!    front for eager paging, set rlimits.
//! 5. Unmap the injection region (one syscall through the vDSO), load the
//!    image's registers, start the page server and detach: the process
//!    resumes inside the runtime's read of its control channel.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;
use tracing::debug;

use crate::image::{AltStack, FdKind, ProcAttrs, ProcessImage, ThreadState, VmaKind};
use crate::inject::{self, Call, DataArea, InjectError, Injector, REGION_LEN};
use crate::pageserver::{self, AddressSpace, PageServer, PageServerError, PageSource, PrefetchStats, Stats};
use crate::ws::{Touch, WorkingSet};
use crate::procfs;
use crate::regs;
use crate::sys::mem::{self, ProcMem};
use crate::sys::ptrace::Tracee;
use crate::sys::{uffd, PAGE_SIZE};

mod children;
mod fds;
mod inotify;
mod unlinked;
pub mod gate;

#[derive(Debug, Error)]
pub enum RestoreError {
    #[error("restoring into pid {pid}: {what}")]
    Io { pid: i32, what: String, #[source] source: io::Error },
    #[error("restoring into pid {pid}")]
    Inject { pid: i32, #[source] source: InjectError },
    #[error("restoring into pid {pid}: installing pages")]
    Pages { pid: i32, #[source] source: PageServerError },
    #[error("the image cannot be restored here: {0}")]
    Incompatible(String),
}

pub use crate::conventions::UFFD_KEEP_FD;
/// Where the search for a free injection region starts.
const REGION_SEARCH_START: u64 = 0x1000_0000;
/// Space after the region used to shuffle the vDSO mappings.
const SHUFFLE_LEN: u64 = 1 << 20;

/// Choose an injection region address that overlaps none of the image's VMAs.
pub fn choose_region(img: &ProcessImage) -> Result<u64, RestoreError> {
    let need = REGION_LEN + SHUFFLE_LEN;
    let mut cand = REGION_SEARCH_START;
    // Free in the child processes' layouts too: they are made through the same region.
    fn all(img: &ProcessImage, out: &mut Vec<(u64, u64)>) {
        out.extend(img.vmas.iter().map(|v| (v.start, v.end)));
        img.children.iter().for_each(|c| all(&c.image, out));
    }
    let mut vmas = Vec::new();
    all(img, &mut vmas);
    vmas.sort_unstable();
    for (start, end) in vmas {
        if end <= cand {
            continue;
        }
        if start >= cand + need {
            return Ok(cand);
        }
        cand = end;
    }
    if cand + need < 0x7fff_0000_0000 {
        return Ok(cand);
    }
    Err(RestoreError::Incompatible("no free address range for the injection region".into()))
}

/// Memory installed before the process resumes, beyond copy-on-written file pages.
pub enum Prefill {
    /// Lazy: nothing.
    None,
    /// Every stored page.
    Eager,
    /// A working set read into memory (REAP prefetch / ws-cached), shared by the
    /// restores of a burst; `reader` is the one restore that read it from disk.
    Ws { shared: Arc<SharedWs>, reader: bool },
    /// The traced pages, fetched by several readers from the image.
    Parallel { trace: Vec<Touch>, readers: usize },
}

/// A working set read into memory once and installed into every instance restored
/// while it is alive (single flight; the bytes are freed when the last one is done),
/// piece by piece as its read goes on.
pub struct SharedWs {
    pub ws: WorkingSet,
    pub pages: crate::ws::Arriving,
}

/// What a finished restore hands to the caller.
pub struct Restored {
    pub pageserver: PageServer,
    pub stats: Arc<Stats>,
    pub prefetch: Option<PrefetchStats>,
    /// Milliseconds per restore step, in order.
    pub phases: Vec<(&'static str, f64)>,
    /// CPU milliseconds the restoring thread spent in each step (the restored process's
    /// own CPU, running the injected calls, is its own: see `Instance::pid`).
    pub phases_cpu: Vec<(&'static str, f64)>,
    /// Write tracking and baseline for in-place resets (None: cannot be reset).
    pub tracking: Option<crate::reset::Tracking>,
}

/// Address of a `syscall` instruction inside the vDSO (identical in every
/// process on this kernel), as an offset from the vDSO start.
///
/// Found once per process: the vDSO is the kernel's and does not change while we run,
/// and reading our own /proc/self/maps costs in proportion to our mappings (a node's
/// threads' stacks: with 500 idle instances it was ~1 ms of every restore).
fn vdso_syscall_offset() -> Option<u64> {
    static OFFSET: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(find_vdso_syscall_offset)
}

fn find_vdso_syscall_offset() -> Option<u64> {
    let base = nix::libc::AT_SYSINFO_EHDR;
    // SAFETY: getauxval only reads the process's auxiliary vector.
    let start = unsafe { libc::getauxval(base) };
    if start == 0 {
        return None;
    }
    let maps = procfs::parse_maps(&std::fs::read_to_string("/proc/self/maps").ok()?)?;
    let vdso = maps.iter().find(|m| m.name == "[vdso]")?;
    let mem = ProcMem::open(std::process::id() as i32, false).ok()?;
    let mut text = vec![0u8; vdso.len() as usize];
    mem.read_exact_at(&mut text, vdso.start).ok()?;
    text.windows(2).position(|w| w == [0x0f, 0x05]).map(|o| o as u64)
}

/// Rebuild `img` into the stopped stub `pid` (our child, traced by this thread),
/// whose injection region is at `region`. `pidfd` refers to the stub. On failure
/// the process is killed (and the threads we created reaped), so the caller can
/// simply destroy the sandbox.
#[allow(clippy::too_many_arguments)]
pub fn restore_into(
    pid: i32,
    pidfd: &OwnedFd,
    region: u64,
    img: &ProcessImage,
    source: Arc<PageSource>,
    track_writes: bool,
    base_file: bool,
    prefill: impl FnOnce() -> (Prefill, bool),
) -> Result<Restored, RestoreError> {
    let mut threads = Vec::new();
    let mut made = Vec::new();
    let result = restore_inner(pid, pidfd, region, img, source, track_writes, base_file, prefill, &mut threads, &mut made);
    if result.is_err() {
        crate::sys::ptrace::kill_and_reap(pid, &threads);
        children::kill(&made);
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn restore_inner(
    pid: i32,
    pidfd: &OwnedFd,
    region: u64,
    img: &ProcessImage,
    source: Arc<PageSource>,
    track_writes: bool,
    base_file: bool,
    prefill: impl FnOnce() -> (Prefill, bool),
    threads: &mut Vec<Tracee>,
    made: &mut Vec<children::Made>,
) -> Result<Restored, RestoreError> {
    // Memory ranges mapped privately from the snapshot's shared memory file (see
    // `sharedmem.rs`): never together with write tracking (a reset works on anonymous
    // memory). `base_file`: its base's file (see `sharedmem.rs`), if it has one.
    let base_file = base_file && source.has_base_file();
    let (shared_path, shared_ranges) = match source.shared(base_file) {
        Some((path, ranges)) if !track_writes => (Some(path.to_path_buf()), ranges.to_vec()),
        _ => (None, Vec::new()),
    };
    let is_shared = |v: &crate::image::Vma| shared_ranges.binary_search(&(v.start, v.end)).is_ok();
    let mut phases = Vec::new();
    let mut phases_cpu = Vec::new();
    let mut t = Instant::now();
    let mut cpu = crate::pageserver::thread_cpu_ns();
    let mut lap = |name: &'static str, phases: &mut Vec<(&'static str, f64)>| {
        tracing::trace!(pid, phase = name, "restore phase done");
        phases.push((name, t.elapsed().as_secs_f64() * 1e3));
        t = Instant::now();
        let now = crate::pageserver::thread_cpu_ns();
        phases_cpu.push((name, now.saturating_sub(cpu) as f64 / 1e6));
        cpu = now;
    };
    let ioe = |what: &str| {
        let what = what.to_string();
        move |source| RestoreError::Io { pid, what, source }
    };
    let inj_err = |source| RestoreError::Inject { pid, source };
    if img.threads.first().map(|t| t.tid) != Some(crate::conventions::MAIN_PID) {
        return Err(RestoreError::Incompatible(format!("the image's first thread is not PID {}", crate::conventions::MAIN_PID)));
    }
    files_unchanged(pid, img)?;

    // What the instance had in /tmp and /dev/shm, before any descriptor is reopened.
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    crate::tmpfs::restore(&root, &img.tmp).map_err(|e| RestoreError::Io { pid, what: "restoring /tmp".into(), source: io::Error::other(e) })?;
    for r in &img.fds {
        if let FdKind::Path { path, .. } | FdKind::PathLocked { path, .. } = &r.kind {
            if std::fs::symlink_metadata(root.join(path.trim_start_matches('/'))).is_err() {
                return Err(RestoreError::Incompatible(format!(
                    "descriptor {} refers to {path}, which does not exist in the new sandbox",
                    r.fd
                )));
            }
        }
    }

    let tracee = Tracee::attached(pid).map_err(ioe("ptrace options"))?;
    let wmem = ProcMem::open(pid, true).map_err(ioe("opening /proc/PID/mem"))?;
    let inj = Injector::new(tracee, &wmem, region).map_err(inj_err)?;
    let stub_maps = procfs::parse_maps(&std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(ioe("reading maps"))?)
        .ok_or_else(|| RestoreError::Io { pid, what: "parsing maps".into(), source: io::ErrorKind::InvalidData.into() })?;
    lap("stub", &mut phases);

    // ---- Batch A: clear the stub, place the vDSO, create the uffd, open files.
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    clear_stub(&mut calls, &stub_maps, img, region, &[])?;
    let uffd_flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    let uffd_idx = calls.len();
    calls.push(Call::new("userfaultfd", libc::SYS_userfaultfd, &[uffd_flags]));
    let mut paths: Vec<&str> = img.files.iter().map(|f| f.path.as_str()).collect();
    paths.push(img.mm.exe.as_str());
    let shared_file = shared_path.filter(|_| !shared_ranges.is_empty()).map(|p| p.to_string_lossy().into_owned());
    if let Some(p) = &shared_file {
        paths.push(p.as_str());
    }
    let open_idx = calls.len();
    for p in &paths {
        let a = data.push_cstr(p);
        calls.push(Call::new("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, a, (libc::O_RDONLY | libc::O_CLOEXEC) as u64]));
    }
    let res = inj.run(&calls, &mut data).map_err(inj_err)?;
    let uffd_tmp = res[uffd_idx] as u64;
    let mut file_fds: Vec<u64> = res[open_idx..].iter().map(|&r| r as u64).collect();
    let shared_fd = if shared_file.is_some() { file_fds.pop() } else { None };
    let all_fds: Vec<u64> = file_fds.iter().copied().chain(shared_fd).collect();
    lap("batch_a", &mut phases);

    // ---- Batch B: the image's address space and process attributes.
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    calls.push(Call::new("dup3(uffd)", libc::SYS_dup3, &[uffd_tmp, UFFD_KEEP_FD, libc::O_CLOEXEC as u64]));
    calls.push(Call::new("close(uffd)", libc::SYS_close, &[uffd_tmp]));
    // (start, end, mapped from the shared memory file): registered with the page server.
    let mut anon_ranges: Vec<(u64, u64, bool)> = Vec::new();
    let mut anon_vmas: Vec<(u64, u64)> = Vec::new();
    for v in &img.vmas {
        let len = v.end - v.start;
        let noreplace = libc::MAP_FIXED_NOREPLACE as u64;
        let (flags, fd, off) = match &v.kind {
            // Mapped from their descriptors once those are restored (see `unlinked`).
            VmaKind::Special { .. } | VmaKind::Unlinked { .. } => continue,
            // Served by the page server: anonymous memory and file mappings stored whole.
            VmaKind::Anon { .. } | VmaKind::FileCopied { .. } => {
                anon_vmas.push((v.start, v.end));
                let shared = shared_fd.is_some() && is_shared(v);
                match anon_ranges.last_mut() {
                    Some(last) if last.1 == v.start && last.2 == shared => last.1 = v.end,
                    _ => anon_ranges.push((v.start, v.end, shared)),
                }
                match shared_fd {
                    // Private mapping of the shared memory file at offset = address: pages
                    // no instance writes exist once on the node; a write copies the page.
                    Some(fd) if shared => (libc::MAP_PRIVATE as u64 | noreplace, fd, v.start),
                    _ => {
                        let gd = if matches!(v.kind, VmaKind::Anon { growsdown: true }) { libc::MAP_GROWSDOWN as u64 } else { 0 };
                        ((libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64 | gd | noreplace, u64::MAX, 0)
                    }
                }
            }
            VmaKind::FilePrivate { file, offset } => (libc::MAP_PRIVATE as u64 | noreplace, file_fds[*file], *offset),
            VmaKind::FileShared { file, offset } => (libc::MAP_SHARED as u64 | noreplace, file_fds[*file], *offset),
            VmaKind::SharedAnon => ((libc::MAP_SHARED | libc::MAP_ANONYMOUS) as u64 | noreplace, u64::MAX, 0),
        };
        // Shared anonymous memory is writable until its contents are written (a
        // forced write into a read-only shared mapping fails); its protection is set
        // with the main thread's last calls.
        let prot = if matches!(v.kind, VmaKind::SharedAnon) { (libc::PROT_READ | libc::PROT_WRITE) as u64 } else { v.prot as u64 };
        calls.push(Call::new("mmap", libc::SYS_mmap, &[v.start, len, prot, flags, fd, off]));
        for &advice in &v.advice {
            calls.push(advice_call(v.start, len, advice));
        }
    }
    let exe_fd = *file_fds.last().expect("exe is always opened");
    push_mm_calls(&mut calls, &mut data, img, exe_fd);
    for fd in &all_fds {
        calls.push(Call::new("close(file)", libc::SYS_close, &[*fd]));
    }
    push_process_calls(&mut calls, &mut data, img, false);
    inj.run(&calls, &mut data).map_err(inj_err)?;
    fds::restore_fds(&inj, img).map_err(inj_err)?;
    if inotify::any(img) {
        inotify::put_back(pid, pidfd.as_fd(), img).map_err(|e| RestoreError::Io { pid, what: format!("inotify events queued at capture: {e}"), source: io::Error::other("not caused again") })?;
    }
    let unlinked = unlinked::calls(img);
    if !unlinked.is_empty() {
        inj.run(&unlinked, &mut DataArea::new(region)).map_err(inj_err)?;
    }
    create_threads(&inj, &wmem, region, img, threads).map_err(inj_err)?;
    create_zombies(&inj, &wmem, region, img).map_err(inj_err)?;
    // Process attributes, then the child processes, forked from the leader with its
    // session and process group set and its descriptors made (restore/children.rs).
    // Resource limits last (still as root, before the credentials drop): a lowered
    // RLIMIT_NOFILE or RLIMIT_NPROC must not refuse the descriptors, threads and
    // processes recreated above. They are per process, so the leader sets them for all.
    // (One batch without children: each batch is a round trip through ptrace.)
    let mut data = DataArea::new(region);
    let mut calls = Vec::new();
    push_attr_calls(&mut calls, &mut data, img, false);
    push_group_calls(&mut calls, &img.attrs);
    if !img.children.is_empty() {
        inj.run(&calls, &mut data).map_err(inj_err)?;
        children::make_all(&inj, region, img, &source, made)?;
        (data, calls) = (DataArea::new(region), Vec::new());
    }
    calls.extend(img.handed_down.iter().map(|&fd| Call::new("close(handed down)", libc::SYS_close, &[fd as u64])));
    push_rlimit_calls(&mut calls, &mut data, img);
    inj.run(&calls, &mut data).map_err(inj_err)?;
    // Lowering it needs privilege the process no longer has: the node writes it.
    std::fs::write(format!("/proc/{pid}/oom_score_adj"), img.attrs.oom_score_adj.to_string())
        .map_err(ioe("writing oom_score_adj"))?;
    let threads: &[Tracee] = threads;
    lap("batch_b", &mut phases);

    // ---- From the node: userfaultfd, copy-on-write pages, up-front pages.
    let uffd = mem::pidfd_getfd(pidfd.as_fd(), UFFD_KEEP_FD as i32).map_err(ioe("pidfd_getfd(userfaultfd)"))?;
    let mut features = uffd::FEATURE_EVENT_FORK | uffd::FEATURE_EVENT_REMAP | uffd::FEATURE_EVENT_REMOVE | uffd::FEATURE_EVENT_UNMAP
        | uffd::FEATURE_WP_ASYNC;
    if shared_fd.is_some() {
        features |= uffd::FEATURE_MISSING_SHMEM | uffd::FEATURE_MINOR_SHMEM;
    }
    uffd::api(uffd.as_fd(), features).map_err(ioe("UFFDIO_API"))?;
    for &(a, b, shared) in &anon_ranges {
        // A mapped page the process released (MADV_DONTNEED) is still in the file: the
        // next touch is a minor fault, answered with zeros (anonymous semantics).
        let mode = uffd::REGISTER_MODE_MISSING | if shared { uffd::REGISTER_MODE_MINOR } else { 0 };
        uffd::register(uffd.as_fd(), a, b - a, mode).map_err(ioe(&format!("UFFDIO_REGISTER {a:#x}-{b:#x}")))?;
    }
    let share = source.fault_cpu_share();
    let stats = Arc::new(Stats::with_fault_budget((share > 0.0).then(|| share * img.sandbox.cpu_millis as f64 / 1000.0)));
    stats.maps_shared_memory.store(shared_fd.is_some(), Ordering::Relaxed);
    stats.maps_base_file.store(shared_fd.is_some() && base_file, Ordering::Relaxed);
    write_file_cow_pages(pid, &wmem, img, &source, &stats)?;
    let pages_err = |source| RestoreError::Pages { pid, source };
    // rseq pages of every thread first (see above), then each thread registers
    // its rseq area and drops to the image's credentials (both are per thread).
    // Before waiting for the prefetched working set: this needs none of it, and
    // the read (on a helper thread) goes on meanwhile. Working-set installs skip
    // pages already present.
    let rseq_pages = rseq_pages(img);
    pageserver::install_pages(&uffd, &source, &rseq_pages, &stats).map_err(|source| RestoreError::Pages { pid, source })?;
    // Changing credentials clears the parent-death signal: set it again, so the
    // process dies with the node that serves its memory. Shared anonymous memory,
    // its contents written (write_file_cow_pages), gets its own protection.
    let mut last = vec![Call::new("prctl(PR_SET_PDEATHSIG)", libc::SYS_prctl, &[libc::PR_SET_PDEATHSIG as u64, libc::SIGKILL as u64])];
    for v in img.vmas.iter().filter(|v| matches!(v.kind, VmaKind::SharedAnon) && v.prot != libc::PROT_READ | libc::PROT_WRITE) {
        last.push(Call::new("mprotect(shared)", libc::SYS_mprotect, &[v.start, v.end - v.start, v.prot as u64]));
    }
    let all: Vec<Tracee> = std::iter::once(tracee).chain(threads.iter().copied()).collect();
    settle_threads(&all, &wmem, region, img, &last)?;
    // Signals pending at capture, queued again with their siginfo last of all: every
    // thread's injected calls are done, and the leader runs what is left of the
    // restore with every signal blocked (the image's masks are set just before the
    // process resumes), so none is delivered early.
    requeue_pending(tracee, &wmem, region, img, crate::conventions::MAIN_PID)?;
    let (prefill, record) = prefill();
    // Recording starts before the process resumes so no fault escapes the trace.
    stats.recording.store(record, Ordering::Relaxed);
    let prefetch = match prefill {
        Prefill::None => None,
        Prefill::Eager => {
            // Per VMA: one UFFDIO_COPY cannot span two VMAs.
            pageserver::install_all(&uffd, &source, &anon_vmas, &stats).map_err(pages_err)?;
            None
        }
        Prefill::Ws { shared, reader } => {
            let starts: Vec<u64> = anon_vmas.iter().map(|v| v.0).collect();
            let mut ps = pageserver::install_ws(&uffd, &shared.ws, &shared.pages, &starts, &source, &stats).map_err(pages_err)?;
            if reader {
                ps.read_ms = shared.pages.read_ms();
                // What came from the disk (ws.lz4's frames are fewer bytes than the pages).
                ps.disk_bytes = shared.pages.read_bytes();
                stats.bytes_read.fetch_add(ps.disk_bytes, Ordering::Relaxed);
            } else {
                ps.shared = true;
            }
            Some(ps)
        }
        Prefill::Parallel { trace, readers } => {
            Some(pageserver::install_parallel(&uffd, &source, &trace, readers, &stats).map_err(pages_err)?)
        }
    };
    lap("memory", &mut phases);

    // ---- Leave no trace of the injection region, load registers, go.
    leave_region(&all, img, region)?;
    // Write tracking for in-place resets, when asked for; an instance that cannot be
    // tracked is still a good instance, it just cannot be reset (see reset.rs).
    let tracking = if track_writes {
        crate::reset::arm(pid, &uffd, img, &stats)
            .map_err(|e| tracing::warn!(pid, error = %e, "write tracking unavailable; this instance cannot be reset"))
            .ok()
    } else {
        None
    };
    let server_pidfd = mem::pidfd_open(pid).map_err(ioe("pidfd_open"))?;
    let space = AddressSpace::identity(&anon_ranges.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>());
    let pageserver = PageServer::start(uffd, server_pidfd, source, space, stats.clone()).map_err(ioe("starting the page server"))?;
    if std::env::var_os("THAW_DEBUG_RESTORE").is_some() {
        debug_follow(&tracee);
    }
    children::detach(made)?;
    for t in all.iter().rev() {
        t.detach().map_err(ioe("PTRACE_DETACH"))?;
    }
    lap("resume", &mut phases);
    debug!(pid, ?phases, upfront = stats.pages_installed_upfront.load(Ordering::Relaxed), "restored");
    Ok(Restored { pageserver, stats, prefetch, phases, phases_cpu, tracking })
}

/// The calls that clear a stub's address space for `img`: unmap everything of its
/// own but the injection region at `region`, and move its vDSO and vvar to where the
/// image had them.
/// Mappings inside `keep` (a child's, inherited across its fork) stay.
pub(crate) fn clear_stub(calls: &mut Vec<Call>, stub_maps: &[procfs::MapEntry], img: &ProcessImage, region: u64, keep: &[crate::image::Vma]) -> Result<(), RestoreError> {
    let specials = ["[vvar]", "[vvar_vclock]", "[vdso]"];
    for m in stub_maps {
        if m.start == region || m.name == "[vsyscall]" || specials.contains(&m.name.as_str()) {
            continue;
        }
        if keep.iter().any(|k| k.start <= m.start && m.end <= k.end) {
            continue;
        }
        calls.push(Call::new("munmap", libc::SYS_munmap, &[m.start, m.len()]));
    }
    let mremap_flags = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64;
    let mut shuffle = region + REGION_LEN;
    let mut moves = Vec::new();
    for m in stub_maps.iter().filter(|m| specials.contains(&m.name.as_str())) {
        let target = img.vmas.iter().find(|v| matches!(&v.kind, VmaKind::Special { name } if *name == m.name));
        match target {
            Some(v) if v.end - v.start == m.len() => {
                calls.push(Call::new("mremap(vdso to scratch)", libc::SYS_mremap, &[m.start, m.len(), m.len(), mremap_flags, shuffle]));
                moves.push((shuffle, m.len(), v.start));
                shuffle += m.len();
            }
            Some(v) => {
                return Err(RestoreError::Incompatible(format!(
                    "{} is {} bytes on this kernel but {} in the image",
                    m.name,
                    m.len(),
                    v.end - v.start
                )))
            }
            None => calls.push(Call::new("munmap(special)", libc::SYS_munmap, &[m.start, m.len()])),
        }
    }
    for (from, len, to) in moves {
        calls.push(Call::new("mremap(vdso into place)", libc::SYS_mremap, &[from, len, len, mremap_flags, to]));
    }
    Ok(())
}

/// PR_SET_MM_MAP: the image's mm fields, auxv and executable (`exe_fd`).
pub(crate) fn push_mm_calls(calls: &mut Vec<Call>, data: &mut DataArea, img: &ProcessImage, exe_fd: u64) {
    let f = &img.mm.fields;
    let auxv = data.push(&img.mm.auxv);
    let mut mm_map = Vec::with_capacity(104);
    for x in [
        f.start_code, f.end_code, f.start_data, f.end_data, f.start_brk, img.mm.brk, f.start_stack, f.arg_start,
        f.arg_end, f.env_start, f.env_end, auxv,
    ] {
        mm_map.extend_from_slice(&x.to_le_bytes());
    }
    mm_map.extend_from_slice(&(img.mm.auxv.len() as u32).to_le_bytes());
    mm_map.extend_from_slice(&(exe_fd as u32).to_le_bytes());
    let mm_map_addr = data.push(&mm_map);
    const PR_SET_MM: u64 = 35;
    const PR_SET_MM_MAP: u64 = 14;
    calls.push(Call::new("prctl(PR_SET_MM_MAP)", libc::SYS_prctl, &[PR_SET_MM, PR_SET_MM_MAP, mm_map_addr, 104]));
}

/// The leader thread's attributes, the signal actions (with `all`, every signal's,
/// the default where the image has none: a forked child has its parent's), cwd,
/// umask and personality.
pub(crate) fn push_process_calls(calls: &mut Vec<Call>, data: &mut DataArea, img: &ProcessImage, all: bool) {
    push_thread_calls(calls, data, &img.threads[0]);
    let default = |sig: u32| crate::image::SigAction { sig, handler: 0, flags: 0, restorer: 0, mask: 0 };
    let every: Vec<crate::image::SigAction> = (1..=64u32)
        .filter(|&s| all && s != libc::SIGKILL as u32 && s != libc::SIGSTOP as u32)
        .map(|s| img.sigactions.iter().find(|a| a.sig == s).cloned().unwrap_or_else(|| default(s)))
        .collect();
    for sa in if all { &every } else { &img.sigactions } {
        let mut b = Vec::with_capacity(32);
        for x in sa.words() {
            b.extend_from_slice(&x.to_le_bytes());
        }
        let a = data.push(&b);
        calls.push(Call::new("rt_sigaction", libc::SYS_rt_sigaction, &[sa.sig as u64, a, 0, 8]));
    }
    let cwd = data.push_cstr(&img.cwd);
    calls.push(Call::new("chdir", libc::SYS_chdir, &[cwd]));
    calls.push(Call::new("umask", libc::SYS_umask, &[img.umask as u64]));
    calls.push(Call::new("personality", libc::SYS_personality, &[img.personality as u64]));
}

/// The files `img` (and its child processes) maps must be the ones it was captured
/// with, as the sandbox of `pid` sees them.
fn files_unchanged(pid: i32, img: &ProcessImage) -> Result<(), RestoreError> {
    for f in &img.files {
        let meta = std::fs::metadata(format!("/proc/{pid}/root{}", f.path)).map_err(|source| RestoreError::Io { pid, what: format!("stat {}", f.path), source })?;
        if !f.unchanged(&meta) {
            return Err(RestoreError::Incompatible(format!(
                "{} changed since the snapshot was taken (size {} -> {}); re-create the snapshot",
                f.path,
                f.size,
                meta.len()
            )));
        }
    }
    img.children.iter().try_for_each(|c| files_unchanged(pid, &c.image))
}

/// The call that sets `advice` (a [`crate::image::Vma::advice`]) on a mapping again.
pub(crate) fn advice_call(start: u64, len: u64, advice: i32) -> Call {
    match advice {
        crate::image::ADVICE_MLOCK => Call::new("mlock2", libc::SYS_mlock2, &[start, len, libc::MLOCK_ONFAULT as u64]),
        _ => Call::new("madvise", libc::SYS_madvise, &[start, len, advice as u64]),
    }
}

/// The pages holding the threads' rseq areas, installed before the process resumes.
pub fn rseq_pages(img: &ProcessImage) -> Vec<u64> {
    img.threads
        .iter()
        .filter_map(|t| t.rseq.as_ref())
        .flat_map(|r| {
            let first = r.ptr & !(PAGE_SIZE - 1);
            let last = (r.ptr + r.len as u64 - 1) & !(PAGE_SIZE - 1);
            (first..=last).step_by(PAGE_SIZE as usize)
        })
        .collect()
}

/// The stored pages of private file mappings (the ones the process had written) and
/// of shared anonymous memory, as (address, first file page, pages) per contiguous
/// run inside a mapping: what [`write_file_cow_pages`] writes before the process
/// resumes.
pub fn file_cow_runs<'a>(img: &'a ProcessImage, index: &'a crate::image::PageIndex) -> impl Iterator<Item = (u64, u64, u64)> + 'a {
    img.vmas
        .iter()
        .filter(|v| matches!(v.kind, VmaKind::FilePrivate { .. } | VmaKind::SharedAnon | VmaKind::Unlinked { shared: false, .. }))
        .flat_map(move |v| stored_runs(index, v.start, v.end, 0))
}

/// The stored pages of `index` from `start` to `end` (keyed with `key`, see
/// [`crate::image::child_key`]), as (address, first file page, pages) per contiguous run.
pub(crate) fn stored_runs(index: &crate::image::PageIndex, start: u64, end: u64, key: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    let (start, end) = (start | key, end | key);
    let first = index.runs.partition_point(|r| r.vaddr + r.npages * PAGE_SIZE <= start);
    index.runs[first..].iter().take_while(move |r| r.vaddr < end).map(move |run| {
        let s = run.vaddr.max(start);
        let e = (run.vaddr + run.npages * PAGE_SIZE).min(end);
        (s & !key, run.file_page + (s - run.vaddr) / PAGE_SIZE, (e - s) / PAGE_SIZE)
    })
}

/// Pages of private file mappings that the process had written (relocations,
/// .data) differ from the file: write them now through /proc/PID/mem, which
/// performs the copy-on-write just as the original writes did. Shared anonymous
/// memory's pages are written the same way (into the shared object).
fn write_file_cow_pages(
    pid: i32,
    wmem: &ProcMem,
    img: &ProcessImage,
    source: &PageSource,
    stats: &Stats,
) -> Result<(), RestoreError> {
    let n = write_runs(pid, wmem, source, file_cow_runs(img, &source.index), 0)?;
    stats.bytes_read.fetch_add(n * PAGE_SIZE, Ordering::Relaxed);
    stats.pages_installed_upfront.fetch_add(n, Ordering::Relaxed);
    Ok(())
}

/// Write stored pages into process `pid` through /proc/PID/mem (`wmem`): each of `runs`
/// (address, first file page, pages; stored under `key`, see
/// [`crate::image::child_key`]) with one read and one write. Returns the pages written.
fn write_runs(pid: i32, wmem: &ProcMem, source: &PageSource, runs: impl Iterator<Item = (u64, u64, u64)>, key: u64) -> Result<u64, RestoreError> {
    let mut buf = Vec::new();
    let mut written = 0;
    for (s, fp, n) in runs {
        buf.resize((n * PAGE_SIZE) as usize, 0);
        source.read_pages(s | key, fp, &mut buf).map_err(|source| RestoreError::Pages { pid, source })?;
        wmem.write_all_at(&buf, s)
            .map_err(|source| RestoreError::Io { pid, what: format!("writing pages at {s:#x}"), source })?;
        written += n;
    }
    Ok(written)
}

/// Each thread's last injected calls, its own: its rseq area (its pages present), the
/// image's credentials; the main thread's last of all, with `last` (what the
/// credentials' change cleared) after its dumpability, which the change clears too.
fn settle_threads(all: &[Tracee], wmem: &ProcMem, region: u64, img: &ProcessImage, last: &[Call]) -> Result<(), RestoreError> {
    for (i, t) in img.threads.iter().enumerate().rev() {
        let pid = all[i].pid.as_raw();
        let ti = Injector::new(all[i], wmem, region).map_err(|source| RestoreError::Inject { pid, source })?;
        let mut data = DataArea::new(region);
        let mut calls = Vec::new();
        push_settle_calls(&mut calls, &mut data, img, t);
        if i == 0 {
            // Without this the process's own /proc/self files (environ, mem, ...) became
            // unreadable to it (dumpability falls to suid_dumpable, 0 here).
            calls.push(Call::new("prctl(PR_SET_DUMPABLE)", libc::SYS_prctl, &[libc::PR_SET_DUMPABLE as u64, img.attrs.dumpable as u64]));
            calls.extend_from_slice(last);
        }
        ti.run(&calls, &mut data).map_err(|source| RestoreError::Inject { pid, source })?;
    }
    Ok(())
}

/// What a process does last before it runs: unmap the injection region (one syscall
/// through the image's vDSO), then load each of `all` (its threads, the main one
/// first) with its registers, extended state and signal mask.
fn leave_region(all: &[Tracee], img: &ProcessImage, region: u64) -> Result<(), RestoreError> {
    let pid = all[0].pid.as_raw();
    let off = vdso_syscall_offset().ok_or_else(|| RestoreError::Incompatible("no syscall instruction in the vDSO".into()))?;
    let vdso = img
        .vmas
        .iter()
        .find(|v| matches!(&v.kind, VmaKind::Special { name } if name == "[vdso]"))
        .ok_or_else(|| RestoreError::Incompatible(format!("process {} of the image has no [vdso] mapping", img.threads[0].tid)))?;
    inject::single(&all[0], vdso.start + off, Call::new("munmap(region)", libc::SYS_munmap, &[region, REGION_LEN]))
        .map_err(|source| RestoreError::Inject { pid, source })?;
    let ioe = |what: &'static str| move |source| RestoreError::Io { pid, what: what.into(), source };
    for (t, st) in all.iter().zip(&img.threads) {
        t.set_regs(&regs::from_array(&st.regs)).map_err(ioe("SETREGS"))?;
        t.set_xstate(&st.xstate).map_err(ioe("SETREGSET xstate"))?;
        t.set_sigmask(st.sigmask).map_err(ioe("SETSIGMASK"))?;
    }
    Ok(())
}

/// Attributes each thread sets for itself: clear-child-tid address, robust
/// futex list, alternate signal stack, name. (rseq comes later, see above.)
fn push_thread_calls(calls: &mut Vec<Call>, data: &mut DataArea, t: &ThreadState) {
    calls.push(Call::new("set_tid_address", libc::SYS_set_tid_address, &[t.tid_address]));
    // The thread group leader is the restore stub itself: whatever per-thread state
    // the stub had and the image does not must be cleared, never inherited.
    const ROBUST_LIST_HEAD_LEN: u64 = 24;
    let (head, len) = if t.robust_list.0 != 0 { t.robust_list } else { (0, ROBUST_LIST_HEAD_LEN) };
    calls.push(Call::new("set_robust_list", libc::SYS_set_robust_list, &[head, len]));
    // Without this the stub's alternate signal stack (Rust's runtime installs one for
    // stack-overflow reports) stayed registered over memory the image reuses: every
    // SA_ONSTACK handler (CPython installs all its handlers so) then killed the
    // restored process with SIGSEGV when its signal arrived.
    let ss = t.altstack.clone().unwrap_or(AltStack { sp: 0, flags: libc::SS_DISABLE, size: 0 });
    let mut b = Vec::with_capacity(24);
    b.extend_from_slice(&ss.sp.to_le_bytes());
    b.extend_from_slice(&(ss.flags as i64).to_le_bytes());
    b.extend_from_slice(&ss.size.to_le_bytes());
    let a = data.push(&b);
    calls.push(Call::new("sigaltstack", libc::SYS_sigaltstack, &[a, 0]));
    let comm = data.push_cstr(&t.comm);
    calls.push(Call::new("prctl(PR_SET_NAME)", libc::SYS_prctl, &[libc::PR_SET_NAME as u64, comm]));
}

/// Pending signals queued per injected batch (128 bytes of siginfo each, well inside
/// the data area).
const PENDING_BATCH: usize = 256;

/// The image's pending signals, in queue order: the process's own (no thread) and
/// each thread's (its tid). Checked, as a malformed one must not reach the kernel.
fn pending_signals(img: &ProcessImage) -> Result<Vec<(Option<i32>, &crate::image::PendingSignal)>, RestoreError> {
    let process = img.attrs.pending_signals.iter().map(|s| (None, s));
    let threads = img.threads.iter().flat_map(|t| t.pending.iter().map(move |s| (Some(t.tid), s)));
    process
        .chain(threads)
        .map(|(tid, s)| {
            if s.info.len() != crate::sys::ptrace::SIGINFO_LEN || !(1..=64).contains(&s.signo) {
                return Err(RestoreError::Incompatible(format!("a pending signal of the image is malformed (signal {}, {} bytes of siginfo)", s.signo, s.info.len())));
            }
            Ok((tid, s))
        })
        .collect()
}

/// Queue the image's pending signals again in the process `tracee` (its pid `ns` in
/// the sandbox), with every signal blocked until its registers and mask are loaded.
fn requeue_pending(tracee: Tracee, wmem: &ProcMem, region: u64, img: &ProcessImage, ns: i32) -> Result<(), RestoreError> {
    let pid = tracee.pid.as_raw();
    let pending = pending_signals(img)?;
    if pending.is_empty() {
        return Ok(());
    }
    tracee.set_sigmask(!0).map_err(|source| RestoreError::Io { pid, what: "SETSIGMASK (all blocked)".into(), source })?;
    let ti = Injector::new(tracee, wmem, region).map_err(|source| RestoreError::Inject { pid, source })?;
    for batch in pending.chunks(PENDING_BATCH) {
        let mut data = DataArea::new(region);
        let calls: Vec<Call> = batch.iter().map(|&(tid, s)| requeue_call(ns, tid, s, data.push(&s.info))).collect();
        ti.run(&calls, &mut data).map_err(|source| RestoreError::Inject { pid, source })?;
    }
    Ok(())
}

/// The call that queues pending signal `s` again, its siginfo at `info`: the
/// process's (`ns` in the sandbox) with rt_sigqueueinfo, a thread's with
/// rt_tgsigqueueinfo. The process makes them; it may queue any siginfo to itself.
fn requeue_call(ns: i32, tid: Option<i32>, s: &crate::image::PendingSignal, info: u64) -> Call {
    let main = ns as u64;
    match tid {
        None => Call::new("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo, &[main, s.signo as u64, info]),
        Some(tid) => Call::new("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo, &[main, tid as u64, s.signo as u64, info]),
    }
}

/// Scheduling and prctl attributes of the process, its interval timers, POSIX timers
/// and its threads' scheduling policies (each thread's tid in the sandbox, where the
/// process runs; with `every_thread`, SCHED_OTHER too: a forked child has its
/// parent's policy).
fn push_attr_calls(calls: &mut Vec<Call>, data: &mut DataArea, img: &ProcessImage, every_thread: bool) {
    let a = &img.attrs;
    calls.push(Call::new("setpriority", libc::SYS_setpriority, &[libc::PRIO_PROCESS as u64, 0, a.nice as i64 as u64]));
    if !a.affinity.is_empty() {
        let mask = data.push(&a.affinity);
        calls.push(Call::new("sched_setaffinity", libc::SYS_sched_setaffinity, &[0, a.affinity.len() as u64, mask]));
    }
    if a.timer_slack_ns != 0 {
        calls.push(Call::new("prctl(PR_SET_TIMERSLACK)", libc::SYS_prctl, &[libc::PR_SET_TIMERSLACK as u64, a.timer_slack_ns]));
    }
    if a.thp_disable {
        calls.push(Call::new("prctl(PR_SET_THP_DISABLE)", libc::SYS_prctl, &[libc::PR_SET_THP_DISABLE as u64, 1, 0, 0, 0]));
    }
    if a.child_subreaper {
        calls.push(Call::new("prctl(PR_SET_CHILD_SUBREAPER)", libc::SYS_prctl, &[libc::PR_SET_CHILD_SUBREAPER as u64, 1]));
    }
    for (which, t) in a.itimers.iter().enumerate() {
        if t.iter().any(|&w| w != 0) {
            let v = data.push(&t.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>());
            calls.push(Call::new("setitimer", libc::SYS_setitimer, &[which as u64, v, 0]));
        }
    }
    push_timer_calls(calls, data, &a.posix_timers);
    for t in img.threads.iter().filter(|t| every_thread || t.sched_policy != libc::SCHED_OTHER) {
        let param = data.push(&0i32.to_le_bytes());
        calls.push(Call::new("sched_setscheduler", libc::SYS_sched_setscheduler, &[t.tid as u64, t.sched_policy as u64, param]));
    }
}

/// The process's session and process group, as the runtime's: its own session, or
/// group, or the one it was born in.
fn push_group_calls(calls: &mut Vec<Call>, a: &ProcAttrs) {
    if a.session_leader {
        calls.push(Call::new("setsid", libc::SYS_setsid, &[]));
    } else if a.group_leader {
        calls.push(Call::new("setpgid", libc::SYS_setpgid, &[0, 0]));
    }
}

/// The process's resource limits.
fn push_rlimit_calls(calls: &mut Vec<Call>, data: &mut DataArea, img: &ProcessImage) {
    for &(res, cur, max) in &img.rlimits {
        let a = data.push(&[cur.to_le_bytes(), max.to_le_bytes()].concat());
        calls.push(Call::new("prlimit64", libc::SYS_prlimit64, &[0, res as u64, a, 0]));
    }
}

/// `prctl(PR_TIMER_CREATE_RESTORE_IDS)`: timer_create takes the id to give the timer
/// from its `created_timer_id` argument (Linux 6.16).
const PR_TIMER_CREATE_RESTORE_IDS: u64 = 77;

/// POSIX timers with their ids (after the threads exist: a timer may target one),
/// then armed with what was left of their period.
fn push_timer_calls(calls: &mut Vec<Call>, data: &mut DataArea, timers: &[crate::image::PosixTimer]) {
    if timers.is_empty() {
        return;
    }
    calls.push(Call::new("prctl(PR_TIMER_CREATE_RESTORE_IDS, on)", libc::SYS_prctl, &[PR_TIMER_CREATE_RESTORE_IDS, 1, 0, 0, 0]));
    for t in timers {
        // struct sigevent: sigev_value, sigev_signo, sigev_notify, then _tid (64 bytes in all).
        let mut ev = Vec::with_capacity(64);
        ev.extend_from_slice(&t.sigval.to_le_bytes());
        ev.extend_from_slice(&t.signo.to_le_bytes());
        ev.extend_from_slice(&t.notify.to_le_bytes());
        ev.extend_from_slice(&t.tid.to_le_bytes());
        ev.resize(64, 0);
        let ev = data.push(&ev);
        let id = data.push(&(t.id as i64).to_le_bytes());
        calls.push(Call::new("timer_create", libc::SYS_timer_create, &[t.clockid as u64, ev, id]));
    }
    calls.push(Call::new("prctl(PR_TIMER_CREATE_RESTORE_IDS, off)", libc::SYS_prctl, &[PR_TIMER_CREATE_RESTORE_IDS, 0, 0, 0, 0]));
    for t in timers.iter().filter(|t| t.value != (0, 0)) {
        let its: Vec<u8> = [t.interval.0, t.interval.1, t.value.0, t.value.1].iter().flat_map(|w| w.to_le_bytes()).collect();
        let its = data.push(&its);
        calls.push(Call::new("timer_settime", libc::SYS_timer_settime, &[t.id as u64, 0, its, 0]));
    }
}

/// What each thread does last, itself: register its rseq area (its pages present),
/// drop to the image's credentials.
fn push_settle_calls(calls: &mut Vec<Call>, data: &mut DataArea, img: &ProcessImage, t: &ThreadState) {
    if let Some(r) = &t.rseq {
        calls.push(Call::new("rseq", libc::SYS_rseq, &[r.ptr, r.len as u64, 0, r.sig as u64]));
    }
    push_cred_calls(calls, data, img);
}

fn push_cred_calls(calls: &mut Vec<Call>, data: &mut DataArea, img: &ProcessImage) {
    let groups: Vec<u8> = img.creds.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
    let groups_addr = data.push(&groups);
    calls.push(Call::new("setgroups", libc::SYS_setgroups, &[img.creds.groups.len() as u64, groups_addr]));
    let [rg, eg, sg] = img.creds.gid;
    calls.push(Call::new("setresgid", libc::SYS_setresgid, &[rg as u64, eg as u64, sg as u64]));
    let [ru, eu, su] = img.creds.uid;
    calls.push(Call::new("setresuid", libc::SYS_setresuid, &[ru as u64, eu as u64, su as u64]));
}



const CLONE_THREAD_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM) as u64;
const SYS_CLONE3: i64 = 435;

/// The clone3 call (`name`) that makes a task of id `tid` in the sandbox (set_tid)
/// with `flags` and `exit_signal`, its struct clone_args placed in `data`.
fn clone3_call(name: &'static str, data: &mut DataArea, flags: u64, exit_signal: u64, tid: i32) -> Call {
    let set_tid = data.push(&tid.to_le_bytes());
    let mut args = Vec::with_capacity(88);
    // struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack,
    // stack_size, tls, set_tid, set_tid_size, cgroup.
    for v in [flags, 0, 0, 0, exit_signal, 0, 0, 0, set_tid, 1, 0] {
        args.extend_from_slice(&v.to_le_bytes());
    }
    Call::new(name, SYS_CLONE3, &[data.push(&args), 88])
}

/// Create the image's other threads with their exact tids (clone3 set_tid), each
/// auto-attached by ptrace and stopped before it runs a single instruction, then
/// give each its per-thread attributes.
fn create_threads(
    inj: &Injector<'_>,
    wmem: &ProcMem,
    region: u64,
    img: &ProcessImage,
    out: &mut Vec<Tracee>,
) -> Result<(), InjectError> {
    if img.threads.len() < 2 {
        return Ok(());
    }
    let pid = inj.tracee.pid.as_raw();
    inj.tracee.trace_clones().map_err(|source| InjectError::Ptrace { op: "SETOPTIONS(TRACECLONE)", pid, source })?;
    for t in &img.threads[1..] {
        let mut data = DataArea::new(region);
        let res = inj.run(&[clone3_call("clone3(thread)", &mut data, CLONE_THREAD_FLAGS, 0, t.tid)], &mut data)?;
        if res[0] != t.tid as i64 {
            return Err(InjectError::Syscall {
                pid,
                index: 0,
                name: "clone3(thread)",
                nr: SYS_CLONE3,
                err: io::Error::other(format!("got tid {} instead of {}", res[0], t.tid)),
            });
        }
        // clone3 returns the tid in the sandbox's namespace; find the host tid.
        let host_tid = procfs::tids(pid)
            .map_err(|source| InjectError::Memory { pid, addr: 0, source })?
            .into_iter()
            .find(|&x| x != pid && !out.iter().any(|o| o.pid.as_raw() == x))
            .ok_or_else(|| InjectError::UnexpectedStop { pid, rip: 0, signal: Some("the new thread is not in /proc".into()) })?;
        tracing::trace!(pid, tid = t.tid, host_tid, "thread created");
        let child = Tracee { pid: nix::unistd::Pid::from_raw(host_tid) };
        out.push(child);
        child.wait_stop().map_err(|source| InjectError::Ptrace { op: "wait(new thread)", pid: res[0] as i32, source })?;
        let ti = Injector::new(child, wmem, region)?;
        let mut data = DataArea::new(region);
        let mut calls = Vec::new();
        push_thread_calls(&mut calls, &mut data, t);
        ti.run(&calls, &mut data)?;
    }
    Ok(())
}

/// Fork from `inj`'s process a child of pid `ns` in the sandbox (an injected clone3
/// named `name`, with `flags`, SIGCHLD its exit signal), auto-attached by ptrace (the
/// caller set TRACEFORK), not yet waited for: its tracee (its host pid found among
/// the process's children).
fn fork_traced(inj: &Injector<'_>, region: u64, name: &'static str, flags: u64, ns: i32) -> Result<Tracee, InjectError> {
    let pid = inj.tracee.pid.as_raw();
    let children = || -> Vec<i32> {
        let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        list.split_whitespace().filter_map(|c| c.parse().ok()).collect()
    };
    let before = children();
    let mut data = DataArea::new(region);
    let res = inj.run(&[clone3_call(name, &mut data, flags, libc::SIGCHLD as u64, ns)], &mut data)?;
    let syscall_err = |what: String| InjectError::Syscall { pid, index: 0, name, nr: SYS_CLONE3, err: io::Error::other(what) };
    if res[0] != ns as i64 {
        return Err(syscall_err(format!("got pid {} instead of {ns}", res[0])));
    }
    let host = children().into_iter().find(|c| !before.contains(c)).ok_or_else(|| syscall_err("the new child is not in /proc".into()))?;
    Ok(Tracee { pid: nix::unistd::Pid::from_raw(host) })
}

/// clone3 flags of a zombie-to-be: a process sharing the leader's memory (nothing is
/// copied, no userfaultfd fork event) that exits at once.
const ZOMBIE_FLAGS: u64 = libc::CLONE_VM as u64;

/// Recreate the image's zombie children: for each, a child of the leader with its
/// exact pid (clone3 set_tid, SIGCHLD its exit signal, as fork gives), auto-attached
/// by ptrace and stopped before it runs, made to exit at once with its status and
/// reaped by us as its tracer, which hands it to the leader as a zombie. The SIGCHLD
/// that sends (kept pending: every signal of the leader is blocked meanwhile) is taken
/// back with rt_sigtimedwait; the image's own pending signals are queued later.
fn create_zombies(inj: &Injector<'_>, wmem: &ProcMem, region: u64, img: &ProcessImage) -> Result<(), InjectError> {
    if img.attrs.zombies.is_empty() {
        return Ok(());
    }
    let leader = inj.tracee;
    let pid = leader.pid.as_raw();
    let perr = |op| move |source| InjectError::Ptrace { op, pid, source };
    leader.trace_clones().map_err(perr("SETOPTIONS(TRACEFORK)"))?;
    let mask = leader.get_sigmask().map_err(perr("GETSIGMASK"))?;
    leader.set_sigmask(!0).map_err(perr("SETSIGMASK"))?;
    for z in &img.attrs.zombies {
        let child = fork_traced(inj, region, "clone3(zombie)", ZOMBIE_FLAGS, z.pid)?;
        let host = child.pid.as_raw();
        child.wait_stop().map_err(|source| InjectError::Ptrace { op: "wait(new child)", pid: host, source })?;
        Injector::new(child, wmem, region)?.run_exit((z.status >> 8) & 0xff)?;
        tracing::trace!(pid, zombie = z.pid, host, status = z.status, "zombie recreated");
    }
    let mut data = DataArea::new(region);
    let set = data.push(&(1u64 << (libc::SIGCHLD - 1)).to_le_bytes());
    let now = data.push(&[0u8; 16]);
    let got = inj.run(&[Call::new("rt_sigtimedwait(SIGCHLD)", libc::SYS_rt_sigtimedwait, &[set, 0, now, 8])], &mut data)?;
    if got[0] != libc::SIGCHLD as i64 {
        return Err(InjectError::Syscall { pid, index: 0, name: "rt_sigtimedwait(SIGCHLD)", nr: libc::SYS_rt_sigtimedwait, err: io::Error::other(format!("took signal {}", got[0])) });
    }
    leader.set_sigmask(mask).map_err(perr("SETSIGMASK"))
}

/// Debug aid (THAW_DEBUG_RESTORE=1): run the restored process under ptrace until its
/// first signal and print where it stopped.
fn debug_follow(tracee: &Tracee) {
    let pid = tracee.pid;
    loop {
        if tracee.cont().is_err() {
            return;
        }
        match tracee.wait_stop() {
            Ok(Some(sig)) => {
                let regs = tracee.get_regs().ok();
                let info = nix::sys::ptrace::getsiginfo(pid).ok();
                // SAFETY: si_addr is valid to read for SIGSEGV/SIGBUS siginfo.
                let addr = info.map(|i| unsafe { i.si_addr() } as u64);
                eprintln!("debug: pid {pid} stopped by {sig:?} rip={:#x} rsp={:#x} fault_addr={addr:#x?}", regs.map(|r| r.rip).unwrap_or(0), regs.map(|r| r.rsp).unwrap_or(0));
                if let Ok(m) = std::fs::read_to_string(format!("/proc/{pid}/maps")) {
                    eprintln!("{m}");
                }
                return;
            }
            Ok(None) => continue,
            Err(e) => {
                eprintln!("debug: {e}");
                return;
            }
        }
    }
}
