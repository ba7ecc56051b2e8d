//! The only place in the engine that talks to the kernel through raw FFI.
//!
//! Everything here is a thin, typed wrapper around one kernel interface:
//! [`ptrace`] (stop, inspect and drive a tracee), [`uffd`] (userfaultfd ioctls
//! and messages), [`mem`] (reading/writing another process's memory, pidfds,
//! mmap of image files), [`kcmp`] (do two descriptors share a file). Every `unsafe` block carries a `// SAFETY:` comment;
//! the rest of the crate is written in safe Rust on top of these modules.

pub mod kcmp;
pub mod mem;
pub mod pagemap;
pub mod ptrace;
pub mod uffd;

/// Size of a page on x86-64; the image format is defined in these units.
pub const PAGE_SIZE: u64 = 4096;

/// The last OS error as an `std::io::Error`.
pub(crate) fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}
