#!/usr/bin/env bash
# The main job: installs what is missing, builds, runs strata-nvme-bench
# against fio on a swap directory (default ./swap; STRATA_SWAP_DIR picks an
# NVMe mount), then trains a synthetic 256M-parameter model for 4 steps with
# its optimizer state streamed from there (strata-sim; the GPU when there is
# one, else the host-emulated device). Extra arguments go to
# strata-nvme-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
strata_install_deps
strata_build default
swap="${STRATA_SWAP_DIR:-$PWD/swap}"
mkdir -p "$swap"
build/bin/strata-nvme-bench --path "$swap" --rw write,read,randread \
  --bs 128K,1M --qd 32 --size 1G --vs-fio "$@"
exec build/bin/strata-sim --params 256M --layers 16 --device auto \
  --device-budget 128M --host-budget 1G --nvme "$swap" --steps 4 --tflops 1
