//! Network namespaces for tests whose agents run as if each were on a machine of its
//! own (issue #29): a bridge in the test's namespace holds [`Net::host`] (`.1`), and
//! each agent's namespace is joined to it by a veth pair, at [`Net::addr`] (`.10 + i`).
//! What the agents use (the apiserver, MinIO) listens on the host address; the
//! gateways, in the test's namespace, reach each agent at its own. Programs enter a
//! namespace with `nsenter --net` (only the network changes: mounts, /sys and the
//! cgroups stay the test's, which `ip netns exec` would remount). Everything is
//! deleted on drop; scripts/test.sh removes what a killed test left
//! (`thaw-test-PID-*` namespaces and `thbPID*` bridges whose process is gone).
//! Needs root, `ip` and `nsenter`.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Networks made by this process so far (each gets a subnet and names of its own).
static MADE: AtomicU32 = AtomicU32::new(0);

pub struct Net {
    bridge: String,
    prefix: String,
    namespaces: Vec<String>,
    veths: Vec<String>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Net {
    /// A bridge and `n` namespaces joined to it.
    pub fn new(n: usize) -> Net {
        let pid = std::process::id();
        let k = MADE.fetch_add(1, Ordering::Relaxed);
        assert!(n < 10 && k < 100, "at most 9 namespaces per network and 99 networks per test process");
        // 10.(100 + pid % 100).k.0/24: distinct within this process, and across
        // processes unless their pids collide modulo 100 at the same k.
        let prefix = format!("10.{}.{}", 100 + pid % 100, k);
        let mut net = Net { bridge: format!("thb{pid}n{k}"), prefix, namespaces: Vec::new(), veths: Vec::new() };
        ip(&["link", "add", &net.bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}/24", net.host()), "dev", &net.bridge]);
        ip(&["link", "set", &net.bridge, "up"]);
        for i in 0..n {
            let ns = format!("thaw-test-{pid}-{k}-{i}");
            let veth = format!("thv{pid}n{k}x{i}");
            ip(&["netns", "add", &ns]);
            net.namespaces.push(ns.clone());
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            net.veths.push(veth.clone());
            ip(&["link", "set", &veth, "master", &net.bridge, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", net.addr(i)), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// The test's own address on the bridge.
    pub fn host(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// Namespace `i`'s address.
    pub fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, 10 + i)
    }

    /// `program` to run in namespace `i`.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.namespaces[i])).arg("--").arg(program);
        c
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for v in &self.veths {
            let _ = Command::new("ip").args(["link", "del", v]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}
