//! Where an invocation runs: the placement policy shared by the gateway and `thaw sim`.
//!
//! Thaw's policy (`Policy::Thaw`) is *consistent hashing with bounded loads*
//! (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018)
//! made snapshot-aware. With `N` nodes, `L` invocations in flight and a load factor
//! `c` (default 1.25), no node may take an invocation once it runs
//! `bound = ceil(c * (L + 1) / N)` of them. Then, in order of preference:
//!
//! 1. **warm**: a node with an idle warm instance of the function (no restore at all),
//!    in the order the caller lists them (most recently idle first);
//! 2. **cached**: a node whose snapshot cache holds the function's snapshot (a local
//!    restore, no store fetch), the least loaded first;
//! 3. **ring**: walk the consistent-hashing ring clockwise from the function's key and
//!    take the first node under the bound. The first nodes of that walk are the
//!    function's *home nodes*: a function keeps landing on the same few nodes, so their
//!    caches stay hot; when they are busy it spills to the next nodes on the ring (again
//!    the same ones each time), so a hot function spreads over a stable, growing set
//!    instead of piling onto one node.
//!
//! Every step skips nodes at the bound, so the busiest node carries at most
//! `c` times the mean (plus one) at every instant, whatever the popularity skew.
//! Because the ring depends only on node names, removing a node moves only the
//! functions whose walk passed through it, and every gateway replica computes the same
//! answer from the same state.
//!
//! For comparison (`thaw sim --policy`): `Random` (uniform), `LeastLoaded` (fewest
//! invocations in flight, random tie-break) and `Hash` (plain consistent hashing: always
//! the primary home, no bound). None of the three looks at warm instances or caches;
//! they profit from them only when they happen to pick the right node.
//!
//! Everything here is pure: same inputs (and same RNG state), same decision.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::hash::{hash_pair, Rng};
use crate::ring::Ring;

/// Default load factor `c` of the bound (the target: busiest node <= 1.25x mean).
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    Random,
    LeastLoaded,
    Hash,
    Thaw,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Random, Policy::LeastLoaded, Policy::Hash, Policy::Thaw];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::LeastLoaded => "least-loaded",
            Policy::Hash => "hash",
            Policy::Thaw => "thaw",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown placement policy {0:?} (expected random, least-loaded, hash or thaw)")]
pub struct UnknownPolicy(String);

impl FromStr for Policy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Policy, UnknownPolicy> {
        Policy::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// The nodes' current load: invocations in flight per node.
pub trait Loads {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn load(&self, node: usize) -> u32;
    /// Sum of all loads.
    fn total(&self) -> u64;
    /// A least-loaded node, ties broken uniformly at random. The default scans every
    /// node; the simulator overrides it with an O(1) bucket index.
    fn least_loaded(&self, rng: &mut Rng) -> usize {
        let (mut best, mut best_load, mut ties) = (0, u32::MAX, 0u64);
        for n in 0..self.len() {
            let l = self.load(n);
            if l < best_load {
                (best, best_load, ties) = (n, l, 1);
            } else if l == best_load {
                ties += 1;
                if rng.below(ties) == 0 {
                    best = n;
                }
            }
        }
        best
    }
}

impl Loads for [u32] {
    fn len(&self) -> usize {
        <[u32]>::len(self)
    }
    fn load(&self, node: usize) -> u32 {
        self[node]
    }
    fn total(&self) -> u64 {
        self.iter().map(|&l| u64::from(l)).sum()
    }
}

/// What placement knows about one invocation of a function.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The function's ring key: [`crate::hash::hash_str`] of its name (and version).
    pub key: u64,
    /// Nodes with an idle warm instance of it, preferred first.
    pub warm: &'a [usize],
    /// Nodes whose snapshot cache holds its snapshot.
    pub cached: &'a [usize],
}

/// Why a node was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    Warm,
    Cached,
    /// The n-th node (0 = primary home) of the function's ring walk.
    Ring(u32),
    Random,
    LeastLoaded,
    Hash,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub node: usize,
    pub reason: Reason,
}

/// A placement policy over a fixed node set (node index = position in the names the
/// ring was built from). Rebuild it when the node set changes.
#[derive(Debug, Clone)]
pub struct Placer {
    policy: Policy,
    ring: Ring,
    load_factor: f64,
}

impl Placer {
    pub fn new(policy: Policy, ring: Ring, load_factor: f64) -> Placer {
        Placer { policy, ring, load_factor: load_factor.max(1.0) }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The most invocations a node may run for it to take one more:
    /// `ceil(c * (total + 1) / nodes)`.
    pub fn bound<L: Loads + ?Sized>(&self, loads: &L) -> u32 {
        let n = loads.len().max(1) as f64;
        (self.load_factor * (loads.total() + 1) as f64 / n).ceil() as u32
    }

    /// Chooses a node; `None` only when there are no nodes.
    pub fn place<L: Loads + ?Sized>(&self, req: &Request<'_>, loads: &L, rng: &mut Rng) -> Option<Decision> {
        let n = loads.len();
        if n == 0 || self.ring.is_empty() {
            return None;
        }
        debug_assert_eq!(n, self.ring.len(), "loads and ring disagree on the node count");
        let d = |node, reason| Some(Decision { node, reason });
        match self.policy {
            Policy::Random => d(rng.below(n as u64) as usize, Reason::Random),
            Policy::LeastLoaded => d(loads.least_loaded(rng), Reason::LeastLoaded),
            Policy::Hash => d(self.ring.walk(req.key).next()?, Reason::Hash),
            Policy::Thaw => {
                let bound = self.bound(loads);
                let free = |node: usize| loads.load(node) < bound;
                if let Some(&w) = req.warm.iter().find(|&&w| w < n && free(w)) {
                    return d(w, Reason::Warm);
                }
                let cached = req
                    .cached
                    .iter()
                    .copied()
                    .filter(|&c| c < n && free(c))
                    .min_by_key(|&c| (loads.load(c), hash_pair(req.key, c as u64)));
                if let Some(c) = cached {
                    return d(c, Reason::Cached);
                }
                // Some node is always under the bound: the mean load is below it.
                let (rank, node) = self.ring.walk(req.key).enumerate().find(|&(_, node)| free(node))?;
                d(node, Reason::Ring(rank as u32))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::hash_str;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    fn placer(policy: Policy, n: usize) -> Placer {
        Placer::new(policy, Ring::new(&names(n), 64), DEFAULT_LOAD_FACTOR)
    }

    fn req(key: u64) -> Request<'static> {
        Request { key, warm: &[], cached: &[] }
    }

    #[test]
    fn policy_names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        let err = "fastest".parse::<Policy>().unwrap_err();
        assert_eq!(err.to_string(), "unknown placement policy \"fastest\" (expected random, least-loaded, hash or thaw)");
    }

    #[test]
    fn preference_order_warm_then_cached_then_home() {
        let p = placer(Policy::Thaw, 10);
        let key = hash_str("f");
        let home = p.ring().walk(key).next().unwrap();
        let (warm, cached) = ((home + 3) % 10, (home + 5) % 10);
        let loads = [0u32; 10];
        let mut rng = Rng::new(1);
        let (w, c) = ([warm], [cached]);
        let place = |warm: &[usize], cached: &[usize], loads: &[u32], rng: &mut Rng| p.place(&Request { key, warm, cached }, loads, rng);
        assert_eq!(place(&w, &c, &loads, &mut rng), Some(Decision { node: warm, reason: Reason::Warm }));
        assert_eq!(place(&[], &c, &loads, &mut rng), Some(Decision { node: cached, reason: Reason::Cached }));
        assert_eq!(place(&[], &[], &loads, &mut rng), Some(Decision { node: home, reason: Reason::Ring(0) }));
        assert_eq!(place(&[], &[], &[], &mut rng), None);
    }

    #[test]
    fn busy_nodes_are_skipped_even_when_warm_or_cached() {
        let p = placer(Policy::Thaw, 4);
        let key = hash_str("g");
        let walk: Vec<usize> = p.ring().walk(key).collect();
        // total 6 in flight: bound = ceil(1.25 * 7 / 4) = 3; the home node runs 3.
        let mut loads = [1u32; 4];
        loads[walk[0]] = 3;
        assert_eq!(p.bound(&loads[..]), 3);
        let busy = [walk[0]];
        let mut rng = Rng::new(1);
        let d = p.place(&Request { key, warm: &busy, cached: &busy }, &loads[..], &mut rng).unwrap();
        assert_eq!(d, Decision { node: walk[1], reason: Reason::Ring(1) });
    }

    #[test]
    fn bound_holds_under_a_single_hot_function() {
        // 10,000 invocations of ONE function, never finishing: plain hashing piles all on
        // one node, the bounded policy keeps every node within c * mean + 1.
        let n = 20;
        for policy in [Policy::Thaw, Policy::Hash] {
            let p = placer(policy, n);
            let mut loads = vec![0u32; n];
            let mut rng = Rng::new(3);
            let key = hash_str("hot");
            for i in 1..=10_000u64 {
                let node = p.place(&req(key), &loads[..], &mut rng).unwrap().node;
                loads[node] += 1;
                let max = *loads.iter().max().unwrap() as f64;
                if policy == Policy::Thaw {
                    assert!(max <= (DEFAULT_LOAD_FACTOR * i as f64 / n as f64).ceil() + 1.0, "after {i}: max {max}");
                }
            }
            if policy == Policy::Hash {
                assert_eq!(*loads.iter().max().unwrap(), 10_000);
            }
        }
    }

    #[test]
    fn few_functions_keep_few_homes() {
        // Light load: each function always lands on its primary home.
        let p = placer(Policy::Thaw, 50);
        let loads = [0u32; 50];
        let mut rng = Rng::new(9);
        for f in 0..100 {
            let key = hash_str(&format!("fn-{f}"));
            let d = p.place(&req(key), &loads[..], &mut rng).unwrap();
            assert_eq!(d.reason, Reason::Ring(0));
            assert_eq!(d.node, p.ring().homes(key, 1)[0]);
        }
    }

    #[test]
    fn least_loaded_and_random_are_deterministic_per_seed() {
        let loads = [3u32, 1, 2, 1, 5];
        for policy in [Policy::Random, Policy::LeastLoaded] {
            let p = placer(policy, 5);
            let run = |seed| {
                let mut rng = Rng::new(seed);
                (0..50).map(|_| p.place(&req(1), &loads[..], &mut rng).unwrap().node).collect::<Vec<_>>()
            };
            assert_eq!(run(5), run(5));
            if policy == Policy::LeastLoaded {
                assert!(run(5).iter().all(|&n| n == 1 || n == 3));
                assert!(run(5).contains(&1) && run(5).contains(&3));
            }
        }
    }
}
