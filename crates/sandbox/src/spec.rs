//! What a sandbox looks like: [`SandboxSpec`], [`Limits`] and the [`Entry`] point.

use std::path::{Path, PathBuf};

use crate::error::SandboxError;

/// Resource limits applied through cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Memory limit (no swap), MiB. Default 512.
    pub memory_mb: u64,
    /// CPU bandwidth in milli-cores; 1000 = one core. Default 1000.
    pub cpu_millis: u64,
    /// Maximum number of tasks. Default 256.
    pub pids_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { memory_mb: 512, cpu_millis: 1000, pids_max: 256 }
    }
}

/// Everything needed to build one sandbox. Construct with [`SandboxSpec::new`] or
/// `SandboxSpec { id, code_dir, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Unique id, `[a-zA-Z0-9_-]{1,64}`; names the cgroup and the root directory.
    pub id: String,
    /// Program exec'd as the sandbox init (it must call [`crate::sandbox_init_main`]).
    pub init_exe: PathBuf,
    /// Extra argv passed to `init_exe` after argv\[0\].
    pub init_args: Vec<String>,
    /// Host directory bind-mounted read-only at `/var/task`.
    pub code_dir: PathBuf,
    /// Host directory bind-mounted read-only at `/var/runtime`.
    pub runtime_dir: Option<PathBuf>,
    /// Host directory bind-mounted read-only at `/opt` (the function's Lambda layers,
    /// extracted in order). `None`: `/opt` is an empty directory.
    pub opt_dir: Option<PathBuf>,
    /// Host paths bind-mounted read-only at the same path. Default `/usr`.
    pub ro_binds: Vec<PathBuf>,
    /// Give the sandbox its own minimal `/etc` (see `etc.rs`) rather than none. Default
    /// true; ignored when `ro_binds` holds `/etc` (the host's, whole).
    pub minimal_etc: bool,
    /// Top-level paths replicated as symlinks when they are symlinks on the host
    /// (merged-/usr), else bind-mounted read-only; skipped when absent.
    /// Default `/bin`, `/lib`, `/lib64`, `/sbin`.
    pub root_links: Vec<PathBuf>,
    /// Size of the private tmpfs at `/tmp`, MiB. Default 64.
    pub tmp_size_mb: u64,
    /// cgroup limits.
    pub limits: Limits,
    /// Unprivileged identity of the program (Exec only). Default 65534.
    pub uid: u32,
    /// Default 65534.
    pub gid: u32,
    /// The complete environment of the program.
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox. Default `/var/task`.
    pub cwd: PathBuf,
    /// UTS hostname. Default `thaw`.
    pub hostname: String,
    /// cgroup filesystem root. Default `/sys/fs/cgroup` (v2 if `cgroup.controllers` exists there).
    pub cgroup_root: PathBuf,
    /// Host directory under which `<id>` is created as the mount point of the new root.
    /// Default `/run/thaw/sandboxes`.
    pub run_dir: PathBuf,
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            id: String::new(),
            init_exe: PathBuf::from("/proc/self/exe"),
            init_args: Vec::new(),
            code_dir: PathBuf::new(),
            runtime_dir: None,
            opt_dir: None,
            ro_binds: vec![PathBuf::from("/usr")],
            minimal_etc: true,
            root_links: ["/bin", "/lib", "/lib64", "/sbin"].iter().map(PathBuf::from).collect(),
            tmp_size_mb: 64,
            limits: Limits::default(),
            uid: 65534,
            gid: 65534,
            env: Vec::new(),
            cwd: PathBuf::from("/var/task"),
            hostname: "thaw".to_string(),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            run_dir: PathBuf::from("/run/thaw/sandboxes"),
        }
    }
}

/// What the sandbox runs once its environment is set up.
#[derive(Debug, Clone)]
pub enum Entry {
    /// exec `argv[0]` (absolute path inside the sandbox) with `spec.env`, as `uid`/`gid`.
    Exec { argv: Vec<String> },
    /// Restore stub: full setup except dropping root, then `blob` is copied into a fresh
    /// RWX private anonymous mapping at `addr` (`len` rounded up to pages), the process
    /// sets `PR_SET_PDEATHSIG(SIGKILL)`, calls `PTRACE_TRACEME` and stops itself with
    /// `SIGSTOP`. If it is ever resumed normally it `_exit(127)`s.
    Stub { addr: u64, len: usize, blob: Vec<u8> },
}

pub(crate) const PAGE_SIZE: u64 = 4096;

impl SandboxSpec {
    /// A spec with defaults, the given id and code directory.
    pub fn new(id: impl Into<String>, code_dir: impl Into<PathBuf>) -> Self {
        SandboxSpec { id: id.into(), code_dir: code_dir.into(), ..Default::default() }
    }

    /// Checks the spec without touching the filesystem.
    pub fn validate(&self) -> Result<(), SandboxError> {
        let bad = |reason: String| Err(SandboxError::InvalidSpec { id: self.id.clone(), reason });
        if self.id.is_empty()
            || self.id.len() > 64
            || !self.id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return bad("id must be 1-64 characters of [a-zA-Z0-9_-]".into());
        }
        let abs = |what: &str, p: &Path| -> Result<(), SandboxError> {
            if !p.is_absolute() || p.as_os_str().as_encoded_bytes().contains(&0) {
                return Err(SandboxError::InvalidSpec {
                    id: self.id.clone(),
                    reason: format!("{what} must be an absolute path without NUL: {}", p.display()),
                });
            }
            Ok(())
        };
        abs("code_dir", &self.code_dir)?;
        if let Some(r) = &self.runtime_dir {
            abs("runtime_dir", r)?;
        }
        if let Some(o) = &self.opt_dir {
            abs("opt_dir", o)?;
        }
        for p in self.ro_binds.iter().chain(&self.root_links) {
            abs("bind path", p)?;
            if p == Path::new("/") {
                return bad("cannot bind-mount /".into());
            }
        }
        abs("cwd", &self.cwd)?;
        if self.hostname.is_empty() || self.hostname.len() > 64 {
            return bad("hostname must be 1-64 bytes".into());
        }
        if self.limits.memory_mb == 0 || self.limits.cpu_millis == 0 || self.limits.pids_max == 0 {
            return bad("limits must be non-zero".into());
        }
        if self.tmp_size_mb == 0 {
            return bad("tmp_size_mb must be non-zero".into());
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return bad(format!("invalid environment variable name or value: {k:?}"));
            }
        }
        Ok(())
    }
}

impl Entry {
    pub(crate) fn validate(&self, id: &str) -> Result<(), SandboxError> {
        let bad = |reason: &str| Err(SandboxError::InvalidSpec { id: id.to_string(), reason: reason.into() });
        match self {
            Entry::Exec { argv } => {
                match argv.first() {
                    Some(a) if a.starts_with('/') => {}
                    _ => return bad("argv[0] must be an absolute path inside the sandbox"),
                }
                if argv.iter().any(|a| a.contains('\0')) {
                    return bad("argv contains NUL");
                }
            }
            Entry::Stub { addr, len, blob } => {
                if *addr % PAGE_SIZE != 0 || *addr == 0 {
                    return bad("stub addr must be non-zero and page aligned");
                }
                if *len == 0 || blob.len() > *len {
                    return bad("stub len must be non-zero and at least blob.len()");
                }
                if addr.checked_add(*len as u64).is_none() {
                    return bad("stub addr + len overflows");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let s = SandboxSpec::new("fn-1_a", "/srv/code");
        assert_eq!(s.init_exe, PathBuf::from("/proc/self/exe"));
        assert_eq!(s.ro_binds, vec![PathBuf::from("/usr")]);
        assert!(s.minimal_etc);
        assert_eq!(s.tmp_size_mb, 64);
        assert_eq!(s.limits, Limits { memory_mb: 512, cpu_millis: 1000, pids_max: 256 });
        assert_eq!((s.uid, s.gid), (65534, 65534));
        assert_eq!(s.cwd, PathBuf::from("/var/task"));
        assert_eq!(s.hostname, "thaw");
        assert!(s.env.is_empty());
        assert!(s.validate().is_ok());
    }

    #[test]
    fn bad_ids_rejected() {
        for id in ["", "a/b", "..", "a b", "x;y", &"a".repeat(65)] {
            let err = SandboxSpec::new(id, "/srv/code").validate().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("sandbox {id}: invalid spec: id must be 1-64 characters of [a-zA-Z0-9_-]")
            );
        }
    }

    #[test]
    fn other_validation() {
        let mut s = SandboxSpec::new("ok", "relative/code");
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "sandbox ok: invalid spec: code_dir must be an absolute path without NUL: relative/code"
        );
        s.code_dir = "/c".into();
        s.env = vec![("A=B".into(), "x".into())];
        assert!(s.validate().is_err());
        s.env = vec![("A".into(), "x=y".into())];
        assert!(s.validate().is_ok());
        s.limits.memory_mb = 0;
        assert!(s.validate().is_err());
    }

    #[test]
    fn entry_validation() {
        assert!(Entry::Exec { argv: vec![] }.validate("x").is_err());
        assert!(Entry::Exec { argv: vec!["sh".into()] }.validate("x").is_err());
        assert!(Entry::Exec { argv: vec!["/bin/sh".into()] }.validate("x").is_ok());
        assert!(Entry::Stub { addr: 0x1001, len: 1, blob: vec![] }.validate("x").is_err());
        assert!(Entry::Stub { addr: 0x1000, len: 1, blob: vec![1, 2] }.validate("x").is_err());
        assert!(Entry::Stub { addr: 0x1000, len: 2, blob: vec![1, 2] }.validate("x").is_ok());
    }
}
