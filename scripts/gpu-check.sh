#!/usr/bin/env bash
# The GPU check in one command (docs/gpu-check.md), on a machine with
# an NVIDIA GPU, over the bundle scripts/gpu-bundle.sh made: no build and no
# package there, only python3. Runs from the repository (the bundle in
# ./gpu-bundle, or STRATA_GPU_BUNDLE) or from inside a bundle. Arguments go
# to gpu_check.py (--report FILE); its docstring lists the parts. Run from
# the repository, it refuses a bundle made from other sources. Exit status:
# 0 all passed on a GPU, 77 no GPU (CUDA parts skipped), 1 a part failed,
# 2 the bundle cannot run here or is stale.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
from_source=()
if [ -f "$here/MANIFEST.json" ]; then
  bundle=$here
else
  bundle=${STRATA_GPU_BUNDLE:-$here/../gpu-bundle}
  from_source=(--source "$(cd "$here/.." && pwd)")  # the bundle must come from these
fi
if [ ! -f "$bundle/MANIFEST.json" ]; then
  echo "gpu-check: no bundle at $bundle: run scripts/gpu-bundle.sh first, where the" \
    "build is, and carry gpu-bundle/ to the GPU machine" >&2
  exit 2
fi
exec python3 "$bundle/gpu_check.py" --bundle "$bundle" "${from_source[@]}" "$@"
