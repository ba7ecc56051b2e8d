//! A consistent-hashing ring over node names.
//!
//! Each node owns `vnodes` points on a 64-bit circle (hash of "name#i"); a function's key
//! is a point too, and walking clockwise from it gives the function's preference order
//! over nodes. The first node is its primary home, the next ones its fallbacks. Removing
//! a node only moves the keys it owned (to the next node on the circle); adding one only
//! takes keys from others. Points depend only on names, so every gateway replica builds
//! the same ring from the same node set, whatever the order it learnt the nodes in.

use crate::hash::{hash_pair, hash_str};

/// Virtual nodes per node: with 128 points per node the heaviest of 1,000 nodes owns
/// ~1.3x the mean arc (measured in `tests::arc_balance`).
pub const DEFAULT_VNODES: u32 = 128;

#[derive(Debug, Clone)]
pub struct Ring {
    /// (point, node index), sorted by point.
    points: Vec<(u64, u32)>,
    nodes: usize,
}

impl Ring {
    /// A ring over `names` (node index = position in `names`).
    pub fn new<S: AsRef<str>>(names: &[S], vnodes: u32) -> Ring {
        let vnodes = vnodes.max(1);
        let mut points = Vec::with_capacity(names.len() * vnodes as usize);
        for (i, name) in names.iter().enumerate() {
            let h = hash_str(name.as_ref());
            for v in 0..vnodes {
                points.push((hash_pair(h, u64::from(v)), i as u32));
            }
        }
        // Ties (astronomically rare) are broken by node name order via the index, which
        // differs between rings with different node sets; acceptable.
        points.sort_unstable();
        Ring { points, nodes: names.len() }
    }

    pub fn len(&self) -> usize {
        self.nodes
    }

    pub fn is_empty(&self) -> bool {
        self.nodes == 0
    }

    /// Nodes in ring order clockwise from `key`. Each node appears once; the walk ends
    /// after every node has been seen.
    pub fn walk(&self, key: u64) -> Walk<'_> {
        let start = self.points.partition_point(|&(p, _)| p < key);
        Walk { ring: self, pos: start, steps: 0, seen: Seen::new(self.nodes), left: self.nodes }
    }

    /// The first `k` nodes of [`Ring::walk`]: the key's home nodes.
    pub fn homes(&self, key: u64, k: usize) -> Vec<usize> {
        self.walk(key).take(k).collect()
    }
}

/// Set of already-yielded nodes: a short list first (most walks stop after 1-3 nodes),
/// a bitmap once the walk gets long.
#[derive(Debug)]
enum Seen {
    Few(Vec<u32>),
    Bits(Vec<u64>),
}

impl Seen {
    fn new(_n: usize) -> Seen {
        Seen::Few(Vec::new())
    }

    /// Inserts; false if it was there already.
    fn insert(&mut self, node: u32, n: usize) -> bool {
        match self {
            Seen::Few(v) => {
                if v.contains(&node) {
                    return false;
                }
                if v.len() < 16 {
                    v.push(node);
                    return true;
                }
                let mut bits = vec![0u64; n.div_ceil(64)];
                for &x in v.iter() {
                    bits[x as usize / 64] |= 1 << (x % 64);
                }
                *self = Seen::Bits(bits);
                self.insert(node, n)
            }
            Seen::Bits(b) => {
                let (w, m) = (node as usize / 64, 1u64 << (node % 64));
                let new = b[w] & m == 0;
                b[w] |= m;
                new
            }
        }
    }
}

#[derive(Debug)]
pub struct Walk<'a> {
    ring: &'a Ring,
    pos: usize,
    steps: usize,
    seen: Seen,
    left: usize,
}

impl Iterator for Walk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let pts = &self.ring.points;
        while self.left > 0 && self.steps < pts.len() {
            let (_, node) = pts[self.pos % pts.len()];
            self.pos += 1;
            self.steps += 1;
            if self.seen.insert(node, self.ring.nodes) {
                self.left -= 1;
                return Some(node as usize);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::hash_str;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i:04}")).collect()
    }

    #[test]
    fn walk_visits_every_node_once() {
        let ring = Ring::new(&names(50), 16);
        let mut v: Vec<usize> = ring.walk(hash_str("f")).collect();
        assert_eq!(v.len(), 50);
        v.sort();
        v.dedup();
        assert_eq!(v.len(), 50);
        assert!(Ring::new(&Vec::<String>::new(), 16).walk(1).next().is_none());
    }

    #[test]
    fn removing_a_node_moves_only_its_keys() {
        let all = names(100);
        let ring = Ring::new(&all, DEFAULT_VNODES);
        let gone = 37;
        let rest: Vec<String> = all.iter().enumerate().filter(|&(i, _)| i != gone).map(|(_, s)| s.clone()).collect();
        let smaller = Ring::new(&rest, DEFAULT_VNODES);
        let mut moved = 0;
        for f in 0..10_000 {
            let key = hash_str(&format!("fn-{f}"));
            let before = &all[ring.walk(key).next().unwrap()];
            let after = &rest[smaller.walk(key).next().unwrap()];
            if before != after {
                assert_eq!(before, &all[gone], "key {f} moved off a node that stayed");
                // It moves to its second home: the fallback order is stable too.
                let second = &all[ring.walk(key).nth(1).unwrap()];
                assert_eq!(after, second);
                moved += 1;
            }
        }
        assert!(moved > 0 && moved < 300, "moved {moved} of 10000 (expected ~100)");
    }

    #[test]
    fn arc_balance() {
        let ring = Ring::new(&names(1000), DEFAULT_VNODES);
        let mut owned = vec![0u32; 1000];
        for f in 0..200_000 {
            owned[ring.walk(hash_str(&format!("fn-{f}"))).next().unwrap()] += 1;
        }
        let max = *owned.iter().max().unwrap() as f64;
        assert!(max / 200.0 < 1.6, "heaviest node owns {max} keys, mean 200");
    }
}
