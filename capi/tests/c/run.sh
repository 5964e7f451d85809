#!/usr/bin/env bash
# Builds gpumem-capi for the host backend, compiles the C test against gpumem.h with warnings as
# errors (as C and as C++), links it against the staticlib and, separately, the cdylib, and runs
# both. From the repository root: bash capi/tests/c/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build -p gpumem-capi
LIB=target/debug
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
CFLAGS=(-std=c11 -Wall -Wextra -Wpedantic -Werror -I capi/include)
cc "${CFLAGS[@]}" capi/tests/c/abi_test.c "$LIB/libgpumem_capi.a" -lpthread -ldl -lm -o "$BUILD/abi_test_static"
cc "${CFLAGS[@]}" capi/tests/c/abi_test.c -L "$LIB" -lgpumem_capi -Wl,-rpath,"$PWD/$LIB" -o "$BUILD/abi_test_shared"
# The header also compiles as C++.
if command -v c++ >/dev/null; then
    echo '#include "gpumem.h"' | c++ -std=c++17 -Wall -Wextra -Werror -I capi/include -x c++ -fsyntax-only -
fi
(cd "$BUILD" && ./abi_test_static && ./abi_test_shared)
