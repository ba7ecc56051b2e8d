#!/usr/bin/env bash
# The sandbox init linked statically against musl: target/release/thaw-sandbox-init-static,
# beside thaw, which prefers it to the glibc-linked thaw-sandbox-init (crates/sandbox/src/
# init_exe.rs: 0.1 ms of CPU to start instead of 1.0, every sandbox; issue #33). Needs
# rustup's x86_64/aarch64 musl target (added here; the Rust standard library for it ships
# its own musl, no C toolchain needed). If it cannot be had, sandboxes use the glibc
# init: slower to start, the same otherwise.
#
#   bash scripts/build-init.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
target="$(uname -m)-unknown-linux-musl"
out="${CARGO_TARGET_DIR:-$ROOT/target}"
warn() { echo "build-init: $*; sandboxes will start the glibc-linked thaw-sandbox-init" >&2; rm -f "$out/release/thaw-sandbox-init-static"; exit 0; }
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    echo "build-init: adding the Rust target $target (once)"
    timeout 300 rustup target add "$target" >/dev/null 2>&1 || warn "could not add the Rust target $target"
fi
# With the target installed, a failed build is the sandbox crate not compiling for musl
# (e.g. a libc struct with other fields there): an error, so the suite's set-up fails
# instead of every sandbox quietly starting the slower init.
if ! cargo build --release --quiet --target "$target" -p thaw-sandbox --bin thaw-sandbox-init; then
    rm -f "$out/release/thaw-sandbox-init-static"
    echo "build-init: the sandbox init does not build for $target (see the errors above)" >&2
    exit 1
fi
mkdir -p "$out/release"
# Copied under a temporary name and renamed: a sandbox starting now execs either the old
# file or the new one, never a half-written one.
cp "$out/$target/release/thaw-sandbox-init" "$out/release/.thaw-sandbox-init-static.tmp" \
    && chmod 0755 "$out/release/.thaw-sandbox-init-static.tmp" \
    && mv -f "$out/release/.thaw-sandbox-init-static.tmp" "$out/release/thaw-sandbox-init-static" \
    || warn "could not install it beside thaw"
echo "build-init: $out/release/thaw-sandbox-init-static ($target, static)"
