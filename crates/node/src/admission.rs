//! Node-wide admission of new instances: one may start only while the node stays
//! within both its instance limit and its memory budget, the sum of the memory sizes
//! (MemorySize, the cgroup limit) of every live instance. Sizes are limits, not use:
//! admitting by them means the host can never be asked for more than it has (an
//! idle instance of another function is evicted first, see `Node::acquire`).

use std::sync::Mutex;

/// Why an instance was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The node already runs its maximum number of instances.
    Instances { max: usize },
    /// Its memory size does not fit in what the budget has left.
    Memory { need_mb: u64, used_mb: u64, budget_mb: u64 },
}

#[derive(Debug, Default, Clone, Copy)]
struct Used {
    instances: usize,
    memory_mb: u64,
}

/// The node's instance slots and memory budget.
#[derive(Debug)]
pub struct Admission {
    max_instances: usize,
    budget_mb: u64,
    used: Mutex<Used>,
}

impl Admission {
    pub fn new(max_instances: usize, budget_mb: u64) -> Admission {
        Admission { max_instances, budget_mb, used: Mutex::new(Used::default()) }
    }

    fn used(&self) -> std::sync::MutexGuard<'_, Used> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserve a slot and `memory_mb` for a new instance.
    pub fn admit(&self, memory_mb: u64) -> Result<(), Refused> {
        let mut u = self.used();
        if u.instances >= self.max_instances {
            return Err(Refused::Instances { max: self.max_instances });
        }
        if u.memory_mb + memory_mb > self.budget_mb {
            return Err(Refused::Memory { need_mb: memory_mb, used_mb: u.memory_mb, budget_mb: self.budget_mb });
        }
        u.instances += 1;
        u.memory_mb += memory_mb;
        Ok(())
    }

    /// Give back what [`Admission::admit`] reserved for an instance that is gone.
    pub fn release(&self, memory_mb: u64) {
        let mut u = self.used();
        u.instances = u.instances.saturating_sub(1);
        u.memory_mb = u.memory_mb.saturating_sub(memory_mb);
    }

    pub fn instances(&self) -> usize {
        self.used().instances
    }

    pub fn memory_mb(&self) -> u64 {
        self.used().memory_mb
    }

    pub fn budget_mb(&self) -> u64 {
        self.budget_mb
    }
}

/// The default memory budget: the host's MemTotal less 10% (at least 512 MiB) for
/// the node itself, the page cache of snapshots and the rest of the system.
pub fn default_budget_mb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse().ok()?;
    let total = kib / 1024;
    Some(total.saturating_sub((total / 10).max(512)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_within_both_limits() {
        let a = Admission::new(3, 1000);
        a.admit(400).unwrap();
        a.admit(400).unwrap();
        assert_eq!(a.admit(400), Err(Refused::Memory { need_mb: 400, used_mb: 800, budget_mb: 1000 }));
        a.admit(200).unwrap();
        assert_eq!(a.admit(0), Err(Refused::Instances { max: 3 }));
        a.release(400);
        assert_eq!((a.instances(), a.memory_mb()), (2, 600));
        a.admit(400).unwrap();
        assert_eq!(a.memory_mb(), 1000);
    }

    #[test]
    fn default_budget_leaves_room_for_the_host() {
        let b = default_budget_mb().unwrap();
        assert!(b > 0);
    }
}
