#!/usr/bin/env bash
# Build MinIO (the S3-compatible server the snapshot store's tests run against)
# from its Go module and keep it outside the clone, keyed by version:
#
#   scripts/build-minio.sh        # prints the binary's path on stdout
#
# -> ${THAW_CACHE_DIR:-/var/cache/thaw}/minio-<version>/minio
#
# Nothing prebuilt can be downloaded here: the Go module proxy serves MinIO's
# sources and Go builds them (~7 min on 2 cores, a ~150 MB binary). A binary
# already in the cache is reused. The version is pinned (MinIO tags are not
# semver, so the module version is a pseudo-version of a RELEASE commit); bump
# MINIO_VERSION here and in crates/store/tests/common/mod.rs together.
#
# Environment: THAW_CACHE_DIR (default /var/cache/thaw), GO (default go).
set -euo pipefail
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"
CACHE="${THAW_CACHE_DIR:-/var/cache/thaw}"
DIR="$CACHE/minio-$MINIO_VERSION"
BIN="$DIR/minio"
log() { echo "build-minio: $*" >&2; }
die() { echo "build-minio: error: $*" >&2; exit 1; }

if [ -x "$BIN" ]; then
    log "minio $MINIO_VERSION: up to date ($BIN)"
    echo "$BIN"
    exit 0
fi

GO="${GO:-go}"
command -v "$GO" >/dev/null || [ -x /usr/local/go/bin/go ] || die "go not found (Go 1.24+ is needed to build MinIO)"
command -v "$GO" >/dev/null || GO=/usr/local/go/bin/go
log "minio $MINIO_VERSION: building with $("$GO" version | cut -d' ' -f3) (several minutes on 2 cores)"

mkdir -p "$CACHE"
# Build into a temporary directory next to the final one and rename it into
# place, so an interrupted build never leaves a half-written binary behind.
tmp="$(mktemp -d "$CACHE/.minio-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
if ! GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
        "$GO" install -trimpath "github.com/minio/minio@$MINIO_VERSION" >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log" >&2
    die "go install github.com/minio/minio@$MINIO_VERSION failed"
fi
[ -x "$tmp/minio" ] || die "go install did not produce a minio binary"
"$tmp/minio" --version >/dev/null 2>&1 || die "the built minio binary does not run"
rm -f "$tmp/build.log"
if ! mv -T "$tmp" "$DIR" 2>/dev/null; then
    # Another build finished first: keep its binary.
    [ -x "$BIN" ] || die "could not move the build into $DIR"
fi
trap - EXIT
log "minio $MINIO_VERSION: built in $(( $(date +%s) - start )) s -> $BIN"
echo "$BIN"
