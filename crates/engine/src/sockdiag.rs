//! The unix sockets of a process's network namespace, from the kernel's
//! sock_diag (NETLINK_SOCK_DIAG, unix_diag): type, state, peer, queue lengths,
//! shutdown state. /proc names a socket only by inode; telling a socketpair
//! whose two ends the process holds from a socket connected to anything else
//! needs the peer's inode, which only sock_diag reports (as `ss -x` shows it).
//!
//! The query runs on a short-lived thread that joins the process's network
//! namespace (setns affects only the calling thread), so the node's own
//! namespace is untouched.

use std::collections::HashMap;
use std::io;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_sock_diag::unix::{nlas::Nla, ShowFlags, StateFlags, UnixRequest};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};

/// One unix socket as sock_diag reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixSock {
    /// SOCK_STREAM, SOCK_DGRAM or SOCK_SEQPACKET.
    pub sock_type: u8,
    /// TCP_* state numbers (1 = connected).
    pub state: u8,
    /// Inode of the connected peer (0: none).
    pub peer: u32,
    /// Bound to a path or an abstract name.
    pub named: bool,
    /// Bytes (or, for datagrams, the first message's length) queued to be read.
    pub rqueue: u32,
    /// Memory this socket's sent messages hold in its peer's receive queue (nonzero
    /// while anything it sent, an empty datagram included, is unread).
    pub wqueue: u32,
    /// RCV_SHUTDOWN (1) / SEND_SHUTDOWN (2) bits.
    pub shutdown: u8,
}

/// The inode of a socket from its descriptor's link target (`socket:[12345]`), as
/// sock_diag numbers it.
pub fn inode_of(link_target: &str) -> Option<u32> {
    link_target.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Every unix socket in the network namespace of `pid`, by inode.
pub fn unix_sockets(pid: i32) -> io::Result<HashMap<u32, UnixSock>> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::Builder::new()
        .name("thaw-sockdiag".into())
        .spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            dump()
        })?
        .join()
        .map_err(|_| io::Error::other("the sock_diag thread panicked"))?
}

fn dump() -> io::Result<HashMap<u32, UnixSock>> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut req = NetlinkMessage::new(
        header,
        SockDiagMessage::UnixRequest(UnixRequest {
            state_flags: StateFlags::from_bits_retain(u32::MAX),
            inode: 0,
            show_flags: ShowFlags::NAME | ShowFlags::PEER | ShowFlags::RQLEN,
            cookie: [0xff; 8],
        })
        .into(),
    );
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {what}"));
    let mut out = HashMap::new();
    let mut rx = Vec::with_capacity(64 << 10);
    loop {
        rx.clear();
        let n = socket.recv(&mut rx, 0)?;
        let mut at = 0;
        while at < n {
            let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(&rx[at..n]).map_err(|e| bad(e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => return Err(bad(format!("{e:?}"))),
                NetlinkPayload::InnerMessage(SockDiagMessage::UnixResponse(r)) => {
                    let mut s = UnixSock { sock_type: r.header.kind, state: r.header.state, peer: 0, named: false, rqueue: 0, wqueue: 0, shutdown: 0 };
                    for nla in &r.nlas {
                        match nla {
                            Nla::Peer(p) => s.peer = *p,
                            Nla::Name(_) => s.named = true,
                            Nla::ReceiveQueueLength(r, w) => (s.rqueue, s.wqueue) = (*r, *w),
                            Nla::Shutdown(b) => s.shutdown = *b,
                            _ => {}
                        }
                    }
                    out.insert(r.header.inode, s);
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn inode(fd: i32) -> u32 {
        inode_of(&std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap().to_string_lossy()).unwrap()
    }

    #[test]
    fn a_socketpair_shows_its_peer_and_queue() {
        if !nix::unistd::geteuid().is_root() {
            return; // setns needs CAP_SYS_ADMIN
        }
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::io::Write;
        (&a).write_all(b"hello").unwrap();
        let (ia, ib) = (inode(a.as_raw_fd()), inode(b.as_raw_fd()));
        let all = unix_sockets(std::process::id() as i32).unwrap();
        let (sa, sb) = (all[&ia], all[&ib]);
        assert_eq!((sa.peer, sb.peer), (ib, ia));
        assert_eq!((sa.sock_type, sa.named), (libc::SOCK_STREAM as u8, false));
        assert_eq!((sa.rqueue, sb.rqueue), (0, 5), "b has the 5 bytes a sent");
        assert!(sa.wqueue > 0 && sb.wqueue == 0, "{sa:?} {sb:?}");
        b.shutdown(std::net::Shutdown::Write).unwrap();
        let all = unix_sockets(std::process::id() as i32).unwrap();
        assert_eq!((all[&ia].shutdown, all[&ib].shutdown), (1, 2));
    }
}
