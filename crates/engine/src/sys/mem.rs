//! Another process's memory and descriptors: /proc/PID/mem access, pidfds,
//! pidfd_getfd, and read-only mappings of image files in our own address space.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use super::last_err;

/// `/proc/PID/mem` opened read-write: reads and writes ignore page protections
/// (FOLL_FORCE), which is what capture and CoW-page restore need.
pub struct ProcMem {
    file: File,
}

impl ProcMem {
    pub fn open(pid: i32, write: bool) -> io::Result<ProcMem> {
        let file = std::fs::OpenOptions::new().read(true).write(write).open(format!("/proc/{pid}/mem"))?;
        Ok(ProcMem { file })
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
