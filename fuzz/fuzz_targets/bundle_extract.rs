//! The deployment zip extractor (`bundle::extract`) into a fresh temp dir: whatever
//! the archive says, nothing may be written outside that directory.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parent = tempfile::tempdir().expect("temp dir");
    let dest = parent.path().join("code");
    let _ = thaw_node::bundle::extract(data, &dest);
    for entry in std::fs::read_dir(parent.path()).expect("listing") {
        let name = entry.expect("entry").file_name();
        assert_eq!(name, "code", "extract wrote outside its directory");
    }
});
