//! Encryption at rest of snapshot images (issue #9): AES-256-GCM under a node key.
//!
//! A process that holds a node key ([`install`]) seals every image it captures:
//! each stored page of `pages.img` is encrypted in place (same size, still page
//! aligned, so O_DIRECT reads and the page index are unchanged) with its GCM tag
//! kept in the page index, and the contents of the captured `/tmp` files and what
//! descriptors carry of the process's data (pipe buffers, queued socket messages,
//! memfd and deleted-file contents; image format 24) are encrypted inside `state.bin`.
//! `ws.pages` holds copies of sealed image pages, so
//! a working set is sealed too. The per-page CRCs cover the *stored* (sealed)
//! bytes: corruption is still reported as such before any decryption is tried.
//!
//! Keys: each image draws a random 16-byte salt; the page key is
//! HMAC-SHA256(node key, "thaw pages v1" || salt) and the /tmp key likewise with
//! "thaw tmp v1". The GCM nonce is the page's index in `pages.img` (or the /tmp
//! entry's index): every (key, nonce) pair is used for exactly one plaintext,
//! because a salt is never reused and an image is written once. The image records
//! the salt and the node key's id (a hash of the key, never the key), so a restore
//! without the key, or with another node's key, is refused with a message saying
//! which key the image needs.
//!
//! The node key is 32 random bytes: `THAW_NODE_KEY` (64 hex digits) or a key file
//! (`thaw serve` creates `<data-dir>/node.key`, mode 0600, on first start). It is
//! process-wide state, like the process's credentials: set once at start-up.
//!
//! Hand-written only where no crate fits: the key file handling and the framing;
//! the cryptography is `ring`'s (BoringSSL's AES-GCM with AES-NI/VAES and carry-less
//! multiply: on the REAP path it decrypts a working set several times faster than
//! RustCrypto's `aes-gcm` did here, see ARCHITECTURE.md).

use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ring::hmac;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Environment variable holding the node key as 64 hex digits.
pub const KEY_ENV: &str = "THAW_NODE_KEY";
/// GCM tag length.
pub const TAG_LEN: usize = 16;

#[derive(Debug, Error)]
pub enum SealError {
    #[error("{what} is not a node key: expected 64 hex digits (32 bytes), got {got}")]
    BadKey { what: String, got: String },
    #[error("node key file {path}")]
    KeyFile { path: PathBuf, #[source] source: io::Error },
    #[error("node key file {path} is readable or writable by others (mode {mode:o}); it must be 0600")]
    KeyFileMode { path: PathBuf, mode: u32 },
    #[error("no randomness from the kernel")]
    Random(#[source] getrandom::Error),
}

/// The node key (32 bytes) and its public id.
pub struct NodeKey {
    bytes: [u8; 32],
    id: String,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Drop for NodeKey {
    fn drop(&mut self) {
        self.bytes = [0; 32];
    }
}

fn random<const N: usize>() -> Result<[u8; N], SealError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(SealError::Random)?;
    Ok(b)
}

impl NodeKey {
    pub fn from_bytes(bytes: [u8; 32]) -> NodeKey {
        let id = hex::encode(&Sha256::new().chain_update(b"thaw node key id v1").chain_update(bytes).finalize()[..8]);
        NodeKey { bytes, id }
    }

    /// A fresh random key.
    pub fn generate() -> Result<NodeKey, SealError> {
        Ok(NodeKey::from_bytes(random()?))
    }

    /// Parse 64 hex digits (surrounding whitespace ignored). `what` names the source.
    pub fn from_hex(s: &str, what: &str) -> Result<NodeKey, SealError> {
        let t = s.trim();
        let bad = || SealError::BadKey {
            what: what.to_string(),
            got: if t.len() == 64 { "non-hex digits".into() } else { format!("{} characters", t.len()) },
        };
        if t.len() != 64 {
            return Err(bad());
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(t, &mut bytes).map_err(|_| bad())?;
        Ok(NodeKey::from_bytes(bytes))
    }

    /// The key in `THAW_NODE_KEY`, if set (and not empty).
    pub fn from_env() -> Result<Option<NodeKey>, SealError> {
        match std::env::var(KEY_ENV) {
            Ok(v) if !v.trim().is_empty() => NodeKey::from_hex(&v, KEY_ENV).map(Some),
            _ => Ok(None),
        }
    }

    /// Read the key file at `path` (hex), refusing one others can read.
    pub fn read_file(path: &Path) -> Result<NodeKey, SealError> {
        let kerr = |source| SealError::KeyFile { path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(kerr)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SealError::KeyFileMode { path: path.to_path_buf(), mode });
        }
        let text = std::fs::read_to_string(path).map_err(kerr)?;
        NodeKey::from_hex(&text, &path.display().to_string())
    }

    /// Read the key file at `path`, creating it (mode 0600, a fresh random key) if
    /// it does not exist. Two processes racing to create it end up with the same key.
    pub fn load_or_create(path: &Path) -> Result<NodeKey, SealError> {
        let kerr = |source| SealError::KeyFile { path: path.to_path_buf(), source };
        match NodeKey::read_file(path) {
            Err(SealError::KeyFile { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            other => return other,
        }
        let key = NodeKey::generate()?;
        let tmp = path.with_extension(format!("new-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(kerr)?;
        f.write_all(format!("{}\n", hex::encode(key.bytes)).as_bytes()).and_then(|()| f.sync_all()).map_err(kerr)?;
        // hard_link fails if another process created the key meanwhile: use theirs.
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(key),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => NodeKey::read_file(path),
            Err(e) => Err(kerr(e)),
        }
    }

    /// Public identifier of the key (16 hex digits of a hash of it).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// An AES-256-GCM key derived for `purpose` and `salt`: HMAC-SHA256(node key, purpose || salt).
    fn derive(&self, purpose: &[u8], salt: &[u8; 16]) -> Gcm {
        let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, &self.bytes));
        ctx.update(purpose);
        ctx.update(salt);
        let k = ctx.sign();
        Gcm(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k.as_ref()).expect("32 bytes is an AES-256 key")))
    }
}

static NODE_KEY: RwLock<Option<Arc<NodeKey>>> = RwLock::new(None);

/// Set (or clear) this process's node key: images captured from now on are sealed
/// with it, sealed images are opened with it.
pub fn install(key: Option<Arc<NodeKey>>) {
    *NODE_KEY.write().unwrap_or_else(|e| e.into_inner()) = key;
}

/// This process's node key, if one was installed.
pub fn node_key() -> Option<Arc<NodeKey>> {
    NODE_KEY.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// What an image records about its sealing (never the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealInfo {
    /// Id of the node key that sealed the image.
    pub key_id: String,
    pub salt: [u8; 16],
}

/// Why a sealed image cannot be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    #[error("it is encrypted with node key {want}, and this process has no node key (set {KEY_ENV} or use the node's key file)")]
    NoKey { want: String },
    #[error("it is encrypted with node key {want}, not with this process's node key {have}")]
    WrongKey { want: String, have: String },
}

/// AES-256-GCM with a counter nonce (the page's or entry's index) and no AAD.
struct Gcm(LessSafeKey);

impl Gcm {
    fn nonce(n: u64) -> Nonce {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&n.to_le_bytes());
        Nonce::assume_unique_for_key(b)
    }

    fn seal(&self, n: u64, data: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self.0.seal_in_place_separate_tag(Gcm::nonce(n), Aad::empty(), data).expect("below GCM's length limit");
        tag.as_ref().try_into().expect("16-byte tag")
    }

    fn open(&self, n: u64, data: &mut [u8], tag: &[u8; TAG_LEN]) -> bool {
        let tag = Tag::try_from(&tag[..]).expect("16-byte tag");
        self.0.open_in_place_separate_tag(Gcm::nonce(n), Aad::empty(), tag, data, 0..).is_ok()
    }

    /// Encrypt `data` in place and append its tag.
    fn seal_tagged(&self, n: u64, data: &mut Vec<u8>) {
        let tag = self.seal(n, data);
        data.extend_from_slice(&tag);
    }

    /// Reverse of [`Gcm::seal_tagged`]; false if it does not authenticate (then
    /// `data` holds garbage and must not be used).
    fn open_tagged(&self, n: u64, data: &mut Vec<u8>) -> bool {
        let Some(at) = data.len().checked_sub(TAG_LEN) else { return false };
        let tag: [u8; TAG_LEN] = data[at..].try_into().expect("16 bytes");
        data.truncate(at);
        self.open(n, data, &tag)
    }
}

/// The ciphers of one sealed image.
pub struct Sealer {
    pages: Gcm,
    tmp: Gcm,
    /// What descriptors carry of the process's data (image format 24; see
    /// `ProcessImage::fd_payloads_mut`), numbered in that order.
    fds: Gcm,
    /// The frames of the compressed working set (`ws/lz4.rs`), with random nonces: a
    /// working set is written again and again (merges) under the same image salt.
    ws: Gcm,
    info: SealInfo,
}

impl Sealer {
    /// Ciphers for a new image (a fresh salt).
    pub fn new(key: &NodeKey) -> Result<Sealer, SealError> {
        Ok(Sealer::with_info(key, SealInfo { key_id: key.id().to_string(), salt: random()? }))
    }

    fn with_info(key: &NodeKey, info: SealInfo) -> Sealer {
        Sealer {
            pages: key.derive(b"thaw pages v1", &info.salt),
            tmp: key.derive(b"thaw tmp v1", &info.salt),
            fds: key.derive(b"thaw fds v1", &info.salt),
            ws: key.derive(b"thaw ws v1", &info.salt),
            info,
        }
    }

    /// Ciphers to open an image sealed as `info`, with `key` (this process's node key).
    pub fn open(info: &SealInfo, key: Option<&NodeKey>) -> Result<Sealer, OpenError> {
        let key = key.ok_or_else(|| OpenError::NoKey { want: info.key_id.clone() })?;
        if key.id() != info.key_id {
            return Err(OpenError::WrongKey { want: info.key_id.clone(), have: key.id().to_string() });
        }
        Ok(Sealer::with_info(key, info.clone()))
    }

    pub fn info(&self) -> &SealInfo {
        &self.info
    }

    /// Encrypt stored page number `file_page` in place; returns its tag.
    pub fn seal_page(&self, file_page: u64, page: &mut [u8]) -> [u8; TAG_LEN] {
        self.pages.seal(file_page, page)
    }

    /// Decrypt stored page number `file_page` in place; false if it does not
    /// authenticate (then `page` holds garbage and must not be used).
    #[must_use]
    pub fn open_page(&self, file_page: u64, page: &mut [u8], tag: &[u8; TAG_LEN]) -> bool {
        self.pages.open(file_page, page, tag)
    }

    /// Encrypt the contents of /tmp entry `n`: ciphertext followed by the tag.
    pub fn seal_data(&self, n: u64, data: &mut Vec<u8>) {
        self.tmp.seal_tagged(n, data);
    }

    /// Encrypt descriptor payload `n` (a pipe's buffered bytes, a queued message, a
    /// memfd's contents...): ciphertext followed by the tag.
    pub fn seal_fd_data(&self, n: u64, data: &mut Vec<u8>) {
        self.fds.seal_tagged(n, data);
    }

    /// Reverse of [`Sealer::seal_fd_data`]; false if it does not authenticate.
    #[must_use]
    pub fn open_fd_data(&self, n: u64, data: &mut Vec<u8>) -> bool {
        self.fds.open_tagged(n, data)
    }

    /// Encrypt a frame of the compressed working set in place, bound to `aad` (where it
    /// belongs); its random nonce and its tag.
    pub fn seal_frame(&self, aad: &[u8], data: &mut [u8]) -> Result<([u8; 12], [u8; TAG_LEN]), SealError> {
        let n: [u8; 12] = random()?;
        let tag = self.ws.0.seal_in_place_separate_tag(Nonce::assume_unique_for_key(n), Aad::from(aad), data).expect("below GCM's length limit");
        Ok((n, tag.as_ref().try_into().expect("16-byte tag")))
    }

    /// Reverse of [`Sealer::seal_frame`]; false if it does not authenticate (then
    /// `data` holds garbage and must not be used).
    #[must_use]
    pub fn open_frame(&self, nonce: &[u8; 12], aad: &[u8], data: &mut [u8], tag: &[u8; TAG_LEN]) -> bool {
        let tag = Tag::try_from(&tag[..]).expect("16-byte tag");
        self.ws.0.open_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), tag, data, 0..).is_ok()
    }

    /// Reverse of [`Sealer::seal_data`]; false if it does not authenticate.
    #[must_use]
    pub fn open_data(&self, n: u64, data: &mut Vec<u8>) -> bool {
        self.tmp.open_tagged(n, data)
    }
}

/// Encrypt a short secret (an environment value in the node's registry) with the
/// node key: `v1:` + hex(nonce || ciphertext || tag) of [`seal_bytes`] for
/// "thaw values v1".
pub fn seal_value(key: &NodeKey, plain: &[u8]) -> Result<String, SealError> {
    Ok(format!("v1:{}", hex::encode(seal_bytes(key, VALUES, b"", plain)?)))
}

/// Reverse of [`seal_value`]; `None` if it is not such a value or does not
/// authenticate under `key`.
pub fn open_value(key: &NodeKey, sealed: &str) -> Option<Vec<u8>> {
    let h = sealed.strip_prefix("v1:")?;
    if h.len() % 2 != 0 || !h.is_ascii() {
        return None;
    }
    open_bytes(key, VALUES, b"", &hex::decode(h).ok()?)
}

const VALUES: &[u8] = b"thaw values v1";

/// Encrypt `plain` with the node key's AES-256-GCM key for `purpose`, bound to `aad`
/// (what it must be opened as, e.g. the record it belongs to): nonce (12 bytes, random:
/// far below the birthday bound for the records a node stores) || ciphertext || tag.
pub fn seal_bytes(key: &NodeKey, purpose: &[u8], aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, SealError> {
    let gcm = key.derive(purpose, &[0; 16]);
    let n: [u8; 12] = random()?;
    let mut out = n.to_vec();
    out.extend_from_slice(plain);
    let tag = gcm.0.seal_in_place_separate_tag(Nonce::assume_unique_for_key(n), Aad::from(aad), &mut out[12..]).expect("below GCM's limit");
    out.extend_from_slice(tag.as_ref());
    Ok(out)
}

/// Reverse of [`seal_bytes`] for the same `purpose` and `aad`; `None` if `sealed` is
/// too short or does not authenticate under `key`.
pub fn open_bytes(key: &NodeKey, purpose: &[u8], aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < 12 + TAG_LEN {
        return None;
    }
    let (n, rest) = sealed.split_at(12);
    let (ct, tag) = rest.split_at(rest.len() - TAG_LEN);
    let mut data = ct.to_vec();
    let gcm = key.derive(purpose, &[0; 16]);
    let nonce = Nonce::try_assume_unique_for_key(n).ok()?;
    let tag = Tag::try_from(tag).ok()?;
    let len = gcm.0.open_in_place_separate_tag(nonce, Aad::from(aad), tag, &mut data, 0..).ok()?.len();
    data.truncate(len);
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_tampering_is_detected() {
        let key = NodeKey::generate().unwrap();
        let s = Sealer::new(&key).unwrap();
        let plain: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        let mut page = plain.clone();
        let tag = s.seal_page(7, &mut page);
        assert_ne!(page, plain, "sealed bytes differ from the plaintext");
        let mut p = page.clone();
        assert!(s.open_page(7, &mut p, &tag));
        assert_eq!(p, plain);
        // The same bytes at another index, a flipped bit, or another image's salt fail.
        let mut p = page.clone();
        assert!(!s.open_page(8, &mut p, &tag));
        let mut p = page.clone();
        p[100] ^= 1;
        assert!(!s.open_page(7, &mut p, &tag));
        let other = Sealer::new(&key).unwrap();
        let mut p = page.clone();
        assert!(!other.open_page(7, &mut p, &tag));
    }

    #[test]
    fn data_and_values_round_trip() {
        let key = NodeKey::generate().unwrap();
        let s = Sealer::new(&key).unwrap();
        let mut d = b"secret /tmp contents".to_vec();
        s.seal_data(3, &mut d);
        assert!(!d.windows(6).any(|w| w == b"secret"));
        assert!(s.open_data(3, &mut d));
        assert_eq!(d, b"secret /tmp contents");
        // A descriptor's payload has a key of its own: the same index under the /tmp
        // key does not open it, nor does another index.
        let mut f = b"queued secret".to_vec();
        s.seal_fd_data(3, &mut f);
        assert!(!f.windows(6).any(|w| w == b"secret"));
        assert!(!s.open_data(3, &mut f.clone()));
        assert!(!s.open_fd_data(4, &mut f.clone()));
        assert!(!s.open_fd_data(0, &mut vec![0; 5]), "shorter than a tag");
        assert!(s.open_fd_data(3, &mut f));
        assert_eq!(f, b"queued secret");
        let v = seal_value(&key, b"hunter2").unwrap();
        assert!(v.starts_with("v1:") && !v.contains("hunter2"));
        assert_eq!(open_value(&key, &v).unwrap(), b"hunter2");
        assert!(open_value(&NodeKey::generate().unwrap(), &v).is_none(), "another key cannot open it");
        assert!(open_value(&key, "v1:zz").is_none());
        assert_ne!(seal_value(&key, b"hunter2").unwrap(), v, "fresh nonce per value");
        // Bytes sealed for a purpose and a record open only as that purpose and record.
        let b = seal_bytes(&key, b"thaw events v1", b"event-1", b"payload").unwrap();
        assert_eq!(b.len(), 12 + 7 + TAG_LEN);
        assert_eq!(open_bytes(&key, b"thaw events v1", b"event-1", &b).unwrap(), b"payload");
        assert!(open_bytes(&key, b"thaw events v1", b"event-2", &b).is_none(), "another record's");
        assert!(open_bytes(&key, VALUES, b"event-1", &b).is_none(), "another purpose's");
        assert!(open_bytes(&key, b"thaw events v1", b"event-1", &b[..b.len() - 1]).is_none());
        assert!(open_bytes(&key, b"thaw events v1", b"event-1", &b[..12 + TAG_LEN - 1]).is_none(), "shorter than a nonce and a tag");
        assert_eq!(open_bytes(&key, b"p", b"", &seal_bytes(&key, b"p", b"", b"").unwrap()).unwrap(), b"", "empty");
    }

    #[test]
    fn key_parsing_and_key_files() {
        assert!(NodeKey::from_hex("00", "x").unwrap_err().to_string().contains("2 characters"));
        let k = NodeKey::from_hex(&"ab".repeat(32), "x").unwrap();
        assert_eq!(k.id().len(), 16);
        assert!(!format!("{k:?}").contains("abab"), "Debug never shows the key");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        let a = NodeKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = NodeKey::load_or_create(&path).unwrap();
        assert_eq!(a.id(), b.id(), "the second start reads the same key");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(NodeKey::read_file(&path), Err(SealError::KeyFileMode { .. })));
    }
}
