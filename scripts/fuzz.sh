#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/fuzz_targets/) one at a time, each for a
# bounded time, and reports what each did. Long-running: not part of
# scripts/test.sh. Needs the nightly toolchain; installs cargo-fuzz if it
# is missing.
#
#   scripts/fuzz.sh                      every target, FUZZ_SECONDS each
#   scripts/fuzz.sh cni_result shim_response
#   FUZZ_SECONDS=600 scripts/fuzz.sh     longer runs
#
# Environment:
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_WORKDIR   corpora and logs (default fuzz/corpus, git-ignored); the
#                  corpus grows across runs, delete it to start afresh
#   FUZZ_TIMEOUT   seconds one input may take before it counts as a hang
#                  (default 10)
#   FUZZ_RSS_MB    memory limit, which also bounds a single allocation
#                  (default 1024)
#
# Each target's corpus is seeded from fuzz/seeds/<target>/ and from the
# repository (the multus wire captures in tests/fixtures, the example and
# packaged daemon configs, the example network config). Crashing inputs
# land in fuzz/artifacts/<target>/; the script prints their paths and how
# to replay them, and exits 1 if any target crashed, 2 on a setup failure.

set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
TOOLCHAIN=nightly

root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_dir=$root/fuzz
seconds=${FUZZ_SECONDS:-60}
workdir=${FUZZ_WORKDIR:-$fuzz_dir/corpus}
timeout=${FUZZ_TIMEOUT:-10}
rss_mb=${FUZZ_RSS_MB:-1024}
all_targets=(cni_request cni_result daemon_config shim_response shim_config)
fixtures=$root/tests/fixtures/multus-wire

die() {
    echo "fuzz.sh: $*" >&2
    exit 2
}

[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "FUZZ_SECONDS must be a positive number of seconds, got '$seconds'"
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
    [[ -f $fuzz_dir/fuzz_targets/$t.rs ]] || die "no such target: $t (targets: ${all_targets[*]})"
done

rustup run "$TOOLCHAIN" rustc --version >/dev/null 2>&1 ||
    die "the $TOOLCHAIN toolchain is missing: rustup toolchain install $TOOLCHAIN"
if [[ $(cargo fuzz --version 2>/dev/null || true) != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
    echo "fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi

# The body of a raw HTTP message: everything after the first blank line.
http_body() {
    awk 'BEGIN { RS = "\r\n\r\n"; ORS = "" } NR == 1 { next } { if (NR > 2) print "\r\n\r\n"; print }' "$1"
}

# Fills $1 (a corpus directory) with the seeds of target $2.
seed() {
    local dir=$1 target=$2 f
    mkdir -p "$dir"
    if [[ -d $fuzz_dir/seeds/$target ]]; then
        cp "$fuzz_dir/seeds/$target"/* "$dir"/
    fi
    case $target in
    cni_request)
        for f in "$fixtures"/*-cni-request.txt; do
            if [[ -f $f ]]; then http_body "$f" >"$dir/repo-$(basename "$f" .txt)"; fi
        done
        ;;
    cni_result)
        for f in "$fixtures"/*-cni-response.txt; do
            if [[ -f $f ]]; then http_body "$f" >"$dir/repo-$(basename "$f" .txt)"; fi
        done
        for f in "$fixtures"/shim-*-stdout.txt; do
            if [[ -s $f ]]; then cp "$f" "$dir/repo-$(basename "$f" .txt)"; fi
        done
        ;;
    daemon_config)
        cp "$root/examples/daemon-config.json" "$dir/repo-example"
        for f in "$root"/packaging/*/daemon-config.json; do
            cp "$f" "$dir/repo-$(basename "$(dirname "$f")")"
        done
        ;;
    shim_config)
        if [[ -f $fixtures/shim-stdin-config.json ]]; then cp "$fixtures/shim-stdin-config.json" "$dir/repo-multus"; fi
        cp "$root/examples/cni/00-plexus.conflist" "$dir/repo-example-conflist"
        ;;
    shim_response)
        # The target's first byte picks the mode: 0 is a raw answer.
        for f in "$fixtures"/*-response.txt; do
            if [[ -f $f ]]; then { printf '\0'; cat "$f"; } >"$dir/repo-$(basename "$f" .txt)"; fi
        done
        ;;
    esac
}

max_len() {
    case $1 in
    shim_response) echo 16384 ;;
    *) echo 8192 ;;
    esac
}

cd "$fuzz_dir"
mkdir -p "$workdir/logs"
echo "fuzz.sh: building the targets" >&2
cargo "+$TOOLCHAIN" fuzz build >/dev/null 2>"$workdir/logs/build.log" ||
    { tail -40 "$workdir/logs/build.log" >&2; die "the build failed"; }

failed=()
summary=()
for t in "${targets[@]}"; do
    corpus=$workdir/$t
    seed "$corpus" "$t"
    artifacts=$fuzz_dir/artifacts/$t
    mkdir -p "$artifacts"
    log=$workdir/logs/$t.log
    echo "fuzz.sh: $t for ${seconds}s (log: $log)" >&2
    status=0
    cargo "+$TOOLCHAIN" fuzz run "$t" "$corpus" -- \
        -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb="$rss_mb" \
        -max_len="$(max_len "$t")" -dict="$fuzz_dir/dicts/$t.dict" \
        -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    size=$(find "$corpus" -type f | wc -l)
    if [[ $status -eq 0 ]]; then
        summary+=("$t: ok, ${seconds}s, ${execs:-?} executions, corpus $size files")
    else
        crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        summary+=("$t: FAILED (exit $status), ${execs:-?} executions, input: ${crash:-see $log}")
        failed+=("$t")
        grep -m1 -A12 -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" >&2 || tail -20 "$log" >&2
        if [[ -n $crash ]]; then
            echo "fuzz.sh: replay: (cd fuzz && cargo +$TOOLCHAIN fuzz run $t $crash)" >&2
        fi
    fi
done

printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz.sh: crashed: ${failed[*]}" >&2
    exit 1
fi
