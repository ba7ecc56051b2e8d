#!/usr/bin/env bash
# The main demo: cold boot vs. snapshot restore of sample functions, printing both latencies.
#
#   bash scripts/demo.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THAW="$ROOT/target/release/thaw"
[ -x "$THAW" ] || { echo "demo: run 'bash scripts/setup.sh' first" >&2; exit 1; }
WORK="$(mktemp -d /tmp/thaw-demo.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

ms() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.1f' % (d['total_ms']))" "$1"; }

printf '%-14s %11s %15s %15s %17s  %s\n' function "cold boot" "restore lazy" "restore eager" "restore REAP" result
for fn in helloworld heavyimports; do
    code="$ROOT/build/samples/python/$fn"
    payload='{"name":"demo"}'
    "$THAW" boot --code "$code" --handler handler.handler --payload "$payload" --quiet --stats "$WORK/boot.json" >/dev/null
    "$THAW" snapshot create --code "$code" --handler handler.handler --out "$WORK/$fn.snap" >/dev/null
    "$THAW" snapshot evict "$WORK/$fn.snap"
    result=$("$THAW" snapshot restore "$WORK/$fn.snap" --payload "$payload" --paging lazy --quiet --stats "$WORK/lazy.json")
    "$THAW" snapshot evict "$WORK/$fn.snap"
    "$THAW" snapshot restore "$WORK/$fn.snap" --payload "$payload" --paging eager --quiet --stats "$WORK/eager.json" >/dev/null
    # REAP: the first restore records the working set, later ones prefetch it.
    "$THAW" snapshot restore "$WORK/$fn.snap" --payload "$payload" --paging record --quiet >/dev/null
    "$THAW" snapshot evict "$WORK/$fn.snap"
    "$THAW" snapshot restore "$WORK/$fn.snap" --payload "$payload" --paging prefetch --quiet --stats "$WORK/reap.json" >/dev/null
    printf '%-14s %8s ms %12s ms %12s ms %14s ms  %s\n' "$fn" "$(ms "$WORK/boot.json")" "$(ms "$WORK/lazy.json")" \
        "$(ms "$WORK/eager.json")" "$(ms "$WORK/reap.json")" "${result:0:40}"
done
echo "(time to first response; single runs, page cache of each snapshot evicted before each restore."
echo " For medians over repeated runs: target/release/thaw bench)"
