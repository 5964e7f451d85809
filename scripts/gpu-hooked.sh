#!/bin/bash
# On the GPU machine, from the repository root: the pool's cache hit with and without
# DebugPrintHook on a buffered writer (benches/paths.rs, which interleaves its paths round by
# round), run in several processes, since the machine's clock changes speed from one process to
# the next. Prints each process's hooked and unhooked hit and their ratio; logs go to $OUT.
#
# Stage the bench binaries first, on a machine with Rust, and send .gpu/ along:
#   scripts/gpu-stage --bench --no-tests
# Other builds of the same bench (a baseline, say) can be named as arguments: each process round
# runs every binary once, alternated, so that they share the machine's state.
#   bash scripts/gpu-hooked.sh                              the staged paths bench
#   bash scripts/gpu-hooked.sh .gpu/base/paths .gpu/benches/paths-*   a baseline and this build
set -u
OUT=${OUT:-/tmp/gpumem-hooked}
ROUNDS=${ROUNDS:-6}
mkdir -p "$OUT"
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
    for f in .gpu/benches/paths-*; do
        [ -x "$f" ] && BINS+=("$f")
    done
fi
if [ ${#BINS[@]} -eq 0 ]; then
    echo "no paths bench binary: stage it (see the top of this script)" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
rc=0
: >"$OUT/summary.txt"
for r in $(seq 1 "$ROUNDS"); do
    for i in "${!BINS[@]}"; do
        b=${BINS[$i]}
        log="$OUT/bin$i-round$r.log"
        if ! "$b" >"$log" 2>&1; then
            echo "$b failed; see $log"
            rc=1
            continue
        fi
        # The table's lines are "<ns> ns  <what>"; the two rows compared are the pool's own hit and
        # the same hit with the hook installed.
        awk -v bin="$b" -v round="$r" '
            /ns  pool cache hit \(malloc_pooled/ { pooled = $1 }
            /ns  pool cache hit, DebugPrintHook/ { hooked = $1 }
            END {
                if (pooled > 0 && hooked > 0)
                    printf "%s round %d: unhooked %.1f ns, hooked %.1f ns, ratio %.2f\n", bin, round, pooled, hooked, hooked / pooled
                else
                    printf "%s round %d: rows not found\n", bin, round
            }' "$log" | tee -a "$OUT/summary.txt"
    done
done
exit $rc
