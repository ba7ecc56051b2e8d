//! The fingerprint of a function bundle (the code directory mounted at
//! `/var/task`), recorded in the image at capture and checked when a snapshot is
//! opened: a restore over a changed bundle would run the old code, already loaded
//! in the image's memory, next to new files. Metadata only (path, type, size,
//! modification time, mode, symlink target), so checking a large bundle costs
//! a directory walk, not reading every file.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

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
    let mut lines = Vec::new();
    walk(dir, "", &mut lines)?;
    lines.sort();
    let mut h = Sha256::new();
    for l in &lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    Ok(hex(&h.finalize()))
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) -> io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = format!("{rel}/{}", e.file_name().to_string_lossy());
        let m = std::fs::symlink_metadata(e.path())?;
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
            walk(&e.path(), &name, out)?;
        }
    }
    Ok(())
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
}
