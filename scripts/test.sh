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

echo "== Module map (no new import circle inside a crate; scripts/modmap.py)"
python3 scripts/modmap.py
mods=$?

echo "== Rust tests (unit + integration, as root)"
cargo test --workspace --release --no-fail-fast
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

if [ $mods -ne 0 ] || [ $rust -ne 0 ] || [ $py -ne 0 ] || [ $fz -ne 0 ]; then
    echo "test: FAILED (modmap exit $mods, cargo exit $rust, pytest exit $py, fuzz exit $fz)" >&2
    exit 1
fi
