//! Thaw on a cluster.
//!
//! - [`placement`]: which node runs an invocation (consistent hashing with bounded
//!   loads, snapshot-aware), used by the gateway and by the simulator alike;
//! - [`ring`], [`hash`]: the deterministic consistent-hashing ring under it;
//! - [`sim`]: `thaw sim`, trace-driven simulation of 10..1,000 nodes;
//! - [`view`]: advertisements (ThawNode objects) watched from the apiserver, as placement inputs;
//! - [`gateway`]: `thaw gateway` (skeleton): Lambda API + SigV4, Invoke forwarded to the placed agent;
//! - [`controlplane`]: a real etcd + kube-apiserver on 127.0.0.1 for tests.
#![forbid(unsafe_code)]

pub mod cli;
pub mod controlplane;
pub mod gateway;
pub mod hash;
pub mod placement;
pub mod ring;
pub mod sim;
pub mod view;

mod chart;
