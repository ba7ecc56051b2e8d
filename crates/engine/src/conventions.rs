//! What capture, restore and reset agree on about a sandboxed process: numbers, below
//! all three, so that none of them imports another for one (issue #34).

/// The namespace pid of the captured process: PID 1 is the sandbox's init (the
/// reaper, recreated by every sandbox), PID 2 the runtime.
pub const MAIN_PID: i32 = 2;

/// The restore moves new descriptors through scratch numbers from here (or from above
/// the image's highest descriptor, see restore/fds.rs `scratch_base`).
pub const HIGH_FD_BASE: i32 = 700;

/// Descriptor number the userfaultfd keeps inside the restored process. Holding
/// it there keeps the fault context alive even if the node dies, so faults
/// block (and the process is killed) instead of reading zero pages.
pub const UFFD_KEEP_FD: u64 = 1000;

/// `_IOW('T', 0, u64)`: set a timerfd's count of expirations (CONFIG_CHECKPOINT_RESTORE).
pub(crate) const TFD_IOC_SET_TICKS: u64 = (1 << 30) | (8 << 16) | ((b'T' as u64) << 8);

/// The seccomp filters the sandbox puts a runtime (and a restore's stub) under: one,
/// its deny-list (crates/sandbox init.rs). A process under more installed its own.
pub const SANDBOX_SECCOMP_FILTERS: u32 = 1;
