//! The disk's large-read bandwidth: O_DIRECT sequential reads of a file made once.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use thaw_engine::ws::AlignedBuf;

pub const BLOCK: usize = 16 << 20;

/// Write `size` bytes of incompressible data to `path` and flush it to disk.
pub fn make_file(path: &Path, size: usize) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; BLOCK];
    let mut left = size;
    while left > 0 {
        for c in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(BLOCK);
        f.write_all(&block[..n])?;
        left -= n;
    }
    f.sync_all()?;
    Ok(())
}

/// Drop a file from the page cache (dirty pages are written back first).
pub fn evict(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let _ = f.sync_all();
    thaw_engine::sys::mem::fadvise_dontneed(&f);
    Ok(())
}

/// One pass of O_DIRECT sequential reads with `BLOCK`-sized requests; MiB/s.
pub fn read_bandwidth(path: &Path) -> Result<f64> {
    evict(path)?;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))?;
    let mut buf = AlignedBuf::new(BLOCK);
    let t0 = Instant::now();
    let mut off = 0u64;
    loop {
        let n = f.read_at(buf.as_mut(), off).context("O_DIRECT read")?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(off as f64 / (1 << 20) as f64 / secs)
}
