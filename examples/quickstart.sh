#!/usr/bin/env bash
# Plexus quick start: two networks for one container, end to end.
#
# As root on a Debian machine with a Rust toolchain, from the repository:
#   bash examples/quickstart.sh
#
# It installs the packages it needs, builds plexusd and plexus-shim, puts
# plexusd behind socket activation (systemd-socket-activate owns
# /run/plexus/plexus.sock; plexusd starts on the first CNI call) with
# examples/daemon-config.json, creates a network namespace, runs a real ADD
# through plexus-shim (cluster network plexus-cluster as eth0, default
# network plexus-lan as net1, both Debian's bridge + host-local), shows the
# interfaces and addresses, runs DEL, shows they are gone, and removes
# everything it made.
#
# PLEXUS_BIN_DIR=<dir with plexusd and plexus-shim> skips the build.
set -euo pipefail

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'quickstart: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run me as root (network namespaces and bridges need it)"
cd "$(dirname "$0")/.."
repo=$PWD
config=$repo/examples/daemon-config.json
sock_dir=/run/plexus
sock=$sock_dir/plexus.sock
id=plexus-demo-$$
ns=plexus-demo-$$

say "installing containernetworking-plugins, iproute2 and systemd (for systemd-socket-activate)"
if [ ! -x /usr/lib/cni/bridge ] || ! command -v ip >/dev/null || ! command -v systemd-socket-activate >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends containernetworking-plugins iproute2 systemd >/dev/null
fi
echo "ok"

if [ -n "${PLEXUS_BIN_DIR:-}" ]; then
    bin=$PLEXUS_BIN_DIR
else
    say "building plexusd and plexus-shim (release)"
    command -v cargo >/dev/null || die "cargo is missing: install a Rust toolchain (https://rustup.rs) first"
    cargo build --release --locked --bins
    bin=${CARGO_TARGET_DIR:-$repo/target}/release
fi
[ -x "$bin/plexusd" ] && [ -x "$bin/plexus-shim" ] || die "no plexusd/plexus-shim in $bin"

if [ -e "$sock" ]; then
    die "$sock already exists: is Plexus already running here? Stop it first."
fi

# Everything made below is listed here and undone on exit, even on failure.
made=()
launcher=
cleanup() {
    set +e
    if [ -n "$launcher" ]; then
        kill -TERM "$launcher" 2>/dev/null
        wait "$launcher" 2>/dev/null
    fi
    local i
    for ((i = ${#made[@]} - 1; i >= 0; i--)); do
        case ${made[$i]} in
            netns:*) ip netns del "${made[$i]#netns:}" 2>/dev/null ;;
            link:*) ip link del "${made[$i]#link:}" 2>/dev/null ;;
            dir:*) rm -rf "${made[$i]#dir:}" ;;
            file:*) rm -f "${made[$i]#file:}" ;;
        esac
    done
}
trap cleanup EXIT

# Host-side things the plugins create and never remove themselves: the
# bridges and host-local's reservation directories; and Plexus's own state.
for link in plexusbr0 plexusbr1; do
    ip link show "$link" >/dev/null 2>&1 || made+=("link:$link")
done
for dir in /var/lib/cni /var/lib/cni/networks /var/lib/cni/networks/plexus-cluster /var/lib/cni/networks/plexus-lan /var/lib/plexus "$sock_dir"; do
    [ -e "$dir" ] || made+=("dir:$dir")
done

say "socket activation: systemd-socket-activate listens on $sock; plexusd starts on the first call"
mkdir -p -m 0700 "$sock_dir"
systemd-socket-activate --listen="$sock" --fdname=plexus \
    "$bin/plexusd" --config "$config" &
launcher=$!
for _ in $(seq 100); do
    [ -S "$sock" ] && break
    kill -0 "$launcher" 2>/dev/null || die "systemd-socket-activate exited"
    sleep 0.05
done
[ -S "$sock" ] || die "$sock did not appear"
made+=("file:$sock")
echo "listening; plexusd is not running yet"

say "network namespace $ns"
ip netns add "$ns"
made+=("netns:$ns")

# What a container runtime gives the shim: the plugin entry of
# examples/cni/00-plexus.conflist with the list's name and cniVersion.
stdin='{"cniVersion":"1.0.0","name":"plexus","type":"plexus-shim","daemonSocketDir":"/run/plexus"}'
cni() {
    printf '%s' "$stdin" | env -i PATH="$PATH" CNI_COMMAND="$1" CNI_CONTAINERID="$id" \
        CNI_NETNS="/run/netns/$ns" CNI_IFNAME=eth0 CNI_PATH="$bin:/usr/lib/cni" \
        CNI_ARGS="IgnoreUnknown=1" "$bin/plexus-shim"
}

say "ADD through plexus-shim (the runtime's result is the cluster network's)"
cni ADD
echo

say "inside $ns"
ip -n "$ns" -br addr show
ip -n "$ns" -o -4 addr show dev eth0 | grep -q 'inet 10.252.10.' || die "eth0 has no plexus-cluster address"
ip -n "$ns" -o -4 addr show dev net1 | grep -q 'inet 10.252.20.' || die "net1 has no plexus-lan address"

say "what plexusd recorded (plexusd show $id)"
"$bin/plexusd" --config "$config" show "$id"

say "DEL through plexus-shim"
cni DEL
echo "ok"

say "inside $ns after DEL"
ip -n "$ns" -br addr show
if ip -n "$ns" link show eth0 >/dev/null 2>&1 || ip -n "$ns" link show net1 >/dev/null 2>&1; then
    die "interfaces are still there after DEL"
fi
if ls /var/lib/cni/networks/plexus-cluster /var/lib/cni/networks/plexus-lan 2>/dev/null | grep -q '^10\.'; then
    die "addresses are still reserved after DEL"
fi
if "$bin/plexusd" --config "$config" show "$id" >/dev/null 2>&1; then
    die "the attachment is still recorded after DEL"
fi
echo "eth0 and net1 are gone, both addresses are released, nothing is recorded"

say "cleaning up"
cleanup
launcher=
made=()
echo "done: everything the quick start made is removed"
