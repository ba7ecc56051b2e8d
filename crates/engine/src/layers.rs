//! Layered snapshots (SnapFaaS): one base image per runtime, a small diff per function.
//!
//! A **base** is an ordinary image of a runtime that started in a sandbox whose
//! /var/task is an empty placeholder and that waits, before loading any function
//! code, for the node to name its function (the shim's `load` message). Nothing of a
//! function is in it: no code path, handler, environment value or secret. It lives in
//! `BASES/<id>/` (state.bin, pages.img, base.json), where `id` is the sha256 of its
//! state.bin and pages.img. A base is keyed by what the runtime sizes itself by
//! ([`BaseKey`]): runtime, shim version, memory class, CPU, image format.
//!
//! A **diff** is the image of an instance restored from the base (eagerly, so every
//! base page is present) after the function's init ran in it. Its state is complete
//! (registers, the whole memory map, descriptors, ...); of its pages it stores only
//! those whose contents differ from the base's page at the same address, and
//! [`BaseRef::runs`] lists the addresses whose contents are the base's. A page the
//! function released (MADV_DONTNEED, munmap, brk shrink) is in neither and reads as
//! zeros, exactly as anonymous memory must. Because the comparison is by content, a
//! page the function rewrote with the same bytes is not stored either.
//!
//! Restore merges the two indexes into one numbering of stored pages ([`PageFiles`]:
//! the diff's pages, then the base's), so the page server, working sets, eager
//! installs and resets work on a diff exactly as on a full image. Each base page is
//! checked against the base's CRC as it is read (the diff carries the CRCs of the base
//! pages it takes, and where they lie in the base's pages.img: [`BaseRef::pieces`]), and
//! the base's state.bin CRC must be the one the diff recorded, checked beside the
//! restore and before the function runs ([`BaseCheck`]): a diff is never restored over
//! another base.
//!
//! A base still named by a diff is never removed: each diff leaves a reference in
//! `BASES/<id>/refs/`, checked (the diff still exists and names this base) by
//! [`remove`].
//!
//! Instances of a diff share its memory through `sharedmem.rs`. A diff captured by a
//! process holding a node key is sealed like a full image (its own pages and /tmp);
//! its base stays clear.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tracing::info;

use crate::image::{BaseRef, ImageError, PageIndex, PageRun, ProcessImage, SandboxRecord, Snapshot, FORMAT_VERSION, PAGES_FILE, STATE_FILE};
use crate::pagefiles::{MappedPages, PageFiles};
use crate::sys::PAGE_SIZE;

/// A base's description, beside its image.
pub const META_FILE: &str = "base.json";
/// Beside a diff that moved to another machine (fetched from a snapshot store): its
/// base, as a directory or a link to one. Preferred to the place the diff recorded.
pub const BASE_LINK: &str = "base";
const REFS_DIR: &str = "refs";
/// The empty directory mounted at /var/task while a base boots.
pub const PLACEHOLDER_DIR: &str = ".placeholder-task";

#[derive(Debug, Error)]
pub enum LayerError {
    #[error("{what} {}", path.display())]
    Io { path: PathBuf, what: &'static str, #[source] source: io::Error },
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("the diff {diff} cannot be restored over base {base}: {why}")]
    Mismatch { diff: PathBuf, base: String, why: String },
    #[error("base {id} is still used by {} diff snapshot(s), e.g. {}; remove them (or re-create them with --no-base) first", .diffs.len(), .diffs[0].display())]
    InUse { id: String, diffs: Vec<PathBuf> },
    #[error("no base {id} in {}", dir.display())]
    NotFound { id: String, dir: PathBuf },
    #[error("runtime {runtime} cannot have a base yet: {why}")]
    Unsupported { runtime: String, why: &'static str },
    #[error("{0}")]
    Refused(String),
}

/// What a base is built for: a diff only ever goes on a base with the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseKey {
    pub runtime: String,
    /// The shim directory's name (`runtimes-<content hash>`): a new shim is a new base.
    pub shims: String,
    pub memory_mb: u64,
    pub cpu_millis: u64,
    pub format: u32,
}

impl BaseKey {
    pub fn of(rec: &SandboxRecord) -> BaseKey {
        BaseKey {
            runtime: rec.runtime.clone(),
            shims: rec.runtime_dir.as_deref().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            memory_mb: rec.memory_mb,
            cpu_millis: rec.cpu_millis,
            format: FORMAT_VERSION,
        }
    }
}

/// `BASES/<id>/base.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseMeta {
    pub id: String,
    pub key: BaseKey,
    pub created_unix_ms: u64,
    pub stored_pages: u64,
    pub bytes: u64,
    /// Set by [`list`]: where the base is.
    #[serde(skip)]
    pub dir: PathBuf,
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> LayerError {
    let path = path.to_path_buf();
    move |source| LayerError::Io { path, what, source }
}

/// The content id of the image in `dir`: sha256 over state.bin, then pages.img.
pub fn content_id(dir: &Path) -> Result<String, LayerError> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for name in [STATE_FILE, PAGES_FILE] {
        let path = dir.join(name);
        let mut f = File::open(&path).map_err(io_err(&path, "opening"))?;
        loop {
            let n = f.read(&mut buf).map_err(io_err(&path, "reading"))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// The empty directory a base's sandbox mounts at /var/task (created if needed).
pub fn placeholder(bases: &Path) -> Result<PathBuf, LayerError> {
    let dir = bases.join(PLACEHOLDER_DIR);
    std::fs::create_dir_all(&dir).map_err(io_err(&dir, "creating"))?;
    if std::fs::read_dir(&dir).map_err(io_err(&dir, "listing"))?.next().is_some() {
        return Err(LayerError::Refused(format!("the base placeholder {} must be empty", dir.display())));
    }
    Ok(dir)
}

/// Move a freshly captured base image from `captured` to `BASES/<id>` and describe
/// it. An identical base already there is kept (and `captured` removed).
pub fn install(captured: &Path, bases: &Path, key: BaseKey) -> Result<BaseMeta, LayerError> {
    let id = content_id(captured)?;
    let snap = Snapshot::open_with(captured, None)?;
    if snap.image.seal.is_some() || snap.image.base.is_some() {
        let _ = std::fs::remove_dir_all(captured);
        return Err(LayerError::Refused("a base must be a clear, full image".into()));
    }
    let stored_pages = snap.image.pages.stored_pages();
    let meta = BaseMeta {
        id: id.clone(),
        key,
        created_unix_ms: snap.image.created_unix_ms,
        stored_pages,
        bytes: stored_pages * PAGE_SIZE,
        dir: bases.join(&id),
    };
    let json = serde_json::to_vec_pretty(&meta).expect("BaseMeta serializes");
    let meta_path = captured.join(META_FILE);
    std::fs::write(&meta_path, json).map_err(io_err(&meta_path, "writing"))?;
    if meta.dir.join(META_FILE).is_file() {
        let _ = std::fs::remove_dir_all(captured);
        return Ok(meta);
    }
    std::fs::rename(captured, &meta.dir).map_err(io_err(&meta.dir, "installing the base as"))?;
    info!(id = %meta.id, runtime = %meta.key.runtime, pages = stored_pages, "base installed");
    Ok(meta)
}

/// Every base in `bases` (directories without a readable base.json are skipped).
pub fn list(bases: &Path) -> Result<Vec<BaseMeta>, LayerError> {
    let rd = match std::fs::read_dir(bases) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LayerError::Io { path: bases.to_path_buf(), what: "listing", source: e }),
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        out.extend(meta_of(&entry.path()));
    }
    out.sort_by(|a, b| (&a.key.runtime, a.created_unix_ms).cmp(&(&b.key.runtime, b.created_unix_ms)));
    Ok(out)
}

/// The description of the base in `dir` (None: `dir` holds no base).
pub fn meta_of(dir: &Path) -> Option<BaseMeta> {
    let bytes = std::fs::read(dir.join(META_FILE)).ok()?;
    let mut m = serde_json::from_slice::<BaseMeta>(&bytes).ok()?;
    m.dir = dir.to_path_buf();
    Some(m)
}

/// The newest base built for `key`, if any.
pub fn find(bases: &Path, key: &BaseKey) -> Result<Option<BaseMeta>, LayerError> {
    Ok(list(bases)?.into_iter().filter(|m| &m.key == key).max_by_key(|m| m.created_unix_ms))
}

/// The diffs that still name base `meta` (their reference files, checked).
pub fn users(meta: &BaseMeta) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(meta.dir.join(REFS_DIR)) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let Ok(target) = std::fs::read_to_string(entry.path()) else { continue };
        let diff = PathBuf::from(target.trim_end());
        let names_it = Snapshot::open_with(&diff, None)
            .map(|s| s.image.base.is_some_and(|b| b.id == meta.id))
            // A sealed diff cannot be opened without its key: count it as a user.
            .unwrap_or_else(|e| matches!(e, ImageError::Sealed { .. }));
        if names_it {
            out.push(diff);
        } else {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    out
}

/// Remove base `id` unless a diff still names it.
pub fn remove(bases: &Path, id: &str) -> Result<(), LayerError> {
    let meta = list(bases)?
        .into_iter()
        .find(|m| m.id == id || (id.len() >= 8 && m.id.starts_with(id)))
        .ok_or_else(|| LayerError::NotFound { id: id.into(), dir: bases.to_path_buf() })?;
    let diffs = users(&meta);
    if !diffs.is_empty() {
        return Err(LayerError::InUse { id: meta.id, diffs });
    }
    std::fs::remove_dir_all(&meta.dir).map_err(io_err(&meta.dir, "removing"))
}

/// Remove the bases in `bases` that `key`'s base supersedes: built for the same runtime
/// and sandbox shape by another shim or image format (no diff will be made on them
/// again), and named by no diff. A base still in use, or one that cannot be removed,
/// is left (and logged).
pub fn prune_superseded(bases: &Path, key: &BaseKey) {
    let same_shape = |k: &BaseKey| k.runtime == key.runtime && k.memory_mb == key.memory_mb && k.cpu_millis == key.cpu_millis;
    for m in list(bases).unwrap_or_default() {
        if !same_shape(&m.key) || (m.key.shims == key.shims && m.key.format == key.format) {
            continue;
        }
        match remove(bases, &m.id) {
            Ok(()) => info!(id = %m.id, runtime = %m.key.runtime, shims = %m.key.shims, format = m.key.format, "superseded base removed"),
            Err(LayerError::InUse { diffs, .. }) => info!(id = %m.id, diffs = diffs.len(), "superseded base kept: diffs still name it"),
            Err(e) => tracing::warn!(id = %m.id, error = %e, "superseded base not removed"),
        }
    }
}

/// Record that the diff at `diff` names base `meta` (see [`users`]).
pub fn add_user(meta: &BaseMeta, diff: &Path) -> Result<(), LayerError> {
    let refs = meta.dir.join(REFS_DIR);
    std::fs::create_dir_all(&refs).map_err(io_err(&refs, "creating"))?;
    let abs = std::fs::canonicalize(diff).map_err(io_err(diff, "resolving"))?;
    let name = hex::encode(&Sha256::digest(abs.as_os_str().as_encoded_bytes())[..12]);
    let path = refs.join(name);
    std::fs::write(&path, abs.as_os_str().as_encoded_bytes()).map_err(io_err(&path, "writing"))
}

/// A base's pages, compared with a diff's while it is captured.
pub struct Comparer {
    meta: BaseMeta,
    state_crc: u32,
    index: PageIndex,
    map: MappedPages,
}

impl Comparer {
    /// The pages of base `meta`, as opened for the restore the diff is captured from:
    /// its page index, its page files and its id (the CRC of its state).
    pub fn new(meta: &BaseMeta, index: &PageIndex, files: &PageFiles, state_crc: u32) -> Result<Comparer, LayerError> {
        let map = files.map(index.stored_pages()).map_err(io_err(&meta.dir, "mapping the pages of base"))?;
        Ok(Comparer { meta: meta.clone(), state_crc, index: index.clone(), map })
    }

    /// Whether the base's page at `vaddr` holds exactly `page`.
    pub fn same(&self, vaddr: u64, page: &[u8]) -> bool {
        self.index.lookup(vaddr).is_some_and(|fp| self.map.pages(fp, 1) == page)
    }

    /// The reference a diff stores, for the addresses `pages` (sorted) taken from the
    /// base ([`Comparer::same`] said each is one of its pages): the runs they form, and
    /// where each lies in the base's pages.img with its CRC, so that a restore needs
    /// nothing of the base's state.bin to place them.
    pub fn base_ref(&self, pages: &[u64]) -> BaseRef {
        let runs = crate::image::page_runs(pages);
        let mut pieces: Vec<PageRun> = Vec::new();
        let mut crcs = Vec::with_capacity(pages.len());
        // Each run as the pieces of the base's runs it spans (one lookup per piece, not
        // per page), joined where contiguous in both.
        for &(start, n) in &runs {
            let end = start + n * PAGE_SIZE;
            let mut vaddr = start;
            while vaddr < end {
                let r = self.index.run_at(vaddr).expect("a page taken from the base is one of its pages (Comparer::same)");
                let k = (vaddr - r.vaddr) / PAGE_SIZE;
                let take = (r.npages - k).min((end - vaddr) / PAGE_SIZE);
                let fp = r.file_page + k;
                crcs.extend_from_slice(&self.index.crcs[fp as usize..(fp + take) as usize]);
                match pieces.last_mut() {
                    Some(l) if l.vaddr + l.npages * PAGE_SIZE == vaddr && l.file_page + l.npages == fp => l.npages += take,
                    _ => pieces.push(PageRun { vaddr, npages: take, file_page: fp }),
                }
                vaddr += take * PAGE_SIZE;
            }
        }
        BaseRef {
            id: self.meta.id.clone(),
            dir: self.meta.dir.clone(),
            state_crc: self.state_crc,
            runs,
            pieces,
            crcs,
            stored_pages: self.index.stored_pages(),
        }
    }

    pub fn meta(&self) -> &BaseMeta {
        &self.meta
    }
}

/// Where the base of the diff in `dir` is: beside it ([`BASE_LINK`]) when there is one
/// there, else where it was when the diff was captured. Either way the base found must
/// be the one the diff names (checked by [`page_source`]).
pub fn base_dir(dir: &Path, bref: &BaseRef) -> PathBuf {
    let beside = dir.join(BASE_LINK);
    if beside.exists() {
        beside
    } else {
        bref.dir.clone()
    }
}

/// Where a restore reads the pages of `image` (opened from `dir`, its pages.img
/// `own`): for a full image that file alone; for a diff, the merged index over the
/// diff's pages and its base's (see the module docs), built from the diff's state
/// alone ([`BaseRef::pieces`]). Fails closed if the base is missing or its pages.img
/// has another size; whether it is the diff's base by its state.bin is checked beside
/// the restore: the [`BaseCheck`] returned, which must pass before the function runs.
pub fn page_source(dir: &Path, image: &ProcessImage, own: File) -> Result<(PageIndex, PageFiles, BaseCheck), LayerError> {
    let Some(bref) = &image.base else { return Ok((image.pages.clone(), own.into(), BaseCheck::none())) };
    let mismatch = |why: String| LayerError::Mismatch { diff: dir.to_path_buf(), base: bref.id.clone(), why };
    let corrupt = |detail: String| LayerError::Image(ImageError::Corrupt { dir: dir.to_path_buf(), file: STATE_FILE, detail });
    let at = base_dir(dir, bref);
    let base_pages = match File::open(at.join(PAGES_FILE)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(mismatch(format!("the base is not at {} (rebuild it with `thaw base build`, or re-create the snapshot)", at.display())))
        }
        Err(e) => return Err(mismatch(format!("the base at {} cannot be opened: {e}", at.display()))),
    };
    let size = base_pages.metadata().map_err(|e| mismatch(format!("the base at {} cannot be opened: {e}", at.display())))?.len();
    if size != bref.stored_pages * PAGE_SIZE {
        return Err(mismatch(format!("the image at {} is another base (its pages.img has {size} bytes, the diff's base {})", at.display(), bref.stored_pages * PAGE_SIZE)));
    }
    // The pieces must lie in the base's file, be the runs (the addresses the diff takes
    // from the base) split where the base's file is not contiguous, and carry a CRC for
    // each page (a state.bin that passed its own CRC can still be hostile).
    if let Some(p) = bref.pieces.iter().find(|p| p.npages == 0 || p.file_page.checked_add(p.npages).is_none_or(|end| end > bref.stored_pages)) {
        return Err(corrupt(format!("a base piece of {} pages at file page {} is not in the base's {} pages", p.npages, p.file_page, bref.stored_pages)));
    }
    let mut joined: Vec<(u64, u64)> = Vec::with_capacity(bref.runs.len());
    for p in &bref.pieces {
        match joined.last_mut() {
            Some((a, n)) if a.checked_add(n.saturating_mul(PAGE_SIZE)) == Some(p.vaddr) => *n += p.npages,
            _ => joined.push((p.vaddr, p.npages)),
        }
    }
    let piece_pages: u64 = bref.pieces.iter().map(|p| p.npages).sum();
    if joined != bref.runs || bref.crcs.len() as u64 != piece_pages {
        return Err(corrupt(format!(
            "the base pieces ({piece_pages} pages, {} CRCs) are not the {} base pages the diff takes",
            bref.crcs.len(),
            bref.pages()
        )));
    }
    let own_pages = image.pages.stored_pages();
    let mut runs: Vec<PageRun> = image.pages.runs.clone();
    let mut crcs = Vec::with_capacity((own_pages + bref.stored_pages) as usize);
    crcs.extend_from_slice(&image.pages.crcs);
    // The base's pages are numbered after the diff's; those the diff does not take
    // are never looked up (no run names them), so their CRCs stay unset.
    crcs.resize((own_pages + bref.stored_pages) as usize, 0);
    let mut taken = bref.crcs.iter();
    for p in &bref.pieces {
        p.vaddr.checked_add(p.npages * PAGE_SIZE).ok_or_else(|| corrupt(format!("a run of {} base pages at {:#x} is past the address space", p.npages, p.vaddr)))?;
        let fp = p.file_page + own_pages;
        for (slot, crc) in crcs[fp as usize..(fp + p.npages) as usize].iter_mut().zip(&mut taken) {
            *slot = *crc;
        }
        match runs.last_mut() {
            Some(l) if l.file_page >= own_pages && l.vaddr + l.npages * PAGE_SIZE == p.vaddr && l.file_page + l.npages == fp => l.npages += p.npages,
            _ => runs.push(PageRun { vaddr: p.vaddr, npages: p.npages, file_page: fp }),
        }
    }
    runs.sort_by_key(|r| r.vaddr);
    if runs.windows(2).any(|w| w[0].vaddr + w[0].npages * PAGE_SIZE > w[1].vaddr) {
        return Err(corrupt("a page is both stored and taken from the base".into()));
    }
    // A sealed diff's own pages carry their tags; the base's pages are clear (a base
    // holds nothing of any function, and is never sealed).
    let index = PageIndex { runs, crcs, tags: image.pages.tags.clone() };
    Ok((index, PageFiles::layered(own, own_pages, base_pages), BaseCheck::beside(dir, bref, at)))
}

/// Whether the base a diff is restored over is the one it was captured against: its
/// state.bin's CRC, read on a thread of its own beside the restore (its pages were
/// placed without it, each checked against its CRC as it is read). Nothing of the
/// function runs before it says so ([`BaseCheck::wait`]).
pub struct BaseCheck {
    /// The check, the diff's directory and the base's id (for the error).
    running: Option<(std::sync::Arc<crate::fingerprint::Verdict>, PathBuf, String)>,
}

impl BaseCheck {
    /// A full image's: nothing to check.
    pub fn none() -> BaseCheck {
        BaseCheck { running: None }
    }

    fn beside(dir: &Path, bref: &BaseRef, at: PathBuf) -> BaseCheck {
        let (want, shown) = (bref.state_crc, at.display().to_string());
        let verdict = crate::fingerprint::Verdict::spawn("thaw-base-check", move || match Snapshot::open_with(&at, None) {
            Ok(b) if b.id == want && b.image.base.is_none() && b.image.seal.is_none() => Ok(()),
            Ok(_) => Err(format!("the image at {shown} is another base (it changed since the diff was captured)")),
            Err(e @ ImageError::Io { .. }) => Err(format!("the base at {shown} cannot be opened: {e}")),
            Err(e) => Err(format!("the image at {shown} is another base, or damaged (it changed since the diff was captured): {e}")),
        });
        BaseCheck { running: Some((verdict, dir.to_path_buf(), bref.id.clone())) }
    }

    /// Block until the base is known to be the diff's (at once for a full image).
    pub fn wait(&self) -> Result<(), LayerError> {
        match &self.running {
            Some((v, diff, base)) => v.wait().map_err(|why| LayerError::Mismatch { diff: diff.clone(), base: base.clone(), why }),
            None => Ok(()),
        }
    }
}

/// Sizes of a diff, for `thaw snapshot inspect`.
#[derive(Debug, Clone, Serialize)]
pub struct LayerSizes {
    pub base: Option<String>,
    pub diff_bytes: u64,
    pub base_bytes: u64,
    /// What a full image of the same state stores: the diff's pages plus the base pages it takes.
    pub full_equivalent_bytes: u64,
    pub pages_from_diff: u64,
    pub pages_from_base: u64,
    /// Pages of anonymous memory stored in neither: they read as zeros.
    pub pages_zero: u64,
}

/// Pages of `[start, end)` covered by `runs` (sorted, disjoint (address, pages)).
fn covered(runs: &[(u64, u64)], start: u64, end: u64) -> u64 {
    let first = runs.partition_point(|&(a, n)| a + n * PAGE_SIZE <= start);
    runs[first..]
        .iter()
        .take_while(|&&(a, _)| a < end)
        .map(|&(a, n)| ((a + n * PAGE_SIZE).min(end) - a.max(start)) / PAGE_SIZE)
        .sum()
}

impl LayerSizes {
    pub fn of(image: &ProcessImage) -> LayerSizes {
        let own = image.pages.stored_pages();
        let from_base = image.base.as_ref().map_or(0, BaseRef::pages);
        let base_bytes = image
            .base
            .as_ref()
            .and_then(|b| Snapshot::open_with(&b.dir, None).ok())
            .map_or(0, |s| s.image.pages.stored_pages() * PAGE_SIZE);
        let own_runs: Vec<(u64, u64)> = image.pages.runs.iter().map(|r| (r.vaddr, r.npages)).collect();
        let base_runs = image.base.as_ref().map_or(&[][..], |b| &b.runs[..]);
        let pages_zero = image
            .vmas
            .iter()
            .filter(|v| matches!(v.kind, crate::image::VmaKind::Anon { .. } | crate::image::VmaKind::FileCopied { .. }))
            .map(|v| (v.end - v.start) / PAGE_SIZE - covered(&own_runs, v.start, v.end) - covered(base_runs, v.start, v.end))
            .sum();
        LayerSizes {
            pages_zero,
            base: image.base.as_ref().map(|b| b.id.clone()),
            diff_bytes: own * PAGE_SIZE,
            base_bytes,
            full_equivalent_bytes: (own + from_base) * PAGE_SIZE,
            pages_from_diff: own,
            pages_from_base: from_base,
        }
    }
}

/// Whether `runtime` can have a base, and if not why.
pub fn supported(runtime: thaw_runtime::Runtime) -> Result<(), LayerError> {
    match runtime {
        thaw_runtime::Runtime::Python3 | thaw_runtime::Runtime::Nodejs20 | thaw_runtime::Runtime::Java17 => Ok(()),
        other => Err(LayerError::Unsupported {
            runtime: other.name().into(),
            why: "its instances are not snapshotted (they cold-boot)",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A diff (the image sample's 3 own pages) over a base of 4 pages: base pages at
    /// 0x3000 (the base's file page 2) and 0x7000-0x9000 (file pages 0-1).
    fn diff(root: &Path) -> (PathBuf, ProcessImage) {
        let (d, b) = (root.join("d"), root.join("b"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(d.join(PAGES_FILE), vec![1u8; 3 * PAGE_SIZE as usize]).unwrap();
        std::fs::write(b.join(PAGES_FILE), vec![2u8; 4 * PAGE_SIZE as usize]).unwrap();
        let mut img = crate::image::tests::sample();
        img.base = Some(BaseRef {
            id: "b".into(),
            dir: b,
            state_crc: 7,
            runs: vec![(0x3000, 1), (0x7000, 2)],
            pieces: vec![PageRun { vaddr: 0x3000, npages: 1, file_page: 2 }, PageRun { vaddr: 0x7000, npages: 2, file_page: 0 }],
            crcs: vec![11, 12, 13],
            stored_pages: 4,
        });
        (d, img)
    }

    fn source(d: &Path, img: &ProcessImage) -> Result<(PageIndex, PageFiles, BaseCheck), LayerError> {
        page_source(d, img, File::open(d.join(PAGES_FILE)).unwrap())
    }

    #[test]
    fn a_diff_places_its_base_pages_from_its_own_state_and_checks_the_base_beside() {
        let tmp = tempfile::tempdir().unwrap();
        let (d, img) = diff(tmp.path());
        let (index, _, check) = source(&d, &img).unwrap();
        // The base's pages are numbered after the diff's 3, each with the CRC the diff carries.
        assert_eq!(index.stored_pages(), 3 + 4);
        assert_eq!((index.lookup(0x3000), index.lookup(0x7000), index.lookup(0x8000)), (Some(5), Some(3), Some(4)));
        assert_eq!((index.crcs[5], index.crcs[3], index.crcs[4]), (11, 12, 13));
        assert_eq!((index.lookup(0x1000), index.lookup(0x4000)), (Some(0), None));
        // The base has no state.bin here: the check beside the restore refuses it.
        let e = check.wait().unwrap_err().to_string();
        assert!(e.contains("cannot be restored over base b") && e.contains("cannot be opened"), "{e}");
    }

    #[test]
    fn pieces_that_are_not_the_runs_or_leave_the_base_and_a_base_of_another_size_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (d, img) = diff(tmp.path());
        let refused = |change: &dyn Fn(&mut BaseRef), want: &str| {
            let mut img = img.clone();
            change(img.base.as_mut().unwrap());
            let e = source(&d, &img).err().expect("refused").to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refused(&|b| b.pieces[1].vaddr = 0x8000, "are not the 3 base pages the diff takes");
        refused(
            &|b| {
                b.crcs.pop();
            },
            "are not the 3 base pages",
        );
        refused(&|b| b.pieces[1].file_page = 3, "is not in the base's 4 pages");
        refused(&|b| b.pieces[0].npages = 0, "is not in the base's 4 pages");
        refused(&|b| b.stored_pages = 5, "another base (its pages.img has 16384 bytes");
        refused(&|b| b.runs[0].0 = 0x5000, "are not the 3 base pages");
        refused(&|b| b.dir = tmp.path().join("gone"), "the base is not at");
        // A base page at an address the diff stores itself.
        refused(
            &|b| {
                b.runs[0].0 = 0x2000;
                b.pieces[0].vaddr = 0x2000;
            },
            "a page is both stored and taken from the base",
        );
    }
}
