#!/usr/bin/env bash
# Builds the workspace's test binaries and copies them into .gpu/tests/, where
# scripts/gpu-tests.sh runs them. The arguments go to `cargo test --no-run`; the NVIDIA job of
# .github/workflows/ci.yml runs, from the repository root:
#   bash scripts/stage-tests.sh --workspace --exclude gpumem-hip --features cuda
# The binaries keep their debug info, which LineProfileHook's tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/tests
mkdir -p .gpu/tests
cargo test --no-run --message-format=json-render-diagnostics "$@" | python3 -c '
import json, shutil, sys
staged = 0
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    # Test harnesses only: `cargo test` also builds the examples, which take no test arguments.
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["profile"]["test"]:
        shutil.copy2(msg["executable"], ".gpu/tests/")
        staged += 1
if staged == 0:
    sys.exit("stage-tests: cargo built no test binary")
print(f"stage-tests: {staged} test binaries in .gpu/tests/")
'
