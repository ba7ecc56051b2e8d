//! A build id for this crate: the small `thaw-sandbox-init` binary and the program
//! that spawns sandboxes must speak the same init protocol, and a sibling binary
//! from another build may not (see `init_exe.rs`). It is a hash of what the protocol
//! is built from (this crate's sources, its manifest, the workspace's lock file), so
//! builds of the same sources for other targets agree: the statically linked musl
//! init (`scripts/build-init.sh`) and the glibc programs that start it. The build
//! script runs on the host for every target, so the hash function is the same.
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("reading the crate's sources").flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let lock = here.join("../../Cargo.lock");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed={}", lock.display());
    let mut inputs = vec![here.join("build.rs"), here.join("Cargo.toml"), lock];
    files(&here.join("src"), &mut inputs);
    inputs.sort();
    // SipHash with fixed keys: the same on every run of the same toolchain.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in &inputs {
        p.strip_prefix(&here).unwrap_or(p).hash(&mut h);
        std::fs::read(p).unwrap_or_default().hash(&mut h);
    }
    let id = format!("{}-{:016x}", env!("CARGO_PKG_VERSION"), h.finish());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("build_id.txt");
    std::fs::write(out, id).expect("writing the build id");
}
