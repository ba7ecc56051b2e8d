//! The image's descriptors made again in the stopped process by injected syscalls
//! ([`restore_fds`]): every object created, moved through a scratch range to its
//! number, then its state put back — offsets, locks, buffered bytes and queued
//! messages (with the descriptors in flight they pass), shutdown state, epoll
//! registrations, inotify watches, memfd and deleted-file contents. Ends whose other
//! end was closed at capture (a pipe's, a socketpair's) are made whole and that end
//! closed again.

use std::io;

use super::UFFD_KEEP_FD;
use crate::image::{FdKind, FdRecord, ProcessImage};
use crate::inject::{Call, DataArea, InjectError, Injector};

/// The first of the `n` scratch descriptors [`restore_fds`] moves new descriptors
/// through: at or above [`crate::conventions::HIGH_FD_BASE`], above every descriptor
/// of the image, and clear of [`UFFD_KEEP_FD`] (F_DUPFD would skip an open one and
/// the move that follows would take the wrong descriptor).
fn scratch_base(img: &ProcessImage, n: u64) -> u64 {
    let top = img.fds.iter().map(|r| r.fd as u64 + 1).max().unwrap_or(0);
    let base = (crate::conventions::HIGH_FD_BASE as u64).max(top);
    if base <= UFFD_KEEP_FD && base + n > UFFD_KEEP_FD {
        UFFD_KEEP_FD + 1
    } else {
        base
    }
}

/// Take descriptor `fd`'s file locks again (non-blocking: the file is the instance's
/// own, in its /tmp, so nothing else can hold a conflicting one).
fn push_lock_calls(calls: &mut Vec<Call>, data: &mut DataArea, fd: i32, locks: &[crate::image::FileLock]) {
    use crate::image::LockKind;
    for l in locks {
        let fd = fd as u64;
        match l.kind {
            LockKind::Flock => {
                let op = if l.write { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
                calls.push(Call::new("flock", libc::SYS_flock, &[fd, op as u64]));
            }
            LockKind::Posix | LockKind::Ofd => {
                // struct flock: l_type, l_whence (i16 each), padding, l_start, l_len (i64),
                // l_pid (i32, 0 for OFD locks), padding.
                let mut f = Vec::with_capacity(32);
                f.extend_from_slice(&(if l.write { libc::F_WRLCK } else { libc::F_RDLCK } as i16).to_le_bytes());
                f.extend_from_slice(&(libc::SEEK_SET as i16).to_le_bytes());
                f.extend_from_slice(&[0; 4]);
                f.extend_from_slice(&l.start.to_le_bytes());
                f.extend_from_slice(&l.len.to_le_bytes());
                f.extend_from_slice(&[0; 8]);
                let a = data.push(&f);
                let cmd = if l.kind == LockKind::Ofd { libc::F_OFD_SETLK } else { libc::F_SETLK };
                calls.push(Call::new("fcntl(lock)", libc::SYS_fcntl, &[fd, cmd as u64, a]));
            }
        }
    }
}

/// Recreate the image's descriptors (other than the sandbox's own 0-3):
/// 1. create every object at whatever number the kernel picks,
/// 2. move them all to a private high range (so step 3 cannot clobber one),
/// 3. dup3 each into its recorded number, then close the high range,
/// 4. restore offsets, O_NONBLOCK on pipe ends, and epoll registrations.
pub(super) fn restore_fds(inj: &Injector<'_>, img: &ProcessImage) -> Result<(), InjectError> {
    // Objects made only for their mappings or to be sent with a queued message: made as
    // what they hold (closed once mapped, or sent); one in flight that is the open
    // file of another descriptor (the process's own, or one passed before it) is a
    // dup of it.
    let made_for: Vec<FdRecord> = img
        .fds
        .iter()
        .filter_map(|r| match &r.kind {
            FdKind::MapOnly { object } | FdKind::InFlight { object, .. } => Some(FdRecord { fd: r.fd, kind: object.as_ref().clone() }),
            _ => None,
        })
        .collect();
    let (made_dups, made_for): (Vec<FdRecord>, Vec<FdRecord>) = made_for.into_iter().partition(|r| matches!(r.kind, FdKind::Dup { .. }));
    let dups: Vec<&FdRecord> = img.fds.iter().filter(|r| matches!(r.kind, FdKind::Dup { .. })).chain(&made_dups).collect();
    let recs: Vec<&FdRecord> = img
        .fds
        .iter()
        .filter(|r| {
            !matches!(r.kind, FdKind::Null | FdKind::Log | FdKind::Control | FdKind::Dup { .. } | FdKind::MapOnly { .. } | FdKind::InFlight { .. })
        })
        .chain(&made_for)
        .collect();
    if recs.is_empty() {
        return Ok(());
    }
    let nonblock = libc::O_NONBLOCK as u64;
    let cloexec = libc::O_CLOEXEC as u64;
    // Step 1: create. `sources[i]` = where record i's object comes from: a call's
    // result, or an int written by pipe2 into the data area.
    enum Src {
        Call(usize),
        PipeEnd(u64),
    }
    let mut data = DataArea::new(inj.region);
    let mut calls = Vec::new();
    let mut sources = Vec::new();
    let mut pipes: Vec<(u64, u64)> = Vec::new(); // (pipe id, address of int[2])
    let mut pairs: Vec<(u64, u64)> = Vec::new(); // (socketpair id, address of int[2])
    for r in &recs {
        let src = match &r.kind {
            FdKind::Path { path, flags, .. } | FdKind::PathLocked { path, flags, .. } => {
                let a = data.push_cstr(path);
                let f = (*flags & !(libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL)) as u64;
                calls.push(Call::new("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, a, f]));
                Src::Call(calls.len() - 1)
            }
            FdKind::Pipe { pipe, write, .. } => {
                let at = match pipes.iter().find(|p| p.0 == *pipe) {
                    Some(p) => p.1,
                    None => {
                        let at = data.reserve(8);
                        // O_DIRECT (packet mode) is only ever given at creation, and
                        // the kernel keeps it on the write end only.
                        let direct = recs.iter().any(|x| matches!(&x.kind, FdKind::Pipe { pipe: p, flags, .. } if p == pipe && flags & libc::O_DIRECT != 0));
                        let direct = if direct { libc::O_DIRECT as u64 } else { 0 };
                        calls.push(Call::new("pipe2", libc::SYS_pipe2, &[at, cloexec | direct]));
                        pipes.push((*pipe, at));
                        at
                    }
                };
                Src::PipeEnd(if *write { at + 4 } else { at })
            }
            FdKind::EventFd { count, semaphore, flags } => {
                let f = (*flags as u64 & (nonblock | cloexec)) | if *semaphore { libc::EFD_SEMAPHORE as u64 } else { 0 };
                calls.push(Call::new("eventfd2", libc::SYS_eventfd2, &[*count, f]));
                Src::Call(calls.len() - 1)
            }
            FdKind::TimerFd { clockid, flags, .. } => {
                calls.push(Call::new("timerfd_create", libc::SYS_timerfd_create, &[*clockid as u64, *flags as u64 & (nonblock | cloexec)]));
                Src::Call(calls.len() - 1)
            }
            FdKind::Epoll { flags, .. } => {
                calls.push(Call::new("epoll_create1", libc::SYS_epoll_create1, &[*flags as u64 & cloexec]));
                Src::Call(calls.len() - 1)
            }
            FdKind::SignalFd { mask, flags } => {
                let m = data.push(&mask.to_le_bytes());
                calls.push(Call::new("signalfd4", libc::SYS_signalfd4, &[u64::MAX, m, 8, *flags as u64 & (nonblock | cloexec)]));
                Src::Call(calls.len() - 1)
            }
            FdKind::SocketPair { pair, first, sock_type, .. } => {
                let at = match pairs.iter().find(|p| p.0 == *pair) {
                    Some(p) => p.1,
                    None => {
                        let at = data.reserve(8);
                        let ty = *sock_type as u64 | libc::SOCK_CLOEXEC as u64;
                        calls.push(Call::new("socketpair", libc::SYS_socketpair, &[libc::AF_UNIX as u64, ty, 0, at]));
                        pairs.push((*pair, at));
                        at
                    }
                };
                Src::PipeEnd(if *first { at } else { at + 4 })
            }
            FdKind::MemFd { name, .. } => {
                // Sealable, so its seals can be put back once its contents are in
                // (F_SEAL_SEAL alone is what a memfd made without MFD_ALLOW_SEALING has).
                let a = data.push_cstr(name);
                calls.push(Call::new("memfd_create", libc::SYS_memfd_create, &[a, (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64]));
                Src::Call(calls.len() - 1)
            }
            FdKind::DeletedTmp { path, mode, flags, .. } => {
                // Made again at its path (free: checked at capture; this instance's own
                // /tmp) and unlinked at once; its contents follow, from outside.
                let a = data.push_cstr(path);
                let f = (*flags & !(libc::O_TRUNC | libc::O_EXCL)) | libc::O_CREAT | libc::O_EXCL;
                calls.push(Call::new("openat(deleted file)", libc::SYS_openat, &[libc::AT_FDCWD as u64, a, f as u64, *mode as u64]));
                let src = Src::Call(calls.len() - 1);
                calls.push(Call::new("unlinkat(deleted file)", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, a, 0]));
                src
            }
            FdKind::Inotify { flags, .. } => {
                calls.push(Call::new("inotify_init1", libc::SYS_inotify_init1, &[*flags as u64 & (nonblock | cloexec)]));
                Src::Call(calls.len() - 1)
            }
            FdKind::PidFdSelf { flags } => {
                // Its own pid in its namespace, where the injected call runs.
                let f = if *flags as u64 & nonblock != 0 { libc::PIDFD_NONBLOCK as u64 } else { 0 };
                calls.push(Call::new("pidfd_open(self)", libc::SYS_pidfd_open, &[crate::conventions::MAIN_PID as u64, f]));
                Src::Call(calls.len() - 1)
            }
            FdKind::Null | FdKind::Log | FdKind::Control | FdKind::Dup { .. } | FdKind::MapOnly { .. } | FdKind::InFlight { .. } => {
                unreachable!("filtered above")
            }
        };
        sources.push(src);
    }
    // A pipe end whose other end was closed at capture: the other end pipe2 makes
    // too is kept (above the records, in step 2) to write the buffered bytes through,
    // then closed. The same for a socketpair end whose peer was closed: the peer
    // socketpair makes sends what was queued, then is closed.
    let lone = missing_ends(&pipes, &recs, |k| match k {
        FdKind::Pipe { pipe, write, .. } => Some((*pipe, u64::from(*write))),
        _ => None,
    });
    let lone_pairs = missing_ends(&pairs, &recs, |k| match k {
        FdKind::SocketPair { pair, first, .. } => Some((*pair, u64::from(!*first))),
        _ => None,
    });
    sources.extend(lone.iter().chain(&lone_pairs).map(|&(_, at)| Src::PipeEnd(at)));
    let res = inj.run(&calls, &mut data)?;
    let temp: Vec<u64> = sources
        .iter()
        .map(|s| match s {
            Src::Call(i) => res[*i] as u64,
            Src::PipeEnd(at) => {
                data.u32_at(*at) as i32 as u64
            }
        })
        .collect();

    // Steps 2 and 3.
    let high = scratch_base(img, temp.len() as u64);
    let mut data = DataArea::new(inj.region);
    let mut calls = Vec::new();
    for (i, &t) in temp.iter().enumerate() {
        calls.push(Call::new("fcntl(F_DUPFD)", libc::SYS_fcntl, &[t, libc::F_DUPFD as u64, high + i as u64]));
        calls.push(Call::new("close(temp fd)", libc::SYS_close, &[t]));
    }
    for (i, r) in recs.iter().enumerate() {
        let flags = match &r.kind {
            FdKind::Path { flags, .. } | FdKind::PathLocked { flags, .. } | FdKind::Pipe { flags, .. } | FdKind::EventFd { flags, .. } => *flags,
            FdKind::Epoll { flags, .. } | FdKind::SignalFd { flags, .. } | FdKind::TimerFd { flags, .. } => *flags,
            FdKind::SocketPair { flags, .. } | FdKind::MemFd { flags, .. } | FdKind::DeletedTmp { flags, .. } | FdKind::PidFdSelf { flags } => *flags,
            FdKind::Inotify { flags, .. } => *flags,
            _ => 0,
        } as u64;
        calls.push(Call::new("dup3(fd)", libc::SYS_dup3, &[high + i as u64, r.fd as u64, flags & cloexec]));
        calls.push(Call::new("close(high fd)", libc::SYS_close, &[high + i as u64]));
    }
    // Dups share their original's open file description: dup3 from its final number
    // (every original is in place now; a dup's own number is no other record's).
    for r in &dups {
        if let FdKind::Dup { of, flags } = &r.kind {
            calls.push(Call::new("dup3(dup)", libc::SYS_dup3, &[*of as u64, r.fd as u64, *flags as u64 & cloexec]));
        }
    }
    // Step 4.
    let mut sized: Vec<u64> = Vec::new(); // pipes whose capacity is set
    for r in &recs {
        if let FdKind::PathLocked { locks, .. } = &r.kind {
            push_lock_calls(&mut calls, &mut data, r.fd, locks);
        }
        match &r.kind {
            FdKind::Path { pos, .. } | FdKind::PathLocked { pos, .. } | FdKind::MemFd { pos, .. } | FdKind::DeletedTmp { pos, .. } if *pos != 0 => {
                calls.push(Call::new("lseek", libc::SYS_lseek, &[r.fd as u64, *pos, libc::SEEK_SET as u64]));
            }
            FdKind::SocketPair { flags, options, .. } => {
                // Its options, before anything is sent through it (a send buffer
                // decides how much may wait in it).
                for (opt, value) in options {
                    let value = match *opt {
                        libc::SO_RCVBUF | libc::SO_SNDBUF if value.len() == 4 => (u32::from_le_bytes(value[..4].try_into().expect("4 bytes")) / 2).to_le_bytes().to_vec(),
                        _ => value.clone(),
                    };
                    let a = data.push(&value);
                    calls.push(Call::new("setsockopt", libc::SYS_setsockopt, &[r.fd as u64, libc::SOL_SOCKET as u64, *opt as u64, a, value.len() as u64]));
                }
                if *flags as u64 & nonblock != 0 {
                    calls.push(Call::new("fcntl(F_SETFL)", libc::SYS_fcntl, &[r.fd as u64, libc::F_SETFL as u64, *flags as u64 & nonblock]));
                }
            }
            FdKind::Pipe { pipe, flags, size, .. } => {
                // Its capacity (before the buffered bytes go in), from one end.
                if *size != 0 && !sized.contains(pipe) {
                    sized.push(*pipe);
                    calls.push(Call::new("fcntl(F_SETPIPE_SZ)", libc::SYS_fcntl, &[r.fd as u64, libc::F_SETPIPE_SZ as u64, *size as u64]));
                }
                if *flags as u64 & nonblock != 0 {
                    calls.push(Call::new("fcntl(F_SETFL)", libc::SYS_fcntl, &[r.fd as u64, libc::F_SETFL as u64, *flags as u64 & nonblock]));
                }
            }
            FdKind::TimerFd { ticks, value, interval, .. } => {
                // Re-armed with what was left of its period, relative; then the
                // expirations not yet read (settime clears them, so it goes first).
                if *value != (0, 0) {
                    let its: Vec<u8> = [interval.0, interval.1, value.0, value.1].iter().flat_map(|w| w.to_le_bytes()).collect();
                    let a = data.push(&its);
                    calls.push(Call::new("timerfd_settime", libc::SYS_timerfd_settime, &[r.fd as u64, 0, a, 0]));
                }
                if *ticks > 0 {
                    let t = data.push(&ticks.to_le_bytes());
                    calls.push(Call::new("ioctl(TFD_IOC_SET_TICKS)", libc::SYS_ioctl, &[r.fd as u64, crate::conventions::TFD_IOC_SET_TICKS, t]));
                }
            }
            _ => {}
        }
    }
    for r in &recs {
        if let FdKind::Pipe { pipe, write: false, buffered, .. } = &r.kind {
            if buffered.is_empty() {
                continue;
            }
            let w = recs.iter().find(|x| matches!(&x.kind, FdKind::Pipe { pipe: p, write: true, .. } if p == pipe)).map(|w| w.fd as u64);
            // Or the write end made only for this (its writer closed at capture).
            let w = w.or_else(|| lone.iter().position(|l| l.0 == *pipe).map(|k| high + (recs.len() + k) as u64));
            if let Some(w) = w {
                let a = data.push(buffered);
                calls.push(Call::new("write(pipe)", libc::SYS_write, &[w, a, buffered.len() as u64]));
            }
        }
    }
    // What waited to be read on a socketpair end is sent again from its other end
    // (message by message), then each end's shutdown state is put back.
    for r in &recs {
        if let FdKind::SocketPair { pair, first, queued, .. } = &r.kind {
            let peer = recs.iter().find(|x| matches!(&x.kind, FdKind::SocketPair { pair: p, first: f, .. } if p == pair && f != first)).map(|x| x.fd as u64);
            // Or the peer made only for this (closed at capture).
            let peer = peer.or_else(|| lone_pairs.iter().position(|l| l.0 == *pair).map(|k| high + (recs.len() + lone.len() + k) as u64));
            if let Some(peer) = peer.filter(|_| !queued.is_empty()) {
                for (i, m) in queued.iter().enumerate() {
                    let a = data.push(m);
                    // Each descriptor at its place in the message.
                    let mut rights: Vec<(u32, i32)> = img
                        .fds
                        .iter()
                        .flat_map(|x| match &x.kind {
                            FdKind::InFlight { sends, .. } => {
                                sends.iter().filter(|s| s.0 == r.fd && s.1 as usize == i).map(|s| (s.2, x.fd)).collect()
                            }
                            _ => Vec::new(),
                        })
                        .collect();
                    rights.sort_unstable();
                    let rights: Vec<i32> = rights.into_iter().map(|(_, fd)| fd).collect();
                    if rights.is_empty() {
                        calls.push(Call::new("sendto(socketpair)", libc::SYS_sendto, &[peer, a, m.len() as u64, libc::MSG_DONTWAIT as u64, 0, 0]));
                    } else {
                        calls.push(sendmsg_rights(&mut data, peer as i32, a, m.len(), &rights));
                    }
                }
            }
        }
    }
    for r in &recs {
        if let FdKind::SocketPair { shutdown, .. } = &r.kind {
            let how = match shutdown & 3 {
                1 => Some(libc::SHUT_RD),
                2 => Some(libc::SHUT_WR),
                3 => Some(libc::SHUT_RDWR),
                _ => None,
            };
            if let Some(how) = how {
                calls.push(Call::new("shutdown(socketpair)", libc::SYS_shutdown, &[r.fd as u64, how as u64]));
            }
        }
    }
    for r in &recs {
        if let FdKind::Epoll { items, .. } = &r.kind {
            for &(tfd, events, user) in items {
                let mut ev = events.to_le_bytes().to_vec();
                ev.extend_from_slice(&user.to_le_bytes());
                let a = data.push(&ev);
                calls.push(Call::new("epoll_ctl(ADD)", libc::SYS_epoll_ctl, &[r.fd as u64, libc::EPOLL_CTL_ADD as u64, tfd as u64, a]));
            }
        }
    }
    // Descriptors in flight are in their messages now: closed. So are the other ends
    // of pipes whose other end was closed.
    for r in img.fds.iter().filter(|r| matches!(r.kind, FdKind::InFlight { .. })) {
        calls.push(Call::new("close(in flight)", libc::SYS_close, &[r.fd as u64]));
    }
    for k in 0..lone.len() + lone_pairs.len() {
        calls.push(Call::new("close(closed end)", libc::SYS_close, &[high + (recs.len() + k) as u64]));
    }
    // inotify watches, each added again by path in watch descriptor order: a fresh
    // instance numbers them from 1, so a gap (a watch removed before the capture) is
    // taken by a watch added and removed at once. Each result is checked below.
    let mut watch_calls = Vec::new();
    let mut root = None;
    for r in &recs {
        let FdKind::Inotify { watches, .. } = &r.kind else { continue };
        let mut next = 1;
        let mut gaps = 0u64;
        for w in watches {
            while next < w.wd {
                let root = *root.get_or_insert_with(|| data.push_cstr("/"));
                calls.push(Call::new("inotify_add_watch(gap)", libc::SYS_inotify_add_watch, &[r.fd as u64, root, libc::IN_ATTRIB as u64]));
                calls.push(Call::new("inotify_rm_watch(gap)", libc::SYS_inotify_rm_watch, &[r.fd as u64, next as u64]));
                next += 1;
                gaps += 1;
            }
            let p = data.push_cstr(&w.path);
            watch_calls.push((calls.len(), w.wd));
            calls.push(Call::new("inotify_add_watch", libc::SYS_inotify_add_watch, &[r.fd as u64, p, w.mask as u64]));
            next = w.wd + 1;
        }
        if gaps > 0 {
            // Each removal queued an IN_IGNORED event (16 bytes, no name) the process
            // never had: read them all out (nothing else happens in the sandbox now).
            let len = gaps * std::mem::size_of::<libc::inotify_event>() as u64;
            let buf = data.reserve(len as usize);
            calls.push(Call::new("read(inotify gaps)", libc::SYS_read, &[r.fd as u64, buf, len]));
        }
    }
    let res = inj.run(&calls, &mut data)?;
    if let Some(&(i, want)) = watch_calls.iter().find(|&&(i, want)| res[i] != want as i64) {
        let err = io::Error::other(format!("it gave watch descriptor {}, the image has {want}", res[i]));
        return Err(InjectError::Syscall { pid: inj.tracee.pid.as_raw(), index: i, name: "inotify_add_watch", nr: libc::SYS_inotify_add_watch, err });
    }
    restore_memfd_contents(inj, &recs)
}

/// Of the pipes or socketpairs `made` (id, address of the int[2] pipe2/socketpair
/// fills), those with one end only among `recs` (the other closed at capture): (id,
/// address of the other end's int). `end` gives a record's (id, its place in the
/// int[2]) for the kind in question.
fn missing_ends(made: &[(u64, u64)], recs: &[&FdRecord], end: impl Fn(&FdKind) -> Option<(u64, u64)>) -> Vec<(u64, u64)> {
    made.iter()
        .filter_map(|&(id, at)| {
            let places: Vec<u64> = recs.iter().filter_map(|r| end(&r.kind).filter(|e| e.0 == id).map(|e| e.1)).collect();
            match places[..] {
                [place] => Some((id, at + 4 * (1 - place))),
                _ => None,
            }
        })
        .collect()
}

/// sendmsg(2) of `len` bytes at `buf` from `fd` with descriptors `rights` (SCM_RIGHTS),
/// its message header and control buffer in `data`.
fn sendmsg_rights(data: &mut DataArea, fd: i32, buf: u64, len: usize, rights: &[i32]) -> Call {
    // struct cmsghdr: len (u64), level, type (i32), then the descriptors; padded to 8.
    let cmsg_len = 16 + 4 * rights.len();
    let mut ctl = (cmsg_len as u64).to_le_bytes().to_vec();
    ctl.extend_from_slice(&libc::SOL_SOCKET.to_le_bytes());
    ctl.extend_from_slice(&libc::SCM_RIGHTS.to_le_bytes());
    for r in rights {
        ctl.extend_from_slice(&r.to_le_bytes());
    }
    ctl.resize(cmsg_len.div_ceil(8) * 8, 0);
    let ctl_len = ctl.len() as u64;
    let ctl = data.push(&ctl);
    let iov = data.push(&[buf.to_le_bytes(), (len as u64).to_le_bytes()].concat());
    // struct msghdr: name, namelen(+pad), iov, iovlen, control, controllen, flags(+pad).
    let hdr: Vec<u8> = [0u64, 0, iov, 1, ctl, ctl_len, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
    let msg = data.push(&hdr);
    Call::new("sendmsg(socketpair, SCM_RIGHTS)", libc::SYS_sendmsg, &[fd as u64, msg, libc::MSG_DONTWAIT as u64])
}

/// Write each memfd's and deleted /tmp file's contents through /proc/PID/fd/FD (any
/// size; the process's own offset, set above, is not moved), then put a memfd's seals
/// back from inside the process (after the writes: F_SEAL_WRITE would refuse them).
fn restore_memfd_contents(inj: &Injector<'_>, recs: &[&FdRecord]) -> Result<(), InjectError> {
    use std::os::unix::fs::FileExt;
    let pid = inj.tracee.pid.as_raw();
    let mut calls = Vec::new();
    for r in recs {
        if let FdKind::MemFd { content, seals: _, .. } | FdKind::DeletedTmp { content, .. } = &r.kind {
            let f = std::fs::OpenOptions::new().write(true).open(format!("/proc/{pid}/fd/{}", r.fd));
            f.and_then(|f| f.write_all_at(content, 0).and_then(|()| f.set_len(content.len() as u64)))
                .map_err(|source| InjectError::Memory { pid, addr: 0, source })?;
        }
        if let FdKind::MemFd { seals, .. } = &r.kind {
            if *seals != 0 {
                calls.push(Call::new("fcntl(F_ADD_SEALS)", libc::SYS_fcntl, &[r.fd as u64, libc::F_ADD_SEALS as u64, *seals as u64]));
            }
        }
    }
    if calls.is_empty() {
        return Ok(());
    }
    inj.run(&calls, &mut DataArea::new(inj.region)).map(|_| ())
}
