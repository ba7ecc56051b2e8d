//! PAGEMAP_SCAN (Linux 6.7+) on another process's `/proc/PID/pagemap`: which
//! pages of a range registered for userfaultfd WP-async have been written since
//! they were last write-protected, and single pagemap entries (present/swapped).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use super::last_err;

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
/// Reported for a page not write-protected (WP-async: written since protected).
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// Mapped from a file (or shared anonymous memory): for a page of a private file
/// mapping, clear once the process wrote it (its page is then an anonymous copy).
const PAGE_IS_FILE: u64 = 1 << 2;
/// In memory.
const PAGE_IS_PRESENT: u64 = 1 << 3;
/// Fail (EPERM) if part of the range is not registered for WP-async.
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}
const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}
const _: () = assert!(std::mem::size_of::<PageRegion>() == 24);

/// A process's pagemap, opened once.
pub struct Pagemap {
    file: File,
}

impl Pagemap {
    pub fn open(pid: i32) -> io::Result<Pagemap> {
        Ok(Pagemap { file: File::open(format!("/proc/{pid}/pagemap"))? })
    }

    /// Append to `out` the runs of `[start, end)` reported written (`PAGE_IS_WRITTEN`
    /// alone: the kernel's exact fast path). Fails with EPERM if some of the range
    /// is not registered for WP-async (its registration was lost: unmapped and
    /// mapped again).
    pub fn written(&self, start: u64, end: u64, out: &mut Vec<(u64, u64)>) -> io::Result<()> {
        self.scan(start, end, PM_SCAN_CHECK_WPASYNC, (PAGE_IS_WRITTEN, 0), out)
    }

    /// Append to `out` the runs of `[start, end)` whose pages are present and
    /// anonymous: in a private file mapping, the pages the process copied on writing.
    pub fn copied(&self, start: u64, end: u64, out: &mut Vec<(u64, u64)>) -> io::Result<()> {
        self.scan(start, end, 0, (PAGE_IS_PRESENT | PAGE_IS_FILE, PAGE_IS_FILE), out)
    }

    /// PAGEMAP_SCAN over `[start, end)`: runs of the pages whose categories, with the
    /// `inverted` ones flipped, all have `mask`'s.
    fn scan(&self, start: u64, end: u64, flags: u64, (mask, inverted): (u64, u64), out: &mut Vec<(u64, u64)>) -> io::Result<()> {
        let mut vec = vec![PageRegion::default(); 256];
        let mut at = start;
        while at < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags,
                start: at,
                end,
                vec: vec.as_mut_ptr() as u64,
                vec_len: vec.len() as u64,
                category_inverted: inverted,
                category_mask: mask,
                return_mask: mask,
                ..Default::default()
            };
            // SAFETY: `arg` is the repr(C) struct PAGEMAP_SCAN encodes; `vec` points at
            // `vec_len` live PageRegion entries that the kernel fills and that outlive the call.
            let n = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN, &mut arg as *mut PmScanArg) };
            if n < 0 {
                return Err(last_err());
            }
            for r in &vec[..n as usize] {
                match out.last_mut() {
                    Some(last) if last.1 == r.start => last.1 = r.end,
                    _ => out.push((r.start, r.end)),
                }
            }
            if arg.walk_end <= at {
                return Err(io::Error::other(format!("PAGEMAP_SCAN made no progress at {at:#x}")));
            }
            at = arg.walk_end;
        }
        Ok(())
    }

    /// Whether each page of `[start, start + n pages)` is present or swapped (has contents).
    pub fn populated(&self, start: u64, n: usize) -> io::Result<Vec<bool>> {
        self.entries(start, n, 3 << 62)
    }

    /// Whether each page of `[start, start + n pages)` is present in memory. Unlike
    /// [`Pagemap::populated`], a page that was never touched but carries a
    /// write-protect marker (it reads as "swapped") is not.
    pub fn present(&self, start: u64, n: usize) -> io::Result<Vec<bool>> {
        self.entries(start, n, 1 << 63)
    }

    fn entries(&self, start: u64, n: usize, bits: u64) -> io::Result<Vec<bool>> {
        let mut raw = vec![0u8; n * 8];
        self.file.read_exact_at(&mut raw, start / super::PAGE_SIZE * 8)?;
        Ok(raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) & bits != 0).collect())
    }
}
