//! kcmp(2): whether two descriptors of a process refer to one open file description.

/// `KCMP_FILE` from <linux/kcmp.h>.
const KCMP_FILE: libc::c_long = 0;

/// True when descriptors `a` and `b` of `pid` share one open file description
/// (one was dup'd from the other, or both were inherited from one open).
pub fn same_file(pid: i32, a: i32, b: i32) -> std::io::Result<bool> {
    // SAFETY: kcmp takes only integers and reads no caller memory.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a as libc::c_long, b as libc::c_long) };
    if r < 0 {
        return Err(super::last_err());
    }
    Ok(r == 0)
}
