//! The sandbox's private tmpfs mounts (`/tmp`, `/dev/shm`) are part of an
//! instance: what the function wrote there during init is captured with the image
//! and written back into the new sandbox before the restored process resumes.
//!
//! Only what can be recreated exactly is captured: directories, regular files
//! (contents, mode, owner, mtime), symlinks, FIFOs (made again empty: what was in
//! one belongs to a descriptor, and a FIFO the process holds open is refused with
//! it) and hard links (a file's further names, linked again to its first). A socket
//! or device node is refused at capture, naming it.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The tmpfs mounts of a sandbox that belong to the instance.
pub const MOUNTS: [&str; 2] = ["/tmp", "/dev/shm"];

/// Whether `path` (inside the sandbox) lies below one of [`MOUNTS`]: a file of the
/// instance's own, which every instance gets a copy of.
pub fn holds(path: &str) -> bool {
    MOUNTS.iter().any(|m| path.strip_prefix(m).is_some_and(|rest| rest.starts_with('/')))
}

#[derive(Debug, Error)]
pub enum TmpfsError {
    #[error("{path} is a {kind}, which cannot be carried across a snapshot (remove it before init ends)")]
    Unsupported { path: String, kind: &'static str },
    #[error("{what} {path}")]
    Io { what: &'static str, path: PathBuf, #[source] source: io::Error },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File { data: Vec<u8> },
    Symlink { target: String },
    /// A named pipe (appended: older images keep their variants' numbers).
    Fifo,
    /// A further name of the file first captured at `to` (a hard link).
    Link { to: String },
}

/// One file system object, with its path inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
}

/// Everything below the sandbox's tmpfs mounts, parents before children. `root` is
/// the sandbox's root as seen from the host (`/proc/PID/root`).
pub fn capture(root: &Path) -> Result<Vec<Entry>, TmpfsError> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for m in MOUNTS {
        let host = root.join(m.trim_start_matches('/'));
        if host.is_dir() {
            walk(&host, m, &mut out, &mut seen)?;
        }
    }
    Ok(out)
}

/// `seen`: the first path of each file with several links, by (device, inode).
fn walk(host: &Path, inside: &str, out: &mut Vec<Entry>, seen: &mut std::collections::HashMap<(u64, u64), String>) -> Result<(), TmpfsError> {
    let ioe = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| TmpfsError::Io { what, path, source }
    };
    let mut names: Vec<_> = std::fs::read_dir(host)
        .map_err(ioe("listing", host))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(ioe("listing", host))?;
    names.sort();
    for name in names {
        let h = host.join(&name);
        let path = format!("{inside}/{}", name.to_string_lossy());
        let meta = std::fs::symlink_metadata(&h).map_err(ioe("stat of", &h))?;
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_symlink() {
            let t = std::fs::read_link(&h).map_err(ioe("reading link", &h))?;
            EntryKind::Symlink { target: t.to_string_lossy().into_owned() }
        } else if ft.is_file() && meta.nlink() > 1 && seen.contains_key(&(meta.dev(), meta.ino())) {
            EntryKind::Link { to: seen[&(meta.dev(), meta.ino())].clone() }
        } else if ft.is_file() {
            if meta.nlink() > 1 {
                seen.insert((meta.dev(), meta.ino()), path.clone());
            }
            EntryKind::File { data: std::fs::read(&h).map_err(ioe("reading", &h))? }
        } else if ft.is_fifo() {
            EntryKind::Fifo
        } else {
            let kind = if ft.is_socket() {
                "unix socket"
            } else {
                "device node"
            };
            return Err(TmpfsError::Unsupported { path, kind });
        };
        let is_dir = matches!(kind, EntryKind::Dir);
        out.push(Entry {
            path: path.clone(),
            kind,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        });
        if is_dir {
            walk(&h, &path, out, seen)?;
        }
    }
    Ok(())
}

/// Write `entries` below `root` (a new sandbox's root seen from the host), with
/// their modes, owners and modification times. Directories' times are set last,
/// after their contents.
pub fn restore(root: &Path, entries: &[Entry]) -> Result<(), TmpfsError> {
    let ioe = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| TmpfsError::Io { what, path, source }
    };
    for e in entries {
        let h = root.join(e.path.trim_start_matches('/'));
        match &e.kind {
            EntryKind::Dir => std::fs::create_dir(&h).map_err(ioe("creating directory", &h))?,
            EntryKind::File { data } => std::fs::write(&h, data).map_err(ioe("writing", &h))?,
            EntryKind::Symlink { target } => std::os::unix::fs::symlink(target, &h).map_err(ioe("creating symlink", &h))?,
            EntryKind::Fifo => nix::unistd::mkfifo(&h, nix::sys::stat::Mode::from_bits_truncate(e.mode))
                .map_err(|err| TmpfsError::Io { what: "making FIFO", path: h.clone(), source: err.into() })?,
            EntryKind::Link { to } => std::fs::hard_link(root.join(to.trim_start_matches('/')), &h).map_err(ioe("linking", &h))?,
        }
        std::os::unix::fs::lchown(&h, Some(e.uid), Some(e.gid)).map_err(ioe("chown of", &h))?;
        if !matches!(e.kind, EntryKind::Symlink { .. }) {
            std::fs::set_permissions(&h, std::fs::Permissions::from_mode(e.mode)).map_err(ioe("chmod of", &h))?;
        }
    }
    for e in entries.iter().rev() {
        let h = root.join(e.path.trim_start_matches('/'));
        let t = |(s, ns): (i64, i64)| nix::sys::time::TimeSpec::new(s, ns);
        nix::sys::stat::utimensat(
            None,
            &h,
            &t(e.mtime),
            &t(e.mtime),
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|err| TmpfsError::Io { what: "setting times of", path: h.clone(), source: err.into() })?;
    }
    Ok(())
}

/// Bytes of file contents in `entries`.
pub fn bytes(entries: &[Entry]) -> u64 {
    entries.iter().map(|e| if let EntryKind::File { data } = &e.kind { data.len() as u64 } else { 0 }).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_a_tree_fifos_and_hard_links_and_refuses_sockets() {
        let src = tempfile::tempdir().unwrap();
        let tmp = src.path().join("tmp");
        std::fs::create_dir_all(tmp.join("a/b")).unwrap();
        std::fs::write(tmp.join("a/b/f"), b"contents").unwrap();
        std::fs::set_permissions(tmp.join("a/b/f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink("a/b/f", tmp.join("link")).unwrap();
        let entries = capture(src.path()).unwrap();
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/tmp/a", "/tmp/a/b", "/tmp/a/b/f", "/tmp/link"]);
        assert_eq!(bytes(&entries), 8);

        let dst = tempfile::tempdir().unwrap();
        std::fs::create_dir(dst.path().join("tmp")).unwrap();
        restore(dst.path(), &entries).unwrap();
        assert_eq!(std::fs::read(dst.path().join("tmp/a/b/f")).unwrap(), b"contents");
        assert_eq!(std::fs::metadata(dst.path().join("tmp/a/b/f")).unwrap().mode() & 0o777, 0o640);
        assert_eq!(std::fs::read_link(dst.path().join("tmp/link")).unwrap(), Path::new("a/b/f"));
        assert_eq!(capture(dst.path()).unwrap(), entries, "contents, modes, owners and times survive");

        // A FIFO and a second name of a file are made again as such.
        nix::unistd::mkfifo(&tmp.join("pipe"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::hard_link(tmp.join("a/b/f"), tmp.join("f2")).unwrap();
        let entries = capture(src.path()).unwrap();
        assert!(entries.iter().any(|e| e.path == "/tmp/f2" && e.kind == EntryKind::Link { to: "/tmp/a/b/f".into() }), "{entries:?}");
        assert!(entries.iter().any(|e| e.path == "/tmp/pipe" && e.kind == EntryKind::Fifo), "{entries:?}");
        let dst = tempfile::tempdir().unwrap();
        std::fs::create_dir(dst.path().join("tmp")).unwrap();
        restore(dst.path(), &entries).unwrap();
        assert!(std::fs::symlink_metadata(dst.path().join("tmp/pipe")).unwrap().file_type().is_fifo());
        let (a, b) = (std::fs::metadata(dst.path().join("tmp/a/b/f")).unwrap(), std::fs::metadata(dst.path().join("tmp/f2")).unwrap());
        assert_eq!((a.ino(), a.nlink()), (b.ino(), 2), "one file with two names");
        assert_eq!(capture(dst.path()).unwrap(), entries);

        // A unix socket is refused, naming it.
        let _l = std::os::unix::net::UnixListener::bind(tmp.join("sock")).unwrap();
        let e = capture(src.path()).unwrap_err().to_string();
        assert_eq!(e, "/tmp/sock is a unix socket, which cannot be carried across a snapshot (remove it before init ends)");
    }
}
