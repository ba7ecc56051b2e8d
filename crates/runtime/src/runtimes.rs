//! Language runtimes: how each one's shim is started inside a sandbox.
//!
//! The shims' text files ship inside the `thaw` binary; the Java runtime jar is
//! built by `scripts/build-runtimes.sh` into `build/runtimes/java/` (found at a
//! path baked in at compile time, or `$THAW_JAVA_RUNTIME_JAR`). All of them are
//! written to a content-addressed directory on first use, which the sandbox
//! mounts read-only at /var/runtime:
//!
//! ```text
//! /var/runtime/python/bootstrap.py, thaw_runtime.py
//! /var/runtime/nodejs/bootstrap.sh, bootstrap.js
//! /var/runtime/java/bootstrap.sh, thaw-java-runtime.jar
//! /var/runtime/provided/bridge, bridge.py
//! ```
//!
//! `provided/bridge` is the native `thaw-runtime-bridge` when it was built beside the
//! running program, else a two-line script that execs `bridge.py` (the same bridge in
//! Python, ~35 ms slower to start).

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

const PYTHON_BOOTSTRAP: &str = include_str!("../../../runtimes/python/bootstrap.py");
const PYTHON_THAW_RUNTIME: &str = include_str!("../../../runtimes/python/thaw_runtime.py");
const NODEJS_BOOTSTRAP_SH: &str = include_str!("../../../runtimes/nodejs/bootstrap.sh");
const NODEJS_BOOTSTRAP_JS: &str = include_str!("../../../runtimes/nodejs/bootstrap.js");
const JAVA_BOOTSTRAP_SH: &str = include_str!("../../../runtimes/java/bootstrap.sh");
const PROVIDED_BRIDGE: &str = include_str!("../../../runtimes/provided/bridge.py");
/// Where `scripts/build-runtimes.sh` puts the Java runtime jar.
const JAVA_JAR_BUILD_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../build/runtimes/java/thaw-java-runtime.jar");
const JAVA_JAR_PATH: &str = "java/thaw-java-runtime.jar";
/// The Java shim's native library (setenv for a base's function), beside the jar.
const JAVA_NATIVE: &str = "libthawenv.so";
const JAVA_HOME: &str = "/usr/lib/jvm/java-17-openjdk-amd64";

const SUPPORTED: &str = "python3, python3.11, nodejs20.x, java17, provided.al2023";

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("unknown runtime '{0}' (supported: python3, python3.11, nodejs20.x, java17, provided.al2023)")]
    Unknown(String),
    #[error("malformed handler '{0}': expected module.function")]
    BadHandler(String),
    #[error("malformed handler '{0}': expected package.Class::method or package.Class")]
    BadJavaHandler(String),
    #[error("malformed handler '{0}': expected 1 to 128 characters without whitespace")]
    BadCustomHandler(String),
    #[error("installing the runtime shims into {dir}")]
    Install { dir: PathBuf, #[source] source: io::Error },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Python3,
    Nodejs20,
    Java17,
    /// A custom runtime (`provided.al2023`): the bundle's `bootstrap` executable speaks
    /// Lambda's Runtime API over HTTP to a bridge in the sandbox (`provided/bridge.py`).
    Provided,
}

impl Runtime {
    pub fn parse(name: &str) -> Result<Runtime, RuntimeError> {
        match name {
            "python3" | "python3.11" | "python" => Ok(Runtime::Python3),
            "nodejs20.x" | "nodejs" | "node" => Ok(Runtime::Nodejs20),
            "java17" | "java" => Ok(Runtime::Java17),
            "provided.al2023" | "provided.al2" | "provided" => Ok(Runtime::Provided),
            other => Err(RuntimeError::Unknown(other.to_string())),
        }
    }

    /// Every runtime name `parse` accepts as canonical, for messages.
    pub fn supported() -> &'static str {
        SUPPORTED
    }

    pub fn name(&self) -> &'static str {
        match self {
            Runtime::Python3 => "python3",
            Runtime::Nodejs20 => "nodejs20.x",
            Runtime::Java17 => "java17",
            Runtime::Provided => "provided.al2023",
        }
    }

    /// Whether instances of this runtime can be snapshotted. A custom runtime cannot
    /// yet: its bootstrap is a second process holding a TCP connection to the
    /// Runtime API, and the engine restores neither. Its instances are cold-booted.
    pub fn snapshots(&self) -> bool {
        !matches!(self, Runtime::Provided)
    }

    /// Check the handler string's shape (existence is checked by the shim at init).
    pub fn check_handler(&self, handler: &str) -> Result<(), RuntimeError> {
        let bad = || Err(RuntimeError::BadHandler(handler.to_string()));
        match self {
            Runtime::Python3 => match handler.rsplit_once('.') {
                Some((m, f)) if !m.is_empty() && !f.is_empty() => Ok(()),
                _ => bad(),
            },
            // Lambda's nodejs rule: the last path component is `file.function[.nested]`.
            Runtime::Nodejs20 => {
                let base = handler.rsplit('/').next().unwrap_or("");
                match base.split_once('.') {
                    Some((m, f)) if !m.is_empty() && !f.is_empty() && !f.split('.').any(str::is_empty) => Ok(()),
                    _ => bad(),
                }
            }
            Runtime::Java17 => {
                let (class, method) = match handler.split_once("::") {
                    Some((c, m)) => (c, Some(m)),
                    None => (handler, None),
                };
                let ident = |s: &str| {
                    let mut ch = s.chars();
                    matches!(ch.next(), Some(c) if c.is_alphabetic() || c == '_' || c == '$')
                        && ch.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
                };
                if class.split('.').all(ident) && method.map_or(true, ident) {
                    Ok(())
                } else {
                    Err(RuntimeError::BadJavaHandler(handler.to_string()))
                }
            }
            // The bootstrap reads _HANDLER as it likes (Lambda checks only its length).
            Runtime::Provided => {
                if handler.is_empty() || handler.len() > 128 || handler.chars().any(char::is_whitespace) {
                    Err(RuntimeError::BadCustomHandler(handler.to_string()))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// argv of the shim inside the sandbox.
    ///
    /// Node and Java start through a small `/bin/sh` launcher (as Lambda's own
    /// bootstrap scripts do) that derives heap limits from
    /// `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` and then `exec`s the VM.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Runtime::Python3 => vec!["/usr/bin/python3".into(), "/var/runtime/python/bootstrap.py".into()],
            Runtime::Nodejs20 => vec!["/bin/sh".into(), "/var/runtime/nodejs/bootstrap.sh".into()],
            Runtime::Java17 => vec!["/bin/sh".into(), "/var/runtime/java/bootstrap.sh".into()],
            Runtime::Provided => vec!["/var/runtime/provided/bridge".into()],
        }
    }

    /// The complete environment of the shim (Lambda's variable names). `version` is
    /// [`LATEST_VERSION`] or a published version's number.
    pub fn env(&self, handler: &str, function_name: &str, version: &str, memory_mb: u64, user: &[(String, String)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TZ".into(), ":UTC".into()),
            ("HOME".into(), "/tmp".into()),
            ("LAMBDA_TASK_ROOT".into(), "/var/task".into()),
            ("LAMBDA_RUNTIME_DIR".into(), "/var/runtime".into()),
            ("_HANDLER".into(), handler.into()),
            ("AWS_LAMBDA_FUNCTION_NAME".into(), function_name.into()),
            ("AWS_LAMBDA_FUNCTION_VERSION".into(), version.into()),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE".into(), memory_mb.to_string()),
            ("AWS_REGION".into(), "local".into()),
        ];
        match self {
            Runtime::Python3 => {
                env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
                env.push(("PYTHONUNBUFFERED".into(), "1".into()));
                // One vCPU per sandbox: keep numeric libraries from starting thread pools at import.
                for k in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"] {
                    env.push((k.into(), "1".into()));
                }
            }
            Runtime::Nodejs20 => {
                env.push(("AWS_EXECUTION_ENV".into(), "AWS_Lambda_nodejs20.x".into()));
                // The launcher passes the VM flags on the command line; nothing from the host.
                env.push(("NODE_OPTIONS".into(), String::new()));
                env.push(("NODE_PATH".into(), "/opt/nodejs/node20/node_modules:/opt/nodejs/node_modules:/var/task".into()));
                // libuv's thread pool is started lazily (first async fs/crypto/zlib call);
                // one thread per one-vCPU sandbox keeps snapshots small.
                env.push(("UV_THREADPOOL_SIZE".into(), "1".into()));
            }
            Runtime::Java17 => {
                env.push(("AWS_EXECUTION_ENV".into(), "AWS_Lambda_java17".into()));
                env.push(("JAVA_HOME".into(), JAVA_HOME.into()));
            }
            Runtime::Provided => {
                // Where the bridge serves the Runtime API inside the sandbox.
                env.push(("AWS_LAMBDA_RUNTIME_API".into(), "127.0.0.1:9001".into()));
            }
        }
        for (k, v) in user {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        env
    }
}

/// Path of the Java runtime jar that `install_shims` copies (`$THAW_JAVA_RUNTIME_JAR`
/// or the repository's `build/runtimes/java/thaw-java-runtime.jar`).
pub fn java_runtime_jar() -> PathBuf {
    match std::env::var_os("THAW_JAVA_RUNTIME_JAR") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(JAVA_JAR_BUILD_PATH),
    }
}

/// The fallback `provided/bridge`: the Python bridge, isolated and without `site` (the
/// standard library only; the host's site-packages cost tens of ms at every start).
const PROVIDED_BRIDGE_SCRIPT: &str = "#!/bin/sh\nexec /usr/bin/python3 -I -S \"${0%/*}/bridge.py\"\n";
/// Shim files installed executable.
const EXECUTABLES: &[&str] = &["provided/bridge"];
/// The version an unqualified call runs, as Lambda names it.
pub const LATEST_VERSION: &str = "$LATEST";

/// The native custom-runtime bridge's name beside the running program.
pub const NATIVE_BRIDGE: &str = "thaw-runtime-bridge";

/// The native bridge's bytes, when it sits beside the running program
/// (`THAW_RUNTIME_BRIDGE=python` installs the Python one instead, for comparisons).
fn native_bridge() -> Option<Vec<u8>> {
    if std::env::var("THAW_RUNTIME_BRIDGE").is_ok_and(|v| v == "python") {
        return None;
    }
    let path = std::env::current_exe().ok()?.parent()?.join(NATIVE_BRIDGE);
    std::fs::read(path).ok()
}

/// Note left in place of the jar when it was not built.
const JAVA_JAR_MISSING: &str = "The Java runtime jar was not built when these shims were installed.\n\
Run scripts/build-runtimes.sh (or set THAW_JAVA_RUNTIME_JAR) and restart thaw.\n";

/// Write the shims under `base/runtimes-<content hash>/` (once) and return that dir.
///
/// A missing Java jar does not fail the installation (the other runtimes work):
/// `java/bootstrap.sh` then exits with a message naming scripts/build-runtimes.sh.
pub fn install_shims(base: &Path) -> Result<PathBuf, RuntimeError> {
    let jar_path = java_runtime_jar();
    let jar = std::fs::read(&jar_path).ok();
    let native = std::fs::read(jar_path.with_file_name(JAVA_NATIVE)).ok();
    let bridge = native_bridge();
    let mut files: Vec<(&str, &[u8])> = vec![
        ("python/bootstrap.py", PYTHON_BOOTSTRAP.as_bytes()),
        ("python/thaw_runtime.py", PYTHON_THAW_RUNTIME.as_bytes()),
        ("nodejs/bootstrap.sh", NODEJS_BOOTSTRAP_SH.as_bytes()),
        ("nodejs/bootstrap.js", NODEJS_BOOTSTRAP_JS.as_bytes()),
        ("java/bootstrap.sh", JAVA_BOOTSTRAP_SH.as_bytes()),
        ("provided/bridge.py", PROVIDED_BRIDGE.as_bytes()),
        ("provided/bridge", bridge.as_deref().unwrap_or(PROVIDED_BRIDGE_SCRIPT.as_bytes())),
        match &jar {
            Some(bytes) => (JAVA_JAR_PATH, bytes.as_slice()),
            None => ("java/JAR-MISSING.txt", JAVA_JAR_MISSING.as_bytes()),
        },
    ];
    // Without it a Java base cannot take its function's environment (its functions then
    // get full images); everything else works.
    if let Some(bytes) = &native {
        files.push(("java/libthawenv.so", bytes));
    }
    let mut crc = Crc32::new();
    for (name, data) in &files {
        crc.update(name.as_bytes());
        crc.update(&(data.len() as u64).to_le_bytes());
        crc.update(data);
    }
    let hash = crc.finish();
    let dir = base.join(format!("runtimes-{hash:08x}"));
    let stamp = dir.join(".complete");
    if stamp.is_file() {
        return Ok(dir);
    }
    let err = |source| RuntimeError::Install { dir: dir.clone(), source };
    let tmp = base.join(format!(".runtimes-{hash:08x}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(&tmp).map_err(err)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
    for (name, data) in &files {
        let path = tmp.join(name);
        let parent = path.parent().expect("relative path with a directory");
        if !parent.is_dir() {
            std::fs::create_dir_all(parent).map_err(err)?;
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
        }
        std::fs::write(&path, data).map_err(err)?;
        let mode = if EXECUTABLES.contains(name) { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    }
    std::fs::write(tmp.join(".complete"), b"").map_err(err)?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another process installed it first.
        Err(_) if stamp.is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(err(e)),
    }
}

/// Table-driven CRC-32 (IEEE); only used to name the shim directory.
struct Crc32 {
    table: [u32; 256],
    crc: u32,
}

impl Crc32 {
    fn new() -> Self {
        let mut table = [0u32; 256];
        for (i, t) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0xedb8_8320 } else { c >> 1 };
            }
            *t = c;
        }
        Crc32 { table, crc: 0xffff_ffff }
    }

    fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.crc = self.table[((self.crc ^ b as u32) & 0xff) as usize] ^ (self.crc >> 8);
        }
    }

    fn finish(&self) -> u32 {
        !self.crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runtimes_and_handlers() {
        assert_eq!(Runtime::parse("python3").unwrap(), Runtime::Python3);
        assert_eq!(
            Runtime::parse("cobol").unwrap_err().to_string(),
            "unknown runtime 'cobol' (supported: python3, python3.11, nodejs20.x, java17, provided.al2023)"
        );
        assert!(Runtime::Python3.check_handler("pkg.mod.fn").is_ok());
        assert_eq!(Runtime::Python3.check_handler("nodot").unwrap_err().to_string(), "malformed handler 'nodot': expected module.function");
        assert!(Runtime::Python3.check_handler(".fn").is_err());
    }

    #[test]
    fn parses_node_and_java() {
        for n in ["nodejs20.x", "nodejs", "node"] {
            assert_eq!(Runtime::parse(n).unwrap(), Runtime::Nodejs20);
        }
        for n in ["java17", "java"] {
            assert_eq!(Runtime::parse(n).unwrap(), Runtime::Java17);
        }
        assert_eq!(Runtime::Nodejs20.name(), "nodejs20.x");
        for n in ["provided.al2023", "provided.al2", "provided"] {
            assert_eq!(Runtime::parse(n).unwrap(), Runtime::Provided);
        }
        assert!(!Runtime::Provided.snapshots() && Runtime::Python3.snapshots());
        for ok in ["bootstrap", "main", "anything.goes::here"] {
            assert!(Runtime::Provided.check_handler(ok).is_ok(), "{ok}");
        }
        for bad in ["", "has space", &"x".repeat(129)] {
            assert!(Runtime::Provided.check_handler(bad).is_err(), "{bad}");
        }
        assert_eq!(Runtime::Provided.argv(), vec!["/var/runtime/provided/bridge"]);
        let env = Runtime::Provided.env("bootstrap", "fn", LATEST_VERSION, 128, &[]);
        assert!(env.contains(&("AWS_LAMBDA_RUNTIME_API".into(), "127.0.0.1:9001".into())));
        assert_eq!(Runtime::Java17.name(), "java17");
        assert_eq!(Runtime::parse(Runtime::Java17.name()).unwrap(), Runtime::Java17);
        assert!(Runtime::supported().contains("nodejs20.x"));

        let n = Runtime::Nodejs20;
        for ok in ["index.handler", "src/app.handler", "a/b/index.handlers.main", "index.mjs_fn"] {
            assert!(n.check_handler(ok).is_ok(), "{ok}");
        }
        for bad in ["index", "index.", ".handler", "src/index", "dir.x/index", "index.a..b", ""] {
            assert!(n.check_handler(bad).is_err(), "{bad}");
        }
        let j = Runtime::Java17;
        for ok in ["example.Hello", "Hello", "example.Hello::handleRequest", "a.b.C$Inner::run", "_x.Y::z"] {
            assert!(j.check_handler(ok).is_ok(), "{ok}");
        }
        for bad in ["", "example.Hello::", "::m", "a..B", "1a.B", "a.B::m::n", "a.B:m", "a-b.C"] {
            assert!(j.check_handler(bad).is_err(), "{bad}");
        }
        assert_eq!(
            j.check_handler("a.B::").unwrap_err().to_string(),
            "malformed handler 'a.B::': expected package.Class::method or package.Class"
        );
    }

    #[test]
    fn argv_and_env_per_runtime() {
        assert_eq!(Runtime::Nodejs20.argv(), vec!["/bin/sh", "/var/runtime/nodejs/bootstrap.sh"]);
        assert_eq!(Runtime::Java17.argv(), vec!["/bin/sh", "/var/runtime/java/bootstrap.sh"]);
        let env = Runtime::Nodejs20.env("index.handler", "fn", LATEST_VERSION, 128, &[]);
        let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.clone());
        assert_eq!(get("NODE_OPTIONS").as_deref(), Some(""));
        assert_eq!(get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE").as_deref(), Some("128"));
        assert_eq!(get("PYTHONUNBUFFERED"), None);
        let env = Runtime::Java17.env("a.B::c", "fn", "3", 256, &[("JAVA_TOOL_OPTIONS".into(), "-Dx=1".into())]);
        let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.clone());
        assert_eq!(get("_HANDLER").as_deref(), Some("a.B::c"));
        assert_eq!(get("JAVA_TOOL_OPTIONS").as_deref(), Some("-Dx=1"));
        assert_eq!(get("AWS_EXECUTION_ENV").as_deref(), Some("AWS_Lambda_java17"));
        assert_eq!(get("AWS_LAMBDA_FUNCTION_VERSION").as_deref(), Some("3"));
    }

    #[test]
    fn env_is_complete_and_user_overrides() {
        let env = Runtime::Python3.env("h.handler", "fn", LATEST_VERSION, 256, &[("TZ".into(), "UTC".into()), ("X".into(), "1".into())]);
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
        assert_eq!(std::fs::read_to_string(a.join("python/thaw_runtime.py")).unwrap(), PYTHON_THAW_RUNTIME);
        assert_eq!(std::fs::read_to_string(a.join("nodejs/bootstrap.js")).unwrap(), NODEJS_BOOTSTRAP_JS);
        assert_eq!(std::fs::read_to_string(a.join("nodejs/bootstrap.sh")).unwrap(), NODEJS_BOOTSTRAP_SH);
        assert_eq!(std::fs::read_to_string(a.join("java/bootstrap.sh")).unwrap(), JAVA_BOOTSTRAP_SH);
        assert_eq!(std::fs::read_to_string(a.join("provided/bridge.py")).unwrap(), PROVIDED_BRIDGE);
        use std::os::unix::fs::PermissionsExt;
        let bridge = a.join("provided/bridge");
        assert_eq!(std::fs::metadata(&bridge).unwrap().permissions().mode() & 0o777, 0o755);
        let bytes = std::fs::read(&bridge).unwrap();
        match native_bridge() {
            Some(native) => assert_eq!(bytes, native),
            None => assert_eq!(bytes, PROVIDED_BRIDGE_SCRIPT.as_bytes()),
        }
        let jar = a.join("java/thaw-java-runtime.jar");
        assert_eq!(jar.is_file(), java_runtime_jar().is_file());
        assert_eq!(a.join("java/JAR-MISSING.txt").is_file(), !jar.is_file());
    }

    #[test]
    fn crc32_matches_reference() {
        let mut c = Crc32::new();
        c.update(b"123456789");
        assert_eq!(c.finish(), 0xcbf4_3926);
    }
}
