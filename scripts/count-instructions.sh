#!/bin/bash
# Instructions per allocate + free pair of each hot path (benches/paths.rs), counted by cachegrind:
# each path runs 10,000 and 30,000 pairs, and the difference of the totals is divided by 20,000.
# Run from the repository root on a machine with valgrind, after `cargo bench -p gpumem-benches --bench paths --no-run`
# (or pass the binary). Instruction counts do not drift with the clock, unlike timings.
set -eu
BIN=${1:-}
if [ -z "$BIN" ]; then
    for f in target/release/deps/paths-*; do
        [ -x "$f" ] && [ "${f%.d}" = "$f" ] && { [ -z "$BIN" ] || [ "$f" -nt "$BIN" ]; } && BIN=$f
    done
fi
count() {
    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$BIN" "$1" "$2" 2>&1 \
        | awk '/I *refs/ { gsub(",", "", $NF); print $NF }'
}
for p in pooled pointer arc alloc get_allocator buffer hooked dispatch; do
    a=$(count "$p" 10000)
    b=$(count "$p" 30000)
    echo "$p $(( (b - a) / 20000 ))"
done
