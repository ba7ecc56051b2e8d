//! Conversion between the kernel's `user_regs_struct` and the image's array form,
//! and the syscall-restart fix-up applied to a thread stopped inside a syscall.

use crate::image::RegsArray;
use crate::sys::ptrace::Regs;

macro_rules! regs_fields {
    ($m:ident) => {
        $m!(r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, rax, rcx, rdx, rsi, rdi, orig_rax, rip, cs, eflags, rsp,
            ss, fs_base, gs_base, ds, es, fs, gs)
    };
}

pub fn to_array(r: &Regs) -> RegsArray {
    macro_rules! arr {
        ($($f:ident),*) => { [$(r.$f),*] };
    }
    regs_fields!(arr)
}

pub fn from_array(a: &RegsArray) -> Regs {
    macro_rules! build {
        ($($f:ident),*) => {{
            let mut it = a.iter().copied();
            Regs { $($f: it.next().expect("27 registers")),* }
        }};
    }
    regs_fields!(build)
}

const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;
const NR_RESTART_SYSCALL: u64 = 219;

/// A thread interrupted inside a blocking syscall reports `-ERESTART*` in rax.
/// Rewind it so that, when resumed in the restored process, it re-issues the
/// syscall, as the kernel itself would have on the way back to user space.
pub fn rewind_interrupted_syscall(r: &mut Regs) {
    if (r.orig_rax as i64) < 0 {
        return;
    }
    match -(r.rax as i64) {
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => {
            r.rax = r.orig_rax;
            r.rip -= 2;
        }
        ERESTART_RESTARTBLOCK => {
            r.rax = NR_RESTART_SYSCALL;
            r.rip -= 2;
        }
        _ => {}
    }
    r.orig_rax = u64::MAX;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_round_trip_keeps_order() {
        let mut a = [0u64; 27];
        for (i, v) in a.iter_mut().enumerate() {
            *v = i as u64 * 3 + 1;
        }
        let r = from_array(&a);
        assert_eq!(r.r15, 1);
        assert_eq!(r.rax, 31);
        assert_eq!(r.rip, 49);
        assert_eq!(r.fs_base, 64);
        assert_eq!(to_array(&r), a);
    }

    #[test]
    fn rewinds_restartable_syscalls_only() {
        let mut r = from_array(&[0; 27]);
        r.orig_rax = 0; // read
        r.rax = (-ERESTARTSYS) as u64;
        r.rip = 0x1002;
        rewind_interrupted_syscall(&mut r);
        assert_eq!((r.rax, r.rip, r.orig_rax), (0, 0x1000, u64::MAX));

        let mut r = from_array(&[0; 27]);
        r.orig_rax = 35; // nanosleep
        r.rax = (-ERESTART_RESTARTBLOCK) as u64;
        r.rip = 0x2002;
        rewind_interrupted_syscall(&mut r);
        assert_eq!((r.rax, r.rip), (NR_RESTART_SYSCALL, 0x2000));

        let mut r = from_array(&[0; 27]);
        r.orig_rax = 0;
        r.rax = (-4i64) as u64; // EINTR is final: user space sees it
        r.rip = 0x3002;
        rewind_interrupted_syscall(&mut r);
        assert_eq!((r.rax, r.rip), ((-4i64) as u64, 0x3002));
    }
}
