#!/usr/bin/env bash
# Build the runtime shims that need a build step into build/runtimes/.
#
#   scripts/build-runtimes.sh
#
# Today that is the Java runtime: runtimes/java (Maven; Jackson is shaded and
# relocated into the jar) -> build/runtimes/java/thaw-java-runtime.jar, which
# `install_shims` (crates/runtime/src/runtimes.rs) copies into the runtime dir.
# Skipped when the sources are unchanged (stamp = hash of pom + sources + this
# script).  The Python and Node.js shims are plain files embedded by cargo.
#
# Environment: THAW_RUNTIMES_FORCE=1 rebuilds; MVN (default mvn).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/runtimes/java"
OUT="$ROOT/build/runtimes/java"
JAR="$OUT/thaw-java-runtime.jar"
# The shim's one native function (setenv for a base's function: runtimes/java/native).
NATIVE="$OUT/libthawenv.so"
JDK=/usr/lib/jvm/java-17-openjdk-amd64
MVN="${MVN:-mvn}"
log() { echo "build-runtimes: $*" >&2; }
die() { echo "build-runtimes: error: $*" >&2; exit 1; }

command -v "$MVN" >/dev/null || die "$MVN not found (apt-get install maven)"
[ -x /usr/lib/jvm/java-17-openjdk-amd64/bin/javac ] || die "JDK 17 not found (apt-get install openjdk-17-jdk-headless)"

hash="$( { sha256sum "$ROOT/scripts/build-runtimes.sh" | cut -d' ' -f1
          (cd "$SRC" && find pom.xml src native -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); } \
        | sha256sum | cut -d' ' -f1)"
if [ "${THAW_RUNTIMES_FORCE:-0}" != 1 ] && [ -f "$JAR" ] && [ -f "$NATIVE" ] && [ -f "$OUT/.stamp" ] && [ "$(cat "$OUT/.stamp")" = "$hash" ]; then
    log "java: up to date"
    exit 0
fi
log "java: building with Maven"
mkdir -p "$OUT"
build="$(mktemp -d /tmp/thaw-java-runtime.XXXXXX)"
trap 'rm -rf "$build"' EXIT
cp -r "$SRC/pom.xml" "$SRC/src" "$build/"
if ! (cd "$build" && JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 "$MVN" -q -B package >"$build/mvn.log" 2>&1); then
    cat "$build/mvn.log" >&2
    die "java: mvn package failed"
fi
command -v cc >/dev/null || die "no C compiler (apt-get install gcc)"
cc -shared -fPIC -O2 -Wall -Werror -I"$JDK/include" -I"$JDK/include/linux" \
    -o "$build/libthawenv.so" "$SRC/native/thaw_env.c" || die "java: compiling native/thaw_env.c failed"
cp "$build/target/thaw-java-runtime.jar" "$JAR.tmp"
mv "$JAR.tmp" "$JAR"
cp "$build/libthawenv.so" "$NATIVE.tmp"
mv "$NATIVE.tmp" "$NATIVE"
echo "$hash" >"$OUT/.stamp"
log "java: built ${JAR#$ROOT/} ($(du -h "$JAR" | cut -f1))"
