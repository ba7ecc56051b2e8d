//! A build id for this crate: the small `thaw-sandbox-init` binary and the program
//! that spawns sandboxes must speak the same init protocol, and a sibling binary
//! from another build may not (see `init_exe.rs`). Regenerated whenever the crate's
//! sources change; both binaries of one build link the same compiled crate.
fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let id = format!("{}-{now:x}-{:x}", env!("CARGO_PKG_VERSION"), std::process::id());
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("build_id.txt");
    std::fs::write(out, id).expect("writing the build id");
}
