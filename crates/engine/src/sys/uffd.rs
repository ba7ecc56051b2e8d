//! userfaultfd: the API handshake, range registration, page installation
//! (COPY / ZEROPAGE / WAKE) and reading fault and non-cooperative events.
//!
//! The descriptor is created *inside* the restored process (it binds to the
//! caller's mm) and taken out with `pidfd_getfd`; every ioctl here operates on
//! the target's address space.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::last_err;

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xC020_AA04;
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xC018_AA06;
const UFFDIO_CONTINUE: libc::c_ulong = 0xC020_AA07;

pub const FEATURE_EVENT_FORK: u64 = 1 << 1;
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const FEATURE_MISSING_SHMEM: u64 = 1 << 5;
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// Minor faults on shmem mappings: the page is in the file's page cache but not
/// mapped; [`continue_`] maps it (read-only in a private mapping: a write copies it).
pub const FEATURE_MINOR_SHMEM: u64 = 1 << 10;
/// Write faults on write-protected pages are resolved by the kernel itself (the page
/// is unprotected and the write goes on); PAGEMAP_SCAN then reports it as written.
pub const FEATURE_WP_ASYNC: u64 = 1 << 15;
pub const REGISTER_MODE_MISSING: u64 = 1;
pub const REGISTER_MODE_WP: u64 = 2;
pub const REGISTER_MODE_MINOR: u64 = 4;
const COPY_MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;
const WRITEPROTECT_MODE_WP: u64 = 1;

pub const EVENT_PAGEFAULT: u8 = 0x12;
pub const EVENT_FORK: u8 = 0x13;
pub const EVENT_REMAP: u8 = 0x14;
pub const EVENT_REMOVE: u8 = 0x15;
pub const EVENT_UNMAP: u8 = 0x16;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
#[repr(C)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}
#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

// The kernel ABI sizes these ioctl numbers encode (see linux/userfaultfd.h).
const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioCopy>() == 40);
const _: () = assert!(std::mem::size_of::<UffdioZeropage>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioContinue>() == 32);
const _: () = assert!(std::mem::size_of::<RawMsg>() == 32);

/// `struct uffd_msg` as read from the descriptor.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawMsg {
    event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    arg: [u64; 3],
}

/// One decoded userfaultfd message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    PageFault { addr: u64, flags: u64 },
    Fork { ufd: i32 },
    Remap { from: u64, to: u64, len: u64 },
    Remove { start: u64, end: u64 },
    Unmap { start: u64, end: u64 },
    Unknown(u8),
}

/// Outcome of installing pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    Done,
    /// Someone else (or an earlier event) already populated the page.
    Exists,
    /// Only `copied` bytes were installed: the mm is changing (a non-cooperative
    /// event is pending) or the copy was cut short. Read events, then retry the rest.
    Again { copied: u64 },
    /// The range is no longer registered/mapped, or the process is exiting.
    Gone,
}

fn ioctl<T>(fd: BorrowedFd<'_>, req: libc::c_ulong, arg: &mut T) -> io::Result<()> {
    // SAFETY: every caller passes the repr(C) struct the request number encodes, and
    // `arg` is valid for reads and writes of that struct for the duration of the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg as *mut T) };
    if r < 0 {
        return Err(last_err());
    }
    Ok(())
}

/// Perform the UFFDIO_API handshake asking for `features`; returns the features granted.
pub fn api(fd: BorrowedFd<'_>, features: u64) -> io::Result<u64> {
    let mut a = UffdioApi { api: UFFD_API, features, ioctls: 0 };
    ioctl(fd, UFFDIO_API, &mut a)?;
    Ok(a.features)
}

/// Register `[start, start+len)` for missing-page faults.
pub fn register_missing(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut r = UffdioRegister { range: UffdioRange { start, len }, mode: REGISTER_MODE_MISSING, ioctls: 0 };
    ioctl(fd, UFFDIO_REGISTER, &mut r)
}

/// Register `[start, start+len)` with the given `REGISTER_MODE_*` bits. Registering
/// a range this descriptor already covers replaces its modes.
pub fn register(fd: BorrowedFd<'_>, start: u64, len: u64, mode: u64) -> io::Result<()> {
    let mut r = UffdioRegister { range: UffdioRange { start, len }, mode, ioctls: 0 };
    ioctl(fd, UFFDIO_REGISTER, &mut r)
}

/// Write-protect (`protect`) or unprotect `[start, start+len)` of a range
/// registered in write-protect mode. With WP-async, protecting is what re-arms the
/// written-page tracking that PAGEMAP_SCAN reports.
pub fn writeprotect(fd: BorrowedFd<'_>, start: u64, len: u64, protect: bool) -> io::Result<()> {
    let mut w = UffdioWriteprotect { range: UffdioRange { start, len }, mode: if protect { WRITEPROTECT_MODE_WP } else { 0 } };
    ioctl(fd, UFFDIO_WRITEPROTECT, &mut w)
}

/// Like [`copy`], but the installed pages are write-protected (faulting a page in is
/// not writing it; see `reset`). Needs a range registered in write-protect mode.
pub fn copy_wp(fd: BorrowedFd<'_>, dst: u64, src: *const u8, len: u64, wake: bool) -> io::Result<Install> {
    let mode = COPY_MODE_WP | if wake { 0 } else { COPY_MODE_DONTWAKE };
    let mut c = UffdioCopy { dst, src: src as u64, len, mode, copy: 0 };
    match ioctl(fd, UFFDIO_COPY, &mut c) {
        Ok(()) => Ok(Install::Done),
        Err(e) => classify(e, c.copy),
    }
}

fn classify(e: io::Error, copied: i64) -> io::Result<Install> {
    match e.raw_os_error() {
        Some(libc::EEXIST) => Ok(Install::Exists),
        Some(libc::EAGAIN) => Ok(Install::Again { copied: copied.max(0) as u64 }),
        Some(libc::ENOENT) | Some(libc::ESRCH) => Ok(Install::Gone),
        _ => Err(e),
    }
}

/// Copy `len` bytes from our address `src` into the target at `dst` (both page aligned).
pub fn copy(fd: BorrowedFd<'_>, dst: u64, src: *const u8, len: u64, wake: bool) -> io::Result<Install> {
    let mut c = UffdioCopy { dst, src: src as u64, len, mode: if wake { 0 } else { COPY_MODE_DONTWAKE }, copy: 0 };
    match ioctl(fd, UFFDIO_COPY, &mut c) {
        Ok(()) => Ok(Install::Done),
        Err(e) => classify(e, c.copy),
    }
}

/// Map the file's own pages at `[dst, dst+len)` of a shmem mapping registered for
/// minor faults (in a private mapping they are shared, read-only, until written).
pub fn continue_(fd: BorrowedFd<'_>, dst: u64, len: u64, wake: bool) -> io::Result<Install> {
    let mut c = UffdioContinue { range: UffdioRange { start: dst, len }, mode: if wake { 0 } else { COPY_MODE_DONTWAKE }, mapped: 0 };
    match ioctl(fd, UFFDIO_CONTINUE, &mut c) {
        Ok(()) => Ok(Install::Done),
        Err(e) => classify(e, c.mapped),
    }
}

/// Map zero pages at `[dst, dst+len)` in the target.
pub fn zeropage(fd: BorrowedFd<'_>, dst: u64, len: u64, wake: bool) -> io::Result<Install> {
    let mut z = UffdioZeropage { range: UffdioRange { start: dst, len }, mode: if wake { 0 } else { COPY_MODE_DONTWAKE }, zeropage: 0 };
    match ioctl(fd, UFFDIO_ZEROPAGE, &mut z) {
        Ok(()) => Ok(Install::Done),
        Err(e) => classify(e, z.zeropage),
    }
}

/// Whether the address space behind `fd` still exists. `probe` must be a page in
/// no range registered with `fd`: a live address space answers ENOENT there (nothing
/// to fill), one whose process has exited or exec'd ESRCH.
pub fn mm_alive(fd: BorrowedFd<'_>, probe: u64) -> bool {
    let mut z = UffdioZeropage { range: UffdioRange { start: probe, len: 4096 }, mode: COPY_MODE_DONTWAKE, zeropage: 0 };
    !matches!(ioctl(fd, UFFDIO_ZEROPAGE, &mut z), Err(e) if e.raw_os_error() == Some(libc::ESRCH))
}

/// Wake threads blocked on faults in `[start, start+len)`.
pub fn wake(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut r = UffdioRange { start, len };
    ioctl(fd, UFFDIO_WAKE, &mut r)
}

/// Read up to `max` pending messages (the descriptor is non-blocking). Fork
/// events carry a new descriptor, which the caller then owns.
pub fn read_events(fd: BorrowedFd<'_>, out: &mut Vec<Event>, max: usize) -> io::Result<()> {
    let mut buf = vec![RawMsg::default(); max.max(1)];
    let bytes = std::mem::size_of_val(buf.as_slice());
    // SAFETY: `buf` is a live array of repr(C) messages, `bytes` long; the kernel writes
    // whole messages into it.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), bytes) };
    if n < 0 {
        let e = last_err();
        if e.raw_os_error() == Some(libc::EAGAIN) {
            return Ok(());
        }
        return Err(e);
    }
    let count = n as usize / std::mem::size_of::<RawMsg>();
    for m in &buf[..count] {
        out.push(match m.event {
            EVENT_PAGEFAULT => Event::PageFault { flags: m.arg[0], addr: m.arg[1] },
            EVENT_FORK => Event::Fork { ufd: m.arg[0] as u32 as i32 },
            EVENT_REMAP => Event::Remap { from: m.arg[0], to: m.arg[1], len: m.arg[2] },
            EVENT_REMOVE => Event::Remove { start: m.arg[0], end: m.arg[1] },
            EVENT_UNMAP => Event::Unmap { start: m.arg[0], end: m.arg[1] },
            other => Event::Unknown(other),
        });
    }
    Ok(())
}

/// Take ownership of a raw descriptor handed to us by the kernel (fork events).
pub fn own_fd(raw: i32) -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: the kernel installed `raw` in our table for us (UFFD_EVENT_FORK) and
    // nothing else refers to it.
    unsafe { OwnedFd::from_raw_fd(raw) }
}
