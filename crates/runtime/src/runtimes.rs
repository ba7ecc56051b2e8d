//! Language runtimes: how each one's shim is started inside a sandbox.
//!
//! The shims ship inside the `thaw` binary and are written to a
//! content-addressed directory on first use, which the sandbox mounts
//! read-only at /var/runtime.

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

const PYTHON_BOOTSTRAP: &str = include_str!("../../../runtimes/python/bootstrap.py");

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("unknown runtime '{0}' (supported: python3, python3.11)")]
    Unknown(String),
    #[error("malformed handler '{0}': expected module.function")]
    BadHandler(String),
    #[error("installing the runtime shims into {dir}")]
    Install { dir: PathBuf, #[source] source: io::Error },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Python3,
}

impl Runtime {
    pub fn parse(name: &str) -> Result<Runtime, RuntimeError> {
        match name {
            "python3" | "python3.11" | "python" => Ok(Runtime::Python3),
            other => Err(RuntimeError::Unknown(other.to_string())),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Runtime::Python3 => "python3",
        }
    }

    /// Check the handler string's shape (existence is checked by the shim at init).
    pub fn check_handler(&self, handler: &str) -> Result<(), RuntimeError> {
        match handler.rsplit_once('.') {
            Some((m, f)) if !m.is_empty() && !f.is_empty() => Ok(()),
            _ => Err(RuntimeError::BadHandler(handler.to_string())),
        }
    }

    /// argv of the shim inside the sandbox.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Runtime::Python3 => vec!["/usr/bin/python3".into(), "/var/runtime/python/bootstrap.py".into()],
        }
    }

    /// The complete environment of the shim (Lambda's variable names).
    pub fn env(&self, handler: &str, function_name: &str, memory_mb: u64, user: &[(String, String)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TZ".into(), ":UTC".into()),
            ("HOME".into(), "/tmp".into()),
            ("LAMBDA_TASK_ROOT".into(), "/var/task".into()),
            ("LAMBDA_RUNTIME_DIR".into(), "/var/runtime".into()),
            ("_HANDLER".into(), handler.into()),
            ("AWS_LAMBDA_FUNCTION_NAME".into(), function_name.into()),
            ("AWS_LAMBDA_FUNCTION_VERSION".into(), "$LATEST".into()),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE".into(), memory_mb.to_string()),
            ("AWS_REGION".into(), "local".into()),
        ];
        if *self == Runtime::Python3 {
            env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
            env.push(("PYTHONUNBUFFERED".into(), "1".into()));
            // One vCPU per sandbox: keep numeric libraries from starting thread pools at import.
            for k in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"] {
                env.push((k.into(), "1".into()));
            }
        }
        for (k, v) in user {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        env
    }
}

/// Write the embedded shims under `base/<content hash>/` (once) and return that dir.
pub fn install_shims(base: &Path) -> Result<PathBuf, RuntimeError> {
    let hash = crc32(PYTHON_BOOTSTRAP.as_bytes());
    let dir = base.join(format!("runtimes-{hash:08x}"));
    let file = dir.join("python/bootstrap.py");
    if file.is_file() {
        return Ok(dir);
    }
    let err = |source| RuntimeError::Install { dir: dir.clone(), source };
    let tmp = base.join(format!(".runtimes-{hash:08x}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("python")).map_err(err)?;
    std::fs::write(tmp.join("python/bootstrap.py"), PYTHON_BOOTSTRAP).map_err(err)?;
    use std::os::unix::fs::PermissionsExt;
    for p in [tmp.clone(), tmp.join("python")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
    }
    std::fs::set_permissions(tmp.join("python/bootstrap.py"), std::fs::Permissions::from_mode(0o644)).map_err(err)?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another process installed it first.
        Err(_) if file.is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(err(e)),
    }
}

fn crc32(data: &[u8]) -> u32 {
    // Tiny bitwise CRC-32 (IEEE); only used to name the shim directory.
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runtimes_and_handlers() {
        assert_eq!(Runtime::parse("python3").unwrap(), Runtime::Python3);
        assert_eq!(Runtime::parse("cobol").unwrap_err().to_string(), "unknown runtime 'cobol' (supported: python3, python3.11)");
        assert!(Runtime::Python3.check_handler("pkg.mod.fn").is_ok());
        assert_eq!(Runtime::Python3.check_handler("nodot").unwrap_err().to_string(), "malformed handler 'nodot': expected module.function");
        assert!(Runtime::Python3.check_handler(".fn").is_err());
    }

    #[test]
    fn env_is_complete_and_user_overrides() {
        let env = Runtime::Python3.env("h.handler", "fn", 256, &[("TZ".into(), "UTC".into()), ("X".into(), "1".into())]);
        let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_str());
        assert_eq!(get("_HANDLER"), Some("h.handler"));
        assert_eq!(get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), Some("256"));
        assert_eq!(get("TZ"), Some("UTC"));
        assert_eq!(get("X"), Some("1"));
        assert_eq!(env.iter().filter(|(k, _)| k == "TZ").count(), 1);
    }

    #[test]
    fn shims_install_once() {
        let tmp = tempfile::tempdir().unwrap();
        let a = install_shims(tmp.path()).unwrap();
        let b = install_shims(tmp.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(std::fs::read_to_string(a.join("python/bootstrap.py")).unwrap(), PYTHON_BOOTSTRAP);
    }
}
