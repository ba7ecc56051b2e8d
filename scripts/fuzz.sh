#!/usr/bin/env bash
# Fuzz every target of fuzz/ (cargo-fuzz, libFuzzer + AddressSanitizer) for a bounded
# time each, starting from the checked-in seeds in fuzz/corpus/<target>.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 20 s, every target)
#   scripts/fuzz.sh --minutes M [TARGET...]              (a campaign: M minutes each, then
#                                                         merged into the committed seeds)
#
# New inputs that grow coverage are kept in a work corpus outside the clone
# (${THAW_FUZZ_DIR:-/var/tmp/thaw-fuzz}/<target>); crashes and hangs stop the run with
# the reproducer in fuzz/artifacts/<target>/ and a non-zero exit. cargo-fuzz is installed
# from crates.io into ${THAW_CACHE_DIR:-/var/cache/thaw}/cargo-fuzz-<version>/ once.
# Stable Rust is used with RUSTC_BOOTSTRAP=1 (libFuzzer needs -Zsanitizer flags).
set -euo pipefail
cd "$(dirname "$0")/.."

MERGE=0
if [ "${1:-}" = "--minutes" ]; then
    [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: --minutes needs a whole number of minutes" >&2; exit 2; }
    SECONDS_PER_TARGET=$(( $2 * 60 ))
    MERGE=1
    shift 2
else
    SECONDS_PER_TARGET=${1:-20}
    shift || true
fi
VERSION=0.13.2
TOOLS="${THAW_CACHE_DIR:-/var/cache/thaw}/cargo-fuzz-$VERSION"
if [ ! -x "$TOOLS/bin/cargo-fuzz" ]; then
    echo "fuzz: installing cargo-fuzz $VERSION into $TOOLS" >&2
    cargo install cargo-fuzz --version "$VERSION" --locked --root "$TOOLS.partial" >&2
    rm -rf "$TOOLS" && mv "$TOOLS.partial" "$TOOLS"
fi
export PATH="$TOOLS/bin:$PATH" RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"

cd fuzz
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || mapfile -t TARGETS < <(cargo fuzz list)
cargo fuzz build -O 2>&1 | tail -3 >&2 || { echo "fuzz: build failed" >&2; exit 2; }
WORK="${THAW_FUZZ_DIR:-/var/tmp/thaw-fuzz}"
status=0
for t in "${TARGETS[@]}"; do
    mkdir -p "$WORK/$t" "artifacts/$t"
    LOG="$WORK/$t.$$.log"   # per run: a long campaign and the suite's short run may share $WORK
    start=$(date +%s)
    # -timeout: one input taking over 10 s (THAW_FUZZ_TIMEOUT) is a hang; -rss_limit_mb: a
    # runaway allocation. The timeout is wall-clock: a campaign at idle priority on a
    # busy machine needs a larger one (a starved process looks hung; reproduce to check).
    if cargo fuzz run -O "$t" "$WORK/$t" "corpus/$t" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout="${THAW_FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 \
        -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"$LOG" 2>&1; then
        runs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$LOG" | grep -o '[0-9]*$' || echo '?')
        echo "fuzz: $t ok: $runs inputs in $(( $(date +%s) - start )) s"
        if [ "$MERGE" = 1 ]; then
            # Keep in the committed seeds only the inputs of the run that add coverage
            # (libFuzzer's merge: a small set, not the whole work corpus), and only those
            # up to THAW_FUZZ_MERGE_MAX_LEN bytes (default 4 KiB: the seeds stay small;
            # larger finds stay in the work corpus). The seeds already there are kept.
            before=$(ls "corpus/$t" | wc -l)
            cargo fuzz run -O "$t" "corpus/$t" "$WORK/$t" -- -merge=1 -max_len="${THAW_FUZZ_MERGE_MAX_LEN:-4096}" -rss_limit_mb=2048 >"$LOG.merge" 2>&1 \
                || { status=1; echo "fuzz: merging $t's corpus failed (log $LOG.merge)" >&2; }
            echo "fuzz: $t seeds: $before -> $(ls "corpus/$t" | wc -l) inputs ($(du -sh "corpus/$t" | cut -f1)); commit fuzz/corpus/$t and log the run in fuzz/README.md"
        fi
    else
        status=1
        echo "fuzz: $t FAILED (log $LOG, reproducer in fuzz/artifacts/$t/):" >&2
        grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$LOG" | head -5 >&2
    fi
done
exit $status
