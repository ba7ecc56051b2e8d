//! The node's access keys: given on the command line / environment, or
//! generated on first start and kept in `<data>/node/credentials` (mode 0600).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::sigv4::Credentials;

#[derive(Debug, Error)]
pub enum KeysError {
    #[error("reading the credentials file {path}")]
    Read { path: PathBuf, #[source] source: std::io::Error },
    #[error("the credentials file {path} is malformed")]
    Parse { path: PathBuf, #[source] source: serde_json::Error },
    #[error("writing the credentials file {path}")]
    Write { path: PathBuf, #[source] source: std::io::Error },
    #[error("gathering randomness for a new key")]
    Random(#[source] getrandom::Error),
    #[error("only one of the access key id and the secret access key was given")]
    Partial,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    access_key_id: String,
    secret_access_key: String,
}

/// Where the keys came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    Given,
    Stored,
    Generated,
}

fn random_string(alphabet: &[u8], len: usize) -> Result<String, KeysError> {
    let mut buf = vec![0u8; len];
    getrandom::getrandom(&mut buf).map_err(KeysError::Random)?;
    Ok(buf.iter().map(|b| alphabet[*b as usize % alphabet.len()] as char).collect())
}

/// Resolve the node's key pair.
pub fn load_or_create(dir: &Path, id: Option<&str>, secret: Option<&str>) -> Result<(Credentials, KeySource), KeysError> {
    match (id, secret) {
        (Some(i), Some(s)) => {
            return Ok((Credentials { access_key_id: i.into(), secret_access_key: s.into() }, KeySource::Given))
        }
        (None, None) => {}
        _ => return Err(KeysError::Partial),
    }
    let path = dir.join("credentials");
    match std::fs::read(&path) {
        Ok(data) => {
            let s: Stored = serde_json::from_slice(&data).map_err(|source| KeysError::Parse { path: path.clone(), source })?;
            return Ok((Credentials { access_key_id: s.access_key_id, secret_access_key: s.secret_access_key }, KeySource::Stored));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(KeysError::Read { path, source }),
    }
    let creds = Credentials {
        access_key_id: format!("AKIA{}", random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)?),
        secret_access_key: random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", 40)?,
    };
    let werr = |source| KeysError::Write { path: path.clone(), source };
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(werr)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(werr)?;
    let body = serde_json::to_vec_pretty(&Stored {
        access_key_id: creds.access_key_id.clone(),
        secret_access_key: creds.secret_access_key.clone(),
    })
    .expect("serializable");
    f.write_all(&body).map_err(werr)?;
    f.sync_all().map_err(werr)?;
    Ok((creds, KeySource::Generated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_then_stored() {
        let d = tempfile::tempdir().unwrap();
        let (a, src) = load_or_create(d.path(), None, None).unwrap();
        assert_eq!(src, KeySource::Generated);
        assert_eq!(a.access_key_id.len(), 20);
        assert_eq!(std::fs::metadata(d.path().join("credentials")).unwrap().permissions().mode() & 0o777, 0o600);
        let (b, src) = load_or_create(d.path(), None, None).unwrap();
        assert_eq!((a, src), (b, KeySource::Stored));
        assert!(matches!(load_or_create(d.path(), Some("x"), None), Err(KeysError::Partial)));
    }
}
