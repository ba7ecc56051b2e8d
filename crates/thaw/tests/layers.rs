//! Layered snapshots (issue #11) through the `thaw` CLI, as root: a base per runtime,
//! a diff per function. A diff restores to what a full image and a cold boot give;
//! layout churn between base and diff (released base pages, brk shrink and regrow,
//! mremap, mprotect, munmap, a new thread, a library from the bundle) restores
//! exactly; a base holds nothing of any function and never changes; a diff is never
//! restored over another base; a base a diff names is never removed.
//! (The corpus, tests/corpus.rs, also restores every probe from base + diff.)

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{bundle, ok, sample, scratch, stderr, stdout, thaw};

/// The tests share one base, and one of them swaps its files for a moment: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Python base of this test binary's data directory (built once).
fn base() -> &'static (String, PathBuf) {
    static BASE: OnceLock<(String, PathBuf)> = OnceLock::new();
    BASE.get_or_init(|| {
        let o = ok(thaw(&["base", "build", "--runtime", "python3"]));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        (v["id"].as_str().unwrap().to_string(), PathBuf::from(v["dir"].as_str().unwrap()))
    })
}

/// `thaw snapshot create` of `code` into a fresh `out`, with `vars` in its
/// environment; returns the create report.
fn create_env(code: &Path, handler: &str, out: &Path, extra: &[&str], vars: &[(&str, &str)]) -> serde_json::Value {
    let _ = std::fs::remove_dir_all(out);
    let mut args = vec!["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", handler, "--out", out.to_str().unwrap()];
    args.extend(extra);
    serde_json::from_str(stdout(&ok(common::thaw_env(vars, &args))).trim()).unwrap()
}

/// `thaw snapshot create` of `code` into a fresh `out`; returns the create report.
fn create(code: &Path, handler: &str, out: &Path, extra: &[&str]) -> serde_json::Value {
    create_env(code, handler, out, extra, &[])
}

/// [`create`] keeping the diff however little its base provides (bigheap's 211 MB heap
/// would otherwise make it a full image: `layered::MIN_BASE_SHARE_PERCENT`).
fn create_diff(code: &Path, handler: &str, out: &Path) -> serde_json::Value {
    create_env(code, handler, out, &[], &[("THAW_DIFF_MIN_BASE_SHARE", "0")])
}

fn restore(snap: &Path, paging: &str, payload: &str, invocations: u32) -> String {
    let n = invocations.to_string();
    stdout(&ok(thaw(&["snapshot", "restore", snap.to_str().unwrap(), "--paging", paging, "--payload", payload, "--invocations", &n, "--quiet"])))
}

/// `thaw` with `var` set to `value` in its environment.
fn thaw_with(var: &str, value: &str, args: &[&str]) -> std::process::Output {
    common::thaw_env(&[(var, value)], args)
}

/// `thaw` with the memory of a diff shared through its base's file
/// (`THAW_SHARE_MEMORY=base`: one file for every diff on the base in the process).
fn thaw_base_file(args: &[&str]) -> std::process::Output {
    thaw_with("THAW_SHARE_MEMORY", "base", args)
}

/// `thaw` giving back run by run, two injected madvise calls each (the way before
/// one process_madvise took them all; still what a kernel that refuses that gets).
fn thaw_run_by_run(args: &[&str]) -> std::process::Output {
    thaw_with("THAW_GIVE_BACK_BATCH", "0", args)
}

fn sha256_of(files: &[PathBuf]) -> String {
    use std::process::Command;
    let cat = files.iter().map(|f| format!("'{}'", f.display())).collect::<Vec<_>>().join(" ");
    let o = Command::new("sh").arg("-c").arg(format!("cat {cat} | sha256sum")).output().unwrap();
    String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap().to_string()
}

fn inspect(snap: &Path) -> serde_json::Value {
    serde_json::from_str(&stdout(&ok(thaw(&["snapshot", "inspect", snap.to_str().unwrap()])))).unwrap()
}

#[test]
fn a_diff_restores_what_a_full_image_and_a_boot_give() {
    let _one = serial();
    let (id, _) = base();
    // Every Python sample that answers (error and initerror fail on purpose), with its
    // manifest payload.
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(common::root().join("samples/manifest.json")).unwrap()).unwrap();
    let names = ["helloworld", "counter", "jsonserde", "pyaes", "bigheap", "htmlrender", "imagerotate", "lrserving", "multiinput", "stdlib", "heavyimports"];
    for name in names {
        let payload = manifest["functions"][name].get("payload").map_or("{}".to_string(), |p| p.to_string());
        let payload = payload.as_str();
        let code = sample(name);
        let diff = scratch().join(format!("{name}.diff"));
        let full = scratch().join(format!("{name}.full"));
        let d = create_diff(&code, "handler.handler", &diff);
        assert_eq!(d["base"].as_str(), Some(id.as_str()), "{name}: a base exists, so the snapshot is a diff on it: {d}");
        let f = create(&code, "handler.handler", &full, &["--no-base"]);
        assert!(f["base"].is_null(), "{name}: --no-base makes a full image");

        let booted = stdout(&ok(thaw(&["boot", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--payload", payload, "--quiet"])));
        let want = restore(&full, "eager", payload, 3);
        assert!(want.starts_with(booted.trim_end()), "{name}: the full image answers as a boot: {want:?} vs {booted:?}");
        for paging in ["lazy", "eager", "record", "prefetch"] {
            assert_eq!(restore(&diff, paging, payload, 3), want, "{name}: base + diff ({paging}) answers as the full image");
        }
        let n = "3";
        let shared = stdout(&ok(thaw(&["snapshot", "restore", diff.to_str().unwrap(), "--share-memory", "--payload", payload, "--invocations", n, "--quiet"])));
        assert_eq!(shared, want, "{name}: base + diff with shared memory answers as the full image");

        // Sizes: the diff stores only what differs from the base; together they hold
        // what the full image holds.
        let (di, fi) = (inspect(&diff), inspect(&full));
        let by = &di["pages_by_source"];
        assert!(by["base"].as_u64().unwrap() > 0 && by["diff"].as_u64().unwrap() > 0, "{name}: {di}");
        assert_eq!(di["diff_bytes"], di["stored_bytes"]);
        assert!(di["diff_bytes"].as_u64() < fi["stored_bytes"].as_u64(), "{name}: diff {} vs full {}", di["diff_bytes"], fi["stored_bytes"]);
        assert_eq!(fi["base"], serde_json::Value::Null);
        assert_eq!(fi["full_equivalent_bytes"], fi["stored_bytes"]);
    }
    // Every instance starts from the snapshot's state: a write in one is not seen by the next.
    let counter = scratch().join("counter.diff");
    assert!(restore(&counter, "lazy", "{}", 2).contains(r#""count": 2"#));
    let again = restore(&counter, "lazy", "{}", 1);
    assert!(again.contains(r#""count": 1"#) && !again.contains(r#""count": 2"#), "{again}");
}

/// Churns the memory layout at init, between the base and the diff, and checks at
/// every invocation that the restored process sees exactly what init left.
const CHURN: &str = r#""""Layout churn between base and diff (issue #11)."""
import ctypes
import mmap
import os
import threading

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.sbrk.restype = ctypes.c_void_p
LIBC.sbrk.argtypes = [ctypes.c_long]
LIBC.mremap.restype = ctypes.c_void_p
LIBC.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PAGE = 4096
PROT_RW, MAP_PRIVATE_ANON, MADV_DONTNEED = 3, 0x22, 4


def stack_range():
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[stack]"):
                a, b = line.split()[0].split("-")
                return int(a, 16), int(b, 16)


# 1. Release pages of the base: the part of the main stack that runtime start-up used
# deeply and nothing uses now (more than 64 KiB below its top, which init is far
# from). The base stores them (non-zero); after release they must read as zeros.
lo, hi = stack_range()
REL_LO, REL_HI = max(lo, hi - 512 * 1024), hi - 64 * 1024
RELEASED_NONZERO = sum(1 for a in range(REL_LO, REL_HI, PAGE) if any(ctypes.string_at(a, PAGE)))
LIBC.madvise(REL_LO, REL_HI - REL_LO, MADV_DONTNEED)

# 2. brk: grow by 64 pages, fill, shrink by 32, grow by 16 (the regrown pages are new: zero).
BRK0 = LIBC.sbrk(0)
LIBC.sbrk(64 * PAGE)
ctypes.memset(BRK0, 0x5A, 64 * PAGE)
LIBC.sbrk(-32 * PAGE)
LIBC.sbrk(16 * PAGE)

# 3. mmap, fill, mremap (moved and grown), mprotect part read-only, munmap a hole.
A = LIBC.mmap(None, 8 * PAGE, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
ctypes.memset(A, 0x33, 8 * PAGE)
B = LIBC.mremap(A, 8 * PAGE, 32 * PAGE, 1)  # MREMAP_MAYMOVE
ctypes.memset(B + 8 * PAGE, 0x44, 4 * PAGE)
LIBC.mprotect(B, 2 * PAGE, 1)  # PROT_READ
LIBC.munmap(B + 16 * PAGE, 4 * PAGE)
MAPS_AT_INIT = [l.split()[0] for l in open("/proc/self/maps") if "rw" in l or "r--p" in l]

# 4. A thread that waits, and a library loaded from the bundle.
EV = threading.Event()
T = threading.Thread(target=EV.wait, daemon=True, name="churn-waiter")
T.start()
ZLIB = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libz.so.1"))
ZLIB.zlibVersion.restype = ctypes.c_char_p
ZVER = ZLIB.zlibVersion().decode()


LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]


def released_after_restore():
    """A page of an area mapped from the snapshot's shared memory file, holding data
    from the image, written and then released (MADV_DONTNEED) after the restore must
    read as zeros, never as the file's page."""
    lines = [l.split() for l in open("/proc/self/maps") if "shared-mem" in l]
    shared = [tuple(int(x, 16) for x in l[0].split("-")) for l in lines]
    if not shared:
        return "no memory area is mapped from the shared memory file"
    # The file is not the function's to read, and other snapshots' files are not there.
    path = lines[0][5]
    try:
        open(path, "rb").close()
        return "the function can open the shared memory file %s" % path
    except PermissionError:
        pass
    if os.listdir(os.path.dirname(path)) != [os.path.basename(path)]:
        return "other shared memory files are visible: %r" % os.listdir(os.path.dirname(path))
    for size in (1 << 16, 1 << 15, 1 << 14, 3 * PAGE, 1 << 17):
        for _ in range(40):
            p = LIBC.malloc(size)
            page = (p + PAGE - 1) & ~(PAGE - 1)
            while page + PAGE <= p + size:
                if any(a <= page < b for a, b in shared) and any(ctypes.string_at(page, PAGE)):
                    ctypes.memset(page, 0x77, PAGE)
                    LIBC.madvise(page, PAGE, MADV_DONTNEED)
                    back = ctypes.string_at(page, PAGE)
                    return None if not any(back) else "a released page reads %r" % back[:16]
                page += PAGE
    return "setup: no non-zero page of a shared memory area found"


def handler(event, context):
    errors = []
    if isinstance(event, dict) and event.get("shared"):
        e = released_after_restore()
        if e:
            errors.append(e)
    if RELEASED_NONZERO == 0:
        errors.append("setup: the released stack range held no base data")
    back = sum(1 for a in range(REL_LO, REL_HI, PAGE) if any(ctypes.string_at(a, PAGE)))
    if back:
        errors.append("%d released pages read non-zero" % back)
    if LIBC.sbrk(0) != BRK0 + 48 * PAGE:
        errors.append("brk moved")
    data = ctypes.string_at(BRK0, 48 * PAGE)
    if data[: 32 * PAGE] != b"\x5a" * (32 * PAGE) or any(data[32 * PAGE :]):
        errors.append("brk contents differ")
    if ctypes.string_at(B, 8 * PAGE) != b"\x33" * (8 * PAGE) or ctypes.string_at(B + 8 * PAGE, 4 * PAGE) != b"\x44" * (4 * PAGE):
        errors.append("remapped contents differ")
    if any(ctypes.string_at(B + 12 * PAGE, 4 * PAGE)):
        errors.append("grown part not zero")
    maps = {l.split()[0]: l.split()[1] for l in open("/proc/self/maps")}
    if maps.get("%x-%x" % (B, B + 2 * PAGE)) != "r--p":
        errors.append("mprotect lost: %r" % maps.get("%x-%x" % (B, B + 2 * PAGE)))
    if any(k.startswith("%x-" % (B + 16 * PAGE)) for k in maps):
        errors.append("the munmapped hole is mapped")
    if not T.is_alive() or "churn-waiter" not in [t.name for t in threading.enumerate()]:
        errors.append("thread lost")
    if ZLIB.zlibVersion().decode() != ZVER:
        errors.append("library from the bundle differs")
    return "PASS" if not errors else "FAIL: " + "; ".join(errors)
"#;

#[test]
fn layout_churn_between_base_and_diff_restores_exactly() {
    let _one = serial();
    base();
    let code = bundle("churn", &[("handler.py", CHURN)]);
    std::fs::create_dir_all(code.join("lib")).unwrap();
    let zlib = ["/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1"].into_iter().find(|p| Path::new(p).exists()).unwrap();
    std::fs::copy(zlib, code.join("lib/libz.so.1")).unwrap();
    let booted = stdout(&ok(thaw(&["boot", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--quiet"])));
    assert_eq!(booted.trim(), r#""PASS""#, "the churn function passes on a cold boot");
    let diff = scratch().join("churn.diff");
    let d = create(&code, "handler.handler", &diff, &[]);
    assert!(d["base"].is_string(), "{d}");
    for paging in ["lazy", "eager", "record", "prefetch"] {
        // The restored instance maps its memory from the snapshot's shared memory file:
        // a page released after the restore reads as zeros too.
        let shared = stdout(&ok(thaw(&["snapshot", "restore", diff.to_str().unwrap(), "--paging", paging, "--share-memory", "--payload", r#"{"shared": true}"#, "--invocations", "2", "--quiet"])));
        assert_eq!(shared.lines().collect::<Vec<_>>(), [r#""PASS""#, r#""PASS""#], "base + diff, shared memory ({paging})");
        // The base's file: the diff's own pages copied, the base's mapped from it.
        let base_file = stdout(&ok(thaw_base_file(&["snapshot", "restore", diff.to_str().unwrap(), "--paging", paging, "--share-memory", "--payload", r#"{"shared": true}"#, "--invocations", "2", "--quiet"])));
        assert_eq!(base_file.lines().collect::<Vec<_>>(), [r#""PASS""#, r#""PASS""#], "base + diff, the base's memory file ({paging})");
        let own = restore(&diff, paging, "{}", 2);
        assert_eq!(own.lines().collect::<Vec<_>>(), [r#""PASS""#, r#""PASS""#], "base + diff ({paging})");
    }
    // In a sandbox prepared ahead (the node's default): the code and the shared memory
    // file are attached to it at the restore; the same semantics and the same isolation
    // (the function cannot open the file and sees no other).
    let stats = scratch().join("churn-prepared.json");
    let out = ok(thaw(&["snapshot", "restore", diff.to_str().unwrap(), "--paging", "prefetch", "--share-memory", "--prepared-sandbox",
        "--payload", r#"{"shared": true}"#, "--invocations", "2", "--quiet", "--stats", stats.to_str().unwrap()]));
    assert_eq!(stdout(&out).lines().collect::<Vec<_>>(), [r#""PASS""#, r#""PASS""#], "base + diff, shared memory, prepared sandbox");
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(st["prepared_sandbox"], true, "{st}");
}

#[test]
fn a_base_holds_nothing_of_a_function_and_never_changes() {
    let _one = serial();
    let (id, dir) = base();
    let files = [dir.join("state.bin"), dir.join("pages.img")];
    assert_eq!(&sha256_of(&files), id, "a base's id is the sha256 of its state.bin and pages.img");
    let code = bundle("sentinel_fn_7c1e", &[("sentinel_mod_7c1e.py", "SECRET = __import__('os').environ['SENTINEL_SECRET']\ndef handler(e, c):\n    return {'n': len(SECRET)}\n")]);
    let diff = scratch().join("sentinel.diff");
    let d = create(&code, "sentinel_mod_7c1e.handler", &diff, &["--env", "SENTINEL_SECRET=s3cr3t-7c1e-value", "--name", "sentinel-name-7c1e"]);
    assert!(d["base"].is_string(), "{d}");
    let contains = |path: &Path, needle: &str| {
        let bytes = std::fs::read(path).unwrap();
        bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
    };
    // The search finds the sentinels where they are (the diff), so their absence from the base means something.
    assert!(contains(&diff.join("pages.img"), "s3cr3t-7c1e-value"), "the secret is in the diff's memory");
    for f in files.iter().chain([&dir.join("base.json")]) {
        for needle in ["s3cr3t-7c1e-value", "sentinel-name-7c1e", "sentinel_mod_7c1e", "sentinel_fn_7c1e"] {
            assert!(!contains(f, needle), "{} holds {needle}", f.display());
        }
    }
    for _ in 0..5 {
        assert!(restore(&diff, "lazy", "{}", 2).contains(r#""n": 17"#));
    }
    assert_eq!(&sha256_of(&files), id, "restores never change the base");
}

#[test]
fn a_diff_is_refused_over_another_base_and_a_named_base_is_kept() {
    let _one = serial();
    let (id, dir) = base();
    let diff = scratch().join("refuse.diff");
    create(&sample("helloworld"), "handler.handler", &diff, &[]);
    let rm = thaw(&["base", "rm", id]);
    assert!(!rm.status.success() && stderr(&rm).contains("still used by"), "{}", stderr(&rm));
    assert!(dir.join("pages.img").is_file());

    // Another image in the base's place: refused before anything runs.
    let full = scratch().join("refuse.full");
    create(&sample("counter"), "handler.handler", &full, &["--no-base"]);
    let saved: Vec<(&str, Vec<u8>)> = ["state.bin", "pages.img"].map(|f| (f, std::fs::read(dir.join(f)).unwrap())).into();
    for (f, _) in &saved {
        std::fs::copy(full.join(f), dir.join(f)).unwrap();
    }
    let o = thaw(&["snapshot", "restore", diff.to_str().unwrap(), "--paging", "lazy", "--quiet"]);
    for (f, bytes) in &saved {
        std::fs::write(dir.join(f), bytes).unwrap();
    }
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot be restored over base") && stderr(&o).contains("another base"), "{}", stderr(&o));
    // Only its state.bin another (its pages.img of the size the diff expects): the diff
    // places its base pages without the base's state, whose check beside the restore
    // still refuses it before the function runs.
    std::fs::copy(full.join("state.bin"), dir.join("state.bin")).unwrap();
    let o = thaw(&["snapshot", "restore", diff.to_str().unwrap(), "--paging", "prefetch", "--quiet"]);
    std::fs::write(dir.join("state.bin"), &saved[0].1).unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot be restored over base") && stderr(&o).contains("changed since the diff was captured"), "{}", stderr(&o));
    assert!(restore(&diff, "lazy", "{}", 1).contains("hello"), "with its base back, the diff restores");

    // A base no diff names is removed.
    let other: serde_json::Value = serde_json::from_str(stdout(&ok(thaw(&["base", "build", "--runtime", "python3", "--memory", "256"]))).trim()).unwrap();
    assert_ne!(other["id"].as_str(), Some(id.as_str()), "another memory class is another base");
    ok(thaw(&["base", "rm", other["id"].as_str().unwrap()]));
    assert!(!Path::new(other["dir"].as_str().unwrap()).exists());
    let listed = stdout(&ok(thaw(&["base", "list"])));
    assert!(listed.contains(id.as_str()) && !listed.contains(other["id"].as_str().unwrap()), "{listed}");

    // Runtimes that cannot be layered say why.
    let custom = thaw(&["base", "build", "--runtime", "provided.al2023"]);
    assert!(!custom.status.success() && stderr(&custom).contains("cannot have a base yet"), "{}", stderr(&custom));
}

/// The answers of `out` (a JSON line each) without what differs between two runs of
/// the same instance by design: the request id, and a `random` part (random bytes,
/// timings) but for its invocation count.
fn comparable(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            if let Some(o) = v.as_object_mut() {
                o.remove("requestId");
                if let Some(r) = o.get_mut("random") {
                    *r = r["invocations"].clone();
                }
            }
            v
        })
        .collect()
}

/// Node.js has bases too (issue #31): the shim starts V8 and the runtime, warms up,
/// reports ready with no function loaded and loads the handler when `load` names
/// it. Every built Node.js sample's diff restores to what its full image and a boot
/// give, in every paging mode and with shared memory, and stores less than its full
/// image.
#[test]
fn a_nodejs_diff_restores_what_a_full_image_and_a_boot_give() {
    let _one = serial();
    let o = ok(thaw(&["base", "build", "--runtime", "nodejs20.x"]));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["runtime"].as_str(), Some("nodejs20.x"), "{v}");
    for (name, payload) in [("helloworld", r#"{"name":"smoke"}"#), ("imageresize", r#"{"width":80}"#), ("features", "{}")] {
        let code = common::root().join("build/samples/nodejs").join(name);
        assert!(code.join("index.js").is_file(), "sample nodejs/{name} not built: run scripts/build-samples.sh");
        let diff = scratch().join(format!("node-{name}.diff"));
        let full = scratch().join(format!("node-{name}.full"));
        let d = create(&code, "index.handler", &diff, &["--runtime", "nodejs20.x"]);
        assert_eq!(d["base"].as_str(), Some(id.as_str()), "nodejs/{name}: a base exists, so the snapshot is a diff on it: {d}");
        let f = create(&code, "index.handler", &full, &["--runtime", "nodejs20.x", "--no-base"]);
        assert!(f["base"].is_null(), "nodejs/{name}: --no-base makes a full image");
        let booted = comparable(&stdout(&ok(thaw(&["boot", "--code", code.to_str().unwrap(), "--handler", "index.handler", "--runtime", "nodejs20.x", "--payload", payload, "--quiet"]))));
        let want = comparable(&restore(&full, "eager", payload, 3));
        assert_eq!((want.len(), &want[..1]), (3, &booted[..]), "nodejs/{name}: the full image answers as a boot");
        for paging in ["lazy", "eager", "record", "prefetch"] {
            assert_eq!(comparable(&restore(&diff, paging, payload, 3)), want, "nodejs/{name}: base + diff ({paging}) answers as the full image");
        }
        let shared = stdout(&ok(thaw(&["snapshot", "restore", diff.to_str().unwrap(), "--share-memory", "--payload", payload, "--invocations", "3", "--quiet"])));
        assert_eq!(comparable(&shared), want, "nodejs/{name}: base + diff with shared memory answers as the full image");
        let (di, fi) = (inspect(&diff), inspect(&full));
        assert!(di["pages_by_source"]["base"].as_u64().unwrap() > 0, "nodejs/{name}: {di}");
        assert!(di["diff_bytes"].as_u64() < fi["stored_bytes"].as_u64(), "nodejs/{name}: diff {} vs full {}", di["diff_bytes"], fi["stored_bytes"]);
        eprintln!("nodejs/{name}: diff {} bytes, full {} bytes", di["diff_bytes"], fi["stored_bytes"]);
        if name == "helloworld" {
            // The function's own pages only: the shim collects the young generation
            // alone before a diff's READY (a full GC would compact the base's old space
            // into the diff: 38% of the full image instead of ~22%).
            let (diff, full) = (di["diff_bytes"].as_f64().unwrap(), fi["stored_bytes"].as_f64().unwrap());
            assert!(diff < 0.3 * full, "nodejs/helloworld: diff {diff} bytes is {:.0}% of the full image's {full}", 100.0 * diff / full);
        }
    }
    // NODE_OPTIONS is read as node starts, before a base knows the function: such a
    // function's snapshot is a full image (and its options hold).
    let code = common::root().join("build/samples/nodejs/helloworld");
    let opts = scratch().join("node-options.snap");
    let o = create(&code, "index.handler", &opts, &["--runtime", "nodejs20.x", "--env", "NODE_OPTIONS=--max-old-space-size=200"]);
    assert!(o["base"].is_null(), "{o}");
    assert!(restore(&opts, "lazy", r#"{"name":"opts"}"#, 1).contains("Hello, opts!"));
}

/// Java has bases too (issue #31): the JVM and the runtime start with the shim alone
/// on the class path, warm up and wait; `load` gives the function's environment, and
/// its classes come from the bundle (classes, lib/*.jar, *.jar), appended to the system
/// class loader's path as in a full image's JVM. Every Java sample's diff restores to what its full image and a boot
/// give, in every paging mode, and stores less than its full image.
#[test]
fn a_java_diff_restores_what_a_full_image_and_a_boot_give() {
    let _one = serial();
    let o = ok(thaw(&["base", "build", "--runtime", "java17"]));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["runtime"].as_str(), Some("java17"), "{v}");
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(common::root().join("samples/manifest.json")).unwrap()).unwrap();
    // helloworld: classes; jsonhandler: classes and lib/*.jar; features: one jar at the root.
    for name in ["helloworld", "jsonhandler", "features", "matmul"] {
        let entry = &manifest["functions"][format!("java/{name}")];
        let handler = entry["handler"].as_str().unwrap();
        let payload = entry.get("payload").map_or("{}".to_string(), |p| p.to_string());
        let payload = payload.as_str();
        let code = common::root().join("build/samples/java").join(name);
        assert!(code.is_dir(), "sample java/{name} not built: run scripts/build-samples.sh");
        let diff = scratch().join(format!("java-{name}.diff"));
        let full = scratch().join(format!("java-{name}.full"));
        let d = create(&code, handler, &diff, &["--runtime", "java17"]);
        assert_eq!(d["base"].as_str(), Some(id.as_str()), "java/{name}: a base exists, so the snapshot is a diff on it: {d}");
        let f = create(&code, handler, &full, &["--runtime", "java17", "--no-base"]);
        assert!(f["base"].is_null(), "java/{name}: --no-base makes a full image");
        let booted = comparable(&stdout(&ok(thaw(&["boot", "--code", code.to_str().unwrap(), "--handler", handler, "--runtime", "java17", "--payload", payload, "--quiet"]))));
        let want = comparable(&restore(&full, "eager", payload, 2));
        assert_eq!((want.len(), &want[..1]), (2, &booted[..]), "java/{name}: the full image answers as a boot");
        for paging in ["lazy", "prefetch"] {
            assert_eq!(comparable(&restore(&diff, paging, payload, 2)), want, "java/{name}: base + diff ({paging}) answers as the full image");
        }
        let (di, fi) = (inspect(&diff), inspect(&full));
        assert!(di["pages_by_source"]["base"].as_u64().unwrap() > 0, "java/{name}: {di}");
        assert!(di["diff_bytes"].as_u64() < fi["stored_bytes"].as_u64(), "java/{name}: diff {} vs full {}", di["diff_bytes"], fi["stored_bytes"]);
        eprintln!("java/{name}: diff {} bytes, full {} bytes", di["diff_bytes"], fi["stored_bytes"]);
    }
    // A function's environment reaches it through the base (System.getenv, and a child
    // process's environment), and its class is the system class loader's with the bundle
    // on java.class.path, as in a full image's JVM; THAW_JAVA_FUNCTION_LOADER=own (the
    // baseline of bench/layers.py) gives it a loader of its own, off that path.
    let src = bundle("java-env", &[("EnvEcho.java", r#"package example;
import java.util.Map;
public class EnvEcho {
    public String handle(Map<String, Object> event) throws Exception {
        Process p = new ProcessBuilder("/bin/sh", "-c", "printf %s \"$GREETING\"").start();
        String child = new String(p.getInputStream().readAllBytes());
        String onPath = String.valueOf(System.getProperty("java.class.path").contains("/var/task"));
        return System.getenv("GREETING") + "|" + child + "|" + EnvEcho.class.getClassLoader().getName() + "|" + onPath;
    }
}
"#)]);
    let javac = std::process::Command::new("/usr/lib/jvm/java-17-openjdk-amd64/bin/javac").arg("-d").arg(&src).arg(src.join("EnvEcho.java")).output().unwrap();
    assert!(javac.status.success(), "{}", String::from_utf8_lossy(&javac.stderr));
    let envsnap = scratch().join("java-env.diff");
    let e = create(&src, "example.EnvEcho::handle", &envsnap, &["--runtime", "java17", "--env", "GREETING=hej"]);
    assert_eq!(e["base"].as_str(), Some(id.as_str()), "{e}");
    let answer = restore(&envsnap, "lazy", "{}", 1);
    assert!(answer.contains("hej|hej|app|true"), "{answer}");
    let full = scratch().join("java-env.full");
    create(&src, "example.EnvEcho::handle", &full, &["--runtime", "java17", "--env", "GREETING=hej", "--no-base"]);
    assert_eq!(restore(&full, "lazy", "{}", 1), answer, "the diff's function sees the JVM a full image's does");
    let own = scratch().join("java-env-own.diff");
    create(&src, "example.EnvEcho::handle", &own, &["--runtime", "java17", "--env", "GREETING=hej", "--env", "THAW_JAVA_FUNCTION_LOADER=own"]);
    let answer = restore(&own, "lazy", "{}", 1);
    assert!(answer.contains("hej|hej|function|false"), "{answer}");

    // The JVM's options, read as it starts, give a full image.
    let code = common::root().join("build/samples/java/helloworld");
    let opts = scratch().join("java-options.snap");
    let o = create(&code, "example.Hello", &opts, &["--runtime", "java17", "--env", "JAVA_TOOL_OPTIONS=-Xss1m"]);
    assert!(o["base"].is_null(), "{o}");
    assert!(restore(&opts, "lazy", r#"{"name":"opts"}"#, 1).contains("opts"));
}

#[test]
fn instances_of_a_diff_share_the_pages_they_do_not_write() {
    let _one = serial();
    base();
    let code = sample("pyaes");
    let (diff, full) = (scratch().join("share.diff"), scratch().join("share.full"));
    create(&code, "handler.handler", &diff, &[]);
    create(&code, "handler.handler", &full, &["--no-base"]);
    let memory = |snap: &Path| -> serde_json::Value {
        restore(snap, "record", "{}", 1);
        let o = ok(thaw(&["snapshot", "memory", snap.to_str().unwrap(), "--instances", "4"]));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let (d, f) = (memory(&diff), memory(&full));
    assert!(d["shared_memory"].is_string() && f["shared_memory"].is_null(), "{d}\n{f}");
    assert!(d["mean"]["pages_shared"].as_u64().unwrap() > 0, "{d}");
    assert_eq!(f["mean"]["pages_shared"].as_u64(), Some(0));
    // Pages mapped from the shared file and never written are not the instance's own.
    let uss = |v: &serde_json::Value| v["mean"]["uss"].as_u64().unwrap();
    assert!(uss(&d) < uss(&f), "private memory per instance: diff {} vs full {}", uss(&d), uss(&f));
    // A closed snapshot's shared memory file is gone: none is left by a finished process.
    let left: Vec<String> = std::fs::read_dir("/run/thaw/shared-mem")
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let dead = |n: &String| n.split('-').next().and_then(|p| p.parse::<u32>().ok()).is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
    assert!(!left.iter().any(dead), "{left:?}");
}

/// A function for the give-back test: data from its init, pages it writes and writes
/// back as they were (their copies are given back), pages it changes for good, and
/// pages it releases (zeros from then on) or releases and writes back as they were.
/// Every call checks what every earlier call left.
const GIVE_BACK: &str = r#"
import ctypes, hashlib, os

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE, MADV_DONTNEED = 4096, 4
N = 64
# Page-aligned data of the init (bytearray's buffer comes from malloc: mmapped).
BUF = bytearray(os.urandom((N + 1) * PAGE))
BASE = ctypes.addressof((ctypes.c_char * len(BUF)).from_buffer(BUF))
AT = (BASE + PAGE - 1) & ~(PAGE - 1)
ORIG = ctypes.string_at(AT, N * PAGE)
DIGEST = hashlib.sha256(ORIG).hexdigest()
CALLS = 0
# Page k: 0-15 read only; 16-31 written and written back; 32-39 changed for good;
# 40-47 released (zeros); 48-55 released and written back as they were.


def page(k):
    return ctypes.string_at(AT + k * PAGE, PAGE)


def orig(k):
    return ORIG[k * PAGE:(k + 1) * PAGE]


def handler(event, context):
    global CALLS
    errors = []
    shared = [tuple(int(x, 16) for x in l.split()[0].split("-")) for l in open("/proc/self/maps") if "shared-mem" in l]
    if not any(a <= AT and AT + N * PAGE <= b for a, b in shared):
        errors.append("setup: the data is not mapped from the shared memory file")
    for k in range(N):
        want = orig(k)
        if CALLS and 32 <= k < 40:
            want = bytes([CALLS & 255]) * PAGE
        elif CALLS and 40 <= k < 48:
            want = bytes(PAGE)
        if page(k) != want:
            errors.append("page %d differs after %d calls" % (k, CALLS))
    CALLS += 1
    for k in range(16, 32):
        old = page(k)
        ctypes.memset(AT + k * PAGE, 0x5A, PAGE)
        ctypes.memmove(AT + k * PAGE, old, PAGE)
    for k in range(32, 40):
        ctypes.memset(AT + k * PAGE, CALLS & 255, PAGE)
    for k in range(40, 56):
        LIBC.madvise(AT + k * PAGE, PAGE, MADV_DONTNEED)
        if any(page(k)):
            errors.append("released page %d reads non-zero" % k)
    for k in range(48, 56):
        ctypes.memmove(AT + k * PAGE, orig(k), PAGE)
    return "PASS" if not errors else "FAIL: " + "; ".join(errors[:6])
"#;

/// Giving back the pages an idle instance copied and holds unchanged (issue #31):
/// nothing the instance sees changes (its calls find their data, their changes, and
/// zeros where they released memory; its state, page by page, is the same before
/// and after), and its private memory shrinks.
#[test]
fn unchanged_copies_are_given_back_and_nothing_the_instance_sees_changes() {
    let _one = serial();
    base();
    let code = bundle("give-back", &[("handler.py", GIVE_BACK)]);
    let diff = scratch().join("give-back.diff");
    let d = create(&code, "handler.handler", &diff, &[]);
    assert!(d["base"].is_string(), "{d}");
    for (paging, base_file, batched) in [("lazy", false, true), ("prefetch", false, true), ("prefetch", true, true), ("prefetch", false, false)] {
        let dir = scratch().join(format!("give-back-{paging}-{base_file}-{batched}"));
        let _ = std::fs::remove_dir_all(&dir);
        let stats = dir.join("stats.json");
        std::fs::create_dir_all(&dir).unwrap();
        let run = match (base_file, batched) {
            (true, _) => thaw_base_file,
            (false, true) => thaw,
            (false, false) => thaw_run_by_run,
        };
        let out = ok(run(&["snapshot", "restore", diff.to_str().unwrap(), "--paging", paging, "--share-memory", "--give-back",
            "--invocations", "4", "--dump-state", dir.to_str().unwrap(), "--quiet", "--stats", stats.to_str().unwrap()]));
        assert_eq!(stdout(&out).lines().collect::<Vec<_>>(), [r#""PASS""#; 4], "{paging}: every call finds what the earlier ones left");
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        let gb = st["give_backs"].as_array().unwrap();
        assert_eq!(gb.len(), 3, "{st}");
        for g in gb {
            // At least the 16 pages written back as they were and the 8 released and
            // written back; never the 8 changed for good.
            let (copied, given) = (g["copied"].as_u64().unwrap(), g["given_back"].as_u64().unwrap());
            // (The base's file holds none of the function's own data: only base pages,
            // the runtime's, go back there.)
            let least = if base_file { 1 } else { 24 };
            assert!(given >= least && given + 8 <= copied, "{paging} {base_file}: {g}");
            // Every run in one process_madvise (this kernel allows it on oneself), or
            // run by run when asked.
            assert_eq!(g["batched"], batched, "{paging} {base_file}: {g}");
        }
        // The state before and after each give-back, fact by fact (layout, every page,
        // registers, descriptors, signals).
        for i in 1..4 {
            let read = |name: String| -> std::collections::BTreeMap<String, String> {
                serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
            };
            let (before, after) = (read(format!("state-{i}-before-give-back.json")), read(format!("state-{i}.json")));
            // The kernel writes the CPU a thread runs on into its rseq area, in its TCB
            // (at fs_base), whenever the thread runs again: set aside, as in reset.rs.
            let tcb = common::tcb_pages(&before);
            let differ: Vec<(&String, Option<&String>, Option<&String>)> = before
                .keys()
                .chain(after.keys())
                .filter(|k| !tcb.contains(k) && before.get(*k) != after.get(*k))
                .map(|k| (k, before.get(k), after.get(k)))
                .collect();
            assert!(!tcb.is_empty() && differ.is_empty(), "{paging} {base_file} {batched}: give-back {i} changed {differ:?}");
        }
    }
    // Memory: the same instances hold fewer pages of their own once they gave back.
    restore(&diff, "record", "{}", 1);
    let memory = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["snapshot", "memory", diff.to_str().unwrap(), "--instances", "2", "--paging", "prefetch"];
        args.extend(extra);
        serde_json::from_str(&stdout(&ok(thaw(&args)))).unwrap()
    };
    let (kept, given) = (memory(&[]), memory(&["--give-back"]));
    let uss = |v: &serde_json::Value| v["mean"]["uss"].as_u64().unwrap();
    assert!(uss(&given) + 24 * 4096 <= uss(&kept), "USS per instance: {} given back vs {} kept", uss(&given), uss(&kept));
}

/// Two functions' diffs on one base, instances of each alive together in one process:
/// with the base's memory file (`THAW_SHARE_MEMORY=base`) one file holds the base's
/// pages for both (the base counted once), where a file per snapshot holds them once
/// per function; and the instances answer as ever.
#[test]
fn diffs_on_one_base_share_its_memory_file() {
    let _one = serial();
    base();
    let (a, b) = (scratch().join("xfn-hello.diff"), scratch().join("xfn-counter.diff"));
    create(&sample("helloworld"), "handler.handler", &a, &[]);
    create(&sample("counter"), "handler.handler", &b, &[]);
    for s in [&a, &b] {
        restore(s, "record", "{}", 1);
    }
    let args = ["snapshot", "memory", a.to_str().unwrap(), b.to_str().unwrap(), "--instances", "2", "--paging", "prefetch"];
    let per_snapshot: serde_json::Value = serde_json::from_str(&stdout(&ok(thaw(&args)))).unwrap();
    let base_file: serde_json::Value = serde_json::from_str(&stdout(&ok(thaw_base_file(&args)))).unwrap();
    assert_eq!(per_snapshot["shared_memory_files"], 2, "{per_snapshot}");
    assert_eq!(base_file["shared_memory_files"], 1, "{base_file}");
    let shared = |v: &serde_json::Value| v["shared_memory_bytes"].as_u64().unwrap();
    // Both functions' instances touch the same ~1.3 MB of the base: once, not twice.
    assert!(shared(&base_file) * 2 < shared(&per_snapshot), "shared memory: base file {} vs a file per snapshot {}", shared(&base_file), shared(&per_snapshot));
    assert!(base_file["mean"]["pages_shared"].as_u64().unwrap() > 0, "{base_file}");
}

/// `thaw` with a data directory of its own (no base built in it yet).
fn thaw_in(data: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_thaw")).env("THAW_DATA_DIR", data).env_remove("THAW_LOG").args(args).output().unwrap()
}

#[test]
fn snapshots_are_layered_by_default_and_a_base_that_cannot_be_built_gives_a_full_image() {
    let code = sample("helloworld");
    let data = scratch().join("fresh-data");
    let data = data.as_path();
    let create_in = |data: &Path, out: &str| {
        let out = scratch().join(out);
        let _ = std::fs::remove_dir_all(&out);
        let o = ok(thaw_in(data, &["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", out.to_str().unwrap()]));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        (v, stderr(&o), out)
    };
    // A base an older shim built for this shape, that no diff names: removed once the
    // new base is built; one for another memory class is kept.
    let stale = |id: &str, shims: &str, memory: u64| {
        let dir = data.join("bases").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let meta = serde_json::json!({"id": id, "key": {"runtime": "python3", "shims": shims, "memory_mb": memory, "cpu_millis": 1000, "format": 18},
                                      "created_unix_ms": 1, "stored_pages": 0, "bytes": 0});
        std::fs::write(dir.join("base.json"), meta.to_string()).unwrap();
        dir
    };
    let old_shims = stale(&"a".repeat(64), "runtimes-00000000", 512);
    let other_class = stale(&"b".repeat(64), "runtimes-00000000", 256);
    // Three creates at once on a machine without a base: the base is built once, and
    // every snapshot is a diff on it.
    let made: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3).map(|i| s.spawn(move || create_in(data, &format!("default-{i}")))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ids: std::collections::BTreeSet<_> = made.iter().map(|(v, _, _)| v["base"].as_str().expect("a diff, without any flag").to_string()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(made.iter().filter(|(_, e, _)| e.contains("building the python3 base")).count(), 1, "built once: {made:?}");
    assert!(!old_shims.exists() && other_class.exists(), "the superseded base is removed, another shape's kept");
    std::fs::remove_dir_all(&other_class).unwrap();
    let bases = ok(thaw_in(data, &["base", "list"]));
    assert_eq!(stdout(&bases).lines().count(), 1, "{}", stdout(&bases));
    let snap = made[0].2.to_str().unwrap();
    let o = ok(thaw_in(data, &["snapshot", "restore", snap, "--payload", r#"{"name":"layered"}"#, "--quiet"]));
    assert!(stdout(&o).contains("hello, layered"), "{}", stdout(&o));

    // A base that cannot be built (its directory is a file): a full image, and a warning
    // saying why.
    let broken = scratch().join("broken-data");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("bases"), b"not a directory").unwrap();
    let (v, err, out) = create_in(&broken, "fallback");
    assert!(v["base"].is_null(), "{v}");
    assert!(err.contains("warning: no python3 base") && err.contains("making a full image"), "{err}");
    let o = ok(thaw_in(&broken, &["snapshot", "restore", out.to_str().unwrap(), "--payload", r#"{"name":"full"}"#, "--quiet"]));
    assert!(stdout(&o).contains("hello, full"), "{}", stdout(&o));
}

#[test]
fn a_function_its_base_provides_little_of_is_captured_as_a_full_image() {
    let _g = serial();
    base();
    // 192 MiB of its own (non-zero) at init: the base's ~1,400 pages are ~2.7% of it.
    let code = bundle(
        "ownheap",
        &[("handler.py", "HEAP = bytearray(b\"\\x01\") * (192 << 20)\nHEAP[12345] = 7\n\ndef handler(event, context):\n    HEAP[1] += 1\n    return {\"len\": len(HEAP), \"at\": HEAP[12345], \"first\": HEAP[1]}\n")],
    );
    let out = scratch().join("ownheap.snap");
    let o = ok(thaw(&["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--out", out.to_str().unwrap()]));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(v["base"].is_null(), "a full image: {v}");
    let why = v["full_image_because"].as_str().unwrap_or_default();
    assert!(why.contains("could provide at most") && why.contains("under 5%"), "{v}");
    assert!(stderr(&o).contains("a full image rather than a diff"), "{}", stderr(&o));
    assert_eq!(v["capture"]["pages_from_base"], 0, "{v}");
    assert!(inspect(&out)["base"].is_null(), "the image names no base");
    let want = r#"{"len": 201326592, "at": 7, "first": 2}"#;
    for paging in ["lazy", "record", "prefetch"] {
        assert_eq!(restore(&out, paging, "{}", 1).trim(), want, "{paging}");
    }
    // THAW_DIFF_MIN_BASE_SHARE=0 keeps the diff (the benchmark's baseline): it answers the same.
    let kept = scratch().join("ownheap-kept.snap");
    let v = create_diff(&code, "handler.handler", &kept);
    assert_eq!(v["base"].as_str(), Some(base().0.as_str()), "{v}");
    assert!(v["capture"]["pages_from_base"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(restore(&kept, "prefetch", "{}", 1).trim(), want);
}
