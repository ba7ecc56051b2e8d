//! The working-set loader (`ws::WorkingSet::load`): ws.trace as given, and with its
//! checksum fixed up (so the entry decoding is reached), next to a ws.pages file of
//! the size the input's last 2 bytes choose; a trace that loads is then read in pieces
//! (`open_pages`, `read_into`, `Arriving`) against an image of 64 zero pages: every
//! piece settles, each one handed over holds checked zeros, and the read succeeds
//! exactly when every stored page of the trace is one of the image's; and the same
//! again beside a ws.lz4 for that trace with bytes the input chooses damaged (header,
//! table or frames): it never changes the outcome (a frame that does not decompress
//! or check is read from ws.pages). Its frames are LZ4 or, when the input's first byte
//! is odd, zstd (a snapshot store's, `lz4::recompress_zstd`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use thaw_engine::image::PageIndex;
use thaw_engine::ws::{lz4, WorkingSet, LZ4_FILE, PAGES_FILE, TRACE_FILE};

/// Pages of the image the pieces are checked against (all zeros).
const IMAGE_PAGES: u64 = 64;

/// ws.lz4 of `len` bytes of zero pages, for the trace whose crc is `crc`.
fn lz4_of_zero_pages(len: u64, crc: u32) -> Option<Vec<u8>> {
    let mut w = lz4::Writer::default();
    for _ in 0..len / 4096 {
        w.page(&[0u8; 4096]);
    }
    w.finish(crc, None)
}

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
    let pages_len = match data {
        [.., a, b] => u16::from_le_bytes([*a, *b]) as u64 * 4096,
        _ => 0,
    };
    let pages = std::fs::File::create(dir.path().join(PAGES_FILE)).expect("ws.pages");
    pages.set_len(pages_len).expect("sizing ws.pages");
    let id = |d: &[u8]| if d.len() >= 16 { u32::from_le_bytes(d[12..16].try_into().unwrap()) } else { 0 };
    std::fs::write(dir.path().join(TRACE_FILE), data).expect("ws.trace");
    let _ = WorkingSet::load(dir.path(), id(data));
    if data.len() >= 28 {
        let mut fixed = data.to_vec();
        let end = fixed.len() - 4;
        let crc = crc32fast::hash(&fixed[..end]);
        fixed[end..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(dir.path().join(TRACE_FILE), &fixed).expect("ws.trace");
        if let Ok(ws) = WorkingSet::load(dir.path(), id(&fixed)) {
            assert_eq!(ws.pages_bytes(), pages_len);
            if pages_len <= 4 << 20 {
                let mut index = PageIndex::default();
                let zero = crc32fast::hash(&[0u8; 4096]);
                for p in 0..IMAGE_PAGES {
                    index.push(0x1000_0000 + p * 4096, zero);
                }
                let known = ws.layout.iter().all(|&(_, fp)| fp < IMAGE_PAGES);
                // Without ws.lz4, then with one made for this trace and damaged where the
                // input says: whatever its frames hold, the outcome is the same.
                for damaged in [false, true] {
                    if damaged {
                        let frames = lz4_of_zero_pages(pages_len, ws.trace_crc)
                            .map(|z| if data[0] & 1 == 1 { lz4::recompress_zstd(&z, None).expect("frames just made").unwrap_or(z) } else { z });
                        if let Some(mut z) = frames {
                            for p in data.chunks_exact(3).take(8) {
                                let at = u16::from_le_bytes([p[0], p[1]]) as usize % z.len();
                                z[at] ^= p[2] | 1;
                            }
                            std::fs::write(dir.path().join(LZ4_FILE), &z).expect("ws.lz4");
                        }
                    }
                    let f = ws.open_pages(dir.path(), true).expect("ws.pages has the trace's size");
                    let into = f.arriving(pages_len as usize);
                    let read = ws.read_into(dir.path(), &index, &f, &into, &|_, _| Ok(()), None);
                    assert_eq!(read.is_ok(), known, "{read:?}");
                    for k in 0..into.pieces() {
                        match into.wait(k) {
                            Ok(bytes) => assert!(bytes.iter().all(|&b| b == 0) && bytes.len() == into.piece_len(k)),
                            Err(_) => assert!(!known),
                        }
                    }
                }
            }
        }
    }
});
