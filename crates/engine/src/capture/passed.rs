//! Descriptors in flight: sent over a socketpair (SCM_RIGHTS) and not yet received
//! at the snapshot. Draining the queued messages (`drain_socket`) receives them into
//! the captured process, which is never resumed; each is recorded as what it is
//! ([`FdKind::InFlight`], at a number the process does not use) and sent again with
//! its message at restore. Only descriptors reopened by path are carried so (files,
//! devices, directories); any other kind, or other ancillary data, is refused by name.

use crate::image::{FdKind, FdRecord};
use crate::procfs;

/// The descriptors an SCM_RIGHTS control buffer `ctl` (as recvmsg filled it) passed;
/// Err names ancillary data that is not descriptors.
pub(super) fn rights(ctl: &[u8]) -> Result<Vec<i32>, &'static str> {
    const HDR: usize = 16; // struct cmsghdr: len (u64), level, type (i32)
    let mut fds = Vec::new();
    let mut at = 0;
    while at + HDR <= ctl.len() {
        let len = u64::from_le_bytes(ctl[at..at + 8].try_into().expect("8 bytes")) as usize;
        let level = i32::from_le_bytes(ctl[at + 8..at + 12].try_into().expect("4 bytes"));
        let kind = i32::from_le_bytes(ctl[at + 12..at + 16].try_into().expect("4 bytes"));
        if len < HDR || at + len > ctl.len() {
            return Err("a queued message carries ancillary data thaw cannot read");
        }
        if (level, kind) != (libc::SOL_SOCKET, libc::SCM_RIGHTS) {
            return Err("a queued message carries ancillary data other than descriptors (credentials)");
        }
        fds.extend(ctl[at + HDR..at + len].chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes"))));
        at += len.div_ceil(8) * 8;
    }
    Ok(fds)
}

/// Record the descriptors the messages `m` queued on socketpair end `via` passed (now
/// received into `pid` at the numbers each message lists): one [`FdKind::InFlight`]
/// per open file description (kcmp), at a number `fds` does not use. Err says what
/// cannot be carried: a descriptor that is not a file reopened by path, or one whose
/// open file the process also holds (a restore would make it a second one).
pub(super) fn record(pid: i32, via: i32, m: &[(Vec<u8>, Vec<i32>)], fds: &mut Vec<FdRecord>) -> Result<(), String> {
    let same = |a: i32, b: i32| crate::sys::kcmp::same_file(pid, a, b).map_err(|e| format!("not comparable (kcmp): {e}"));
    // (a received number of the description, its record's number)
    let mut seen: Vec<(i32, i32)> = Vec::new();
    for (i, (_, rights)) in m.iter().enumerate() {
        for (k, &n) in rights.iter().enumerate() {
            let send = (via, i as u32, k as u32);
            let mut known = None;
            for &(other, record) in &seen {
                if same(other, n)? {
                    known = Some(record);
                    break;
                }
            }
            if let Some(record) = known {
                if let Some(FdRecord { kind: FdKind::InFlight { sends, .. }, .. }) = fds.iter_mut().find(|r| r.fd == record) {
                    sends.push(send);
                }
                continue;
            }
            let object = kind(pid, n)?;
            for r in fds.iter().filter(|r| !matches!(r.kind, FdKind::Null | FdKind::Log | FdKind::Control | FdKind::MapOnly { .. } | FdKind::InFlight { .. })) {
                if same(r.fd, n)? {
                    return Err(format!("also held by the process as descriptor {} (a restore would make them two open files)", r.fd));
                }
            }
            let number = super::unused_number(fds);
            fds.push(FdRecord { fd: number, kind: FdKind::InFlight { sends: vec![send], object: Box::new(object) } });
            seen.push((n, number));
        }
    }
    Ok(())
}

/// What descriptor `fd` of `pid` (one just received out of a queued message) is, if
/// it is one a restore reopens by path; Err says what it is instead.
pub(super) fn kind(pid: i32, fd: i32) -> Result<FdKind, String> {
    let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).map_err(|e| format!("descriptor {fd}: {e}"))?;
    let target = target.to_string_lossy().into_owned();
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).map_err(|e| format!("descriptor {fd}: {e}"))?;
    let (pos, flags) = procfs::parse_fdinfo(&info);
    let flags = flags as i32;
    if !target.starts_with('/') || target.ends_with(" (deleted)") {
        return Err(format!("{target}, which thaw passes again only if it is a file reopened by path"));
    }
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).map_err(|e| format!("{target}: {e}"))?;
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    if !(ft.is_file() || ft.is_char_device() || ft.is_dir()) {
        return Err(format!("{target}, neither a regular file, a device nor a directory"));
    }
    if flags & libc::O_ACCMODE != libc::O_RDONLY && !crate::tmpfs::holds(&target) {
        return Err(format!("{target}, open for writing outside /tmp and /dev/shm"));
    }
    if info.lines().any(|l| l.starts_with("lock:")) {
        return Err(format!("{target}, with a file lock"));
    }
    Ok(FdKind::Path { path: target, flags, pos })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, kind: i32, fds: &[i32]) -> Vec<u8> {
        let len = 16 + 4 * fds.len();
        let mut b = (len as u64).to_le_bytes().to_vec();
        b.extend_from_slice(&level.to_le_bytes());
        b.extend_from_slice(&kind.to_le_bytes());
        for fd in fds {
            b.extend_from_slice(&fd.to_le_bytes());
        }
        b.resize(len.div_ceil(8) * 8, 0);
        b
    }

    #[test]
    fn rights_are_read_and_other_ancillary_data_refused() {
        let mut two = cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &[7]);
        two.extend(cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &[8, 9]));
        assert_eq!(rights(&two), Ok(vec![7, 8, 9]));
        assert!(rights(&cmsg(libc::SOL_SOCKET, libc::SCM_CREDENTIALS, &[1, 2, 3])).unwrap_err().contains("credentials"));
        let mut bad = cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, &[7]);
        bad[0] = 200;
        assert!(rights(&bad).is_err(), "a length past the buffer");
    }
}
