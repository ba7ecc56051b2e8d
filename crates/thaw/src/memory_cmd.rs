//! `thaw snapshot memory`: restore N instances of each snapshot given, invoke each
//! once (or `--invocations` times), keep them all alive and report what they cost the
//! host (per-instance RSS, PSS, USS and anonymous memory from /proc/PID/smaps_rollup,
//! their cgroups' charge, the shared memory files' bytes, the drop of MemAvailable).
//! The instances of a layered snapshot share the pages they do not write (see the
//! engine's sharedmem.rs) unless --no-share-memory. With --idle-seconds it also
//! measures the CPU this process (the engine: page servers and all) uses while the
//! instances sit idle and frozen, as a node keeps them between invocations.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use thaw_engine::instance::{Instance, LoadedSnapshot};
use thaw_engine::pageserver::Paging;

#[derive(Args)]
pub struct MemoryArgs {
    /// Snapshot directory made by `thaw snapshot create`; several: instances of each,
    /// all alive together (functions of one runtime: with THAW_SHARE_MEMORY=base their
    /// diffs share their base's memory file).
    #[arg(required = true)]
    snapdirs: Vec<PathBuf>,
    /// Instances of each snapshot restored and kept alive together.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    instances: u32,
    /// Paging mode of the restores (see `thaw snapshot restore --help`).
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<Paging>())]
    paging: Paging,
    /// The event each instance is invoked with, as JSON text.
    #[arg(long, default_value = "{}")]
    payload: String,
    /// Invocations of each instance before it is measured (0: as restored).
    #[arg(long, default_value_t = 1)]
    invocations: u32,
    /// Give each instance its own copy of every page (no shared memory file), as a
    /// single `thaw snapshot restore` does.
    #[arg(long)]
    no_share_memory: bool,
    /// After the invocations, give back the pages each instance copied from the
    /// shared memory and still holds unchanged (as `thaw serve` does with instances
    /// idle for --give-back-after): they are shared again. Reported as `give_back`.
    #[arg(long)]
    give_back: bool,
    /// Then freeze every instance (as `thaw serve` does with idle ones), wait this many
    /// seconds and report the CPU time this process used meanwhile (`idle`).
    #[arg(long, default_value_t = 0.0)]
    idle_seconds: f64,
}

/// CPU time (user + system) of this process so far, in milliseconds.
fn own_cpu_ms() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| {
            let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
            tv(u.user_time()) + tv(u.system_time())
        })
        .unwrap_or(f64::NAN)
}

/// `key: N kB` lines of a /proc file, in bytes.
fn kb_fields(text: &str, keys: &[&str]) -> Vec<u64> {
    keys.iter()
        .map(|k| {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix(':')))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        })
        .collect()
}

fn mem_available() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    Ok(kb_fields(&text, &["MemAvailable"])[0])
}

pub fn run(a: MemoryArgs) -> Result<()> {
    let shared_before = thaw_engine::sharedmem::resident_bytes();
    let snaps = a.snapdirs.iter().map(|d| LoadedSnapshot::open_with(d, !a.no_share_memory)).collect::<Result<Vec<_>, _>>()?;
    let snap = &snaps[0];
    let before = mem_available()?;
    let mut insts: Vec<Instance> = Vec::new();
    let result = (|| -> Result<serde_json::Value> {
        let mut restore_ms = Vec::new();
        let mut first_invoke_ms = Vec::new();
        for (k, snap) in (0..a.instances).flat_map(|k| snaps.iter().map(move |s| (k, s))) {
            let t = std::time::Instant::now();
            let inst = Instance::restore(snap, a.paging)?;
            restore_ms.push(t.elapsed().as_secs_f64() * 1e3);
            insts.push(inst);
            let inst = insts.last_mut().expect("just pushed");
            for call in 0..a.invocations {
                let t = std::time::Instant::now();
                inst.invoke(&format!("memory-{k}-{call}"), &a.payload, Duration::from_secs(60))?;
                if call == 0 {
                    first_invoke_ms.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        for i in &mut insts {
            i.finish_background();
        }
        let mut give_back = Vec::new();
        if a.give_back {
            for i in &mut insts {
                give_back.push(i.give_back().context("giving back unchanged pages")?);
            }
        }
        let after = mem_available()?;
        let keys = ["Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty", "Anonymous"];
        let mut per = Vec::new();
        for i in &insts {
            let text = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", i.pid())).context("reading smaps_rollup")?;
            let f = kb_fields(&text, &keys);
            // anon: the instance's own pages (copies included); with the shared memory
            // files' bytes counted once, what the instances cost the host. (USS counts a
            // shared file's page as private when one process maps it.)
            per.push(json!({"rss": f[0], "pss": f[1], "shared_clean": f[2], "shared_dirty": f[3], "uss": f[4] + f[5], "anon": f[6],
                            "cgroup_bytes": i.memory_usage_bytes(), "pages_shared": i.page_stats().pages_shared}));
        }
        let mean = |k: &str| per.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum::<u64>() / per.len().max(1) as u64;
        let idle = if a.idle_seconds > 0.0 {
            for i in &mut insts {
                i.freeze().context("freezing an idle instance")?;
            }
            let cpu0 = own_cpu_ms();
            std::thread::sleep(Duration::from_secs_f64(a.idle_seconds));
            let cpu_ms = own_cpu_ms() - cpu0;
            json!({"seconds": a.idle_seconds, "engine_cpu_ms": cpu_ms,
                   "engine_cpu_share_of_one_core": cpu_ms / (a.idle_seconds * 1e3),
                   "engine_threads": std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)})
        } else {
            serde_json::Value::Null
        };
        Ok(json!({
            "idle": idle,
            "snapshot": a.snapdirs[0], "snapshots": a.snapdirs, "instances": a.instances,
            "shared_memory": snap.source.shared(snap.uses_base_file()).map(|s| s.0.to_path_buf()),
            "shared_memory_files": snaps.iter().filter_map(|s| s.source.shared(s.uses_base_file()).map(|x| x.0.to_path_buf())).collect::<std::collections::BTreeSet<_>>().len(),
            // What the shared memory files hold (the tmpfs's use, less what it held before).
            "shared_memory_bytes": thaw_engine::sharedmem::resident_bytes().saturating_sub(shared_before),
            "host_mem_added_bytes": before.saturating_sub(after),
            "host_mem_added_per_instance_bytes": before.saturating_sub(after) / u64::from(a.instances) / snaps.len() as u64,
            "mean": {"rss": mean("rss"), "pss": mean("pss"), "uss": mean("uss"), "anon": mean("anon"), "shared_clean": mean("shared_clean"),
                     "cgroup_bytes": mean("cgroup_bytes"), "pages_shared": mean("pages_shared")},
            "per_instance": per,
            "give_back": give_back,
            // The first restore of a process fills the shared memory file; later ones map it.
            "restore_ms": restore_ms, "first_invoke_ms": first_invoke_ms,
        }))
    })();
    for i in insts {
        i.kill();
    }
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(())
}
