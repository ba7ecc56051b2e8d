//! The snapshot state parser (`image::decode_state`): once on the raw input (framing,
//! magic, version, length, checksum) and once with the input as the payload of a
//! correctly framed state, so the fuzzer reaches the bincode decoding behind the CRC;
//! then what decodes is re-encoded, and its descriptors' payloads sealed and opened.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const MAGIC: &[u8; 8] = b"THAWIMG\0";

fuzz_target!(|data: &[u8]| {
    let dir = Path::new("/nonexistent");
    let _ = thaw_engine::image::decode_state(dir, data);
    // A real state.bin in the corpus: its payload, framed as this build's version (so
    // seeds of an older format still reach the decoding; the raw input above
    // exercises the version check).
    let version = thaw_engine::image::FORMAT_VERSION.to_le_bytes();
    let payload = if data.len() >= 20 && &data[..8] == MAGIC { &data[20..data.len().saturating_sub(4).max(20)] } else { data };
    let mut framed = Vec::with_capacity(payload.len() + 24);
    framed.extend_from_slice(MAGIC);
    framed.extend_from_slice(&version);
    framed.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    framed.extend_from_slice(payload);
    let crc = crc32fast::hash(&framed);
    framed.extend_from_slice(&crc.to_le_bytes());
    if let Ok(img) = thaw_engine::image::decode_state(dir, &framed) {
        // Whatever decodes must encode again and decode to the same bytes.
        let again = thaw_engine::image::encode_state(&img);
        let img2 = thaw_engine::image::decode_state(dir, &again).expect("re-encoded state decodes");
        assert_eq!(thaw_engine::image::encode_state(&img2), again);
        // Its descriptors' payloads sealed as a sealed image's are (format 24), then
        // opened: the same image again, and a payload opened at another number fails.
        let s = thaw_engine::seal::Sealer::new(key()).expect("a sealer");
        let mut sealed = img.clone();
        let mut n = 0;
        sealed.fd_payloads_mut(&mut |d| {
            s.seal_fd_data(n, d);
            n += 1;
        });
        let mut wrong = sealed.clone();
        let mut opened = 0;
        sealed.fd_payloads_mut(&mut |d| {
            assert!(s.open_fd_data(opened, d), "payload {opened} opens");
            opened += 1;
        });
        assert_eq!((opened, &sealed), (n, &img));
        let mut m = 0;
        wrong.fd_payloads_mut(&mut |d| {
            assert!(!s.open_fd_data(m + 1, d), "payload {m} opens only at its own number");
            m += 1;
        });
    }
});

/// One node key for every input (a fresh salt per image, as captures draw).
fn key() -> &'static thaw_engine::seal::NodeKey {
    static KEY: std::sync::OnceLock<thaw_engine::seal::NodeKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| thaw_engine::seal::NodeKey::from_hex(&"42".repeat(32), "the fuzz key").expect("64 hex digits"))
}
