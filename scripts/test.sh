#!/usr/bin/env bash
# Run the whole test suite (as root): set-up, Rust unit + integration tests, Python tests.
#
#   bash scripts/test.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh || { echo "test: set-up failed" >&2; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"

echo "== Rust tests (unit + integration, as root)"
cargo test --workspace --release --no-fail-fast
rust=$?

echo "== Python tests (runtime shims, benchmark harness, Lambda API through boto3)"
.venv/bin/python -m pytest -q runtimes bench tests/api
py=$?

if [ $rust -ne 0 ] || [ $py -ne 0 ]; then
    echo "test: FAILED (cargo exit $rust, pytest exit $py)" >&2
    exit 1
fi
