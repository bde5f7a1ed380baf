#!/usr/bin/env bash
# The main job: installs what is missing (Debian packages, and once per
# machine the torch 2.x environment), builds, runs strata-nvme-bench against
# fio on a swap directory (default ./swap; STRATA_SWAP_DIR picks an NVMe
# mount), then trains a GPT on a Debian text through strata.torch with its
# optimizer state on that swap directory (the GPU when there is one, else
# the host-emulated device), printing the loss every step and writing the
# loss curve to loss.png. Extra arguments go to examples/train_gpt.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
strata_install_deps
strata_torch_venv
strata_build default
swap="${STRATA_SWAP_DIR:-$PWD/swap}"
mkdir -p "$swap"
build/bin/strata-nvme-bench --path "$swap" --rw write,read,randread \
  --bs 128K,1M --qd 32 --size 1G --vs-fio
PYTHONPATH="$PWD/python:$PWD/examples" STRATA_LIBRARY="$PWD/build/lib/libstrata.so" \
  exec "$STRATA_TORCH_VENV/bin/python" examples/train_gpt.py --swap "$swap" \
  --png loss.png "$@"
