#!/usr/bin/env bash
# Build the Kubernetes control-plane pieces Thaw's cluster tests run against, from source.
#
#   bash scripts/build-k8s.sh            # idempotent; instant when the cache is complete
#   bash scripts/build-k8s.sh --print-dir
#
# Nothing prebuilt can be downloaded, so kube-apiserver, kube-controller-manager (its
# garbage collector deletes objects whose ownerReference points at a deleted Node) and
# kubectl (for `kubectl kustomize` and server-side dry-run) are built from the
# k8s.io/kubernetes Go module. `go install k8s.io/kubernetes/...@v1.34.4` is refused
# because kubernetes' go.mod has `replace` lines for its staging modules (k8s.io/api,
# k8s.io/apiserver, ...); a generated wrapper module requires k8s.io/kubernetes and
# repeats those replaces against the published v0.34.4 staging modules instead.
# etcd comes from Debian's etcd-server package.
#
# Output: ${THAW_CACHE_DIR:-/var/cache/thaw}/kubernetes-v1.34.4/{kube-apiserver,
# kube-controller-manager,kubectl,etcd}. The wrapper module is generated under the cache
# directory; no Kubernetes code enters this repository. ~8-15 min on 2 cores the first time.
set -euo pipefail
K8S_VERSION=v1.34.4
STAGING_VERSION=v0.34.4   # staging modules are tagged v0.<minor>.<patch>
CACHE="${THAW_CACHE_DIR:-/var/cache/thaw}/kubernetes-${K8S_VERSION}"
log() { echo "build-k8s: $*" >&2; }
die() { echo "build-k8s: error: $*" >&2; exit 1; }

if [ "${1:-}" = --print-dir ]; then echo "$CACHE"; exit 0; fi
[ $# -eq 0 ] || die "usage: $0 [--print-dir]"

mkdir -p "$CACHE"

# etcd: Debian's etcd-server (3.4). kube-apiserver 1.34 works with it (it detects the
# missing watch-progress feature and falls back).
if [ ! -x "$CACHE/etcd" ]; then
    if ! command -v etcd >/dev/null; then
        [ "$(id -u)" -eq 0 ] || die "etcd missing: run as root to apt-get install etcd-server"
        log "installing Debian package etcd-server"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
        # The package starts a system etcd on 2379; tests run their own on free ports.
        systemctl disable --now etcd >/dev/null 2>&1 || true
    fi
    ln -sf "$(command -v etcd)" "$CACHE/etcd"
fi

BINS=(kube-apiserver kube-controller-manager kubectl)
missing=()
for b in "${BINS[@]}"; do [ -x "$CACHE/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
    log "cached: $CACHE"
    exit 0
fi

command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || die "go not found (Go >= 1.24 is needed)"
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0

WRAP="$CACHE/wrapper"
if [ ! -f "$WRAP/go.sum" ]; then
    log "generating wrapper module in $WRAP"
    rm -rf "$WRAP"; mkdir -p "$WRAP"; cd "$WRAP"
    go mod init thaw.dev/k8s-wrapper >/dev/null 2>&1
    # kubernetes' own go.mod: every `k8s.io/x => ./staging/src/k8s.io/x` line.
    gomod="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@${K8S_VERSION}'s go.mod"
    staging=$(sed -n 's#^[[:space:]]*\(replace[[:space:]]\+\)\{0,1\}\(k8s\.io/[a-z0-9-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\2#p' "$gomod" | sort -u)
    [ -n "$staging" ] || die "no staging replaces found in $gomod"
    go mod edit -require="k8s.io/kubernetes@${K8S_VERSION}"
    for m in $staging; do go mod edit -replace="$m=$m@${STAGING_VERSION}"; done
    {
        echo '//go:build tools'
        echo
        echo 'package tools'
        echo
        echo 'import ('
        for b in "${BINS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
        echo ')'
    } > tools.go
    log "go mod tidy ($(echo "$staging" | wc -l) staging replaces)"
    go mod tidy
fi
cd "$WRAP"
# What `version.Get()` reports (kubectl's skew check, /version); same flags as hack/lib/version.sh.
VERSION_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
    VERSION_LDFLAGS+=" -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
    VERSION_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for b in "${missing[@]}"; do
    log "building $b ${K8S_VERSION} (several minutes on 2 cores)"
    nice -n 5 go build -trimpath -ldflags="-s -w $VERSION_LDFLAGS" -o "$CACHE/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$CACHE/$b.tmp" "$CACHE/$b"
done
log "ready: $CACHE"
