//! What a miss pays to parse a large manifest (issue #28): a binary (format 6)
//! manifest shaped like lrserving's (pages.img in 5,246 stored chunks, each in a pack,
//! most compressed), parsed again and again.
//!
//!     cargo run --release -p thaw-store --example manifest_parse [CHUNKS] [RUNS]
//!
//! Prints the median and p90 of `Manifest::parse`, in ms, as JSON. The manifest is
//! built from JSON, so the same program measures builds whose in-memory types differ.

use std::time::Instant;

use thaw_store::manifest::{Manifest, MANIFEST_FORMAT_BINARY};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a whole number"));
    let (chunks, runs) = (args.next().unwrap_or(5246), args.next().unwrap_or(301));
    let hex = |n: usize| format!("{:064x}", n as u128 * 0x9e37_79b9_7f4a_7c15 + 1);
    let mut page_chunks = Vec::with_capacity(chunks);
    let (mut off, mut at) = (0u64, 0u64);
    for i in 0..chunks {
        let len = 16384 + (i % 7) as u64 * 4096;
        let zlen = len / 3;
        page_chunks.push(serde_json::json!({"offset": off, "len": len, "sha256": hex(i), "pack": i % 4, "at": at, "zlen": zlen}));
        (off, at) = (off + len, at + zlen);
    }
    let json = serde_json::json!({
        "format": MANIFEST_FORMAT_BINARY,
        "image_format": thaw_engine::image::FORMAT_VERSION,
        "image_id": 1,
        "packs": (0..4).map(|p| serde_json::json!({"name": hex(1_000_000 + p), "size": at + 1})).collect::<Vec<_>>(),
        "head": 0,
        "files": [
            {"name": "state.bin", "size": 4096, "chunks": [{"offset": 0, "len": 4096, "sha256": hex(2_000_000), "pack": 0, "at": 0}]},
            {"name": "pages.img", "size": off, "chunks": page_chunks},
        ],
        "derived": [],
    });
    let m: Manifest = serde_json::from_value(json).expect("a manifest");
    let bytes = m.to_bytes();
    assert_eq!(Manifest::parse("m", &bytes).expect("it parses"), m);
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(Manifest::parse("m", std::hint::black_box(&bytes)).expect("it parses"));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!("{}", serde_json::json!({"chunks": chunks, "bytes": bytes.len(), "runs": runs, "parse_ms_median": ms[runs / 2], "parse_ms_p90": ms[runs * 9 / 10]}));
}
