//! `thaw snapshot push | pull | gc` against a real MinIO started by the test:
//! a pulled snapshot restores and answers like the original, and so does a restore
//! straight from the store that starts after the working set (the head) arrived and
//! fetches the rest as it faults; a second version
//! of a function stores only the chunks that differ; corruption and a store
//! that is down are clear errors that leave nothing behind.

mod common;
mod s3;

use std::process::{Command, Output};

use common::*;
use s3::minio::{self, Minio};
use s3::{last_line, thaw_s3};

fn report(o: &Output) -> serde_json::Value {
    let out = stdout(o);
    let lines: Vec<&str> = out.lines().collect();
    serde_json::from_str(lines[lines.len() - 2]).unwrap()
}

#[test]
fn push_pull_restore_round_trip() {
    let m = Minio::start();
    let snap = scratch().join("rt.snap");
    let code = sample("helloworld");
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let payload = r#"{"name":"store"}"#;
    // The first restore records the working set, which is pushed with the snapshot.
    let original = stdout(&ok(thaw(&["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--quiet"])));
    assert!(snap.join("ws.trace").is_file());

    let o = ok(thaw_s3(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://rt-bucket/fns/hello", "--create-bucket"]));
    let url = last_line(&o);
    assert!(url.starts_with("s3://rt-bucket/fns/hello/") && url.len() == "s3://rt-bucket/fns/hello/".len() + 64, "{url}");
    let r = report(&o);
    assert!(r["bytes_uploaded"].as_u64().unwrap() > 1 << 20, "{r}");

    let pulled = scratch().join("rt-pulled");
    let o = ok(thaw_s3(&m, &["snapshot", "pull", &url, pulled.to_str().unwrap()]));
    let p: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    // Everything pushed but the head's copy (a miss's shortcut) is pulled.
    assert!(r["head_copy_bytes"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(p["bytes_fetched"].as_u64().unwrap(), r["bytes_uploaded"].as_u64().unwrap() - r["head_copy_bytes"].as_u64().unwrap());
    let stats = scratch().join("rt-stats.json");
    let restored = stdout(&ok(thaw(&[
        "snapshot", "restore", pulled.to_str().unwrap(), "--payload", payload, "--quiet", "--stats", stats.to_str().unwrap(),
    ])));
    assert_eq!(restored, original);
    assert_eq!(restored.trim(), r#"{"message": "hello, store"}"#);
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(st["mode"], "prefetch", "the pulled working set (ws.pages rebuilt from pages.img) is used: {st}");

    // Restore straight from the store: the first fetches into the node cache (working
    // set first: the manifest and the head, then faults), the second hits it. The
    // third and fourth do the same fetching everything first (THAW_STORE_FETCH=whole).
    let snapshot_bytes = r["snapshot_bytes"].as_u64().unwrap();
    let id = url.rsplit('/').next().unwrap();
    // Format 7 (binary, compact tables): ws.pages is stored (in the head), not derived
    // (a clear image's default). `thaw snapshot inspect` shows the manifest as JSON.
    let manifest = s3::store(&m, "s3://rt-bucket/fns/hello").manifest(id).unwrap();
    assert_eq!((manifest.format, manifest.derived.len()), (7, 0), "{:?}", manifest.derived);
    let shown = stdout(&ok(s3::thaw_s3(&m, &["snapshot", "inspect", &url])));
    let shown: thaw_store::Manifest = serde_json::from_str(&shown).expect("inspect prints the manifest as JSON");
    assert_eq!(shown, manifest);
    // What an earlier build stored (format 6, THAW_STORE_MANIFEST=6) is read too: the
    // same snapshot under another id, restored from the store with the same answer.
    let o6 = ok(s3::thaw_s3_env(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://rt-bucket/fns/hello6"], &[("THAW_STORE_MANIFEST", "6")]));
    let url6 = last_line(&o6);
    let m6 = s3::store(&m, "s3://rt-bucket/fns/hello6").manifest(url6.rsplit('/').next().unwrap()).unwrap();
    assert_eq!(m6.format, 6);
    assert_eq!((&m6.files, &m6.derived), (&manifest.files, &manifest.derived), "the same snapshot, the same chunks");
    assert_eq!(stdout(&ok(thaw_s3(&m, &["snapshot", "restore", &url6, "--payload", payload, "--quiet"]))), original);
    assert!(manifest.file("ws.pages").is_some_and(|f| f.size == std::fs::metadata(snap.join("ws.pages")).unwrap().len()));
    let mut fetched_by = [0u64; 5];
    for (i, hit, whole) in [(1, false, false), (2, true, false), (3, false, true), (4, true, true)] {
        if i == 3 {
            std::fs::remove_dir_all(scratch().join("data/snapshot-cache/entries").join(id)).unwrap();
        }
        let stats = scratch().join(format!("rt-s3-stats-{i}.json"));
        let args = ["snapshot", "restore", &url, "--payload", payload, "--quiet", "--stats", stats.to_str().unwrap()];
        let o = if whole { ok(s3::thaw_s3_env(&m, &args, &[("THAW_STORE_FETCH", "whole")])) } else { ok(thaw_s3(&m, &args)) };
        assert_eq!(stdout(&o), original);
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        let s = &st["store"];
        assert_eq!(s["cache_hit"], hit, "{st}");
        // A hit restores from what the miss cached: its ws.pages (written once the fetch
        // completed) matches the image, or the restore would have fallen back to record.
        assert_eq!(st["mode"], "prefetch", "{st}");
        assert_eq!(s["cached"], true, "{st}");
        let fetched = s["bytes_fetched"].as_u64().unwrap();
        assert!(if hit { fetched == 0 } else { fetched > 1 << 20 }, "{st}");
        fetched_by[i] = fetched;
        if !hit {
            let (reqs, first) = (s["requests_before_first_response"].as_u64().unwrap(), s["bytes_fetched_before_first_response"].as_u64().unwrap());
            assert!(reqs <= 4, "{reqs} requests before the first response: {s}");
            if !whole {
                // Two, at once: the head's copy under the snapshot's id, which starts
                // with the manifest, and its second part (the head's pages).
                assert_eq!(reqs, 2, "{s}");
            }
            assert_eq!(s["lazy"], !whole, "{s}");
            // By default the sandbox is made after the fetch (see THAW_STORE_EARLY_SANDBOX).
            assert_eq!(s["sandbox_during_fetch"], false, "{s}");
            if whole {
                assert_eq!(first, fetched, "everything before the start: {s}");
            } else {
                assert!(first < fetched && first < snapshot_bytes / 2, "the instance started before the image was here: {s}");
                assert_eq!(st["mode"], "prefetch", "the working set came with the head: {st}");
            }
        }
        eprintln!("restore from the store #{i}: {s}");
    }
    // The miss from the head built pages.img's chunks of working-set pages from the
    // stored ws.pages instead of fetching them (packed last): it read less than the
    // whole fetch, which reads every pack.
    assert!(fetched_by[1] < fetched_by[3], "lazy {} vs whole {} bytes", fetched_by[1], fetched_by[3]);
    // The head's copy is only a shortcut. Its pack corrupt (the first byte of
    // state.bin flipped): the manifest it starts with checks and is used, the head is
    // read from its pack (two requests more). Its manifest corrupt: the manifest is
    // read apart, the head from its pack (three more). Missing: the manifest, then the
    // head from its pack (the copy's 404 is not counted). Its second part missing:
    // state.bin and ws.trace from the first, the pages from the pack. Each answers the
    // same; a corrupt part of a copy is never used.
    let store = s3::store(&m, "s3://rt-bucket/fns/hello");
    let head_key = thaw_store::Remote::head_key(id);
    let rest_key = thaw_store::Remote::head_rest_key(id);
    let copy = store.block_on(store.remote.get(&head_key)).unwrap();
    let rest = store.block_on(store.remote.get(&rest_key)).unwrap();
    let header = thaw_store::fetch::HEAD_MAGIC.len() + 4;
    let manifest_len = u32::from_le_bytes(copy[header - 4..header].try_into().unwrap()) as usize;
    let flipped = |at: usize| {
        let mut c = copy.to_vec();
        c[at] ^= 1;
        Some(c)
    };
    // Longer than the head (a store that keeps sending): not read past the head's
    // size into memory (requests vary with where the read stops).
    let longer = Some([&copy[..], &vec![0u8; 4 << 20]].concat());
    let cases = [
        ("corrupt pack", flipped(header + manifest_len), Some(4), "the head's copy does not check"),
        ("corrupt manifest", flipped(header + manifest_len / 2), Some(5), "the manifest in the head's copy does not check"),
        ("missing", None, Some(3), ""),
        ("second part missing", Some(copy.to_vec()), None, "is missing: its head copy is split"),
        // Refused while it streams (over the head's size once the manifest set the
        // limit) or, when it all arrived before that, by its size once here.
        ("longer", longer, None, "holds more than the head's|the head's copy does not check"),
    ];
    for (what, put, requests, warning) in cases {
        match put {
            Some(b) => store.block_on(store.remote.put(&head_key, b.into())).unwrap(),
            None => store.block_on(store.remote.delete(&head_key)).unwrap(),
        }
        if what == "second part missing" {
            store.block_on(store.remote.delete(&rest_key)).unwrap();
        }
        std::fs::remove_dir_all(scratch().join("data/snapshot-cache/entries").join(id)).unwrap();
        let stats = scratch().join(format!("rt-s3-stats-{}-copy.json", what.replace(' ', "-")));
        let o = ok(thaw_s3(&m, &["snapshot", "restore", &url, "--payload", payload, "--quiet", "--stats", stats.to_str().unwrap()]));
        assert_eq!(stdout(&o), original, "head copy {what}");
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert_eq!(st["mode"], "prefetch", "head copy {what}: {st}");
        if let Some(n) = requests {
            assert_eq!(st["store"]["requests_before_first_response"], n, "head copy {what}: {st}");
        }
        assert!(warning.split('|').any(|w| stderr(&o).contains(w)), "head copy {what}: {}", stderr(&o));
    }
    store.block_on(store.remote.put(&head_key, copy)).unwrap();
    store.block_on(store.remote.put(&rest_key, rest)).unwrap();
    // THAW_STORE_EARLY_SANDBOX=1: the manifest names the sandbox; it is prepared while
    // the rest arrives, and used.
    std::fs::remove_dir_all(scratch().join("data/snapshot-cache/entries").join(id)).unwrap();
    let stats = scratch().join("rt-s3-stats-early.json");
    let args = ["snapshot", "restore", &url, "--payload", payload, "--quiet", "--stats", stats.to_str().unwrap()];
    let o = ok(s3::thaw_s3_env(&m, &args, &[("THAW_STORE_EARLY_SANDBOX", "1")]));
    assert_eq!(stdout(&o), original);
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!((&st["store"]["sandbox_during_fetch"], &st["prepared_sandbox"]), (&serde_json::Value::Bool(true), &serde_json::Value::Bool(true)), "{st}");
    let left: Vec<_> = std::fs::read_dir(scratch().join("data/snapshot-cache/lazy")).unwrap().flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(id)).collect();
    assert!(left.is_empty(), "nothing is left of the lazy fetches: {left:?}");

    // Pulling onto an existing directory is refused and changes nothing.
    let o = thaw_s3(&m, &["snapshot", "pull", &url, pulled.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    let o = thaw_s3(&m, &["snapshot", "pull", "s3://rt-bucket/fns/hello/xyz", "/tmp/never"]);
    assert!(stderr(&o).contains("the last segment must be a snapshot id"), "{}", stderr(&o));
    // Removed: no longer pullable, and its head's copy went with it.
    ok(thaw_s3(&m, &["snapshot", "rm", &url]));
    assert!(store.block_on(store.remote.head(&head_key)).unwrap().is_none(), "snapshot rm leaves {head_key}");
    let o = thaw_s3(&m, &["snapshot", "pull", &url, scratch().join("rt-removed").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not found in the store"), "{}", stderr(&o));
}

/// A sealed snapshot (a node's default) stores its working set as its ws.lz4 (version
/// 2: pages decrypted, compressed, each frame sealed) instead of ws.pages, whose
/// ciphertext does not compress (format 5); a clear one does so when asked
/// (`THAW_STORE_CLEAR_WS=lz4`). A miss writes its frames as they arrive, each piece
/// checked by its hash, and the restore installs them as they come: it fetches a
/// third of the bytes before its first response, restores from ws.lz4 (with the key,
/// sealed), and the cache and a pull rebuild ws.pages (without it).
#[test]
fn a_sealed_snapshot_stores_its_working_set_compressed_and_restores_from_it() {
    ws_lz4_in_the_store(true);
}

#[test]
fn a_clear_snapshot_stores_its_working_set_compressed_and_restores_from_it() {
    ws_lz4_in_the_store(false);
}

fn ws_lz4_in_the_store(sealed: bool) {
    let m = Minio::start();
    let name = if sealed { "sealed" } else { "clear" };
    let key = scratch().join(format!("{name}-store.key"));
    // `thaw` with the key when sealed (without, a CLI seals nothing).
    let with: Vec<String> = if sealed { vec!["--key-file".into(), key.to_str().unwrap().into()] } else { vec![] };
    let args = |rest: &[&str]| -> Vec<String> { with.iter().cloned().chain(rest.iter().map(|a| a.to_string())).collect() };
    let run = |rest: &[&str]| ok(thaw(&args(rest).iter().map(String::as_str).collect::<Vec<_>>()));
    // Sealed: restores that read ws.lz4 whatever its size (as for a working set of
    // ws::LZ4_READ_FROM or more), so the CLI rewrites the store's frames once it arrived;
    // a smaller one keeps them (sealing.rs).
    let env: &[(&str, &str)] = if sealed { &[("THAW_WS_LZ4", "1")] } else { &[("THAW_STORE_CLEAR_WS", "lz4")] };
    let run_s3 = |rest: &[&str]| ok(s3::thaw_s3_env(&m, &args(rest).iter().map(String::as_str).collect::<Vec<_>>(), env));
    let snap = scratch().join(format!("{name}-store.snap"));
    let code = sample("helloworld");
    run(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]);
    let payload = &format!(r#"{{"name":"{name}"}}"#);
    let original = stdout(&run(&["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--quiet"]));
    assert_eq!(original.trim(), format!(r#"{{"message": "hello, {name}"}}"#));
    let z = std::fs::read(snap.join("ws.lz4")).expect("the recording wrote ws.lz4");
    assert_eq!(u32::from_le_bytes(z[8..12].try_into().unwrap()), if sealed { 2 } else { 1 }, "sealed frames, or clear");
    let ws_pages = std::fs::metadata(snap.join("ws.pages")).unwrap().len();

    let bucket = format!("s3://{name}-bucket/fns/hello");
    let o = run_s3(&["snapshot", "push", snap.to_str().unwrap(), &bucket, "--create-bucket"]);
    let url = last_line(&o);
    let id = url.rsplit('/').next().unwrap().to_string();
    let manifest = s3::store(&m, &bucket).manifest(&id).unwrap();
    assert_eq!(manifest.format, 7, "binary, ws.lz4 stored");
    // The node's LZ4 frames recompressed with zstd for the store (version 3 clear, 4
    // sealed: sealed again with the key the CLI holds): fewer bytes.
    let stored_lz4 = manifest.file("ws.lz4").map(|f| f.size).unwrap();
    assert!(stored_lz4 < z.len() as u64, "zstd frames ({stored_lz4} bytes) are smaller than LZ4's ({})", z.len());
    assert!(manifest.file("ws.pages").is_none() && manifest.derived == ["ws.pages"], "{:?}", manifest.derived);
    let head = &manifest.packs[manifest.head.unwrap() as usize];
    assert!(head.size < ws_pages / 2, "the head ({} bytes) is smaller than the sealed ws.pages ({ws_pages})", head.size);

    // A miss: the head (with ws.lz4), then the restore from it (with the key).
    let stats = scratch().join(format!("{name}-store-miss.json"));
    let restore = |stats: &std::path::Path| run_s3(&["snapshot", "restore", &url, "--payload", payload, "--quiet", "--stats", stats.to_str().unwrap()]);
    assert_eq!(stdout(&restore(&stats)), original);
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let s = &st["store"];
    assert_eq!((s["cache_hit"].as_bool(), s["lazy"].as_bool()), (Some(false), Some(true)), "{st}");
    assert_eq!(st["mode"], "prefetch", "the working set came in the head: {st}");
    assert_eq!(st["prefetch"]["partial"], false, "every page of it installed: {st}");
    assert!(st["prefetch"]["disk_bytes"].as_u64().unwrap() < ws_pages / 2, "read from ws.lz4: {st}");
    let first = s["bytes_fetched_before_first_response"].as_u64().unwrap();
    assert!(first < ws_pages / 2, "{first} bytes before the first response: {s}");

    // The cache rebuilt ws.pages and ws.lz4 holds LZ4 frames again (decoded faster from
    // a local disk): clear, written with ws.pages; sealed, written by the CLI with the
    // key it holds (the store's zstd frames are sealed too, only a key holder can
    // replace them). A hit restores from it.
    let entry = scratch().join("data/snapshot-cache/entries").join(&id);
    assert_eq!(std::fs::metadata(entry.join("ws.pages")).unwrap().len(), ws_pages);
    let entry_lz4 = std::fs::read(entry.join("ws.lz4")).unwrap();
    if sealed {
        assert_eq!(u32::from_le_bytes(entry_lz4[8..12].try_into().unwrap()), 2, "sealed LZ4 frames");
        assert_ne!(entry_lz4.len() as u64, stored_lz4, "not the stored zstd frames");
    } else {
        assert_eq!(entry_lz4, z, "the node's LZ4 frames");
    }
    let stats = scratch().join(format!("{name}-store-hit.json"));
    assert_eq!(stdout(&restore(&stats)), original);
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!((st["store"]["cache_hit"].as_bool(), st["mode"].as_str()), (Some(true), Some("prefetch")), "{st}");

    // The head's copy corrupt in ws.lz4's bytes: not used, the head is read from its
    // pack. Then the pack's ws.lz4 corrupt too (and no copy): state.bin still checks,
    // ws.lz4 never arrives, and the restore reads the working set out of the image
    // (pages.img's chunks, fetched from their packs): the same answer.
    let store = s3::store(&m, &bucket);
    let lz4_chunk = manifest.file("ws.lz4").unwrap().chunks[0].clone();
    assert_eq!(lz4_chunk.pack, manifest.head, "ws.lz4 is in the head");
    // ws.lz4 is in the split copy's second part (the pack from where state.bin and
    // ws.trace end).
    let (copy_key, rest_key) = (thaw_store::Remote::head_key(&id), thaw_store::Remote::head_rest_key(&id));
    let copy = store.block_on(store.remote.get(&copy_key)).unwrap();
    let rest = store.block_on(store.remote.get(&rest_key)).unwrap();
    let in_rest = (lz4_chunk.at.unwrap() - manifest.head_first_end().expect("a split copy")) as usize + 100;
    let mut bad = rest.to_vec();
    bad[in_rest] ^= 1;
    store.block_on(store.remote.put(&rest_key, bad.into())).unwrap();
    let pack_key = format!("packs/{}", head.name);
    let pack = store.block_on(store.remote.get(&pack_key)).unwrap();
    for case in ["copy", "copy and pack"] {
        if case == "copy and pack" {
            store.block_on(store.remote.delete(&copy_key)).unwrap();
            let mut bad = pack.to_vec();
            bad[lz4_chunk.at.unwrap() as usize + 100] ^= 1;
            store.block_on(store.remote.put(&pack_key, bad.into())).unwrap();
        }
        std::fs::remove_dir_all(&entry).unwrap();
        let stats = scratch().join(format!("{name}-store-bad.json"));
        let o = restore(&stats);
        assert_eq!(stdout(&o), original, "corrupt {case}");
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        // Either way the whole working set is installed before the process resumes:
        // out of the pack, or (the pack corrupt too) out of pages.img's chunks.
        assert_eq!((st["mode"].as_str(), st["prefetch"]["partial"].as_bool()), (Some("prefetch"), Some(false)), "corrupt {case}: {st}");
        if case == "copy and pack" {
            assert!(stderr(&o).contains("ws.lz4 did not arrive"), "corrupt {case}: {}", stderr(&o));
            assert!(!stderr(&o).contains("ignoring the working set"), "the working set is kept: {}", stderr(&o));
        }
    }
    store.block_on(store.remote.put(&pack_key, pack)).unwrap();
    store.block_on(store.remote.put(&copy_key, copy)).unwrap();
    store.block_on(store.remote.put(&rest_key, rest)).unwrap();
    std::fs::remove_dir_all(&entry).unwrap();

    // A pull derives ws.pages too; the pulled copy restores with the key.
    let pulled = scratch().join(format!("{name}-store-pulled"));
    run_s3(&["snapshot", "pull", &url, pulled.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(pulled.join("ws.pages")).unwrap().len(), ws_pages);
    let pulled_lz4 = std::fs::read(pulled.join("ws.lz4")).unwrap();
    assert_eq!(pulled_lz4[8..12], entry_lz4[8..12], "LZ4 frames, as in the cache");
    if !sealed {
        assert_eq!(pulled_lz4, entry_lz4);
    }
    let restored = stdout(&run(&["snapshot", "restore", pulled.to_str().unwrap(), "--payload", payload, "--quiet"]));
    assert_eq!(restored, original);
}

#[test]
fn a_second_version_stores_only_what_changed() {
    let m = Minio::start();
    let handler = std::fs::read_to_string(sample("helloworld").join("handler.py")).unwrap();
    let v2_text = handler.replace("\"hello, \"", "\"hello again, \"") + "\n\ndef helper(x):\n    return x * 2\n";
    assert_ne!(handler, v2_text);
    let mut reports = Vec::new();
    for (v, text) in [("v1", handler.clone()), ("v2", v2_text)] {
        let code = bundle(&format!("dedup-{v}"), &[("handler.py", &text)]);
        let snap = scratch().join(format!("dedup-{v}.snap"));
        // Identical pages across captures need the same address layout and hash
        // seed: without them nearly every heap page differs (pointers, dict order).
        let o = Command::new("setarch")
            .args(["-R", env!("CARGO_BIN_EXE_thaw"), "snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler"])
            .args(["--env", "PYTHONHASHSEED=0", "--out", snap.to_str().unwrap()])
            .env("THAW_DATA_DIR", scratch().join("data"))
            .output()
            .unwrap();
        ok(o);
        // Its working set, as every snapshot a node serves has one (the head's pages
        // are cut apart from the others).
        ok(thaw(&["snapshot", "restore", snap.to_str().unwrap(), "--quiet"]));
        let o = ok(thaw_s3(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://dedup/fn", "--create-bucket"]));
        reports.push(report(&o));
        eprintln!("{v}: {}", reports.last().unwrap());
    }
    let up = |i: usize, k: &str| reports[i][k].as_u64().unwrap();
    assert_ne!(reports[0]["id"], reports[1]["id"]);
    // The packs (the heads' copies under each snapshot's id, a miss's shortcut, are
    // each version's own by design: printed, not counted).
    eprintln!("heads' copies: {} + {} bytes", up(0, "head_copy_bytes"), up(1, "head_copy_bytes"));
    let one = up(0, "bytes_uploaded") - up(0, "head_copy_bytes");
    let total = one + up(1, "bytes_uploaded") - up(1, "head_copy_bytes");
    eprintln!("store holds {total} bytes for two versions = {:.3}x one version", total as f64 / one as f64);
    // Measured: 1.44x to 1.48x with content-defined chunks of 8 to 16 KiB, 1.50x with
    // the 8 KiB address windows before them. The heads weigh most: each version's
    // head pack holds its working set's chunks again, so that one read starts it.
    assert!(total as f64 <= 1.5 * one as f64, "two versions take {total} bytes, one {one}");
    assert!(up(1, "chunks_uploaded") * 3 < up(1, "chunks"), "{}", reports[1]);
}

#[test]
fn corruption_and_a_store_that_is_down_are_clear_errors_that_leave_nothing() {
    let mut m = Minio::start();
    let snap = scratch().join("err.snap");
    let code = sample("helloworld");
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let o = ok(thaw_s3(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://errs", "--create-bucket"]));
    let url = last_line(&o);
    // Flip a byte of a stored chunk, on MinIO's disk: MinIO keeps small objects
    // inline in xl.meta, so corrupt the object through S3 instead.
    let store = thaw_store::Store::open(
        &thaw_store::StoreUrl::parse("s3://errs").unwrap(),
        &thaw_store::StoreConfig {
            endpoint: Some(m.endpoint()),
            access_key_id: Some(minio::ACCESS_KEY.into()),
            secret_access_key: Some(minio::SECRET_KEY.into()),
            ..Default::default()
        },
    )
    .unwrap();
    let (key, _) = store.block_on(store.remote.list("packs")).unwrap().into_iter().next().unwrap();
    let mut data = store.block_on(store.remote.get(&key)).unwrap().to_vec();
    data[0] ^= 1;
    store.block_on(store.remote.put(&key, data.into())).unwrap();
    let dest = scratch().join("err-pulled");
    let o = thaw_s3(&m, &["snapshot", "pull", &url, dest.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(&format!("s3://errs/{key} is corrupt or truncated (the chunk at 0 ")), "{}", stderr(&o));
    assert!(!dest.exists());

    m.stop();
    let o = thaw_s3(&m, &["snapshot", "pull", &url, dest.to_str().unwrap(), "--store-timeout", "5"]);
    assert_eq!(o.status.code(), Some(2));
    let id = url.rsplit('/').next().unwrap();
    assert!(stderr(&o).contains(&format!("GET s3://errs/snapshots/{id}.json failed")), "{}", stderr(&o));
    assert!(!dest.exists());
    let o = thaw_s3(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://errs", "--store-timeout", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with(&format!("thaw: error: pushing {} to s3://errs:", snap.display())), "{}", stderr(&o));
    let o = thaw_s3(&m, &["snapshot", "gc", "s3://errs", "--store-timeout", "5"]);
    assert_eq!(o.status.code(), Some(2));
}

/// Working set first: the instance starts before the image is here, so a fetch can
/// fail after the start. Here every pack but the head is corrupt, and the call touches
/// memory the recorded working set did not: the fault's fetch fails its hash check,
/// the page server kills the instance (never a wrong page, never a hang), the restore
/// fails naming the pack, and nothing is cached or left behind.
#[test]
fn a_fetch_that_fails_after_the_start_kills_the_instance() {
    let m = Minio::start();
    let code = bundle(
        "late-fail",
        &[(
            "handler.py",
            "import os\n\
             BLOCKS = [bytes([i % 251]) * 4096 for i in range(4096)]  # 16 MiB, each page its own\n\
             NOISE = os.urandom(1 << 21)  # pages no compressor shrinks (a whole chunk of ws.pages), read by every call\n\n\
             def handler(event, context):\n    \
             return sum(b[0] for b in BLOCKS) if event.get('touch') else 'idle' if hash(NOISE) else 'zero'\n",
        )],
    );
    let snap = scratch().join("late-fail.snap");
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    // The working set is recorded by a call that leaves the blocks alone.
    ok(thaw(&["snapshot", "restore", snap.to_str().unwrap(), "--payload", r#"{"touch":false}"#, "--quiet"]));
    let o = ok(thaw_s3(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://late-fail", "--create-bucket"]));
    let url = last_line(&o);
    let id = url.rsplit('/').next().unwrap().to_string();
    let store = thaw_store::Store::open(&thaw_store::StoreUrl::parse("s3://late-fail").unwrap(), &s3::store_config(&m)).unwrap();
    let manifest = store.manifest(&id).unwrap();
    let head = manifest.head.expect("a snapshot with a working set has a head") as usize;
    assert!(manifest.packs.len() > 1, "{:?}", manifest.packs);
    for (n, p) in manifest.packs.iter().enumerate().filter(|(n, _)| *n != head) {
        let key = format!("packs/{}", p.name);
        let good = store.block_on(store.remote.get(&key)).unwrap();
        let bad: Vec<u8> = good.iter().map(|b| b ^ 0xff).collect();
        store.block_on(store.remote.put(&key, bad.into())).unwrap();
        eprintln!("corrupted pack {n} of {}", manifest.packs.len());
    }
    // What the working set covers still restores and answers.
    let o = ok(thaw_s3(&m, &["snapshot", "restore", &url, "--payload", r#"{"touch":false}"#, "--quiet"]));
    assert_eq!(stdout(&o).trim(), r#""idle""#);
    std::fs::remove_dir_all(scratch().join("data/snapshot-cache/entries").join(&id)).ok();
    // What it does not cover needs the corrupt packs.
    let o = thaw_s3(&m, &["snapshot", "restore", &url, "--payload", r#"{"touch":true}"#, "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("invocation failed") && e.contains("page server: ") && e.contains("is corrupt or truncated"), "{e}");
    assert!(!scratch().join("data/snapshot-cache/entries").join(&id).exists(), "nothing cached");
    let left: Vec<_> = std::fs::read_dir(scratch().join("data/snapshot-cache/lazy")).unwrap().flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(&id)).collect();
    assert!(left.is_empty(), "nothing is left behind: {left:?}");

    // The head's pages arrive beside the restore (its state first), checked at once by
    // the head's name: a head with one byte changed inside a page stored raw (which no
    // decompression would notice) fails that restore too, naming the head, whatever
    // the call touches.
    // The head's copy under the snapshot's id too (else the miss reads that instead):
    // it fails its check, and the pages are read from the head's pack.
    let key = format!("packs/{}", manifest.packs[head].name);
    let raw = manifest.file("ws.pages").unwrap().chunks.iter().find(|c| c.pack == Some(head as u32) && c.zlen.is_none()).expect("the noise is in the head, raw");
    // In the copy, ws.pages is in its second part (the pack from where state.bin and
    // ws.trace end).
    let split = manifest.head_first_end().expect("a split copy");
    for (k, from) in [(key.clone(), 0), (thaw_store::Remote::head_rest_key(&id), split)] {
        let mut data = store.block_on(store.remote.get(&k)).unwrap().to_vec();
        data[(raw.at.unwrap() + raw.len / 2 - from) as usize] ^= 0xff;
        store.block_on(store.remote.put(&k, data.into())).unwrap();
    }
    let o = thaw_s3(&m, &["snapshot", "restore", &url, "--payload", r#"{"touch":false}"#, "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(&format!("{key} is corrupt or truncated")), "{e}");
    assert!(!scratch().join("data/snapshot-cache/entries").join(&id).exists(), "nothing cached");
    let left: Vec<_> = std::fs::read_dir(scratch().join("data/snapshot-cache/lazy")).unwrap().flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(&id)).collect();
    assert!(left.is_empty(), "nothing is left behind: {left:?}");
}

#[test]
fn layered_snapshots_store_their_base_once_and_restore_from_the_store() {
    let m = Minio::start();
    // A data directory of its own: with a base in it, every snapshot created there is a diff.
    let data = scratch().join("layered-data");
    let data = data.to_str().unwrap();
    let run = |args: &[&str]| ok(s3::thaw_s3_env(&m, args, &[("THAW_DATA_DIR", data)]));
    let b: serde_json::Value = serde_json::from_str(stdout(&run(&["base", "build", "--runtime", "python3"])).trim()).unwrap();
    let base_id = b["id"].as_str().unwrap().to_string();
    let echo = bundle("layered-echo", &[("handler.py", "def handler(event, context):\n    return {'echo': event}\n")]);
    let functions = [(sample("helloworld"), r#"{"name":"layers"}"#), (echo, r#"{"k":1}"#)];
    let (mut urls, mut pushes, mut answers) = (vec![], vec![], vec![]);
    for (i, (code, payload)) in functions.iter().enumerate() {
        let snap = scratch().join(format!("layered-{i}.snap"));
        let c: serde_json::Value =
            serde_json::from_str(stdout(&run(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()])).trim())
                .unwrap();
        assert_eq!(c["base"].as_str(), Some(base_id.as_str()), "a diff on the base: {c}");
        answers.push(stdout(&run(&["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--quiet"])));
        let o = run(&["snapshot", "push", snap.to_str().unwrap(), "s3://layers", "--create-bucket"]);
        urls.push(last_line(&o));
        pushes.push(report(&o));
        if i == 0 {
            // A base instance used once (repurposed) records the base's working set
            // beside it; the base is still published as before (the same stored id).
            let calls = scratch().join("layered-repurpose.json");
            std::fs::write(&calls, serde_json::json!([{"code": code, "handler": "handler.handler", "payload": {"name": "base"}}]).to_string()).unwrap();
            let out = stdout(&run(&["base", "repurpose", "--calls", calls.to_str().unwrap()])).to_string();
            assert!(out.contains("hello, base") && out.contains(r#""tracks_writes":false"#), "{out}");
            assert!(std::path::Path::new(data).join("bases").join(&base_id).join("ws.trace").is_file(), "the base's working set recorded");
        }
    }
    assert_eq!(answers[0].trim(), r#"{"message": "hello, layers"}"#);
    // The base is a stored snapshot of its own, named by both diffs and sent once
    // (its working set, recorded in between, is not published).
    let stored_base = pushes[0]["base"].as_str().unwrap().to_string();
    assert_eq!(pushes[1]["base"].as_str(), Some(stored_base.as_str()), "{pushes:?}");
    assert_eq!(s3::objects(&s3::store(&m, "s3://layers"), "snapshots").len(), 3, "the base and two diffs");
    let sent = |r: &serde_json::Value| r["bytes_uploaded"].as_u64().unwrap();
    assert!(sent(&pushes[1]) * 2 < sent(&pushes[0]), "the second diff sent none of the base: {pushes:?}");

    // A pulled diff holds its base: it restores by itself.
    let pulled = scratch().join("layered-pulled");
    run(&["snapshot", "pull", &urls[0], pulled.to_str().unwrap()]);
    assert!(pulled.join("base/state.bin").is_file());
    assert_eq!(stdout(&run(&["snapshot", "restore", pulled.to_str().unwrap(), "--payload", functions[0].1, "--quiet"])), answers[0]);

    // Each diff's copy carries the base's start (the first object of the base's copy).
    let store = s3::store(&m, "s3://layers");
    let base_first = store.block_on(store.remote.get(&thaw_store::Remote::head_key(&stored_base))).unwrap();
    for url in &urls {
        let first = store.block_on(store.remote.get(&thaw_store::Remote::head_key(url.rsplit('/').next().unwrap()))).unwrap();
        assert_eq!(&first[..8], thaw_store::fetch::HEAD_BASE_MAGIC, "{url}");
        assert!(first.windows(base_first.len()).any(|w| w == &base_first[..]), "{url} carries the base's first object");
    }
    // Straight from the store, cold cache: the base is fetched once, for both diffs.
    let mut fetched = vec![];
    for (i, url) in urls.iter().enumerate() {
        let stats = scratch().join(format!("layered-stats-{i}.json"));
        let out = run(&["snapshot", "restore", url, "--payload", functions[i].1, "--quiet", "--stats", stats.to_str().unwrap()]);
        assert_eq!(stdout(&out), answers[i], "diff {i} restored from the store answers as before");
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert_eq!(st["store"]["cache_hit"], false, "{st}");
        // The diff's copy, its two objects at once (the first carrying the base's start:
        // its manifest, state.bin and ws.trace), and the second part of the base's copy
        // (it arrives lazily too: the pages the diff's working set needs came in the
        // diff's head); no read for a recorded working set of the base, which never has
        // one. The base cached (the second diff): the diff's copy alone.
        let before = st["store"]["requests_before_first_response"].as_u64().unwrap();
        assert_eq!(before, if i == 0 { 3 } else { 2 }, "diff {i}: requests before the first response: {st}");
        let before_bytes = st["store"]["bytes_fetched_before_first_response"].as_u64().unwrap();
        let all = st["store"]["bytes_fetched"].as_u64().unwrap();
        if i == 0 {
            assert!(before_bytes * 2 < all, "the base's bulk came after the first response: {st}");
        }
        eprintln!("diff {i}: {before} requests, {before_bytes} of {all} bytes before the first response");
        fetched.push(st["store"]["bytes_fetched"].as_u64().unwrap());
    }
    assert!(fetched[1] * 2 < fetched[0], "the second diff's restore fetched no base: {fetched:?}");
    let entries = std::path::Path::new(data).join("snapshot-cache/entries");
    let mut cached: Vec<String> = std::fs::read_dir(&entries).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    cached.sort();
    let mut want = vec![stored_base.clone()];
    want.extend(urls.iter().map(|u| u.rsplit('/').next().unwrap().to_string()));
    want.sort();
    assert_eq!(cached, want, "one base and two diffs in the cache");
    for u in &urls {
        let link = std::fs::read_link(entries.join(u.rsplit('/').next().unwrap()).join("base")).unwrap();
        assert_eq!(link, entries.join(&stored_base), "each cached diff links the one cached base");
    }
    // And again, from the cache.
    let out = run(&["snapshot", "restore", &urls[1], "--payload", functions[1].1, "--quiet"]);
    assert_eq!(stdout(&out), answers[1]);

    // Two diffs that miss at once, on a cache without their base, share one base
    // arriving lazily (opened and counted by the first): completed, it enters the
    // cache once, and each diff then links it there.
    {
        let store = std::sync::Arc::new(s3::store(&m, "s3://layers"));
        let cache = thaw_store::cache::Cache::open(&scratch().join("layered-shared-cache"), 1 << 30).unwrap();
        let ids: Vec<String> = urls.iter().map(|u| u.rsplit('/').next().unwrap().to_string()).collect();
        let misses: Vec<thaw_store::Miss> = std::thread::scope(|s| {
            let opened: Vec<_> = ids
                .iter()
                .map(|id| {
                    let (store, cache) = (store.clone(), cache.clone());
                    s.spawn(move || {
                        let start = store.miss_start(id).unwrap();
                        thaw_store::open_miss(&store, &cache, id, start).unwrap().expect("a head")
                    })
                })
                .collect();
            opened.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let bases: Vec<_> = misses.iter().map(|x| x.fill.lazy_base().expect("the base arrives lazily").clone()).collect();
        assert!(std::sync::Arc::ptr_eq(&bases[0], &bases[1]), "one base for both diffs");
        assert_eq!(bases[0].id, stored_base);
        assert!(misses.iter().all(|x| x.base.is_none()), "no base came whole");
        let base_scratch = bases[0].fill.dir().to_path_buf();
        drop(bases);
        let mut pins = vec![];
        for (x, id) in misses.iter().zip(&ids) {
            x.fill.complete().unwrap();
            pins.push(thaw_store::settle_base(&cache, &x.fill, &x.dir).unwrap().expect("the lazy base's pin"));
            pins.push(cache.get(id, &thaw_store::cache::Adopt { dir: x.dir.clone() }).unwrap());
        }
        let entries = scratch().join("layered-shared-cache/entries");
        for id in &ids {
            assert_eq!(std::fs::read_link(entries.join(id).join("base")).unwrap(), entries.join(&stored_base));
            thaw_engine::image::Snapshot::open(&entries.join(id)).unwrap();
        }
        assert_eq!(cache.stats().misses, 3, "the base and two diffs entered the cache once each: {:?}", cache.stats());
        drop(misses);
        assert!(!base_scratch.exists(), "the base's scratch directory goes with its last diff");
        drop(pins);
    }

    // The base goes once no diff names it: the collector condemns its manifest, then
    // deletes it (two runs a grace period apart), then its packs the same way.
    let store = s3::store(&m, "s3://layers");
    let manifests = || s3::objects(&store, "snapshots").into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    let base_key = format!("snapshots/{stored_base}.json");
    run(&["snapshot", "rm", &urls[0]]);
    let gc = |what: &str| -> serde_json::Value {
        std::thread::sleep(std::time::Duration::from_millis(2100)); // the store's times have 1 s resolution
        let o = run(&["snapshot", "gc", "s3://layers", "--grace", "0s"]);
        serde_json::from_str(stdout(&o).trim()).unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    gc("one diff left");
    gc("one diff left, again");
    assert!(manifests().contains(&base_key), "a base a diff names stays");
    run(&["snapshot", "rm", &urls[1]]);
    let packs = s3::objects(&store, "packs").len();
    let r = gc("condemn the base");
    assert!(r["condemned"].as_u64().unwrap() >= 1, "{r}");
    let r = gc("delete the base");
    assert!(!manifests().contains(&base_key), "{r}");
    gc("condemn its packs");
    gc("delete its packs");
    assert!(s3::objects(&store, "packs").len() < packs, "the base's packs went too");
    assert!(manifests().is_empty(), "{:?}", manifests());
    // The heads' copies: the diffs' went with `snapshot rm`, the base's (its manifest
    // collected) with its packs.
    assert!(s3::objects(&store, "heads").is_empty(), "{:?}", s3::objects(&store, "heads"));
}

/// A snapshot pushed before heads' copies held the manifest (THAW_STORE_HEAD_MANIFEST=0
/// writes one so) misses in three requests (the copy and the second part of a split
/// one, then the manifest); the next push of it rewrites the copy, split, and a miss
/// then makes two at once. A push of a snapshot whose copy is up to date writes nothing.
#[test]
fn a_push_brings_a_head_copy_without_the_manifest_up_to_date() {
    let m = Minio::start();
    let snap = scratch().join("old-copy.snap");
    s3::capture("helloworld", &snap);
    // The payload its working set was recorded with: no fault needs a fetch of its own.
    let payload = r#"{"name":"ws"}"#;
    let push = |env: &[(&str, &str)]| {
        let o = ok(s3::thaw_s3_env(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://old-copy/fns", "--create-bucket"], env));
        (last_line(&o), report(&o))
    };
    let miss = |url: &str, n: usize| {
        let id = url.rsplit('/').next().unwrap();
        let _ = std::fs::remove_dir_all(scratch().join("data/snapshot-cache/entries").join(id));
        let stats = scratch().join(format!("old-copy-stats-{n}.json"));
        let o = ok(thaw_s3(&m, &["snapshot", "restore", url, "--payload", payload, "--quiet", "--stats", stats.to_str().unwrap()]));
        assert_eq!(stdout(&o).trim(), r#"{"message": "hello, ws"}"#);
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert_eq!((&st["store"]["cache_hit"], &st["mode"]), (&serde_json::json!(false), &serde_json::json!("prefetch")), "{st}");
        st["store"]["requests_before_first_response"].as_u64().unwrap()
    };
    let (url, r) = push(&[("THAW_STORE_HEAD_MANIFEST", "0")]);
    assert!(r["head_copy_bytes"].as_u64() > Some(0), "{r}");
    assert_eq!(miss(&url, 0), 3, "the copy without the manifest and the second part a split one would have, then the manifest");
    let (again, r) = push(&[]);
    assert_eq!(again, url, "the same snapshot");
    let copied = r["head_copy_bytes"].as_u64().unwrap();
    assert!(copied > 0, "the copy was not rewritten: {r}");
    assert_eq!(miss(&url, 1), 2, "two requests at once: the copy, which brings the manifest, and its second part");
    let (_, r) = push(&[]);
    assert_eq!(r["head_copy_bytes"], 0, "an up-to-date copy is left alone: {r}");
}

/// A snapshot with a live child process (issue #32) round-trips through the store: its
/// pages (the child's keyed apart in the same pages.img) are packed and fetched like
/// the runtime's, and a restore straight from the store with a cold cache (the head
/// first, the child's pages fetched as its restore reads them) answers like the local
/// one, as does a hit.
#[test]
fn a_snapshot_with_a_live_child_process_restores_from_the_store() {
    let m = Minio::start();
    let handler = r#"import os
REQ_R, REQ = os.pipe()
RESP, RESP_W = os.pipe()
KID = os.fork()
if KID == 0:
    os.close(REQ)
    os.close(RESP)
    table = {i: i * i for i in range(20000)}
    served = 0
    while True:
        k = os.read(REQ_R, 16)
        if not k:
            os._exit(0)
        served += 1
        os.write(RESP_W, b'%d %d %d' % (os.getpid(), table[int(k)], served))
os.close(REQ_R)
os.close(RESP_W)
os.write(REQ, b'3')
os.read(RESP, 100)


def handler(event, context):
    os.write(REQ, b'%d' % event['k'])
    pid, square, served = os.read(RESP, 100).split()
    return [int(pid) == KID, int(square), int(served)]
"#;
    let code = bundle("store-child", &[("handler.py", handler)]);
    let snap = scratch().join("child.snap");
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", snap.to_str().unwrap()]));
    let payload = r#"{"k": 1234}"#;
    let want = "[true, 1522756, 2]";
    assert_eq!(stdout(&ok(thaw(&["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--quiet"]))).trim(), want);
    let o = ok(thaw_s3(&m, &["snapshot", "push", snap.to_str().unwrap(), "s3://child-bucket/fns/child", "--create-bucket"]));
    let url = last_line(&o);
    for (i, hit) in [(1, false), (2, true)] {
        let stats = scratch().join(format!("child-s3-stats-{i}.json"));
        let o = ok(thaw_s3(&m, &["snapshot", "restore", &url, "--payload", payload, "--quiet", "--stats", stats.to_str().unwrap()]));
        assert_eq!(stdout(&o).trim(), want, "restore from the store #{i}");
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert_eq!(st["store"]["cache_hit"], hit, "{st}");
        if !hit {
            assert_eq!(st["store"]["lazy"], true, "{st}");
        }
    }
    let pulled = scratch().join("child-pulled");
    ok(thaw_s3(&m, &["snapshot", "pull", &url, pulled.to_str().unwrap()]));
    assert_eq!(stdout(&ok(thaw(&["snapshot", "restore", pulled.to_str().unwrap(), "--payload", payload, "--quiet"]))).trim(), want);
}
