//! What a live, idle instance is, read from outside, for differential checks (issue
//! #30): a reset instance and a fresh restore of the same snapshot, both at the ready
//! point, must have the same layout, page contents, registers, descriptor table and
//! signal state. [`state`] flattens all of it into one map of named facts
//! (`page:ADDR`, `thread:TID:rip`, `fd:N`, `signals:SigBlk`...), so that two readings
//! compare key by key and a difference names what differs.
//!
//! A thread stopped inside a blocking syscall is recorded as about to issue it (the
//! form a restore or a reset leaves it in; the kernel restarts it either way).
//!
//! Where the instance's writes are tracked (restored for in-place resets), a page
//! written since the restore or the last reset — by the runtime's own answer to the
//! restore notice: reseeding, after-restore hooks — is marked `written`: its content
//! is the runtime's doing after the ready point, and differs from clone to clone. So
//! is every page of a writable private mapping that is not tracked in such an
//! instance: the runtime made it after the ready point (V8 takes a new 256 KiB page
//! for its heap after each restore and reset; a reset unmaps it as made since).
//!
//! Pages are hashed (SHA-256, first 16 hex digits). A page /proc/PID/mem cannot read
//! is one of a userfaultfd range never touched since the restore: what it holds is
//! what the image holds there (its stored page, or zeros), and that is what is
//! hashed — so a page a fresh instance never touched still compares with the same page
//! of an instance that did.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::pageserver::PageSource;
use crate::procfs;
use crate::sys::mem::ProcMem;
use crate::sys::pagemap::Pagemap;
use crate::sys::ptrace::Tracee;
use crate::sys::PAGE_SIZE;

#[derive(Debug, Error)]
pub enum InspectError {
    #[error("instance {pid}: {what}")]
    Io { pid: i32, what: String, #[source] source: io::Error },
    #[error("instance {pid}: reading the image's page at {addr:#x}")]
    Image { pid: i32, addr: u64, #[source] source: crate::pageserver::PageServerError },
}

/// Names of the registers in [`crate::regs::to_array`]'s order.
const REGS: [&str; 27] = [
    "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags",
    "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs",
];

/// /proc/PID/status lines of the process's signal state (and of each thread's).
const SIGNAL_LINES: [&str; 5] = ["SigPnd:", "ShdPnd:", "SigBlk:", "SigIgn:", "SigCgt:"];

/// An [`InspectError::Io`] of instance `pid` while doing `what`.
fn ioe(pid: i32, what: &str) -> impl FnOnce(io::Error) -> InspectError {
    let what = what.to_string();
    move |source| InspectError::Io { pid, what, source }
}

fn hash(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..8])
}

/// How long [`state`] waits for every thread to block in a system call before
/// it reads the instance anyway.
const QUIET_WAIT: Duration = Duration::from_millis(500);

/// Read the idle instance `pid` (not traced, not frozen; restored from the image that
/// `source` serves). It is read once every thread is blocked in a system call (or after
/// [`QUIET_WAIT`]): a thread still on its way back to its wait would read as another
/// state. Every thread is stopped while it is read, then let go.
pub fn state(pid: i32, source: &PageSource) -> Result<BTreeMap<String, String>, InspectError> {
    let ioe = |what: &str| ioe(pid, what);
    let tids = procfs::tids(pid).map_err(ioe("listing threads"))?;
    // Blocked in a system call: /proc/.../syscall names it ("running" while it runs,
    // -1 while it is blocked elsewhere, in a page fault the page server serves).
    let asleep = |tid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
            .map(|s| s.split_whitespace().next().and_then(|n| n.parse::<i64>().ok()).is_some_and(|n| n >= 0))
            .unwrap_or(true)
    };
    let t0 = Instant::now();
    while !tids.iter().all(|&t| asleep(t)) && t0.elapsed() < QUIET_WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut traced = Vec::new();
    let mut out = BTreeMap::new();
    let r = (|| {
        crate::threads::seize_all(pid, &mut traced).map_err(|e| {
            let (what, source) = e.parts();
            InspectError::Io { pid, what, source }
        })?;
        let tids: Vec<i32> = traced.iter().map(|t| t.pid.as_raw()).collect();
        read(pid, source, &traced, &tids, &mut out)
    })();
    for tr in traced.iter().rev() {
        let _ = tr.detach();
    }
    r.map(|()| out)
}

/// Read the instance `pid`, every thread (`tids`) stopped (`traced`), into `out`.
fn read(pid: i32, source: &PageSource, traced: &[Tracee], tids: &[i32], out: &mut BTreeMap<String, String>) -> Result<(), InspectError> {
    let ioe = |what: &str| ioe(pid, what);
    // Threads: registers, extended state, signal mask and pending signals.
    {
        for (tr, &tid) in traced.iter().zip(tids) {
            let st = procfs::thread_status(pid, tid).map_err(ioe("reading thread status"))?;
            let ns = *st.nspid.last().unwrap_or(&tid);
            // A thread stopped inside a blocking syscall reads as one about to issue it
            // (as a restore or reset leaves it): the same state, seen a moment apart.
            let mut regs = tr.get_regs().map_err(ioe("GETREGS"))?;
            crate::regs::rewind_interrupted_syscall(&mut regs);
            let regs = crate::regs::to_array(&regs);
            for (name, v) in REGS.iter().zip(regs) {
                out.insert(format!("thread:{ns}:{name}"), format!("{v:#x}"));
            }
            out.insert(format!("thread:{ns}:xstate"), hash(&tr.get_xstate().map_err(ioe("GETREGSET xstate"))?));
            out.insert(format!("thread:{ns}:sigmask"), format!("{:#x}", tr.get_sigmask().map_err(ioe("GETSIGMASK"))?));
            let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).map_err(ioe("reading thread status"))?;
            for l in text.lines().filter(|l| l.starts_with("SigPnd:") || l.starts_with("SigBlk:")) {
                let (k, v) = l.split_once(':').unwrap_or_default();
                out.insert(format!("thread:{ns}:{k}"), v.trim().to_string());
            }
        }
    }

    // The process: signal state, timers, cwd, limits.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(ioe("reading status"))?;
    for l in status.lines().filter(|l| SIGNAL_LINES.iter().any(|p| l.starts_with(p))) {
        let (k, v) = l.split_once(':').unwrap_or_default();
        out.insert(format!("signals:{k}"), v.trim().to_string());
    }
    for file in ["timers", "limits"] {
        out.insert(file.to_string(), std::fs::read_to_string(format!("/proc/{pid}/{file}")).map_err(ioe(&format!("reading {file}")))?);
    }
    out.insert("cwd".into(), std::fs::read_link(format!("/proc/{pid}/cwd")).map_err(ioe("reading cwd"))?.to_string_lossy().into_owned());

    // Descriptors: what each is, its flags and offset.
    for f in procfs::fds(pid).map_err(ioe("reading descriptors"))? {
        let info: Vec<&str> = f.info.lines().filter(|l| l.starts_with("pos:") || l.starts_with("flags:")).collect();
        out.insert(format!("fd:{}", f.fd), format!("{} {}", f.target, info.join(" ")));
    }

    // Layout and page contents.
    let maps = procfs::maps(pid).map_err(ioe("reading maps"))?;
    let mem = ProcMem::open(pid, false).map_err(ioe("opening /proc/PID/mem"))?;
    let pm = Pagemap::open(pid).map_err(ioe("opening pagemap"))?;
    let page = PAGE_SIZE as usize;
    let mut written = Vec::new();
    let mut buf = vec![0u8; page];
    // Whether this instance tracks writes at all (then an untracked writable private
    // mapping is one made since the restore or the last reset, which a reset unmaps).
    let tracking = maps.iter().any(|m| m.read && m.write && !m.shared && pm.written(m.start, m.end, &mut Vec::new()).is_ok());
    for m in &maps {
        out.insert(
            format!("map:{:#x}", m.start),
            format!("{:#x} {} {:#x} {} {} {}", m.end, m.perms(), m.offset, m.dev, m.inode, m.name),
        );
        if !m.read || m.name.starts_with("[v") {
            continue;
        }
        // Pages written since the restore or the last reset, where writes are tracked
        // (an instance restored for resets): the runtime's own work after it (the
        // restore notice: reseeding, after-restore hooks). Marked, for the comparison
        // to set aside.
        written.clear();
        let tracked = pm.written(m.start, m.end, &mut written).is_ok();
        let made_since = tracking && !tracked && m.write && !m.shared;
        let is_written = |a: u64| made_since || (tracked && written.iter().any(|&(s, e)| s <= a && a < e));
        for addr in (m.start..m.end).step_by(page) {
            if mem.read_exact_at(&mut buf, addr).is_err() {
                // Never touched since the restore: the image's page, or zeros.
                match source.index.lookup(addr) {
                    Some(fp) => source.read_page(addr, fp, &mut buf).map_err(|source| InspectError::Image { pid, addr, source })?,
                    None => buf.fill(0),
                }
            }
            let h = hash(&buf);
            out.insert(format!("page:{addr:#x}"), if is_written(addr) { format!("{h} written") } else { h });
        }
    }
    Ok(())
}
