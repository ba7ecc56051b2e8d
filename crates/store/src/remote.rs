//! The object-store layer: where a store is (`s3://BUCKET/PREFIX`), how to
//! reach it (configured like the AWS tools), and verified reads and writes of
//! the store's objects.
//!
//! Object names under PREFIX:
//! ```text
//! chunks/<sha256>          chunk contents; the name is the SHA-256 of the bytes
//! snapshots/<id>.json      a manifest; id = SHA-256 of the manifest's bytes
//! gc/condemned.json        the collector's list of orphans due for deletion
//! ```
//! Every object is named by the hash of its contents, so a reader verifies each
//! one against its name, and two writers of one name always write the same bytes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::signer::Signer;
use object_store::{ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, RetryConfig};
use sha2::{Digest, Sha256};

use crate::error::{Result, StoreError};

/// `s3://BUCKET/PREFIX`: a snapshot store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    pub bucket: String,
    /// Without leading or trailing '/'; may be empty.
    pub prefix: String,
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl> {
        let bad = |reason: &str| StoreError::BadUrl { url: url.to_string(), reason: reason.to_string() };
        let rest = url.strip_prefix("s3://").ok_or_else(|| bad("expected s3://BUCKET/PREFIX"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid_bucket {
            return Err(bad("the bucket name must be 3-63 characters of a-z, 0-9, '-' and '.'"));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|s| s == "." || s == "..") || prefix.contains("//") {
            return Err(bad("the prefix must not contain empty, '.' or '..' segments"));
        }
        Ok(StoreUrl { bucket: bucket.to_string(), prefix: prefix.to_string() })
    }

    /// The store's name for `key` (relative to the prefix).
    pub fn key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    /// `s3://BUCKET/PREFIX/key`, for messages.
    pub fn object_url(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(key))
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// `s3://BUCKET/PREFIX/ID`: one stored snapshot (what `push` prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotUrl {
    pub store: StoreUrl,
    /// The manifest's SHA-256, 64 lowercase hex digits.
    pub id: String,
}

impl SnapshotUrl {
    pub fn parse(url: &str) -> Result<SnapshotUrl> {
        let (store, id) = url.trim_end_matches('/').rsplit_once('/').ok_or_else(|| StoreError::BadUrl {
            url: url.to_string(),
            reason: "expected s3://BUCKET/PREFIX/ID".into(),
        })?;
        if !is_sha256_hex(id) {
            return Err(StoreError::BadUrl {
                url: url.to_string(),
                reason: "the last segment must be a snapshot id (64 hex digits, as printed by `thaw snapshot push`)".into(),
            });
        }
        Ok(SnapshotUrl { store: StoreUrl::parse(store)?, id: id.to_string() })
    }
}

impl fmt::Display for SnapshotUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.store, self.id)
    }
}

pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// How to reach the store. Unset fields come from the environment the way the
/// AWS tools read it: `AWS_ENDPOINT_URL` (e.g. `http://127.0.0.1:9000` for
/// MinIO), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
/// `AWS_REGION` (default us-east-1).
#[derive(Debug, Clone, Default)]
pub struct StoreConfig {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Give up on a request after this long (connect + transfer, retries included).
    /// Default 30 s; a store that is down fails within it.
    pub timeout: Option<Duration>,
}

/// Parallel requests of one push or pull.
pub const CONCURRENCY: usize = 16;
/// Objects larger than this are put in parts (a head pack can be tens of MiB).
pub const MULTIPART_ABOVE: u64 = 16 << 20;
/// The size of each part but the last (S3 wants at least 5 MiB).
const PART_SIZE: usize = 8 << 20;

/// A connected store: the S3 client plus the names of things in it.
#[derive(Debug, Clone)]
pub struct Remote {
    pub url: StoreUrl,
    s3: Arc<AmazonS3>,
    /// The region requests are signed for (CreateBucket names it outside us-east-1).
    region: String,
}

impl Remote {
    pub fn new(url: &StoreUrl, cfg: &StoreConfig) -> Result<Remote> {
        let mut b = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e);
        }
        let endpoint = cfg.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
        let region = cfg.region.clone().or_else(|| std::env::var("AWS_REGION").ok()).unwrap_or_else(|| "us-east-1".into());
        b = b.with_region(&region);
        if let Some(k) = &cfg.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &cfg.secret_access_key {
            b = b.with_secret_access_key(k);
        }
        let timeout = cfg.timeout.unwrap_or(Duration::from_secs(30));
        let http = endpoint.as_deref().is_some_and(|e| e.starts_with("http://"));
        b = b
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(http)
                    // A plain-HTTP endpoint needs no trust store: loading the system's
                    // costs ~2.5 ms, paid by every `thaw snapshot restore s3://...`.
                    .with_no_system_certificates(http)
                    .with_connect_timeout(Duration::from_secs(2).min(timeout))
                    .with_timeout(timeout),
            )
            .with_retry(RetryConfig { max_retries: 3, retry_timeout: timeout, ..Default::default() });
        let s3 = b.build().map_err(|e| StoreError::Config {
            detail: format!("cannot configure the S3 client for {url} (set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)"),
            source: Some(e),
        })?;
        Ok(Remote { url: url.clone(), s3: Arc::new(s3), region })
    }

    fn path(&self, key: &str) -> ObjPath {
        ObjPath::from(self.url.key(key))
    }

    pub fn chunk_key<S: std::fmt::Display + ?Sized>(sha: &S) -> String {
        format!("chunks/{sha}")
    }

    pub fn manifest_key(id: &str) -> String {
        format!("snapshots/{id}.json")
    }

    /// A copy of snapshot `id`'s head pack under a name its id gives, so a miss reads
    /// it beside the manifest instead of after it (see `fetch::manifest_and_head`).
    pub fn head_key(id: &str) -> String {
        format!("heads/{id}")
    }

    /// The second part of a split head copy ([`Remote::head_key`]): the head pack from
    /// where the restore's first files end (its pages), read beside the first part.
    pub fn head_rest_key(id: &str) -> String {
        format!("heads/{id}.rest")
    }

    /// The working set recorded for snapshot `id` after it was published (advisory: see fetch::working_set).
    pub fn ws_key(id: &str) -> String {
        format!("ws/{id}.trace")
    }

    fn remote_err(&self, op: &'static str, key: &str) -> impl FnOnce(object_store::Error) -> StoreError {
        let object = self.url.object_url(key);
        move |source| match source {
            object_store::Error::NotFound { .. } => StoreError::NotFound { object },
            source => StoreError::Remote { op, object, source },
        }
    }

    /// Metadata of `key`, or None if absent.
    pub async fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        match self.s3.head(&self.path(key)).await {
            Ok(m) => Ok(Some(m)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.remote_err("HEAD", key)(e)),
        }
    }

    /// Put `data` at `key`: in one request, or, above [`MULTIPART_ABOVE`] bytes, as a
    /// multipart upload of [`PART_SIZE`] parts sent in parallel (aborted on failure,
    /// so no part is left behind where the store allows it).
    pub async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        if data.len() as u64 <= MULTIPART_ABOVE {
            self.s3.put(&self.path(key), data.into()).await.map_err(self.remote_err("PUT", key))?;
            return Ok(());
        }
        let mut upload = self.s3.put_multipart(&self.path(key)).await.map_err(self.remote_err("PUT (multipart)", key))?;
        let parts: Vec<_> = (0..data.len()).step_by(PART_SIZE).map(|at| upload.put_part(data.slice(at..(at + PART_SIZE).min(data.len())).into())).collect();
        let sent = futures::future::try_join_all(parts).await;
        let done = match sent {
            Ok(_) => upload.complete().await.map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            let _ = upload.abort().await;
            return Err(self.remote_err("PUT (multipart)", key)(e));
        }
        Ok(())
    }

    /// Put small `data` at `key` only if the object is as the caller last saw it:
    /// `seen` is the version (ETag) it read or wrote, or None for "not there yet".
    /// Returns the new version, or None when the condition failed (another writer
    /// changed or created it meanwhile, or it was deleted). S3's conditional writes
    /// (If-Match / If-None-Match), which MinIO and AWS S3 honour.
    pub async fn put_if(&self, key: &str, data: Bytes, seen: Option<&str>) -> Result<Option<String>> {
        let mode = match seen {
            None => object_store::PutMode::Create,
            Some(e) => object_store::PutMode::Update(object_store::UpdateVersion { e_tag: Some(e.to_string()), version: None }),
        };
        match self.s3.put_opts(&self.path(key), data.into(), mode.into()).await {
            Ok(r) => Ok(Some(r.e_tag.unwrap_or_default())),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(None),
            Err(e) => Err(self.remote_err("PUT (conditional)", key)(e)),
        }
    }

    /// Object `key` and its version (ETag), or None if absent.
    pub async fn get_versioned(&self, key: &str) -> Result<Option<(Bytes, String)>> {
        let r = match self.s3.get(&self.path(key)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.remote_err("GET", key)(e)),
        };
        let etag = r.meta.e_tag.clone().unwrap_or_default();
        Ok(Some((r.bytes().await.map_err(self.remote_err("GET", key))?, etag)))
    }

    /// The whole object `key`, unverified (callers verify against the name).
    pub async fn get(&self, key: &str) -> Result<Bytes> {
        let r = self.s3.get(&self.path(key)).await.map_err(self.remote_err("GET", key))?;
        r.bytes().await.map_err(self.remote_err("GET", key))
    }

    /// The whole object `key` as it arrives, unverified: its bytes in the parts the
    /// connection brings them.
    pub async fn get_stream(&self, key: &str) -> Result<futures::stream::BoxStream<'static, Result<Bytes>>> {
        use futures::StreamExt;
        let r = self.s3.get(&self.path(key)).await.map_err(self.remote_err("GET", key))?;
        let object = self.url.object_url(key);
        Ok(r.into_stream().map(move |part| part.map_err(|source| StoreError::Remote { op: "GET", object: object.clone(), source })).boxed())
    }

    /// Bytes `range` of `key`.
    pub async fn get_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.s3.get_range(&self.path(key), range).await.map_err(self.remote_err("GET (range)", key))
    }

    /// Chunk `sha`, verified: its bytes must be `len` long and hash to its name.
    pub async fn get_chunk(&self, sha: &str, len: u64) -> Result<Bytes> {
        let key = Self::chunk_key(sha);
        let data = self.get(&key).await?;
        verify(&self.url.object_url(&key), sha, len, &data)?;
        Ok(data)
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        self.s3.delete(&self.path(key)).await.map_err(self.remote_err("DELETE", key))
    }

    /// Every object under `dir` (relative to the prefix), with keys relative to the prefix.
    pub async fn list(&self, dir: &str) -> Result<Vec<(String, ObjectMeta)>> {
        let p = self.path(dir);
        let metas: Vec<ObjectMeta> =
            self.s3.list(Some(&p)).try_collect().await.map_err(self.remote_err("LIST", &format!("{dir}/")))?;
        let strip = if self.url.prefix.is_empty() { 0 } else { self.url.prefix.len() + 1 };
        Ok(metas.into_iter().map(|m| (m.location.as_ref()[strip..].to_string(), m)).collect())
    }

    /// Create the bucket if it does not exist (S3 CreateBucket through a
    /// presigned URL, since the object API has no bucket calls). For test and
    /// demo servers; production buckets are made by their operators.
    pub async fn ensure_bucket(&self) -> Result<()> {
        let err = |detail: String| StoreError::Config { detail, source: None };
        let url = self
            .s3
            .signed_url(object_store::signer::Method::PUT, &ObjPath::from(""), Duration::from_secs(60))
            .await
            .map_err(|e| StoreError::Config { detail: format!("signing CreateBucket for {}", self.url.bucket), source: Some(e) })?;
        // S3 requires a Content-Length on CreateBucket ("411 Length Required"
        // otherwise), and hyper sends none for an empty body unless told; outside
        // us-east-1 the body names the region.
        let body = match self.region.as_str() {
            "us-east-1" => String::new(),
            r => format!(
                "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>{r}</LocationConstraint></CreateBucketConfiguration>"
            ),
        };
        let resp = reqwest::Client::new()
            .put(url)
            .header(reqwest::header::CONTENT_LENGTH, body.len())
            .body(body)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| err(format!("CreateBucket {}: {e}", self.url.bucket)))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status.is_success() || body.contains("BucketAlreadyOwnedByYou") {
            Ok(())
        } else {
            Err(err(format!("CreateBucket {} returned {status}: {body}", self.url.bucket)))
        }
    }
}

/// Check that `data`, read from `object`, is `len` bytes hashing to `sha`.
pub fn verify(object: &str, sha: &str, len: u64, data: &[u8]) -> Result<()> {
    if data.len() as u64 != len {
        return Err(StoreError::Corrupt { object: object.to_string(), detail: format!("{} bytes, expected {len}", data.len()) });
    }
    let got = sha256_hex(data);
    if got != sha {
        return Err(StoreError::Corrupt { object: object.to_string(), detail: format!("contents hash to {got}") });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_print() {
        let u = StoreUrl::parse("s3://snaps/prod/eu/").unwrap();
        assert_eq!(u, StoreUrl { bucket: "snaps".into(), prefix: "prod/eu".into() });
        assert_eq!(u.to_string(), "s3://snaps/prod/eu");
        assert_eq!(u.object_url("chunks/ab"), "s3://snaps/prod/eu/chunks/ab");
        let bare = StoreUrl::parse("s3://snaps").unwrap();
        assert_eq!(bare.key("snapshots/x.json"), "snapshots/x.json");
        for bad in ["http://x/y", "s3://A_B/x", "s3://ab", "s3://bucket/a/../b", "s3://bucket/a//b"] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
        let id = sha256_hex(b"x");
        let s = SnapshotUrl::parse(&format!("s3://snaps/p/{id}")).unwrap();
        assert_eq!((s.store.prefix.as_str(), s.id.as_str()), ("p", id.as_str()));
        assert_eq!(s.to_string(), format!("s3://snaps/p/{id}"));
        let e = SnapshotUrl::parse("s3://snaps/p/notanid").unwrap_err().to_string();
        assert!(e.contains("the last segment must be a snapshot id"), "{e}");
    }

    /// What a server sees of CreateBucket: a strict one (AWS S3 itself) answers
    /// 411 to a PUT without a Content-Length.
    fn create_bucket_request(region: &str) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "the client closed before the end of the request head");
                got.extend_from_slice(&buf[..n]);
            }
            let head = String::from_utf8_lossy(&got).to_lowercase();
            let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
            let body_at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            while got.len() < body_at + len {
                let n = c.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").unwrap();
            String::from_utf8_lossy(&got).into_owned()
        });
        let cfg = StoreConfig {
            endpoint: Some(format!("http://127.0.0.1:{port}")),
            region: Some(region.into()),
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            timeout: Some(Duration::from_secs(5)),
        };
        let remote = Remote::new(&StoreUrl::parse("s3://strict-bucket").unwrap(), &cfg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(remote.ensure_bucket()).unwrap();
        server.join().unwrap()
    }

    #[test]
    fn create_bucket_carries_a_content_length_and_its_region() {
        let req = create_bucket_request("us-east-1");
        assert!(req.starts_with("PUT /strict-bucket"), "{req}");
        assert!(req.to_lowercase().contains("\r\ncontent-length: 0\r\n"), "{req}");
        let req = create_bucket_request("eu-west-3");
        assert!(req.ends_with("<LocationConstraint>eu-west-3</LocationConstraint></CreateBucketConfiguration>"), "{req}");
        let body_len = req.split("\r\n\r\n").nth(1).unwrap().len();
        assert!(req.to_lowercase().contains(&format!("\r\ncontent-length: {body_len}\r\n")), "{req}");
    }

    #[test]
    fn verify_names_the_object() {
        let sha = sha256_hex(b"hello");
        verify("s3://b/chunks/x", &sha, 5, b"hello").unwrap();
        let e = verify("s3://b/chunks/x", &sha, 5, b"hellO").unwrap_err().to_string();
        assert!(e.starts_with("s3://b/chunks/x is corrupt or truncated (contents hash to "), "{e}");
        let e = verify("s3://b/chunks/x", &sha, 5, b"hell").unwrap_err().to_string();
        assert_eq!(e, "s3://b/chunks/x is corrupt or truncated (4 bytes, expected 5)");
    }
}
