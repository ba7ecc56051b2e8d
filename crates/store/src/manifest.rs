//! The manifest: what a stored snapshot is made of. Written last; its
//! existence is the commit point of a publish.
//!
//! ```json
//! {"format": 3, "image_format": 16, "image_id": 3735928559,
//!  "packs": [{"name": "5b1c...", "size": 8392704}],
//!  "files": [{"name": "state.bin", "size": 11291,
//!             "chunks": [{"offset": 0, "len": 11291, "sha256": "9f86...", "pack": 0, "at": 0, "zlen": 2301}]},
//!            {"name": "pages.img", "size": 5419008, "chunks": [... , {"offset": 65536, "len": 16384, "sha256": null}]},
//!            {"name": "ws.trace", ...}],
//!  "derived": ["ws.pages"]}
//! ```
//! A chunk with `"sha256": null` is all zeros and not stored. Every other chunk
//! is stored inside a *pack* (`packs/<sha256 of the pack>`, a few MiB of chunks
//! back to back): `pack` indexes `packs`, `at` is the chunk's offset in it. A
//! restore therefore reads a handful of large objects (whole, or in coalesced
//! ranges) instead of one object per chunk. Format 3 may store a chunk compressed
//! (zstd): `zlen` is then its length in the pack, and its bytes are `len` once
//! decompressed; its hash is that of the decompressed bytes (what the snapshot
//! holds), so compression changes neither dedup nor the content digest. Format 2
//! (packs, every chunk raw) and format 1 (chunks stored as objects of their own,
//! `chunks/<sha256>`, no packs) are still read.
//! A layered snapshot's diff names its base, a stored snapshot of its own (`base`,
//! format 3): the base is stored once for all its diffs, fetched once per node,
//! and found beside the fetched diff (`thaw_engine::layers::BASE_LINK`).
//! `derived` files are rebuilt by the reader from the others: before format 4,
//! ws.pages (a copy of the working set's pages out of pages.img, in the order the
//! trace touched them). Format 4 stores ws.pages itself, in 1 MiB chunks in the
//! head, so a miss gets the working set as a few large, well-compressed chunks it
//! installs as they are, instead of assembling it page by page out of pages.img's
//! small chunks (pages.img's chunks that hold only working-set pages are packed
//! last, and a miss builds them from ws.pages instead of fetching them).
//! A sealed image's ws.pages is ciphertext, which does not compress (a node seals its
//! snapshots by default): format 5 stores its ws.lz4 instead (the pages decrypted,
//! compressed in 256 KiB frames, each frame sealed with the node key: helloworld's
//! 1.36 MB working set travels as 0.45 MB; a miss writes the frames as they arrive and
//! the restore installs them as they do, with the key), and lists ws.pages as derived,
//! rebuilt once the image is here. A clear image's ws.lz4 is stored so when its
//! working set is large (`publish::CLEAR_WS_LZ4_FROM`: its frames are installed as they
//! arrive, where ws.pages is decompressed once it is all here).
//! Format 6 is the same manifest in a binary encoding (`MAGIC`, then bincode with
//! varint integers, hashes as 32 bytes: [`Wire`]): a miss reads and checks the
//! manifest before anything of the head can be used, and lrserving's 743 KB of JSON
//! (5,246 chunks of pages.img, 277 KB stored) cost ~3 ms to decompress, hash and parse
//! on that path. Formats up to 5 are JSON; `THAW_STORE_MANIFEST=json` still writes
//! them (the baseline). A build older than format 6 refuses such a manifest as "not a
//! manifest".
//! Format 7 is format 6 with compact chunk tables ([`Table`]): a chunk's offset is where
//! the one before it ended, a field it does not have takes no bytes, integers are
//! varints, and a chunk placed right after the one before it in the same pack does not
//! write its place. What is left is mostly the hashes, which zstd cannot shrink, so such
//! a manifest is stored as it is unless zstd saves an eighth: a miss neither
//! decompresses it nor hashes and parses fixed records (lrserving's: 235 KB stored as
//! format 6, its 362 KB decompressed, hashed and parsed before the restore starts).
//! `THAW_STORE_MANIFEST=6` still writes format 6 (the baseline).
//! The snapshot's id is the SHA-256 of the manifest's bytes, so a
//! manifest is verified like any other object, and the id names exactly one set
//! of chunks, each verified by its own hash wherever it is read from (a Merkle
//! tree). The manifest holds nothing that differs between two publishers of the
//! same snapshot into the same store (no time, no host): packing is a function of
//! the chunks and of the packs already there.

use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::remote::is_sha256_hex;

/// The newest format this build writes: 7, the binary manifest with compact chunk
/// tables (see the module's doc).
pub const MANIFEST_FORMAT_COMPACT: u32 = 7;
/// Format 6, the manifest in a binary encoding (see the module's doc), with whatever
/// formats up to 5 could hold; its chunk tables are fixed records. Still read.
pub const MANIFEST_FORMAT_BINARY: u32 = 6;
/// The newest JSON format: 5 stores a sealed image's ws.lz4 in place of ws.pages (see
/// the module's doc); a clear image's JSON manifest is still format 4.
pub const MANIFEST_FORMAT: u32 = 5;
/// ws.pages stored (format 4 on).
pub const MANIFEST_FORMAT_WS_PAGES: u32 = 4;
/// Chunks compressed (zstd), bases: format 3 and later; still read.
pub const MANIFEST_FORMAT_COMPRESSED: u32 = 3;
/// Packs, every chunk raw: still read.
pub const MANIFEST_FORMAT_PACKS: u32 = 2;
/// Chunks as objects of their own (`chunks/<sha256>`): still read.
pub const MANIFEST_FORMAT_CHUNKS: u32 = 1;
/// Refuse to parse manifests larger than this.
pub const MAX_MANIFEST_LEN: usize = 64 << 20;
/// The first bytes of a format 6 manifest (JSON starts with '{').
pub const MAGIC: &[u8; 8] = b"THAWMAN\0";
/// The files of a snapshot directory the store knows, in manifest order (ws.pages
/// from format 4 on, ws.lz4 from format 5 on).
pub const STORED_FILES: [&str; 5] = [
    thaw_engine::image::STATE_FILE,
    thaw_engine::image::PAGES_FILE,
    thaw_engine::ws::TRACE_FILE,
    thaw_engine::ws::PAGES_FILE,
    thaw_engine::ws::LZ4_FILE,
];

/// A chunk's SHA-256 (of its bytes as the snapshot holds them): 32 bytes, shown, and
/// written in JSON manifests and object names, as 64 lowercase hex digits. Bytes
/// rather than a String: a miss parses thousands of them before its restore starts
/// (lrserving's 5,246), and a String each was most of that parse.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkHash(pub [u8; 32]);

impl ChunkHash {
    /// The hash of `data`.
    pub fn of(data: &[u8]) -> ChunkHash {
        use sha2::Digest;
        ChunkHash(sha2::Sha256::digest(data).into())
    }

    /// `hex` (64 lowercase hex digits) as a hash; None if it is not one.
    pub fn from_hex(hex: &str) -> Option<ChunkHash> {
        let mut b = [0u8; 32];
        (is_sha256_hex(hex) && hex::decode_to_slice(hex, &mut b).is_ok()).then_some(ChunkHash(b))
    }

    /// As 64 lowercase hex digits.
    pub fn hex(&self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(std::str::from_utf8(&hex_digits(&self.0)).expect("hex digits are ASCII"))
    }
}

impl std::fmt::Debug for ChunkHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl Serialize for ChunkHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ChunkHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<ChunkHash, D::Error> {
        let hex = std::borrow::Cow::<str>::deserialize(d)?;
        ChunkHash::from_hex(&hex).ok_or_else(|| serde::de::Error::custom(format!("a chunk's sha256 '{hex}' is not 64 lowercase hex digits")))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub offset: u64,
    pub len: u64,
    /// None: all zeros, not stored.
    pub sha256: Option<ChunkHash>,
    /// Format 2: the index in [`Manifest::packs`] of the pack holding the chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<u32>,
    /// Format 2: the chunk's offset in its pack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    /// Format 3: stored compressed (zstd), in this many bytes of its pack (less than `len`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zlen: Option<u64>,
}

impl Chunk {
    /// A chunk not (yet) placed in a pack.
    pub fn new(offset: u64, len: u64, sha256: Option<ChunkHash>) -> Chunk {
        Chunk { offset, len, sha256, pack: None, at: None, zlen: None }
    }

    /// The chunk's length in its pack.
    pub fn stored_len(&self) -> u64 {
        self.zlen.unwrap_or(self.len)
    }
}

/// A pack object (`packs/<name>`): `name` is the SHA-256 of its `size` bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackRef {
    pub name: String,
    pub size: u64,
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
    /// Format 2: the packs the chunks are in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packs: Vec<PackRef>,
    /// Format 2: the pack holding, alone, what a restore reads before the process
    /// resumes (state.bin, ws.trace, the working set's pages in trace order, the
    /// copy-on-written file pages): a restore that misses the cache starts after the
    /// manifest and this one read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<u32>,
    pub files: Vec<FileEntry>,
    pub derived: Vec<String>,
    /// Format 3: the id of the stored base this snapshot is a diff on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Format 3: pushed as the base of a diff; the collector deletes it once no
    /// manifest names it any more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_base: bool,
    /// The sandbox the process lived in (a copy of state.bin's record, optional in
    /// format 3): a restore that misses the cache prepares the sandbox while the head
    /// is still arriving. Only a hint: the restore uses the prepared sandbox only if it
    /// has the shape state.bin's record asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<thaw_engine::image::SandboxRecord>,
}

/// A format 6 manifest as bincode encodes it (after [`MAGIC`]): [`Manifest`] with its
/// hashes as bytes and no optional fields left out (bincode is not self-describing).
#[derive(Serialize, Deserialize)]
struct Wire {
    format: u32,
    image_format: u32,
    image_id: u32,
    packs: Vec<(Sha, u64)>,
    head: Option<u32>,
    files: Vec<WireFile>,
    derived: Vec<String>,
    base: Option<Sha>,
    is_base: bool,
    sandbox: Option<thaw_engine::image::SandboxRecord>,
}

type Sha = [u8; 32];

#[derive(Serialize, Deserialize)]
struct WireFile {
    name: String,
    size: u64,
    /// The chunks, [`RECORD`] bytes each (see [`Table`]).
    chunks: Table,
}

/// A file's chunks as one byte string. By hand rather than bincode's encoding of
/// [`Chunk`]: that decodes a hash as 32 elements one by one (lrserving's 5,246 chunks:
/// 0.5 ms on a miss's path), this copies one string and slices it.
///
/// Format 6: fixed records, each: flags u8 (1: sha256, 2: pack, 4: at, 8: zlen
/// present), offset u64, len u64, sha256 [32], pack u32, at u64, zlen u64,
/// little-endian, a field not present all zeros.
///
/// Format 7 (compact): each chunk is flags u8 (the same bits, and 16: its `at` is where
/// the chunk before it in this table in the same pack ended, and is not written), len,
/// then the fields it has, in that order: sha256 [32], pack, at, zlen; integers as
/// unsigned LEB128. Its offset is where the chunk before it ended (the chunks tile
/// their file). LEB128 by hand (a dozen lines): bincode's varints exist only inside its
/// serde encoding, which is what this avoids.
struct Table(Vec<u8>);

/// Format 7's flag: the chunk's place follows the previous chunk of its pack.
const FOLLOWS: u8 = 16;

const RECORD: usize = 1 + 8 + 8 + 32 + 4 + 8 + 8;

impl Serialize for Table {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Table {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Table, D::Error> {
        struct Bytes;
        impl serde::de::Visitor<'_> for Bytes {
            type Value = Table;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a chunk table")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> std::result::Result<Table, E> {
                Ok(Table(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> std::result::Result<Table, E> {
                Ok(Table(v))
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

impl Table {
    /// `chunks` as the table of a manifest of `format`.
    fn of(chunks: &[Chunk], format: u32) -> Table {
        if format >= MANIFEST_FORMAT_COMPACT {
            return Table::compact(chunks);
        }
        let mut t = Vec::with_capacity(chunks.len() * RECORD);
        for c in chunks {
            t.push(flags_of(c));
            t.extend_from_slice(&c.offset.to_le_bytes());
            t.extend_from_slice(&c.len.to_le_bytes());
            t.extend_from_slice(&c.sha256.map(|h| h.0).unwrap_or_default());
            t.extend_from_slice(&c.pack.unwrap_or(0).to_le_bytes());
            t.extend_from_slice(&c.at.unwrap_or(0).to_le_bytes());
            t.extend_from_slice(&c.zlen.unwrap_or(0).to_le_bytes());
        }
        Table(t)
    }

    fn compact(chunks: &[Chunk]) -> Table {
        let mut t = Vec::with_capacity(chunks.len() * 40);
        // Where the last chunk of each pack seen so far ended (packs are few).
        let mut ends: Vec<(u32, u64)> = Vec::new();
        for c in chunks {
            let place = c.pack.zip(c.at);
            let end = place.and_then(|(p, _)| ends.iter().find(|e| e.0 == p)).map(|e| e.1);
            let follows = place.is_some_and(|(_, at)| end == Some(at));
            t.push(flags_of(c) | if follows { FOLLOWS } else { 0 });
            put_varint(&mut t, c.len);
            if let Some(h) = c.sha256 {
                t.extend_from_slice(&h.0);
            }
            if let Some(p) = c.pack {
                put_varint(&mut t, p.into());
            }
            if let Some(at) = c.at.filter(|_| !follows) {
                put_varint(&mut t, at);
            }
            if let Some(z) = c.zlen {
                put_varint(&mut t, z);
            }
            if let Some((p, at)) = place {
                let end = at.saturating_add(c.stored_len());
                match ends.iter_mut().find(|e| e.0 == p) {
                    Some(e) => e.1 = end,
                    None => ends.push((p, end)),
                }
            }
        }
        Table(t)
    }

    /// The chunks of a manifest of `format` with `packs` packs, or what is wrong with
    /// the table.
    fn chunks(&self, format: u32, packs: usize) -> std::result::Result<Vec<Chunk>, String> {
        if format >= MANIFEST_FORMAT_COMPACT {
            return self.compact_chunks(packs);
        }
        if !self.0.len().is_multiple_of(RECORD) {
            return Err(format!("a chunk table of {} bytes is not whole records", self.0.len()));
        }
        self.0
            .chunks_exact(RECORD)
            .map(|r| {
                let u64_at = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().expect("8 bytes"));
                let flags = r[0];
                let (sha, pack, at, zlen) = (&r[17..49], u32::from_le_bytes(r[49..53].try_into().expect("4 bytes")), u64_at(53), u64_at(61));
                let some = |bit: u8, zero: bool| -> std::result::Result<bool, String> {
                    match (flags & bit != 0, zero) {
                        (false, false) => Err(format!("a chunk record has a field it says is absent (flags {flags:#x})")),
                        (present, _) => Ok(present),
                    }
                };
                if flags & !15 != 0 {
                    return Err(format!("a chunk record has unknown flags {flags:#x}"));
                }
                Ok(Chunk {
                    offset: u64_at(1),
                    len: u64_at(9),
                    sha256: some(1, sha.iter().all(|&b| b == 0))?.then(|| ChunkHash(sha.try_into().expect("32 bytes"))),
                    pack: some(2, pack == 0)?.then_some(pack),
                    at: some(4, at == 0)?.then_some(at),
                    zlen: some(8, zlen == 0)?.then_some(zlen),
                })
            })
            .collect()
    }

    fn compact_chunks(&self, packs: usize) -> std::result::Result<Vec<Chunk>, String> {
        let mut r = Reader(&self.0);
        let mut out = Vec::with_capacity(self.0.len() / 40);
        // Where the last chunk of each pack seen so far ended: the manifest's packs, so
        // a hostile table allocates nothing for a pack it invents.
        let mut ends: Vec<Option<u64>> = vec![None; packs];
        let mut offset = 0u64;
        while !r.0.is_empty() {
            let flags = r.byte()?;
            if flags & !(15 | FOLLOWS) != 0 {
                return Err(format!("a chunk record has unknown flags {flags:#x}"));
            }
            if flags & FOLLOWS != 0 && flags & 6 != 6 {
                return Err(format!("a chunk record follows the one before it in a pack without a pack and a place (flags {flags:#x})"));
            }
            let len = r.varint()?;
            let sha256 = if flags & 1 != 0 { Some(ChunkHash(r.bytes::<32>()?)) } else { None };
            let pack = match flags & 2 != 0 {
                true => Some(u32::try_from(r.varint()?).ok().filter(|&p| (p as usize) < packs).ok_or("a chunk record names a pack the manifest does not list")?),
                false => None,
            };
            let at = match (flags & FOLLOWS != 0, flags & 4 != 0) {
                (true, _) => Some(pack.and_then(|p| ends[p as usize]).ok_or("a chunk record follows no earlier chunk of its pack")?),
                (false, true) => Some(r.varint()?),
                (false, false) => None,
            };
            let zlen = if flags & 8 != 0 { Some(r.varint()?) } else { None };
            let c = Chunk { offset, len, sha256, pack, at, zlen };
            if let Some((p, at)) = pack.zip(at) {
                ends[p as usize] = Some(at.checked_add(c.stored_len()).ok_or("a chunk record's place overflows")?);
            }
            offset = offset.checked_add(len).ok_or("the chunks' lengths overflow")?;
            out.push(c);
        }
        Ok(out)
    }
}

/// The flags of format 6 and 7's chunk records for the fields `c` has.
fn flags_of(c: &Chunk) -> u8 {
    c.sha256.is_some() as u8 | (c.pack.is_some() as u8) << 1 | (c.at.is_some() as u8) << 2 | (c.zlen.is_some() as u8) << 3
}

/// `v` as unsigned LEB128: 7 bits a byte, low first, the high bit set on all but the last.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A compact table being read.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let (b, rest) = self.0.split_first_chunk::<N>().ok_or("a chunk record is cut short")?;
        self.0 = rest;
        Ok(*b)
    }

    fn byte(&mut self) -> std::result::Result<u8, String> {
        Ok(self.bytes::<1>()?[0])
    }

    /// An unsigned LEB128 of at most 64 bits.
    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                break;
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a chunk record holds a number over 64 bits".into())
    }
}

fn wire_options(limit: usize) -> impl bincode::Options {
    use bincode::Options;
    // Varint integers (most are small), little-endian, trailing bytes refused, and never
    // more read or allocated than the bytes given hold.
    bincode::DefaultOptions::new().with_limit(limit as u64)
}

/// `sha` as lowercase hex digits: by hand, as `hex::encode` (an iterator collected
/// into a String) took 1.1 ms for lrserving's 5,246 chunks on a miss's path, this 0.2.
fn hex_digits(sha: &Sha) -> [u8; 64] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 64];
    for (i, b) in sha.iter().enumerate() {
        out[2 * i] = DIGITS[(b >> 4) as usize];
        out[2 * i + 1] = DIGITS[(b & 15) as usize];
    }
    out
}

/// `sha` as a String of lowercase hex (pack and base names).
fn sha_hex(sha: &Sha) -> String {
    ChunkHash(*sha).hex()
}

fn sha_bytes(hex_name: &str) -> Sha {
    let mut b = [0u8; 32];
    hex::decode_to_slice(hex_name, &mut b).expect("a manifest's names are SHA-256 hex (publish made them)");
    b
}

impl Wire {
    fn of(m: &Manifest) -> Wire {
        Wire {
            format: m.format,
            image_format: m.image_format,
            image_id: m.image_id,
            packs: m.packs.iter().map(|p| (sha_bytes(&p.name), p.size)).collect(),
            head: m.head,
            files: m
                .files
                .iter()
                .map(|f| WireFile {
                    name: f.name.clone(),
                    size: f.size,
                    chunks: Table::of(&f.chunks, m.format),
                })
                .collect(),
            derived: m.derived.clone(),
            base: m.base.as_deref().map(sha_bytes),
            is_base: m.is_base,
            sandbox: m.sandbox.clone(),
        }
    }

    fn into_manifest(self) -> std::result::Result<Manifest, String> {
        let mut files = Vec::with_capacity(self.files.len());
        for f in self.files {
            let chunks = f.chunks.chunks(self.format, self.packs.len()).map_err(|e| format!("{}: {e}", f.name))?;
            files.push(FileEntry { chunks, name: f.name, size: f.size });
        }
        Ok(Manifest {
            format: self.format,
            image_format: self.image_format,
            image_id: self.image_id,
            packs: self.packs.into_iter().map(|(name, size)| PackRef { name: sha_hex(&name), size }).collect(),
            head: self.head,
            files,
            derived: self.derived,
            base: self.base.as_ref().map(sha_hex),
            is_base: self.is_base,
            sandbox: self.sandbox,
        })
    }
}

impl Manifest {
    /// The manifest's bytes (whose SHA-256 is the snapshot's id): binary from format 6
    /// on, JSON before.
    pub fn to_bytes(&self) -> Vec<u8> {
        if self.format >= MANIFEST_FORMAT_BINARY {
            use bincode::Options;
            let mut out = MAGIC.to_vec();
            wire_options(MAX_MANIFEST_LEN).serialize_into(&mut out, &Wire::of(self)).expect("manifest serializes");
            return out;
        }
        serde_json::to_vec(self).expect("manifest serializes")
    }

    /// Parse and check a manifest read from `object`: the chunks of each file
    /// must tile it exactly, names must be hashes, only known files.
    pub fn parse(object: &str, bytes: &[u8]) -> Result<Manifest> {
        let bad = |detail: String| StoreError::BadManifest { object: object.to_string(), detail };
        if bytes.len() > MAX_MANIFEST_LEN {
            return Err(bad(format!("{} bytes, over the {MAX_MANIFEST_LEN} byte cap", bytes.len())));
        }
        let binary = bytes.starts_with(MAGIC);
        let m: Manifest = if binary {
            use bincode::Options;
            let wire: Wire = wire_options(bytes.len()).deserialize(&bytes[MAGIC.len()..]).map_err(|e| bad(format!("not a manifest: {e}")))?;
            wire.into_manifest().map_err(|e| bad(format!("not a manifest: {e}")))?
        } else {
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a manifest: {e}")))?
        };
        if !(MANIFEST_FORMAT_CHUNKS..=MANIFEST_FORMAT_COMPACT).contains(&m.format) {
            return Err(bad(format!(
                "manifest format {} (this build reads {MANIFEST_FORMAT_CHUNKS} to {MANIFEST_FORMAT_COMPACT}): upgrade thaw",
                m.format
            )));
        }
        if binary != (m.format >= MANIFEST_FORMAT_BINARY) {
            return Err(bad(format!("format {} in the wrong encoding ({})", m.format, if binary { "binary" } else { "JSON" })));
        }
        let packed = m.packed();
        if !packed && !m.packs.is_empty() {
            return Err(bad("format 1 has no packs".into()));
        }
        for p in &m.packs {
            if !is_sha256_hex(&p.name) {
                return Err(bad(format!("bad pack name '{}'", p.name)));
            }
        }
        let compressed = m.format >= MANIFEST_FORMAT_COMPRESSED;
        if m.base.as_deref().is_some_and(|b| !is_sha256_hex(b) || !compressed) || (m.is_base && (m.base.is_some() || !compressed)) {
            return Err(bad("bad base".into()));
        }
        if m.head.is_some_and(|h| h as usize >= m.packs.len()) {
            return Err(bad("the head is not one of the packs".into()));
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
            // ws.pages is stored from format 4 on, with its trace, and never also derived.
            if f.name == thaw_engine::ws::PAGES_FILE
                && (m.format < MANIFEST_FORMAT_WS_PAGES || m.file(thaw_engine::ws::TRACE_FILE).is_none() || !m.derived.is_empty())
            {
                return Err(bad("ws.pages stored without its trace, derived too, or before format 4".into()));
            }
            // ws.lz4 (a sealed image's) from format 5 on, with its trace, in place of
            // ws.pages, which the reader derives.
            if f.name == thaw_engine::ws::LZ4_FILE
                && (m.format < MANIFEST_FORMAT
                    || m.file(thaw_engine::ws::TRACE_FILE).is_none()
                    || m.file(thaw_engine::ws::PAGES_FILE).is_some()
                    || !m.derived.iter().any(|d| d == thaw_engine::ws::PAGES_FILE))
            {
                return Err(bad("ws.lz4 stored without its trace, beside ws.pages, or before format 5".into()));
            }
            let mut at = 0;
            for c in &f.chunks {
                if c.offset != at || c.len == 0 {
                    return Err(bad(format!("{}: bad chunk at offset {}", f.name, c.offset)));
                }
                // Only format 3 compresses, and a compressed chunk is smaller.
                if c.zlen.is_some_and(|z| !compressed || z == 0 || z >= c.len || c.pack.is_none()) {
                    return Err(bad(format!("{}: chunk at offset {} has a bad compressed length", f.name, c.offset)));
                }
                // Stored chunks of format 2 lie inside a pack; nothing else names one.
                let placed = match (c.pack, c.at) {
                    (Some(p), Some(a)) => m.packs.get(p as usize).is_some_and(|p| a.checked_add(c.stored_len()).is_some_and(|end| end <= p.size)),
                    (None, None) => true,
                    _ => false,
                };
                let wants_pack = packed && c.sha256.is_some();
                if !placed || wants_pack != c.pack.is_some() {
                    return Err(bad(format!("{}: chunk at offset {} is not in a pack as it should be", f.name, c.offset)));
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
    pub fn unique_chunks(&self) -> Vec<(ChunkHash, u64)> {
        let mut seen = std::collections::HashSet::new();
        self.files.iter().flat_map(|f| &f.chunks).filter_map(|c| c.sha256.map(|s| (s, c.len))).filter(|(s, _)| seen.insert(*s)).collect()
    }

    /// Whether the chunks are in packs (format 2 and later) rather than objects of their own.
    pub fn packed(&self) -> bool {
        self.format >= MANIFEST_FORMAT_PACKS
    }

    /// SHA-256 of what the snapshot holds, whatever packs its chunks are in: two
    /// manifests of one snapshot directory have the same digest.
    pub fn content_digest(&self) -> String {
        let mut c = self.clone();
        c.format = 0;
        c.packs.clear();
        c.head = None;
        for ch in c.files.iter_mut().flat_map(|f| &mut f.chunks) {
            (ch.pack, ch.at, ch.zlen) = (None, None, None);
        }
        crate::remote::sha256_hex(&c.to_bytes())
    }

    /// Whether file `name` is read after the restore starts: pages.img and the working
    /// set's pages (ws.pages, ws.lz4), which a miss installs as they arrive. The others
    /// (state.bin, ws.trace) are what a restore waits for before it starts.
    pub fn read_after_start(name: &str) -> bool {
        [thaw_engine::image::PAGES_FILE, thaw_engine::ws::PAGES_FILE, thaw_engine::ws::LZ4_FILE].contains(&name)
    }

    /// Where, in the head pack, the chunks of the files a restore waits for before it
    /// starts ([`Manifest::read_after_start`]) end: the head starts with them
    /// (`publish::plan`), and a split head copy's first object holds the pack up to
    /// here (`fetch::head_copy_split`). None without a head, without such chunks in it,
    /// or where they end with the pack (nothing to split off).
    pub fn head_first_end(&self) -> Option<u64> {
        let head = self.head?;
        let end = self
            .files
            .iter()
            .filter(|f| !Manifest::read_after_start(&f.name))
            .flat_map(|f| &f.chunks)
            .filter(|c| c.sha256.is_some() && c.pack == Some(head))
            .filter_map(|c| Some(c.at? + c.stored_len()))
            .max()?;
        (end < self.packs.get(head as usize)?.size).then_some(end)
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
        let h = ChunkHash::of(b"a");
        Manifest {
            format: MANIFEST_FORMAT,
            image_format: thaw_engine::image::FORMAT_VERSION,
            image_id: 7,
            packs: vec![PackRef { name: sha256_hex(b"pack"), size: 4106 }],
            head: None,
            files: vec![
                FileEntry {
                    name: "state.bin".into(),
                    size: 10,
                    chunks: vec![Chunk { pack: Some(0), at: Some(0), ..Chunk::new(0, 10, Some(h)) }],
                },
                FileEntry {
                    name: "pages.img".into(),
                    size: 8192,
                    chunks: vec![
                        Chunk::new(0, 4096, None),
                        Chunk { pack: Some(0), at: Some(10), ..Chunk::new(4096, 4096, Some(h)) },
                    ],
                },
            ],
            derived: vec![],
            base: None,
            is_base: false,
            sandbox: None,
        }
    }

    #[test]
    fn a_chunk_hash_is_hex_in_json_and_names_and_anything_else_is_refused() {
        let h = ChunkHash::of(b"a");
        assert_eq!(h.hex(), sha256_hex(b"a"));
        assert_eq!(format!("{h}"), h.hex());
        assert_eq!(crate::Remote::chunk_key(&h), format!("chunks/{}", sha256_hex(b"a")));
        assert_eq!(serde_json::to_string(&h).unwrap(), format!("\"{}\"", h.hex()));
        assert_eq!(serde_json::from_str::<ChunkHash>(&format!("\"{}\"", h.hex())).unwrap(), h);
        assert_eq!(ChunkHash::from_hex(&h.hex()), Some(h));
        for bad in [h.hex().to_uppercase(), h.hex()[1..].to_string(), format!("{}g", &h.hex()[1..])] {
            assert_eq!(ChunkHash::from_hex(&bad), None, "{bad}");
        }
        // A JSON manifest whose chunk names are not hashes is refused by name.
        let mut json = serde_json::to_value(sample()).unwrap();
        json["files"][1]["chunks"][1]["sha256"] = "../../etc/passwd".into();
        let e = Manifest::parse("m", &serde_json::to_vec(&json).unwrap()).unwrap_err().to_string();
        assert!(e.contains("a chunk's sha256 '../../etc/passwd' is not 64 lowercase hex digits"), "{e}");
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
        let mut future = sample();
        future.format = MANIFEST_FORMAT_COMPACT + 1;
        let json = serde_json::to_vec(&future).unwrap();
        assert!(Manifest::parse("m", &json).unwrap_err().to_string().contains("this build reads 1 to 7): upgrade thaw"));
    }

    #[test]
    fn format_6_is_binary_checked_as_json_is_and_refused_in_the_other_encoding() {
        let mut m = sample();
        m.format = MANIFEST_FORMAT_BINARY;
        m.sandbox = None;
        let b = m.to_bytes();
        assert!(b.starts_with(MAGIC));
        assert_eq!(Manifest::parse("m", &b).unwrap(), m);
        let json = serde_json::to_vec(&m).unwrap();
        assert!(b.len() < json.len(), "{} bytes binary, {} JSON", b.len(), json.len());
        assert_eq!(m.content_digest(), sample().content_digest(), "the encoding is not content");
        // The same checks as JSON's.
        let mut gap = m.clone();
        gap.files[1].chunks[1].offset = 5000;
        assert!(Manifest::parse("m", &gap.to_bytes()).unwrap_err().to_string().contains("bad chunk at offset 5000"));
        let mut nostate = m.clone();
        nostate.files.remove(0);
        assert!(Manifest::parse("m", &nostate.to_bytes()).unwrap_err().to_string().ends_with("no state.bin"));
        // Each format in its own encoding only.
        assert!(Manifest::parse("m", &json).unwrap_err().to_string().contains("format 6 in the wrong encoding (JSON)"));
        let mut as_5 = m.clone();
        as_5.format = MANIFEST_FORMAT;
        let mut b5 = MAGIC.to_vec();
        bincode::Options::serialize_into(wire_options(MAX_MANIFEST_LEN), &mut b5, &Wire::of(&as_5)).unwrap();
        assert!(Manifest::parse("m", &b5).unwrap_err().to_string().contains("format 5 in the wrong encoding (binary)"));
        // Cut short, with bytes after it, or garbage: refused, never a panic or a huge
        // allocation (a length prefix near 2^64 included).
        for cut in [b.len() - 1, b.len() / 2, MAGIC.len()] {
            assert!(Manifest::parse("m", &b[..cut]).unwrap_err().to_string().contains("not a manifest"), "cut at {cut}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(Manifest::parse("m", &longer).is_err());
        // A chunk record that is not whole, or names a field it says is absent.
        let mut torn = m.clone();
        torn.format = MANIFEST_FORMAT_BINARY;
        let t = torn.to_bytes();
        let whole = Manifest::parse("m", &t).unwrap();
        assert_eq!(whole, torn);
        let zero_chunk: Vec<u8> = [&[0u8][..], &0u64.to_le_bytes(), &4096u64.to_le_bytes()].concat();
        let record_at = t.windows(17).position(|w| w == zero_chunk).expect("pages.img's zero chunk: flags 0, offset 0, len 4096");
        let mut flagged = t.clone();
        flagged[record_at + 17] = 1; // a hash byte of a chunk without one
        assert!(Manifest::parse("m", &flagged).unwrap_err().to_string().contains("a field it says is absent"));
        let mut unknown = t.clone();
        unknown[record_at] = 0x10;
        assert!(Manifest::parse("m", &unknown).unwrap_err().to_string().contains("unknown flags"));
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[6, 0, 0xfb]);
        huge.extend_from_slice(&[0xff; 12]);
        assert!(Manifest::parse("m", &huge).is_err());
    }

    /// A format 7 manifest whose pages.img has chunks that follow one another in their
    /// pack, a zero chunk, a compressed one and one that goes back to an earlier place.
    fn compact_sample() -> Manifest {
        let (a, b) = (ChunkHash::of(b"a"), ChunkHash::of(b"b"));
        let mut m = sample();
        m.format = MANIFEST_FORMAT_COMPACT;
        m.packs[0].size = 10 + 2 * 4096 + 100;
        m.files[1] = FileEntry {
            name: "pages.img".into(),
            size: 5 * 4096,
            chunks: vec![
                Chunk { pack: Some(0), at: Some(10), ..Chunk::new(0, 4096, Some(a)) },
                Chunk { pack: Some(0), at: Some(4106), ..Chunk::new(4096, 4096, Some(b)) },
                Chunk::new(8192, 4096, None),
                Chunk { pack: Some(0), at: Some(8202), zlen: Some(100), ..Chunk::new(12288, 4096, Some(a)) },
                Chunk { pack: Some(0), at: Some(10), ..Chunk::new(16384, 4096, Some(a)) },
            ],
        };
        m
    }

    #[test]
    fn format_7_tables_are_compact_and_read_back_as_written() {
        let m = compact_sample();
        let b7 = m.to_bytes();
        assert!(b7.starts_with(MAGIC));
        assert_eq!(Manifest::parse("m", &b7).unwrap(), m);
        let mut as_6 = m.clone();
        as_6.format = MANIFEST_FORMAT_BINARY;
        let b6 = as_6.to_bytes();
        assert_eq!(Manifest::parse("m", &b6).unwrap(), as_6, "format 6 is still read");
        // 6 chunks: 69 bytes each as fixed records; here at most a hash and 5 bytes of
        // fields each, the zero chunk 3.
        assert!(b6.len() - b7.len() >= 6 * 69 - (5 * (32 + 5) + 3), "{} bytes as format 7, {} as 6", b7.len(), b6.len());
        // Only the first chunk of a pack in a table, and the one that goes back, write
        // their place: the second and fourth chunk follow the one before in the pack.
        let flags: Vec<u8> = {
            let t = Table::of(&m.files[1].chunks, MANIFEST_FORMAT_COMPACT).0;
            let mut r = Reader(&t);
            let mut flags = vec![];
            while !r.0.is_empty() {
                let f = r.byte().unwrap();
                flags.push(f);
                r.varint().unwrap();
                let skip = if f & 1 != 0 { 32 } else { 0 };
                r.0 = &r.0[skip..];
                for bit in [2, 4, 8] {
                    if f & bit != 0 && !(bit == 4 && f & FOLLOWS != 0) {
                        r.varint().unwrap();
                    }
                }
            }
            flags
        };
        assert_eq!(flags, vec![7, 7 | FOLLOWS, 0, 15 | FOLLOWS, 7]);
        // The same checks as every format's: chunks that do not cover their file.
        let mut short = m.clone();
        short.files[1].size += 1;
        assert!(Manifest::parse("m", &short.to_bytes()).unwrap_err().to_string().contains("chunks cover 20480 bytes of 20481"));
        // Cut anywhere, never a panic.
        for cut in MAGIC.len()..b7.len() {
            assert!(Manifest::parse("m", &b7[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_format_7_table_that_does_not_decode_is_refused_by_what_is_wrong() {
        let t = Table::of(&compact_sample().files[1].chunks, MANIFEST_FORMAT_COMPACT);
        assert_eq!(t.chunks(MANIFEST_FORMAT_COMPACT, 1).unwrap(), compact_sample().files[1].chunks);
        assert!(t.chunks(MANIFEST_FORMAT_COMPACT, 0).unwrap_err().contains("names a pack the manifest does not list"));
        // A table cut short is refused, or (cut between records) holds fewer chunks,
        // which then do not cover their file.
        for cut in 0..t.0.len() {
            if let Ok(c) = Table(t.0[..cut].to_vec()).chunks(MANIFEST_FORMAT_COMPACT, 1) {
                assert!(c.len() < 5, "cut at {cut}");
            }
        }
        let bad = |bytes: &[u8]| Table(bytes.to_vec()).chunks(MANIFEST_FORMAT_COMPACT, 1).unwrap_err();
        assert!(bad(&[0x20, 1]).contains("unknown flags 0x20"));
        assert!(bad(&[FOLLOWS | 4, 1]).contains("without a pack and a place"));
        assert!(bad(&[FOLLOWS | 6, 1, 0]).contains("follows no earlier chunk of its pack"));
        assert!(bad(&[2, 1, 1]).contains("names a pack the manifest does not list"));
        assert!(bad(&[0, 0x80]).contains("cut short"));
        assert!(bad(&[1, 5, 0, 0]).contains("cut short"), "a hash of two bytes");
        let mut over = vec![0];
        over.extend_from_slice(&[0xff; 9]);
        assert_eq!(Table([&over[..], &[1]].concat()).chunks(MANIFEST_FORMAT_COMPACT, 1).unwrap()[0].len, u64::MAX);
        assert!(bad(&[&over[..], &[2]].concat()).contains("over 64 bits"));
        assert!(bad(&[&over[..], &[1, 0, 1]].concat()).contains("lengths overflow"));
        assert!(bad(&[6, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, FOLLOWS | 6, 1, 0]).contains("place overflows"));
    }

    #[test]
    fn ws_lz4_is_stored_from_format_5_with_its_trace_in_place_of_ws_pages() {
        let file = |name: &str| FileEntry { name: name.into(), size: 0, chunks: vec![] };
        let mut m = sample();
        m.files.push(file("ws.trace"));
        m.files.push(file("ws.lz4"));
        m.derived = vec!["ws.pages".into()];
        assert_eq!(Manifest::parse("m", &m.to_bytes()).unwrap(), m);
        let refused = |m: &Manifest| Manifest::parse("m", &m.to_bytes()).unwrap_err().to_string();
        let mut old = m.clone();
        old.format = MANIFEST_FORMAT_WS_PAGES;
        assert!(refused(&old).ends_with("ws.lz4 stored without its trace, beside ws.pages, or before format 5"));
        let mut both = m.clone();
        both.files.push(file("ws.pages"));
        both.derived.clear();
        assert!(refused(&both).contains("ws.lz4 stored without its trace, beside ws.pages"));
        let mut underived = m.clone();
        underived.derived.clear();
        assert!(refused(&underived).contains("ws.lz4 stored"));
        let mut traceless = m.clone();
        traceless.files.retain(|f| f.name != "ws.trace");
        assert!(refused(&traceless).contains("ws.lz4 stored"));
    }

    #[test]
    fn a_compressed_chunk_is_smaller_lies_in_its_pack_and_needs_format_3() {
        let mut z = sample();
        z.files[1].chunks[1].zlen = Some(96);
        let m = Manifest::parse("m", &z.to_bytes()).unwrap();
        assert_eq!(m.files[1].chunks[1].stored_len(), 96);
        assert_eq!(m.content_digest(), sample().content_digest(), "compression is not content");
        let mut longer = sample();
        longer.files[1].chunks[1].zlen = Some(4096);
        assert!(Manifest::parse("m", &longer.to_bytes()).unwrap_err().to_string().contains("bad compressed length"));
        let mut v2 = z.clone();
        v2.format = MANIFEST_FORMAT_PACKS;
        assert!(Manifest::parse("m", &v2.to_bytes()).unwrap_err().to_string().contains("bad compressed length"), "format 2 stores chunks raw");
        v2.files[1].chunks[1].zlen = None;
        assert!(Manifest::parse("m", &v2.to_bytes()).is_ok(), "format 2 is still read");
        // A compressed chunk may end where a raw one of its length would not fit.
        let mut tail = sample();
        tail.packs[0].size = 10 + 96;
        tail.files[1].chunks[1].zlen = Some(96);
        assert!(Manifest::parse("m", &tail.to_bytes()).is_ok());
        tail.files[1].chunks[1].zlen = Some(97);
        assert!(Manifest::parse("m", &tail.to_bytes()).unwrap_err().to_string().contains("is not in a pack"));
    }

    #[test]
    fn a_base_is_a_full_image_of_format_3_and_a_diff_names_one_by_id() {
        let mut base = sample();
        base.is_base = true;
        assert!(Manifest::parse("m", &base.to_bytes()).unwrap().is_base);
        assert_ne!(base.to_bytes(), sample().to_bytes(), "a base is another snapshot than the same image pushed alone");
        let mut based = base.clone();
        based.base = Some(sha256_hex(b"b"));
        assert!(Manifest::parse("m", &based.to_bytes()).unwrap_err().to_string().contains("bad base"), "a base is no diff");
        let mut diff = sample();
        diff.base = Some("not-an-id".into());
        assert!(Manifest::parse("m", &diff.to_bytes()).unwrap_err().to_string().contains("bad base"));
        diff.base = Some(sha256_hex(b"b"));
        assert!(Manifest::parse("m", &diff.to_bytes()).is_ok());
        diff.format = MANIFEST_FORMAT_PACKS;
        assert!(Manifest::parse("m", &diff.to_bytes()).unwrap_err().to_string().contains("bad base"), "format 2 has no bases");
    }

    #[test]
    fn ws_pages_is_stored_from_format_4_on_with_its_trace_and_not_also_derived() {
        let file = |name: &str| FileEntry { name: name.into(), size: 8, chunks: vec![Chunk::new(0, 8, None)] };
        let mut m = sample();
        m.files.push(file("ws.trace"));
        m.files.push(file("ws.pages"));
        assert!(Manifest::parse("m", &m.to_bytes()).is_ok());
        let mut v3 = m.clone();
        v3.format = MANIFEST_FORMAT_COMPRESSED;
        assert!(Manifest::parse("m", &v3.to_bytes()).unwrap_err().to_string().contains("ws.pages stored"), "format 3 derives it");
        let mut both = m.clone();
        both.derived = vec!["ws.pages".into()];
        assert!(Manifest::parse("m", &both.to_bytes()).unwrap_err().to_string().contains("derived too"));
        let mut alone = m.clone();
        alone.files.remove(2);
        assert!(Manifest::parse("m", &alone.to_bytes()).unwrap_err().to_string().contains("without its trace"));
        let mut twice = m.clone();
        twice.files.push(file("ws.pages"));
        assert!(Manifest::parse("m", &twice.to_bytes()).unwrap_err().to_string().contains("repeated file"));
    }

    #[test]
    fn packed_chunks_must_lie_in_their_pack_and_the_digest_ignores_packing() {
        let m = sample();
        let mut outside = sample();
        outside.files[1].chunks[1].at = Some(20);
        assert!(Manifest::parse("m", &outside.to_bytes()).unwrap_err().to_string().contains("is not in a pack"));
        let mut loose = sample();
        loose.files[0].chunks[0].pack = None;
        assert!(Manifest::parse("m", &loose.to_bytes()).is_err(), "a stored chunk of format 2 has a pack");
        let mut nopack = sample();
        nopack.files[1].chunks[1].pack = Some(1);
        assert!(Manifest::parse("m", &nopack.to_bytes()).is_err(), "an index past the packs");
        let mut v1 = sample();
        v1.format = MANIFEST_FORMAT_CHUNKS;
        assert!(Manifest::parse("m", &v1.to_bytes()).unwrap_err().to_string().contains("format 1 has no packs"));
        v1.packs.clear();
        for c in v1.files.iter_mut().flat_map(|f| &mut f.chunks) {
            (c.pack, c.at) = (None, None);
        }
        assert!(Manifest::parse("m", &v1.to_bytes()).is_ok(), "format 1 is still read");
        let mut repacked = sample();
        repacked.packs[0] = PackRef { name: sha256_hex(b"other"), size: 9000 };
        repacked.files[1].chunks[1].at = Some(4000);
        assert_ne!(repacked.to_bytes(), m.to_bytes());
        assert_eq!(repacked.content_digest(), m.content_digest(), "the same contents in other packs");
        assert_eq!(v1.content_digest(), m.content_digest());
    }
}
