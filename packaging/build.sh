#!/usr/bin/env bash
# Builds the Debian and RPM packages into target/packages/:
#   bash packaging/build.sh
# Needs cargo-deb and cargo-generate-rpm (`cargo install --locked cargo-deb
# cargo-generate-rpm`). Everything is built under ./target: the package
# metadata in Cargo.toml names files there.
set -euo pipefail
cd "$(dirname "$0")/.."
unset CARGO_TARGET_DIR

for tool in deb generate-rpm; do
    if ! cargo "$tool" --version >/dev/null 2>&1; then
        echo "packaging/build.sh: cargo-$tool is missing: cargo install --locked cargo-$tool" >&2
        exit 1
    fi
done

out=target/packages
mkdir -p "$out"

cargo build --release --locked --bins
# The shim is executed for every CNI call: link it statically, which saves
# the dynamic loader's work on each exec (about 0.3 ms of CPU per call).
cargo rustc --release --locked --bin plexus-shim -- -C target-feature=+crt-static
# Man pages and completions (plexusd's generated from its command line).
rm -rf target/gendocs
cargo run --release --locked --features gendocs --bin plexus-gendocs -- target/gendocs
gzip -9 -n -f target/gendocs/man/plexusd.8 target/gendocs/man/plexus-shim.8
# The shim link unit names the shim's path: Fedora's in the RPM.
mkdir -p target/rpm
sed 's#/usr/lib/cni/plexus-shim#/usr/libexec/cni/plexus-shim#' \
    systemd/plexus-shim-link.service >target/rpm/plexus-shim-link.service
if ! grep -q '^ExecStart=.* /usr/libexec/cni/plexus-shim ' target/rpm/plexus-shim-link.service; then
    echo "packaging/build.sh: the shim's path in plexus-shim-link.service was not replaced" >&2
    exit 1
fi

cargo deb --no-build --output "$out/"
cargo generate-rpm --output "$out/"
ls -l "$out"
