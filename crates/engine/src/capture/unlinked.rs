//! Mappings of objects no path reaches: a memfd (memfd_create), or a file of the
//! instance's own /tmp or /dev/shm deleted since it was mapped. Each is mapped again
//! from a descriptor once the descriptors are restored ([`VmaKind::Unlinked`]): one
//! the process holds of the same object (its `MemFd` or `DeletedTmp` record carries
//! the contents), or, where it holds none, one made for its mappings and closed after
//! them ([`FdKind::MapOnly`], its contents read through /proc/PID/map_files).

use std::os::unix::fs::MetadataExt;

use super::fds::{read_file, MEMFD_MAX};
use super::CaptureError;
use crate::image::{FdKind, FdRecord, VmaKind};
use crate::procfs::MapEntry;

/// The seals that forbid writing through a shared mapping made after them.
const WRITE_SEALS: u32 = (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) as u32;

/// Whether `m` maps a memfd or a deleted file of the instance's own /tmp or /dev/shm.
pub(super) fn is_unlinked(m: &MapEntry) -> bool {
    let Some(target) = m.name.strip_suffix(" (deleted)") else { return false };
    m.is_file() && (target.starts_with("/memfd:") || crate::tmpfs::holds(target))
}

/// Finds (or makes) the descriptor each unlinked mapping is restored from.
pub(super) struct Unlinked {
    pid: i32,
    /// (device, inode) of each `MemFd`/`DeletedTmp` descriptor, with its number.
    held: Vec<((u64, u64), i32)>,
}

impl Unlinked {
    pub(super) fn new(pid: i32, fds: &[FdRecord]) -> Result<Self, CaptureError> {
        let mut held = Vec::new();
        for r in fds.iter().filter(|r| matches!(r.kind, FdKind::MemFd { .. } | FdKind::DeletedTmp { .. })) {
            let meta = std::fs::metadata(format!("/proc/{pid}/fd/{}", r.fd))
                .map_err(|source| CaptureError::Io { pid, what: format!("stat of descriptor {}", r.fd), source })?;
            held.push(((meta.dev(), meta.ino()), r.fd));
        }
        Ok(Self { pid, held })
    }

    /// The kind of mapping `m` (for which [`is_unlinked`] holds); a mapped object the
    /// process holds no descriptor of is added to `fds` as a [`FdKind::MapOnly`].
    pub(super) fn kind(&mut self, m: &MapEntry, fds: &mut Vec<FdRecord>) -> Result<VmaKind, CaptureError> {
        let pid = self.pid;
        let refuse = |reason: String| CaptureError::Refused { pid, reason };
        let range = format!("{:x}-{:x}", m.start, m.end);
        let key = (dev_of(&m.dev).ok_or_else(|| refuse(format!("its mapping {range} of {} has an unreadable device {}", m.name, m.dev)))?, m.inode);
        let fd = match self.held.iter().find(|h| h.0 == key) {
            Some(&(_, fd)) => fd,
            None => {
                let fd = super::unused_number(fds);
                let object = self.read_object(m, &range)?;
                fds.push(FdRecord { fd, kind: FdKind::MapOnly { object: Box::new(object) } });
                self.held.push((key, fd));
                fd
            }
        };
        let record = fds.iter().find(|r| r.fd == fd).expect("recorded above");
        let (flags, seals) = match &record.kind {
            FdKind::MemFd { flags, seals, .. } => (*flags, *seals),
            FdKind::DeletedTmp { flags, .. } => (*flags, 0),
            FdKind::MapOnly { object } => match object.as_ref() {
                FdKind::MemFd { flags, seals, .. } => (*flags, *seals),
                FdKind::DeletedTmp { flags, .. } => (*flags, 0),
                _ => unreachable!("a MapOnly holds a memfd or a deleted file"),
            },
            _ => unreachable!("held are memfds and deleted files"),
        };
        if m.shared && m.write {
            if flags & libc::O_ACCMODE != libc::O_RDWR {
                return Err(refuse(format!(
                    "it has a writable shared mapping {range} of {} whose descriptor {fd} is not open for reading and writing; it cannot be mapped again from it",
                    m.name
                )));
            }
            if seals & WRITE_SEALS != 0 {
                return Err(refuse(format!("it has a writable shared mapping {range} of {}, sealed against writes since ({seals:#x})", m.name)));
            }
        }
        Ok(VmaKind::Unlinked { fd, offset: m.offset, shared: m.shared })
    }

    /// The object behind mapping `m`, read whole through /proc/PID/map_files.
    fn read_object(&self, m: &MapEntry, range: &str) -> Result<FdKind, CaptureError> {
        let pid = self.pid;
        let refuse = |reason: String| CaptureError::Refused { pid, reason };
        let path = format!("/proc/{pid}/map_files/{range}");
        let (content, seals, mode) = read_file(&path).map_err(|e| match e {
            Some(source) => CaptureError::Io { pid, what: format!("reading the object mapped at {range} ({})", m.name), source },
            None => refuse(format!("it maps {} ({range}), larger than {} MiB; the engine carries such objects up to that size", m.name, MEMFD_MAX >> 20)),
        })?;
        let flags = libc::O_RDWR | libc::O_CLOEXEC;
        let target = m.name.strip_suffix(" (deleted)").expect("is_unlinked");
        if let Some(name) = target.strip_prefix("/memfd:") {
            return Ok(FdKind::MemFd { name: name.to_string(), content, seals, flags, pos: 0 });
        }
        // A deleted file of the instance's /tmp: made again at its path, which must be free.
        if std::fs::symlink_metadata(format!("/proc/{pid}/root{target}")).is_ok() {
            return Err(refuse(format!("it maps a deleted file ({}) whose path was taken again; it cannot be made again there", m.name)));
        }
        let meta = std::fs::metadata(&path).map_err(|source| CaptureError::Io { pid, what: format!("stat of the file mapped at {range}"), source })?;
        if !meta.file_type().is_file() || meta.nlink() != 0 {
            return Err(refuse(format!("it maps {} ({range}), a deleted file that is not a regular file, or still linked elsewhere", m.name)));
        }
        Ok(FdKind::DeletedTmp { path: target.to_string(), content, mode, flags, pos: 0 })
    }
}

/// A device as /proc/PID/maps prints it ("major:minor", hex), as `st_dev`.
fn dev_of(s: &str) -> Option<u64> {
    let (major, minor) = s.split_once(':')?;
    Some(libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_read_as_stat_gives_them() {
        assert_eq!(dev_of("00:01"), Some(libc::makedev(0, 1)));
        assert_eq!(dev_of("fd:1a"), Some(libc::makedev(0xfd, 0x1a)));
        assert_eq!(dev_of("0001"), None);
        assert_eq!(dev_of("zz:01"), None);
    }
}
