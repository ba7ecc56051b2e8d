//! The process's descriptors as a restore makes them again ([`capture_fds`]): each
//! described by what it is ([`describe`]: a file or device by path, a pipe or
//! socketpair end — its other end the process's, in flight to it, or closed —, an
//! eventfd, timerfd, signalfd, epoll set, inotify instance, memfd, deleted /tmp
//! file, pidfd of the process), a dup by the descriptor it shares an open file
//! with (kcmp), and anything else refused by name.

use super::{inotify, passed, CaptureError};
use crate::image::{FdKind, FdRecord};
use crate::{procfs, sockdiag};

/// The socket with inode `ino` as one end of a socketpair whose other end the
/// process holds too, or that is closed: (peer inode, 0 if closed; the socket). Err(Some(why)) for a unix socket
/// that is not one; Err(None) for a socket that is not unix at all.
fn socketpair_end(unix: &std::collections::HashMap<u32, sockdiag::UnixSock>, list: &[procfs::FdInfo], ino: u32) -> Result<(u32, sockdiag::UnixSock), Option<String>> {
    let s = *unix.get(&ino).ok_or(None)?;
    if s.named {
        return Err(Some("bound to a name (a server or client endpoint)".into()));
    }
    if ![libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_SEQPACKET].contains(&(s.sock_type as i32)) {
        return Err(Some(format!("of type {}", s.sock_type)));
    }
    if s.state != 1 {
        return Err(Some("that is not connected".into()));
    }
    // Connected, and its peer closed (peer inode 0): made by the restore and closed.
    if s.peer == 0 {
        return Ok((0, s));
    }
    let peer = format!("socket:[{}]", s.peer);
    if !list.iter().any(|g| g.target == peer) {
        return Err(Some(format!("whose peer ({peer}) is outside the process")));
    }
    Ok((s.peer, s))
}

/// The largest memfd or deleted /tmp file carried across a snapshot (its contents go
/// into state.bin).
pub(super) const MEMFD_MAX: u64 = 16 << 20;

/// The contents, seals (0 where a file has none) and mode of the file behind
/// descriptor `fd` of `pid`, read through /proc/PID/fd/FD (a second open file
/// description: the process's offset is not moved). Err(None): larger than
/// [`MEMFD_MAX`].
fn read_fd_file(pid: i32, fd: i32) -> Result<(Vec<u8>, u32, u32), Option<std::io::Error>> {
    read_file(&format!("/proc/{pid}/fd/{fd}"))
}

/// [`read_fd_file`] of any path (/proc/PID/map_files/... for an object only mapped).
pub(super) fn read_file(path: &str) -> Result<(Vec<u8>, u32, u32), Option<std::io::Error>> {
    use std::os::unix::fs::PermissionsExt;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).map_err(Some)?;
    let meta = f.metadata().map_err(Some)?;
    if meta.len() > MEMFD_MAX {
        return Err(None);
    }
    let mut content = Vec::new();
    (&f).take(MEMFD_MAX + 1).read_to_end(&mut content).map_err(Some)?;
    if content.len() as u64 > MEMFD_MAX {
        return Err(None);
    }
    // EINVAL: a file system without seals (a /tmp file).
    let seals = nix::fcntl::fcntl(f.as_raw_fd(), nix::fcntl::FcntlArg::F_GET_SEALS).unwrap_or(0);
    Ok((content, seals as u32, meta.permissions().mode() & 0o7777))
}

/// The process's descriptors (`list`, as procfs::fds read them), each as what a
/// restore makes again. `received`: those
/// just received out of queued messages (in flight at the snapshot), described
/// after the process's own (so that one it also holds is a [`FdKind::Dup`] of its
/// own number) and named as passed in a refusal.
pub(super) fn capture_fds(pid: i32, mut list: Vec<procfs::FdInfo>, received: &[passed::Received]) -> Result<Vec<FdRecord>, CaptureError> {
    let refuse = |reason: String| CaptureError::Refused { pid, reason };
    let late = |fd: i32| received.iter().position(|r| r.fd == fd);
    list.sort_by_key(|f| (late(f.fd), f.fd));
    let mut out = Vec::new();
    // The unix sockets of the process's network namespace, read once if it has sockets.
    let mut unix: Option<std::collections::HashMap<u32, sockdiag::UnixSock>> = None;
    for f in &list {
        let (fd, t, flags) = (f.fd, f.target.as_str(), f.flags as i32);
        if fd as u64 == crate::conventions::UFFD_KEEP_FD && t == "anon_inode:[userfaultfd]" {
            // A restored process (a base restored for a diff): the restore's own
            // userfaultfd, which every restore makes again.
            continue;
        }
        if fd as u64 == crate::conventions::UFFD_KEEP_FD {
            return Err(refuse(format!("descriptor {fd} has the number the engine keeps a restored process's userfaultfd at; the engine reserves it")));
        }
        // A dup of a descriptor already recorded shares its open file description
        // (one offset): recorded as such, restored with dup3 (kcmp(KCMP_FILE) decides).
        let mut dup_of = None;
        for r in out.iter().filter(|r: &&FdRecord| !matches!(r.kind, FdKind::Null | FdKind::Log | FdKind::Control | FdKind::Dup { .. })) {
            if list.iter().any(|g| g.fd == r.fd && g.target == f.target)
                && crate::sys::kcmp::same_file(pid, r.fd, fd).map_err(|source| CaptureError::Io {
                    pid,
                    what: format!("comparing descriptors {} and {fd} (kcmp)", r.fd),
                    source,
                })?
            {
                dup_of = Some(r.fd);
                break;
            }
        }
        if let Some(of) = dup_of {
            out.push(FdRecord { fd, kind: FdKind::Dup { of, flags } });
            continue;
        }
        let kind = match describe(pid, f, &list, &mut unix) {
            Err(CaptureError::Refused { pid, reason }) if late(fd).is_some() => {
                let via = received[late(fd).expect("checked")].send.0;
                return Err(CaptureError::Refused {
                    pid,
                    reason: format!("descriptor {via} is a unix socketpair end with a descriptor in flight (SCM_RIGHTS): {reason}"),
                });
            }
            other => other?,
        };
        out.push(FdRecord { fd, kind });
    }
    // Epoll registrations must point at descriptors we recreate.
    for r in &out {
        if let FdKind::Epoll { items, .. } = &r.kind {
            for (tfd, _, _) in items {
                if !out.iter().any(|x| x.fd == *tfd) {
                    return Err(refuse(format!("epoll descriptor {} watches descriptor {tfd}, which is closed or was replaced", r.fd)));
                }
            }
        }
    }
    Ok(out)
}

/// What descriptor `f` of `pid` is, as a restore makes it again (`list`: all of the
/// process's descriptors, for the other end of a pipe or socketpair); a refusal
/// names why it cannot be.
fn describe(
    pid: i32,
    f: &procfs::FdInfo,
    list: &[procfs::FdInfo],
    unix: &mut Option<std::collections::HashMap<u32, sockdiag::UnixSock>>,
) -> Result<FdKind, CaptureError> {
    let refuse = |reason: String| CaptureError::Refused { pid, reason };
    let pipe_ino = |t: &str| t.strip_prefix("pipe:[").and_then(|x| x.strip_suffix(']')).and_then(|x| x.parse::<u64>().ok());
    let (fd, t, flags) = (f.fd, f.target.as_str(), f.flags as i32);
    Ok(match (fd, t) {
        (0, "/dev/null") => FdKind::Null,
        (1 | 2, t) if t.starts_with("pipe:") && flags & libc::O_ACCMODE == libc::O_WRONLY && is_log_pipe(list, t) => FdKind::Log,
        (3, t) if t.starts_with("socket:") => FdKind::Control,
        (_, t) if t.starts_with("socket:") => {
            let ino = sockdiag::inode_of(t).unwrap_or(0);
            if unix.is_none() {
                *unix = Some(sockdiag::unix_sockets(pid).map_err(|source| CaptureError::Io { pid, what: "listing unix sockets (sock_diag)".into(), source })?);
            }
            match socketpair_end(unix.as_ref().expect("set above"), list, ino) {
                Ok((peer, s)) => FdKind::SocketPair {
                    // A pair of its own where the peer is closed.
                    pair: u64::from(if peer == 0 { ino } else { ino.min(peer) }),
                    first: peer == 0 || ino < peer,
                    sock_type: s.sock_type as i32,
                    flags,
                    shutdown: s.shutdown,
                    queued: Vec::new(),
                    // Read by injection with the other state only the process reports.
                    options: Vec::new(),
                },
                Err(Some(why)) => return Err(refuse(format!("descriptor {fd} is a unix socket {why}; only socketpairs whose both ends the process holds are carried across a snapshot"))),
                Err(None) => {
                    let what = procfs::describe_socket(pid, u64::from(ino)).unwrap_or_else(|| format!("socket {t}"));
                    return Err(refuse(format!(
                        "descriptor {fd} is an open {what}; network connections cannot be carried across a snapshot \
                         (open them in the handler, not at import time)"
                    )));
                }
            }
        }
        (_, t) if t.starts_with("pipe:") => {
            let ino = pipe_ino(t).unwrap_or(0);
            let ends = list.iter().filter(|g| g.target == t).count();
            let write = flags & libc::O_ACCMODE == libc::O_WRONLY;
            // The other end is the process's (or in flight to it), or closed: the
            // restore makes it and closes it (after putting the buffered bytes in).
            // Held by another process, it cannot be carried.
            if !list.iter().any(|g| g.target == t && (g.flags as i32 & libc::O_ACCMODE == libc::O_WRONLY) != write) && !other_end_closed(pid, fd, write) {
                return Err(refuse(format!(
                    "descriptor {fd} is one end of a pipe ({t}, {ends} descriptor(s)) whose other end is open outside the process"
                )));
            }
            // Its capacity is read by injection with the other state only the process reports.
            FdKind::Pipe { pipe: ino, write, flags, buffered: Vec::new(), size: 0 }
        }
        (_, "anon_inode:[eventfd]") => FdKind::EventFd {
            count: procfs::fdinfo_field(&f.info, "eventfd-count").and_then(|v| v.parse().ok()).unwrap_or(0),
            semaphore: procfs::fdinfo_field(&f.info, "eventfd-semaphore").as_deref() == Some("1"),
            flags,
        },
        (_, "anon_inode:[timerfd]") => {
            let pair = |k: &str| -> Option<(i64, i64)> {
                let v = procfs::fdinfo_field(&f.info, k)?;
                let (a, b) = v.trim_matches(|c| c == '(' || c == ')').split_once(',')?;
                Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
            };
            match (procfs::fdinfo_field(&f.info, "clockid").and_then(|v| v.parse().ok()), pair("it_value"), pair("it_interval")) {
                (Some(clockid), Some(value), Some(interval)) => FdKind::TimerFd {
                    clockid,
                    flags,
                    ticks: procfs::fdinfo_field(&f.info, "ticks").and_then(|v| v.parse().ok()).unwrap_or(0),
                    value,
                    interval,
                },
                _ => return Err(refuse(format!("descriptor {fd} is a timerfd whose settings cannot be read: {}", f.info.trim()))),
            }
        }
        (_, "anon_inode:[eventpoll]") => FdKind::Epoll { flags, items: procfs::parse_epoll_items(&f.info) },
        (_, "anon_inode:inotify") => FdKind::Inotify { flags, watches: inotify::watches(pid, fd, &f.info)?, queued: Vec::new() },
        // fdinfo's Pid is in the reader's namespace: the host pid.
        (_, "anon_inode:[pidfd]") if procfs::fdinfo_field(&f.info, "Pid").and_then(|p| p.parse::<i32>().ok()) == Some(pid) => FdKind::PidFdSelf { flags },
        (_, "anon_inode:[pidfd]") => {
            return Err(refuse(format!("descriptor {fd} is a pidfd of another process ({}); only one of the process itself is carried across a snapshot", f.info.lines().find(|l| l.starts_with("Pid:")).unwrap_or("Pid: ?").trim())));
        }
        (_, "anon_inode:[signalfd]") => FdKind::SignalFd {
            mask: procfs::fdinfo_field(&f.info, "sigmask").and_then(|v| u64::from_str_radix(&v, 16).ok()).unwrap_or(0),
            flags,
        },
        (_, t) if t.starts_with("/memfd:") && t.ends_with(" (deleted)") => {
            let name = t["/memfd:".len()..t.len() - " (deleted)".len()].to_string();
            let (content, seals, _) = read_fd_file(pid, fd).map_err(|e| match e {
                Some(source) => CaptureError::Io { pid, what: format!("reading memfd descriptor {fd} ({t})"), source },
                None => refuse(format!("descriptor {fd} is a memfd ({t}) larger than {} MiB; the engine carries memfds up to that size", MEMFD_MAX >> 20)),
            })?;
            FdKind::MemFd { name, content, seals, flags, pos: f.pos }
        }
        (_, t) if t.ends_with(" (deleted)") && crate::tmpfs::holds(t) => {
            // A file of the instance's own /tmp, open and then deleted: made again at
            // its path, which must be free.
            let path = t[..t.len() - " (deleted)".len()].to_string();
            if std::fs::symlink_metadata(format!("/proc/{pid}/root{path}")).is_ok() {
                return Err(refuse(format!("descriptor {fd} is a deleted file ({t}) whose path was taken again; it cannot be made again there")));
            }
            let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}"))
                .map_err(|source| CaptureError::Io { pid, what: format!("stat of descriptor {fd}"), source })?;
            if !meta.file_type().is_file() || std::os::unix::fs::MetadataExt::nlink(&meta) != 0 {
                return Err(refuse(format!("descriptor {fd} ({t}) is a deleted file that is not a regular file, or still linked elsewhere")));
            }
            let (content, _, mode) = read_fd_file(pid, fd).map_err(|e| match e {
                Some(source) => CaptureError::Io { pid, what: format!("reading deleted file descriptor {fd} ({t})"), source },
                None => refuse(format!("descriptor {fd} is a deleted file ({t}) larger than {} MiB", MEMFD_MAX >> 20)),
            })?;
            FdKind::DeletedTmp { path, content, mode, flags, pos: f.pos }
        }
        (_, t) if t.starts_with('/') && !t.ends_with(" (deleted)") => {
            let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}"))
                .map_err(|source| CaptureError::Io { pid, what: format!("stat of descriptor {fd}"), source })?;
            let ft = meta.file_type();
            use std::os::unix::fs::FileTypeExt;
            if !(ft.is_file() || ft.is_char_device() || ft.is_dir()) {
                return Err(refuse(format!("descriptor {fd} ({t}) is neither a regular file nor a device")));
            }
            // File locks: taken again on the instance's own /tmp files (no other
            // process shares those), refused by name elsewhere.
            let locks = parse_locks(&f.info).map_err(|line| refuse(format!("descriptor {fd} ({t}) holds a file lock thaw cannot take again: {line}")))?;
            if !locks.is_empty() && !(ft.is_file() && crate::tmpfs::holds(t)) {
                return Err(refuse(format!("descriptor {fd} ({t}) holds a file lock (flock, POSIX or OFD) on a file outside /tmp and /dev/shm, which cannot be carried across a snapshot")));
            }
            // Open for writing: only a file of the instance's own /tmp or /dev/shm
            // (restored afresh for every instance), never one others share.
            let acc = flags & libc::O_ACCMODE;
            if ft.is_file() && acc != libc::O_RDONLY && !crate::tmpfs::holds(t) {
                return Err(refuse(format!("descriptor {fd} ({t}) is open for writing (only files in /tmp or /dev/shm may be)")));
            }
            if locks.is_empty() {
                FdKind::Path { path: t.to_string(), flags, pos: f.pos }
            } else {
                FdKind::PathLocked { path: t.to_string(), flags, pos: f.pos, locks }
            }
        }
        (_, t) => {
            return Err(refuse(format!("descriptor {fd} is of a kind the engine cannot recreate yet: {t}")));
        }
    })
}

/// Whether the other end of the pipe whose end is descriptor `fd` of `pid` (its write
/// end if `write`) is closed everywhere: polled through a copy of the end (which
/// holds this end, not that one), a read end reports POLLHUP with no writer left, a
/// write end POLLERR with no reader.
fn other_end_closed(pid: i32, fd: i32, write: bool) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let Ok(end) = crate::sys::mem::pidfd_open(pid).and_then(|p| crate::sys::mem::pidfd_getfd(p.as_fd(), fd)) else { return false };
    let mut fds = [PollFd::new(end.as_fd(), PollFlags::empty())];
    let gone = if write { PollFlags::POLLERR } else { PollFlags::POLLHUP };
    poll(&mut fds, PollTimeout::ZERO).is_ok() && fds[0].revents().is_some_and(|r| r.contains(gone))
}

/// fds 1 and 2 are the sandbox's log pipe: write ends whose read end is not ours.
fn is_log_pipe(list: &[procfs::FdInfo], target: &str) -> bool {
    !list.iter().any(|g| g.target == target && g.flags as i32 & libc::O_ACCMODE == libc::O_RDONLY)
}

/// The file locks in a descriptor's fdinfo (`lock:\t1: POSIX  ADVISORY  WRITE 42
/// 00:2f:1234 0 EOF`, as /proc/locks prints them). Err: a line naming a lock this
/// engine does not take again (a lease, a mandatory lock, one it cannot read).
fn parse_locks(info: &str) -> Result<Vec<crate::image::FileLock>, String> {
    use crate::image::{FileLock, LockKind};
    let mut out = Vec::new();
    for line in info.lines().filter_map(|l| l.strip_prefix("lock:")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let parsed = (|| {
            let kind = match *w.get(1)? {
                "FLOCK" => LockKind::Flock,
                "POSIX" => LockKind::Posix,
                "OFDLCK" => LockKind::Ofd,
                _ => return None,
            };
            let write = match (*w.get(2)?, *w.get(3)?) {
                ("ADVISORY", "WRITE") => true,
                ("ADVISORY", "READ") => false,
                _ => return None,
            };
            let start: u64 = w.get(6)?.parse().ok()?;
            let len = match *w.get(7)? {
                "EOF" => 0,
                end => end.parse::<u64>().ok()?.checked_sub(start)? + 1,
            };
            Some(FileLock { kind, write, start, len })
        })();
        out.push(parsed.ok_or_else(|| line.trim().to_string())?);
    }
    Ok(out)
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_locks_are_read_from_fdinfo_and_leases_refused() {
        use crate::image::{FileLock, LockKind};
        let info = "pos:\t0\nflags:\t02\nlock:\t1: FLOCK  ADVISORY  WRITE 42 00:2f:1234 0 EOF\nlock:\t2: POSIX  ADVISORY  READ 42 00:2f:1234 10 19\n";
        assert_eq!(
            parse_locks(info).unwrap(),
            vec![
                FileLock { kind: LockKind::Flock, write: true, start: 0, len: 0 },
                FileLock { kind: LockKind::Posix, write: false, start: 10, len: 10 }
            ]
        );
        assert_eq!(parse_locks("pos:\t0\n").unwrap(), vec![]);
        assert!(parse_locks("lock:\t1: LEASE  ACTIVE    READ 42 00:2f:1234 0 EOF\n").is_err());
        assert!(parse_locks("lock:\t1: POSIX  ADVISORY  WRITE 42 00:2f:1234 9 3\n").is_err(), "an end before the start");
    }
}
