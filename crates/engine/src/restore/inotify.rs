//! Events queued on inotify instances at capture, caused again before the process
//! resumes (capture/inotify.rs says which kinds can be). A new instance cannot be
//! handed an event, but the kernel queues one for whatever causes it, so each is
//! caused again, from outside the process and in order:
//! 1. each instance is taken with `pidfd_getfd` and every watch of every instance
//!    is made quiet (a mask of `IN_UNMOUNT` alone, which nothing here causes);
//! 2. for each event, its watch's mask is set to that event alone, the file
//!    operation that causes it is done (an open, a one-byte read or a listing, a
//!    truncate to the same size, a chmod to the same mode, an entry made, deleted,
//!    or renamed between two watched directories), and the watch is quiet again;
//!    whatever stands at a name the operation needs is set aside meanwhile and put
//!    back, and the access and modification times of what was touched in /tmp and
//!    /dev/shm are set back (the change times cannot be);
//! 3. every watch gets its mask back.
//!
//! The kernel merges an event equal to the last one queued, as it did at capture,
//! so the queue reads the same; a rename's two events share a new cookie.
//! Every path is resolved inside the instance's root without following any
//! symbolic link (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{self as rfs, inotify, AtFlags, Mode, OFlags, ResolveFlags, Timestamps};

use crate::image::{FdKind, InotifyEvent, InotifyWatch, ProcessImage};

/// A mask nothing done here causes (only an unmount does).
const QUIET: u32 = libc::IN_UNMOUNT;

/// Whether any inotify instance of `img` had events queued.
pub(super) fn any(img: &ProcessImage) -> bool {
    img.fds.iter().any(|r| matches!(&r.kind, FdKind::Inotify { queued, .. } if !queued.is_empty()))
}

/// Cause the queued events of `img`'s inotify instances again in process `pid`
/// (stopped, its descriptors restored). Err says what failed.
pub(super) fn put_back(pid: i32, pidfd: BorrowedFd<'_>, img: &ProcessImage) -> Result<(), String> {
    let root = rfs::open(format!("/proc/{pid}/root"), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("opening the instance's root: {e}"))?;
    let mut instances = Vec::new();
    for r in &img.fds {
        if let FdKind::Inotify { watches, queued, .. } = &r.kind {
            let fd = crate::sys::mem::pidfd_getfd(pidfd, r.fd).map_err(|e| format!("taking inotify descriptor {} (pidfd_getfd): {e}", r.fd))?;
            instances.push((fd, &watches[..], &queued[..]));
        }
    }
    let w = Watches { root: root.as_fd() };
    for (fd, watches, _) in &instances {
        for x in watches.iter() {
            w.set(fd.as_fd(), x, QUIET)?;
        }
    }
    for (fd, watches, queued) in &instances {
        let mut i = 0;
        while i < queued.len() {
            let e = &queued[i];
            let watch = |wd: i32| watches.iter().find(|x| x.wd == wd).ok_or_else(|| format!("an event of watch {wd}, which the image does not have"));
            if e.mask & !libc::IN_ISDIR == libc::IN_MOVED_FROM {
                let to = queued.get(i + 1).ok_or("an IN_MOVED_FROM without its IN_MOVED_TO")?;
                w.rename(fd.as_fd(), (watch(e.wd)?, e), (watch(to.wd)?, to))?;
                i += 2;
            } else {
                w.cause(fd.as_fd(), watch(e.wd)?, e)?;
                i += 1;
            }
        }
    }
    for (fd, watches, _) in &instances {
        for x in watches.iter() {
            w.set(fd.as_fd(), x, x.mask)?;
        }
    }
    Ok(())
}

/// A directory readied by [`Watches::clear`].
struct Cleared {
    dir: OwnedFd,
    kept: Timestamps,
    aside: Option<String>,
}

impl Cleared {
    /// What was set aside back at `name`, and the directory's times back.
    fn put_back(self, name: &str) -> Result<(), String> {
        if let Some(aside) = &self.aside {
            rfs::renameat(&self.dir, aside.as_str(), &self.dir, name).map_err(|e| format!("putting {name} back: {e}"))?;
        }
        rfs::futimens(&self.dir, &self.kept).map_err(|e| format!("setting times back: {e}"))
    }
}

struct Watches<'a> {
    root: BorrowedFd<'a>,
}

/// Access and modification times of an open object, to set back.
fn times(fd: BorrowedFd<'_>) -> Result<Timestamps, String> {
    let st = rfs::fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    Ok(Timestamps {
        last_access: rfs::Timespec { tv_sec: st.st_atime as _, tv_nsec: st.st_atime_nsec as _ },
        last_modification: rfs::Timespec { tv_sec: st.st_mtime as _, tv_nsec: st.st_mtime_nsec as _ },
    })
}

/// A fresh entry `name` in `dir` (every watch quiet): a directory, or a file of one
/// byte (so that a read of it is an access).
fn fresh(dir: BorrowedFd<'_>, name: &str, is_dir: bool) -> Result<(), String> {
    if is_dir {
        return rfs::mkdirat(dir, name, Mode::from_bits_truncate(0o700)).map_err(|e| format!("mkdir {name}: {e}"));
    }
    let f = rfs::openat(dir, name, OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_bits_truncate(0o600))
        .map_err(|e| format!("creating {name}: {e}"))?;
    rustix::io::write(&f, b"x").map(drop).map_err(|e| format!("writing {name}: {e}"))
}

/// Remove the entry [`fresh`] made.
fn remove(dir: BorrowedFd<'_>, name: &str, is_dir: bool) -> Result<(), String> {
    rfs::unlinkat(dir, name, if is_dir { AtFlags::REMOVEDIR } else { AtFlags::empty() }).map_err(|e| format!("removing {name}: {e}"))
}

impl Watches<'_> {
    /// `path` (in the instance) opened with `flags`, no symbolic link followed.
    fn open(&self, path: &str, flags: OFlags) -> Result<OwnedFd, String> {
        let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        rfs::openat2(self.root, path.trim_start_matches('/'), flags | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty(), how)
            .map_err(|e| format!("opening {path} in the instance: {e}"))
    }

    /// Set watch `x`'s mask (by its path: the same inode gives the same watch).
    fn set(&self, fd: BorrowedFd<'_>, x: &InotifyWatch, mask: u32) -> Result<(), String> {
        let obj = self.open(&x.path, OFlags::PATH)?;
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&obj));
        let got = inotify::add_watch(fd, path, inotify::WatchFlags::from_bits_retain(mask)).map_err(|e| format!("setting the mask of watch {} on {}: {e}", x.wd, x.path))?;
        if got != x.wd {
            return Err(format!("watch {} on {} came back as watch {got}", x.wd, x.path));
        }
        Ok(())
    }

    /// Cause event `e` (not a rename) on watch `x`.
    fn cause(&self, fd: BorrowedFd<'_>, x: &InotifyWatch, e: &InotifyEvent) -> Result<(), String> {
        let bit = e.mask & !libc::IN_ISDIR;
        let own = crate::tmpfs::holds(&x.path);
        let err = |s: String| format!("causing event {:#x} on {} {:?}: {s}", e.mask, x.path, String::from_utf8_lossy(&e.name));
        let dir = e.mask & libc::IN_ISDIR != 0;
        let name = std::str::from_utf8(&e.name).map_err(|_| err("a name that is not UTF-8".into()))?;
        if matches!(bit, libc::IN_CREATE | libc::IN_DELETE) {
            // An entry of the watched directory (of the instance's own: checked at capture).
            let cleared = self.clear(&x.path, name).map_err(err)?;
            let make = || fresh(cleared.dir.as_fd(), name, dir);
            let remove = || remove(cleared.dir.as_fd(), name, dir);
            if bit == libc::IN_CREATE {
                self.set(fd, x, bit)?;
                let made = make();
                self.set(fd, x, QUIET)?;
                made.map_err(err)?;
                remove().map_err(err)?;
            } else {
                make().map_err(err)?;
                self.set(fd, x, bit)?;
                let removed = remove();
                self.set(fd, x, QUIET)?;
                removed.map_err(err)?;
            }
            return cleared.put_back(name).map_err(err);
        }
        // An operation on the watched object itself, or on an entry of the directory:
        // an entry that is not there or not fit for it (of the instance's own
        // directories only) is stood in for by a fresh one meanwhile.
        let path = if name.is_empty() { x.path.clone() } else { format!("{}/{name}", x.path.trim_end_matches('/')) };
        let fit = self.open(&path, OFlags::PATH).ok().and_then(|o| rfs::fstat(&o).ok()).is_some_and(|st| {
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            let is_file = st.st_mode & libc::S_IFMT == libc::S_IFREG;
            (name.is_empty() || is_dir == dir)
                && match bit {
                    libc::IN_ACCESS => is_dir || is_file && st.st_size > 0,
                    libc::IN_MODIFY | libc::IN_CLOSE_WRITE => is_file,
                    _ => is_dir || is_file,
                }
        });
        let stand_in = if fit {
            None
        } else if own && !name.is_empty() {
            let cleared = self.clear(&x.path, name).map_err(err)?;
            fresh(cleared.dir.as_fd(), name, dir).map_err(err)?;
            Some(cleared)
        } else {
            return Err(err("what the event is about is gone or changed".into()));
        };
        let kept = if own && stand_in.is_none() { Some(times(self.open(&path, OFlags::PATH).map_err(err)?.as_fd()).map_err(err)?) } else { None };
        let flags = if matches!(bit, libc::IN_MODIFY | libc::IN_CLOSE_WRITE) { OFlags::WRONLY } else { OFlags::RDONLY };
        self.set(fd, x, bit)?;
        let done = (|| -> Result<(), String> {
            // Opened with the event's bit set (IN_OPEN), closed before it is quiet (IN_CLOSE_*).
            let obj = self.open(&path, flags)?;
            let st = rfs::fstat(&obj).map_err(|e| format!("fstat: {e}"))?;
            match bit {
                libc::IN_OPEN | libc::IN_CLOSE_NOWRITE | libc::IN_CLOSE_WRITE => Ok(()),
                libc::IN_ACCESS if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let mut buf = [std::mem::MaybeUninit::uninit(); 1024];
                    match rfs::RawDir::new(&obj, &mut buf).next() {
                        Some(Err(e)) => Err(format!("listing: {e}")),
                        _ => Ok(()),
                    }
                }
                libc::IN_ACCESS => match rustix::io::pread(&obj, &mut [0u8; 1], 0) {
                    Ok(1) => Ok(()),
                    Ok(_) => Err("read: the file is empty".into()),
                    Err(e) => Err(format!("read: {e}")),
                },
                libc::IN_MODIFY => rfs::ftruncate(&obj, st.st_size as u64).map_err(|e| format!("truncate: {e}")),
                libc::IN_ATTRIB => rfs::fchmod(&obj, Mode::from_bits_truncate(st.st_mode & 0o7777)).map_err(|e| format!("chmod: {e}")),
                other => Err(format!("event {other:#x} is not one a restore causes")),
            }
        })();
        self.set(fd, x, QUIET)?;
        done.map_err(err)?;
        if let Some(t) = kept {
            let obj = self.open(&path, OFlags::RDONLY).map_err(err)?;
            rfs::futimens(&obj, &t).map_err(|e| err(format!("setting times back: {e}")))?;
        }
        if let Some(cleared) = stand_in {
            remove(cleared.dir.as_fd(), name, dir).map_err(err)?;
            cleared.put_back(name).map_err(err)?;
        }
        Ok(())
    }

    /// Cause one rename's two events: `from` on watch `fx`, `to` on watch `tx`.
    fn rename(&self, fd: BorrowedFd<'_>, (fx, from): (&InotifyWatch, &InotifyEvent), (tx, to): (&InotifyWatch, &InotifyEvent)) -> Result<(), String> {
        let err = |s: String| format!("causing a rename from {} {:?} to {} {:?}: {s}", fx.path, String::from_utf8_lossy(&from.name), tx.path, String::from_utf8_lossy(&to.name));
        let (fname, tname) = match (std::str::from_utf8(&from.name), std::str::from_utf8(&to.name)) {
            (Ok(f), Ok(t)) => (f, t),
            _ => return Err(err("a name that is not UTF-8".into())),
        };
        // Put back in the reverse order (the same directory twice: its first times last).
        let from_dir = self.clear(&fx.path, fname).map_err(err)?;
        let to_dir = self.clear(&tx.path, tname).map_err(err)?;
        let (fdir, tdir) = (from_dir.dir.as_fd(), to_dir.dir.as_fd());
        let dir = from.mask & libc::IN_ISDIR != 0;
        fresh(fdir, fname, dir).map_err(err)?;
        if fx.wd == tx.wd {
            self.set(fd, fx, libc::IN_MOVED_FROM | libc::IN_MOVED_TO)?;
        } else {
            self.set(fd, fx, libc::IN_MOVED_FROM)?;
            self.set(fd, tx, libc::IN_MOVED_TO)?;
        }
        rfs::renameat(fdir, fname, tdir, tname).map_err(|e| err(format!("rename: {e}")))?;
        self.set(fd, fx, QUIET)?;
        self.set(fd, tx, QUIET)?;
        remove(tdir, tname, dir).map_err(err)?;
        to_dir.put_back(tname).map_err(err)?;
        from_dir.put_back(fname).map_err(err)
    }

    /// Directory `dir_path` (the instance's own) readied for an operation on its entry
    /// `name` (every watch quiet): its times kept, and what stands at `name`, if
    /// anything, moved to a free name there; [`Cleared::put_back`] undoes both.
    fn clear(&self, dir_path: &str, name: &str) -> Result<Cleared, String> {
        let dir = self.open(dir_path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let kept = times(dir.as_fd())?;
        let mut aside = None;
        if rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            let free = (0..1000).map(|k| format!(".thaw-aside-{k}")).find(|a| rfs::statat(&dir, a.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_err());
            let free = free.ok_or_else(|| format!("no free name to set {name} aside"))?;
            rfs::renameat(&dir, name, &dir, free.as_str()).map_err(|e| format!("setting {name} aside: {e}"))?;
            aside = Some(free);
        }
        Ok(Cleared { dir, kept, aside })
    }
}
