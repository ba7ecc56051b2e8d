#!/usr/bin/env bash
# Run the whole test suite (as root): set-up, the module map's import circles, Rust unit +
# integration tests, Python tests, a bounded fuzzing run of every fuzz target.
#
#   bash scripts/test.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh || { echo "test: set-up failed" >&2; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"

# The tests write snapshots, MinIO buckets and etcd data under the temporary directory;
# MinIO refuses every write once its drive is nearly full, which reads as many unrelated
# failures. Say how much room there is, and warn early.
tmp="${TMPDIR:-/tmp}"
free_kib=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
echo "test: $((free_kib / 1024 / 1024)) GiB free in $tmp"
if [ "${free_kib:-0}" -lt $((8 * 1024 * 1024)) ]; then
    echo "test: WARNING: less than 8 GiB free in $tmp; the store and cluster tests need room (MinIO refuses writes on a nearly full drive)" >&2
fi

# Scratch directories of test binaries whose process has ended (thaw-CRATE-PID-XXXXXX,
# crates/thaw/tests/common/mod.rs): removed at the start and at the end of the run.
sweep_scratch() {
    local d pid
    for d in "$tmp"/thaw-*-[0-9]*-*; do
        [ -d "$d" ] || continue
        pid="${d%-*}"; pid="${pid##*-}"
        case "$pid" in *[!0-9]*|'') continue ;; esac
        [ -e "/proc/$pid" ] || rm -rf -- "$d"
    done
}
# Network namespaces and bridges of cluster tests whose process has ended
# (crates/thaw/tests/netns/mod.rs: namespaces thaw-test-PID-K-I, bridges thbPIDnK; a
# namespace's veth goes with it).
sweep_netns() {
    local n pid
    for n in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep '^thaw-test-[0-9]*-'); do
        pid="${n#thaw-test-}"; pid="${pid%%-*}"
        [ -e "/proc/$pid" ] || ip netns del "$n"
    done
    for n in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{ print $2 }' | grep '^thb[0-9]*n[0-9]*$'); do
        pid="${n#thb}"; pid="${pid%%n*}"
        [ -e "/proc/$pid" ] || ip link del "$n"
    done
}
sweep_scratch
sweep_netns

echo "== Module map (no new import circle inside a crate; scripts/modmap.py)"
python3 scripts/modmap.py
mods=$?

echo "== Rust tests (unit + integration, as root)"
# thaw bench's test (crates/bench/tests/quick.rs) runs the `thaw` binary this very build
# makes for the thaw crate's own tests (THAW_BIN): left to itself it ran `cargo build -p
# thaw`, whose features differ from the workspace test build's, and rebuilt everything
# under it a second time (~5 minutes of every run).
THAW_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/thaw" cargo test --workspace --release --no-fail-fast
rust=$?

echo "== Python tests (runtime shims, benchmark harness, Lambda API through boto3)"
.venv/bin/python -m pytest -q runtimes bench tests/api tests/tools
py=$?

# Every fuzz target (fuzz/README.md) for a bounded time on its seed corpus. The sanitizer
# build is cached outside the clone (its dependencies build once; ~10 min on 2 cores).
secs="${THAW_FUZZ_SECONDS:-15}"
echo "== Fuzzing (cargo-fuzz + AddressSanitizer, $secs s per target)"
CARGO_TARGET_DIR="${THAW_CACHE_DIR:-/var/cache/thaw}/fuzz-target" bash scripts/fuzz.sh "$secs"
fz=$?

sweep_scratch
sweep_netns

if [ $mods -ne 0 ] || [ $rust -ne 0 ] || [ $py -ne 0 ] || [ $fz -ne 0 ]; then
    echo "test: FAILED (modmap exit $mods, cargo exit $rust, pytest exit $py, fuzz exit $fz)" >&2
    exit 1
fi
