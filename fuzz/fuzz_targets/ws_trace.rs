//! The working-set loader (`ws::WorkingSet::load`): ws.trace as given, and with its
//! checksum fixed up (so the entry decoding is reached), next to a ws.pages file of
//! the size the input's last 2 bytes choose.
#![no_main]
use libfuzzer_sys::fuzz_target;
use thaw_engine::ws::{WorkingSet, PAGES_FILE, TRACE_FILE};

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
        }
    }
});
