//! ptrace wrappers: seize/interrupt a live process, read and write its
//! registers (general purpose, xstate), signal mask, pending signals and rseq
//! configuration.
//!
//! A [`Tracee`] is bound to the OS thread that attached it: the kernel makes
//! that *thread* the tracer, so every call must come from it.

use std::io;

use nix::sys::ptrace as nptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::last_err;

const PTRACE_GETREGSET: libc::c_uint = 0x4204;
const PTRACE_SETREGSET: libc::c_uint = 0x4205;
const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;
const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;
const PTRACE_PEEKSIGINFO: libc::c_uint = 0x4209;
const PTRACE_PEEKSIGINFO_SHARED: u32 = 1;
/// Size of the kernel's siginfo_t.
pub const SIGINFO_LEN: usize = 128;
/// More queued signals than any RLIMIT_SIGPENDING gives a process here: a queue
/// this long is read no further (the caller compares it with the pending set).
const PEEK_MAX: usize = 1 << 16;
const NT_X86_XSTATE: libc::c_ulong = 0x202;
/// Large enough for every xstate layout x86-64 CPUs have today (AMX included).
const XSTATE_MAX: usize = 16 * 1024;

pub use libc::user_regs_struct as Regs;

/// rseq registration of a thread as the kernel reports it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RseqConfig {
    pub rseq_abi_pointer: u64,
    pub rseq_abi_size: u32,
    pub signature: u32,
    pub flags: u32,
    pub pad: u32,
}
const _: () = assert!(std::mem::size_of::<RseqConfig>() == 24);

/// struct ptrace_peeksiginfo_args.
#[repr(C)]
struct PeekSiginfoArgs {
    off: u64,
    flags: u32,
    nr: i32,
}

/// A stopped thread under our control.
#[derive(Debug, Clone, Copy)]
pub struct Tracee {
    pub pid: Pid,
}

fn nix_io(e: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

impl Tracee {
    /// Attach to a running process without stopping it, then stop it with
    /// PTRACE_INTERRUPT and wait for the stop.
    pub fn seize_and_stop(pid: i32) -> io::Result<Tracee> {
        let pid = Pid::from_raw(pid);
        let opts = nptrace::Options::PTRACE_O_TRACESYSGOOD | nptrace::Options::PTRACE_O_EXITKILL;
        nptrace::seize(pid, opts).map_err(nix_io)?;
        nptrace::interrupt(pid).map_err(nix_io)?;
        let t = Tracee { pid };
        t.wait_stop()?;
        Ok(t)
    }

    /// A process this thread already traces and that is stopped (our restore stub,
    /// seized by the sandbox).
    pub fn attached(pid: i32) -> io::Result<Tracee> {
        let pid = Pid::from_raw(pid);
        let opts = nptrace::Options::PTRACE_O_TRACESYSGOOD | nptrace::Options::PTRACE_O_EXITKILL;
        nptrace::setoptions(pid, opts).map_err(nix_io)?;
        Ok(Tracee { pid })
    }

    /// Also trace threads and processes this tracee creates (they start stopped,
    /// attached to us).
    pub fn trace_clones(&self) -> io::Result<()> {
        let opts = nptrace::Options::PTRACE_O_TRACESYSGOOD
            | nptrace::Options::PTRACE_O_EXITKILL
            | nptrace::Options::PTRACE_O_TRACECLONE
            | nptrace::Options::PTRACE_O_TRACEFORK;
        nptrace::setoptions(self.pid, opts).map_err(nix_io)
    }

    /// Wait until the tracee is in some ptrace stop; returns the stop signal.
    pub fn wait_stop(&self) -> io::Result<Option<Signal>> {
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::__WALL)).map_err(nix_io)? {
                WaitStatus::Stopped(_, sig) => return Ok(Some(sig)),
                WaitStatus::PtraceEvent(_, _, _) => return Ok(None),
                WaitStatus::PtraceSyscall(_) => return Ok(None),
                WaitStatus::Exited(_, code) => {
                    return Err(io::Error::other(format!("process exited with status {code}")))
                }
                WaitStatus::Signaled(_, sig, _) => {
                    return Err(io::Error::other(format!("process was killed by {sig}")))
                }
                _ => continue,
            }
        }
    }

    /// Wait until the tracee has exited: its exit code (None: killed by a signal).
    pub fn wait_exit(&self) -> io::Result<Option<i32>> {
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::__WALL)).map_err(nix_io)? {
                WaitStatus::Exited(_, code) => return Ok(Some(code)),
                WaitStatus::Signaled(..) => return Ok(None),
                WaitStatus::Stopped(_, sig) => return Err(io::Error::other(format!("stopped by {sig} instead of exiting"))),
                _ => continue,
            }
        }
    }

    pub fn get_regs(&self) -> io::Result<Regs> {
        nptrace::getregs(self.pid).map_err(nix_io)
    }

    pub fn set_regs(&self, regs: &Regs) -> io::Result<()> {
        nptrace::setregs(self.pid, *regs).map_err(nix_io)
    }

    /// The XSAVE area (FPU, SSE, AVX... state) as raw bytes.
    pub fn get_xstate(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; XSTATE_MAX];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: iov points at a live buffer of iov_len bytes; the kernel writes at most
        // iov_len bytes and updates iov_len to the size written.
        let r = unsafe { libc::ptrace(PTRACE_GETREGSET, self.pid.as_raw(), NT_X86_XSTATE, &mut iov) };
        if r < 0 {
            return Err(last_err());
        }
        buf.truncate(iov.iov_len);
        Ok(buf)
    }

    pub fn set_xstate(&self, xstate: &[u8]) -> io::Result<()> {
        let mut copy = xstate.to_vec();
        let mut iov = libc::iovec { iov_base: copy.as_mut_ptr().cast(), iov_len: copy.len() };
        // SAFETY: iov describes `copy`, which outlives the call; the kernel only reads it.
        let r = unsafe { libc::ptrace(PTRACE_SETREGSET, self.pid.as_raw(), NT_X86_XSTATE, &mut iov) };
        if r < 0 {
            return Err(last_err());
        }
        Ok(())
    }

    pub fn get_sigmask(&self) -> io::Result<u64> {
        let mut mask: u64 = 0;
        // SAFETY: the kernel writes exactly `size_of::<u64>()` bytes into `mask`.
        let r = unsafe {
            libc::ptrace(PTRACE_GETSIGMASK, self.pid.as_raw(), std::mem::size_of::<u64>(), &mut mask)
        };
        if r < 0 {
            return Err(last_err());
        }
        Ok(mask)
    }

    pub fn set_sigmask(&self, mask: u64) -> io::Result<()> {
        // SAFETY: the kernel reads exactly `size_of::<u64>()` bytes from `mask`.
        let r = unsafe {
            libc::ptrace(PTRACE_SETSIGMASK, self.pid.as_raw(), std::mem::size_of::<u64>(), &mask)
        };
        if r < 0 {
            return Err(last_err());
        }
        Ok(())
    }

    /// The signals queued and not yet delivered, in queue order, without dequeuing
    /// them: the thread's own queue, or the process's (`shared`). Each is the
    /// kernel's siginfo_t.
    pub fn pending_signals(&self, shared: bool) -> io::Result<Vec<[u8; SIGINFO_LEN]>> {
        const BATCH: usize = 32;
        let mut out = Vec::new();
        loop {
            let mut buf = [[0u8; SIGINFO_LEN]; BATCH];
            let args = PeekSiginfoArgs { off: out.len() as u64, flags: if shared { PTRACE_PEEKSIGINFO_SHARED } else { 0 }, nr: BATCH as i32 };
            // SAFETY: the kernel reads `args` and writes at most `args.nr` siginfo_t
            // (SIGINFO_LEN bytes each) into `buf`, which holds that many.
            let r = unsafe { libc::ptrace(PTRACE_PEEKSIGINFO, self.pid.as_raw(), &args as *const PeekSiginfoArgs, buf.as_mut_ptr()) };
            if r < 0 {
                return Err(last_err());
            }
            let n = (r as usize).min(BATCH);
            out.extend_from_slice(&buf[..n]);
            if n < BATCH || out.len() >= PEEK_MAX {
                return Ok(out);
            }
        }
    }

    pub fn get_rseq(&self) -> io::Result<RseqConfig> {
        let mut conf = RseqConfig::default();
        // SAFETY: the kernel writes at most `size_of::<RseqConfig>()` bytes into `conf`.
        let r = unsafe {
            libc::ptrace(
                PTRACE_GET_RSEQ_CONFIGURATION,
                self.pid.as_raw(),
                std::mem::size_of::<RseqConfig>(),
                &mut conf,
            )
        };
        if r < 0 {
            return Err(last_err());
        }
        Ok(conf)
    }

    /// Resume until the next stop (used to run injected code that ends in int3).
    pub fn cont(&self) -> io::Result<()> {
        nptrace::cont(self.pid, None).map_err(nix_io)
    }

    /// Resume for one instruction (a `syscall` instruction: until the call returns).
    pub fn step(&self) -> io::Result<()> {
        nptrace::step(self.pid, None).map_err(nix_io)
    }

    /// Resume until the next syscall entry or exit stop.
    pub fn syscall(&self) -> io::Result<()> {
        nptrace::syscall(self.pid, None).map_err(nix_io)
    }

    /// Let the process run on its own, suppressing any pending stop signal.
    pub fn detach(&self) -> io::Result<()> {
        nptrace::detach(self.pid, None).map_err(nix_io)
    }

    /// End this thread (not the leader): it runs `exit(0)` (the thread alone, not
    /// `exit_group`) at the `syscall` instruction at `insn`, as if it had returned
    /// from its start routine without cleaning up; returns once it is gone (reaped).
    /// Whatever it was blocked in is abandoned, not restarted.
    pub fn exit_thread(&self, insn: u64) -> io::Result<()> {
        let mut regs = self.get_regs()?;
        regs.rip = insn;
        regs.rax = libc::SYS_exit as u64;
        regs.orig_rax = u64::MAX;
        regs.rdi = 0;
        self.set_regs(&regs)?;
        self.cont()?;
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::__WALL)).map_err(nix_io)? {
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => return Ok(()),
                // A stop on the way (a signal that was pending): go on to the exit.
                WaitStatus::Stopped(..) | WaitStatus::PtraceEvent(..) | WaitStatus::PtraceSyscall(_) => self.cont()?,
                _ => continue,
            }
        }
    }
}

/// `get_robust_list(2)` of another thread: (head, len).
pub fn robust_list(pid: i32) -> io::Result<(u64, u64)> {
    let mut head: u64 = 0;
    let mut len: usize = 0;
    // SAFETY: both out-pointers are valid for writes of their types.
    let r = unsafe { libc::syscall(libc::SYS_get_robust_list, pid, &mut head, &mut len) };
    if r < 0 {
        return Err(last_err());
    }
    Ok((head, len as u64))
}

/// SIGKILL a process whose threads we trace, and reap them (see [`reap_threads`]).
pub fn kill_and_reap(leader: i32, traced: &[Tracee]) {
    let _ = nix::sys::signal::kill(Pid::from_raw(leader), Signal::SIGKILL);
    reap_threads(leader, traced);
}

/// After SIGKILLing a process whose threads we trace: reap every traced thread,
/// the leader included (a traced thread's exit waits for its tracer; the leader's
/// parent is the sandbox's init, which reaps it once we have). Threads are polled
/// in any order: the leader is reported only after its threads are gone.
pub fn reap_threads(leader: i32, traced: &[Tracee]) {
    let mut left: Vec<Pid> = traced.iter().map(|t| t.pid).collect();
    if !left.contains(&Pid::from_raw(leader)) {
        left.push(Pid::from_raw(leader));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        left.retain(|&p| match waitpid(p, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) | Err(_) => false,
            Ok(_) => true,
        });
        if !left.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
