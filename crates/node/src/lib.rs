//! The Thaw node: a long-running service that serves functions from snapshots
//! behind a Lambda-compatible HTTP API.
//!
//! Data flow of an invocation: [`api`] (HTTP, SigV4 via [`sigv4`], Lambda
//! shapes) → [`node`] (function state, instance pools, limits, keep-alive) →
//! [`workers`] (long-lived threads that restore/boot/kill sandboxes) →
//! `thaw_engine::instance`. Deploys: [`api`] → [`bundle`] (unzip) → [`node`]
//! build (boot + capture on a build worker) → [`registry`] (SQLite).
//! Asynchronous invocations go through [`events`] (persisted queue + retries).

#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod bundle;
pub mod cli;
pub mod events;
pub mod keys;
pub mod metrics;
pub mod node;
pub mod registry;
pub mod runtimes;
pub mod sigv4;
pub mod workers;
