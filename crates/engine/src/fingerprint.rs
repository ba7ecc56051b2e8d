//! The fingerprint of a function bundle (the code directory mounted at
//! `/var/task`), recorded in the image at capture and checked when a snapshot is
//! opened: a restore over a changed bundle would run the old code, already loaded
//! in the image's memory, next to new files. Metadata only (path, type, size,
//! modification time, mode, symlink target), so checking a large bundle costs
//! a directory walk, not reading every file.
//!
//! After a cold page and dentry cache the walk is thousands of small reads (23 ms for
//! a 6,242-file scikit-learn bundle, one at a time), so it is kept off the restore's
//! path: [`CodeCheck`] says how a snapshot's opener checks, and [`Verdict`] is a walk
//! running beside the restores. The walk itself runs on a few threads at once (the
//! disk serves many small reads in parallel far faster than in sequence); the
//! listing is sorted before hashing, so the fingerprint does not depend on the order.
//! Hand-written (a queue and a condition variable) rather than a parallel-walk crate:
//! those bring a global thread pool into the restore path for forty lines of code.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use sha2::{Digest, Sha256};

/// Threads of one walk.
const WALKERS: usize = 8;

/// How opening a snapshot makes sure the function's files are those it captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodeCheck {
    /// Walk the bundle before the snapshot opens.
    Before,
    /// Walk beside the restores: they go on meanwhile, and each restored instance
    /// waits for the verdict before its runtime is told it was restored (the first
    /// thing after the restore that runs function code); a changed bundle kills it.
    Beside,
    /// The opener knows the fingerprint of the bundle at these paths (a node, of the
    /// revision directories it owns: written once at deploy, root-only, never
    /// changed). Compared with the image's, no walk. An image captured over other
    /// paths with this same fingerprint (the same bundle unpacked elsewhere, e.g. on
    /// another node) is restored over these paths; with another fingerprint, its own
    /// paths are walked before it opens.
    Known { code_dir: PathBuf, opt_dir: Option<PathBuf>, fingerprint: String },
    /// No check: the baseline of benchmarks that measure what the check costs.
    Unchecked,
}

impl CodeCheck {
    /// The check `THAW_CODE_CHECK` names (`before`, `beside`, `unchecked`); `beside`
    /// when unset. Anything else is an error naming the choices.
    pub fn from_env() -> Result<CodeCheck, String> {
        match std::env::var("THAW_CODE_CHECK").as_deref() {
            Err(_) | Ok("") | Ok("beside") => Ok(CodeCheck::Beside),
            Ok("before") => Ok(CodeCheck::Before),
            Ok("unchecked") => Ok(CodeCheck::Unchecked),
            Ok(other) => Err(format!("THAW_CODE_CHECK={other}: expected before, beside or unchecked")),
        }
    }
}

/// The message of a bundle that does not match its snapshot.
pub fn changed_message(code: &Path) -> String {
    format!("the function bundle {} changed since the snapshot was taken; re-create the snapshot", code.display())
}

/// The message of a bundle that cannot be read.
pub fn unreadable_message(code: &Path, e: &io::Error) -> String {
    format!("the function bundle {} cannot be read: {e}", code.display())
}

/// Whether the bundle at `code` (and `opt`) still has the fingerprint `expected`;
/// the error says why not.
pub fn check(code: &Path, opt: Option<&Path>, expected: &str) -> Result<(), String> {
    match of_bundle(code, opt) {
        Ok(now) if now == expected => Ok(()),
        Ok(_) => Err(changed_message(code)),
        Err(e) => Err(unreadable_message(code, &e)),
    }
}

/// The outcome of a check, possibly still running on its own thread.
pub struct Verdict {
    state: Mutex<Option<Result<(), String>>>,
    done: Condvar,
}

impl Verdict {
    /// A verdict already given.
    pub fn given(r: Result<(), String>) -> Arc<Verdict> {
        Arc::new(Verdict { state: Mutex::new(Some(r)), done: Condvar::new() })
    }

    /// [`check`] on a thread of its own; [`Verdict::wait`] for the outcome.
    pub fn beside(code: PathBuf, opt: Option<PathBuf>, expected: String) -> Arc<Verdict> {
        Verdict::spawn("thaw-code-check", move || check(&code, opt.as_deref(), &expected))
    }

    /// `check` on a thread of its own named `name`; [`Verdict::wait`] for the outcome.
    pub fn spawn(name: &str, check: impl FnOnce() -> Result<(), String> + Send + 'static) -> Arc<Verdict> {
        let v = Arc::new(Verdict { state: Mutex::new(None), done: Condvar::new() });
        let out = v.clone();
        let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
            let r = check();
            *out.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            out.done.notify_all();
        });
        match spawned {
            Ok(_) => v,
            Err(e) => Verdict::given(Err(format!("cannot start the {name} thread: {e}"))),
        }
    }

    /// The outcome if the check has ended.
    pub fn given_now(&self) -> Option<Result<(), String>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Block until the check has ended; its outcome.
    pub fn wait(&self) -> Result<(), String> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = &*st {
                return r.clone();
            }
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The fingerprint of a function's files: its code directory and, when it has
/// layers, the directory they were extracted to (mounted at `/opt`).
pub fn of_bundle(code: &Path, opt: Option<&Path>) -> io::Result<String> {
    let code = of_dir(code)?;
    match opt {
        None => Ok(code),
        Some(opt) => Ok(format!("{code}+{}", of_dir(opt)?)),
    }
}

/// Hex SHA-256 over the sorted listing of `dir`.
pub fn of_dir(dir: &Path) -> io::Result<String> {
    let mut lines = walk(dir)?;
    lines.sort();
    let mut h = Sha256::new();
    for l in &lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    Ok(hex(&h.finalize()))
}

/// Directories still to list, and how many are being listed.
struct Queue {
    todo: Vec<(PathBuf, String)>,
    busy: usize,
    failed: Option<io::Error>,
}

/// Every entry below `root`, one line each, in no particular order.
fn walk(root: &Path) -> io::Result<Vec<String>> {
    let queue = Mutex::new(Queue { todo: vec![(root.to_path_buf(), String::new())], busy: 0, failed: None });
    let more = Condvar::new();
    let lines = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..WALKERS {
            s.spawn(|| loop {
                let (dir, rel) = {
                    let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
                    loop {
                        if q.failed.is_some() || (q.todo.is_empty() && q.busy == 0) {
                            more.notify_all();
                            return;
                        }
                        if let Some(d) = q.todo.pop() {
                            q.busy += 1;
                            break d;
                        }
                        q = more.wait(q).unwrap_or_else(|p| p.into_inner());
                    }
                };
                let mut subdirs = Vec::new();
                let listed = list(&dir, &rel, &mut subdirs);
                let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
                q.busy -= 1;
                match listed {
                    Ok(mine) => {
                        q.todo.extend(subdirs);
                        lines.lock().unwrap_or_else(|p| p.into_inner()).extend(mine);
                    }
                    Err(e) => q.failed = q.failed.take().or(Some(e)),
                }
                more.notify_all();
            });
        }
    });
    match queue.into_inner().unwrap_or_else(|p| p.into_inner()).failed {
        Some(e) => Err(e),
        None => Ok(lines.into_inner().unwrap_or_else(|p| p.into_inner())),
    }
}

/// The lines of `dir`'s entries; its subdirectories are added to `subdirs`.
fn list(dir: &Path, rel: &str, subdirs: &mut Vec<(PathBuf, String)>) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = format!("{rel}/{}", e.file_name().to_string_lossy());
        // Relative to the listed directory (fstatat on its descriptor, not following
        // a symlink): no walk of the whole path for every entry.
        let m = e.metadata()?;
        let ft = m.file_type();
        let (kind, extra) = if ft.is_symlink() {
            ("l", std::fs::read_link(e.path())?.to_string_lossy().into_owned())
        } else if ft.is_dir() {
            ("d", String::new())
        } else {
            ("f", String::new())
        };
        out.push(format!("{name}\0{kind}\0{}\0{}.{}\0{:o}\0{extra}", m.len(), m.mtime(), m.mtime_nsec(), m.mode()));
        if ft.is_dir() {
            subdirs.push((e.path(), name));
        }
    }
    Ok(out)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_with_any_file_and_not_otherwise() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("pkg")).unwrap();
        std::fs::write(d.path().join("pkg/a.py"), "x = 1\n").unwrap();
        let f1 = of_dir(d.path()).unwrap();
        assert_eq!(f1, of_dir(d.path()).unwrap());
        std::fs::write(d.path().join("pkg/a.py"), "x = 22\n").unwrap();
        let f2 = of_dir(d.path()).unwrap();
        assert_ne!(f1, f2, "a changed size");
        std::fs::write(d.path().join("new.py"), "").unwrap();
        assert_ne!(f2, of_dir(d.path()).unwrap(), "an added file");
    }

    /// The same listing as a plain one-thread walk, in whatever order the threads ran.
    #[test]
    fn the_parallel_walk_sees_every_entry_once() {
        let d = tempfile::tempdir().unwrap();
        let mut want = Vec::new();
        for i in 0..20 {
            let sub = d.path().join(format!("d{i}/e{}", i % 3));
            std::fs::create_dir_all(&sub).unwrap();
            for j in 0..5 {
                std::fs::write(sub.join(format!("f{j}")), "x").unwrap();
                want.push(format!("/d{i}/e{}/f{j}", i % 3));
            }
            want.push(format!("/d{i}"));
            want.push(format!("/d{i}/e{}", i % 3));
        }
        std::os::unix::fs::symlink("d1", d.path().join("link")).unwrap();
        want.push("/link".into());
        let mut got: Vec<String> = walk(d.path()).unwrap().into_iter().map(|l| l.split('\0').next().unwrap().to_string()).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        assert!(walk(&d.path().join("missing")).is_err(), "a missing directory is an error");
    }

    #[test]
    fn a_verdict_beside_says_whether_the_bundle_changed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.py"), "x = 1\n").unwrap();
        let print = of_bundle(d.path(), None).unwrap();
        assert_eq!(Verdict::beside(d.path().to_path_buf(), None, print.clone()).wait(), Ok(()));
        std::fs::write(d.path().join("a.py"), "x = 22\n").unwrap();
        let v = Verdict::beside(d.path().to_path_buf(), None, print);
        assert_eq!(v.wait(), Err(changed_message(d.path())));
        assert_eq!(v.wait(), Err(changed_message(d.path())), "asked again, the same answer");
        let gone = d.path().join("gone");
        assert!(check(&gone, None, "x").unwrap_err().contains("cannot be read"));
    }
}
