//! Function code bundles in the store (issue #29): the zip a ThawFunction's
//! `spec.code` names (`key`, `sha256`), which every agent that deploys the function
//! fetches. `thaw bundle push` puts one under its content address,
//! `bundles/<sha256>.zip`; a fetch checks the bytes against the sha256 the
//! ThawFunction gives, wherever the key points. Not collected: a bundle stays until
//! deleted by hand (a ThawFunction in git may name it again).

use bytes::Bytes;

use crate::error::{Result, StoreError};
use crate::remote::{is_sha256_hex, sha256_hex};
use crate::Store;

/// The largest bundle fetched (Lambda's limit for unzipped code is 250 MB).
pub const MAX_BUNDLE_BYTES: usize = 256 << 20;

/// Where `thaw bundle push` puts the bundle whose SHA-256 is `sha256`.
pub fn key(sha256: &str) -> String {
    format!("bundles/{sha256}.zip")
}

/// A key a ThawFunction may name: relative to the store's prefix, no `..`, plain characters.
pub fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= 1024
        && !key.starts_with('/')
        && key.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Config { detail: format!("'{key}' is not a bundle key (a path under the store's prefix: letters, digits, / . _ -, no ..)"), source: None })
    }
}

impl Store {
    /// Put `zip` at its content address unless it is there already. Returns (key, sha256).
    pub fn put_bundle(&self, zip: &[u8]) -> Result<(String, String)> {
        let sha = sha256_hex(zip);
        let key = key(&sha);
        self.block_on(async {
            match self.remote.head(&key).await? {
                Some(meta) if meta.size == zip.len() as u64 => Ok(()),
                _ => self.remote.put(&key, Bytes::copy_from_slice(zip)).await,
            }
        })?;
        Ok((key, sha))
    }

    /// Bundle `key`, checked against `sha256` (and [`MAX_BUNDLE_BYTES`]).
    pub fn get_bundle(&self, key: &str, sha256: &str) -> Result<Vec<u8>> {
        check_key(key)?;
        if !is_sha256_hex(sha256) {
            return Err(StoreError::Config { detail: format!("'{sha256}' is not a SHA-256 (64 lowercase hex digits)"), source: None });
        }
        let object = self.remote.url.object_url(key);
        let size = self.block_on(self.remote.head(key))?.ok_or_else(|| StoreError::NotFound { object: object.clone() })?.size;
        if size > MAX_BUNDLE_BYTES as u64 {
            return Err(StoreError::Corrupt { object, detail: format!("{size} bytes, over the {MAX_BUNDLE_BYTES} byte limit of a bundle") });
        }
        let data = self.block_on(self.remote.get(key))?;
        let got = sha256_hex(&data);
        if got != sha256 {
            return Err(StoreError::Corrupt { object, detail: format!("its bytes hash to {got}, not {sha256}") });
        }
        Ok(data.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_keys_stay_under_the_prefix() {
        check_key(&key(&"a".repeat(64))).unwrap();
        check_key("team-a/fns/hello_1.zip").unwrap();
        for bad in ["", "/abs.zip", "a/../b.zip", "a//b", "./a", "a b.zip", "a?x=1", &"a".repeat(1025)] {
            assert!(check_key(bad).is_err(), "{bad:?} accepted");
        }
    }
}
