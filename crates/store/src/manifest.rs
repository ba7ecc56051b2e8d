//! The manifest: what a stored snapshot is made of. Written last; its
//! existence is the commit point of a publish.
//!
//! ```json
//! {"format": 1, "image_format": 4, "image_id": 3735928559,
//!  "files": [{"name": "state.bin", "size": 11291,
//!             "chunks": [{"offset": 0, "len": 11291, "sha256": "9f86..."}]},
//!            {"name": "pages.img", "size": 5419008, "chunks": [... , {"offset": 65536, "len": 16384, "sha256": null}]},
//!            {"name": "ws.trace", ...}],
//!  "derived": ["ws.pages"]}
//! ```
//! A chunk with `"sha256": null` is all zeros and not stored. `derived` files
//! are rebuilt by the reader from the others (ws.pages is a copy of the
//! working set's pages out of pages.img, so storing it would store those bytes
//! twice). The snapshot's id is the SHA-256 of the manifest's bytes, so a
//! manifest is verified like any other object, and the id names exactly one
//! set of chunks (a Merkle tree). The manifest holds nothing that differs
//! between two publishers of the same snapshot (no time, no host), so they
//! write the same bytes under the same name.

use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::remote::is_sha256_hex;

pub const MANIFEST_FORMAT: u32 = 1;
/// Refuse to parse manifests larger than this.
pub const MAX_MANIFEST_LEN: usize = 64 << 20;
/// The files of a snapshot directory the store knows, in manifest order.
pub const STORED_FILES: [&str; 3] = [
    thaw_engine::image::STATE_FILE,
    thaw_engine::image::PAGES_FILE,
    thaw_engine::ws::TRACE_FILE,
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub offset: u64,
    pub len: u64,
    /// None: all zeros, not stored.
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
    pub chunks: Vec<Chunk>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// thaw_engine::image::FORMAT_VERSION of the image.
    pub image_format: u32,
    /// The image's id (CRC of state.bin), which working sets refer to.
    pub image_id: u32,
    pub files: Vec<FileEntry>,
    pub derived: Vec<String>,
}

impl Manifest {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("manifest serializes")
    }

    /// Parse and check a manifest read from `object`: the chunks of each file
    /// must tile it exactly, names must be hashes, only known files.
    pub fn parse(object: &str, bytes: &[u8]) -> Result<Manifest> {
        let bad = |detail: String| StoreError::BadManifest { object: object.to_string(), detail };
        if bytes.len() > MAX_MANIFEST_LEN {
            return Err(bad(format!("{} bytes, over the {MAX_MANIFEST_LEN} byte cap", bytes.len())));
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        if m.format != MANIFEST_FORMAT {
            return Err(bad(format!("manifest format {} (this build reads {MANIFEST_FORMAT})", m.format)));
        }
        if m.image_format != thaw_engine::image::FORMAT_VERSION {
            return Err(bad(format!(
                "image format {} (this build restores {})",
                m.image_format,
                thaw_engine::image::FORMAT_VERSION
            )));
        }
        for d in &m.derived {
            if d != thaw_engine::ws::PAGES_FILE {
                return Err(bad(format!("unknown derived file '{d}'")));
            }
        }
        for (i, f) in m.files.iter().enumerate() {
            if !STORED_FILES.contains(&f.name.as_str()) || m.files[..i].iter().any(|g| g.name == f.name) {
                return Err(bad(format!("unexpected or repeated file '{}'", f.name)));
            }
            let mut at = 0;
            for c in &f.chunks {
                if c.offset != at || c.len == 0 || c.sha256.as_deref().is_some_and(|s| !is_sha256_hex(s)) {
                    return Err(bad(format!("{}: bad chunk at offset {}", f.name, c.offset)));
                }
                at += c.len;
            }
            if at != f.size {
                return Err(bad(format!("{}: chunks cover {at} bytes of {}", f.name, f.size)));
            }
        }
        for required in &STORED_FILES[..2] {
            if m.file(required).is_none() {
                return Err(bad(format!("no {required}")));
            }
        }
        Ok(m)
    }

    pub fn file(&self, name: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.name == name)
    }

    /// The stored chunks (sha, len), each once.
    pub fn unique_chunks(&self) -> Vec<(String, u64)> {
        let mut seen = std::collections::HashSet::new();
        self.files
            .iter()
            .flat_map(|f| &f.chunks)
            .filter_map(|c| c.sha256.as_ref().map(|s| (s.clone(), c.len)))
            .filter(|(s, _)| seen.insert(s.clone()))
            .collect()
    }

    /// Total bytes of the snapshot's files (derived files excluded).
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::sha256_hex;

    fn sample() -> Manifest {
        let h = sha256_hex(b"a");
        Manifest {
            format: MANIFEST_FORMAT,
            image_format: thaw_engine::image::FORMAT_VERSION,
            image_id: 7,
            files: vec![
                FileEntry { name: "state.bin".into(), size: 10, chunks: vec![Chunk { offset: 0, len: 10, sha256: Some(h.clone()) }] },
                FileEntry {
                    name: "pages.img".into(),
                    size: 8192,
                    chunks: vec![
                        Chunk { offset: 0, len: 4096, sha256: None },
                        Chunk { offset: 4096, len: 4096, sha256: Some(h) },
                    ],
                },
            ],
            derived: vec![],
        }
    }

    #[test]
    fn round_trips_and_rejects_gaps_and_unknowns() {
        let m = sample();
        assert_eq!(Manifest::parse("m", &m.to_bytes()).unwrap(), m);
        assert_eq!(m.unique_chunks().len(), 1, "the same chunk twice is fetched once; zero chunks not at all");
        let mut gap = sample();
        gap.files[1].chunks[1].offset = 5000;
        let e = Manifest::parse("s3://b/snapshots/x.json", &gap.to_bytes()).unwrap_err().to_string();
        assert_eq!(e, "manifest s3://b/snapshots/x.json is invalid: pages.img: bad chunk at offset 5000");
        let mut short = sample();
        short.files[1].size = 9000;
        assert!(Manifest::parse("m", &short.to_bytes()).unwrap_err().to_string().contains("chunks cover 8192 bytes of 9000"));
        let mut odd = sample();
        odd.files[0].name = "../etc/passwd".into();
        assert!(Manifest::parse("m", &odd.to_bytes()).is_err());
        let mut nostate = sample();
        nostate.files.remove(0);
        assert!(Manifest::parse("m", &nostate.to_bytes()).unwrap_err().to_string().ends_with("no state.bin"));
        let mut newer = sample();
        newer.image_format += 1;
        assert!(Manifest::parse("m", &newer.to_bytes()).unwrap_err().to_string().contains("this build restores"));
    }
}
