//! Another process's memory and descriptors: /proc/PID/mem access, pidfds,
//! pidfd_getfd, and read-only mappings of image files in our own address space.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::io::IoSlice;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use nix::sys::uio::{process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

use super::last_err;

/// `/proc/PID/mem` opened read-write: reads and writes ignore page protections
/// (FOLL_FORCE), which is what capture and CoW-page restore need.
pub struct ProcMem {
    file: File,
    pid: i32,
}

/// The kernel's limit of iovecs per call (IOV_MAX, UIO_MAXIOV): process_vm_writev's,
/// process_madvise's.
pub(crate) const IOV_MAX: usize = 1024;

impl ProcMem {
    pub fn open(pid: i32, write: bool) -> io::Result<ProcMem> {
        let file = std::fs::OpenOptions::new().read(true).write(write).open(format!("/proc/{pid}/mem"))?;
        Ok(ProcMem { file, pid })
    }

    /// Write runs of `bytes` into the process: each `(address, range of bytes)`. By
    /// process_vm_writev, up to IOV_MAX runs a call, where a /proc/PID/mem write takes
    /// one call per run and walks it page by page. A run it cannot write (a page of a
    /// read-only mapping: process_vm_writev does not force protections) goes through
    /// /proc/PID/mem, which does, and the rest continue.
    pub fn write_runs(&self, bytes: &[u8], runs: &[(u64, Range<usize>)]) -> io::Result<()> {
        let mut i = 0;
        while i < runs.len() {
            let batch = &runs[i..runs.len().min(i + IOV_MAX)];
            let local: Vec<IoSlice<'_>> = batch.iter().map(|(_, r)| IoSlice::new(&bytes[r.clone()])).collect();
            let remote: Vec<RemoteIoVec> = batch.iter().map(|(a, r)| RemoteIoVec { base: *a as usize, len: r.len() }).collect();
            // Whole runs are written, or a run in part where it stopped (the first it
            // could not write in full), which is then written again whole.
            let mut wrote = match process_vm_writev(Pid::from_raw(self.pid), &local, &remote) {
                Ok(n) => n,
                Err(nix::errno::Errno::EFAULT) => 0,
                Err(e) => return Err(e.into()),
            };
            for (a, r) in batch {
                i += 1;
                if wrote >= r.len() {
                    wrote -= r.len();
                    continue;
                }
                self.write_all_at(&bytes[r.clone()], *a)?;
                break;
            }
        }
        Ok(())
    }

    pub fn read_exact_at(&self, buf: &mut [u8], addr: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, addr)
    }

    pub fn write_all_at(&self, buf: &[u8], addr: u64) -> io::Result<()> {
        self.file.write_all_at(buf, addr)
    }
}

pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(last_err());
    }
    // SAFETY: the kernel returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Duplicate descriptor `target_fd` of the process behind `pidfd` into our table.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target_fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target_fd, 0) };
    if r < 0 {
        return Err(last_err());
    }
    // SAFETY: the kernel returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// SIGKILL the process behind `pidfd` (no pid reuse race).
pub fn pidfd_kill(pidfd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall; a null siginfo means "as kill(2) would send it".
    let r = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<u8>(), 0)
    };
    if r < 0 {
        return Err(last_err());
    }
    Ok(())
}

/// A read-only private mapping of a whole file in our address space; unmapped on drop.
pub struct Mapped {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is read-only and never mutated after creation, so sharing the
// pointer between threads cannot cause data races.
unsafe impl Send for Mapped {}
// SAFETY: as above, all access is read-only.
unsafe impl Sync for Mapped {}

impl Mapped {
    pub fn map(file: &File, len: usize) -> io::Result<Mapped> {
        if len == 0 {
            return Ok(Mapped { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0 });
        }
        // SAFETY: a fresh shared-nothing read-only mapping chosen by the kernel; it does
        // not alias any Rust object. The fd is valid for the duration of the call.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(last_err());
        }
        Ok(Mapped { ptr: p.cast(), len })
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len, "slice {off}+{len} outside mapping of {}", self.len);
        // SAFETY: the range was bounds-checked above against a live read-only mapping
        // that lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: ptr/len describe exactly the mapping created in `map`, and no
            // borrow of it can outlive `self`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// Drop a file's pages from the page cache (benchmarks: make a cold cache).
pub fn fadvise_dontneed(file: &File) {
    // SAFETY: advisory call on a valid descriptor; no memory is touched.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// Start reading `[off, off+len)` of a file into the page cache in the background.
pub fn fadvise_willneed(file: &File, off: u64, len: u64) {
    // SAFETY: advisory call on a valid descriptor; no memory is touched.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), off as i64, len as i64, libc::POSIX_FADV_WILLNEED) };
}

#[cfg(test)]
mod tests {
    use super::ProcMem;

    #[test]
    fn runs_are_written_and_a_read_only_one_through_proc_mem() {
        let page = 4096usize;
        // SAFETY: a new private anonymous mapping of 4 pages, owned by this test and
        // unmapped at its end; nothing else refers to it.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4 * page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let base = p as u64;
        // SAFETY: the second page of the mapping above becomes read-only.
        assert_eq!(unsafe { libc::mprotect((base + page as u64) as *mut libc::c_void, page, libc::PROT_READ) }, 0);
        let mem = ProcMem::open(std::process::id() as i32, true).unwrap();
        // Three runs: page 0 and half of page 1 (read-only: process_vm_writev stops
        // there), page 2, page 3.
        let bytes: Vec<u8> = (0..3 * page + page / 2).map(|i| (i % 251) as u8).collect();
        let runs = [(base, 0..page + page / 2), (base + 2 * page as u64, page + page / 2..2 * page + page / 2), (base + 3 * page as u64, 2 * page + page / 2..3 * page + page / 2)];
        mem.write_runs(&bytes, &runs).unwrap();
        // SAFETY: the mapping is 4 live, readable pages.
        let got = unsafe { std::slice::from_raw_parts(p as *const u8, 4 * page) };
        assert_eq!(&got[..page + page / 2], &bytes[..page + page / 2]);
        assert!(got[page + page / 2..2 * page].iter().all(|&b| b == 0), "past the run: untouched");
        assert_eq!(&got[2 * page..4 * page], &bytes[page + page / 2..]);
        // SAFETY: unmapping the mapping made above; `got` is not used after this.
        unsafe { libc::munmap(p, 4 * page) };
    }
}
