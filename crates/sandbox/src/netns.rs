//! Network namespaces used again, when nothing shows they were used.
//!
//! A new network namespace is the most expensive part of a sandbox: every networking
//! subsystem of the kernel sets up its per-namespace state (sysctl tables, protocol
//! tables, the loopback device) and a kernel worker tears it all down after the last
//! process leaves, ~1.3 ms of the machine's CPU per sandbox on the 2-core hosts we
//! measure (0.67 set-up, 0.61 teardown; perf over 300 restores, `bench/README.md`,
//! "Network namespaces used again"). A function's sandbox has loopback only, and its
//! unprivileged processes cannot configure the namespace (that needs CAP_NET_ADMIN
//! over the initial user namespace, which owns it): what one tenant can leave in it
//! is sockets, and counters that show its traffic.
//!
//! So once a sandbox's init is reaped — the end of its pid namespace, whose every
//! process the kernel has waited for by then — its network namespace goes to one
//! checker thread. The checker enters it and reads what the namespace shows its
//! processes under `/proc/thread-self/net`: the interfaces and their counters, the
//! IP, ICMP, TCP and UDP counters, and how many sockets it holds. Only a namespace
//! that reads exactly as a fresh one (the reference the checker made itself,
//! loopback up) is kept, at most [`MAX_KEPT`]; a later sandbox
//! joins it (`setns` between clone and exec, instead of CLONE_NEWNET). Anything
//! else — one packet on loopback, one socket not yet freed, an unroutable connect
//! counted — and the namespace is dropped, as before. Nothing a previous tenant did
//! is visible to the next; what stays is the namespace's identity (the number a
//! process reads at /proc/self/ns/net), so an instance can tell that its namespace
//! served a quiet sandbox before, not whose.
//!
//! The checker runs under SCHED_IDLE, on cores nothing else wants, so a check never
//! slows a start; at most [`MAX_WAITING`] namespaces wait for it (more are dropped).
//!
//! `THAW_NETNS_REUSE=0` turns it off (every sandbox a new namespace: the baseline).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Mutex, OnceLock};

use nix::sched::{setns, unshare, CloneFlags};

/// Namespaces kept ready at most (each holds some kernel memory: its loopback device,
/// tables, sysctls).
pub(crate) const MAX_KEPT: usize = 32;
/// Ended sandboxes' namespaces waiting for the checker at most; more are dropped. The
/// checker runs only on idle cores (SCHED_IDLE: a check never slows a start), so
/// under a long full load they would otherwise pile up, each held alive.
const MAX_WAITING: usize = 64;

/// What `/proc/thread-self/net` shows that a tenant's use would change: the
/// interfaces and their counters, the protocols' counters (IPv4, IPv6, TCP's and IP's
/// extensions) and the namespace's sockets — `sockets: used` counts every socket of any
/// family that a process made in it, and `tw` the TCP connections in TIME_WAIT.
/// `sockstat*` are filtered: some of their fields count the whole host (see
/// [`per_namespace`]). Not the socket tables (`tcp` walks the host's whole connection
/// hash, ~4 ms): with no socket left they list nothing, which `sockets: used 0` says.
const FILES: [&str; 6] = ["dev", "snmp", "snmp6", "netstat", "sockstat", "sockstat6"];

/// Counters of the recycling, for logs, metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NetnsStats {
    /// Sandboxes that joined a namespace used before, and those that made a new one.
    pub reused: u64,
    pub created: u64,
    /// Namespaces of ended sandboxes kept, and dropped (used, or more than `MAX_KEPT`).
    pub kept: u64,
    pub dropped: u64,
    /// Namespaces ready now.
    pub ready: usize,
}

struct Recycler {
    ready: Mutex<Vec<OwnedFd>>,
    /// To the checker thread; `None` once it failed to start (no reuse then).
    to_checker: Mutex<Option<SyncSender<OwnedFd>>>,
    reused: AtomicU64,
    created: AtomicU64,
    kept: AtomicU64,
    dropped: AtomicU64,
}

pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("THAW_NETNS_REUSE").map_or(true, |v| v != "0"))
}

fn recycler() -> &'static Recycler {
    static R: OnceLock<Recycler> = OnceLock::new();
    R.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel(MAX_WAITING);
        let started = std::thread::Builder::new().name("thaw-netns".into()).spawn(move || checker(rx));
        if let Err(e) = &started {
            tracing::warn!(error = %e, "network namespaces will not be used again: the checker thread did not start");
        }
        Recycler {
            ready: Mutex::new(Vec::new()),
            to_checker: Mutex::new(started.ok().map(|_| tx)),
            reused: AtomicU64::new(0),
            created: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    })
}

/// A network namespace for a new sandbox to join, if one is ready; `None`: the
/// sandbox makes its own (CLONE_NEWNET).
pub(crate) fn take() -> Option<OwnedFd> {
    if !enabled() {
        return None;
    }
    let r = recycler();
    // Never wait for the lock: the checker (SCHED_IDLE) may be preempted holding it
    // under load; a start then makes its own namespace.
    let got = match r.ready.try_lock() {
        Ok(mut ready) => ready.pop(),
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().pop(),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    match got {
        Some(_) => r.reused.fetch_add(1, Ordering::Relaxed),
        None => r.created.fetch_add(1, Ordering::Relaxed),
    };
    got
}

/// The network namespace of a sandbox whose init has been reaped: checked on the
/// checker thread and kept if nothing shows it was used. Only call this once no
/// process of the sandbox can be left (its init reaped).
pub(crate) fn give_back(ns: OwnedFd) {
    if !enabled() {
        return;
    }
    let r = recycler();
    let tx = r.to_checker.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Full (or no checker): the namespace is dropped here, as before recycling.
    if tx.is_none_or(|tx| tx.try_send(ns).is_err()) {
        r.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// The recycling's counters (all zero while it is off).
pub fn stats() -> NetnsStats {
    if !enabled() {
        return NetnsStats::default();
    }
    let r = recycler();
    NetnsStats {
        reused: r.reused.load(Ordering::Relaxed),
        created: r.created.load(Ordering::Relaxed),
        kept: r.kept.load(Ordering::Relaxed),
        dropped: r.dropped.load(Ordering::Relaxed),
        // A metrics read does not wait for a preempted idle checker either.
        ready: r.ready.try_lock().map_or(0, |ready| ready.len()),
    }
}

/// The namespace of the calling thread, as a descriptor.
fn own_namespace() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/proc/thread-self/ns/net")?.into())
}

/// The checker: makes the reference (a fresh namespace, loopback up; it is the first
/// one kept), then checks each namespace handed back. It returns to the host's
/// namespace (opened once) after each, so it holds none alive itself.
fn checker(rx: Receiver<OwnedFd>) {
    let r = recycler();
    if let Err(e) = crate::sys::idle_priority() {
        tracing::debug!(error = %e, "the network namespace checker runs at normal priority");
    }
    let made = own_namespace().and_then(|host| make_reference(&host).map(|(fresh, fp)| (host, fresh, fp)));
    let (host, reference) = match made {
        Ok((host, fresh, fp)) => {
            r.ready.lock().unwrap_or_else(|e| e.into_inner()).push(fresh);
            (host, fp)
        }
        Err(e) => {
            tracing::warn!(error = %e, "network namespaces will not be used again: no fresh one to compare with");
            *r.to_checker.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return;
        }
    };
    for ns in rx {
        match inspect(&host, &ns).map(|fp| first_difference(&reference, &fp)) {
            Ok(None) => {
                let mut ready = r.ready.lock().unwrap_or_else(|e| e.into_inner());
                if ready.len() < MAX_KEPT {
                    ready.push(ns);
                    r.kept.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            Ok(Some(line)) => tracing::debug!(differs = %line, "a sandbox's network namespace shows use: not used again"),
            Err(e) => tracing::debug!(error = %e, "a sandbox's network namespace could not be read: not used again"),
        }
        r.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// A new namespace (on this thread), loopback up as a sandbox's init leaves it, and
/// what it shows; the thread goes back to `host`.
fn make_reference(host: &OwnedFd) -> io::Result<(OwnedFd, String)> {
    unshare(CloneFlags::CLONE_NEWNET)?;
    let made = (|| {
        crate::sys::loopback_up()?;
        let fresh = own_namespace()?;
        // The socket that brought loopback up is freed after an RCU grace period.
        let mut fp = fingerprint()?;
        for _ in 0..50 {
            if fp.contains("\nsockets: used 0\n") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
            fp = fingerprint()?;
        }
        // Fail closed: what is compared must be this namespace's, and show what a
        // check relies on (else every namespace would compare equal, used or not).
        match fresh_as_expected(&fp) {
            Ok(()) => Ok((fresh, fp)),
            Err(why) => Err(io::Error::other(format!("a fresh namespace reads unexpectedly under /proc/thread-self/net: {why}"))),
        }
    })();
    setns(host.as_fd(), CloneFlags::CLONE_NEWNET)?;
    made
}

/// What namespace `ns` shows, read from inside it; the thread goes back to `host`.
fn inspect(host: &OwnedFd, ns: &OwnedFd) -> io::Result<String> {
    setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
    let fp = fingerprint();
    setns(host.as_fd(), CloneFlags::CLONE_NEWNET)?;
    fp
}

/// The calling thread's namespace as its processes see it under /proc/thread-self/net.
fn fingerprint() -> io::Result<String> {
    let mut out = String::new();
    for f in FILES {
        out.push_str("== ");
        out.push_str(f);
        out.push('\n');
        match std::fs::read_to_string(format!("/proc/thread-self/net/{f}")) {
            Ok(s) if f.starts_with("sockstat") => out.push_str(&per_namespace(&s)),
            Ok(s) => out.push_str(&s),
            // Without IPv6 its files are missing, in the reference as in every other.
            Err(e) if e.kind() == io::ErrorKind::NotFound && f.ends_with('6') => out.push_str("(none)\n"),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// What a fresh namespace's fingerprint must show: loopback as its only interface
/// (so the files are this thread's namespace, not the process's), no packet on it, no
/// socket.
fn fresh_as_expected(fp: &str) -> Result<(), String> {
    let dev = fp.split("== dev\n").nth(1).and_then(|r| r.split("== ").next()).unwrap_or("");
    // Two header lines, then one line per interface.
    let ifaces: Vec<Vec<&str>> = dev.lines().skip(2).map(|l| l.split_whitespace().collect()).collect();
    match ifaces.as_slice() {
        [lo] if lo.first() == Some(&"lo:") && lo[1..].iter().all(|c| *c == "0") => {}
        _ => return Err(format!("interfaces {dev:?}")),
    }
    if !fp.contains("\nsockets: used 0\n") {
        return Err("sockets in use".into());
    }
    Ok(())
}

/// `sockstat` without the fields that count the whole host (orphans, allocated
/// sockets and memory of a protocol are global; `inuse`, `tw` and `sockets: used` are
/// the namespace's).
fn per_namespace(sockstat: &str) -> String {
    let mut out = String::new();
    for line in sockstat.lines() {
        let mut words = line.split_whitespace();
        let Some(head) = words.next() else { continue };
        out.push_str(head);
        let rest: Vec<&str> = words.collect();
        for kv in rest.chunks(2) {
            if let [k, v] = kv {
                if !matches!(*k, "orphan" | "alloc" | "mem") {
                    out.push(' ');
                    out.push_str(k);
                    out.push(' ');
                    out.push_str(v);
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The first line of `got` that differs from `reference`, if any.
fn first_difference(reference: &str, got: &str) -> Option<String> {
    let mut file = "";
    let mut a = reference.lines();
    for g in got.lines() {
        if let Some(name) = g.strip_prefix("== ") {
            file = name;
        }
        if a.next() != Some(g) {
            return Some(format!("{file}: {}", g.trim()));
        }
    }
    a.next().map(|l| format!("{file}: (missing) {}", l.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockstat_keeps_only_the_namespace_s_fields() {
        let s = "sockets: used 3\nTCP: inuse 1 orphan 7 tw 2 alloc 9 mem 4\nUDP: inuse 0 mem 12\nFRAG: inuse 0 memory 0\n";
        assert_eq!(per_namespace(s), "sockets: used 3\nTCP: inuse 1 tw 2\nUDP: inuse 0\nFRAG: inuse 0 memory 0\n");
    }

    #[test]
    fn a_reference_must_be_a_fresh_namespace_s() {
        let head = "Inter-|   Receive\n face |bytes    packets\n";
        let fp = |dev: &str, used: u32| format!("== dev\n{head}{dev}== sockstat\nsockets: used {used}\n");
        assert_eq!(fresh_as_expected(&fp("    lo: 0 0 0 0\n", 0)), Ok(()));
        // The host's namespace (another interface), traffic, a socket, nothing read.
        assert!(fresh_as_expected(&fp("    lo: 0 0 0 0\n  eth0: 5 1 0 0\n", 0)).is_err());
        assert!(fresh_as_expected(&fp("    lo: 433 8 0 0\n", 0)).is_err());
        assert!(fresh_as_expected(&fp("    lo: 0 0 0 0\n", 1)).is_err());
        assert!(fresh_as_expected(&fp("", 0)).is_err());
    }

    #[test]
    fn the_first_difference_names_its_file() {
        let a = "== dev\nlo: 0 0\n== snmp\nIp: 0\n";
        assert_eq!(first_difference(a, a), None);
        assert_eq!(first_difference(a, "== dev\nlo: 0 0\n== snmp\nIp: 8\n").as_deref(), Some("snmp: Ip: 8"));
        assert_eq!(first_difference(a, "== dev\nlo: 0 0\n== snmp\n").as_deref(), Some("snmp: (missing) Ip: 0"));
        assert!(first_difference(a, "== dev\nlo: 0 0\n== snmp\nIp: 0\nextra\n").is_some());
    }
}
