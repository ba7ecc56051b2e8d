//! CPU time per cold start (issue #33): the harness's own, which is the node's side of a
//! start (opening the snapshot, the sandbox, the restore's syscall injection, the page
//! server and the working-set read, all threads of this process), and the restored
//! instance's (its threads, from /proc: the code it ran at restore and the first
//! invocation). On 2 cores a burst is CPU-bound, so what a start costs in CPU is what
//! bounds how many start at once.

/// CPU time (user + system) this process has used, all its threads (ended ones too), ms.
pub fn process_ms() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).map_or(0.0, |t| t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6)
}

/// CPU time process `pid`'s live threads have used, ms (the first field of each
/// thread's schedstat: nanoseconds on a CPU). None if /proc cannot say. A thread that
/// ends between the listing and the read is left out (its time is lost with it).
pub fn task_ms(pid: i32) -> Option<f64> {
    let mut ns: u64 = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else { continue };
        ns += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_cpu_a_busy_thread_uses() {
        let pid = std::process::id() as i32;
        let (p0, t0) = (process_ms(), task_ms(pid).unwrap());
        // Spin until the threads' own count says 20 ms went by (bounded in wall time, so
        // a count that never moves fails rather than hangs).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        while task_ms(pid).unwrap() - t0 < 20.0 {
            assert!(std::time::Instant::now() < deadline, "schedstat did not count 20 ms of spinning");
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        assert!(process_ms() - p0 >= 20.0, "the process clock counts what its threads spent");
        assert!(task_ms(-1).is_none());
    }
}
