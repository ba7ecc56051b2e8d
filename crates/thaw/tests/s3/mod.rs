//! Helpers of the snapshot-store tests: a real MinIO (the helper lives with
//! the store crate), stores on it, and snapshots made by the `thaw` binary.
#![allow(dead_code)]

#[path = "../../../store/tests/common/minio.rs"]
pub mod minio;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use minio::Minio;
use thaw_store::{Store, StoreConfig, StoreUrl};

use crate::common::{ok, sample, scratch, stdout, thaw};

/// `thaw ARGS` with the store's environment.
pub fn thaw_s3(m: &Minio, args: &[&str]) -> Output {
    thaw_s3_env(m, args, &[])
}

/// [`thaw_s3`] with more environment.
pub fn thaw_s3_env(m: &Minio, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_thaw"));
    c.env("THAW_DATA_DIR", scratch().join("data")).env_remove("THAW_LOG").args(args);
    for (k, v) in m.env() {
        c.env(k, v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running thaw")
}

/// Capture the Python sample `name` into `out` and restore it once, which
/// records its working set (as a deployed function has).
pub fn capture(name: &str, out: &Path) {
    let code = sample(name);
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", out.to_str().unwrap()]));
    ok(thaw(&["snapshot", "restore", out.to_str().unwrap(), "--payload", r#"{"name":"ws"}"#, "--quiet"]));
    assert!(out.join("ws.trace").is_file(), "the first restore recorded no working set");
}

/// The helloworld sample, captured once for this test binary.
pub fn hello_snapshot() -> &'static Path {
    static SNAP: OnceLock<PathBuf> = OnceLock::new();
    SNAP.get_or_init(|| {
        let out = scratch().join("hello.snap");
        capture("helloworld", &out);
        out
    })
}

pub fn store_config(m: &Minio) -> StoreConfig {
    StoreConfig {
        endpoint: Some(m.endpoint()),
        region: Some("us-east-1".into()),
        access_key_id: Some(minio::ACCESS_KEY.into()),
        secret_access_key: Some(minio::SECRET_KEY.into()),
        timeout: Some(Duration::from_secs(5)),
    }
}

/// A store at `url` (s3://BUCKET/PREFIX) on `m`, the bucket created.
pub fn store(m: &Minio, url: &str) -> Store {
    let s = Store::open(&StoreUrl::parse(url).unwrap(), &store_config(m)).unwrap();
    s.ensure_bucket().unwrap();
    s
}

/// The objects under DIR of the store's prefix, with sizes, sorted.
pub fn objects(s: &Store, dir: &str) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = s.block_on(s.remote.list(dir)).unwrap().into_iter().map(|(k, m)| (k, m.size)).collect();
    v.sort();
    v
}

pub fn no_progress(_: u64) {}

/// The files of a snapshot directory with their contents, sorted.
pub fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

pub fn last_line(o: &Output) -> String {
    stdout(o).lines().last().unwrap_or_default().to_string()
}
