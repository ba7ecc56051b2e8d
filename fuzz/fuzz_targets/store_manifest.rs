//! The snapshot store's manifest (`thaw_store::Manifest::parse`): the bytes as read
//! from a store (an untrusted object until its hash is checked, and a tampered store
//! can serve anything under a name it also controls the hash of).
#![no_main]
use libfuzzer_sys::fuzz_target;
use thaw_store::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::parse("s3://fuzz/snapshots/x.json", data) {
        // What parse accepted is self-consistent: it serializes back to a manifest that
        // parses to the same thing, every stored chunk lies inside its pack, and the
        // content digest ignores the packing and the compression.
        let again = Manifest::parse("again", &m.to_bytes()).expect("a parsed manifest re-parses");
        assert_eq!(again, m);
        for c in m.files.iter().flat_map(|f| &f.chunks) {
            if let (Some(p), Some(at)) = (c.pack, c.at) {
                assert!(at + c.stored_len() <= m.packs[p as usize].size);
            }
        }
        let mut unpacked = m.clone();
        unpacked.packs.clear();
        unpacked.head = None;
        for c in unpacked.files.iter_mut().flat_map(|f| &mut f.chunks) {
            (c.pack, c.at, c.zlen) = (None, None, None);
        }
        assert_eq!(unpacked.content_digest(), m.content_digest());
        let _ = (m.unique_chunks(), m.total_bytes());
    }
});
