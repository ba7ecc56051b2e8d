#!/usr/bin/env bash
# Build the custom-runtime (provided.al2023) samples into
# build/samples/provided/<name>/bootstrap, as a user builds them for AWS Lambda:
#
#   go-hello    Go + github.com/aws/aws-lambda-go (go.sum pinned), CGO_ENABLED=0
#   rust-hello  Rust + the lambda_runtime crate (Cargo.lock pinned); its target
#               directory is cached outside the clone in
#               ${THAW_CACHE_DIR:-/var/cache/thaw}/provided-rust-target (~1 min once)
#
# A sample whose stamp matches the hash of its sources is skipped.
#   scripts/build-provided.sh [go-hello|rust-hello ...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/samples/provided"
OUT="$ROOT/build/samples/provided"
CACHE="${THAW_CACHE_DIR:-/var/cache/thaw}"

die() { echo "build-provided: error: $*" >&2; exit 1; }
log() { echo "build-provided: $*" >&2; }

export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$PATH"

stamp_of() {  # the hash of a sample's sources and of this script
    (cd "$SRC/$1" && find . -path ./target -prune -o -type f -print0 | sort -z | xargs -0 sha256sum; sha256sum "$ROOT/scripts/build-provided.sh") | sha256sum | cut -c1-16
}

build() {
    local name="$1" dst="$OUT/$1" stamp
    stamp="$(stamp_of "$name")"
    if [ -x "$dst/bootstrap" ] && [ "$(cat "$dst/.stamp" 2>/dev/null)" = "$stamp" ]; then
        log "$name: up to date"
        return
    fi
    log "$name: building"
    mkdir -p "$dst"
    case "$name" in
        go-*)
            command -v go >/dev/null || die "go not found (Go 1.24+ is needed)"
            (cd "$SRC/$name" && CGO_ENABLED=0 GOOS=linux GOFLAGS=-buildvcs=false go build -trimpath -ldflags="-s -w" -o "$dst/bootstrap.tmp" .) \
                || die "$name: go build failed"
            ;;
        rust-*)
            command -v cargo >/dev/null || die "cargo not found"
            local target="$CACHE/provided-rust-target"
            mkdir -p "$target"
            (cd "$SRC/$name" && CARGO_TARGET_DIR="$target/$name" cargo build --release --locked --quiet) || die "$name: cargo build failed"
            cp "$target/$name/release/bootstrap" "$dst/bootstrap.tmp"
            ;;
        *) die "unknown sample '$name'" ;;
    esac
    mv "$dst/bootstrap.tmp" "$dst/bootstrap"
    echo "$stamp" > "$dst/.stamp"
    log "$name: built ($(du -h "$dst/bootstrap" | cut -f1))"
}

if [ "$#" -eq 0 ]; then
    for d in "$SRC"/*/; do set -- "$@" "$(basename "$d")"; done
fi
for n in "$@"; do
    [ -d "$SRC/$n" ] || die "unknown sample '$n'"
    build "$n"
done
