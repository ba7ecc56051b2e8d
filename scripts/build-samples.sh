#!/usr/bin/env bash
# Build every sample function into build/samples/<runtime>/<name>/.
#
#   scripts/build-samples.sh [name...]
#
# A name is `nodejs/<name>`, `java/<name>` or a Python sample's plain name
# (`python/<name>` works too); `nodejs` / `java` / `python` alone mean all of
# that runtime's samples.  Default: every sample of every runtime.
#
# Node.js (samples/nodejs/*): sources copied; a package.json's dependencies are
# installed with `npm ci --omit=dev` (package-lock.json pinned) into the build.
# Java (samples/java/*, one Maven multi-module build): the Java runtime jar is
# built first (scripts/build-runtimes.sh); bundles are laid out as Lambda
# extracts them: classes at the root (helloworld, matmul, random), classes +
# lib/*.jar (jsonhandler), or the function's jar itself (features/features.jar).
# Both are smoke-tested through runtimes/harness.py like the Python ones.
#
# Python:
# For each sample: copy its sources, install requirements.txt (if any) into
# the same directory with Debian's /usr/bin/python3 -m pip --target, byte-
# compile everything, and write a build stamp.  A sample whose stamp matches
# the hash of its sources + requirements (+ interpreter + this script) is
# skipped, so a second run is fast.  At the end every built sample is smoke-
# tested with /usr/bin/python3 through the real runtime shim
# (runtimes/harness.py -> runtimes/python/bootstrap.py).
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
# How a sample is called (handler, payload), from samples/manifest.json, which
# thaw bench reads too.  NAME as the bench spells it: plain (Python), nodejs/x, java/x.
sample_meta() {  # handler|payload NAME
    "$PY" - "$ROOT/samples/manifest.json" "$1" "$2" <<'PYEOF'
import json, sys
manifest, field, name = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
entry = manifest["functions"].get(name, {})
if field == "handler":
    runtime = name.split("/")[0] if "/" in name else "python"
    print(entry.get("handler") or manifest["default_handler"][runtime])
else:
    print(json.dumps(entry.get("payload", {}), separators=(",", ":")))
PYEOF
}

smoke_one() {
    local name="$1" dst="$OUT/$1"
    local expect; expect="$(expect_for "$name")"
    local payload; payload="$(sample_meta payload "$name")"
    local out
    out="$("$PY" "$ROOT/runtimes/harness.py" --runtime python --code "$dst" --handler "$(sample_meta handler "$name")" --memory 128 \
            --payload "$payload")" || die "$name: smoke harness failed"
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

# --------------------------------------------------------------------------
# Node.js and Java samples
# --------------------------------------------------------------------------

NODE_SRC="$ROOT/samples/nodejs"
NODE_OUT="$ROOT/build/samples/nodejs"
JAVA_SRC="$ROOT/samples/java"
JAVA_OUT="$ROOT/build/samples/java"

tree_hash() {
    {
        sha256sum "$ROOT/scripts/build-samples.sh" | cut -d' ' -f1
        "$@"
    } | sha256sum | cut -d' ' -f1
}

build_node() {
    local name="$1" src="$NODE_SRC/$1" dst="$NODE_OUT/$1"
    command -v node >/dev/null || die "node not found (the nodejs runtime uses /usr/bin/node)"
    local hash; hash="$(tree_hash bash -c "node --version; cd '$src' && find . -type f ! -path './node_modules/*' -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")"
    if [ "${THAW_SAMPLES_FORCE:-0}" != 1 ] && [ -f "$dst/$STAMP_NAME" ] && [ "$(cat "$dst/$STAMP_NAME")" = "$hash" ]; then
        log "nodejs/$name: up to date"
        return 0
    fi
    log "nodejs/$name: building"
    local tmp="$NODE_OUT/.$name.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp"
    (cd "$src" && tar --exclude=node_modules -cf - .) | (cd "$tmp" && tar -xf -) || die "nodejs/$name: copying sources failed"
    if [ -f "$tmp/package.json" ]; then
        command -v npm >/dev/null || die "nodejs/$name: npm not found"
        local cmd=(npm install --omit=dev --no-audit --no-fund --no-update-notifier)
        [ -f "$tmp/package-lock.json" ] && cmd=(npm ci --omit=dev --no-audit --no-fund --no-update-notifier)
        if ! (cd "$tmp" && "${cmd[@]}" >"$tmp.npm.log" 2>&1); then
            cat "$tmp.npm.log" >&2; rm -rf "$tmp" "$tmp.npm.log"
            die "nodejs/$name: ${cmd[*]} failed"
        fi
        rm -f "$tmp.npm.log"
    fi
    echo "$hash" >"$tmp/$STAMP_NAME"
    rm -rf "$dst"; mv "$tmp" "$dst"
    log "nodejs/$name: built ($(du -sh "$dst" | cut -f1))"
}

# All Java samples come from one Maven build; each is then laid out.
build_java_all() {
    command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
    bash "$ROOT/scripts/build-runtimes.sh"
    local hash; hash="$(tree_hash bash -c "cd '$JAVA_SRC' && find . -type f ! -path '*/target/*' -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")"
    if [ "${THAW_SAMPLES_FORCE:-0}" != 1 ] && [ -f "$JAVA_OUT/$STAMP_NAME" ] && [ "$(cat "$JAVA_OUT/$STAMP_NAME")" = "$hash" ]; then
        log "java: up to date"
        return 0
    fi
    log "java: building with Maven"
    local tmp; tmp="$(mktemp -d /tmp/thaw-java-samples.XXXXXX)"
    (cd "$JAVA_SRC" && tar --exclude=target -cf - .) | (cd "$tmp" && tar -xf -)
    if ! (cd "$tmp" && JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 mvn -q -B package >"$tmp/mvn.log" 2>&1); then
        cat "$tmp/mvn.log" >&2; rm -rf "$tmp"
        die "java: mvn package failed"
    fi
    local out="$JAVA_OUT.tmp.$$"
    rm -rf "$out"; mkdir -p "$out"
    for d in "$tmp"/*/; do
        local name; name="$(basename "$d")"
        local jar="$d/target/$name.jar"
        [ -f "$jar" ] || continue
        mkdir -p "$out/$name"
        case "$name" in
            features) cp "$jar" "$out/$name/$name.jar" ;;   # bundle = the function's jar
            *) (cd "$out/$name" && unzip -q "$jar" -x 'META-INF/*') ;;   # extracted classes
        esac
        if [ -d "$d/target/lib" ]; then
            mkdir -p "$out/$name/lib"; cp "$d/target/lib/"*.jar "$out/$name/lib/"
        fi
        echo "$hash" >"$out/$name/$STAMP_NAME"
    done
    rm -rf "$tmp"
    echo "$hash" >"$out/$STAMP_NAME"
    rm -rf "$JAVA_OUT"; mv "$out" "$JAVA_OUT"
    log "java: built $(ls "$JAVA_OUT" | tr '\n' ' ')"
}

smoke_rt() {
    local rt="$1" name="$2" dst="$ROOT/build/samples/$1/$2"
    local out
    out="$("$PY" "$ROOT/runtimes/harness.py" --runtime "$rt" --code "$dst" --handler "$(sample_meta handler "$rt/$name")" \
            --payload "$(sample_meta payload "$rt/$name")" --invocations 2 --restored)" || die "$rt/$name: smoke harness failed"
    NAME="$rt/$name" "$PY" -c '
import json, os, sys
o = json.loads(sys.stdin.read())
name = os.environ["NAME"]
init = o.get("init") or {}
if init.get("type") != "ready":
    ok, got = False, "init failed: %s" % json.dumps(init)
else:
    rs = o["results"]
    ok = all(r.get("ok") is True for r in rs) and (o.get("restored") or {}).get("type") == "ok"
    got = rs[0].get("result") if ok else json.dumps(rs) + " restored=" + json.dumps(o.get("restored"))
msg = "%-18s init %7.1f ms  threads %2s  %s" % (name, o.get("init_ms", 0), o.get("threads", "?"),
                                                 got if len(got) < 100 else got[:97] + "...")
print(("smoke ok:   " if ok else "smoke FAIL: ") + msg, file=sys.stderr)
if not ok:
    print(o.get("log", ""), file=sys.stderr)
sys.exit(0 if ok else 1)
' <<<"$out" || die "$rt/$name: smoke test failed"
}

main() {
    local py=() node=() java=() a
    if [ "$#" -eq 0 ]; then set -- python nodejs java; fi
    for a in "$@"; do
        case "$a" in
            python) for d in "$SRC"/*/; do py+=("$(basename "$d")"); done ;;
            nodejs) for d in "$NODE_SRC"/*/; do node+=("$(basename "$d")"); done ;;
            java) for d in "$JAVA_SRC"/*/; do java+=("$(basename "$d")"); done ;;
            nodejs/*) [ -d "$NODE_SRC/${a#nodejs/}" ] || die "unknown sample '$a'"; node+=("${a#nodejs/}") ;;
            java/*) [ -d "$JAVA_SRC/${a#java/}" ] || die "unknown sample '$a'"; java+=("${a#java/}") ;;
            python/*) py+=("${a#python/}") ;;
            *) py+=("$a") ;;
        esac
    done
    mkdir -p "$OUT" "$NODE_OUT"
    for n in "${py[@]}"; do
        [ -d "$SRC/$n" ] || die "unknown sample '$n' (no $SRC/$n)"
        build_one "$n"
    done
    for n in "${node[@]}"; do build_node "$n"; done
    [ "${#java[@]}" -gt 0 ] && build_java_all
    if [ "${THAW_SAMPLES_NO_SMOKE:-0}" != 1 ]; then
        for n in "${py[@]}"; do smoke_one "$n"; done
        for n in "${node[@]}"; do smoke_rt nodejs "$n"; done
        for n in "${java[@]}"; do smoke_rt java "$n"; done
    fi
    log "done: ${#py[@]} python, ${#node[@]} nodejs, ${#java[@]} java sample(s) in build/samples"
}

main "$@"
