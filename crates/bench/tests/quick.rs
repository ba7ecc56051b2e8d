//! `thaw bench --quick` end to end, as root, on helloworld (needs the samples built by
//! scripts/build-samples.sh). Checks the JSON, not timings: every mode has numbers,
//! prefetch faults no more than lazy, and every mode returned the same result (the
//! harness aborts if they disagree, so a successful run is that check).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The `thaw` binary: THAW_BIN, or a release build of the workspace's `thaw` crate.
fn thaw_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("THAW_BIN") {
        return PathBuf::from(p);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(root())
        .args(["build", "--release", "--quiet", "-p", "thaw"])
        .status()
        .expect("running cargo build");
    assert!(st.success(), "building thaw failed");
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    target.join("release/thaw")
}

#[test]
fn quick_bench_on_helloworld() {
    assert!(
        root().join("build/samples/python/helloworld/handler.py").is_file(),
        "samples not built: run scripts/build-samples.sh"
    );
    let tmp = tempfile::Builder::new().prefix("thaw-bench-it-").tempdir().unwrap();
    let out = tmp.path().join("results");
    let o = Command::new(thaw_bin())
        .current_dir(root())
        .env("THAW_DATA_DIR", tmp.path().join("data"))
        .env_remove("THAW_LOG")
        .args(["bench", "--quick", "--functions", "helloworld", "--runs", "2", "--concurrency", "1,2", "--out"])
        .arg(&out)
        .output()
        .expect("running thaw bench");
    let (so, se) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "thaw bench failed ({:?})\nstdout:\n{so}\nstderr:\n{se}", o.status);
    assert!(so.contains("prefetch vs lazy (128 KiB read-around) speedup"), "{so}");
    assert!(so.contains("prefetch vs lazy-page (one page per fault) speedup"), "{so}");
    assert!(se.contains("helloworld run 2/2"), "no progress lines: {se}");

    let jsons: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(jsons.len(), 1, "{jsons:?}");
    let name = jsons[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("reap-") && name.ends_with("Z.json"), "{name}");
    let v: Value = serde_json::from_slice(&std::fs::read(&jsons[0]).unwrap()).unwrap();
    assert!(!out.read_dir().unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".work")), "scratch left behind");

    let pf = &v["summary"]["per_function"]["helloworld"];
    for mode in thaw_bench::MODES {
        for metric in ["ttfr_ms", "first_invoke_ms", "restore_ms", "page_faults", "bytes_read"] {
            let s = &pf[mode][metric];
            assert!(s["median"].is_number() && s["p90"].is_number(), "{mode} {metric}: {s}");
        }
        assert_eq!(pf[mode]["ttfr_ms"]["n"], 2, "{mode}");
        assert!(pf[mode]["ttfr_ms"]["median"].as_f64().unwrap() > 0.0, "{mode}");
    }
    for mode in ["parallel", "ws-cached", "prefetch", "prefetch-sealed"] {
        assert!(pf[mode]["ws_bytes"]["median"].as_f64().unwrap() > 0.0, "{mode} has no working set");
    }
    let lazy_faults = pf["lazy"]["page_faults"]["median"].as_f64().unwrap();
    let pre_faults = pf["prefetch"]["page_faults"]["median"].as_f64().unwrap();
    assert!(lazy_faults > 0.0);
    assert!(pre_faults == 0.0 || pre_faults < lazy_faults, "prefetch {pre_faults} faults vs lazy {lazy_faults}");
    // Read-around reads whole windows; one page per fault reads only the touched pages.
    let bytes = |m: &str| pf[m]["bytes_read"]["median"].as_f64().unwrap();
    assert!(bytes("lazy-page") < bytes("lazy"), "lazy-page {} vs lazy {}", bytes("lazy-page"), bytes("lazy"));

    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * thaw_bench::MODES.len(), "every mode x 2 runs");
    // The encryption-at-rest comparison is reported.
    assert!(v["summary"]["headline"]["seal_overhead_prefetch"]["helloworld"].is_number(), "{}", v["summary"]["headline"]);
    for r in runs {
        assert!(r["ttfr_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
    let conc = v["concurrency_runs"].as_array().unwrap();
    assert_eq!(conc.len(), 2 * 6 * (1 + 2), "2 reps x 6 modes (lazy, prefetch, prefetch-pooled, burst-each, burst-shared, burst-pooled) x (1 + 2) instances");
    // Every burst reads the working set at least once; each-reads bursts read it once per instance.
    for r in conc.iter().filter(|r| r["mode"] == "burst-each") {
        assert!(r["ws_bytes_read"].as_u64().unwrap() > 0, "{r}");
    }
    let cs = &v["summary"]["concurrency"]["helloworld"];
    for mode in ["lazy", "prefetch", "prefetch-pooled", "burst-pooled"] {
        let pts = cs[mode].as_array().unwrap();
        assert_eq!(pts.iter().map(|p| p["n"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
        assert!(pts.iter().all(|p| p["p99_ms"].as_f64().unwrap() >= p["median_ms"].as_f64().unwrap()), "{mode}: {pts:?}");
    }
    for k in ["date", "kernel", "cpu_model", "git_commit", "runs", "rcu_expedited"] {
        assert!(v["meta"].get(k).is_some(), "meta lacks {k}");
    }
    for c in v["charts"].as_array().unwrap() {
        let s = std::fs::read_to_string(out.join(c.as_str().unwrap())).unwrap();
        assert!(s.starts_with("<svg"));
    }
    let charts: Vec<&str> = v["charts"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(charts.len(), 5, "{charts:?}");
    assert!(charts.iter().any(|c| c.ends_with("-memory.svg")), "{charts:?}");
    // Every instance reports the memory it was charged.
    for mode in ["boot", "lazy", "eager", "prefetch"] {
        assert!(pf[mode]["mem_peak"]["median"].as_f64().unwrap() > 0.0, "{mode}");
    }
}
