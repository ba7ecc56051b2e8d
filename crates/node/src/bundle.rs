//! Deployment bundles: validate and unpack a function's zip into a code directory
//! the sandbox can mount (world-readable, no paths escaping the directory).

use std::io::{Cursor, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Lambda's limit for an unzipped deployment package.
pub const MAX_UNZIPPED: u64 = 250 * 1024 * 1024;

/// The modification time of what a zip gives none: 1980-01-01T00:00:00Z, the
/// earliest time a zip can hold.
pub const DOS_EPOCH: u64 = 315_532_800;

#[derive(Debug, Error)]
pub enum BundleError {
    #[error("Could not unzip uploaded file. Please check your file, then try to upload again.")]
    NotAZip(#[source] zip::result::ZipError),
    #[error("Unzipped size must be smaller than {MAX_UNZIPPED} bytes")]
    TooLarge,
    #[error("the zip entry '{0}' would be written outside the function's directory")]
    UnsafePath(String),
    #[error("the zip entry '{0}' collides with another entry or would be written through a symbolic link")]
    Conflict(String),
    #[error("writing {path}")]
    Write { path: PathBuf, #[source] source: std::io::Error },
    #[error("reading zip entry '{name}'")]
    Read { name: String, #[source] source: zip::result::ZipError },
}

/// Lambda's CodeSha256: base64 of the SHA-256 of the zip file.
pub fn code_sha256(zip: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(zip))
}

/// Copy the tree `from` into `to` (created if absent): files with their modes and
/// modification times (so a copy of a bundle keeps its fingerprint), directories,
/// symbolic links as they are. What `from` holds replaces what `to` holds
/// at the same path (a later layer overrides an earlier one); nothing is ever written
/// through a symbolic link already in `to`. Returns the bytes of the files copied.
pub fn overlay_tree(from: &Path, to: &Path) -> std::io::Result<u64> {
    match std::fs::symlink_metadata(to) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            std::fs::remove_file(to)?;
            std::fs::create_dir(to)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(to)?,
        Err(e) => return Err(e),
    }
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    let mut bytes = 0;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type()?;
        let existing = std::fs::symlink_metadata(&dst).ok();
        if let Some(m) = &existing {
            if m.is_dir() && !t.is_dir() {
                std::fs::remove_dir_all(&dst)?;
            } else if !m.is_dir() {
                std::fs::remove_file(&dst)?;
            }
        }
        let modified = std::fs::symlink_metadata(&src)?.modified()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
            set_link_time(&dst, modified)?;
        } else if t.is_dir() {
            bytes += overlay_tree(&src, &dst)?;
            std::fs::File::open(&dst)?.set_modified(modified)?;
        } else {
            bytes += std::fs::copy(&src, &dst)?;
            std::fs::OpenOptions::new().write(true).open(&dst)?.set_modified(modified)?;
        }
    }
    Ok(bytes)
}

/// Unpack `zip` into `dest` (created; must not exist), writing at most [`MAX_UNZIPPED`]
/// bytes. Directories get 0755, files 0644 (0755 if executable in the archive), so the
/// sandbox's unprivileged user can read them whatever the node's umask.
///
/// Every entry's modification time is the zip's (as Lambda keeps them; a directory
/// the zip does not list gets [`DOS_EPOCH`]), not the time of the unpacking: the same
/// zip unpacked on two nodes gives the same bundle fingerprint
/// (`thaw_engine::fingerprint`, which includes times), so a snapshot captured on one
/// node matches the bundle on another; and `.pyc` files shipped in the zip stay valid
/// for their sources.
pub fn extract(zip: &[u8], dest: &Path) -> Result<u64, BundleError> {
    extract_limited(zip, dest, MAX_UNZIPPED)
}

/// [`extract`] with an explicit limit on the bytes written. The limit counts the bytes
/// actually decompressed, never the sizes the zip's headers claim (they can lie).
/// Symbolic links are kept when they point inside the bundle; nothing is ever written
/// through one.
pub fn extract_limited(zip: &[u8], dest: &Path, limit: u64) -> Result<u64, BundleError> {
    let mut archive = zip::ZipArchive::new(Cursor::new(zip)).map_err(BundleError::NotAZip)?;
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BundleError::Write { path, source }
    };
    std::fs::create_dir_all(dest).map_err(werr(dest))?;
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755)).map_err(werr(dest))?;
    let mut total = 0u64;
    // Directories' times are set last (what is created in one changes its time).
    let mut dir_times: std::collections::HashMap<PathBuf, SystemTime> = std::collections::HashMap::new();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(BundleError::NotAZip)?;
        let name = entry.name().to_string();
        let rel = PathBuf::from(&name);
        if rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
            return Err(BundleError::UnsafePath(name));
        }
        let path = dest.join(&rel);
        let time = entry_time(entry.last_modified());
        if entry.is_dir() {
            mkdirs(dest, &rel, &name)?;
            dir_times.insert(rel.components().collect(), time);
            continue;
        }
        if let Some(parent) = rel.parent() {
            mkdirs(dest, parent, &name)?;
        }
        let read_err = |e: std::io::Error| BundleError::Read { name: name.clone(), source: e.into() };
        if entry.is_symlink() {
            let mut target = String::new();
            (&mut entry).take(4096).read_to_string(&mut target).map_err(read_err)?;
            if !link_stays_inside(&rel, Path::new(&target)) {
                return Err(BundleError::UnsafePath(format!("{name} -> {target}")));
            }
            std::os::unix::fs::symlink(&target, &path).map_err(|e| conflict_or_write(e, &name, &path))?;
            set_link_time(&path, time).map_err(werr(&path))?;
            continue;
        }
        let exec = entry.unix_mode().is_some_and(|m| m & 0o111 != 0);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&path)
            .map_err(|e| conflict_or_write(e, &name, &path))?;
        // One byte more than allowed, so that going over the limit is seen.
        let room = limit.saturating_sub(total).saturating_add(1);
        let written = std::io::copy(&mut (&mut entry).take(room), &mut file).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::Other => read_err(e),
            _ => BundleError::Write { path: path.clone(), source: e },
        })?;
        total += written;
        if total > limit {
            return Err(BundleError::TooLarge);
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(if exec { 0o755 } else { 0o644 })).map_err(werr(&path))?;
        file.set_modified(time).map_err(werr(&path))?;
    }
    set_dir_times(dest, Path::new(""), &dir_times).map_err(|(path, e)| werr(&path)(e))?;
    Ok(total)
}

/// A zip entry's time as a time of the file system (zip times carry no zone: read
/// as UTC, so that every node gives the same); [`DOS_EPOCH`] when absent or invalid.
fn entry_time(t: Option<zip::DateTime>) -> SystemTime {
    let secs = t.and_then(|t| {
        let day = chrono::NaiveDate::from_ymd_opt(t.year().into(), t.month().into(), t.day().into())?;
        Some(day.and_hms_opt(t.hour().into(), t.minute().into(), t.second().into())?.and_utc().timestamp())
    });
    UNIX_EPOCH + Duration::from_secs(secs.and_then(|s| u64::try_from(s).ok()).unwrap_or(DOS_EPOCH))
}

/// Set the modification (and access) time of the symbolic link at `path` itself.
fn set_link_time(path: &Path, t: SystemTime) -> std::io::Result<()> {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ts = rustix::fs::Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos().into() };
    let times = rustix::fs::Timestamps { last_access: ts, last_modification: ts };
    Ok(rustix::fs::utimensat(rustix::fs::CWD, path, &times, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?)
}

/// Give every directory below `root` (`rel` within it) its zip time (`times`, by
/// relative path), or [`DOS_EPOCH`]; the deepest first.
fn set_dir_times(root: &Path, rel: &Path, times: &std::collections::HashMap<PathBuf, SystemTime>) -> Result<(), (PathBuf, std::io::Error)> {
    let dir = root.join(rel);
    let err = |e| (dir.clone(), e);
    for e in std::fs::read_dir(&dir).map_err(err)? {
        let e = e.map_err(err)?;
        if e.file_type().map_err(err)?.is_dir() {
            let sub = rel.join(e.file_name());
            set_dir_times(root, &sub, times)?;
            let t = times.get(&sub.components().collect::<PathBuf>()).copied().unwrap_or_else(|| entry_time(None));
            std::fs::File::open(root.join(&sub)).and_then(|f| f.set_modified(t)).map_err(|e| (root.join(&sub), e))?;
        }
    }
    Ok(())
}

/// Whether a symlink at `rel` (relative to the bundle's root) pointing at `target`
/// resolves inside the bundle, judged on the path alone.
fn link_stays_inside(rel: &Path, target: &Path) -> bool {
    let mut depth: i64 = rel.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    !target.as_os_str().is_empty()
}

fn conflict_or_write(source: std::io::Error, name: &str, path: &Path) -> BundleError {
    // EEXIST: the entry is in the zip twice; ELOOP: O_NOFOLLOW met a symlink.
    match source.raw_os_error() {
        Some(libc::EEXIST) | Some(libc::ELOOP) | Some(libc::ENOTDIR) => BundleError::Conflict(name.to_string()),
        _ => BundleError::Write { path: path.to_path_buf(), source },
    }
}

/// Create `dir` (relative to `root`) one component at a time with mode 0755, refusing
/// to pass through anything that is not a real directory (a symlink from the zip).
fn mkdirs(root: &Path, dir: &Path, entry: &str) -> Result<(), BundleError> {
    let mut d = root.to_path_buf();
    for c in dir.components() {
        let Component::Normal(part) = c else { continue };
        d.push(part);
        match std::fs::symlink_metadata(&d) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => return Err(BundleError::Conflict(entry.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(BundleError::Write { path: d, source }),
        }
        std::fs::create_dir(&d).map_err(|source| BundleError::Write { path: d.clone(), source })?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
            .map_err(|source| BundleError::Write { path: d.clone(), source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn make_zip(files: &[(&str, &str)]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, body) in files {
            w.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
            w.write_all(body.as_bytes()).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn extracts_with_readable_modes() {
        let dir = tempfile::tempdir().unwrap();
        let z = make_zip(&[("handler.py", "x = 1\n"), ("pkg/mod.py", "y = 2\n")]);
        let dest = dir.path().join("code");
        assert_eq!(extract(&z, &dest).unwrap(), 12);
        assert_eq!(std::fs::read_to_string(dest.join("pkg/mod.py")).unwrap(), "y = 2\n");
        let mode = std::fs::metadata(dest.join("pkg")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        assert_eq!(code_sha256(b"").len(), 44);
    }

    #[test]
    fn the_same_zip_unpacks_to_the_same_fingerprint_with_the_zips_times() {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let at = zip::DateTime::from_date_and_time(2024, 5, 6, 7, 8, 10).unwrap();
        let opts = zip::write::SimpleFileOptions::default().last_modified_time(at);
        w.add_directory("lib/", opts).unwrap();
        w.start_file("lib/util.py", opts).unwrap();
        w.write_all(b"u = 1\n").unwrap();
        w.start_file("pkg/mod.py", opts).unwrap(); // pkg/ is not listed
        w.write_all(b"m = 2\n").unwrap();
        w.add_symlink("link.py", "lib/util.py", opts).unwrap();
        let z = w.finish().unwrap().into_inner();
        let dir = tempfile::tempdir().unwrap();
        extract(&z, &dir.path().join("a")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        extract(&z, &dir.path().join("b")).unwrap();
        let print = |d: &str| thaw_engine::fingerprint::of_dir(&dir.path().join(d)).unwrap();
        assert_eq!(print("a"), print("b"), "unpacked twice, 20 ms apart");
        overlay_tree(&dir.path().join("a"), &dir.path().join("c")).unwrap();
        assert_eq!(print("a"), print("c"), "copied (a configuration update's new revision)");
        let mtime = |p: &str| std::fs::symlink_metadata(dir.path().join("a").join(p)).unwrap().modified().unwrap();
        let zip_time = UNIX_EPOCH + Duration::from_secs(1_714_979_290); // 2024-05-06T07:08:10Z
        for p in ["lib", "lib/util.py", "pkg/mod.py", "link.py"] {
            assert_eq!(mtime(p), zip_time, "{p}");
        }
        assert_eq!(mtime("pkg"), UNIX_EPOCH + Duration::from_secs(DOS_EPOCH), "a directory the zip does not list");
    }

    #[test]
    fn rejects_garbage_and_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let e = extract(b"not a zip", &dir.path().join("a")).unwrap_err();
        assert_eq!(e.to_string(), "Could not unzip uploaded file. Please check your file, then try to upload again.");
        let z = make_zip(&[("../evil.py", "")]);
        assert!(matches!(extract(&z, &dir.path().join("b")), Err(BundleError::UnsafePath(_))));
    }

    /// A zip whose headers claim `claimed` bytes for an entry of `actual` zeros.
    fn lying_zip(actual: usize, claimed: u32) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        w.start_file("bomb.bin", opts).unwrap();
        w.write_all(&vec![0u8; actual]).unwrap();
        let mut z = w.finish().unwrap().into_inner();
        let le = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        // Local file header: uncompressed size at offset 22.
        assert_eq!(le(&z[0..4]), 0x0403_4b50);
        z[22..26].copy_from_slice(&claimed.to_le_bytes());
        // Central directory entry: uncompressed size at offset 24.
        let cd = (0..z.len() - 4).find(|&i| le(&z[i..i + 4]) == 0x0201_4b50).unwrap();
        z[cd + 24..cd + 28].copy_from_slice(&claimed.to_le_bytes());
        z
    }

    #[test]
    fn overlay_replaces_earlier_layers_and_never_writes_through_links() {
        let t = tempfile::tempdir().unwrap();
        let (a, b, out, outside) = (t.path().join("a"), t.path().join("b"), t.path().join("out"), t.path().join("outside"));
        std::fs::create_dir_all(a.join("python/pkg")).unwrap();
        std::fs::write(a.join("python/pkg/mod.py"), "a").unwrap();
        std::fs::write(a.join("python/only_a.py"), "a").unwrap();
        std::os::unix::fs::symlink(&outside, a.join("python/link")).unwrap();
        std::fs::write(a.join("python/file_then_dir"), "a").unwrap();
        std::fs::create_dir_all(b.join("python/file_then_dir")).unwrap();
        std::fs::create_dir_all(b.join("python/pkg")).unwrap();
        std::fs::write(b.join("python/pkg/mod.py"), "bb").unwrap();
        std::fs::write(b.join("python/link"), "b").unwrap();
        assert_eq!(overlay_tree(&a, &out).unwrap(), 3);
        assert_eq!(overlay_tree(&b, &out).unwrap(), 3);
        assert_eq!(std::fs::read_to_string(out.join("python/pkg/mod.py")).unwrap(), "bb", "the later layer wins");
        assert_eq!(std::fs::read_to_string(out.join("python/only_a.py")).unwrap(), "a", "the earlier layer's other files stay");
        assert!(out.join("python/file_then_dir").is_dir());
        assert!(!std::fs::symlink_metadata(out.join("python/link")).unwrap().file_type().is_symlink());
        assert!(!outside.exists(), "nothing was written through the earlier layer's link");
    }

    #[test]
    fn counts_bytes_written_not_the_sizes_headers_claim() {
        let dir = tempfile::tempdir().unwrap();
        let z = lying_zip(4 << 20, 100);
        assert!(z.len() < 64 << 10, "the bomb is small: {} bytes", z.len());
        let dest = dir.path().join("code");
        let e = extract_limited(&z, &dest, 1 << 20).unwrap_err();
        assert!(matches!(e, BundleError::TooLarge), "{e:?}");
        let written = std::fs::metadata(dest.join("bomb.bin")).map(|m| m.len()).unwrap_or(0);
        assert!(written <= (1 << 20) + 1, "wrote {written} bytes past a 1 MiB limit");
        // Within the limit the same kind of entry unpacks whole.
        let ok = lying_zip(1000, 10);
        let n = extract_limited(&ok, &dir.path().join("ok"), 1 << 20);
        assert!(matches!(n, Ok(1000) | Err(BundleError::Read { .. })), "{n:?}");
    }

    #[test]
    fn symlinks_stay_inside_and_are_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let link_zip = |entries: &[(&str, Option<&str>)]| {
            let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
            let o = zip::write::SimpleFileOptions::default();
            for (name, target) in entries {
                match target {
                    Some(t) => w.add_symlink(*name, *t, o).unwrap(),
                    None => {
                        w.start_file(*name, o).unwrap();
                        w.write_all(b"data").unwrap();
                    }
                }
            }
            w.finish().unwrap().into_inner()
        };
        // Out of the bundle: refused.
        let e = extract(&link_zip(&[("etc", Some("/etc"))]), &dir.path().join("a")).unwrap_err();
        assert!(matches!(e, BundleError::UnsafePath(_)), "{e:?}");
        let e = extract(&link_zip(&[("d/up", Some("../../x"))]), &dir.path().join("b")).unwrap_err();
        assert!(matches!(e, BundleError::UnsafePath(_)), "{e:?}");
        // Inside: kept; but nothing is written through it.
        let e = extract(&link_zip(&[("real/f", None), ("alias", Some("real")), ("alias/g", None)]), &dir.path().join("c"))
            .unwrap_err();
        assert!(matches!(e, BundleError::Conflict(ref n) if n == "alias/g"), "{e:?}");
        assert!(!dir.path().join("c/real/g").exists());
        let e = extract(&link_zip(&[("f", None), ("f/g", None)]), &dir.path().join("d")).unwrap_err();
        assert!(matches!(e, BundleError::Conflict(_)), "{e:?}");
        let d = dir.path().join("e");
        extract(&link_zip(&[("lib/real.py", None), ("lib/link.py", Some("real.py"))]), &d).unwrap();
        assert_eq!(std::fs::read_link(d.join("lib/link.py")).unwrap(), Path::new("real.py"));
        assert_eq!(std::fs::read(d.join("lib/link.py")).unwrap(), b"data");
    }
}
