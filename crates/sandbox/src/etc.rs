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
use crate::error::EtcStageError;
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

/// Staging: the minimal `/etc` built once as a host directory and bound read-only as
/// one mount, instead of ~20 file writes and read-only binds per sandbox (they made
/// every sandbox, and so every restore, ~0.9 ms slower: restore 5.3 -> 6.2 ms).
///
/// The directory is `<base>/<key>`, where the key hashes the plan (the generated
/// files' contents, so the uid, gid and hostname; the host entries) and the metadata
/// (path, type, size, mtime, mode, link target) of every host entry it copies and of
/// the directories below them (see [`describe`]), so a changed host entry gives a new
/// directory at the next node start. Within one process the directory of a plan
/// is looked up by the plan alone: host changes while a node runs are seen after a
/// restart (the old binds saw them at once). Directories are built under a temporary
/// name and renamed into place; a creator that loses the race uses the winner's.
/// Modes are explicit (the host's for copies, less any group/other write bit; 0755
/// for the directories staging makes, 0644 for generated files): the node runs with
/// umask 077. Everything is owned by the node's user (root), so nothing in it is
/// writable by the function's uid. Old directories (a few MB on tmpfs) are left for
/// the operator; `/run` is emptied at boot.
pub(crate) fn stage(ops: &[RootOp], base: &Path) -> Result<PathBuf, EtcStageError> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static STAGED: Mutex<Option<HashMap<u64, PathBuf>>> = Mutex::new(None);
    let t0 = std::time::Instant::now();
    let plan_key = hash_of(&format!("{ops:?}{}", base.display()));
    if let Some(dir) = STAGED.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).get(&plan_key) {
        if dir.is_dir() {
            return Ok(dir.clone());
        }
    }
    let mut meta = String::new();
    for op in ops {
        if let RootOp::Bind { src, .. } = op {
            describe(src, &mut meta)?;
        }
    }
    let dir = base.join(format!("{:016x}", hash_of(&format!("{ops:?}{meta}"))));
    if !dir.is_dir() {
        build(ops, base, &dir)?;
    }
    STAGED.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(plan_key, dir.clone());
    tracing::debug!(dir = %dir.display(), ms = t0.elapsed().as_secs_f64() * 1e3, "minimal /etc staged");
    Ok(dir)
}

fn hash_of(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// The error of `op` on `path`.
fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> EtcStageError + 'a {
    move |source| EtcStageError { op, path: path.to_path_buf(), source }
}

/// Append the metadata of `p` and, for a directory, of the directories below it (a
/// file replaced by rename, as dpkg and update-ca-certificates do, or added or
/// removed, changes its directory's mtime; a file edited in place is not noticed
/// until /run is emptied). Directory entries come from getdents alone: staging an
/// already staged /etc costs a few dozen syscalls, not one per certificate.
fn describe(p: &Path, out: &mut String) -> Result<(), EtcStageError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).map_err(at("stat", p))?;
    let link = if m.file_type().is_symlink() {
        std::fs::read_link(p).map_err(at("readlink", p))?.display().to_string()
    } else {
        String::new()
    };
    out.push_str(&format!("{}|{:o}|{}|{}.{}|{}\n", p.display(), m.mode(), m.size(), m.mtime(), m.mtime_nsec(), link));
    if m.is_dir() {
        let mut subdirs = vec![];
        for e in std::fs::read_dir(p).map_err(at("read directory", p))? {
            let e = e.map_err(at("read directory", p))?;
            if e.file_type().map_err(at("read directory", p))?.is_dir() {
                subdirs.push(e.path());
            }
        }
        subdirs.sort();
        for d in subdirs {
            describe(&d, out)?;
        }
    }
    Ok(())
}

/// Set the mode of `p` (no symlink) to `mode`.
fn chmod(p: &Path, mode: u32) -> Result<(), EtcStageError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(at("chmod", p))
}

/// Materialise `ops` (paths under /etc) into `dir`, through a temporary directory.
fn build(ops: &[RootOp], base: &Path, dir: &Path) -> Result<(), EtcStageError> {
    let mkdir = |p: &Path| -> Result<(), EtcStageError> {
        std::fs::create_dir_all(p).map_err(at("mkdir", p))?;
        chmod(p, 0o755)
    };
    mkdir(base)?;
    let tmp = base.join(format!(".partial-{}-{:?}", std::process::id(), std::thread::current().id()));
    let _ = std::fs::remove_dir_all(&tmp);
    mkdir(&tmp)?;
    let inside = |p: &Path| tmp.join(p.strip_prefix("/etc").unwrap_or(p));
    let result = (|| {
        for op in ops {
            match op {
                RootOp::File { dst, data } => {
                    let to = inside(dst);
                    mkdir(to.parent().unwrap_or(&tmp))?;
                    std::fs::write(&to, data).map_err(at("write", &to))?;
                    chmod(&to, 0o644)?;
                }
                RootOp::Symlink { target, dst } => {
                    let to = inside(dst);
                    mkdir(to.parent().unwrap_or(&tmp))?;
                    std::os::unix::fs::symlink(target, &to).map_err(at("symlink", &to))?;
                }
                RootOp::Bind { src, dst, .. } => {
                    let to = inside(dst);
                    mkdir(to.parent().unwrap_or(&tmp))?;
                    copy(src, &to)?;
                }
                other => {
                    let what = std::io::Error::other(format!("cannot stage {other:?} into /etc"));
                    return Err(at("plan", base)(what));
                }
            }
        }
        match std::fs::rename(&tmp, dir) {
            Ok(()) => Ok(()),
            // Another creator won: theirs has the same contents.
            Err(_) if dir.is_dir() => Ok(()),
            Err(e) => Err(at("rename into place", dir)(e)),
        }
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Copy `src` (a file, a symlink or a directory tree) to `to` with the host's modes
/// (what the function's user could not read on the host it cannot read here either)
/// less any group/other write bit.
fn copy(src: &Path, to: &Path) -> Result<(), EtcStageError> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::symlink_metadata(src).map_err(at("stat", src))?;
    let mode = m.permissions().mode() & 0o755;
    if m.file_type().is_symlink() {
        let target = std::fs::read_link(src).map_err(at("readlink", src))?;
        std::os::unix::fs::symlink(target, to).map_err(at("symlink", to))
    } else if m.is_dir() {
        std::fs::create_dir(to).map_err(at("mkdir", to))?;
        for e in std::fs::read_dir(src).map_err(at("read directory", src))? {
            let e = e.map_err(at("read directory", src))?;
            copy(&e.path(), &to.join(e.file_name()))?;
        }
        chmod(to, mode)
    } else if m.is_file() {
        std::fs::copy(src, to).map_err(at("copy to", to))?;
        chmod(to, mode)
    } else {
        Err(at("copy", src)(std::io::Error::other("neither a file, a directory nor a symlink")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn ops(host: &Path, user: &str) -> Vec<RootOp> {
        vec![
            RootOp::File { dst: "/etc/passwd".into(), data: format!("{user}:x:1:1::/tmp:/bin/false\n") },
            RootOp::Symlink { target: "/usr/share/zoneinfo/UTC".into(), dst: "/etc/localtime".into() },
            RootOp::Bind { src: host.join("certs"), dst: "/etc/ssl/certs".into(), dir: true, readonly: true },
            RootOp::Bind { src: host.join("secret.conf"), dst: "/etc/secret.conf".into(), dir: false, readonly: true },
        ]
    }

    #[test]
    fn staging_copies_the_plan_once_with_host_modes_and_a_new_key_per_change() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host");
        std::fs::create_dir_all(host.join("certs")).unwrap();
        std::fs::write(host.join("certs/ca.pem"), "CA").unwrap();
        std::os::unix::fs::symlink("ca.pem", host.join("certs/abcd.0")).unwrap();
        std::fs::write(host.join("secret.conf"), "only root").unwrap();
        std::fs::set_permissions(host.join("secret.conf"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(host.join("certs/ca.pem"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let base = t.path().join("stage");

        let a = stage(&ops(&host, "alice"), &base).unwrap();
        assert_eq!(std::fs::read_to_string(a.join("passwd")).unwrap(), "alice:x:1:1::/tmp:/bin/false\n");
        assert_eq!(std::fs::read_link(a.join("localtime")).unwrap(), Path::new("/usr/share/zoneinfo/UTC"));
        assert_eq!(std::fs::read_to_string(a.join("ssl/certs/ca.pem")).unwrap(), "CA");
        assert_eq!(std::fs::read_link(a.join("ssl/certs/abcd.0")).unwrap(), Path::new("ca.pem"));
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&a.join("passwd")), 0o644);
        assert_eq!(mode(&a.join("ssl")), 0o755);
        assert_eq!(mode(&a.join("ssl/certs/ca.pem")), 0o644);
        assert_eq!(mode(&a.join("secret.conf")), 0o600, "a host file others cannot read stays so");
        assert_eq!(mode(&a), 0o755);

        // The same plan again (this process, or another one racing): the same directory.
        assert_eq!(stage(&ops(&host, "alice"), &base).unwrap(), a);
        let racers: Vec<_> = (0..4).map(|_| {
            let (h, b) = (host.clone(), base.clone());
            std::thread::spawn(move || stage(&ops(&h, "bob"), &b).unwrap())
        }).collect();
        let dirs: Vec<PathBuf> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        assert!(dirs.iter().all(|d| d == &dirs[0]) && dirs[0] != a, "{dirs:?}");
        assert_eq!(std::fs::read_to_string(dirs[0].join("passwd")).unwrap(), "bob:x:1:1::/tmp:/bin/false\n");
        let entries: Vec<_> = std::fs::read_dir(&base).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries.len(), 2, "no partial directory is left: {entries:?}");
    }

    /// Every path below `dir` (not following symlinks).
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.push(p.clone());
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                walk(&p, out);
            }
        }
    }

    #[test]
    fn staged_generated_files_key_on_uid_and_hostname_and_nothing_is_writable_by_others() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host");
        std::fs::create_dir_all(host.join("conf.d")).unwrap();
        std::fs::write(host.join("conf.d/open.conf"), "x").unwrap();
        std::fs::set_permissions(host.join("conf.d/open.conf"), std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::set_permissions(host.join("conf.d"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let base = t.path().join("stage");
        let staged = |spec: &SandboxSpec| {
            let mut ops: Vec<RootOp> =
                generated(spec).into_iter().map(|(dst, data)| RootOp::File { dst, data }).collect();
            ops.push(RootOp::Bind { src: host.join("conf.d"), dst: "/etc/conf.d".into(), dir: true, readonly: true });
            stage(&ops, &base).unwrap()
        };
        let spec = SandboxSpec::new("p", "/code");
        let a = staged(&spec);
        for (path, data) in generated(&spec) {
            assert_eq!(std::fs::read_to_string(a.join(path.strip_prefix("/etc").unwrap())).unwrap(), data);
        }
        let mut all = vec![a.clone()];
        walk(&a, &mut all);
        for p in &all {
            let m = std::fs::symlink_metadata(p).unwrap();
            assert!(m.file_type().is_symlink() || m.permissions().mode() & 0o022 == 0, "{} is writable by others", p.display());
        }
        assert_eq!(staged(&spec), a, "the same spec: the same directory");
        let mut other_uid = spec.clone();
        other_uid.uid = 1000;
        let mut other_host = spec.clone();
        other_host.hostname = "fn-2".into();
        let (b, c) = (staged(&other_uid), staged(&other_host));
        assert!(a != b && a != c && b != c, "{a:?} {b:?} {c:?}");
        assert!(std::fs::read_to_string(b.join("passwd")).unwrap().contains(":1000:"));
        assert!(std::fs::read_to_string(c.join("hostname")).unwrap().starts_with("fn-2"));
    }
}
