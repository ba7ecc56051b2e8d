//! Memory shared by the instances of one snapshot (layered snapshots, issue #11).
//!
//! A page the page server copies in with UFFDIO_COPY belongs to one instance: N
//! instances of a function hold N copies of every page they touch, even those none
//! of them ever writes. For a snapshot opened with sharing
//! (`LoadedSnapshot::open_with(dir, true)`), the process keeps a
//! **shared memory file**: a sparse tmpfs file (shmem, so userfaultfd minor faults
//! work on it) in which each image page lives at the offset of its address. Every
//! private memory area that holds image pages ([`shareable`]: not stacks, which must
//! be anonymous growsdown mappings) is restored as a private mapping of that file at
//! offset = its start, registered for missing *and* minor faults:
//!
//! * a stored page (base or diff) is written into the file the first time any
//!   instance needs it (verified, from the image, once per node) and mapped with
//!   UFFDIO_CONTINUE: read-only and shared until the instance writes it, when the
//!   kernel copies it (copy on write) into the instance's own memory;
//! * a zero page is UFFDIO_ZEROPAGE'd, as in an anonymous mapping;
//! * a page the process released (MADV_DONTNEED, munmap) would refill from the file:
//!   the page server sees the removal (UFFD_EVENT_REMOVE / UNMAP) and answers the next
//!   fault there with zeros, so anonymous-memory semantics hold exactly.
//!
//! The file is filled lazily by faults and working-set installs (a cold start reads
//! no more of the image than without sharing), is charged to the node (the writer),
//! not to the instances, and is unlinked when the snapshot is closed (instances still
//! running keep their mappings). Instances that track writes for in-place resets are
//! not shared (a reset works on anonymous memory). `THAW_SHARE_MEMORY=0` turns
//! sharing off.
//!
//! What a process can tell: /proc/PID/maps names the file for those areas, and
//! madvise advice that only anonymous memory accepts (MADV_FREE, MADV_WIPEONFORK)
//! fails there with EINVAL after the restore (glibc and CPython use neither; an area
//! that had MADV_WIPEONFORK at capture stays anonymous). That is why sharing is for
//! layered (Python) snapshots only so far.
//!
//! Why by hand: no crate maps a userfaultfd-served shmem file; this is the engine's
//! own page-serving policy on top of `sys/uffd.rs`.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing::{debug, warn};

use crate::image::{PageIndex, ProcessImage, VmaKind};
use crate::sys::PAGE_SIZE;

/// The tmpfs the shared memory files live in (mounted on first use if the directory
/// is not a tmpfs already). A sandbox of a shared restore sees its own snapshot's
/// file (only that one) read-only at the same path.
pub const DIR: &str = "/run/thaw/shared-mem";
/// Size of a shared memory file: the whole user address space (sparse).
const FILE_LEN: u64 = 1 << 47;

/// A shared memory file: one snapshot's, or one base's for all its diffs.
struct SharedFile {
    path: PathBuf,
    file: File,
    /// Image addresses whose page is in the file.
    filled: Mutex<HashSet<u64>>,
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A snapshot's shared memory: the file, and the image address ranges (whole VMAs,
/// sorted) restored as mappings of it.
pub struct SharedMemory {
    file: Arc<SharedFile>,
    ranges: Vec<(u64, u64)>,
    /// The file is its base's (`THAW_SHARE_MEMORY=base`): only the base's pages are
    /// put in it and mapped from it, for every diff on that base in this process; a
    /// diff's own pages are copied into each instance.
    base_only: bool,
}

/// Whether diffs share their base's file in this process by default (see
/// [`SharedMemory::base_only`]; `THAW_SHARE_MEMORY=base` or `=snapshot` overrides).
static BASE_FILE_DEFAULT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Make the base's file the default for this process's layered snapshots (`thaw
/// serve --shared-memory-file base`), or a file per snapshot.
pub fn use_base_files(on: bool) {
    BASE_FILE_DEFAULT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether restores map the base's file by default: `THAW_SHARE_MEMORY=base` or
/// `=snapshot`, else what [`use_base_files`] set (a file per snapshot if nothing).
pub fn base_files_default() -> bool {
    match std::env::var("THAW_SHARE_MEMORY").as_deref() {
        Ok("base") => true,
        Ok("snapshot") => false,
        _ => BASE_FILE_DEFAULT.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// The base files open in this process, by base id (see [`SharedMemory::create`]).
static BASE_FILES: Mutex<Vec<(String, std::sync::Weak<SharedFile>)>> = Mutex::new(Vec::new());

impl SharedMemory {
    /// A new, empty shared memory file for `image` (whose stored pages `index` lists),
    /// or `None` (logged) when sharing is off or the file cannot be made: restores
    /// then copy pages, as without sharing.
    /// `base_file`: the file of `image`'s base, for all its diffs in this process.
    pub fn create(image: &ProcessImage, index: &PageIndex, base_file: bool) -> Option<SharedMemory> {
        if std::env::var("THAW_SHARE_MEMORY").is_ok_and(|v| v == "0") {
            return None;
        }
        let base = image.base.as_ref().filter(|_| base_file);
        if base_file && base.is_none() {
            return None;
        }
        let file = match base {
            Some(b) => Self::base_file(&b.id),
            None => Self::try_create().map(Arc::new),
        };
        match file {
            Ok(file) => Some(SharedMemory { file, ranges: shareable(image, index), base_only: base.is_some() }),
            Err(e) => {
                warn!(error = %e, dir = DIR, "cannot make a shared memory file; instances get their own copies of every page");
                None
            }
        }
    }

    /// The file of base `id` in this process: the one its other diffs map, if any
    /// is still open, else a new one.
    fn base_file(id: &str) -> io::Result<Arc<SharedFile>> {
        let mut open = BASE_FILES.lock().expect("base files lock");
        open.retain(|(_, w)| w.strong_count() > 0);
        if let Some(f) = open.iter().find(|(k, _)| k == id).and_then(|(_, w)| w.upgrade()) {
            return Ok(f);
        }
        let f = Arc::new(Self::try_create()?);
        open.push((id.to_string(), Arc::downgrade(&f)));
        debug!(base = id, path = %f.path.display(), "a base's shared memory file, for all its diffs");
        Ok(f)
    }

    fn try_create() -> io::Result<SharedFile> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = Path::new(DIR);
        std::fs::create_dir_all(dir)?;
        let fs = nix::sys::statfs::statfs(dir)?;
        if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
            let flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC;
            nix::mount::mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some("mode=0755"))?;
        }
        sweep(dir);
        let path = dir.join(format!("{}-{}.mem", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        file.set_len(FILE_LEN)?;
        // Readable by the restore only (root, before it drops privileges): the restored
        // process keeps its mappings but cannot open the file again. Written only here.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400))?;
        debug!(path = %path.display(), "shared memory file created");
        Ok(SharedFile { path, file, filled: Mutex::default() })
    }

    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// Whether only the base's pages are in the file (see [`SharedMemory::base_only`]).
    pub fn base_only(&self) -> bool {
        self.base_only
    }

    /// The image address ranges restored as mappings of the file.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Whether image address `img` lies in a range mapped from the file.
    pub fn maps(&self, img: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 <= img);
        self.ranges.get(i).is_some_and(|r| r.0 <= img)
    }

    /// Whether the page of image address `img` is in the file.
    pub fn has(&self, img: u64) -> bool {
        self.file.filled.lock().expect("filled lock").contains(&img)
    }

    /// Read the page of image address `img` into `buf` (one page) if it is in the
    /// file; false if it is not.
    pub fn read_page(&self, img: u64, buf: &mut [u8]) -> io::Result<bool> {
        if !self.has(img) {
            return Ok(false);
        }
        self.file.file.read_exact_at(buf, img)?;
        Ok(true)
    }

    /// The file's inode, as /proc/PID/maps shows it beside a mapping of it.
    pub fn inode(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.file.metadata()?.ino())
    }

    /// Put `bytes` (whole, verified image pages of consecutive image addresses from
    /// `img`) into the file, skipping pages already there.
    pub fn fill(&self, img: u64, bytes: &[u8]) -> io::Result<()> {
        for (k, page) in bytes.chunks_exact(PAGE_SIZE as usize).enumerate() {
            let at = img + k as u64 * PAGE_SIZE;
            if self.has(at) {
                continue;
            }
            self.file.file.write_all_at(page, at)?;
            self.file.filled.lock().expect("filled lock").insert(at);
        }
        Ok(())
    }
}

/// Memory in use by the shared memory files of every process on the host (0 when
/// their tmpfs is not mounted yet).
pub fn resident_bytes() -> u64 {
    let dir = Path::new(DIR);
    let is_tmpfs = nix::sys::statfs::statfs(dir).is_ok_and(|f| f.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) if is_tmpfs => (s.blocks() - s.blocks_free()) * s.fragment_size(),
        _ => 0,
    }
}

/// Remove the files of processes that are gone (`<pid>-<n>.mem`).
fn sweep(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The image address ranges (whole VMAs) restored as mappings of the shared memory
/// file: private anonymous memory (not stacks: a growsdown mapping must be anonymous;
/// not MADV_WIPEONFORK memory, which must be too) and file mappings stored whole,
/// holding at least one stored page of `index`.
fn shareable(image: &ProcessImage, index: &PageIndex) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = image
        .vmas
        .iter()
        .filter(|v| matches!(v.kind, VmaKind::Anon { growsdown: false } | VmaKind::FileCopied { .. }))
        // MADV_WIPEONFORK is refused on anything but anonymous memory.
        .filter(|v| !v.advice.contains(&libc::MADV_WIPEONFORK))
        .filter(|v| {
            let i = index.runs.partition_point(|r| r.vaddr + r.npages * PAGE_SIZE <= v.start);
            index.runs.get(i).is_some_and(|r| r.vaddr < v.end)
        })
        .map(|v| (v.start, v.end))
        .collect();
    out.sort();
    out
}
