//! The sandbox's seccomp deny-list as a BPF program that is cheap to install.
//!
//! Written here rather than with `seccompiler::SeccompFilter` (which still installs
//! it: `seccompiler::apply_filter`) because seccompiler emits one comparison per
//! syscall, in a chain. Installing a filter makes the kernel emulate it once for
//! every syscall number of every architecture (`seccomp_cache_prepare`: which
//! syscalls are always allowed, so that later calls skip the filter), with the
//! process's signal lock held: for the chain of our 260 instructions that took
//! ~195 µs per install, and a sandbox installs it twice (its init and its process),
//! ~18% of the init's CPU (issue #33). This program decides by binary search over
//! the boundaries between allowed and denied numbers: ~7 comparisons for any
//! syscall, a fraction of that cost. libseccomp builds such trees too, but is a C
//! library this project does not otherwise need.
//!
//! Numbers with the x32 bit (`__X32_SYSCALL_BIT`: x32 binaries share the x86-64
//! architecture value, their mount is 0x40000000 | 165) are denied as a whole, so the
//! list cannot be bypassed through that ABI where a kernel enables it.

use seccompiler::{sock_filter, BpfProgram};

/// Start of the x32 syscall numbers (and of every number no native syscall has).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `struct seccomp_data`: `nr` at 0, `arch` at 4.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000; // AUDIT_ARCH_AARCH64

const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const DENY: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The number line cut where the action changes: (first number, denied), sorted by
/// first number, starting at 0, neighbours differing.
fn segments(denied: &[i64]) -> Vec<(u32, bool)> {
    let mut nrs: Vec<u32> = denied.iter().filter_map(|&n| u32::try_from(n).ok()).filter(|&n| n < X32_SYSCALL_BIT).collect();
    nrs.sort_unstable();
    nrs.dedup();
    // Runs of consecutive denied numbers, each after the allowed gap before it.
    let mut segs = Vec::new();
    let (mut at, mut i) = (0u32, 0);
    while i < nrs.len() {
        let (lo, mut hi) = (nrs[i], nrs[i] + 1);
        i += 1;
        while i < nrs.len() && nrs[i] == hi {
            hi += 1;
            i += 1;
        }
        if lo > at {
            segs.push((at, false));
        }
        segs.push((lo, true));
        at = hi;
    }
    // The x32 numbers and above, after the last allowed gap (if a run does not reach them).
    if at < X32_SYSCALL_BIT {
        segs.push((at, false));
        segs.push((X32_SYSCALL_BIT, true));
    }
    segs
}

/// Code deciding among `segs` (the accumulator holds the syscall number): a binary
/// search over their starts down to one return per segment.
fn decide(segs: &[(u32, bool)]) -> Vec<sock_filter> {
    if let [(_, deny)] = segs {
        return vec![stmt(RET, if *deny { DENY } else { ALLOW })];
    }
    let mid = segs.len() / 2;
    let (left, right) = (decide(&segs[..mid]), decide(&segs[mid..]));
    let mut code = Vec::with_capacity(2 + left.len() + right.len());
    match u8::try_from(left.len()) {
        // nr >= pivot: over the left half to the right one.
        Ok(skip) => code.push(jump(JGE, segs[mid].0, skip, 0)),
        // Too far for a conditional jump's 8-bit offset: through an unconditional one.
        Err(_) => {
            code.push(jump(JGE, segs[mid].0, 0, 1));
            code.push(stmt(JA, left.len() as u32));
        }
    }
    code.extend(left);
    code.extend(right);
    code
}

/// The filter: a process of another architecture is killed (as seccompiler's
/// filters do), a denied syscall fails with EPERM, every other one is allowed.
pub(crate) fn deny_list(denied: &[i64]) -> BpfProgram {
    let mut prog = vec![stmt(LD_ABS, DATA_ARCH), jump(JEQ, AUDIT_ARCH, 1, 0), stmt(RET, libc::SECCOMP_RET_KILL_PROCESS), stmt(LD_ABS, DATA_NR)];
    prog.extend(decide(&segments(denied)));
    prog
}

#[cfg(test)]
mod tests {
    use super::*;
    use seccompiler::{SeccompAction, SeccompFilter};

    /// What `prog` returns for syscall `nr` of architecture `arch`: a classic-BPF
    /// interpreter for the instructions these filters use (and seccompiler's use).
    fn run(prog: &[sock_filter], arch: u32, nr: u32) -> (u32, usize) {
        let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0);
        loop {
            let i = &prog[pc];
            steps += 1;
            pc += 1;
            match i.code {
                LD_ABS => acc = if i.k == DATA_ARCH { arch } else { assert_eq!(i.k, DATA_NR); nr },
                JGE => pc += usize::from(if acc >= i.k { i.jt } else { i.jf }),
                JEQ => pc += usize::from(if acc == i.k { i.jt } else { i.jf }),
                JA => pc += i.k as usize,
                RET => return (i.k, steps),
                other => panic!("instruction {other:#x} not expected"),
            }
        }
    }

    fn reference(denied: &[i64]) -> BpfProgram {
        let arch = std::env::consts::ARCH.try_into().unwrap();
        let rules = denied.iter().map(|&nr| (nr, Vec::new())).collect();
        SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch).unwrap().try_into().unwrap()
    }

    /// Every native syscall number (and then some) gets what seccompiler's chain gives
    /// it; x32 numbers are denied; another architecture is killed.
    #[test]
    fn decides_as_the_chain_for_every_number_in_a_few_steps() {
        let denied = crate::init::denied_syscalls();
        let (tree, chain) = (deny_list(&denied), reference(&denied));
        let mut worst = 0;
        for nr in 0..4096 {
            let (got, steps) = run(&tree, AUDIT_ARCH, nr);
            assert_eq!(got, run(&chain, AUDIT_ARCH, nr).0, "syscall {nr}");
            assert_eq!(got == DENY, denied.contains(&i64::from(nr)), "syscall {nr}");
            worst = worst.max(steps);
        }
        for nr in [X32_SYSCALL_BIT, X32_SYSCALL_BIT | 165, X32_SYSCALL_BIT | 1, u32::MAX] {
            assert_eq!(run(&tree, AUDIT_ARCH, nr).0, DENY, "x32 {nr:#x}");
        }
        assert_eq!(run(&tree, 0x4000_0003, 1).0, libc::SECCOMP_RET_KILL_PROCESS, "i386 is killed");
        assert!(worst <= 14, "{worst} steps for the worst number");
        let (_, chain_steps) = run(&chain, AUDIT_ARCH, 0);
        assert!(chain_steps > 5 * worst, "the chain walks {chain_steps} for an allowed number");
    }

    #[test]
    fn long_lists_jump_far_and_edges_hold() {
        // 400 denied numbers, every other one: the root's left half is longer than a
        // conditional jump reaches.
        let denied: Vec<i64> = (0..800).step_by(2).collect();
        let tree = deny_list(&denied);
        assert!(tree.iter().any(|i| i.code == JA), "far jumps are taken through JA");
        for nr in 0..1000 {
            assert_eq!(run(&tree, AUDIT_ARCH, nr).0 == DENY, nr < 800 && nr % 2 == 0, "syscall {nr}");
        }
        // Nothing denied but x32; 0 denied; duplicates and unsorted input.
        assert_eq!(segments(&[]), vec![(0, false), (X32_SYSCALL_BIT, true)]);
        assert_eq!(segments(&[0, 2, 1, 1, 5]), vec![(0, true), (3, false), (5, true), (6, false), (X32_SYSCALL_BIT, true)]);
        assert_eq!(run(&deny_list(&[0]), AUDIT_ARCH, 0).0, DENY);
        assert_eq!(run(&deny_list(&[0]), AUDIT_ARCH, 1).0, ALLOW);
    }
}
