//! The Thaw node: a long-running service that serves functions from snapshots
//! behind a Lambda-compatible HTTP API. (Skeleton; being built.)

pub mod cli;
