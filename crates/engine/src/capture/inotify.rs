//! inotify instances (file watchers, hot-reload libraries): each watch is recorded by
//! the path of the inode it watches, found by walking the places an instance's own
//! files live (its /tmp and /dev/shm, its code at /var/task, its layers at /opt),
//! and added again by that path at restore, in the order of its watch descriptor.
//! fdinfo names a watch by inode and device only (`inotify wd:1 ino:.. sdev:..
//! mask:..`); a watch on an inode found nowhere there is refused by name. Events
//! queued at capture are read out first thing ([`read_queued`], before any walk of
//! ours could queue one) and checked here ([`queued`]): each must be one the restore can cause again on the same
//! watch (restore/inotify.rs) — an access, open or close of what a watch names,
//! and in the instance's own /tmp and /dev/shm a change of contents or mode, an
//! entry made, deleted, or renamed from one watched directory to another. Anything
//! else (an overflow, an event of a watch removed since, a watched object deleted
//! or moved away) is refused by name.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::CaptureError;
use crate::image::{InotifyEvent, InotifyWatch};
use crate::inject::{Call, DataArea, Injector};

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

/// The events queued on each inotify instance among `pid`'s descriptors `list` that
/// has any (those just received out of queued messages too): (descriptor, bytes queued, the bytes read
/// out, which are empty where there are more than a snapshot carries).
pub(super) fn read_queued(inj: &Injector<'_>, region: u64, pid: i32, list: &[crate::procfs::FdInfo]) -> Result<Vec<(i32, u32, Vec<u8>)>, CaptureError> {
    let mut out = Vec::new();
    for f in list.iter().filter(|f| f.target == "anon_inode:inotify") {
        let inject = |source| CaptureError::Inject { pid, source };
        let mut d = DataArea::new(region);
        let n_at = d.reserve(4);
        inj.run(&[Call::new("ioctl(FIONREAD)", libc::SYS_ioctl, &[f.fd as u64, libc::FIONREAD, n_at])], &mut d).map_err(inject)?;
        let n = d.u32_at(n_at);
        if n == 0 {
            continue;
        }
        let mut bytes = Vec::new();
        if n as usize <= super::PIPE_DATA_MAX {
            let buf = d.reserve(n as usize);
            let got = inj.run(&[Call::new("read(inotify)", libc::SYS_read, &[f.fd as u64, buf, n as u64])], &mut d).map_err(inject)?[0] as usize;
            bytes = d.bytes(buf, got).to_vec();
        }
        out.push((f.fd, n, bytes));
    }
    Ok(out)
}

/// The events `bytes` (what read(2) gave: `struct inotify_event`s, each followed by
/// its NUL-padded name) of inotify descriptor `fd` of `pid`, checked against its
/// `watches`: Err is the refusal.
pub(super) fn queued(pid: i32, fd: i32, bytes: &[u8], watches: &[InotifyWatch]) -> Result<Vec<InotifyEvent>, CaptureError> {
    let refuse = |why: String| CaptureError::Refused { pid, reason: format!("descriptor {fd} is an inotify instance with events queued: {why}") };
    let events = parse_events(bytes).map_err(refuse)?;
    check_events(Path::new(&format!("/proc/{pid}/root")), &events, watches).map_err(refuse)?;
    Ok(events)
}

/// `struct inotify_event`s as read(2) returns them.
fn parse_events(mut bytes: &[u8]) -> Result<Vec<InotifyEvent>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let word = |i: usize| bytes.get(i * 4..i * 4 + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let (Some(wd), Some(mask), Some(cookie), Some(len)) = (word(0), word(1), word(2), word(3)) else {
            return Err("a truncated event".into());
        };
        let name = bytes.get(16..16 + len as usize).ok_or("an event whose name runs past what was read")?;
        let name = name.split(|&b| b == 0).next().unwrap_or_default().to_vec();
        out.push(InotifyEvent { wd: wd as i32, mask, cookie, name });
        bytes = &bytes[16 + len as usize..];
    }
    Ok(out)
}

/// What event `e` is (its mask without `IN_ISDIR`), by name, for refusals.
fn event_name(mask: u32) -> String {
    const NAMES: [(u32, &str); 16] = [
        (libc::IN_ACCESS, "IN_ACCESS"),
        (libc::IN_MODIFY, "IN_MODIFY"),
        (libc::IN_ATTRIB, "IN_ATTRIB"),
        (libc::IN_CLOSE_WRITE, "IN_CLOSE_WRITE"),
        (libc::IN_CLOSE_NOWRITE, "IN_CLOSE_NOWRITE"),
        (libc::IN_OPEN, "IN_OPEN"),
        (libc::IN_MOVED_FROM, "IN_MOVED_FROM"),
        (libc::IN_MOVED_TO, "IN_MOVED_TO"),
        (libc::IN_CREATE, "IN_CREATE"),
        (libc::IN_DELETE, "IN_DELETE"),
        (libc::IN_DELETE_SELF, "IN_DELETE_SELF"),
        (libc::IN_MOVE_SELF, "IN_MOVE_SELF"),
        (libc::IN_UNMOUNT, "IN_UNMOUNT"),
        (libc::IN_Q_OVERFLOW, "IN_Q_OVERFLOW"),
        (libc::IN_IGNORED, "IN_IGNORED"),
        (libc::IN_ISDIR, "IN_ISDIR"),
    ];
    let names: Vec<&str> = NAMES.iter().filter(|(b, _)| mask & b != 0).map(|(_, n)| *n).collect();
    if names.is_empty() {
        format!("{mask:#x}")
    } else {
        names.join("|")
    }
}

/// Each event one the restore can cause again (see the module's doc); `root` is the
/// instance's root, where what a watch names is looked at.
fn check_events(root: &Path, events: &[InotifyEvent], watches: &[InotifyWatch]) -> Result<(), String> {
    let mut i = 0;
    while i < events.len() {
        let e = &events[i];
        let what = event_name(e.mask);
        let Some(w) = watches.iter().find(|w| w.wd == e.wd) else {
            return Err(format!("{what} of watch {}, which was removed since (or an overflow)", e.wd));
        };
        let target = if e.name.is_empty() { w.path.clone() } else { format!("{}/{}", w.path.trim_end_matches('/'), String::from_utf8_lossy(&e.name)) };
        if e.name.contains(&b'/') || std::str::from_utf8(&e.name).is_err() {
            return Err(format!("{what} named {:?}, which is not a plain UTF-8 name", String::from_utf8_lossy(&e.name)));
        }
        let own = crate::tmpfs::holds(&w.path);
        let meta = std::fs::symlink_metadata(root.join(target.trim_start_matches('/')));
        let is_dir = e.mask & libc::IN_ISDIR != 0;
        let ok = match e.mask & !libc::IN_ISDIR {
            // An entry of one of the instance's own directories: the restore stands a
            // fresh one in for it where it is gone or not fit.
            libc::IN_OPEN | libc::IN_CLOSE_NOWRITE | libc::IN_ACCESS | libc::IN_MODIFY | libc::IN_CLOSE_WRITE | libc::IN_ATTRIB if own && !e.name.is_empty() => true,
            libc::IN_OPEN | libc::IN_CLOSE_NOWRITE => meta.as_ref().is_ok_and(|m| m.is_file() || m.is_dir()),
            // A read of one byte, or a listing.
            libc::IN_ACCESS => meta.as_ref().is_ok_and(|m| m.is_dir() || m.is_file() && m.len() > 0),
            libc::IN_MODIFY | libc::IN_CLOSE_WRITE => own && meta.as_ref().is_ok_and(|m| m.is_file()),
            libc::IN_ATTRIB => own && meta.as_ref().is_ok_and(|m| m.is_file() || m.is_dir()),
            // An entry made or deleted (what is there now is set aside meanwhile).
            libc::IN_CREATE | libc::IN_DELETE => own && !e.name.is_empty(),
            libc::IN_MOVED_FROM => {
                // One rename: its IN_MOVED_TO follows at once, with the same cookie.
                let to = events.get(i + 1).filter(|t| t.mask & !libc::IN_ISDIR == libc::IN_MOVED_TO && t.cookie == e.cookie && (t.mask & libc::IN_ISDIR != 0) == is_dir);
                let to_watch = to.and_then(|t| watches.iter().find(|w| w.wd == t.wd));
                match (to, to_watch) {
                    (Some(t), Some(tw)) if own && crate::tmpfs::holds(&tw.path) && !e.name.is_empty() && !t.name.is_empty() && !t.name.contains(&b'/') && std::str::from_utf8(&t.name).is_ok() => {
                        i += 2;
                        continue;
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        if !ok {
            return Err(format!(
                "{what} on {target}, which a restore cannot cause again (an access, open or close of what a watch names, and in /tmp or /dev/shm a change, an entry made or deleted, or a rename between watched directories, are)"
            ));
        }
        i += 1;
    }
    Ok(())
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

    fn event(wd: i32, mask: u32, cookie: u32, name: &[u8]) -> Vec<u8> {
        let len = if name.is_empty() { 0 } else { (name.len() + 1).div_ceil(16) * 16 };
        let mut b = [wd as u32, mask, cookie, len as u32].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        b.extend_from_slice(name);
        b.resize(16 + len, 0);
        b
    }

    #[test]
    fn queued_events_are_read_as_the_kernel_writes_them() {
        let mut bytes = event(1, libc::IN_CREATE, 0, b"early");
        bytes.extend(event(2, libc::IN_ACCESS, 0, b""));
        let got = parse_events(&bytes).unwrap();
        assert_eq!(got[0], InotifyEvent { wd: 1, mask: libc::IN_CREATE, cookie: 0, name: b"early".to_vec() });
        assert_eq!(got[1], InotifyEvent { wd: 2, mask: libc::IN_ACCESS, cookie: 0, name: Vec::new() });
        assert!(parse_events(&bytes[..20]).is_err(), "a name past the end");
        assert!(parse_events(&bytes[..10]).is_err(), "a truncated header");
    }

    #[test]
    fn only_events_a_restore_can_cause_again_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("tmp/w")).unwrap();
        std::fs::create_dir_all(dir.path().join("var/task")).unwrap();
        std::fs::write(dir.path().join("var/task/code"), b"x").unwrap();
        let watches = [
            InotifyWatch { wd: 1, path: "/tmp/w".into(), mask: libc::IN_ALL_EVENTS },
            InotifyWatch { wd: 2, path: "/var/task/code".into(), mask: libc::IN_ALL_EVENTS },
        ];
        let ev = |wd, mask, cookie, name: &[u8]| InotifyEvent { wd, mask, cookie, name: name.to_vec() };
        let check = |events: &[InotifyEvent]| check_events(dir.path(), events, &watches);
        // In the instance's own /tmp: made, deleted, renamed, changed (what is gone is stood in for).
        let own = [
            ev(1, libc::IN_CREATE, 0, b"a"),
            ev(1, libc::IN_MODIFY, 0, b"a"),
            ev(1, libc::IN_MOVED_FROM, 7, b"a"),
            ev(1, libc::IN_MOVED_TO, 7, b"b"),
            ev(1, libc::IN_DELETE | libc::IN_ISDIR, 0, b"d"),
        ];
        assert_eq!(check(&own), Ok(()));
        // The code: read, never changed.
        assert_eq!(check(&[ev(2, libc::IN_OPEN, 0, b""), ev(2, libc::IN_ACCESS, 0, b"")]), Ok(()));
        let refused = |events: &[InotifyEvent], why: &str| {
            let e = check(events).unwrap_err();
            assert!(e.contains(why), "{e:?} should say {why:?}");
        };
        refused(&[ev(2, libc::IN_MODIFY, 0, b"")], "IN_MODIFY on /var/task/code");
        refused(&[ev(3, libc::IN_CREATE, 0, b"x")], "watch 3, which was removed");
        refused(&[ev(1, libc::IN_IGNORED, 0, b"")], "IN_IGNORED");
        refused(&[ev(1, libc::IN_Q_OVERFLOW, 0, b"")], "IN_Q_OVERFLOW");
        refused(&[ev(1, libc::IN_MOVED_FROM, 7, b"a")], "IN_MOVED_FROM");
        refused(&[ev(1, libc::IN_MOVED_FROM, 7, b"a"), ev(1, libc::IN_MOVED_TO, 8, b"b")], "IN_MOVED_FROM");
        refused(&[ev(1, libc::IN_DELETE_SELF, 0, b"")], "IN_DELETE_SELF");
        refused(&[ev(1, libc::IN_CREATE, 0, b"a/b")], "not a plain");
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
