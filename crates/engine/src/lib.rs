//! The Thaw snapshot engine: capture a ready-to-invoke sandboxed process to an
//! image on disk, and restore new processes from it with their memory served by
//! a userfaultfd page server.
//!
//! Data flow: [`capture`] → [`image`] (sealed at rest by [`seal`]; a diff on a
//! shared base by [`layers`]) → [`restore`] + [`pageserver`] (reading [`pagefiles`]) → [`reset`].
//! All raw kernel interfaces live in [`sys`]; [`inject`] runs syscalls inside a
//! stopped tracee.

pub mod capture;
pub mod conventions;
pub mod fingerprint;
pub mod giveback;
pub mod image;
pub mod instance;
pub mod layered;
pub mod layers;
pub mod inject;
pub mod inspect;
pub mod pagefiles;
pub mod pageserver;
pub mod procfs;
pub mod refusals;
pub mod regs;
pub mod repurpose;
pub mod reset;
pub mod restore;
pub mod seal;
pub mod sharedmem;
pub mod sockdiag;
pub mod sys;
pub mod threads;
pub mod tmpfs;
pub mod ws;
