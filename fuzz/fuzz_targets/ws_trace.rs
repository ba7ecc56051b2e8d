//! The working-set loader (`ws::WorkingSet::load`): ws.trace as given, and with its
//! checksum fixed up (so the entry decoding is reached), next to a ws.pages file of
//! the size the input's last 2 bytes choose; a trace that loads is then read in pieces
//! (`open_pages`, `read_into`, `Arriving`) against an image of 64 zero pages: every
//! piece settles, each one handed over holds checked zeros, and the read succeeds
//! exactly when every stored page of the trace is one of the image's.
#![no_main]
use libfuzzer_sys::fuzz_target;
use thaw_engine::image::PageIndex;
use thaw_engine::ws::{Arriving, WorkingSet, PAGES_FILE, TRACE_FILE};

/// Pages of the image the pieces are checked against (all zeros).
const IMAGE_PAGES: u64 = 64;

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
                let into = Arriving::new(pages_len as usize);
                let f = ws.open_pages(dir.path(), true).expect("ws.pages has the trace's size");
                let read = ws.read_into(dir.path(), &index, &f, &into, &|_, _| Ok(()));
                let known = ws.layout.iter().all(|&(_, fp)| fp < IMAGE_PAGES);
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
});
