#!/usr/bin/env bash
# Install everything Thaw needs on a fresh Debian 12 machine of this kind, then build.
#
#   bash scripts/setup.sh            # idempotent; fast when everything is in place
#
# Installs Debian packages (python3, pip, venv), creates .venv with the Python
# test/bench tools, builds the sample functions into build/samples/ and builds
# the `thaw` binary (target/release/thaw). Must run as root: Thaw itself needs
# root (namespaces, cgroups, ptrace, userfaultfd).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "setup: $*" >&2; }
die() { echo "setup: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (Thaw needs namespaces, cgroups, ptrace and userfaultfd)"

need_pkgs=()
for p in python3 python3-pip python3-venv; do
    dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    log "installing Debian packages: ${need_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

command -v cargo >/dev/null || [ -x "$HOME/.cargo/bin/cargo" ] \
    || die "cargo not found: install a Rust toolchain (rustup) first"
export PATH="$HOME/.cargo/bin:$PATH"

if [ ! -x .venv/bin/python ] || [ requirements-dev.txt -nt .venv/.stamp ]; then
    log "creating .venv with the Python test tools"
    /usr/bin/python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check --no-input -r requirements-dev.txt
    touch .venv/.stamp
fi

# Host tuning for a Thaw node: moving a process into a cgroup v1 hierarchy waits
# for an RCU grace period (10-20 ms on these VMs), which would dominate sandbox
# creation. Expedited grace periods make it ~0.1 ms. See ARCHITECTURE.md.
if [ -w /sys/kernel/rcu_expedited ] && [ "$(cat /sys/kernel/rcu_expedited)" != 1 ]; then
    log "enabling expedited RCU grace periods (/sys/kernel/rcu_expedited=1) for fast cgroup attach"
    echo 1 > /sys/kernel/rcu_expedited
fi

# Cluster tests: etcd (Debian) + kube-apiserver, kube-controller-manager and kubectl
# built from the k8s.io/kubernetes Go module, cached outside the clone (~10 min once).
bash scripts/build-k8s.sh

log "building MinIO (the S3 server the snapshot store's tests use; cached outside the clone)"
bash scripts/build-minio.sh >/dev/null
bash scripts/build-runtimes.sh   # Java runtime jar (build/runtimes/java), copied into the shim dir by thaw
log "building sample functions"
bash scripts/build-samples.sh
bash scripts/build-provided.sh   # Go and Rust custom-runtime samples (provided.al2023)

log "building thaw (release)"
cargo build --release --quiet
bash scripts/build-init.sh   # the sandbox init linked statically (musl): faster to start
log "ready: target/release/thaw"
