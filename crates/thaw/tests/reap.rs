//! REAP record-and-prefetch through the CLI, as root: recording writes a working
//! set that matches the image, prefetch restores give the same results as lazy
//! ones with fewer faults, broken or stale working sets are ignored without
//! failing the call and re-recorded, and mispredictions are counted.

mod common;

use std::path::{Path, PathBuf};

use common::{ok, sample, scratch, thaw, thaw_env};
use thaw_engine::image::Snapshot;
use thaw_engine::ws::{WorkingSet, LZ4_FILE, PAGES_FILE, TRACE_FILE};

/// A fresh snapshot of `sample` in its own directory.
fn fresh_snapshot(name: &str, tag: &str) -> PathBuf {
    let code = sample(name);
    let dir = scratch().join(format!("{name}-{tag}"));
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--memory", "1024", "--out", dir.to_str().unwrap()]));
    dir
}

/// Restore once; returns (stdout, stats).
fn restore(dir: &Path, payload: &str, paging: &str, extra: &[&str]) -> (String, serde_json::Value) {
    restore_env(dir, payload, paging, extra, &[])
}

/// [`restore`] with `vars` in thaw's environment.
fn restore_env(dir: &Path, payload: &str, paging: &str, extra: &[&str], vars: &[(&str, &str)]) -> (String, serde_json::Value) {
    let stats = dir.with_extension(format!("stats-{paging}-{}.json", std::process::id()));
    let mut args = vec!["snapshot", "restore", dir.to_str().unwrap(), "--payload", payload, "--paging", paging, "--quiet", "--stats", stats.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = ok(thaw_env(vars, &args));
    let v = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    (String::from_utf8(o.stdout).unwrap(), v)
}

#[test]
fn record_writes_a_working_set_matching_the_image_and_prefetch_uses_it() {
    let dir = fresh_snapshot("stdlib", "record");
    let payload = r#"{"text":"a b c","n":3}"#;
    assert!(!WorkingSet::exists(&dir));
    let (rec_out, rec) = restore(&dir, payload, "auto", &[]);
    assert_eq!(rec["mode"], "record", "no working set yet: auto must record");
    let faults = rec["page_faults"].as_u64().unwrap();
    assert!(faults > 0);
    assert_eq!(rec["recorded_pages"].as_u64().unwrap(), faults, "every fault of the first invocation is recorded");

    // The trace and pages exist, belong to this image and every page matches it.
    let snap = Snapshot::open(&dir).unwrap();
    let ws = WorkingSet::load(&dir, snap.id).unwrap();
    assert_eq!(ws.trace.len() as u64, faults);
    let (buf, _) = ws.read_pages(&dir, &snap.image.pages, false).unwrap();
    assert_eq!(buf.as_ref().len(), ws.layout.len() * 4096);
    let pages = std::fs::read(dir.join("pages.img")).unwrap();
    for (i, &(_, fp)) in ws.layout.iter().enumerate() {
        assert_eq!(&buf.as_ref()[i * 4096..(i + 1) * 4096], &pages[fp as usize * 4096..(fp as usize + 1) * 4096]);
    }

    // Prefetch (the default now) gives the same answer with the working set installed up front.
    let (pre_out, pre) = restore(&dir, payload, "auto", &[]);
    assert_eq!(pre["mode"], "prefetch");
    assert_eq!(pre_out, rec_out);
    assert_eq!(pre["prefetch"]["ws_pages"].as_u64().unwrap() as usize, ws.layout.len());
    assert!(pre["page_faults"].as_u64().unwrap() < faults / 10, "prefetch should leave few faults: {pre}");
    for mode in ["lazy", "ws-cached", "parallel", "eager"] {
        let (out, st) = restore(&dir, payload, mode, &[]);
        assert_eq!(st["mode"], mode);
        assert_eq!(out, rec_out, "{mode} differs");
    }
}

#[test]
fn corrupt_or_stale_working_sets_are_ignored_then_re_recorded() {
    let dir = fresh_snapshot("helloworld", "corrupt");
    let (want, _) = restore(&dir, "{}", "record", &[]);
    assert!(WorkingSet::exists(&dir));

    // Flip a byte of a working-set page, in its first piece and then in its last: the
    // working set is checked piece by piece as it is read and installed, so the
    // pieces before the bad one are installed and the rest is served lazily; the
    // restore answers as ever, the set is removed, and the next restore records one.
    let snap = Snapshot::open(&dir).unwrap();
    // ws.lz4 is written beside ws.pages (helloworld's pages compress), but a working set
    // this small is read from ws.pages (ws::LZ4_READ_FROM)...
    assert!(dir.join(LZ4_FILE).is_file(), "ws.lz4 written with the working set");
    let (_, st) = restore(&dir, "{}", "prefetch", &[]);
    assert_eq!(st["prefetch"]["disk_bytes"], st["prefetch"]["ws_bytes"], "small: read from ws.pages: {st}");
    // ...unless asked (THAW_WS_LZ4=1). A frame that does not decompress to the image's
    // pages is read from ws.pages instead, and ws.lz4 removed; the working set stays.
    let lz4 = [("THAW_WS_LZ4", "1")];
    let (_, st) = restore_env(&dir, "{}", "prefetch", &[], &lz4);
    let (ws_bytes, disk) = (st["prefetch"]["ws_bytes"].as_u64().unwrap(), st["prefetch"]["disk_bytes"].as_u64().unwrap());
    assert!(disk > 0 && disk < ws_bytes / 2, "{disk} bytes read for {ws_bytes}: {st}");
    let mut z = std::fs::read(dir.join(LZ4_FILE)).unwrap();
    let at = z.len() - 200;
    z[at] ^= 0xff;
    std::fs::write(dir.join(LZ4_FILE), &z).unwrap();
    let (out, st) = restore_env(&dir, "{}", "prefetch", &[], &lz4);
    assert_eq!(out, want);
    assert_eq!(st["prefetch"]["partial"], false, "{st}");
    assert!(!dir.join(LZ4_FILE).exists(), "the damaged ws.lz4 is removed");
    assert!(WorkingSet::exists(&dir), "the working set stays");
    let (out, st) = restore(&dir, "{}", "prefetch", &[]);
    assert_eq!(out, want);
    assert_eq!(st["prefetch"]["disk_bytes"], st["prefetch"]["ws_bytes"], "read from ws.pages: {st}");
    for at in [100, std::fs::metadata(dir.join(PAGES_FILE)).unwrap().len() as usize - 100] {
        // ws.pages itself (ws.lz4, made again by the re-recording below, removed).
        let _ = std::fs::remove_file(dir.join(LZ4_FILE));
        let mut wp = std::fs::read(dir.join(PAGES_FILE)).unwrap();
        wp[at] ^= 0xff;
        std::fs::write(dir.join(PAGES_FILE), &wp).unwrap();
        let (out, st) = restore(&dir, "{}", "prefetch", &[]);
        assert_eq!(out, want);
        assert_eq!(st["prefetch"]["partial"], true, "byte {at}: a corrupt working set is not installed past the bad page: {st}");
        let installed = st["prefetch"]["ws_pages"].as_u64().unwrap();
        assert!(if at == 100 { installed == 0 } else { installed > 0 }, "byte {at}: {installed} pages installed before it");
        assert!(!WorkingSet::exists(&dir), "byte {at}: the corrupt working set is removed");
        let (out, st) = restore(&dir, "{}", "auto", &[]);
        assert_eq!((out.as_str(), &st["mode"]), (want.as_str(), &serde_json::json!("record")));
        let ws = WorkingSet::load(&dir, snap.id).expect("re-recorded");
        ws.read_pages(&dir, &snap.image.pages, true).expect("the new working set is valid");
        let (_, st) = restore(&dir, "{}", "auto", &[]);
        assert_eq!(st["mode"], "prefetch");
        assert_eq!(st["prefetch"]["partial"], false, "{st}");
    }

    // A working set recorded for another image is stale: ignored and re-recorded.
    let other = fresh_snapshot("helloworld", "other");
    std::fs::copy(dir.join(TRACE_FILE), other.join(TRACE_FILE)).unwrap();
    std::fs::copy(dir.join(PAGES_FILE), other.join(PAGES_FILE)).unwrap();
    let (out, st) = restore(&other, "{}", "auto", &[]);
    assert_eq!(out, want);
    assert_eq!(st["mode"], "record");
    let osnap = Snapshot::open(&other).unwrap();
    assert!(WorkingSet::load(&other, osnap.id).is_ok());

    // A truncated trace as well.
    let t = std::fs::read(other.join(TRACE_FILE)).unwrap();
    std::fs::write(other.join(TRACE_FILE), &t[..t.len() - 7]).unwrap();
    let (out, st) = restore(&other, "{}", "auto", &[]);
    assert_eq!((out, st["mode"].as_str().unwrap()), (want, "record"));
}

#[test]
fn faults_outside_the_working_set_are_counted_and_trigger_re_recording() {
    let dir = fresh_snapshot("multiinput", "mispredict");
    let (_, rec) = restore(&dir, r#"{"table":0}"#, "record", &[]);
    let recorded = rec["recorded_pages"].as_u64().unwrap();

    // Same input: almost everything comes from the working set.
    let (_, same) = restore(&dir, r#"{"table":0}"#, "prefetch", &[]);
    assert_eq!(same["mode"], "prefetch");
    let same_faults = same["page_faults"].as_u64().unwrap();

    // Another input touches another table: those faults are served lazily and counted.
    let (_, other) = restore(&dir, r#"{"table":5}"#, "prefetch", &["--reprofile-threshold", "0.99", "--no-ws-merge"]);
    let other_faults = other["page_faults"].as_u64().unwrap();
    assert!(other_faults > same_faults + 100, "table 5 should fault outside a table-0 working set: {other_faults} vs {same_faults}");
    assert!(WorkingSet::exists(&dir), "below the threshold the working set is kept");

    // Above the threshold the working set is dropped so the next restore re-records.
    let (_, _) = restore(&dir, r#"{"table":5}"#, "prefetch", &["--reprofile-threshold", "0.05"]);
    assert!(!WorkingSet::exists(&dir), "an unrepresentative working set must be dropped");
    let (_, again) = restore(&dir, r#"{"table":5}"#, "auto", &[]);
    assert_eq!(again["mode"], "record");
    assert!(recorded > 0);
}

#[test]
fn pages_a_prefetch_restore_faults_in_join_the_working_set() {
    let dir = fresh_snapshot("multiinput", "merge");
    let (want, _) = restore(&dir, r#"{"table":5}"#, "eager", &[]);
    restore(&dir, r#"{"table":0}"#, "record", &[]);
    let id = Snapshot::open(&dir).unwrap().id;
    let recorded = WorkingSet::load(&dir, id).unwrap().trace.len();

    // Table 5 is outside a table-0 working set: served lazily, then merged into it.
    let (got, first) = restore(&dir, r#"{"table":5}"#, "prefetch", &["--reprofile-threshold", "0.99"]);
    assert_eq!(got, want);
    let missed = first["page_faults"].as_u64().unwrap();
    assert!(missed > 100, "table 5 should fault outside a table-0 working set: {missed}");
    let merged = WorkingSet::load(&dir, id).unwrap().trace.len();
    assert!(merged >= recorded + 100, "working set {recorded} -> {merged} entries after {missed} misses");

    // The next restore with that input prefetches them: (almost) nothing faults.
    let (got, second) = restore(&dir, r#"{"table":5}"#, "prefetch", &["--reprofile-threshold", "0.99"]);
    assert_eq!(got, want);
    let again = second["page_faults"].as_u64().unwrap();
    assert!(again * 10 < missed, "still {again} faults after merging {missed}");
    // and the merged working set still serves the recorded input.
    let (got, _) = restore(&dir, r#"{"table":0}"#, "prefetch", &[]);
    assert_eq!(got, restore(&dir, r#"{"table":0}"#, "eager", &[]).0);
}

/// A call that releases memory holding image pages (MADV_DONTNEED) and writes it
/// again faults in fresh zero pages, which no working set can hold: they do not count
/// against it. (Counted, such a function looked unrepresentative at every call and its
/// working set was dropped and re-recorded at every other restore.)
#[test]
fn pages_released_since_the_restore_are_not_misses_of_the_working_set() {
    let code = scratch().join("released-code");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(
        code.join("handler.py"),
        "import mmap\n\
         N = 16 << 20\n\
         buf = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n\
         for i in range(0, N, 4096):\n    buf[i] = 1\n\
         def handler(event, context):\n\
         \x20   buf.madvise(mmap.MADV_DONTNEED)\n\
         \x20   for i in range(0, N, 4096):\n        buf[i] = 2\n\
         \x20   return {'sum': sum(buf[i] for i in range(0, N, 4096))}\n",
    )
    .unwrap();
    let dir = scratch().join("released-snap");
    ok(thaw(&["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", dir.to_str().unwrap()]));
    let (want, rec) = restore(&dir, "{}", "auto", &[]);
    assert_eq!(rec["mode"], "record", "{rec}");
    assert!(want.contains(&format!("{}", 2 * (16 << 20) / 4096)), "{want}");
    for i in 0..2 {
        let (out, st) = restore(&dir, "{}", "auto", &[]);
        assert_eq!(out, want);
        assert_eq!(st["mode"], "prefetch", "restore {i}: the working set was kept: {st}");
        assert!(st["page_faults"].as_u64().unwrap() >= 4096, "restore {i}: the released pages fault in again: {st}");
    }
}
