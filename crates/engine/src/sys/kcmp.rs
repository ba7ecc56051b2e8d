//! kcmp(2): whether two descriptors of a process refer to one open file description.

/// `KCMP_FILE` from <linux/kcmp.h>.
const KCMP_FILE: libc::c_long = 0;

/// True when descriptors `a` and `b` of `pid` share one open file description
/// (one was dup'd from the other, or both were inherited from one open).
pub fn same_file(pid: i32, a: i32, b: i32) -> std::io::Result<bool> {
    same_file_in(pid, a, pid, b)
}

/// True when descriptor `a` of process `pa` and descriptor `b` of `pb` share one
/// open file description (inherited across a fork, or passed).
pub fn same_file_in(pa: i32, a: i32, pb: i32, b: i32) -> std::io::Result<bool> {
    // SAFETY: kcmp takes only integers and reads no caller memory.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pa, pb, KCMP_FILE, a as libc::c_long, b as libc::c_long) };
    if r < 0 {
        return Err(super::last_err());
    }
    Ok(r == 0)
}
