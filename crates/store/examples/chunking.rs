//! How pages.img is best cut into chunks (issue #28): for two versions of one
//! function, each way of cutting (`publish::Chunking`) gives the number of chunks,
//! the manifest's size and parse time, the bytes stored for one version and for
//! both (dedup), and the head's bytes against the pages it must hold.
//!
//!     chunking A.snap B.snap    (bench/chunking.py makes the versions and runs it)
//!
//! Prints one JSON object per way of cutting. Stored bytes are zstd-compressed
//! chunk by chunk at the level a publish uses, as a push stores them.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use thaw_store::manifest::{ChunkHash, Manifest};
use thaw_store::publish::{plan_with, Chunking, Plan};

const ZSTD_LEVEL: i32 = 3;

/// Compressed size of every distinct chunk of `plan` (by hash), at most its raw size.
fn stored(plan: &Plan, sizes: &mut HashMap<ChunkHash, u64>) {
    for u in &plan.uploads {
        if sizes.contains_key(&u.sha256) {
            continue;
        }
        let buf = plan.read(u).expect("reading a chunk");
        let z = zstd::bulk::compress(&buf, ZSTD_LEVEL).map_or(u.len, |z| (z.len() as u64).min(u.len));
        sizes.insert(u.sha256, z);
    }
}

/// The manifest as a publish writes it: every stored chunk placed in a pack.
fn packed(plan: &Plan, sizes: &HashMap<ChunkHash, u64>) -> Manifest {
    let mut m = plan.manifest.clone();
    m.format = thaw_store::manifest::MANIFEST_FORMAT;
    m.packs = vec![thaw_store::manifest::PackRef { name: "0".repeat(64), size: 0 }];
    m.head = Some(0);
    let mut at = 0;
    for c in m.files.iter_mut().flat_map(|f| f.chunks.iter_mut()) {
        if let Some(s) = &c.sha256 {
            let z = sizes[s];
            c.pack = Some(0);
            c.at = Some(at);
            c.zlen = (z < c.len).then_some(z);
            at += z;
        }
    }
    m.packs[0].size = at;
    m
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [a, b] = args.as_slice() else {
        eprintln!("usage: chunking A.snap B.snap");
        std::process::exit(2);
    };
    let ways = [
        ("window-8k", Chunking::Window(8 << 10)),
        ("window-64k", Chunking::Window(64 << 10)),
        ("cdc-8k", Chunking::Cdc { avg: 8 << 10, head_gap: Some(0) }),
        ("cdc-16k", Chunking::Cdc { avg: 16 << 10, head_gap: Some(0) }),
        ("cdc-32k", Chunking::Cdc { avg: 32 << 10, head_gap: Some(0) }),
        ("cdc-64k", Chunking::Cdc { avg: 64 << 10, head_gap: Some(0) }),
        ("cdc-128k", Chunking::Cdc { avg: 128 << 10, head_gap: Some(0) }),
        ("cdc-16k-gap2", Chunking::Cdc { avg: 16 << 10, head_gap: Some(2) }),
        ("cdc-8k-mixed", Chunking::Cdc { avg: 8 << 10, head_gap: None }),
        ("cdc-16k-mixed", Chunking::Cdc { avg: 16 << 10, head_gap: None }),
        ("cdc-64k-mixed", Chunking::Cdc { avg: 64 << 10, head_gap: None }),
    ];
    for (name, way) in ways {
        let t0 = Instant::now();
        let pa = plan_with(Path::new(a), way).expect("plan A");
        let plan_ms = t0.elapsed().as_secs_f64() * 1e3;
        let pb = plan_with(Path::new(b), way).expect("plan B");
        let mut sizes = HashMap::new();
        stored(&pa, &mut sizes);
        let one: u64 = sizes.values().sum();
        stored(&pb, &mut sizes);
        let both: u64 = sizes.values().sum();
        let pages = pa.manifest.file(thaw_engine::image::PAGES_FILE).expect("pages.img");
        let page_chunks = pages.chunks.iter().filter(|c| c.sha256.is_some()).count();
        // The head's pages.img chunks against the pages they are there for.
        let head_shas: HashSet<ChunkHash> = pa.head.iter().map(|&i| pa.uploads[i].sha256).collect();
        let head_chunks: Vec<_> = pages.chunks.iter().filter(|c| c.sha256.is_some_and(|s| head_shas.contains(&s))).collect();
        let head_raw: u64 = head_chunks.iter().map(|c| c.len).sum();
        let head_stored: u64 = head_chunks.iter().map(|c| sizes[&c.sha256.unwrap()]).sum();
        let m = packed(&pa, &sizes);
        let json = m.to_bytes();
        let zjson = zstd::bulk::compress(&json, ZSTD_LEVEL).expect("compress");
        let mut parse = Vec::new();
        for _ in 0..15 {
            let t = Instant::now();
            Manifest::parse("m", &json).expect("parses");
            parse.push(t.elapsed().as_secs_f64() * 1e3);
        }
        parse.sort_by(f64::total_cmp);
        let out = serde_json::json!({
            "chunking": name,
            "page_chunks": page_chunks,
            "manifest_bytes": json.len(),
            "manifest_zstd_bytes": zjson.len(),
            "manifest_parse_ms": parse[parse.len() / 2],
            "stored_one": one,
            "stored_both": both,
            "both_vs_one": both as f64 / one as f64,
            "head_pages_bytes": head_raw,
            "head_pages_stored": head_stored,
            "head_chunks": head_chunks.len(),
            "plan_ms": plan_ms,
        });
        println!("{out}");
    }
}
