//! A real MinIO for tests: started on 127.0.0.1 (or another address of this host) with a free port and a
//! temporary data directory, stopped on drop. The binary is built by
//! scripts/build-minio.sh (scripts/setup.sh runs it) into
//! ${THAW_CACHE_DIR:-/var/cache/thaw}/minio-<version>/minio.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Keep in step with MINIO_VERSION in scripts/build-minio.sh.
pub const MINIO_VERSION: &str = "v0.0.0-20260212201848-7aac2a2c5b7c";
pub const ACCESS_KEY: &str = "thawtest";
pub const SECRET_KEY: &str = "thawtest-secret";

pub fn minio_bin() -> PathBuf {
    let cache = std::env::var_os("THAW_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/cache/thaw".into());
    let bin = cache.join(format!("minio-{MINIO_VERSION}")).join("minio");
    assert!(
        bin.is_file(),
        "MinIO {MINIO_VERSION} is not built ({} is missing): run scripts/build-minio.sh (scripts/setup.sh runs it)",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct Minio {
    child: Option<Child>,
    /// The address it listens on.
    pub host: String,
    pub port: u16,
    pub data: tempfile::TempDir,
}

impl Minio {
    /// Start MinIO and wait until it answers its health check.
    pub fn start() -> Minio {
        Minio::start_on("127.0.0.1")
    }

    /// [`Minio::start`] on address `host` of this machine (e.g. a bridge that network
    /// namespaces reach it through).
    pub fn start_on(host: &str) -> Minio {
        let data = tempfile::Builder::new().prefix("thaw-minio-").tempdir().unwrap();
        let mut m = Minio { child: None, host: host.to_string(), port: 0, data };
        for _ in 0..5 {
            m.port = free_port();
            if m.spawn() {
                return m;
            }
        }
        panic!("MinIO did not start on {host} (see the log above)");
    }

    fn spawn(&mut self) -> bool {
        let log = std::fs::File::create(self.data.path().join("minio.log")).unwrap();
        let store = self.data.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        let child = Command::new(minio_bin())
            .args(["server", "--quiet", "--address"])
            .arg(format!("{}:{}", self.host, self.port))
            .arg(&store)
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting minio");
        self.child = Some(child);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let log = std::fs::read_to_string(self.data.path().join("minio.log")).unwrap_or_default();
                eprintln!("minio exited ({st}) on port {}:\n{log}", self.port);
                self.child = None;
                return false;
            }
            if self.healthy() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.data.path().join("minio.log")).unwrap_or_default();
        panic!("minio on port {} not ready after 30 s:\n{log}", self.port);
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect((self.host.as_str(), self.port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        // The health endpoint answers before the object layer is up; an
        // anonymous ListBuckets answers 503 until it is, then 403.
        let req = format!("GET / HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n", self.host, self.port);
        let mut resp = String::new();
        s.write_all(req.as_bytes()).is_ok() && s.read_to_string(&mut resp).is_ok() && resp.starts_with("HTTP/1.1 403")
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// Environment for `thaw` and other AWS-configured clients.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Stop the server (the store is "down"); `resume` starts it again on the same port and data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn resume(&mut self) {
        assert!(self.spawn(), "MinIO did not restart on port {}", self.port);
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        self.stop();
    }
}
