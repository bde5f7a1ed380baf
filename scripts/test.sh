#!/usr/bin/env bash
# The whole test suite: installs what is missing, then builds and runs every
# test under AddressSanitizer+UBSan, ThreadSanitizer, and finally the default
# RelWithDebInfo build, whose CTest summary ends the output. The Python
# package's tests (python.pytest) run in the default build under the torch
# 2.x environment strata_torch_venv makes once per machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
strata_install_deps
strata_torch_venv
for preset in asan tsan default; do
  echo "== strata: $preset build and tests"
  start=$SECONDS
  strata_build "$preset"
  built=$SECONDS
  ctest --preset "$preset" -j"$(nproc)"
  echo "== strata: $preset built in $((built - start)) s, tested in $((SECONDS - built)) s"
done
