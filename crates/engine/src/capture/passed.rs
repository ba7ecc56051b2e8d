//! Descriptors in flight: sent over a socketpair (SCM_RIGHTS) and not yet received
//! at the snapshot. Before the descriptors are read, every socketpair end is drained
//! ([`drain_all`]): the queued messages are received into the captured process
//! (which is never resumed), so each descriptor they passed is one of its own, at a
//! number recvmsg picked, and the capture describes it like any other (a file, a
//! pipe end, a socketpair end — drained in turn —, an eventfd, a memfd...). Then
//! [`wrap`] marks each such number [`FdKind::InFlight`]: the restore makes what it
//! holds at that number, sends it again with its message, and closes it. One open
//! file description passed twice, or passed and also held by the process, is a
//! [`FdKind::Dup`] of the first (held numbers come first), so it stays one.
//! Ancillary data other than descriptors is refused by name.

use super::{CaptureError, PIPE_DATA_MAX};
use crate::image::{FdKind, FdRecord};
use crate::inject::{Call, DataArea, InjectError, Injector};
use crate::sockdiag;

/// A descriptor received out of a queued message while draining: its number in
/// the process now, and (socketpair end, message index on it, place among the
/// message's descriptors).
#[derive(Debug, Clone, Copy)]
pub(super) struct Received {
    pub fd: i32,
    pub send: (i32, u32, u32),
}

/// What each socketpair end drained held (by descriptor), and every descriptor received.
pub(super) type Drains = (Vec<(i32, Drained)>, Vec<Received>);

/// Most socketpair ends drained in one capture (those the process holds and those
/// in flight).
const SOCKETS_MAX: usize = 1024;

/// Drain every unix socketpair end of `pid` (connected, unnamed; not its control
/// channel, descriptor 3), then every socketpair end those messages passed, and so
/// on: what each held, by descriptor, and every descriptor received. Sockets of any
/// other kind are left for the descriptor capture to refuse by name.
pub(super) fn drain_all(inj: &Injector<'_>, region: u64, pid: i32) -> Result<Drains, CaptureError> {
    let list = crate::procfs::fds(pid).map_err(|source| CaptureError::Io { pid, what: "listing descriptors".into(), source })?;
    let mut todo: std::collections::VecDeque<i32> =
        list.iter().filter(|f| f.fd != 3 && f.target.starts_with("socket:")).map(|f| f.fd).collect();
    if todo.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    // Every socket of the namespace is listed, those in flight too.
    let unix = sockdiag::unix_sockets(pid).map_err(|source| CaptureError::Io { pid, what: "listing unix sockets (sock_diag)".into(), source })?;
    let (mut drains, mut received) = (Vec::new(), Vec::new());
    while let Some(fd) = todo.pop_front() {
        let Some(ino) = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok().and_then(|t| sockdiag::inode_of(&t.to_string_lossy())) else {
            continue;
        };
        let Some(s) = unix.get(&ino) else { continue };
        let kind = s.sock_type as i32;
        // Connected (its peer open, or closed: what it queued is still to be read).
        if s.named || s.state != 1 || ![libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_SEQPACKET].contains(&kind) {
            continue;
        }
        if drains.len() == SOCKETS_MAX {
            drains.push((fd, Drained::Refused("more socketpair ends than a snapshot carries")));
            break;
        }
        let d = drain_socket(inj, region, fd, kind, s.shutdown & 1 != 0).map_err(|source| CaptureError::Inject { pid, source })?;
        if let Drained::Messages(m) = &d {
            for (i, (_, rights)) in m.iter().enumerate() {
                for (k, &n) in rights.iter().enumerate() {
                    received.push(Received { fd: n, send: (fd, i as u32, k as u32) });
                    todo.push_back(n);
                }
            }
        }
        drains.push((fd, d));
    }
    Ok((drains, received))
}

/// Mark the records of descriptors received out of queued messages as in flight:
/// made at their number, sent again with their message, closed.
pub(super) fn wrap(fds: &mut [FdRecord], received: &[Received]) {
    for r in fds.iter_mut() {
        if let Some(x) = received.iter().find(|x| x.fd == r.fd) {
            let object = std::mem::replace(&mut r.kind, FdKind::Null);
            r.kind = FdKind::InFlight { sends: vec![x.send], object: Box::new(object) };
        }
    }
}

/// What draining one socketpair end found.
pub(super) enum Drained {
    /// The messages, in order (a stream's bytes as one or more pieces), each with the
    /// descriptors it passed (SCM_RIGHTS), now received into the process.
    Messages(Vec<(Vec<u8>, Vec<i32>)>),
    /// Something that cannot be carried (named in the refusal).
    Refused(&'static str),
}

/// Read out everything waiting on socketpair end `fd` (the process is never
/// resumed, so reading it is harmless), message by message with recvmsg, until
/// EAGAIN. Ancillary data (passed descriptors, credentials) and messages larger
/// than what may travel are refused, never dropped.
fn drain_socket(inj: &Injector<'_>, region: u64, fd: i32, sock_type: i32, rcv_shutdown: bool) -> Result<Drained, InjectError> {
    const CTL: usize = 256;
    let mut msgs = Vec::new();
    let mut total = 0usize;
    for _ in 0..SOCKET_MSGS_MAX {
        let room = PIPE_DATA_MAX - total;
        if room == 0 {
            return Ok(Drained::Refused("more queued bytes than a snapshot carries"));
        }
        let mut d = DataArea::new(region);
        let buf = d.reserve(room);
        let ctl = d.reserve(CTL);
        let iov = d.push(&[buf.to_le_bytes(), (room as u64).to_le_bytes()].concat());
        // struct msghdr: name, namelen(+pad), iov, iovlen, control, controllen, flags(+pad).
        let hdr: Vec<u8> = [0u64, 0, iov, 1, ctl, CTL as u64, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
        let msg = d.push(&hdr);
        let call = Call::new("recvmsg(socketpair)", libc::SYS_recvmsg, &[fd as u64, msg, libc::MSG_DONTWAIT as u64]);
        let got = match inj.run(&[call], &mut d) {
            Ok(r) => r[0] as usize,
            Err(InjectError::Syscall { err, .. }) if err.raw_os_error() == Some(libc::EAGAIN) => return Ok(Drained::Messages(msgs)),
            Err(e) => return Err(e),
        };
        let (controllen, flags) = (d.u64_at(msg, 5), d.u32_at(msg + 48) as i32);
        if flags & libc::MSG_CTRUNC != 0 {
            return Ok(Drained::Refused("a queued message passes more descriptors than a snapshot carries"));
        }
        let rights = match rights(d.bytes(ctl, (controllen as usize).min(CTL))) {
            Ok(r) => r,
            Err(what) => return Ok(Drained::Refused(what)),
        };
        if flags & libc::MSG_TRUNC != 0 {
            return Ok(Drained::Refused("a queued message is larger than a snapshot carries"));
        }
        // 0 is the end of a stream (its peer shut its sending side down: kept as
        // shutdown state), or an empty record; a record socket shut down for
        // receiving cannot tell them apart (the capture's final check refuses
        // whatever was left unread).
        if got == 0 && (sock_type == libc::SOCK_STREAM || sock_type == libc::SOCK_SEQPACKET && rcv_shutdown) {
            return Ok(Drained::Messages(msgs));
        }
        total += got;
        msgs.push((d.bytes(buf, got).to_vec(), rights));
    }
    Ok(Drained::Refused("more queued messages than a snapshot carries"))
}

/// Most messages a socketpair end may hold at capture.
const SOCKET_MSGS_MAX: usize = 1024;

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
    fn received_descriptors_are_wrapped_as_in_flight_and_others_left() {
        let mut fds = vec![
            FdRecord { fd: 4, kind: FdKind::EventFd { count: 1, semaphore: false, flags: 0 } },
            FdRecord { fd: 5, kind: FdKind::Dup { of: 4, flags: 0 } },
            FdRecord { fd: 6, kind: FdKind::Null },
        ];
        wrap(&mut fds, &[Received { fd: 5, send: (9, 2, 1) }]);
        assert!(matches!(fds[0].kind, FdKind::EventFd { .. }));
        match &fds[1].kind {
            FdKind::InFlight { sends, object } => {
                assert_eq!(sends, &vec![(9, 2, 1)]);
                assert!(matches!(**object, FdKind::Dup { of: 4, .. }));
            }
            other => panic!("not wrapped: {other:?}"),
        }
        assert!(matches!(fds[2].kind, FdKind::Null));
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
