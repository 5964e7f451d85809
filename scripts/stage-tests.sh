#!/usr/bin/env bash
# Builds the workspace's test binaries and copies them into .gpu/tests/ (or $STAGE_DIR), where
# scripts/gpu-tests.sh runs them. The arguments go to `cargo test --no-run`; the NVIDIA job of
# .github/workflows/ci.yml runs, from the repository root:
#   bash scripts/stage-tests.sh --workspace --exclude gpumem-hip --features cuda
# and, for scripts/gpu-hip-tests.sh (HIP's headers needed: HIP_PATH=/usr on Debian):
#   STAGE_DIR=.gpu/hip-tests bash scripts/stage-tests.sh -p gpumem-hip
#   STAGE_DIR=.gpu/auto-tests bash scripts/stage-tests.sh -p gpumem-auto --features cuda,hip
# The binaries keep their debug info, which LineProfileHook's tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE_DIR=${STAGE_DIR:-.gpu/tests}
rm -rf "$STAGE_DIR"
mkdir -p "$STAGE_DIR"
export STAGE_DIR
cargo test --no-run --message-format=json-render-diagnostics "$@" | python3 -c '
import json, os, shutil, sys
dest = os.environ["STAGE_DIR"]
staged = 0
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    # Test harnesses only: `cargo test` also builds the examples, which take no test arguments.
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["profile"]["test"]:
        shutil.copy2(msg["executable"], dest)
        staged += 1
if staged == 0:
    sys.exit("stage-tests: cargo built no test binary")
print(f"stage-tests: {staged} test binaries in {dest}/")
'
