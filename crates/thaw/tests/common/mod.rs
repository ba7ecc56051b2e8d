//! Helpers shared by the end-to-end tests of the `thaw` CLI (each test binary
//! includes this module with `mod common;`; not every binary uses every helper).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The repository's root directory.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A built Python sample function (`build/samples/python/NAME`).
pub fn sample(name: &str) -> PathBuf {
    let p = root().join("build/samples/python").join(name);
    assert!(p.join("handler.py").is_file(), "sample {name} not built: run scripts/build-samples.sh");
    p
}

/// A scratch directory shared by the tests of this binary (data dir, snapshots), named
/// `thaw-CRATE-PID-XXXXXX` in the temporary directory.
///
/// A static is never dropped, so the directory outlives the run; the next run of the same
/// binary removes every such directory whose process has ended (`scripts/test.sh` sweeps
/// them all at its end). Without this, each run left up to a gigabyte behind and the disk
/// filled until MinIO refused writes.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let prefix = format!("thaw-{}-", env!("CARGO_CRATE_NAME"));
        sweep_ended(&std::env::temp_dir(), &prefix);
        tempfile::Builder::new().prefix(&format!("{prefix}{}-", std::process::id())).tempdir().unwrap()
    })
    .path()
}

/// Remove the scratch directories `PREFIX<pid>-*` in `tmp` whose process no longer exists.
fn sweep_ended(tmp: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((pid, _)) = name.strip_prefix(prefix).and_then(|rest| rest.split_once('-')) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Run the `thaw` binary with this binary's data directory.
pub fn thaw(args: &[&str]) -> Output {
    thaw_env(&[], args)
}

/// [`thaw`] with `vars` set in its environment.
pub fn thaw_env(vars: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_thaw"))
        .env("THAW_DATA_DIR", scratch().join("data"))
        .env_remove("THAW_LOG")
        .envs(vars.iter().copied())
        .args(args)
        .output()
        .expect("running thaw")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `o`, after asserting that thaw succeeded.
pub fn ok(o: Output) -> Output {
    assert!(o.status.success(), "thaw failed ({:?}):\nstdout: {}\nstderr: {}", o.status, stdout(&o), stderr(&o));
    o
}

/// A function bundle `name` in the scratch directory holding `files` (name, text).
pub fn bundle(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

/// The pages holding each thread's TCB (at its fs_base), named as the engine's
/// inspection names pages (`page:0x...`): the kernel writes the CPU a thread runs on
/// into its rseq area there whenever it schedules the thread, so those pages differ
/// from run to run and from clone to clone. Differential checks set them aside.
#[allow(dead_code)]
pub fn tcb_pages(facts: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    facts
        .iter()
        .filter(|(k, _)| k.ends_with(":fs_base"))
        .flat_map(|(_, v)| {
            let fs = u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap();
            [fs & !4095, (fs + 4095) & !4095].map(|p| format!("page:{p:#x}"))
        })
        .collect()
}
