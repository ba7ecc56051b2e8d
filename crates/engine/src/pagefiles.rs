//! The files an image's stored pages live in.
//!
//! A full image stores its pages in one file (pages.img). A diff image (see
//! `layers.rs`) stores its own pages in its pages.img and takes the rest from its
//! base's pages.img; the page server sees one numbering of "file pages": the diff's
//! pages first, `0..own_pages`, then the base's, `own_pages..`. Everything that reads
//! pages by file page number (faults, working sets, eager installs, resets) goes
//! through [`PageFiles`] and never learns which file a page came from.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::sys::mem::{self, Mapped};
use crate::sys::PAGE_SIZE;

/// Where stored pages come from when the page files do not hold them yet: a
/// snapshot still arriving from a store (issue #28), whose restore starts before
/// every byte is on disk. The engine calls it before it reads; an implementation
/// writes the bytes into the page files (sparse until then) and returns, or fails,
/// and a failed read kills the instance as any unreadable page does (never a wrong
/// page: what it wrote is checked like every page, CRC and seal). Byte ranges are in
/// the combined numbering of [`PageFiles`] (file page × page size).
pub trait PageFill: Send + Sync {
    /// Return once bytes `offset..offset + len` are in the page files.
    fn ensure(&self, offset: u64, len: u64) -> io::Result<()>;
    /// The bytes are going to be read soon: start fetching, do not wait.
    fn hint(&self, _offset: u64, _len: u64) {}
    /// Copy bytes `offset..offset + buf.len()` into `buf` if the fill holds them in
    /// memory (fetched, checked, not written yet), waiting for a fetch of them in
    /// flight. `Ok(false)`: read them from the files after [`PageFill::ensure`].
    fn copy(&self, _offset: u64, _buf: &mut [u8]) -> io::Result<bool> {
        Ok(false)
    }
    /// Copy the working set's pages (what ws.pages holds for the trace whose layout
    /// is `layout`, see `ws::WorkingSet`) into `buf` if the fill holds them in memory,
    /// waiting for a fetch of them in flight. `Ok(false)`: assemble them from the page
    /// files. The caller checks them against the image as it checks ws.pages.
    fn working_set(&self, _layout: &[(u64, u64)], _buf: &mut [u8]) -> io::Result<bool> {
        Ok(false)
    }
    /// Whether the fill brings the snapshot's ws.lz4 for its working set's trace (a
    /// snapshot from a store, format 5): the restore reads each piece of the working
    /// set from it once [`PageFill::ws_lz4_upto`] says its frames are written.
    fn brings_ws_lz4(&self) -> bool {
        false
    }
    /// Return once bytes `0..end` of ws.lz4 are written (`true`), or will not all be
    /// (`false`): a fill writes ws.lz4 as it arrives, so the restore reads its first
    /// frames while the last are on their way.
    fn ws_lz4_upto(&self, _end: u64) -> bool {
        false
    }
}

/// [`PageFill::ws_lz4_upto`] of a snapshot's fill, for `ws::lz4::Frames` to wait on.
pub type Arrival = Arc<dyn Fn(u64) -> bool + Send + Sync>;

/// One image's page files, numbered one after the other.
pub struct PageFiles {
    own: File,
    /// Pages of `own`; file pages at and past this number are in `base`.
    own_pages: u64,
    base: Option<File>,
    /// Fetches what the files do not hold yet (`None`: they hold everything).
    fill: Option<Arc<dyn PageFill>>,
}

impl From<File> for PageFiles {
    fn from(own: File) -> PageFiles {
        PageFiles { own, own_pages: u64::MAX, base: None, fill: None }
    }
}

impl PageFiles {
    /// A diff's pages (`own_pages` of them in `own`), then its base's.
    pub fn layered(own: File, own_pages: u64, base: File) -> PageFiles {
        PageFiles { own, own_pages, base: Some(base), fill: None }
    }

    /// These files, with `fill` asked for every range before it is read.
    pub fn with_fill(mut self, fill: Option<Arc<dyn PageFill>>) -> PageFiles {
        self.fill = fill;
        self
    }

    /// [`PageFill::working_set`] of the fill, if there is one.
    pub fn fill_working_set(&self, layout: &[(u64, u64)], buf: &mut [u8]) -> io::Result<bool> {
        match &self.fill {
            Some(f) => f.working_set(layout, buf),
            None => Ok(false),
        }
    }

    /// How to wait for ws.lz4's bytes as the fill writes them ([`PageFill::ws_lz4_upto`]),
    /// if it brings ws.lz4.
    pub fn ws_lz4_arrival(&self) -> Option<Arrival> {
        let f = self.fill.clone().filter(|f| f.brings_ws_lz4())?;
        Some(Arc::new(move |end| f.ws_lz4_upto(end)))
    }

    /// Whether the fill brings ws.lz4 ([`PageFill::brings_ws_lz4`]).
    pub fn fill_brings_ws_lz4(&self) -> bool {
        self.fill.as_ref().is_some_and(|f| f.brings_ws_lz4())
    }

    /// Number of the first base page (`u64::MAX` for a single file).
    pub fn own_pages(&self) -> u64 {
        self.own_pages
    }

    /// The file holding `file_page`, and the page's number in it.
    fn locate(&self, file_page: u64) -> (&File, u64) {
        match &self.base {
            Some(b) if file_page >= self.own_pages => (b, file_page - self.own_pages),
            _ => (&self.own, file_page),
        }
    }

    /// Read `buf.len()` bytes at byte `offset` of the combined numbering (a read may
    /// span both files).
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if let Some(f) = &self.fill {
            if f.copy(offset, buf)? {
                return Ok(());
            }
            f.ensure(offset, buf.len() as u64)?;
        }
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let (file, page) = self.locate(at / PAGE_SIZE);
            let in_page = at % PAGE_SIZE;
            // Bytes left in this file before the numbering switches files.
            let left_in_file = match &self.base {
                Some(_) if at / PAGE_SIZE < self.own_pages => (self.own_pages * PAGE_SIZE - at) as usize,
                _ => usize::MAX,
            };
            let n = (buf.len() - done).min(left_in_file);
            file.read_exact_at(&mut buf[done..done + n], page * PAGE_SIZE + in_page)?;
            done += n;
        }
        Ok(())
    }

    /// Start reading `npages` stored pages from `file_page` into the page cache.
    pub fn willneed(&self, file_page: u64, npages: u64) {
        if let Some(f) = &self.fill {
            f.hint(file_page * PAGE_SIZE, npages * PAGE_SIZE);
        }
        let (file, page) = self.locate(file_page);
        mem::fadvise_willneed(file, page * PAGE_SIZE, npages * PAGE_SIZE);
    }

    /// Map every stored page (`total` of them) read-only.
    pub fn map(&self, total: u64) -> io::Result<MappedPages> {
        if let Some(f) = &self.fill {
            f.ensure(0, total * PAGE_SIZE)?;
        }
        let own = total.min(self.own_pages);
        Ok(MappedPages {
            own: Mapped::map(&self.own, (own * PAGE_SIZE) as usize)?,
            own_pages: self.own_pages,
            base: match &self.base {
                Some(b) => Some(Mapped::map(b, ((total - own) * PAGE_SIZE) as usize)?),
                None => None,
            },
        })
    }
}

/// The stored pages mapped into our address space.
pub struct MappedPages {
    own: Mapped,
    own_pages: u64,
    base: Option<Mapped>,
}

impl MappedPages {
    /// `n` consecutive stored pages from `file_page`, all in one file (the runs of a
    /// page index never cross from a diff's pages to its base's).
    pub fn pages(&self, file_page: u64, n: u64) -> &[u8] {
        let len = (n * PAGE_SIZE) as usize;
        match &self.base {
            Some(b) if file_page >= self.own_pages => b.slice(((file_page - self.own_pages) * PAGE_SIZE) as usize, len),
            _ => self.own.slice((file_page * PAGE_SIZE) as usize, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(pages: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for &b in pages {
            f.write_all(&[b; PAGE_SIZE as usize]).unwrap();
        }
        let h = File::open(f.path()).unwrap();
        (f, h)
    }

    #[test]
    fn numbering_continues_into_the_base() {
        let (_a, own) = file_of(&[1, 2]);
        let (_b, base) = file_of(&[7, 8, 9]);
        let files = PageFiles::layered(own, 2, base);
        let p = PAGE_SIZE as usize;
        let mut buf = vec![0u8; 3 * p];
        // A read that starts in the diff's file and ends in the base's.
        files.read_exact_at(&mut buf, PAGE_SIZE).unwrap();
        assert!(buf[..p].iter().all(|&b| b == 2));
        assert!(buf[p..2 * p].iter().all(|&b| b == 7));
        assert!(buf[2 * p..].iter().all(|&b| b == 8));
        let m = files.map(5).unwrap();
        assert!(m.pages(4, 1).iter().all(|&b| b == 9));
        assert!(m.pages(0, 2)[p..].iter().all(|&b| b == 2));
        let mut one = vec![0u8; p];
        assert!(files.read_exact_at(&mut one, 5 * PAGE_SIZE).is_err(), "past the base's end");
    }

    /// A fill that writes the asked bytes (from a hidden copy) into a sparse file.
    struct Hidden {
        hidden: File,
        target: File,
        asked: std::sync::Mutex<Vec<(u64, u64)>>,
        fail: bool,
    }

    impl PageFill for Hidden {
        fn ensure(&self, offset: u64, len: u64) -> io::Result<()> {
            self.asked.lock().unwrap().push((offset, len));
            if self.fail {
                return Err(io::Error::other("the store is down"));
            }
            let mut b = vec![0u8; len as usize];
            self.hidden.read_exact_at(&mut b, offset)?;
            self.target.write_all_at(&b, offset)
        }
    }

    #[test]
    fn a_fill_is_asked_for_every_read_and_its_failure_is_the_reads() {
        let (_h, hidden) = file_of(&[3, 4, 5]);
        let sparse = tempfile::NamedTempFile::new().unwrap();
        sparse.as_file().set_len(3 * PAGE_SIZE).unwrap();
        let fill = Arc::new(Hidden {
            hidden,
            target: std::fs::OpenOptions::new().write(true).open(sparse.path()).unwrap(),
            asked: Default::default(),
            fail: false,
        });
        let files = PageFiles::from(File::open(sparse.path()).unwrap()).with_fill(Some(fill.clone()));
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        files.read_exact_at(&mut buf, 2 * PAGE_SIZE).unwrap();
        assert!(buf.iter().all(|&b| b == 5), "the bytes the fill wrote");
        assert_eq!(*fill.asked.lock().unwrap(), [(2 * PAGE_SIZE, PAGE_SIZE)]);
        assert!(files.map(3).unwrap().pages(0, 1).iter().all(|&b| b == 3), "mapping asks for everything first");
        let down = Arc::new(Hidden { fail: true, asked: Default::default(), ..Hidden::clone_files(&fill) });
        let files = PageFiles::from(File::open(sparse.path()).unwrap()).with_fill(Some(down));
        let e = files.read_exact_at(&mut buf, 0).unwrap_err();
        assert_eq!(e.to_string(), "the store is down");
    }

    impl Hidden {
        fn clone_files(h: &Hidden) -> Hidden {
            Hidden { hidden: h.hidden.try_clone().unwrap(), target: h.target.try_clone().unwrap(), asked: Default::default(), fail: h.fail }
        }
    }
}
