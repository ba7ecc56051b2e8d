//! The snapshot store against a real MinIO (started by the tests): round trip
//! (chunks in packs), the commit protocol under a publisher killed after each of its objects,
//! concurrent publishers, corruption, the store going down, the collector, and
//! the store as the node cache's source.

mod common;
mod s3;

use std::time::Duration;

use common::scratch;
use s3::minio::Minio;
use s3::*;
use thaw_store::{pack, publish, Remote, StoreError};

fn publish_pack_target() -> u64 {
    pack::PACK_TARGET
}

type Bytes = thaw_store::bytes::Bytes;

#[test]
fn round_trip_is_byte_identical_and_a_second_push_uploads_nothing() {
    let m = Minio::start();
    let s = store(&m, "s3://snaps/fleet/a");
    let snap = hello_snapshot();
    let counted = std::sync::atomic::AtomicU64::new(0);
    let r = s.push(snap, &|n| {
        counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    })
    .unwrap();
    assert!(r.url.starts_with("s3://snaps/fleet/a/") && r.url.ends_with(&r.id), "{}", r.url);
    assert!(r.chunks_uploaded > 0 && r.chunks_uploaded <= r.chunks);
    // Few large objects: the chunks are in packs of a few MiB, none stands alone.
    let packs = objects(&s, "packs");
    assert!(objects(&s, "chunks").is_empty());
    assert_eq!((packs.len(), r.packs, r.packs_uploaded), (r.packs, r.packs, r.packs));
    assert!(r.packs as u64 <= r.snapshot_bytes / publish_pack_target() + 2, "the head, then packs of the target size: {r:?}");
    assert!(r.requests <= 2 * r.packs as u64 + 5, "LIST, HEAD+PUT per pack, the head's copy (two objects), the manifest, the GC list: {r:?}");
    let stored: u64 = packs.iter().map(|(_, n)| n).sum();
    // The head's copy under the snapshot's id, split in two: the manifest as stored,
    // then the head pack's bytes up to where state.bin's and ws.trace's end (what the
    // restore waits for), and the rest of them in a second object (requested at once).
    let heads = objects(&s, "heads");
    let (first_key, rest_key) = (format!("heads/{}", r.id), format!("heads/{}.rest", r.id));
    assert_eq!(heads.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), vec![first_key.clone(), rest_key.clone()], "{r:?}");
    assert_eq!(heads[0].1 + heads[1].1, r.head_copy_bytes, "{r:?}");
    let copy = s.block_on(s.remote.get(&first_key)).unwrap();
    let rest = s.block_on(s.remote.get(&rest_key)).unwrap();
    let manifest = s.block_on(s.remote.get(&format!("snapshots/{}.json", r.id))).unwrap();
    let magic = thaw_store::fetch::HEAD_SPLIT_MAGIC.len();
    assert_eq!(&copy[..magic], thaw_store::fetch::HEAD_SPLIT_MAGIC);
    assert_eq!(u32::from_le_bytes(copy[magic..magic + 4].try_into().unwrap()) as usize, manifest.len());
    assert_eq!(copy[magic + 4..magic + 4 + manifest.len()], manifest[..], "the manifest as stored");
    let m = s.manifest(&r.id).unwrap();
    assert_eq!(Some((copy.len() - magic - 4 - manifest.len()) as u64), m.head_first_end(), "split where the restore's first files end");
    let pack = [&copy[magic + 4 + manifest.len()..], &rest[..]].concat();
    let head = packs.iter().find(|(key, _)| key.ends_with(&thaw_store::remote::sha256_hex(&pack))).expect("the two parts are a stored pack's bytes");
    assert_eq!(head.1, pack.len() as u64);
    assert_eq!(r.bytes_uploaded, stored + objects(&s, "snapshots")[0].1 + r.head_copy_bytes, "bytes reported = packs + manifest + the head's copy in the store");
    let raw: u64 = publish::plan(snap).unwrap().uploads.iter().map(|u| u.len).sum();
    assert_eq!(counted.into_inner(), raw, "progress covers every chunk once");
    assert!(stored < raw * 2 / 3, "packs hold chunks compressed: {stored} bytes for {raw}");
    // ws.pages is rebuilt on pull, not stored: the store holds less than the directory.
    let dir_bytes: u64 = files(snap).iter().map(|(_, b)| b.len() as u64).sum();
    assert!(stored < dir_bytes, "stored {stored} >= directory {dir_bytes}");

    let again = s.push(snap, &no_progress).unwrap();
    assert_eq!(again.id, r.id, "the id is a function of the contents");
    assert_eq!(again.chunks_uploaded, 0);
    assert_eq!(again.bytes_deduplicated, raw);

    let dest = scratch().join("pulled-rt");
    let p = s.pull(&r.id, &dest, &no_progress).unwrap();
    assert_eq!(p.bytes_fetched, r.bytes_uploaded - r.head_copy_bytes, "a pull reads all but the head's copy");
    assert_eq!(p.chunks_fetched, r.packs, "one ranged read per pack");
    assert_eq!(files(&dest), files(snap), "pulled files (ws.pages rebuilt) equal the original");
    let e = s.pull(&r.id, &dest, &no_progress).unwrap_err();
    assert!(matches!(e, StoreError::Exists { .. }), "{e}");
    let e = s.pull(&"0".repeat(64), &scratch().join("nope"), &no_progress).unwrap_err().to_string();
    assert_eq!(e, format!("s3://snaps/fleet/a/snapshots/{}.json not found in the store", "0".repeat(64)));
    assert!(!scratch().join("nope").exists());
}

#[test]
fn a_publisher_killed_after_any_object_leaves_nothing_visible_and_gc_removes_the_orphans() {
    let m = Minio::start();
    let s = store(&m, "s3://snaps/killed");
    let plan = publish::plan(hello_snapshot()).unwrap();
    let none = Default::default();
    // Small packs, so the publisher has several objects to die after.
    let packs = pack::new_packs(&plan, |_| false, 512 << 10);
    let n = packs.len();
    assert!(n > 4, "{n} packs");
    let requests = std::sync::atomic::AtomicU64::new(0);
    // The publisher dies after its k-th object, for every k: no manifest, nothing to restore.
    for k in 0..=n {
        if k > 0 {
            s.block_on(pack::store_pack(&s.remote, &plan, &packs[k - 1], &none, &requests)).unwrap();
        }
        assert!(objects(&s, "snapshots").is_empty());
        let e = s.pull(&plan.id, &scratch().join("killed"), &no_progress).unwrap_err();
        assert!(matches!(e, StoreError::NotFound { .. }), "after {k} objects: {e}");
    }
    assert_eq!(objects(&s, "packs").len(), n);
    // Orphans younger than the grace period are left alone (an in-flight publish).
    let r = s.gc(Duration::from_secs(3600)).unwrap();
    assert_eq!((r.deleted, r.condemned, r.chunks), (0, 0, n));
    // Older: condemned by one run, deleted by the next.
    std::thread::sleep(Duration::from_millis(2100));
    let r = s.gc(Duration::ZERO).unwrap();
    assert_eq!((r.deleted, r.condemned), (0, n));
    let r = s.gc(Duration::ZERO).unwrap();
    assert_eq!((r.deleted, r.condemned), (n, 0));
    assert!(objects(&s, "packs").is_empty());
    assert!(objects(&s, "gc").is_empty());
}

#[test]
fn the_format_before_packs_is_still_read_and_collected() {
    let m = Minio::start();
    let s = store(&m, "s3://snaps/v1");
    // As THAW_STORE_FORMAT=1 plans it: address windows, ws.pages derived.
    let plan = publish::plan_with(hello_snapshot(), publish::Chunking::WINDOWS).unwrap();
    let none = Default::default();
    s.block_on(publish::upload(&s.remote, &plan, 0..plan.uploads.len(), &none, &no_progress)).unwrap();
    s.block_on(publish::commit(&s.remote, &plan)).unwrap();
    assert_eq!(objects(&s, "chunks").len(), plan.uploads.len());
    let dest = scratch().join("pulled-v1");
    let p = s.pull(&plan.id, &dest, &no_progress).unwrap();
    assert_eq!(p.chunks_fetched, plan.uploads.len(), "one request per chunk");
    assert_eq!(files(&dest), files(hello_snapshot()));
    // Its chunks are referenced, then collected once it is removed.
    let r = s.gc(Duration::ZERO).unwrap();
    assert_eq!((r.condemned, r.referenced_chunks), (0, plan.uploads.len()));
    s.remove(&plan.id).unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(s.gc(Duration::ZERO).unwrap().condemned, plan.uploads.len());
    assert_eq!(s.gc(Duration::ZERO).unwrap().deleted, plan.uploads.len());
    assert!(objects(&s, "chunks").is_empty());
}

#[test]
fn gc_keeps_what_manifests_reference_and_a_publisher_revives_condemned_chunks() {
    let m = Minio::start();
    let s = store(&m, "s3://snaps/gc");
    let snap = hello_snapshot();
    let first = s.push(snap, &no_progress).unwrap();
    // Delete the snapshot (its manifest): its chunks become orphans.
    s.remove(&first.id).unwrap();
    assert!(matches!(s.remove(&first.id), Err(StoreError::NotFound { .. })));
    std::thread::sleep(Duration::from_millis(2100));
    let r = s.gc(Duration::ZERO).unwrap();
    assert_eq!(r.condemned, first.packs_uploaded);
    // A publisher of the same snapshot now uploads the condemned packs again
    // instead of relying on them, and the next run deletes nothing it needs.
    let second = s.push(snap, &no_progress).unwrap();
    assert_eq!((second.chunks_uploaded, second.packs_uploaded), (first.chunks_uploaded, first.packs_uploaded));
    let r = s.gc(Duration::ZERO).unwrap();
    assert_eq!((r.deleted, r.referenced_chunks), (0, first.packs_uploaded));
    let dest = scratch().join("pulled-gc");
    s.pull(&second.id, &dest, &no_progress).unwrap();
    assert_eq!(files(&dest), files(snap));
    // Recorded working sets (ws/<id>.trace, written by nodes beside a snapshot) and
    // head copies (both parts of a split one): those of a snapshot that is gone are
    // collected in two runs, the live one's kept.
    let gone_id = first.id.chars().rev().collect::<String>();
    let (live, gone) = (Remote::ws_key(&second.id), Remote::ws_key(&gone_id));
    for key in [&live, &gone, &Remote::head_key(&gone_id), &Remote::head_rest_key(&gone_id)] {
        s.block_on(s.remote.put(key, thaw_store::bytes::Bytes::from_static(b"a trace"))).unwrap();
    }
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(s.gc(Duration::ZERO).unwrap().condemned, 3, "the orphan trace and head copy");
    let r = s.gc(Duration::ZERO).unwrap();
    assert_eq!(r.deleted, 3);
    assert_eq!(objects(&s, "ws").into_iter().map(|(k, _)| k).collect::<Vec<_>>(), vec![live]);
    let heads: Vec<String> = objects(&s, "heads").into_iter().map(|(k, _)| k).collect();
    assert_eq!(heads, vec![Remote::head_key(&second.id), Remote::head_rest_key(&second.id)], "the live copy's two parts are kept");
}

#[test]
fn concurrent_publishers_of_one_snapshot_produce_one_consistent_snapshot() {
    let m = Minio::start();
    let snap = hello_snapshot();
    let reports: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let s = store(&m, "s3://snaps/race");
                sc.spawn(move || s.push(snap, &no_progress).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(reports.iter().all(|r| r.id == reports[0].id));
    let s = store(&m, "s3://snaps/race");
    assert_eq!(objects(&s, "snapshots").len(), 1, "exactly one manifest");
    let plan = publish::plan(snap).unwrap();
    let packs = pack::packs_to_store(&plan, |_| false).len();
    assert_eq!(objects(&s, "packs").len(), packs, "each pack once");
    let dest = scratch().join("pulled-race");
    s.pull(&reports[0].id, &dest, &no_progress).unwrap();
    assert_eq!(files(&dest), files(snap));
}

#[test]
fn a_corrupt_or_truncated_object_is_named_and_nothing_is_installed() {
    let m = Minio::start();
    let s = store(&m, "s3://snaps/corrupt");
    let r = s.push(hello_snapshot(), &no_progress).unwrap();
    let (key, _) = objects(&s, "packs").into_iter().max_by_key(|(_, n)| *n).unwrap();
    let good = s.block_on(s.remote.get(&key)).unwrap();
    let dest = scratch().join("pulled-corrupt");
    let mut flipped = good.to_vec();
    flipped[100] ^= 1;
    for (bad, what) in [(Bytes::from(flipped), "the chunk at 0 hashes to "), (good.slice(..good.len() - 1), "bytes, expected")] {
        s.block_on(s.remote.put(&key, bad)).unwrap();
        let e = s.pull(&r.id, &dest, &no_progress).unwrap_err().to_string();
        assert!(e.starts_with(&format!("s3://snaps/corrupt/{key} is corrupt or truncated (")) && e.contains(what), "{e}");
        assert!(!dest.exists());
        let leftovers: Vec<_> = std::fs::read_dir(scratch()).unwrap().filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("pulled-corrupt")).collect();
        assert!(leftovers.is_empty(), "temporary directory left behind");
    }
    // Pushing again repairs the truncated pack (wrong size in the store).
    let again = s.push(hello_snapshot(), &no_progress).unwrap();
    assert_eq!((again.id.as_str(), again.packs_uploaded, again.chunks_uploaded), (r.id.as_str(), 1, 0));
    s.pull(&r.id, &dest, &no_progress).unwrap();
    // A manifest that does not hash to its id is refused too.
    // (Format 7, mostly hashes, is stored as it is, not zstd-compressed; a reader takes
    // compressed and plain JSON ones too.)
    let mkey = Remote::manifest_key(&r.id);
    let stored = s.block_on(s.remote.get(&mkey)).unwrap();
    assert!(stored.starts_with(thaw_store::manifest::MAGIC), "a format 7 manifest of random hashes is stored raw");
    let mut mb = s.manifest(&r.id).unwrap().to_bytes();
    mb[10] = b' ';
    s.block_on(s.remote.put(&mkey, Bytes::from(mb))).unwrap();
    let e = s.pull(&r.id, &scratch().join("pulled-corrupt2"), &no_progress).unwrap_err().to_string();
    assert!(e.starts_with(&format!("s3://snaps/corrupt/{mkey} is corrupt or truncated (contents hash to ")), "{e}");
    let mut cut = stored.to_vec();
    cut.truncate(40);
    s.block_on(s.remote.put(&mkey, Bytes::from(cut))).unwrap();
    let e = s.pull(&r.id, &scratch().join("pulled-corrupt3"), &no_progress).unwrap_err().to_string();
    assert!(e.starts_with(&format!("s3://snaps/corrupt/{mkey} is corrupt or truncated (contents hash to ")), "{e}");
    // What says it is zstd and is not.
    let garbage = [&[0x28, 0xB5, 0x2F, 0xFD][..], &stored[..40]].concat();
    s.block_on(s.remote.put(&mkey, Bytes::from(garbage))).unwrap();
    let e = s.pull(&r.id, &scratch().join("pulled-corrupt4"), &no_progress).unwrap_err().to_string();
    assert!(e.starts_with(&format!("s3://snaps/corrupt/{mkey} is corrupt or truncated (does not decompress")), "{e}");
}

#[test]
fn store_down_is_a_clear_error_that_changes_nothing_and_recovery_is_automatic() {
    let mut m = Minio::start();
    let s = store(&m, "s3://snaps/down");
    let snap = hello_snapshot();
    let id = s.push(snap, &no_progress).unwrap().id;
    m.stop();
    let t0 = std::time::Instant::now();
    let dest = scratch().join("pulled-down");
    let e = s.pull(&id, &dest, &no_progress).unwrap_err();
    let msg = format!("{e}: {}", std::error::Error::source(&e).map(|c| c.to_string()).unwrap_or_default());
    assert!(msg.starts_with(&format!("GET s3://snaps/down/snapshots/{id}.json failed")), "{msg}");
    assert!(!dest.exists());
    let e = s.push(snap, &no_progress).unwrap_err().to_string();
    assert!(e.contains("failed"), "{e}");
    eprintln!("store down: two failed operations took {:.1} s", t0.elapsed().as_secs_f64());
    m.resume();
    s.pull(&id, &dest, &no_progress).unwrap();
    assert_eq!(files(&dest), files(snap));
}

#[test]
fn the_s3_store_as_the_cache_source_fetches_once_and_never_installs_corruption() {
    let m = Minio::start();
    let s = store(&m, "s3://snaps/cache");
    let id = s.push(hello_snapshot(), &no_progress).unwrap().id;
    let (key, _) = objects(&s, "packs").into_iter().next().unwrap();
    let good = s.block_on(s.remote.get(&key)).unwrap();
    let mut bad = good.to_vec();
    bad[0] ^= 0xff;
    s.block_on(s.remote.put(&key, bad.into())).unwrap();

    let t = tempfile::Builder::new().prefix("thaw-cache-").tempdir().unwrap();
    let cache = thaw_store::cache::Cache::open(t.path(), 64 << 20).unwrap();
    let src = thaw_store::StoreSource::new(&s);
    let e = cache.get(&id, &src).err().unwrap();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(chain.contains(&format!("s3://snaps/cache/{key} is corrupt or truncated")), "{chain}");
    assert!(!cache.contains(&id) && std::fs::read_dir(t.path().join("tmp")).unwrap().next().is_none());

    s.block_on(s.remote.put(&key, good)).unwrap();
    let src = thaw_store::StoreSource::new(&s);
    let handles: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4).map(|_| sc.spawn(|| cache.get(&id, &src).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stored: u64 = objects(&s, "packs").iter().map(|(_, n)| n).sum();
    assert_eq!(src.bytes_fetched.load(std::sync::atomic::Ordering::SeqCst), stored, "four requests, one download");
    assert_eq!(files(handles[0].dir()), files(hello_snapshot()));
}

#[test]
fn a_large_object_goes_up_in_parts_and_comes_back_whole() {
    let m = Minio::start();
    let s = store(&m, "s3://snaps/multipart");
    let n = thaw_store::remote::MULTIPART_ABOVE as usize + (3 << 20) + 7;
    let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    s.block_on(s.remote.put("packs/big", data.clone().into())).unwrap();
    let meta = s.block_on(s.remote.head("packs/big")).unwrap().unwrap();
    assert_eq!(meta.size, n as u64);
    // S3 (and MinIO) name a multipart object's ETag by its parts: 8 + 8 + 3 MiB.
    assert!(meta.e_tag.as_deref().is_some_and(|e| e.trim_matches('"').ends_with("-3")), "three parts: {:?}", meta.e_tag);
    assert_eq!(&s.block_on(s.remote.get("packs/big")).unwrap()[..], &data[..]);
    // At the threshold, one request.
    s.block_on(s.remote.put("packs/small", data[..thaw_store::remote::MULTIPART_ABOVE as usize].to_vec().into())).unwrap();
    let meta = s.block_on(s.remote.head("packs/small")).unwrap().unwrap();
    assert!(meta.e_tag.as_deref().is_some_and(|e| !e.contains('-')), "{:?}", meta.e_tag);
}
