#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs strata-nvme-bench
# against fio on a swap directory (default ./swap; STRATA_SWAP_DIR picks an
# NVMe mount). Extra arguments go to strata-nvme-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
strata_install_deps
strata_build default
swap="${STRATA_SWAP_DIR:-$PWD/swap}"
mkdir -p "$swap"
exec build/bin/strata-nvme-bench --path "$swap" --rw write,read,randread \
  --bs 128K,1M --qd 32 --size 1G --vs-fio "$@"
