#!/usr/bin/env bash
# Checks the HIP-on-CUDA shim without CUDA: compiles hip_on_cuda.c with gcc against cuda_stub.h
# (warnings as errors), then compares the entry points it exports with those gpumem-hip
# resolves (the `fn hip...(` declarations in backend-hip/src/result.rs). CI's lint job runs it;
# the shim itself is built and run by scripts/gpu-hip-tests.sh on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -std=c11 -Wall -Wextra -Werror -DHIP_ON_CUDA_STUB -shared -fPIC -Wl,--unresolved-symbols=ignore-all \
    -o "$dir/libamdhip64.so" scripts/hip-on-cuda/hip_on_cuda.c
nm -D --defined-only "$dir/libamdhip64.so" | awk '$2 == "T" && $3 ~ /^hip/ { print $3 }' | sort > "$dir/exported"
sed -n 's/^ *fn \(hip[A-Za-z]*\)(.*/\1/p' backend-hip/src/result.rs | sort -u > "$dir/called"
if [ "$(wc -l < "$dir/called")" -lt 40 ]; then
    echo "found only $(wc -l < "$dir/called") entry points in backend-hip/src/result.rs: the scan is broken" >&2
    exit 1
fi
missing=$(comm -23 "$dir/called" "$dir/exported")
if [ -n "$missing" ]; then
    echo "the HIP-on-CUDA shim lacks entry points gpumem-hip calls:" >&2
    echo "$missing" >&2
    exit 1
fi
echo "hip-on-cuda: compiles against the stub declarations; exports all $(wc -l < "$dir/called") entry points gpumem-hip calls"
