//! cgroup v1 and v2 behind one trait.
//!
//! Layout: v1 `<root>/<ctrl>/thaw/<id>` for `ctrl` in memory, cpu, pids (and
//! freezer, created the first time the sandbox is frozen, so that spawning pays for
//! no fourth attach); v2 `<root>/thaw/<id>`. The root (normally `/sys/fs/cgroup`) is a parameter so the
//! logic can be unit-tested against a plain directory.

use std::fmt::Debug;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::CgroupError;
use crate::spec::Limits;

/// Name of the directory grouping all sandboxes under each hierarchy.
pub const THAW_GROUP: &str = "thaw";
const CPU_PERIOD_US: u64 = 100_000;
const RMDIR_RETRY_FOR: Duration = Duration::from_millis(500);
/// Longest wait for the kernel to report a cgroup frozen.
const FREEZE_WAIT: Duration = Duration::from_secs(2);

/// One sandbox's cgroup(s).
pub trait Cgroup: Send + Sync + Debug {
    /// Creates the directories. Fails with `ErrorKind::AlreadyExists` if the leaf exists.
    fn create(&self) -> Result<(), CgroupError>;
    /// Writes memory, cpu and pids limits.
    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError>;
    /// Moves `pid` into the cgroup(s).
    fn add_pid(&self, pid: i32) -> Result<(), CgroupError>;
    /// Pids currently in the cgroup (from the memory hierarchy for v1).
    fn pids(&self) -> Result<Vec<i32>, CgroupError>;
    /// Current memory usage including page cache.
    fn memory_usage_bytes(&self) -> Result<u64, CgroupError>;
    /// Highest memory usage since the cgroup was created (v1 `max_usage_in_bytes`,
    /// v2 `memory.peak`, which needs Linux 5.19).
    fn memory_peak_bytes(&self) -> Result<u64, CgroupError>;
    /// True once the OOM killer has killed something in this cgroup.
    fn oom_killed(&self) -> bool;
    /// SIGKILLs every process in the cgroup(s).
    fn kill_all(&self) -> Result<(), CgroupError>;
    /// Stops every process in the cgroup (the cgroup freezer, as Lambda freezes idle
    /// execution environments) and waits until the kernel reports them frozen.
    fn freeze(&self) -> Result<(), CgroupError>;
    /// Lets frozen processes run again; a no-op for a cgroup never frozen. A SIGKILL
    /// sent while frozen takes effect here, before any user code runs.
    fn thaw(&self) -> Result<(), CgroupError>;
    /// Kills what is left, then removes the directories (retrying briefly on EBUSY).
    /// Missing directories are not an error.
    fn destroy(&self) -> Result<(), CgroupError>;
    /// Leaf directories, for diagnostics and tests.
    fn paths(&self) -> Vec<PathBuf>;
    /// The one directory a process can be created in directly (clone3 with
    /// CLONE_INTO_CGROUP): v2 only; v1 needs an attach per hierarchy.
    fn clone_target(&self) -> Option<&Path> {
        None
    }
}

/// cgroup v2 is used when `<root>/cgroup.controllers` exists.
pub fn is_v2(root: &Path) -> bool {
    root.join("cgroup.controllers").exists()
}

/// The right implementation for the hierarchy mounted at `root`.
pub fn for_sandbox(root: &Path, id: &str) -> Box<dyn Cgroup> {
    if is_v2(root) {
        Box::new(CgroupV2::new(root, id))
    } else {
        Box::new(CgroupV1::new(root, id))
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io { op, path: path.to_path_buf(), source }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err("write", path))
}

/// Like [`write`], but a missing file (an optional controller feature) is not an error.
pub(crate) fn write_if_exists(path: &Path, value: &str) -> Result<(), CgroupError> {
    match std::fs::OpenOptions::new().write(true).truncate(true).open(path) {
        Ok(mut f) => io::Write::write_all(&mut f, value.as_bytes()).map_err(io_err("write", path)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("write", path)(e)),
    }
}

fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(io_err("read", path))
}

/// mkdir `leaf`, creating its parent (the `thaw` group) on ENOENT.
fn mkdir_leaf(leaf: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(leaf) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let parent = leaf.parent().expect("leaf has a parent");
            match std::fs::create_dir(parent) {
                Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                    return Err(io_err("mkdir", parent)(e));
                }
                _ => {}
            }
            std::fs::create_dir(leaf).map_err(io_err("mkdir", leaf))
        }
        r => r.map_err(io_err("mkdir", leaf)),
    }
}

fn rmdir_retry(dir: &Path) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < RMDIR_RETRY_FOR => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(io_err("rmdir", dir)(e)),
        }
    }
}

fn read_procs(dir: &Path) -> Result<Vec<i32>, CgroupError> {
    let path = dir.join("cgroup.procs");
    let text = match std::fs::read_to_string(&path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        r => r.map_err(io_err("read", &path))?,
    };
    text.lines()
        .map(|l| l.trim().parse().map_err(|_| CgroupError::Parse { path: path.clone(), content: l.into() }))
        .collect()
}

/// Poll `path` until `done(contents)`, for at most [`FREEZE_WAIT`].
fn wait_for(path: &Path, done: impl Fn(&str) -> bool) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        let text = read(path)?;
        if done(&text) {
            return Ok(());
        }
        if start.elapsed() > FREEZE_WAIT {
            return Err(CgroupError::Parse { path: path.to_path_buf(), content: format!("still '{}' after {FREEZE_WAIT:?}", text.trim()) });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn kill_procs(dir: &Path) -> Result<(), CgroupError> {
    for pid in read_procs(dir)? {
        // ESRCH: it is already gone.
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    Ok(())
}

/// Parses `key N` out of a flat-keyed file such as memory.events or memory.oom_control.
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok()).flatten()
    })
}

fn parse_u64(path: &Path, text: &str) -> Result<u64, CgroupError> {
    text.trim()
        .parse()
        .map_err(|_| CgroupError::Parse { path: path.to_path_buf(), content: text.into() })
}

/// cgroup v1: one directory per controller.
#[derive(Debug)]
pub struct CgroupV1 {
    memory: PathBuf,
    cpu: PathBuf,
    pids: PathBuf,
    freezer: PathBuf,
}

impl CgroupV1 {
    pub fn new(root: &Path, id: &str) -> Self {
        let leaf = |ctrl: &str| root.join(ctrl).join(THAW_GROUP).join(id);
        CgroupV1 { memory: leaf("memory"), cpu: leaf("cpu"), pids: leaf("pids"), freezer: leaf("freezer") }
    }

    /// Move every process of the sandbox into its freezer cgroup (created on first use).
    /// Returns how many were not there yet.
    fn join_freezer(&self) -> Result<usize, CgroupError> {
        if !self.freezer.exists() {
            mkdir_leaf(&self.freezer)?;
        }
        let inside = read_procs(&self.freezer)?;
        let mut moved = 0;
        for pid in read_procs(&self.memory)?.into_iter().filter(|p| !inside.contains(p)) {
            let procs = self.freezer.join("cgroup.procs");
            match std::fs::write(&procs, pid.to_string()) {
                Ok(()) => moved += 1,
                // Exited meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(io_err("write", &procs)(e)),
            }
        }
        Ok(moved)
    }

    fn dirs(&self) -> [&Path; 3] {
        [&self.memory, &self.cpu, &self.pids]
    }
}

impl Cgroup for CgroupV1 {
    fn create(&self) -> Result<(), CgroupError> {
        for (i, dir) in self.dirs().into_iter().enumerate() {
            if let Err(e) = mkdir_leaf(dir) {
                for d in &self.dirs()[..i] {
                    let _ = std::fs::remove_dir(d);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        let bytes = (limits.memory_mb << 20).to_string();
        let limit = self.memory.join("memory.limit_in_bytes");
        // memsw (memory+swap, only present with swap accounting) must stay >= the memory
        // limit: lower the memory limit first, raise memsw first.
        let memsw = self.memory.join("memory.memsw.limit_in_bytes");
        match write(&limit, &bytes) {
            Ok(()) => write_if_exists(&memsw, &bytes)?,
            Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                write_if_exists(&memsw, &bytes)?;
                write(&limit, &bytes)?;
            }
            Err(e) => return Err(e),
        }
        write(&self.cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
        write(&self.cpu.join("cpu.cfs_quota_us"), &(limits.cpu_millis * CPU_PERIOD_US / 1000).to_string())?;
        write(&self.pids.join("pids.max"), &limits.pids_max.to_string())
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        let pid = pid.to_string();
        for dir in self.dirs() {
            write(&dir.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        read_procs(&self.memory)
    }

    fn memory_usage_bytes(&self) -> Result<u64, CgroupError> {
        let path = self.memory.join("memory.usage_in_bytes");
        parse_u64(&path, &read(&path)?)
    }

    fn memory_peak_bytes(&self) -> Result<u64, CgroupError> {
        let path = self.memory.join("memory.max_usage_in_bytes");
        parse_u64(&path, &read(&path)?)
    }

    fn oom_killed(&self) -> bool {
        read(&self.memory.join("memory.oom_control"))
            .ok()
            .and_then(|t| keyed_value(&t, "oom_kill"))
            .is_some_and(|n| n > 0)
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            kill_procs(dir)?;
        }
        Ok(())
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        // A process forked while others were being moved may have missed the move:
        // freeze, then check that nobody is outside, a few times.
        for _ in 0..4 {
            self.join_freezer()?;
            let state = self.freezer.join("freezer.state");
            write(&state, "FROZEN")?;
            wait_for(&state, |s| s.trim() == "FROZEN")?;
            if self.join_freezer()? == 0 {
                return Ok(());
            }
        }
        Err(CgroupError::Parse { path: self.freezer.clone(), content: "processes kept appearing outside the freezer".into() })
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        write_if_exists(&self.freezer.join("freezer.state"), "THAWED")
    }

    fn destroy(&self) -> Result<(), CgroupError> {
        let killed = self.kill_all();
        let _ = self.thaw();
        let _ = rmdir_retry(&self.freezer);
        let mut first_err = None;
        for dir in self.dirs() {
            if let Err(e) = rmdir_retry(dir) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => killed,
        }
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.dirs().iter().map(|p| p.to_path_buf()).collect()
    }
}

/// cgroup v2: one unified directory.
#[derive(Debug)]
pub struct CgroupV2 {
    root: PathBuf,
    dir: PathBuf,
}

impl CgroupV2 {
    pub fn new(root: &Path, id: &str) -> Self {
        CgroupV2 { root: root.to_path_buf(), dir: root.join(THAW_GROUP).join(id) }
    }
}

impl Cgroup for CgroupV2 {
    fn create(&self) -> Result<(), CgroupError> {
        let group = self.root.join(THAW_GROUP);
        match std::fs::create_dir(&group) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => return Err(io_err("mkdir", &group)(e)),
            _ => {}
        }
        // Idempotent; needed so that the leaf gets the controllers' files.
        write(&self.root.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
        write(&group.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
        std::fs::create_dir(&self.dir).map_err(io_err("mkdir", &self.dir))
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        write(&self.dir.join("memory.max"), &(limits.memory_mb << 20).to_string())?;
        write_if_exists(&self.dir.join("memory.swap.max"), "0")?;
        let quota = limits.cpu_millis * CPU_PERIOD_US / 1000;
        write(&self.dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        write(&self.dir.join("pids.max"), &limits.pids_max.to_string())
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    fn clone_target(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        read_procs(&self.dir)
    }

    fn memory_usage_bytes(&self) -> Result<u64, CgroupError> {
        let path = self.dir.join("memory.current");
        parse_u64(&path, &read(&path)?)
    }

    fn memory_peak_bytes(&self) -> Result<u64, CgroupError> {
        let path = self.dir.join("memory.peak");
        parse_u64(&path, &read(&path)?)
    }

    fn oom_killed(&self) -> bool {
        read(&self.dir.join("memory.events"))
            .ok()
            .and_then(|t| keyed_value(&t, "oom_kill"))
            .is_some_and(|n| n > 0)
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        let path = self.dir.join("cgroup.kill");
        match std::fs::OpenOptions::new().write(true).open(&path) {
            Ok(mut f) => io::Write::write_all(&mut f, b"1").map_err(io_err("write", &path)),
            // Kernels before 5.14, or the directory is already gone.
            Err(e) if e.kind() == ErrorKind::NotFound => kill_procs(&self.dir),
            Err(e) => Err(io_err("write", &path)(e)),
        }
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        write(&self.dir.join("cgroup.freeze"), "1")?;
        wait_for(&self.dir.join("cgroup.events"), |t| keyed_value(t, "frozen") == Some(1))
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        write_if_exists(&self.dir.join("cgroup.freeze"), "0")
    }

    fn destroy(&self) -> Result<(), CgroupError> {
        let killed = self.kill_all();
        // (cgroup.kill kills frozen processes too; thawing is for the fallback path.)
        let _ = self.thaw();
        rmdir_retry(&self.dir)?;
        killed
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.dir.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(p: PathBuf) -> String {
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn detects_version() {
        let t = tempfile::tempdir().unwrap();
        assert!(!is_v2(t.path()));
        assert_eq!(for_sandbox(t.path(), "a").paths().len(), 3);
        std::fs::write(t.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        assert!(is_v2(t.path()));
        assert_eq!(for_sandbox(t.path(), "a").paths(), vec![t.path().join("thaw/a")]);
    }

    #[test]
    fn v1_writes() {
        let t = tempfile::tempdir().unwrap();
        for c in ["memory", "cpu", "pids"] {
            std::fs::create_dir(t.path().join(c)).unwrap();
        }
        let cg = CgroupV1::new(t.path(), "sb1");
        cg.create().unwrap();
        let err = cg.create().unwrap_err();
        assert!(matches!(&err, CgroupError::Io { op: "mkdir", source, .. } if source.kind() == ErrorKind::AlreadyExists));
        assert_eq!(err.to_string(), format!("cgroup mkdir {}/memory/thaw/sb1", t.path().display()));
        cg.set_limits(&Limits { memory_mb: 128, cpu_millis: 250, pids_max: 64 }).unwrap();
        let m = t.path().join("memory/thaw/sb1");
        assert_eq!(content(m.join("memory.limit_in_bytes")), "134217728");
        assert!(!m.join("memory.memsw.limit_in_bytes").exists(), "memsw only written when present");
        std::fs::write(m.join("memory.memsw.limit_in_bytes"), "9223372036854771712\n").unwrap();
        cg.set_limits(&Limits { memory_mb: 128, cpu_millis: 250, pids_max: 64 }).unwrap();
        assert_eq!(content(m.join("memory.memsw.limit_in_bytes")), "134217728");
        assert_eq!(content(t.path().join("cpu/thaw/sb1/cpu.cfs_period_us")), "100000");
        assert_eq!(content(t.path().join("cpu/thaw/sb1/cpu.cfs_quota_us")), "25000");
        assert_eq!(content(t.path().join("pids/thaw/sb1/pids.max")), "64");
        cg.add_pid(4242).unwrap();
        for c in ["memory", "cpu", "pids"] {
            assert_eq!(content(t.path().join(c).join("thaw/sb1/cgroup.procs")), "4242");
        }
        assert_eq!(cg.pids().unwrap(), vec![4242]);

        assert!(!cg.oom_killed(), "no oom_control file yet");
        std::fs::write(m.join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n").unwrap();
        assert!(!cg.oom_killed());
        std::fs::write(m.join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        assert!(cg.oom_killed());
        std::fs::write(m.join("memory.usage_in_bytes"), "123456\n").unwrap();
        assert_eq!(cg.memory_usage_bytes().unwrap(), 123456);
        std::fs::write(m.join("memory.usage_in_bytes"), "junk").unwrap();
        assert!(matches!(cg.memory_usage_bytes(), Err(CgroupError::Parse { .. })));
        std::fs::write(m.join("memory.max_usage_in_bytes"), "777216\n").unwrap();
        assert_eq!(cg.memory_peak_bytes().unwrap(), 777216);
    }

    #[test]
    fn v1_freezer_is_created_on_first_freeze() {
        let t = tempfile::tempdir().unwrap();
        for c in ["memory", "cpu", "pids", "freezer"] {
            std::fs::create_dir(t.path().join(c)).unwrap();
        }
        let cg = CgroupV1::new(t.path(), "fz");
        cg.create().unwrap();
        let f = t.path().join("freezer/thaw/fz");
        assert!(!f.exists(), "spawning creates no freezer cgroup");
        cg.thaw().unwrap();
        cg.add_pid(4242).unwrap();
        cg.freeze().unwrap();
        assert_eq!(content(f.join("cgroup.procs")), "4242");
        assert_eq!(content(f.join("freezer.state")), "FROZEN");
        cg.thaw().unwrap();
        assert_eq!(content(f.join("freezer.state")), "THAWED");
    }

    #[test]
    fn v1_destroy_tolerates_missing_dirs() {
        let t = tempfile::tempdir().unwrap();
        for c in ["memory", "cpu", "pids"] {
            std::fs::create_dir(t.path().join(c)).unwrap();
        }
        let cg = CgroupV1::new(t.path(), "gone");
        cg.create().unwrap();
        cg.destroy().unwrap();
        for p in cg.paths() {
            assert!(!p.exists(), "{}", p.display());
        }
        cg.destroy().unwrap();
    }

    #[test]
    fn v1_create_rolls_back_partial() {
        let t = tempfile::tempdir().unwrap();
        // No "pids" hierarchy: the third mkdir fails, the first two are removed.
        for c in ["memory", "cpu"] {
            std::fs::create_dir(t.path().join(c)).unwrap();
        }
        let cg = CgroupV1::new(t.path(), "p");
        assert!(cg.create().is_err());
        assert!(!t.path().join("memory/thaw/p").exists());
        assert!(!t.path().join("cpu/thaw/p").exists());
    }

    #[test]
    fn v2_writes() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let cg = CgroupV2::new(t.path(), "sb2");
        cg.create().unwrap();
        assert_eq!(content(t.path().join("cgroup.subtree_control")), "+memory +cpu +pids");
        assert_eq!(content(t.path().join("thaw/cgroup.subtree_control")), "+memory +cpu +pids");
        let d = t.path().join("thaw/sb2");
        // Pretend the kernel created the interface files.
        std::fs::write(d.join("memory.swap.max"), "max\n").unwrap();
        cg.set_limits(&Limits { memory_mb: 256, cpu_millis: 1500, pids_max: 100 }).unwrap();
        assert_eq!(content(d.join("memory.max")), "268435456");
        assert_eq!(content(d.join("memory.swap.max")), "0");
        assert_eq!(content(d.join("cpu.max")), "150000 100000");
        assert_eq!(content(d.join("pids.max")), "100");
        cg.add_pid(77).unwrap();
        assert_eq!(content(d.join("cgroup.procs")), "77");

        std::fs::write(d.join("memory.events"), "low 0\nhigh 0\nmax 5\noom 1\noom_kill 0\n").unwrap();
        assert!(!cg.oom_killed());
        std::fs::write(d.join("memory.events"), "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n")
            .unwrap();
        assert!(cg.oom_killed());
        std::fs::write(d.join("memory.current"), "4096\n").unwrap();
        assert_eq!(cg.memory_usage_bytes().unwrap(), 4096);
        assert!(cg.memory_peak_bytes().is_err(), "no memory.peak before Linux 5.19");
        std::fs::write(d.join("memory.peak"), "8192\n").unwrap();
        assert_eq!(cg.memory_peak_bytes().unwrap(), 8192);
        // Pretend cgroup.kill exists (5.14+): destroy writes 1 to it.
        std::fs::write(d.join("cgroup.kill"), "").unwrap();
        cg.kill_all().unwrap();
        assert_eq!(content(d.join("cgroup.kill")), "1");
    }

    #[test]
    fn keyed_values() {
        assert_eq!(keyed_value("oom 3\noom_kill 4\n", "oom_kill"), Some(4));
        assert_eq!(keyed_value("oom_kill_disable 1\n", "oom_kill"), None);
    }
}
