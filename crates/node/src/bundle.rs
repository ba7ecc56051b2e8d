//! Deployment bundles: validate and unpack a function's zip into a code directory
//! the sandbox can mount (world-readable, no paths escaping the directory).

use std::io::{Cursor, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use base64::Engine;
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Lambda's limit for an unzipped deployment package.
pub const MAX_UNZIPPED: u64 = 250 * 1024 * 1024;

#[derive(Debug, Error)]
pub enum BundleError {
    #[error("Could not unzip uploaded file. Please check your file, then try to upload again.")]
    NotAZip(#[source] zip::result::ZipError),
    #[error("Unzipped size must be smaller than {MAX_UNZIPPED} bytes")]
    TooLarge,
    #[error("the zip entry '{0}' would be written outside the function's directory")]
    UnsafePath(String),
    #[error("writing {path}")]
    Write { path: PathBuf, #[source] source: std::io::Error },
    #[error("reading zip entry '{name}'")]
    Read { name: String, #[source] source: zip::result::ZipError },
}

/// Lambda's CodeSha256: base64 of the SHA-256 of the zip file.
pub fn code_sha256(zip: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(zip))
}

/// Unpack `zip` into `dest` (created; must not exist). Directories get 0755, files
/// 0644 (0755 if executable in the archive), so the sandbox's unprivileged user can read them.
pub fn extract(zip: &[u8], dest: &Path) -> Result<u64, BundleError> {
    let mut archive = zip::ZipArchive::new(Cursor::new(zip)).map_err(BundleError::NotAZip)?;
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BundleError::Write { path, source }
    };
    std::fs::create_dir_all(dest).map_err(werr(dest))?;
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755)).map_err(werr(dest))?;
    let mut total = 0u64;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(BundleError::NotAZip)?;
        let name = entry.name().to_string();
        let rel = PathBuf::from(&name);
        if rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
            return Err(BundleError::UnsafePath(name));
        }
        let path = dest.join(&rel);
        if entry.is_dir() {
            mkdirs(dest, &path)?;
            continue;
        }
        if let Some(parent) = path.parent() {
            mkdirs(dest, parent)?;
        }
        total += entry.size();
        if total > MAX_UNZIPPED {
            return Err(BundleError::TooLarge);
        }
        let mut data = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut data).map_err(|e| BundleError::Read { name: name.clone(), source: e.into() })?;
        std::fs::write(&path, &data).map_err(werr(&path))?;
        let exec = entry.unix_mode().is_some_and(|m| m & 0o111 != 0);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(if exec { 0o755 } else { 0o644 })).map_err(werr(&path))?;
    }
    Ok(total)
}

fn mkdirs(root: &Path, dir: &Path) -> Result<(), BundleError> {
    std::fs::create_dir_all(dir).map_err(|source| BundleError::Write { path: dir.to_path_buf(), source })?;
    let mut d = dir;
    while d != root {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
            .map_err(|source| BundleError::Write { path: d.to_path_buf(), source })?;
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
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
    fn rejects_garbage_and_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let e = extract(b"not a zip", &dir.path().join("a")).unwrap_err();
        assert_eq!(e.to_string(), "Could not unzip uploaded file. Please check your file, then try to upload again.");
        let z = make_zip(&[("../evil.py", "")]);
        assert!(matches!(extract(&z, &dir.path().join("b")), Err(BundleError::UnsafePath(_))));
    }
}
