#!/usr/bin/env bash
# The whole test run from a fresh clone: installs what the tests need, builds
# the distribution packages that tests/integration/packaging.rs inspects, checks
# formatting and lints, then runs every test.
#
#   bash scripts/test.sh
#
# As root (the tests use network namespaces, real CNI plugins and a private
# systemd manager); Debian or a derivative with a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(containernetworking-plugins iproute2 iptables dnsmasq-base systemd util-linux procps curl jq lintian rpm containerd runc gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "scripts/test.sh: missing Debian packages (run as root to install): ${missing[*]}" >&2
        exit 1
    fi
    echo "scripts/test.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The package builders, pinned (packaging/build.sh uses them).
cargo deb --version >/dev/null 2>&1 || cargo install --locked --quiet cargo-deb@3.8.0
cargo generate-rpm --version >/dev/null 2>&1 || cargo install --locked --quiet cargo-generate-rpm@0.21.1
bash packaging/build.sh

cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked
