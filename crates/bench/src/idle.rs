//! The idle-instances experiment (issue #33): does a cold start get slower as idle
//! instances pile up on the node?
//!
//! For each count N of `--idle` (ascending), the harness first brings the number of
//! idle instances up to N: restores of the idle function (prefetch, one opened
//! snapshot), each invoked once and then frozen as the node freezes an idle instance
//! (cgroup freezer). Then it measures `--runs` cold starts of the same function from
//! its own snapshot directory, evicted before each, in the modes `prefetch` and
//! `prefetch-pooled` (interleaved), exactly as the main experiment measures one, and
//! records how many threads this process (the node's side) has and how many of them
//! are page-server threads.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use thaw_engine::instance::Instance;
use thaw_engine::pageserver::Paging;

use crate::runner::{self, Prepared, RunRecord};
use crate::stats;

/// How long the idle instances are left alone before the measurements at a count.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// The modes measured at each idle count.
pub const IDLE_MODES: [&str; 2] = ["prefetch", "prefetch-pooled"];

/// One measured cold start with `idle` idle instances on the node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleRecord {
    pub idle: u32,
    /// Threads of the harness process at the measurement, and how many of them serve
    /// pages (named `thaw-pageserver` or `thaw-ps-child`).
    pub threads: u32,
    pub pageserver_threads: u32,
    pub run: RunRecord,
}

/// (all threads, page-server threads) of this process.
pub fn thread_counts() -> (u32, u32) {
    let (mut all, mut ps) = (0, 0);
    if let Ok(rd) = std::fs::read_dir("/proc/self/task") {
        for t in rd.flatten() {
            all += 1;
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim_end().starts_with("thaw-pageserver") || comm.trim_end().starts_with("thaw-ps-child") {
                ps += 1;
            }
        }
    }
    (all, ps)
}

/// Run the experiment for `p` at the idle counts `counts`; `runs` starts per mode and count.
pub(crate) fn run(p: &Prepared, counts: &[u32], runs: usize, work: &std::path::Path) -> Result<Vec<IdleRecord>> {
    let mut counts = counts.to_vec();
    counts.sort_unstable();
    counts.dedup();
    // The idle instances come from a copy of the snapshot, so that evicting the measured
    // snapshot's files never touches the files the idle instances map.
    let idle_dir = work.join(&p.name).join("idle-copy");
    runner::copy_snapshot(&p.snap, &p.golden, &idle_dir)?;
    let idle_snap = Arc::new(runner::open_for_burst(&idle_dir, p)?);
    let mut idle: Vec<Instance> = Vec::new();
    let mut out = Vec::new();
    let r = (|| -> Result<()> {
        for &n in &counts {
            let t = std::time::Instant::now();
            while idle.len() < n as usize {
                let mut inst = Instance::restore(&idle_snap, Paging::Prefetch)
                    .with_context(|| format!("restoring idle instance {} of {n}", idle.len() + 1))?;
                let v = runner::invoke_checked(&mut inst, p, "idle");
                if let Err(e) = v.and_then(|_| inst.freeze().context("freezing an idle instance")) {
                    inst.kill();
                    return Err(e);
                }
                idle.push(inst);
            }
            eprintln!("bench: idle: {n} idle instances ready ({:.0} ms)", t.elapsed().as_secs_f64() * 1e3);
            // Idle means idle for a while: let the kernel's work of their creation (RCU
            // callbacks, cgroup and namespace work queues) settle before measuring.
            std::thread::sleep(SETTLE);
            // Counted once per level: reading 500 threads' names is not free either.
            let (threads, pageserver_threads) = thread_counts();
            for run in 0..runs {
                for k in 0..IDLE_MODES.len() {
                    let mode = IDLE_MODES[(k + run) % IDLE_MODES.len()];
                    let rec = runner::measure(p, mode, run).with_context(|| format!("{} {mode} with {n} idle instances", p.name))?;
                    out.push(IdleRecord { idle: n, threads, pageserver_threads, run: rec });
                }
            }
            let line = summary(&out)
                .get(&n)
                .map(|m| m.iter().map(|(mode, s)| format!("{mode} {:.2} ms (x{:.2})", s.ttfr_ms, s.vs_empty)).collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            eprintln!("bench: idle: N={n}: time to first response median {line}");
        }
        Ok(())
    })();
    for inst in idle {
        inst.kill();
    }
    r.map(|()| out)
}

/// Medians at one idle count and mode.
#[derive(Debug, Clone, Serialize)]
pub struct IdlePoint {
    pub runs: usize,
    pub ttfr_ms: f64,
    pub restore_ms: f64,
    pub node_cpu_ms: f64,
    pub instance_cpu_ms: f64,
    /// This point's time to first response over the same mode's with the fewest idle
    /// instances measured (normally 0).
    pub vs_empty: f64,
    pub threads: u32,
    pub pageserver_threads: u32,
}

/// idle count -> mode -> medians.
pub fn summary(recs: &[IdleRecord]) -> BTreeMap<u32, BTreeMap<String, IdlePoint>> {
    let mut groups: BTreeMap<(u32, String), Vec<&IdleRecord>> = BTreeMap::new();
    for r in recs {
        groups.entry((r.idle, r.run.mode.clone())).or_default().push(r);
    }
    let med = |g: &[&IdleRecord], f: &dyn Fn(&IdleRecord) -> Option<f64>| {
        let v: Vec<f64> = g.iter().filter_map(|r| f(r)).filter(|v| v.is_finite()).collect();
        stats::median(&v).unwrap_or(f64::NAN)
    };
    let mut out: BTreeMap<u32, BTreeMap<String, IdlePoint>> = BTreeMap::new();
    let mut first: BTreeMap<String, f64> = BTreeMap::new();
    for ((n, mode), g) in groups {
        let ttfr = med(&g, &|r| Some(r.run.ttfr_ms));
        let base = *first.entry(mode.clone()).or_insert(ttfr);
        out.entry(n).or_default().insert(
            mode,
            IdlePoint {
                runs: g.len(),
                ttfr_ms: ttfr,
                restore_ms: med(&g, &|r| Some(r.run.restore_ms)),
                node_cpu_ms: med(&g, &|r| r.run.node_cpu_ms),
                instance_cpu_ms: med(&g, &|r| r.run.instance_cpu_ms),
                vs_empty: ttfr / base,
                threads: g.iter().map(|r| r.threads).max().unwrap_or(0),
                pageserver_threads: g.iter().map(|r| r.pageserver_threads).max().unwrap_or(0),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_relative_to_the_fewest_idle() {
        let rec = |idle, mode: &str, ttfr| IdleRecord {
            idle,
            threads: 10 + idle,
            pageserver_threads: idle,
            run: RunRecord { mode: mode.into(), ttfr_ms: ttfr, ..Default::default() },
        };
        let recs = [rec(0, "prefetch", 4.0), rec(0, "prefetch", 6.0), rec(500, "prefetch", 10.0), rec(500, "prefetch", 12.0)];
        let s = summary(&recs);
        assert_eq!(s[&0]["prefetch"].ttfr_ms, 5.0);
        assert_eq!(s[&500]["prefetch"].vs_empty, 11.0 / 5.0);
        assert_eq!(s[&500]["prefetch"].pageserver_threads, 500);
        let (all, ps) = thread_counts();
        assert!(all >= 1 && ps <= all);
    }
}
