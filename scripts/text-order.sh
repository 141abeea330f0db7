#!/usr/bin/env bash
# Regenerates link/plexusd-text.ld: runs the benchmark's scenarios (quick
# counts) with every plexusd they start traced by scripts/text_order/trace.py,
# and turns the functions that ran into the linker script that places them
# first in plexusd's text (see build.rs). Run as root on x86-64, after
# changes to the call path, the release profile or the toolchain; commit
# the result.
set -euo pipefail
cd "$(dirname "$0")/.."

bench=$(cargo bench --locked --bench cni_path --no-run 2>&1 |
    sed -n 's/^ *Executable benches\/cni_path.rs (\(.*\))$/\1/p' | tail -n 1)
[ -x "$bench" ] || { echo "text-order: the benchmark did not build" >&2; exit 1; }

daemon=target/release/plexusd
tmp=$(mktemp -d /tmp/plexus-text-order.XXXXXX)
cp "$daemon" "$tmp/plexusd"
# The benchmark starts target/release/plexusd: a wrapper there traces the
# real program, put back whatever happens.
trap 'rm -f "$daemon"; cp -p "$tmp/plexusd" "$daemon"; rm -rf "$tmp"' EXIT
rm -f "$daemon"
printf '#!/bin/sh\nexec python3 %q %q %q "$@"\n' \
    "$PWD/scripts/text_order/trace.py" "$tmp/ran" "$tmp/plexusd" >"$daemon"
chmod +x "$daemon"

# A backtrace setting would trace the symbolizer as well.
env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE PLEXUS_BENCH_QUICK=1 \
    PLEXUS_BENCH_OUT="$tmp/report.md" "$bench" --bench >"$tmp/bench.log" 2>&1 ||
    { tail -n 20 "$tmp/bench.log" >&2; exit 1; }
[ -s "$tmp/ran" ] || { echo "text-order: no plexusd was traced" >&2; exit 1; }
python3 scripts/text_order/script.py "$tmp/ran" >link/plexusd-text.ld
echo "link/plexusd-text.ld: $(grep -c '^    \*(' link/plexusd-text.ld) functions"
