//! Summaries, the printed table, JSON and charts of a benchmark run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::charts;
use crate::runner::{ConcRecord, Results, RunRecord};
use crate::stats::{self, Summary};
use crate::{Config, MODES};

pub const TARGET_SPEEDUP: f64 = 3.7;
pub const TARGET_FAULT_REDUCTION: f64 = 0.90;
pub const TARGET_WS_BW_SHARE: f64 = 0.70;
pub const PAPER_RECORD_OVERHEAD: f64 = 0.28;

/// function -> mode -> metric -> summary.
pub type PerFunction = BTreeMap<String, BTreeMap<String, BTreeMap<String, Summary>>>;

fn metric_values(r: &RunRecord) -> Vec<(&'static str, Option<f64>)> {
    vec![
        ("restore_ms", Some(r.restore_ms)),
        ("open_ms", Some(r.open_ms)),
        ("sandbox_ms", Some(r.sandbox_ms)),
        ("first_invoke_ms", Some(r.first_invoke_ms)),
        ("ttfr_ms", Some(r.ttfr_ms)),
        ("page_faults", Some(r.page_faults as f64)),
        ("bytes_read", Some(r.bytes_read as f64)),
        ("ws_bytes", r.ws_bytes.map(|v| v as f64)),
        ("ws_read_ms", r.ws_read_ms),
        ("ws_install_ms", r.ws_install_ms),
        ("ws_read_mib_s", ws_bandwidth(r)),
        ("mem_peak", r.mem_peak.map(|v| v as f64)),
        ("node_cpu_ms", r.node_cpu_ms),
        ("instance_cpu_ms", r.instance_cpu_ms),
        ("cpu_ms", r.node_cpu_ms.zip(r.instance_cpu_ms).map(|(a, b)| a + b)),
    ]
}

/// MiB/s of one working-set read (prefetch runs).
pub fn ws_bandwidth(r: &RunRecord) -> Option<f64> {
    match (r.ws_bytes, r.ws_read_ms) {
        (Some(b), Some(t)) if t > 0.0 && b > 0 => Some(b as f64 / (1 << 20) as f64 / (t / 1e3)),
        _ => None,
    }
}

pub fn per_function(runs: &[RunRecord]) -> PerFunction {
    let mut vals: BTreeMap<(String, String, &'static str), Vec<f64>> = BTreeMap::new();
    for r in runs {
        for (m, v) in metric_values(r) {
            if let Some(v) = v {
                vals.entry((r.function.clone(), r.mode.clone(), m)).or_default().push(v);
            }
        }
    }
    let mut out = PerFunction::new();
    for ((f, mode, m), v) in vals {
        if let Some(s) = Summary::of(&v) {
            out.entry(f).or_default().entry(mode).or_default().insert(m.to_string(), s);
        }
    }
    out
}

fn med(pf: &PerFunction, f: &str, mode: &str, metric: &str) -> Option<f64> {
    pf.get(f)?.get(mode)?.get(metric).map(|s| s.median)
}

/// The headline figures compared against the targets.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Headline {
    /// lazy / prefetch median time to first response.
    pub speedup: BTreeMap<String, f64>,
    pub speedup_avg: Option<f64>,
    pub speedup_geomean: Option<f64>,
    /// prefetch vs lazy-page (one page per fault, no read-around).
    pub speedup_vs_page: BTreeMap<String, f64>,
    pub speedup_vs_page_avg: Option<f64>,
    pub fault_reduction: BTreeMap<String, f64>,
    pub fault_reduction_avg: Option<f64>,
    pub ws_read_mib_s: BTreeMap<String, f64>,
    pub ws_read_mib_s_median: Option<f64>,
    pub disk_mib_s: Option<f64>,
    pub ws_bw_share: Option<f64>,
    /// record / lazy median first invocation - 1.
    pub record_overhead: BTreeMap<String, f64>,
    pub record_overhead_avg: Option<f64>,
    /// Encryption at rest: prefetch-sealed / prefetch median restore - 1, and the
    /// same for lazy (time to first response: lazy decrypts on every fault).
    pub seal_overhead_prefetch: BTreeMap<String, f64>,
    pub seal_overhead_lazy: BTreeMap<String, f64>,
    /// Prepared sandboxes: prefetch / prefetch-pooled median time to first response.
    pub pooled_speedup: BTreeMap<String, f64>,
}

pub fn headline(runs: &[RunRecord], pf: &PerFunction, disk_mib_s: &[f64]) -> Headline {
    let mut h = Headline::default();
    for f in pf.keys() {
        if let (Some(l), Some(p)) = (med(pf, f, "lazy", "ttfr_ms"), med(pf, f, "prefetch", "ttfr_ms")) {
            if let Some(s) = stats::speedup(l, p) {
                h.speedup.insert(f.clone(), s);
            }
        }
        if let (Some(l), Some(p)) = (med(pf, f, "lazy-page", "ttfr_ms"), med(pf, f, "prefetch", "ttfr_ms")) {
            if let Some(s) = stats::speedup(l, p) {
                h.speedup_vs_page.insert(f.clone(), s);
            }
        }
        if let (Some(l), Some(p)) = (med(pf, f, "lazy", "page_faults"), med(pf, f, "prefetch", "page_faults")) {
            if let Some(s) = stats::reduction(l, p) {
                h.fault_reduction.insert(f.clone(), s);
            }
        }
        if let Some(b) = med(pf, f, "prefetch", "ws_read_mib_s") {
            h.ws_read_mib_s.insert(f.clone(), b);
        }
        if let Some(s) = med(pf, f, "prefetch", "ttfr_ms").zip(med(pf, f, "prefetch-pooled", "ttfr_ms")).and_then(|(p, q)| stats::speedup(p, q)) {
            h.pooled_speedup.insert(f.clone(), s);
        }
        let sealed = [
            (&mut h.seal_overhead_prefetch, "prefetch", "restore_ms"),
            (&mut h.seal_overhead_lazy, "lazy", "ttfr_ms"),
        ];
        for (map, mode, metric) in sealed {
            let sealed_mode = format!("{mode}-sealed");
            if let Some(o) = med(pf, f, mode, metric).zip(med(pf, f, &sealed_mode, metric)).and_then(|(c, s)| stats::overhead(c, s)) {
                map.insert(f.clone(), o);
            }
        }
        if let (Some(l), Some(r)) = (med(pf, f, "lazy", "first_invoke_ms"), med(pf, f, "record", "first_invoke_ms")) {
            if let Some(o) = stats::overhead(l, r) {
                h.record_overhead.insert(f.clone(), o);
            }
        }
    }
    let sp: Vec<f64> = h.speedup.values().copied().collect();
    h.speedup_avg = stats::mean(&sp);
    h.speedup_geomean = stats::geomean(&sp);
    h.speedup_vs_page_avg = stats::mean(&h.speedup_vs_page.values().copied().collect::<Vec<_>>());
    h.fault_reduction_avg = stats::mean(&h.fault_reduction.values().copied().collect::<Vec<_>>());
    h.record_overhead_avg = stats::mean(&h.record_overhead.values().copied().collect::<Vec<_>>());
    let bw: Vec<f64> = runs.iter().filter(|r| r.mode == "prefetch").filter_map(ws_bandwidth).collect();
    h.ws_read_mib_s_median = stats::median(&bw);
    h.disk_mib_s = stats::median(disk_mib_s);
    if let (Some(w), Some(d)) = (h.ws_read_mib_s_median, h.disk_mib_s) {
        h.ws_bw_share = (d > 0.0).then(|| w / d);
    }
    h
}

/// One point of the concurrency curve: medians over repetitions of the per-trial
/// average and maximum time to first response.
#[derive(Debug, Clone, Serialize)]
pub struct ConcPoint {
    pub n: u32,
    pub avg_ms: f64,
    pub max_ms: f64,
    pub p90_avg_ms: f64,
    pub trials: usize,
    pub page_faults_avg: f64,
    /// Median over trials of how many instances read the working set from disk.
    pub ws_reads: f64,
    /// Per instance, over every instance of every trial: median and 99th percentile
    /// of the time to first response.
    pub median_ms: f64,
    pub p99_ms: f64,
    /// Per instance: median CPU time of a start (the harness's share of the trial plus
    /// the instance's own), and the two parts, ms.
    #[serde(default)]
    pub cpu_ms: f64,
    #[serde(default)]
    pub node_cpu_ms: f64,
    #[serde(default)]
    pub instance_cpu_ms: f64,
}

/// function -> mode -> points by N.
pub type ConcSummary = BTreeMap<String, BTreeMap<String, Vec<ConcPoint>>>;

pub fn concurrency_summary(recs: &[ConcRecord]) -> ConcSummary {
    let mut trials: BTreeMap<(String, String, u32, usize), Vec<&ConcRecord>> = BTreeMap::new();
    for r in recs {
        trials.entry((r.function.clone(), r.mode.clone(), r.n, r.rep)).or_default().push(r);
    }
    type Acc = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
    let mut by_n: BTreeMap<(String, String, u32), Acc> = BTreeMap::new();
    // (harness, instance) CPU per start, by (function, mode, N).
    type Cpu = (Vec<f64>, Vec<f64>);
    let mut cpu: BTreeMap<(String, String, u32), Cpu> = BTreeMap::new();
    for ((f, m, n, _), t) in trials {
        let c = cpu.entry((f.clone(), m.clone(), n)).or_default();
        c.0.extend(t.iter().map(|r| r.node_cpu_ms));
        c.1.extend(t.iter().map(|r| r.instance_cpu_ms).filter(|v| v.is_finite()));
        let e = by_n.entry((f, m, n)).or_default();
        e.4.extend(t.iter().map(|r| r.ttfr_ms));
        e.0.push(t.iter().map(|r| r.ttfr_ms).sum::<f64>() / t.len() as f64);
        e.1.push(t.iter().map(|r| r.ttfr_ms).fold(0.0, f64::max));
        e.2.push(t.iter().map(|r| r.page_faults as f64).sum::<f64>() / t.len() as f64);
        e.3.push(t.iter().filter(|r| r.ws_bytes_read > 0).count() as f64);
    }
    let mut out = ConcSummary::new();
    for ((f, m, n), (avg, mx, pfs, reads, each)) in by_n {
        let (node, inst) = cpu.remove(&(f.clone(), m.clone(), n)).unwrap_or_default();
        let (node, inst) = (stats::median(&node).unwrap_or(f64::NAN), stats::median(&inst).unwrap_or(f64::NAN));
        out.entry(f).or_default().entry(m).or_default().push(ConcPoint {
            cpu_ms: node + inst,
            node_cpu_ms: node,
            instance_cpu_ms: inst,
            n,
            avg_ms: stats::median(&avg).unwrap_or(f64::NAN),
            max_ms: stats::median(&mx).unwrap_or(f64::NAN),
            p90_avg_ms: stats::p90(&avg).unwrap_or(f64::NAN),
            trials: avg.len(),
            page_faults_avg: stats::median(&pfs).unwrap_or(f64::NAN),
            ws_reads: stats::median(&reads).unwrap_or(f64::NAN),
            median_ms: stats::median(&each).unwrap_or(f64::NAN),
            p99_ms: stats::percentile(&each, 99.0).unwrap_or(f64::NAN),
        });
    }
    out
}

/// function -> mode -> where a start's CPU goes -> median ms: the restoring thread's steps
/// (`sandbox`, `stub`, ...), `sandbox_init` (the sandbox's init process), `instance`
/// (the restored process to its first response) and `node_total` (all of the harness's
/// threads: the restoring thread, the working-set reader, the page server...).
pub type CpuPhases = BTreeMap<String, BTreeMap<String, BTreeMap<String, f64>>>;

pub fn cpu_phases(runs: &[RunRecord]) -> CpuPhases {
    let mut acc: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for r in runs.iter().filter(|r| !r.phases_cpu_ms.is_empty()) {
        let mut put = |k: &str, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                acc.entry((r.function.clone(), r.mode.clone(), k.to_string())).or_default().push(v);
            }
        };
        for (k, v) in &r.phases_cpu_ms {
            put(k, Some(*v));
        }
        put("sandbox_init", r.sandbox_init_cpu_ms);
        put("instance", r.instance_cpu_ms);
        put("node_total", r.node_cpu_ms);
    }
    let mut out = CpuPhases::new();
    for ((f, m, k), v) in acc {
        out.entry(f).or_default().entry(m).or_default().insert(k, stats::median(&v).unwrap_or(f64::NAN));
    }
    out
}

/// One line per function and restore mode with a CPU profile (see [`cpu_phases`]).
pub fn cpu_phase_lines(c: &CpuPhases) -> Vec<String> {
    let order = ["sandbox", "stub", "batch_a", "batch_b", "memory", "resume"];
    let mut out = Vec::new();
    for (f, modes) in c {
        for (m, ph) in modes.iter().filter(|(m, _)| m.starts_with("prefetch") || *m == "lazy") {
            let steps: Vec<String> = order.iter().filter_map(|k| Some(format!("{k} {:.2}", ph.get(*k)?))).collect();
            let g = |k: &str| ph.get(k).map_or("-".to_string(), |v| format!("{v:.2}"));
            out.push(format!(
                "CPU of a start {f} {m} (medians, ms): restoring thread {}; sandbox init {}; all node threads {}; instance {}",
                steps.join(", "),
                g("sandbox_init"),
                g("node_total"),
                g("instance")
            ));
        }
    }
    out
}

/// UTC timestamp as (compact for file names, ISO 8601).
pub fn utc_stamp(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (
        format!("{y:04}{m:02}{d:02}T{hh:02}{mm:02}{ss:02}Z"),
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z"),
    )
}

fn read_trim(p: &str) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Metadata of a run, taken at its start (`loadavg_end` is added when the JSON is written).
pub fn meta(cfg: &Config, started: SystemTime) -> Value {
    let (_, iso) = utc_stamp(started);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string()));
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
    json!({
        "date": iso,
        "kernel": read_trim("/proc/sys/kernel/osrelease"),
        "cpu_model": cpu,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "git_commit": commit,
        "git_dirty": dirty,
        "runs": cfg.runs,
        "rcu_expedited": read_trim("/sys/kernel/rcu_expedited"),
        "loadavg_start": read_trim("/proc/loadavg"),
        "thaw_version": env!("CARGO_PKG_VERSION"),
        "memory_mb": cfg.memory_mb,
    })
}

pub fn build_json(cfg: &Config, res: &Results, pf: &PerFunction, h: &Headline, charts: &[String]) -> Value {
    let mut m = if res.meta.is_object() { res.meta.clone() } else { meta(cfg, res.started) };
    m["loadavg_end"] = json!(read_trim("/proc/loadavg"));
    json!({
        "meta": m,
        "config": cfg,
        "modes": MODES,
        "disk": {"o_direct_16mib_read_mib_s": res.disk_mib_s, "median_mib_s": stats::median(&res.disk_mib_s)},
        "snapshot_bytes": res.snapshot_bytes,
        "summary": {
            "per_function": pf,
            "headline": h,
            "targets": {"speedup_avg": TARGET_SPEEDUP, "fault_reduction": TARGET_FAULT_REDUCTION,
                        "ws_bw_share": TARGET_WS_BW_SHARE, "paper_record_overhead": PAPER_RECORD_OVERHEAD},
            "concurrency": concurrency_summary(&res.concurrency),
            "idle": crate::idle::summary(&res.idle),
            "cpu_phases": cpu_phases(&res.runs),
        },
        "runs": res.runs,
        "concurrency_runs": res.concurrency,
        "idle_runs": res.idle,
        "charts": charts,
    })
}

fn f1(v: Option<f64>) -> String {
    v.map(|x| if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.1}") }).unwrap_or_else(|| "-".into())
}

pub fn table(pf: &PerFunction, functions: &[String]) -> String {
    let mut s = String::new();
    s += &format!(
        "{:<12} {:<9} {:>3}  {:>15}  {:>15}  {:>15}  {:>7}  {:>8}  {:>6}  {:>7}  {:>13}\n",
        "function", "mode", "n", "restore ms", "invoke ms", "TTFR ms", "faults", "read MiB", "WS MiB", "mem MiB", "CPU ms"
    );
    s += &format!(
        "{:<12} {:<9} {:>3}  {:>15}  {:>15}  {:>15}  {:>7}  {:>8}  {:>6}  {:>7}  {:>13}\n",
        "", "", "", "med / p90", "med / p90", "med / p90", "med", "med", "", "peak", "node + inst"
    );
    s += &"-".repeat(128);
    s.push('\n');
    for f in functions {
        let Some(modes) = pf.get(f) else { continue };
        for mode in MODES {
            let Some(m) = modes.get(mode) else { continue };
            let g = |k: &str| m.get(k);
            let pair = |k: &str| match g(k) {
                Some(x) => format!("{} / {}", f1(Some(x.median)), f1(Some(x.p90))),
                None => "-".into(),
            };
            let restore = if mode == "warm" { "-".to_string() } else { pair("restore_ms") };
            let mib = |k: &str| g(k).map(|x| format!("{:.2}", x.median / (1 << 20) as f64)).unwrap_or_else(|| "-".into());
            let cpu = match (g("node_cpu_ms"), g("instance_cpu_ms")) {
                (Some(a), Some(b)) => format!("{:.1} + {:.1}", a.median, b.median),
                _ => "-".into(),
            };
            s += &format!(
                "{:<12} {:<9} {:>3}  {:>15}  {:>15}  {:>15}  {:>7}  {:>8}  {:>6}  {:>7}  {:>13}\n",
                f,
                mode,
                g("ttfr_ms").map(|x| x.n).unwrap_or(0),
                restore,
                pair("first_invoke_ms"),
                pair("ttfr_ms"),
                g("page_faults").map(|x| format!("{:.0}", x.median)).unwrap_or_else(|| "-".into()),
                if mode == "boot" { "-".into() } else { mib("bytes_read") },
                mib("ws_bytes"),
                g("mem_peak").map(|x| format!("{:.1}", x.median / (1 << 20) as f64)).unwrap_or_else(|| "-".into()),
                cpu,
            );
        }
    }
    s
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

pub fn summary_lines(h: &Headline, conc: &ConcSummary) -> Vec<String> {
    let per = |m: &BTreeMap<String, f64>, fmt: &dyn Fn(f64) -> String| {
        m.iter().map(|(k, v)| format!("{k} {}", fmt(*v))).collect::<Vec<_>>().join(", ")
    };
    let mut out = Vec::new();
    out.push(format!(
        "prefetch vs lazy (128 KiB read-around) speedup of time to first response (medians): {}; average {}x (geomean {}x) — target >= {TARGET_SPEEDUP}x: {}",
        per(&h.speedup, &|v| format!("{v:.2}x")),
        h.speedup_avg.map(|v| format!("{v:.2}")).unwrap_or("-".into()),
        h.speedup_geomean.map(|v| format!("{v:.2}")).unwrap_or("-".into()),
        verdict(h.speedup_avg.is_some_and(|v| v >= TARGET_SPEEDUP))
    ));
    if !h.speedup_vs_page.is_empty() {
        out.push(format!(
            "prefetch vs lazy-page (one page per fault) speedup: {}; average {}x — target >= {TARGET_SPEEDUP}x: {}",
            per(&h.speedup_vs_page, &|v| format!("{v:.2}x")),
            h.speedup_vs_page_avg.map(|v| format!("{v:.2}")).unwrap_or("-".into()),
            verdict(h.speedup_vs_page_avg.is_some_and(|v| v >= TARGET_SPEEDUP))
        ));
    }
    out.push(format!(
        "fault reduction prefetch vs lazy: {}; average {} — target >= {:.0}%: {}",
        per(&h.fault_reduction, &|v| format!("{:.1}%", v * 100.0)),
        h.fault_reduction_avg.map(|v| format!("{:.1}%", v * 100.0)).unwrap_or("-".into()),
        TARGET_FAULT_REDUCTION * 100.0,
        verdict(h.fault_reduction_avg.is_some_and(|v| v >= TARGET_FAULT_REDUCTION))
    ));
    out.push(format!(
        "WS read bandwidth (ws_bytes / read_ms, median of prefetch runs): {} MiB/s ({}) vs disk O_DIRECT 16 MiB reads {} MiB/s = {} — target >= {:.0}%: {}",
        f1(h.ws_read_mib_s_median),
        per(&h.ws_read_mib_s, &|v| format!("{v:.0}")),
        f1(h.disk_mib_s),
        h.ws_bw_share.map(|v| format!("{:.0}%", v * 100.0)).unwrap_or("-".into()),
        TARGET_WS_BW_SHARE * 100.0,
        verdict(h.ws_bw_share.is_some_and(|v| v >= TARGET_WS_BW_SHARE))
    ));
    out.push(format!(
        "record overhead (first invocation, record vs lazy, medians): {}; average {} (paper: +{:.0}%)",
        per(&h.record_overhead, &|v| format!("{:+.1}%", v * 100.0)),
        h.record_overhead_avg.map(|v| format!("{:+.1}%", v * 100.0)).unwrap_or("-".into()),
        PAPER_RECORD_OVERHEAD * 100.0
    ));
    out.push(format!(
        "encryption at rest (same run, medians): prefetch restore {}; lazy time to first response {}",
        per(&h.seal_overhead_prefetch, &|v| format!("{:+.1}%", v * 100.0)),
        per(&h.seal_overhead_lazy, &|v| format!("{:+.1}%", v * 100.0)),
    ));
    out.push(format!(
        "prepared sandboxes (same run, medians): prefetch-pooled vs prefetch time to first response {}",
        per(&h.pooled_speedup, &|v| format!("{v:.2}x")),
    ));
    for (f, modes) in conc {
        for (m, pts) in modes {
            out.push(format!(
                "concurrency {f} {m}: time to first response per instance median/p99: {}",
                pts.iter()
                    .map(|p| format!("N={} {:.1}/{:.1} ms ({} WS reads, CPU {:.1} + {:.1} ms per start)", p.n, p.median_ms, p.p99_ms, p.ws_reads, p.node_cpu_ms, p.instance_cpu_ms))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    out
}

/// Write the charts; returns their file names.
pub fn write_charts(out: &Path, stamp: &str, res: &Results, pf: &PerFunction, functions: &[String]) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let path = |kind: &str| -> (PathBuf, String) {
        let n = format!("reap-{stamp}-{kind}.svg");
        (out.join(&n), n)
    };
    let groups: Vec<charts::LatencyGroup> = functions
        .iter()
        .filter_map(|f| {
            let modes = pf.get(f)?;
            let bars = MODES
                .iter()
                .filter_map(|m| {
                    let s = modes.get(*m)?;
                    Some((m.to_string(), s.get("restore_ms")?.median, s.get("first_invoke_ms")?.median))
                })
                .collect();
            Some(charts::LatencyGroup { function: f.clone(), bars })
        })
        .collect();
    let (p, n) = path("latency");
    charts::latency_breakdown(&p, &groups)?;
    names.push(n);

    let faults: Vec<(String, f64, f64)> = functions
        .iter()
        .filter_map(|f| Some((f.clone(), med(pf, f, "lazy", "page_faults")?, med(pf, f, "prefetch", "page_faults")?)))
        .collect();
    let (p, n) = path("faults");
    charts::page_faults(&p, &faults)?;
    names.push(n);

    // Peak memory (MiB) of an instance: a cold boot against the restore modes.
    let mem_modes = [("boot", "boot"), ("lazy", "lazy"), ("eager", "eager"), ("prefetch", "prefetch (REAP)")];
    let memory: Vec<(String, Vec<f64>)> = functions
        .iter()
        .filter_map(|f| {
            let v: Option<Vec<f64>> = mem_modes.iter().map(|(m, _)| Some(med(pf, f, m, "mem_peak")? / (1 << 20) as f64)).collect();
            Some((f.clone(), v?))
        })
        .collect();
    if !memory.is_empty() {
        let (p, n) = path("memory");
        charts::memory(&p, &mem_modes, &memory)?;
        names.push(n);
    }

    let conc = concurrency_summary(&res.concurrency);
    if !conc.is_empty() {
        let series: Vec<charts::ConcSeries> = conc
            .iter()
            .flat_map(|(f, modes)| {
                modes.iter().map(move |(m, pts)| (format!("{f} {m}"), m.clone(), pts.iter().map(|p| (p.n, p.avg_ms, p.max_ms)).collect()))
            })
            .collect();
        let (p, n) = path("concurrency");
        charts::concurrency(&p, &series)?;
        names.push(n);
    }

    let idle = crate::idle::summary(&res.idle);
    if !idle.is_empty() {
        let series: Vec<charts::ConcSeries> = crate::idle::IDLE_MODES
            .iter()
            .map(|m| {
                let pts = idle.iter().filter_map(|(n, modes)| modes.get(*m).map(|p| (*n, p.ttfr_ms, p.node_cpu_ms + p.instance_cpu_ms))).collect();
                (format!("{} {m}", res.idle[0].run.function), m.to_string(), pts)
            })
            .collect();
        let (p, n) = path("idle");
        charts::lines(&p, "Cold start beside idle instances: time to first response (solid), CPU node + instance (thin)", "idle instances on the node", &series, ("time", "CPU"))?;
        names.push(n);
    }

    let cdf: Vec<(String, String, Vec<f64>)> = ["lazy", "prefetch"]
        .iter()
        .map(|m| {
            let v = res.runs.iter().filter(|r| r.mode == *m && functions.contains(&r.function)).map(|r| r.ttfr_ms).collect();
            let label = if *m == "prefetch" { "prefetch (REAP)".to_string() } else { m.to_string() };
            (label, m.to_string(), v)
        })
        .collect();
    let (p, n) = path("cdf");
    charts::cdf(&p, &cdf)?;
    names.push(n);
    Ok(names)
}

/// Print the table and summary, write JSON and SVGs into `out`. Returns the JSON path.
pub fn finish(cfg: &Config, out: &Path, res: Results) -> Result<()> {
    write_all(cfg, out, &res).map(|p| eprintln!("bench: wrote {}", p.display()))
}

pub fn write_all(cfg: &Config, out: &Path, res: &Results) -> Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let pf = per_function(&res.runs);
    let h = headline(&res.runs, &pf, &res.disk_mib_s);
    let (stamp, _) = utc_stamp(res.started);
    let charts = write_charts(out, &stamp, res, &pf, &cfg.functions)?;
    let conc = concurrency_summary(&res.concurrency);
    println!("{}", table(&pf, &cfg.functions));
    for l in summary_lines(&h, &conc).into_iter().chain(cpu_phase_lines(&cpu_phases(&res.runs))) {
        println!("{l}");
    }
    for (n, modes) in crate::idle::summary(&res.idle) {
        for (m, p) in modes {
            println!(
                "idle {n}: {m}: time to first response median {:.2} ms (x{:.2} the fewest idle), CPU {:.1} + {:.1} ms, {} page-server threads of {}",
                p.ttfr_ms, p.vs_empty, p.node_cpu_ms, p.instance_cpu_ms, p.pageserver_threads, p.threads
            );
        }
    }
    let v = build_json(cfg, res, &pf, &h, &charts);
    let p = out.join(format!("reap-{stamp}.json"));
    std::fs::write(&p, serde_json::to_vec_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
    println!("results: {} (charts: {})", p.display(), charts.join(", "));
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BenchArgs;

    fn rec(f: &str, mode: &str, run: usize, restore: f64, invoke: f64, faults: u64) -> RunRecord {
        let ws = mode == "prefetch";
        RunRecord {
            function: f.into(),
            mode: mode.into(),
            run,
            restore_ms: restore,
            first_invoke_ms: invoke,
            ttfr_ms: restore + invoke,
            page_faults: faults,
            bytes_read: faults * 4096,
            ws_bytes: ws.then_some(8 << 20),
            ws_read_ms: ws.then_some(10.0),
            ..Default::default()
        }
    }

    fn fake() -> Results {
        let mut runs = Vec::new();
        for f in ["helloworld", "pyaes"] {
            for run in 0..3 {
                let k = run as f64;
                runs.push(rec(f, "boot", run, 200.0 + k, 2.0, 0));
                runs.push(rec(f, "lazy", run, 10.0, 30.0 + k, 1000));
                runs.push(rec(f, "record", run, 10.0, 39.0 + k, 1000));
                runs.push(rec(f, "eager", run, 30.0, 2.0, 0));
                runs.push(rec(f, "prefetch", run, 8.0, 2.0 + k, 10));
                runs.push(rec(f, "warm", run, 0.0, 1.0, 0));
            }
        }
        let mut concurrency = Vec::new();
        for n in [1u32, 2] {
            for m in ["lazy", "prefetch"] {
                for i in 0..n {
                    concurrency.push(ConcRecord {
                        function: "helloworld".into(),
                        mode: m.into(),
                        n,
                        rep: 0,
                        instance: i,
                        restore_ms: 5.0,
                        first_invoke_ms: 5.0,
                        ttfr_ms: 10.0 * (i + 1) as f64,
                        page_faults: 3,
                        ws_bytes_read: 0,
                        node_cpu_ms: 1.5,
                        instance_cpu_ms: 0.5 * f64::from(i + 1),
                    });
                }
            }
        }
        Results {
            runs,
            concurrency,
            idle: Vec::new(),
            disk_mib_s: vec![1000.0, 1300.0, 1200.0],
            snapshot_bytes: BTreeMap::from([("helloworld".into(), 1 << 20)]),
            started: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
            meta: Value::Null,
        }
    }

    #[test]
    fn cpu_profile_medians_per_step() {
        let mut runs = Vec::new();
        for (k, sandbox) in [0.2, 0.4, 0.3].into_iter().enumerate() {
            let mut r = rec("helloworld", "prefetch-pooled", k, 2.0, 0.5, 0);
            r.phases_cpu_ms = BTreeMap::from([("sandbox".into(), sandbox), ("memory".into(), 0.5)]);
            r.sandbox_init_cpu_ms = Some(1.0 + k as f64);
            r.instance_cpu_ms = Some(1.1);
            r.node_cpu_ms = Some(1.8);
            runs.push(r);
        }
        // Runs without a profile (boot, warm) are left out.
        runs.push(rec("helloworld", "boot", 0, 20.0, 1.0, 0));
        let c = cpu_phases(&runs);
        let p = &c["helloworld"]["prefetch-pooled"];
        assert_eq!((p["sandbox"], p["memory"], p["sandbox_init"], p["instance"], p["node_total"]), (0.3, 0.5, 2.0, 1.1, 1.8));
        assert!(!c["helloworld"].contains_key("boot"));
        let lines = cpu_phase_lines(&c);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("restoring thread sandbox 0.30, memory 0.50; sandbox init 2.00"), "{}", lines[0]);
    }

    #[test]
    fn aggregation_and_headline() {
        let res = fake();
        let pf = per_function(&res.runs);
        let lazy = &pf["helloworld"]["lazy"];
        assert_eq!(lazy["ttfr_ms"], Summary { median: 41.0, p90: 41.8, n: 3 });
        let h = headline(&res.runs, &pf, &res.disk_mib_s);
        // lazy ttfr median 41, prefetch 11 -> 3.727x
        assert!((h.speedup["pyaes"] - 41.0 / 11.0).abs() < 1e-9);
        assert!((h.speedup_avg.unwrap() - 41.0 / 11.0).abs() < 1e-9);
        assert!((h.fault_reduction["helloworld"] - 0.99).abs() < 1e-9);
        // 8 MiB in 10 ms = 800 MiB/s vs disk median 1200 (67%)
        assert!((h.ws_read_mib_s_median.unwrap() - 800.0).abs() < 1e-9);
        assert!((h.ws_bw_share.unwrap() - 800.0 / 1200.0).abs() < 1e-9);
        assert!((h.record_overhead["helloworld"] - (40.0 / 31.0 - 1.0)).abs() < 1e-9);
        let c = concurrency_summary(&res.concurrency);
        let pts = &c["helloworld"]["lazy"];
        assert_eq!(pts.len(), 2);
        assert_eq!((pts[1].n, pts[1].avg_ms, pts[1].max_ms), (2, 15.0, 20.0));
        assert_eq!((pts[0].node_cpu_ms, pts[0].instance_cpu_ms, pts[0].cpu_ms), (1.5, 0.5, 2.0), "CPU per start: the harness's share and the instance's");
        let lines = summary_lines(&h, &c);
        assert!(lines[0].contains("average 3.73x") && lines[0].contains(": met"), "{}", lines[0]);
        assert!(lines[2].contains("NOT met"), "{}", lines[2]);
        let t = table(&pf, &["helloworld".into(), "pyaes".into()]);
        assert!(t.contains("helloworld   prefetch"), "{t}");
    }

    #[test]
    fn utc_stamps() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(utc_stamp(t), ("20231114T221320Z".to_string(), "2023-11-14T22:13:20Z".to_string()));
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(utc_stamp(t).1, "2000-02-29T00:00:00Z");
    }

    #[test]
    fn json_shape_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = BenchArgs { quick: true, ..Default::default() }.config();
        let p = write_all(&cfg, dir.path(), &fake()).unwrap();
        assert_eq!(p.file_name().unwrap().to_str().unwrap(), "reap-20231114T221320Z.json");
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        for k in ["date", "kernel", "cpu_model", "git_commit", "runs", "rcu_expedited"] {
            assert!(v["meta"].get(k).is_some(), "meta lacks {k}");
        }
        assert_eq!(v["meta"]["runs"], 3);
        assert_eq!(v["runs"].as_array().unwrap().len(), 36);
        let r0 = &v["runs"][0];
        for k in ["function", "mode", "run", "restore_ms", "first_invoke_ms", "ttfr_ms", "page_faults", "bytes_read"] {
            assert!(r0.get(k).is_some(), "run record lacks {k}");
        }
        assert!(v["summary"]["per_function"]["helloworld"]["prefetch"]["ttfr_ms"]["median"].is_number());
        assert!(v["summary"]["per_function"]["helloworld"]["prefetch"]["ttfr_ms"]["p90"].is_number());
        assert!(v["summary"]["headline"]["speedup_avg"].is_number());
        assert!(v["summary"]["concurrency"]["helloworld"]["prefetch"][0]["avg_ms"].is_number());
        assert_eq!(v["concurrency_runs"].as_array().unwrap().len(), 6);
        let charts: Vec<String> = v["charts"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
        assert_eq!(charts.len(), 4);
        for c in charts {
            let s = std::fs::read_to_string(dir.path().join(&c)).unwrap();
            assert!(s.starts_with("<svg"), "{c}");
        }
    }
}
