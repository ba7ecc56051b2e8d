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
    // Shared anonymous memory shows up as a mapping of the deleted "/dev/zero";
    // System V segments as "/SYSV<key> (deleted)". Both are shared with whoever else
    // maps them (forks, other processes), which a private restore cannot reproduce.
    if m.shared && m.name.starts_with("/dev/zero") {
        return Some(format!(
            "it has shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS) at {range}, which the engine cannot recreate yet"
        ));
    }
    if m.name.starts_with("/SYSV") {
        return Some(format!(
            "it has a System V shared memory segment (shmat) attached at {range}; SysV shm is not carried across a snapshot"
        ));
    }
    // VMA flags the restore does not set again: losing them changes behaviour.
    // (MADV_DONTFORK and MADV_WIPEONFORK are set again: see `Vma::advice`.)
    let lost = [("lo", "mlock'd memory (mlock/MCL_FUTURE): the restore would not lock it")];
    lost.iter()
        .find(|(flag, _)| m.has_flag(flag))
        .map(|(_, what)| format!("it has {what} at {range}"))
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
        assert!(msg(map("/dev/zero (deleted)", true, &[])).contains("shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS) at 0x1000-0x3000"));
        assert!(msg(map("/SYSV00000000 (deleted)", true, &[])).contains("System V shared memory"));
        assert!(msg(map("", false, &["rd", "lo"])).contains("mlock'd memory"));
        assert_eq!(refuse_mapping(&map("", false, &["rd", "wf"])), None, "WIPEONFORK is restored");
        assert_eq!(refuse_mapping(&map("", false, &["rd", "dc"])), None, "DONTFORK is restored");
        assert_eq!(refuse_mapping(&map("/usr/lib/libc.so.6", false, &["rd", "mr"])), None);
        assert_eq!(refuse_mapping(&map("", false, &["rd", "wr", "gd"])), None);
        assert!(check_maps(&[map("", false, &[]), map("", false, &["lo"])]).is_err());
    }
}
