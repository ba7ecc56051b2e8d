//! The mappings of memfds and deleted /tmp files ([`VmaKind::Unlinked`]): made once
//! the descriptors are restored (with the objects' contents and seals), from those
//! descriptors; the descriptors made only for them ([`FdKind::MapOnly`]) are closed
//! after. A private mapping's copy-on-written pages are written later with the file
//! mappings' (`file_cow_runs`).

use crate::image::{FdKind, ProcessImage, VmaKind};
use crate::inject::Call;

/// The calls that map the image's unlinked mappings and close its map-only
/// descriptors (none when it has neither).
pub(super) fn calls(img: &ProcessImage) -> Vec<Call> {
    let mut calls = Vec::new();
    for v in &img.vmas {
        let VmaKind::Unlinked { fd, offset, shared } = v.kind else { continue };
        let len = v.end - v.start;
        let flags = if shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } | libc::MAP_FIXED_NOREPLACE;
        calls.push(Call::new("mmap(unlinked)", libc::SYS_mmap, &[v.start, len, v.prot as u64, flags as u64, fd as u64, offset]));
        for &advice in &v.advice {
            calls.push(super::advice_call(v.start, len, advice));
        }
    }
    for r in img.fds.iter().filter(|r| matches!(r.kind, FdKind::MapOnly { .. })) {
        calls.push(Call::new("close(map-only fd)", libc::SYS_close, &[r.fd as u64]));
    }
    calls
}
