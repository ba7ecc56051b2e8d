//! What a miss pays to check a large manifest before its restore starts (issue #28): a
//! binary manifest shaped like lrserving's (pages.img in 5,246 stored chunks, each
//! compressed, packs filled in order), stored as a publish stores it, then checked as a
//! miss checks it (decompressed if it is, hashed against its id, parsed), again and
//! again.
//!
//!     cargo run --release -p thaw-store --example manifest_parse [FORMAT] [CHUNKS] [RUNS]
//!
//! FORMAT is 6 (fixed records) or 7 (compact tables, the default). Prints the stored
//! size and the median and p90 of the check and of `Manifest::parse` alone, in ms, as
//! JSON. The manifest is built from JSON, so the same program measures builds whose
//! in-memory types differ.

use std::time::Instant;

use thaw_store::manifest::{Manifest, MANIFEST_FORMAT_COMPACT};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a whole number"));
    let format = args.next().unwrap_or(MANIFEST_FORMAT_COMPACT as usize);
    let (chunks, runs) = (args.next().unwrap_or(5246), args.next().unwrap_or(301));
    // Hashes as random as real ones (zstd cannot shrink them).
    let hex = |n: usize| thaw_store::remote::sha256_hex(&n.to_le_bytes());
    let (packs, mut ends) = (4usize, [0u64; 4]);
    let mut page_chunks = Vec::with_capacity(chunks);
    let mut off = 0u64;
    for i in 0..chunks {
        let len = 16384 + (i % 7) as u64 * 4096;
        let (zlen, pack) = (len / 3, i * packs / chunks);
        page_chunks.push(serde_json::json!({"offset": off, "len": len, "sha256": hex(i), "pack": pack, "at": ends[pack], "zlen": zlen}));
        (off, ends[pack]) = (off + len, ends[pack] + zlen);
    }
    let json = serde_json::json!({
        "format": format,
        "image_format": thaw_engine::image::FORMAT_VERSION,
        "image_id": 1,
        "packs": (0..packs).map(|p| serde_json::json!({"name": hex(1_000_000 + p), "size": ends[p] + 4096})).collect::<Vec<_>>(),
        "head": 0,
        "files": [
            {"name": "state.bin", "size": 4096, "chunks": [{"offset": 0, "len": 4096, "sha256": hex(2_000_000), "pack": 0, "at": ends[0]}]},
            {"name": "pages.img", "size": off, "chunks": page_chunks},
        ],
        "derived": [],
    });
    let m: Manifest = serde_json::from_value(json).expect("a manifest");
    let bytes = m.to_bytes();
    let id = thaw_store::remote::sha256_hex(&bytes);
    let stored = thaw_store::pack::stored_manifest(&m, bytes.clone());
    assert_eq!(thaw_store::fetch::verify_manifest("m", stored.clone(), &id).expect("it checks"), m);
    let median_p90 = |f: &dyn Fn()| {
        let mut ms: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        (ms[runs / 2], ms[runs * 9 / 10])
    };
    let check = median_p90(&|| {
        std::hint::black_box(thaw_store::fetch::verify_manifest("m", std::hint::black_box(stored.clone()), &id).expect("it checks"));
    });
    let parse = median_p90(&|| {
        std::hint::black_box(Manifest::parse("m", std::hint::black_box(&bytes)).expect("it parses"));
    });
    println!(
        "{}",
        serde_json::json!({"format": format, "chunks": chunks, "bytes": bytes.len(), "stored": stored.len(), "runs": runs,
            "check_ms_median": check.0, "check_ms_p90": check.1, "parse_ms_median": parse.0, "parse_ms_p90": parse.1})
    );
}
