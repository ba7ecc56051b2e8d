#!/usr/bin/env bash
# Build every sample function into build/samples/python/<name>/.
#
#   scripts/build-samples.sh [name...]      (default: every samples/python/*)
#
# For each sample: copy its sources, install requirements.txt (if any) into
# the same directory with Debian's /usr/bin/python3 -m pip --target, byte-
# compile everything, and write a build stamp.  A sample whose stamp matches
# the hash of its sources + requirements (+ interpreter + this script) is
# skipped, so a second run is fast.  At the end every built sample is smoke-
# tested with /usr/bin/python3 through the real runtime shim
# (runtimes/python/harness.py -> runtimes/python/bootstrap.py).
#
# Environment: PYTHON (default /usr/bin/python3), THAW_SAMPLES_FORCE=1 to
# rebuild everything, THAW_SAMPLES_NO_SMOKE=1 to skip the smoke test.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/samples/python"
OUT="$ROOT/build/samples/python"
PY="${PYTHON:-/usr/bin/python3}"
STAMP_NAME=".thaw-build-stamp"

die() { echo "build-samples: error: $*" >&2; exit 1; }
log() { echo "build-samples: $*" >&2; }

[ -x "$PY" ] || die "$PY not found (the sandboxed runtime uses Debian's python3: apt-get install python3)"
[ -d "$SRC" ] || die "no samples in $SRC"

ensure_pip() {
    if "$PY" -m pip --version >/dev/null 2>&1; then return 0; fi
    log "$PY has no pip; installing Debian's python3-pip"
    command -v apt-get >/dev/null || die "pip missing and apt-get not available"
    if [ "$(id -u)" -ne 0 ]; then die "pip missing: run 'apt-get install python3-pip' as root"; fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null \
        || die "apt-get install python3-pip failed"
    "$PY" -m pip --version >/dev/null 2>&1 || die "pip still unusable after installing python3-pip"
}

# hash of everything that determines a sample's build output
sample_hash() {
    local dir="$1"
    {
        "$PY" -c 'import sys; print(sys.version)'
        sha256sum "$ROOT/scripts/build-samples.sh" | cut -d' ' -f1
        (cd "$dir" && find . -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
            | LC_ALL=C sort -z | xargs -0 -r sha256sum)
    } | sha256sum | cut -d' ' -f1
}

build_one() {
    local name="$1" src="$SRC/$1" dst="$OUT/$1"
    [ -f "$src/handler.py" ] || die "$name: $src/handler.py missing"
    local hash; hash="$(sample_hash "$src")"
    if [ "${THAW_SAMPLES_FORCE:-0}" != 1 ] && [ -f "$dst/$STAMP_NAME" ] \
        && [ "$(cat "$dst/$STAMP_NAME")" = "$hash" ]; then
        log "$name: up to date"
        return 0
    fi
    log "$name: building"
    local tmp="$OUT/.$name.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    # copy sources (no bytecode caches)
    (cd "$src" && tar --exclude='__pycache__' --exclude='*.pyc' -cf - .) | (cd "$tmp" && tar -xf -) \
        || die "$name: copying sources failed"
    if [ -f "$src/requirements.txt" ]; then
        ensure_pip
        # --target bypasses Debian's EXTERNALLY-MANAGED guard and never
        # touches the system site-packages; --no-user keeps ~/.local out;
        # --only-binary keeps builds fast and free of compilers.
        if ! PYTHONDONTWRITEBYTECODE= PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install \
                --quiet --no-cache-dir --disable-pip-version-check --no-input \
                --no-warn-script-location --only-binary=:all: \
                --target "$tmp" -r "$src/requirements.txt" >"$tmp.pip.log" 2>&1; then
            cat "$tmp.pip.log" >&2
            rm -rf "$tmp" "$tmp.pip.log"
            die "$name: pip install -r requirements.txt failed"
        fi
        rm -f "$tmp.pip.log"
        rm -rf "$tmp/bin"   # console scripts are useless in a function bundle
    fi
    # byte-compile so the sandbox (read-only code, PYTHONDONTWRITEBYTECODE or
    # not) never compiles at cold start; timestamp-based pycs stay valid as
    # long as the files keep their mtimes.
    PYTHONDONTWRITEBYTECODE= "$PY" -m compileall -q -j 0 "$tmp" >/dev/null \
        || die "$name: compileall failed"
    echo "$hash" >"$tmp/$STAMP_NAME"
    rm -rf "$dst"
    mv "$tmp" "$dst"
    log "$name: built ($(du -sh "$dst" | cut -f1))"
}

# expected smoke outcome per sample: "ok" | "error:<ErrorType>" | "init_error:<ErrorType>"
expect_for() {
    case "$1" in
        error) echo "error:ValueError" ;;
        initerror) echo "init_error:RuntimeError" ;;
        *) echo "ok" ;;
    esac
}
payload_for() {
    case "$1" in
        helloworld) echo '{"name":"smoke"}' ;;
        bigheap) echo '{"i":7}' ;;
        error) echo '{"fail":"smoke"}' ;;
        pyaes) echo '{"text":"the quick brown fox jumps over the lazy dog","rounds":3}' ;;
        jsonserde) echo '{"key":"delta"}' ;;
        htmlrender) echo '{"rows":200}' ;;
        imagerotate) echo '{"angle":90}' ;;
        lrserving) echo '{"x":[0.5,-1.0,0.25,2.0,-0.75,1.5,0.0,-2.0,1.0,0.3,-0.3,0.8,-1.2,0.6,0.05,-0.45,1.1,-0.9,0.2,0.7]}' ;;
        multiinput) echo '{"table":3}' ;;
        *) echo '{}' ;;
    esac
}

smoke_one() {
    local name="$1" dst="$OUT/$1"
    local expect; expect="$(expect_for "$name")"
    local payload; payload="$(payload_for "$name")"
    local out
    out="$("$PY" "$ROOT/runtimes/python/harness.py" --code "$dst" --handler handler.handler \
            --payload "$payload" --python "$PY")" || die "$name: smoke harness failed"
    EXPECT="$expect" NAME="$name" "$PY" -c '
import json, os, sys
o = json.loads(sys.stdin.read())
exp, name = os.environ["EXPECT"], os.environ["NAME"]
init = o.get("init") or {}
if exp.startswith("init_error:"):
    ok = init.get("type") == "init_error" and init.get("errorType") == exp.split(":", 1)[1]
    got = "%s %s" % (init.get("type"), init.get("errorType"))
elif init.get("type") != "ready":
    ok, got = False, "init failed: %s" % json.dumps(init)
else:
    r = o["results"][0]
    if exp == "ok":
        ok = r.get("ok") is True
        got = r.get("result") if ok else json.dumps(r.get("error"))
    else:
        ok = r.get("ok") is False and r["error"]["errorType"] == exp.split(":", 1)[1]
        got = json.dumps(r.get("error"))
msg = "%-13s init %6.1f ms  %s" % (name, o.get("init_ms", 0), got if len(got) < 100 else got[:97] + "...")
print(("smoke ok:   " if ok else "smoke FAIL: ") + msg, file=sys.stderr)
if not ok:
    print(o.get("log", ""), file=sys.stderr)
sys.exit(0 if ok else 1)
' <<<"$out" || die "$name: smoke test failed (expected $expect)"
}

main() {
    local names=()
    if [ "$#" -gt 0 ]; then
        names=("$@")
    else
        for d in "$SRC"/*/; do names+=("$(basename "$d")"); done
    fi
    mkdir -p "$OUT"
    for n in "${names[@]}"; do
        [ -d "$SRC/$n" ] || die "unknown sample '$n' (no $SRC/$n)"
        build_one "$n"
    done
    if [ "${THAW_SAMPLES_NO_SMOKE:-0}" != 1 ]; then
        for n in "${names[@]}"; do smoke_one "$n"; done
    fi
    log "done: ${#names[@]} sample(s) in ${OUT#$ROOT/}"
}

main "$@"
