//! Syscall injection into a stopped tracee.
//!
//! Capture and restore both need the *target* to execute syscalls on itself
//! (rt_sigaction, prctl, mmap, userfaultfd...). Doing one ptrace round trip
//! per syscall would cost hundreds of context switches per restore, so we
//! place a 55-byte loop (the "batch blob") in a scratch region of the tracee;
//! it executes a table of syscalls and stops with `int3` after the last one
//! or the first that fails. One batch = one resume + one stop.
//!
//! Region layout (`REGION_LEN` bytes, RWX, private anonymous):
//! ```text
//! +0        blob (code, BLOB_RESERVED bytes)
//! +DATA_OFF data area: strings and structs that syscalls point at
//! +TABLE_OFF table: 64-byte entries {nr, a1..a6, result}, ended by nr = -1
//! ```

use std::io;

use thiserror::Error;

use crate::sys::mem::ProcMem;
use crate::sys::ptrace::{Regs, Tracee};

/// The batch loop, assembled from:
/// ```text
/// loop: mov rax,[rbx]; cmp rax,-1; je done
///       mov rdi,[rbx+8]; mov rsi,[rbx+16]; mov rdx,[rbx+24]
///       mov r10,[rbx+32]; mov r8,[rbx+40]; mov r9,[rbx+48]
///       syscall
///       mov [rbx+56],rax; cmp rax,-4095; jae done
///       add rbx,64; jmp loop
/// done: int3; int3
/// ```
pub const BLOB: [u8; 55] = [
    0x48, 0x8b, 0x03, 0x48, 0x83, 0xf8, 0xff, 0x74, 0x2c, 0x48, 0x8b, 0x7b, 0x08, 0x48, 0x8b, 0x73, 0x10, 0x48,
    0x8b, 0x53, 0x18, 0x4c, 0x8b, 0x53, 0x20, 0x4c, 0x8b, 0x43, 0x28, 0x4c, 0x8b, 0x4b, 0x30, 0x0f, 0x05, 0x48,
    0x89, 0x43, 0x38, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x06, 0x48, 0x83, 0xc3, 0x40, 0xeb, 0xcb, 0xcc,
    0xcc,
];
/// Offset of the first `int3`: after it executes, rip == region + DONE_OFF + 1.
const DONE_OFF: u64 = 0x35;
const BLOB_RESERVED: u64 = 128;
pub const DATA_OFF: u64 = BLOB_RESERVED;
pub const DATA_LEN: u64 = 128 * 1024;
pub const TABLE_OFF: u64 = DATA_OFF + DATA_LEN;
const TABLE_ENTRIES: u64 = 4096;
/// Total size of an injection region.
pub const REGION_LEN: u64 = (TABLE_OFF + TABLE_ENTRIES * 64 + 4095) & !4095;
const UNSET: i64 = i64::MIN;

#[derive(Debug, Error)]
pub enum InjectError {
    #[error("ptrace operation '{op}' on pid {pid} failed")]
    Ptrace { op: &'static str, pid: i32, #[source] source: io::Error },
    #[error("writing the injection table into pid {pid} at {addr:#x} failed")]
    Memory { pid: i32, addr: u64, #[source] source: io::Error },
    #[error("injected syscall #{index} ({name}, nr {nr}) failed in pid {pid}: {err}")]
    Syscall { pid: i32, index: usize, name: &'static str, nr: i64, err: io::Error },
    #[error("pid {pid} stopped at {rip:#x}, not at the end of the batch blob (signal {signal:?})")]
    UnexpectedStop { pid: i32, rip: u64, signal: Option<String> },
    #[error("batch of {count} syscalls exceeds the table ({max} entries) or data area")]
    TooLarge { count: usize, max: u64 },
}

/// One syscall to inject, with a name for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub name: &'static str,
    pub nr: i64,
    pub args: [u64; 6],
}

impl Call {
    pub fn new(name: &'static str, nr: i64, args: &[u64]) -> Call {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Call { name, nr, args: a }
    }
}

/// Bytes placed in the data area, addressed by their final tracee address.
pub struct DataArea {
    base: u64,
    buf: Vec<u8>,
}

impl DataArea {
    pub fn new(region: u64) -> DataArea {
        DataArea { base: region + DATA_OFF, buf: Vec::new() }
    }

    /// Append `bytes` (8-byte aligned) and return their address in the tracee.
    pub fn push(&mut self, bytes: &[u8]) -> u64 {
        while !self.buf.len().is_multiple_of(8) {
            self.buf.push(0);
        }
        let addr = self.base + self.buf.len() as u64;
        self.buf.extend_from_slice(bytes);
        addr
    }

    /// Append a NUL-terminated string.
    pub fn push_cstr(&mut self, s: &str) -> u64 {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.push(&v)
    }

    /// Reserve `len` zeroed bytes (an out-buffer).
    pub fn reserve(&mut self, len: usize) -> u64 {
        self.push(&vec![0u8; len])
    }

    fn offset_of(&self, addr: u64) -> usize {
        (addr - self.base) as usize
    }

    /// `len` bytes at tracee address `addr` (as read back after a batch).
    pub fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let off = self.offset_of(addr);
        &self.buf[off..off + len]
    }

    /// The `i`-th little-endian u64 at tracee address `addr`.
    pub fn u64_at(&self, addr: u64, i: usize) -> u64 {
        u64::from_le_bytes(self.bytes(addr + i as u64 * 8, 8).try_into().expect("8 bytes"))
    }

    /// The little-endian u32 at tracee address `addr`.
    pub fn u32_at(&self, addr: u64) -> u32 {
        u32::from_le_bytes(self.bytes(addr, 4).try_into().expect("4 bytes"))
    }
}

/// Runs syscall batches in a stopped tracee that has an injection region mapped.
pub struct Injector<'a> {
    pub tracee: Tracee,
    pub mem: &'a ProcMem,
    pub region: u64,
    /// Registers used as a template for each batch (segment registers, flags).
    template: Regs,
}

impl<'a> Injector<'a> {
    pub fn new(tracee: Tracee, mem: &'a ProcMem, region: u64) -> Result<Injector<'a>, InjectError> {
        let pid = tracee.pid.as_raw();
        let template = tracee.get_regs().map_err(|source| InjectError::Ptrace { op: "GETREGS", pid, source })?;
        Ok(Injector { tracee, mem, region, template })
    }

    /// Write the batch blob into the region (once, after mapping it).
    pub fn install_blob(&self) -> Result<(), InjectError> {
        let pid = self.tracee.pid.as_raw();
        self.mem
            .write_all_at(&BLOB, self.region)
            .map_err(|source| InjectError::Memory { pid, addr: self.region, source })
    }

    /// Run `exit_group(code)`: the tracee (a process made to be a zombie) exits, and
    /// its exit is waited for as its tracer (which, when we are not its parent, hands
    /// it to its parent as a zombie).
    pub fn run_exit(&self, code: i32) -> Result<(), InjectError> {
        let pid = self.tracee.pid.as_raw();
        self.start(&[Call::new("exit_group", libc::SYS_exit_group, &[code as u64])], &DataArea::new(self.region))?;
        match self.tracee.wait_exit().map_err(|source| InjectError::Ptrace { op: "wait(exit)", pid, source })? {
            Some(c) if c == code => Ok(()),
            other => Err(InjectError::UnexpectedStop { pid, rip: 0, signal: Some(format!("expected exit status {code}, got {other:?}")) }),
        }
    }

    /// Write `calls` (the table the blob runs) and `data` into the region, point the
    /// tracee at the blob and let it run; returns the table's address.
    fn start(&self, calls: &[Call], data: &DataArea) -> Result<u64, InjectError> {
        let pid = self.tracee.pid.as_raw();
        if calls.len() as u64 >= TABLE_ENTRIES || data.buf.len() as u64 > DATA_LEN {
            return Err(InjectError::TooLarge { count: calls.len(), max: TABLE_ENTRIES - 1 });
        }
        let mut table = Vec::with_capacity((calls.len() + 1) * 64);
        for c in calls {
            table.extend_from_slice(&c.nr.to_le_bytes());
            for a in c.args {
                table.extend_from_slice(&a.to_le_bytes());
            }
            table.extend_from_slice(&UNSET.to_le_bytes());
        }
        table.extend_from_slice(&(-1i64).to_le_bytes());
        table.extend_from_slice(&[0u8; 56]);
        let table_addr = self.region + TABLE_OFF;
        let mem_err = |addr: u64| move |source| InjectError::Memory { pid, addr, source };
        if !data.buf.is_empty() {
            self.mem.write_all_at(&data.buf, data.base).map_err(mem_err(data.base))?;
        }
        self.mem.write_all_at(&table, table_addr).map_err(mem_err(table_addr))?;

        let mut regs = self.template;
        regs.rip = self.region;
        regs.rbx = table_addr;
        regs.orig_rax = u64::MAX; // not in a syscall: no restart fix-ups
        regs.eflags &= !(1 << 8); // clear TF
        self.tracee.set_regs(&regs).map_err(|source| InjectError::Ptrace { op: "SETREGS", pid, source })?;
        self.tracee.cont().map_err(|source| InjectError::Ptrace { op: "CONT", pid, source })?;
        Ok(table_addr)
    }

    /// Run `calls` with `data` placed in the data area; returns each call's result.
    /// The data area is read back into `data` afterwards so out-parameters can be parsed.
    pub fn run(&self, calls: &[Call], data: &mut DataArea) -> Result<Vec<i64>, InjectError> {
        let pid = self.tracee.pid.as_raw();
        let table_addr = self.start(calls, data)?;
        let mem_err = |addr: u64| move |source| InjectError::Memory { pid, addr, source };
        let sig = loop {
            match self.tracee.wait_stop().map_err(|source| InjectError::Ptrace { op: "wait", pid, source })? {
                // A ptrace event (e.g. PTRACE_EVENT_CLONE of an injected clone3): go on.
                None => self.tracee.cont().map_err(|source| InjectError::Ptrace { op: "CONT", pid, source })?,
                Some(sig) => break Some(sig),
            }
        };
        let after = self.tracee.get_regs().map_err(|source| InjectError::Ptrace { op: "GETREGS", pid, source })?;
        if after.rip != self.region + DONE_OFF + 1 {
            return Err(InjectError::UnexpectedStop { pid, rip: after.rip, signal: sig.map(|s| s.to_string()) });
        }

        let mut out = vec![0u8; calls.len() * 64];
        self.mem.read_exact_at(&mut out, table_addr).map_err(mem_err(table_addr))?;
        if !data.buf.is_empty() {
            let base = data.base;
            self.mem.read_exact_at(&mut data.buf, base).map_err(mem_err(base))?;
        }
        let mut results = Vec::with_capacity(calls.len());
        for (i, c) in calls.iter().enumerate() {
            let r = i64::from_le_bytes(out[i * 64 + 56..i * 64 + 64].try_into().expect("8 bytes"));
            if r == UNSET || (-4095..0).contains(&r) {
                let err = if r == UNSET {
                    io::Error::other("not executed")
                } else {
                    io::Error::from_raw_os_error(-r as i32)
                };
                return Err(InjectError::Syscall { pid, index: i, name: c.name, nr: c.nr, err });
            }
            results.push(r);
        }
        Ok(results)
    }

}

/// The address of a `syscall` instruction in the vDSO of `pid` (`maps`: its memory
/// map), for [`single`] in a process that has no injection region; `None` when it
/// has no vDSO or none there.
pub fn vdso_syscall(pid: i32, maps: &[crate::procfs::MapEntry]) -> io::Result<Option<u64>> {
    let Some(vdso) = maps.iter().find(|m| m.name == "[vdso]") else {
        return Ok(None);
    };
    let mut text = vec![0u8; vdso.len() as usize];
    ProcMem::open(pid, false)?.read_exact_at(&mut text, vdso.start)?;
    Ok(text.windows(2).position(|w| w == [0x0f, 0x05]).map(|i| vdso.start + i as u64))
}

/// Execute a single syscall in a stopped tracee using an existing `syscall`
/// instruction at `insn` (found in its vDSO). Used once per capture, to map the
/// injection region, and by resets (which map none). The `syscall` instruction is
/// single-stepped: one stop (the kernel reports the step once the call has
/// returned), where stopping at its entry and its exit took two.
pub fn single(tracee: &Tracee, insn: u64, call: Call) -> Result<i64, InjectError> {
    let pid = tracee.pid.as_raw();
    let perr = |op| move |source| InjectError::Ptrace { op, pid, source };
    set_call(tracee, insn, call)?;
    tracee.step().map_err(perr("SINGLESTEP"))?;
    let sig = tracee.wait_stop().map_err(perr("wait(step)"))?;
    let after = tracee.get_regs().map_err(perr("GETREGS"))?;
    if after.rip != insn + 2 {
        return Err(InjectError::UnexpectedStop { pid, rip: after.rip, signal: sig.map(|s| s.to_string()) });
    }
    let r = after.rax as i64;
    if (-4095..0).contains(&r) {
        return Err(InjectError::Syscall { pid, index: 0, name: call.name, nr: call.nr, err: io::Error::from_raw_os_error(-r as i32) });
    }
    Ok(r)
}

/// Point the stopped tracee at the `syscall` instruction at `insn`, with `call`'s
/// number and arguments.
fn set_call(tracee: &Tracee, insn: u64, call: Call) -> Result<(), InjectError> {
    let pid = tracee.pid.as_raw();
    let perr = |op| move |source| InjectError::Ptrace { op, pid, source };
    let mut regs = tracee.get_regs().map_err(perr("GETREGS"))?;
    regs.rip = insn;
    regs.rax = call.nr as u64;
    regs.orig_rax = u64::MAX;
    regs.rdi = call.args[0];
    regs.rsi = call.args[1];
    regs.rdx = call.args[2];
    regs.r10 = call.args[3];
    regs.r8 = call.args[4];
    regs.r9 = call.args[5];
    regs.eflags &= !(1 << 8); // TF: the step sets it
    tracee.set_regs(&regs).map_err(perr("SETREGS"))
}
