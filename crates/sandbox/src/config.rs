//! The parent → init wire format and the mount plan it carries.
//!
//! The parent resolves everything that needs the host's view (stat of the bind sources,
//! readlink of merged-/usr symlinks) into a list of [`RootOp`]s; the init only executes
//! them. Framing on the config socket: `u32 LE json_len | u32 LE blob_len | json | blob`
//! (the blob is the restore stub's code).
//!
//! Status (init → parent, same socket, CLOEXEC in the init):
//! `EXEC_MARK` right before `execve` (then EOF when exec succeeds), or `STUB_MARK` right
//! before the stub stops; an error record `{"step":..,"errno":..}` ends the stream
//! whenever a step fails, including a failed `execve` after `EXEC_MARK`.
//!
//! A prepared sandbox ([`InitMode::Deferred`], see `prepared.rs`) says `PREPARED_MARK`
//! once its root is built, then reads a second frame of the same framing holding a
//! [`Go`] and the stub, with one mount descriptor per [`Go::binds`] entry attached
//! (SCM_RIGHTS), and goes on as a stub sandbox.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::SandboxError;
use crate::spec::{Entry, SandboxSpec};

/// Status/config socket descriptor in the init (0-3 are as in the program).
pub(crate) const FD_STATUS: i32 = 4;

pub(crate) const EXEC_MARK: u8 = b'X';
pub(crate) const STUB_MARK: u8 = b'S';
pub(crate) const PREPARED_MARK: u8 = b'P';
/// Bytes of the frame header: json_len and blob_len.
pub(crate) const HEADER_LEN: usize = 8;

/// Size of the tmpfs holding the new root (only directories, symlinks and mount points).
pub(crate) const ROOT_TMPFS_OPTS: &str = "size=1m,mode=0755";
const DEV_TMPFS_OPTS: &str = "size=64k,mode=0755";
const DEV_NODES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RootOp {
    /// Bind `src` (host) at `dst` (inside); `dir` says whether to mkdir or create a file;
    /// `readonly` remounts it MS_RDONLY|MS_NOSUID|MS_NODEV.
    Bind { src: PathBuf, dst: PathBuf, dir: bool, readonly: bool },
    Symlink { target: PathBuf, dst: PathBuf },
    /// tmpfs with MS_NOSUID|MS_NODEV (+ MS_NOEXEC when `noexec`).
    Tmpfs { dst: PathBuf, data: String, noexec: bool },
    Proc { dst: PathBuf },
    /// MS_REMOUNT|MS_BIND|MS_RDONLY of an existing mount.
    RemountRo { dst: PathBuf },
    /// A regular file created in the root tmpfs (mode 0644) holding `data`.
    File { dst: PathBuf, data: String },
    /// An empty directory, mount point of a bind attached later (a prepared sandbox's
    /// /var/task).
    Dir { dst: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum InitMode {
    Exec { argv: Vec<String> },
    Stub { addr: u64, len: usize },
    /// Build the root without the function's code, report `PREPARED_MARK`, and wait
    /// for a [`Go`].
    Deferred,
}

/// The second frame a prepared sandbox's init reads: where to attach the mounts sent
/// with it (in order), and the stub to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Go {
    /// Mount points inside the sandbox, one per attached descriptor; `dir` says
    /// whether to create a directory or a file there (if absent). Attached read-only.
    pub binds: Vec<(PathBuf, bool)>,
    pub addr: u64,
    pub len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InitConfig {
    /// Host directory on which the root tmpfs is mounted.
    pub root: PathBuf,
    pub ops: Vec<RootOp>,
    pub hostname: String,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub env: Vec<(String, String)>,
    pub mode: InitMode,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StatusError {
    pub step: String,
    pub errno: i32,
}

/// How a host path is to be mounted; filled by the parent with one stat each.
pub(crate) trait HostFs {
    /// `Some(true)` for a directory, `Some(false)` for another file (following symlinks).
    fn kind(&self, p: &Path) -> std::io::Result<bool>;
    /// `Ok(Some(target))` if `p` itself is a symlink, `Ok(None)` if it is something else.
    fn symlink(&self, p: &Path) -> std::io::Result<Option<PathBuf>>;
    /// Names in directory `p`.
    fn list(&self, _p: &Path) -> std::io::Result<Vec<String>> {
        Ok(Vec::new())
    }
    /// The minimal /etc planned as `ops`, staged as one host directory (see
    /// `etc::stage`); `None`: mount it entry by entry.
    fn stage_etc(&self, _spec: &SandboxSpec, _ops: &[RootOp]) -> Option<PathBuf> {
        None
    }
}

pub(crate) struct RealFs;

impl HostFs for RealFs {
    fn kind(&self, p: &Path) -> std::io::Result<bool> {
        Ok(std::fs::metadata(p)?.is_dir())
    }
    fn symlink(&self, p: &Path) -> std::io::Result<Option<PathBuf>> {
        let m = std::fs::symlink_metadata(p)?;
        if m.file_type().is_symlink() {
            Ok(Some(std::fs::read_link(p)?))
        } else {
            Ok(None)
        }
    }
    fn list(&self, p: &Path) -> std::io::Result<Vec<String>> {
        std::fs::read_dir(p)?.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned())).collect()
    }
    fn stage_etc(&self, spec: &SandboxSpec, ops: &[RootOp]) -> Option<PathBuf> {
        // The entry-by-entry mounts, for comparison (bench/env_ab.py etc-staging THAW_NO_ETC_STAGING=1).
        if std::env::var_os("THAW_NO_ETC_STAGING").is_some() {
            return None;
        }
        // Beside the sandboxes' directory (not in it: stale sandboxes are swept there).
        let base = spec.run_dir.parent().unwrap_or(Path::new("/run/thaw")).join("etc");
        match crate::etc::stage(ops, &base) {
            Ok(dir) => Some(dir),
            Err(e) => {
                tracing::warn!(error = %e, cause = %e.source, "cannot stage the minimal /etc; binding it entry by entry");
                None
            }
        }
    }
}

/// Builds the mount plan, checking every host source exists. `deferred`: the code
/// directory is attached later (a prepared sandbox); /var/task is only a mount point.
pub(crate) fn plan(spec: &SandboxSpec, fs: &dyn HostFs, deferred: bool) -> Result<Vec<RootOp>, SandboxError> {
    let host_err = |what: &'static str, path: &Path| {
        let id = spec.id.clone();
        let path = path.to_path_buf();
        move |source| SandboxError::HostPath { id, what, path, source }
    };
    let mut ops = Vec::new();
    for p in &spec.ro_binds {
        let dir = fs.kind(p).map_err(host_err("ro_bind", p))?;
        ops.push(RootOp::Bind { src: p.clone(), dst: p.clone(), dir, readonly: true });
    }
    if spec.minimal_etc && !spec.ro_binds.iter().any(|p| p == Path::new("/etc")) {
        let etc = crate::etc::plan(spec, fs);
        match fs.stage_etc(spec, &etc) {
            Some(src) => ops.push(RootOp::Bind { src, dst: PathBuf::from("/etc"), dir: true, readonly: true }),
            None => ops.extend(etc),
        }
    }
    for p in &spec.root_links {
        if spec.ro_binds.contains(p) {
            continue;
        }
        match fs.symlink(p) {
            Ok(Some(target)) => ops.push(RootOp::Symlink { target, dst: p.clone() }),
            Ok(None) => {
                let dir = fs.kind(p).map_err(host_err("root link", p))?;
                ops.push(RootOp::Bind { src: p.clone(), dst: p.clone(), dir, readonly: true });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(host_err("root link", p)(e)),
        }
    }
    let dir_only = |what: &'static str, p: &Path| -> Result<(), SandboxError> {
        match fs.kind(p) {
            Ok(true) => Ok(()),
            Ok(false) => Err(host_err(what, p)(std::io::Error::from_raw_os_error(libc::ENOTDIR))),
            Err(e) => Err(host_err(what, p)(e)),
        }
    };
    if deferred {
        ops.push(RootOp::Dir { dst: CODE_DIR.into() });
        ops.push(RootOp::Dir { dst: OPT_DIR.into() });
    } else {
        dir_only("code_dir", &spec.code_dir)?;
        ops.push(RootOp::Bind { src: spec.code_dir.clone(), dst: CODE_DIR.into(), dir: true, readonly: true });
        match &spec.opt_dir {
            Some(opt) => {
                dir_only("opt_dir", opt)?;
                ops.push(RootOp::Bind { src: opt.clone(), dst: OPT_DIR.into(), dir: true, readonly: true });
            }
            // As in Lambda, /opt exists (empty) without layers.
            None => ops.push(RootOp::Dir { dst: OPT_DIR.into() }),
        }
    }
    if let Some(rt) = &spec.runtime_dir {
        dir_only("runtime_dir", rt)?;
        ops.push(RootOp::Bind { src: rt.clone(), dst: "/var/runtime".into(), dir: true, readonly: true });
    }
    ops.push(RootOp::Tmpfs { dst: "/tmp".into(), data: format!("size={}m,mode=1777", spec.tmp_size_mb), noexec: false });
    ops.push(RootOp::Tmpfs { dst: "/dev".into(), data: DEV_TMPFS_OPTS.into(), noexec: true });
    for n in DEV_NODES {
        let p = Path::new("/dev").join(n);
        ops.push(RootOp::Bind { src: p.clone(), dst: p, dir: false, readonly: false });
    }
    for (name, target) in
        [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")]
    {
        ops.push(RootOp::Symlink { target: target.into(), dst: Path::new("/dev").join(name) });
    }
    ops.push(RootOp::Tmpfs { dst: "/dev/shm".into(), data: format!("size={}m,mode=1777", spec.tmp_size_mb), noexec: true });
    ops.push(RootOp::RemountRo { dst: "/dev".into() });
    ops.push(RootOp::Proc { dst: "/proc".into() });
    Ok(ops)
}

/// Where the function's code is mounted inside every sandbox.
pub(crate) const CODE_DIR: &str = "/var/task";
/// Where the function's layers are mounted (when it has any).
pub(crate) const OPT_DIR: &str = "/opt";

/// The init's configuration; `entry` `None`: a prepared sandbox ([`InitMode::Deferred`]).
pub(crate) fn init_config(spec: &SandboxSpec, entry: Option<&Entry>, root: PathBuf, ops: Vec<RootOp>) -> InitConfig {
    let mode = match entry {
        Some(Entry::Exec { argv }) => InitMode::Exec { argv: argv.clone() },
        Some(Entry::Stub { addr, len, .. }) => InitMode::Stub { addr: *addr, len: *len },
        None => InitMode::Deferred,
    };
    InitConfig {
        root,
        ops,
        hostname: spec.hostname.clone(),
        cwd: spec.cwd.clone(),
        uid: spec.uid,
        gid: spec.gid,
        env: spec.env.clone(),
        mode,
    }
}

/// One frame: `u32 LE json_len | u32 LE blob_len | json | blob`.
pub(crate) fn encode<T: Serialize>(msg: &T, blob: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(msg).expect("init messages serialize");
    let mut out = Vec::with_capacity(HEADER_LEN + json.len() + blob.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&(blob.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(blob);
    out
}

/// How many bytes follow a frame's header.
pub(crate) fn body_len(header: &[u8; HEADER_LEN]) -> usize {
    let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes")) as usize;
    word(0).saturating_add(word(4))
}

/// A whole frame (header included) back into its message and blob.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<(T, &[u8]), String> {
    let header: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN).ok_or("truncated header")?.try_into().expect("8 bytes");
    let json_len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let body = &bytes[HEADER_LEN..];
    if body.len() != body_len(header) {
        return Err(format!("frame of {} bytes, header says {}", body.len(), body_len(header)));
    }
    let msg = serde_json::from_slice(&body[..json_len]).map_err(|e| e.to_string())?;
    Ok((msg, &body[json_len..]))
}

/// JSON prefix of an error record whose errno digits and `}` are appended by
/// async-signal-safe code in the pre-exec child.
pub(crate) fn error_prefix(step: &str) -> Vec<u8> {
    let mut v = b"{\"step\":".to_vec();
    v.extend_from_slice(&serde_json::to_vec(step).expect("string serializes"));
    v.extend_from_slice(b",\"errno\":");
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct FakeFs(HashMap<&'static str, Result<Option<&'static str>, bool>>);
    // value: Err(is_dir) = plain dir/file, Ok(Some(t)) = symlink to t; absent = ENOENT.
    impl HostFs for FakeFs {
        fn kind(&self, p: &Path) -> std::io::Result<bool> {
            match self.0.get(p.to_str().unwrap()) {
                Some(Err(d)) => Ok(*d),
                Some(Ok(_)) => Ok(true),
                None => Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
            }
        }
        fn symlink(&self, p: &Path) -> std::io::Result<Option<PathBuf>> {
            match self.0.get(p.to_str().unwrap()) {
                Some(Ok(Some(t))) => Ok(Some(PathBuf::from(t))),
                Some(_) => Ok(None),
                None => Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
            }
        }
    }

    #[test]
    fn minimal_etc_has_generated_files_and_only_listed_host_entries() {
        let mut fs = host();
        fs.0.insert("/etc/ld.so.cache", Err(false));
        fs.0.insert("/etc/ssl/certs", Err(true));
        fs.0.insert("/etc/localtime", Ok(Some("/usr/share/zoneinfo/Etc/UTC")));
        fs.0.insert("/etc/shadow", Err(false));
        fs.0.insert("/etc/ssl/private", Err(true));
        let spec = SandboxSpec::new("p", "/code");
        let ops = plan(&spec, &fs, false).unwrap();
        assert!(!ops.iter().any(|o| matches!(o, RootOp::Bind { src, .. } if src == Path::new("/etc"))));
        let passwd = ops.iter().find_map(|o| match o {
            RootOp::File { dst, data } if dst == Path::new("/etc/passwd") => Some(data.clone()),
            _ => None,
        });
        assert!(passwd.unwrap().contains("sbx_user:x:65534:65534:"));
        assert!(ops.contains(&RootOp::Bind { src: "/etc/ld.so.cache".into(), dst: "/etc/ld.so.cache".into(), dir: false, readonly: true }));
        assert!(ops.contains(&RootOp::Bind { src: "/etc/ssl/certs".into(), dst: "/etc/ssl/certs".into(), dir: true, readonly: true }));
        assert!(ops.contains(&RootOp::Symlink { target: "/usr/share/zoneinfo/Etc/UTC".into(), dst: "/etc/localtime".into() }));
        let mentions = |p: &str| ops.iter().any(|o| !matches!(o, RootOp::File { .. }) && format!("{o:?}").contains(p));
        assert!(!mentions("shadow") && !mentions("private"));
    }

    /// `FakeFs` whose minimal /etc stages to `/run/thaw/etc/k` (counting the calls).
    struct StagingFs(FakeFs, std::cell::Cell<usize>);
    impl HostFs for StagingFs {
        fn kind(&self, p: &Path) -> std::io::Result<bool> {
            self.0.kind(p)
        }
        fn symlink(&self, p: &Path) -> std::io::Result<Option<PathBuf>> {
            self.0.symlink(p)
        }
        fn stage_etc(&self, _spec: &SandboxSpec, ops: &[RootOp]) -> Option<PathBuf> {
            assert!(ops.iter().any(|o| matches!(o, RootOp::File { dst, .. } if dst == Path::new("/etc/passwd"))));
            self.1.set(self.1.get() + 1);
            Some("/run/thaw/etc/k".into())
        }
    }

    #[test]
    fn staged_minimal_etc_is_one_readonly_bind_unless_the_host_etc_is_bound() {
        let mut fs = host();
        fs.0.insert("/etc/ld.so.cache", Err(false));
        fs.0.insert("/etc/ssl/certs", Err(true));
        let fs = StagingFs(fs, Default::default());
        let ops = plan(&SandboxSpec::new("p", "/code"), &fs, false).unwrap();
        let on_etc: Vec<_> = ops.iter().filter(|o| format!("{o:?}").contains("\"/etc")).collect();
        assert_eq!(on_etc, [&RootOp::Bind { src: "/run/thaw/etc/k".into(), dst: "/etc".into(), dir: true, readonly: true }]);
        assert_eq!(fs.1.get(), 1);

        // The host's /etc bound explicitly: no minimal one, staged or not.
        let mut spec = SandboxSpec::new("p", "/code");
        spec.ro_binds.push("/etc".into());
        let ops = plan(&spec, &fs, false).unwrap();
        assert!(!ops.iter().any(|o| format!("{o:?}").contains("/run/thaw/etc")));
        assert_eq!(fs.1.get(), 1, "not staged");
    }

    fn host() -> FakeFs {
        FakeFs(HashMap::from([
            ("/usr", Err(true)),
            ("/etc", Err(true)),
            ("/bin", Ok(Some("usr/bin"))),
            ("/lib", Ok(Some("usr/lib"))),
            ("/sbin", Err(true)),
            ("/code", Err(true)),
            ("/file", Err(false)),
        ]))
    }

    #[test]
    fn plan_replicates_merged_usr_and_binds_the_rest() {
        let mut spec = SandboxSpec::new("p", "/code");
        spec.ro_binds.push("/etc".into()); // the host's /etc, whole
        let ops = plan(&spec, &host(), false).unwrap();
        let bind = |s: &str, d: &str| RootOp::Bind { src: s.into(), dst: d.into(), dir: true, readonly: true };
        assert_eq!(ops[0], bind("/usr", "/usr"));
        assert_eq!(ops[1], bind("/etc", "/etc"));
        assert_eq!(ops[2], RootOp::Symlink { target: "usr/bin".into(), dst: "/bin".into() });
        assert_eq!(ops[3], RootOp::Symlink { target: "usr/lib".into(), dst: "/lib".into() });
        // /lib64 is absent on this fake host: skipped. /sbin is a real dir: bound.
        assert_eq!(ops[4], bind("/sbin", "/sbin"));
        assert_eq!(ops[5], bind("/code", "/var/task"));
        assert!(ops.contains(&RootOp::Tmpfs { dst: "/tmp".into(), data: "size=64m,mode=1777".into(), noexec: false }));
        assert!(ops.contains(&RootOp::Proc { dst: "/proc".into() }));
        assert!(ops.contains(&RootOp::Symlink { target: "/proc/self/fd".into(), dst: "/dev/fd".into() }));
        let ro = ops.iter().position(|o| *o == RootOp::RemountRo { dst: "/dev".into() }).unwrap();
        let shm = ops.iter().position(|o| matches!(o, RootOp::Tmpfs { dst, .. } if dst == Path::new("/dev/shm"))).unwrap();
        assert!(shm < ro, "/dev is made read-only after everything is created in it");
    }

    #[test]
    fn plan_rejects_missing_or_non_dir_code() {
        let spec = SandboxSpec::new("p", "/nope");
        let e = plan(&spec, &host(), false).unwrap_err();
        assert_eq!(e.to_string(), "sandbox p: code_dir /nope");
        assert_eq!(std::error::Error::source(&e).unwrap().to_string(), "No such file or directory (os error 2)");
        // A prepared sandbox's plan does not look at the code: /var/task is a mount point.
        let ops = plan(&SandboxSpec::new("p", "/nope"), &host(), true).unwrap();
        assert!(ops.contains(&RootOp::Dir { dst: "/var/task".into() }));
        assert!(!ops.iter().any(|o| format!("{o:?}").contains("/nope")));
        let spec = SandboxSpec::new("p", "/file");
        let e = plan(&spec, &host(), false).unwrap_err();
        assert_eq!(std::error::Error::source(&e).unwrap().to_string(), "Not a directory (os error 20)");
        let mut spec = SandboxSpec::new("p", "/code");
        spec.ro_binds.push("/file".into());
        let ops = plan(&spec, &host(), false).unwrap();
        assert!(ops.contains(&RootOp::Bind { src: "/file".into(), dst: "/file".into(), dir: false, readonly: true }));
    }

    #[test]
    fn wire_roundtrip() {
        let spec = SandboxSpec::new("p", "/code");
        let cfg = init_config(&spec, Some(&Entry::Stub { addr: 0x1000, len: 3, blob: vec![] }), "/r/p".into(), vec![]);
        let bytes = encode(&cfg, &[1, 2, 3]);
        let (back, blob) = decode::<InitConfig>(&bytes).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(blob, &[1, 2, 3]);
        assert!(decode::<InitConfig>(&bytes[..3]).is_err());
        assert!(decode::<InitConfig>(&bytes[..bytes.len() - 1]).is_err(), "a short frame is refused");
        let go = Go { binds: vec![("/var/task".into(), true)], addr: 0x2000, len: 1 };
        let frame = encode(&go, &[]);
        let (back, blob) = decode::<Go>(&frame).unwrap();
        assert_eq!((back, blob), (go, &[][..]));
    }

    #[test]
    fn error_prefix_is_json_once_completed() {
        let mut v = error_prefix("execve \"/x\"");
        v.extend_from_slice(b"2}");
        let e: StatusError = serde_json::from_slice(&v).unwrap();
        assert_eq!(e, StatusError { step: "execve \"/x\"".into(), errno: 2 });
    }
}
