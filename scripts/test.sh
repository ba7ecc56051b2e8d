#!/usr/bin/env bash
# Run the whole test suite (as root): set-up, Rust unit + integration tests, Python tests.
#
#   bash scripts/test.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== Rust tests (unit + integration, as root)"
cargo test --workspace --release 2>&1 | tee /tmp/thaw-cargo-test.log

echo "== Python tests (runtime shim, benchmark harness, API)"
py_dirs=(runtimes/python bench)
[ -d tests/api ] && py_dirs+=(tests/api)
.venv/bin/python -m pytest -q "${py_dirs[@]}"
