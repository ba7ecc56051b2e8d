//! Which program a sandbox's init execs. The small `thaw-sandbox-init` binary starts
//! in ~1.3 ms where re-exec'ing a large caller (the 165 MB `thaw`) takes ~2.2 ms of a
//! sandbox's creation (measured, issue #15); linked statically against musl
//! (`thaw-sandbox-init-static`, `scripts/build-init.sh`) it starts in 0.1 ms of CPU
//! against 1.0 (`perf stat -r 300 ... --build-id`, issue #33): glibc's start-up runs
//! the dynamic loader and probes the CPU's caches with dozens of CPUID instructions,
//! each a trap to the hypervisor on a VM. The first of [`INIT_BINARIES`] that sits
//! next to the caller's executable *and* comes from the same build (it answers
//! `--build-id` with this crate's [`BUILD_ID`]) is used; otherwise the caller re-execs
//! itself through `/proc/self/exe` with the `__sandbox-init` marker. Decided once per
//! process. `THAW_SANDBOX_INIT=self` forces the re-exec, `THAW_SANDBOX_INIT=glibc`
//! skips the static binary (for comparisons).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Identifies the build of this crate (see build.rs).
pub const BUILD_ID: &str = include_str!(concat!(env!("OUT_DIR"), "/build_id.txt"));

/// The argument that makes `thaw-sandbox-init` print [`BUILD_ID`] and exit.
pub const BUILD_ID_ARG: &str = "--build-id";

/// The name of the small init binary (as cargo builds it: linked against glibc).
pub const INIT_BINARY: &str = "thaw-sandbox-init";

/// The same program linked statically against musl (`scripts/build-init.sh`).
pub const STATIC_INIT_BINARY: &str = "thaw-sandbox-init-static";

/// The init binaries looked for next to the caller, the preferred first.
pub const INIT_BINARIES: [&str; 2] = [STATIC_INIT_BINARY, INIT_BINARY];

/// `(init_exe, init_args)` for sandboxes spawned by this process.
pub fn default_init() -> (PathBuf, Vec<String>) {
    static CHOICE: OnceLock<PathBuf> = OnceLock::new();
    let exe = CHOICE.get_or_init(|| {
        let forced = std::env::var("THAW_SANDBOX_INIT").unwrap_or_default();
        let dir = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf));
        match dir {
            Some(dir) if forced != "self" => {
                let names: &[&str] = if forced == "glibc" { &[INIT_BINARY] } else { &INIT_BINARIES };
                match find_init_binary(&dir, names) {
                    Ok((s, passed_over)) => {
                        tracing::debug!(init = %s.display(), "sandboxes start the small init binary");
                        // A static init that is there but stale (the crate changed since
                        // scripts/build-init.sh ran) costs every sandbox ~1 ms of CPU: say so.
                        let stat = dir.join(STATIC_INIT_BINARY);
                        if let Some(why) = passed_over.first().filter(|_| s != stat && stat.exists()) {
                            tracing::warn!(init = %stat.display(), why, "not using the static sandbox init; scripts/build-init.sh rebuilds it");
                        }
                        s
                    }
                    Err(why) => {
                        tracing::debug!(dir = %dir.display(), why, "sandboxes re-exec this program as their init");
                        PathBuf::from("/proc/self/exe")
                    }
                }
            }
            _ => PathBuf::from("/proc/self/exe"),
        }
    });
    (exe.clone(), vec!["__sandbox-init".into()])
}

/// The first of `names` in `dir` that [`check_init_binary`] accepts, with why each
/// before it was passed over (`name: why`); `Err` says why each was not.
pub fn find_init_binary(dir: &Path, names: &[&str]) -> Result<(PathBuf, Vec<String>), String> {
    let mut why = Vec::new();
    for name in names {
        let path = dir.join(name);
        match check_init_binary(&path) {
            Ok(()) => return Ok((path, why)),
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    Err(why.join("; "))
}

/// Whether `path` is a `thaw-sandbox-init` of this very build that only its owner
/// (root, or whoever runs us) can change; `Err` says why not.
pub fn check_init_binary(path: &Path) -> Result<(), String> {
    let m = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a file".into());
    }
    // A binary others may rewrite must not become every sandbox's init.
    if m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o022 != 0 {
        return Err("owned by another user or writable by group/others".into());
    }
    let out = run_build_id(path).map_err(|e| e.to_string())?;
    let theirs = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || theirs.trim() != BUILD_ID {
        return Err(format!("another build ({})", theirs.trim()));
    }
    Ok(())
}

/// Runs `path --build-id`. A file that was just written may be briefly "busy" (ETXTBSY):
/// a fork elsewhere in this process, between its fork and its exec, still holds the
/// writer's descriptor (close-on-exec closes it only at that exec). That clears within
/// milliseconds, so the exec is tried again for up to a second before it counts.
fn run_build_id(path: &Path) -> std::io::Result<std::process::Output> {
    let mut delay = std::time::Duration::from_millis(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let out = std::process::Command::new(path)
            .arg(BUILD_ID_ARG)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && std::time::Instant::now() < deadline => {
                std::thread::sleep(delay);
                delay = (delay * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}
