//! How many restores run at once in a process (issue #33), first come first served.
//!
//! A burst of cold starts on a small host is CPU-bound: 16 restores of helloworld need
//! ~28 ms of CPU on 2 cores. Run all at once, the scheduler shares the cores among them
//! and they all finish near the end (median 12.9 ms, bench/results). Let through a few
//! at a time, in arrival order, and they finish in waves: the first after a few
//! milliseconds, the median at about half the burst's CPU time, the last no later than
//! before. The gate covers the CPU-heavy part of a restore (sandbox, injection, memory),
//! not the instance's first steps after it resumes.
//!
//! Permits: `THAW_RESTORE_GATE` (a number; `0` or `off`: no gate), else two per core (a
//! restore also waits for its sandbox's init and for the disk; the second permit keeps
//! the core busy meanwhile). A hand-written ticket lock rather than a semaphore crate:
//! it must be FIFO (std has no semaphore; tokio's is async and the restore path is not).

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub struct Gate {
    permits: u64,
    /// (tickets handed out, permits given back).
    state: Mutex<(u64, u64)>,
    cv: Condvar,
}

/// A permit; given back when dropped.
pub struct Permit<'a> {
    gate: &'a Gate,
    /// How long the restore waited for it.
    pub waited: Duration,
}

impl Gate {
    pub fn new(permits: u64) -> Gate {
        Gate { permits: permits.max(1), state: Mutex::new((0, 0)), cv: Condvar::new() }
    }

    /// Wait for a permit, after every caller that came before.
    pub fn enter(&self) -> Permit<'_> {
        let t0 = Instant::now();
        let mut s = self.state.lock().expect("restore gate lock");
        let ticket = s.0;
        s.0 += 1;
        // Ticket t may run while fewer than `permits` of the tickets before it are still
        // running: t < given back + permits.
        while ticket >= s.1 + self.permits {
            s = self.cv.wait(s).expect("restore gate lock");
        }
        Permit { gate: self, waited: t0.elapsed() }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.gate.state.lock().expect("restore gate lock").1 += 1;
        self.gate.cv.notify_all();
    }
}

/// The process's gate, or None when `THAW_RESTORE_GATE` turns it off.
pub fn global() -> Option<&'static Gate> {
    static GATE: OnceLock<Option<Gate>> = OnceLock::new();
    GATE.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
        match std::env::var("THAW_RESTORE_GATE").as_deref() {
            Ok("0") | Ok("off") => None,
            Ok(v) => Some(Gate::new(v.parse().unwrap_or(2 * cores))),
            Err(_) => Some(Gate::new(2 * cores)),
        }
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Runs 6 callers through a gate of `permits`, queued in a known order behind
    /// callers holding every permit; returns (order they entered, most inside at once).
    fn run(permits: u64) -> (Vec<usize>, usize) {
        let gate = Arc::new(Gate::new(permits));
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(Mutex::new(Vec::new()));
        let held: Vec<Permit<'_>> = (0..permits).map(|_| gate.enter()).collect();
        let mut threads = Vec::new();
        for i in 0..6 {
            let (g, inside, most, order) = (gate.clone(), inside.clone(), most.clone(), order.clone());
            threads.push(std::thread::spawn(move || {
                let _p = g.enter();
                order.lock().unwrap().push(i);
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
            // Each takes its ticket before the next starts.
            while gate.state.lock().unwrap().0 < permits + 1 + i as u64 {
                std::thread::yield_now();
            }
        }
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        let order = order.lock().unwrap().clone();
        (order, most.load(Ordering::SeqCst))
    }

    #[test]
    fn one_at_a_time_in_arrival_order() {
        assert_eq!(run(1), (vec![0, 1, 2, 3, 4, 5], 1));
    }

    #[test]
    fn never_more_than_its_permits() {
        let (order, most) = run(2);
        assert_eq!(order.len(), 6);
        assert!(most <= 2, "{most} inside a gate of 2");
        let g = Gate::new(3);
        let t0 = Instant::now();
        let _held: Vec<Permit<'_>> = (0..3).map(|_| g.enter()).collect();
        assert!(t0.elapsed() < Duration::from_secs(1), "a free gate lets its permits through at once");
    }
}
