//! The sandbox's own minimal `/etc` (instead of the host's, which holds the host's
//! users, keys and configuration): files generated for the function (passwd and group
//! with its user, hosts, resolv.conf, nsswitch.conf, hostname) and, read-only from
//! the host, only what the runtimes need to work: the dynamic loader's cache, CA
//! certificates and the OpenSSL configuration, the timezone, Debian's alternatives
//! (`/usr/bin/java` points through them), the JDK's and Python's configuration
//! directories that `/usr` links into, and a few tables libc and Python read.
//! Never `/etc/ssl/private`, `shadow`, `ssh`, or anything else of the host's.

use std::path::{Path, PathBuf};

use crate::config::{HostFs, RootOp};
use crate::spec::SandboxSpec;

/// Host files and directories bound read-only when they exist (symlinks are
/// replicated as symlinks).
const FROM_HOST: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates.conf",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/os-release",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
    "/etc/locale.alias",
];

/// Host `/etc` entries bound when their name starts with one of these (the JDK's
/// `conf/` links into `/etc/java-17-openjdk`, Debian's Python into `/etc/python3.11`).
const FROM_HOST_PREFIXES: &[&str] = &["java-", "python3"];

/// The generated files, as (path, contents).
pub(crate) fn generated(spec: &SandboxSpec) -> Vec<(PathBuf, String)> {
    let (uid, gid, host) = (spec.uid, spec.gid, &spec.hostname);
    vec![
        (
            "/etc/passwd".into(),
            format!("root:x:0:0:root:/root:/usr/sbin/nologin\nsbx_user:x:{uid}:{gid}:Thaw function:/tmp:/usr/sbin/nologin\n"),
        ),
        ("/etc/group".into(), format!("root:x:0:\nsbx_user:x:{gid}:\n")),
        ("/etc/hosts".into(), format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{host}\n")),
        ("/etc/hostname".into(), format!("{host}\n")),
        // The sandbox has loopback only: no resolver to name.
        ("/etc/resolv.conf".into(), "options timeout:1 attempts:1\n".into()),
        (
            "/etc/nsswitch.conf".into(),
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n"
                .into(),
        ),
    ]
}

/// The mount plan of the minimal `/etc`.
pub(crate) fn plan(spec: &SandboxSpec, fs: &dyn HostFs) -> Vec<RootOp> {
    let mut ops: Vec<RootOp> = generated(spec).into_iter().map(|(dst, data)| RootOp::File { dst, data }).collect();
    let mut host: Vec<PathBuf> = FROM_HOST.iter().map(PathBuf::from).collect();
    let mut extra: Vec<PathBuf> = fs
        .list(Path::new("/etc"))
        .unwrap_or_default()
        .into_iter()
        .filter(|n| FROM_HOST_PREFIXES.iter().any(|p| n.starts_with(p)))
        .map(|n| Path::new("/etc").join(n))
        .collect();
    extra.sort();
    host.extend(extra);
    for p in host {
        match fs.symlink(&p) {
            Ok(Some(target)) => ops.push(RootOp::Symlink { target, dst: p }),
            Ok(None) => {
                if let Ok(dir) = fs.kind(&p) {
                    ops.push(RootOp::Bind { src: p.clone(), dst: p, dir, readonly: true });
                }
            }
            // Absent on this host: nothing to offer.
            Err(_) => {}
        }
    }
    ops
}
