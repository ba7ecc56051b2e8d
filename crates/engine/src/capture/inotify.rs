//! inotify instances (file watchers, hot-reload libraries): each watch is recorded by
//! the path of the inode it watches, found by walking the places an instance's own
//! files live (its /tmp and /dev/shm, its code at /var/task, its layers at /opt),
//! and added again by that path at restore, in the order of its watch descriptor.
//! fdinfo names a watch by inode and device only (`inotify wd:1 ino:.. sdev:..
//! mask:..`); a watch on an inode found nowhere there is refused by name. Events
//! queued at capture are refused too (checked with the pipes, `injected_state`):
//! an event cannot be put back into a new instance.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::CaptureError;
use crate::image::InotifyWatch;

/// Where a watched inode is looked for, under the instance's root.
const ROOTS: [&str; 4] = ["/tmp", "/dev/shm", "/var/task", "/opt"];

/// More entries than this under the roots: refused rather than walked on.
const WALK_MAX: usize = 200_000;

/// One `inotify` line of fdinfo: (wd, inode, device as `st_dev`, mask).
fn parse_line(line: &str) -> Option<(i32, u64, u64, u32)> {
    let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k));
    let wd = field("wd:")?.parse().ok()?;
    let ino = u64::from_str_radix(field("ino:")?, 16).ok()?;
    // The kernel's own encoding of a device (major << 20 | minor), not st_dev's.
    let sdev = u64::from_str_radix(field("sdev:")?, 16).ok()?;
    let dev = libc::makedev((sdev >> 20) as u32, (sdev & 0xfffff) as u32);
    let mask = u32::from_str_radix(field("mask:")?, 16).ok()?;
    Some((wd, ino, dev, mask))
}

/// The watches of inotify descriptor `fd` of `pid` (fdinfo `info`), in watch
/// descriptor order, each with the path (in the instance) of the inode it watches.
pub(super) fn watches(pid: i32, fd: i32, info: &str) -> Result<Vec<InotifyWatch>, CaptureError> {
    let refuse = |reason: String| CaptureError::Refused { pid, reason };
    let mut raw = Vec::new();
    for line in info.lines().filter(|l| l.starts_with("inotify ")) {
        raw.push(parse_line(line).ok_or_else(|| refuse(format!("descriptor {fd} is an inotify instance with a watch thaw cannot read: {line}")))?);
    }
    raw.sort_unstable_by_key(|w| w.0);
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let root = format!("/proc/{pid}/root");
    let mut want: Vec<(u64, u64)> = raw.iter().map(|w| (w.2, w.1)).collect();
    want.sort_unstable();
    let found = find(Path::new(&root), &want).map_err(|e| refuse(format!("descriptor {fd} is an inotify instance whose watched files cannot be looked up: {e}")))?;
    raw.into_iter()
        .map(|(wd, ino, dev, mask)| match found.iter().find(|f| f.0 == (dev, ino)) {
            Some((_, path)) => Ok(InotifyWatch { wd, path: path.clone(), mask }),
            None => Err(refuse(format!(
                "descriptor {fd} is an inotify instance watching inode {ino} (device {}:{}) outside {}; such a watch cannot be added again by path",
                libc::major(dev),
                libc::minor(dev),
                ROOTS.join(", ")
            ))),
        })
        .collect()
}

/// An inode as (device, inode number).
type InodeKey = (u64, u64);

/// The paths (in the instance) of the inodes `want` (sorted) under [`ROOTS`] of
/// `root`: the first path met for each, the roots themselves included.
fn find(root: &Path, want: &[InodeKey]) -> Result<Vec<(InodeKey, String)>, String> {
    let mut found = Vec::new();
    let mut seen = 0usize;
    let mut stack: Vec<String> = ROOTS.iter().map(|r| r.to_string()).collect();
    while let Some(path) = stack.pop() {
        let host = root.join(path.trim_start_matches('/'));
        let Ok(meta) = std::fs::symlink_metadata(&host) else { continue };
        let key = (meta.dev(), meta.ino());
        if want.binary_search(&key).is_ok() && !found.iter().any(|f: &(InodeKey, String)| f.0 == key) {
            found.push((key, path.clone()));
            if found.len() == want.len() {
                break;
            }
        }
        if meta.is_dir() {
            for e in std::fs::read_dir(&host).map_err(|e| format!("listing {path}: {e}"))? {
                let e = e.map_err(|e| format!("listing {path}: {e}"))?;
                seen += 1;
                if seen > WALK_MAX {
                    return Err(format!("over {WALK_MAX} files under {}", ROOTS.join(", ")));
                }
                stack.push(format!("{}/{}", path.trim_end_matches('/'), e.file_name().to_string_lossy()));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_lines_read_as_the_kernel_writes_them() {
        let line = "inotify wd:2 ino:9fc4cf sdev:fe00000 mask:80000002 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:cfc49f00";
        assert_eq!(parse_line(line), Some((2, 0x9fc4cf, libc::makedev(0xfe, 0), 0x8000_0002)));
        assert_eq!(parse_line("inotify wd:1 ino:zz sdev:0 mask:1"), None);
        assert_eq!(parse_line("inotify ino:1 sdev:0 mask:1"), None);
    }

    #[test]
    fn watched_inodes_are_found_by_path_under_the_roots() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("tmp/a/b")).unwrap();
        std::fs::write(dir.path().join("tmp/a/b/f"), b"x").unwrap();
        let m = |p: &str| std::fs::metadata(dir.path().join(p)).unwrap();
        let key = |p: &str| (m(p).dev(), m(p).ino());
        let mut want = vec![key("tmp/a/b"), key("tmp/a/b/f"), key("tmp")];
        want.sort_unstable();
        let mut got = find(dir.path(), &want).unwrap();
        got.sort();
        let mut expect = vec![(key("tmp/a/b"), "/tmp/a/b".to_string()), (key("tmp/a/b/f"), "/tmp/a/b/f".to_string()), (key("tmp"), "/tmp".to_string())];
        expect.sort();
        assert_eq!(got, expect);
        assert!(find(dir.path(), &[(1, 1)]).unwrap().is_empty(), "an inode found nowhere is not made up");
    }
}
