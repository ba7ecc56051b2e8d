//! Language runtimes and the control channel between the node and a function
//! instance.
//!
//! [`runtimes`] knows how to start each language's shim inside a sandbox;
//! [`channel`] speaks the framed JSON protocol documented in
//! `runtimes/python/README.md` (4-byte big-endian length + UTF-8 JSON).

#![forbid(unsafe_code)]

pub mod channel;
pub mod runtimes;

pub use channel::{Channel, ChannelError, FunctionError, InvokeOutcome, InvokeRequest};
pub use runtimes::{Runtime, RuntimeError, LATEST_VERSION};
