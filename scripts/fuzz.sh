#!/usr/bin/env bash
# Runs gpumem's fuzz targets (fuzz/) with cargo-fuzz, one after another, each for SECONDS seconds
# (default 60), starting from its stored corpus (fuzz/corpus/TARGET). Needs the nightly toolchain
# and cargo-fuzz (`cargo install cargo-fuzz`). From anywhere in the repository:
#
#   bash scripts/fuzz.sh [SECONDS [TARGET...]]
#
# The targets are built optimised with debug assertions and overflow checks, under
# AddressSanitizer. New inputs go to target/fuzz/corpus/TARGET (the stored corpus is left as it
# is; `cargo fuzz cmin` and a copy add to it), each run's log to target/fuzz/logs/TARGET.log, and
# an input that finds something to target/fuzz/artifacts/TARGET/; the script then fails naming
# it. Replay a found input on stable Rust with `cargo run -p gpumem-fuzz --bin TARGET -- FILE`.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(pool cupy_import pytorch_import capi)
seconds=${1:-60}
if [ $# -gt 0 ]; then
    shift
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=("${ALL_TARGETS[@]}")
fi

out=target/fuzz
# The C ABI's default pool on the host backend reserves its simulated device's memory as one range
# of host memory (16 GiB by default): 1 GiB devices keep that under libFuzzer's malloc limit.
export GPUMEM_HOST_DEVICE_MEMORY="${GPUMEM_HOST_DEVICE_MEMORY:-1GiB}"
# Every target is built first, so that each run's time is fuzzing.
cargo +nightly fuzz build --fuzz-dir fuzz -O -a
for t in "${targets[@]}"; do
    mkdir -p "$out/corpus/$t" "$out/artifacts/$t" "$out/logs"
    echo "== fuzzing $t for ${seconds}s"
    # One process (-jobs=1 is libFuzzer's default); a run that takes 30 s, or 4 GiB, is a finding.
    if ! cargo +nightly fuzz run --fuzz-dir fuzz -O -a "$t" "$out/corpus/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
        -artifact_prefix="$out/artifacts/$t/" -print_final_stats=1 >"$out/logs/$t.log" 2>&1; then
        tail -n 60 "$out/logs/$t.log"
        echo "fuzz target $t found something: $(ls "$out/artifacts/$t")" >&2
        exit 1
    fi
    grep -E '^(#[0-9]+ *DONE|Done [0-9]+ runs)|stat::number_of_executed_units|stat::new_units_added' "$out/logs/$t.log" || true
done
echo "== fuzzing passed: ${targets[*]}, ${seconds}s each"
