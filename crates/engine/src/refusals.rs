//! Capture-time refusals found by the conformance corpus (tests/corpus): state the
//! restore would silently drop or get wrong, refused by name before anything is
//! written. Each check reads only /proc of the stopped process.
//!
//! Kept apart from `capture.rs` (which calls [`check_maps`] once) so the list of
//! what the engine cannot restore faithfully yet is in one place; ARCHITECTURE.md
//! "Faithful or refused" lists the same kinds.

use crate::procfs::MapEntry;

/// Why a mapping cannot be restored faithfully, or None. Called on every VMA of the
/// process before the VMAs are classified.
pub fn refuse_mapping(m: &MapEntry) -> Option<String> {
    let range = format!("{:#x}-{:#x}", m.start, m.end);
    // System V segments show up as "/SYSV<key> (deleted)": shared with whoever else
    // attaches them (by key, from outside the instance too), which a restore cannot
    // reproduce. (Shared anonymous memory, "/dev/zero (deleted)", is restored:
    // `VmaKind::SharedAnon`.)
    if m.name.starts_with("/SYSV") {
        return Some(format!(
            "it has a System V shared memory segment (shmat) attached at {range}; SysV shm is not carried across a snapshot"
        ));
    }
    // VMA flags the restore sets again (MADV_DONTFORK, MADV_WIPEONFORK, THP advice,
    // mlock: see `Vma::advice`) need no refusal.
    None
}

/// The first refusal among the process's mappings.
pub fn check_maps(maps: &[MapEntry]) -> Result<(), String> {
    maps.iter().find_map(refuse_mapping).map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(name: &str, shared: bool, flags: &[&str]) -> MapEntry {
        MapEntry {
            start: 0x1000,
            end: 0x3000,
            read: true,
            write: true,
            exec: false,
            shared,
            offset: 0,
            dev: "00:01".into(),
            inode: 7,
            name: name.into(),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn refusals_name_the_state() {
        let msg = |m: MapEntry| refuse_mapping(&m).unwrap_or_default();
        assert_eq!(refuse_mapping(&map("/dev/zero (deleted)", true, &[])), None, "shared anonymous memory is restored");
        assert!(msg(map("/SYSV00000000 (deleted)", true, &[])).contains("System V shared memory"));
        assert_eq!(refuse_mapping(&map("", false, &["rd", "lo"])), None, "mlock is restored");
        assert_eq!(refuse_mapping(&map("", false, &["rd", "wf"])), None, "WIPEONFORK is restored");
        assert_eq!(refuse_mapping(&map("", false, &["rd", "dc"])), None, "DONTFORK is restored");
        assert_eq!(refuse_mapping(&map("/usr/lib/libc.so.6", false, &["rd", "mr"])), None);
        assert_eq!(refuse_mapping(&map("", false, &["rd", "wr", "gd"])), None);
        assert!(check_maps(&[map("", false, &[]), map("/SYSV00000001 (deleted)", true, &[])]).is_err());
    }
}
