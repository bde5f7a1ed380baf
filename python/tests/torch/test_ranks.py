"""ZeRO across ranks (Note [Partitions] in strata/torch/ranks.py): two
processes on gloo, started as torchrun starts them, train like one rank
with their batches together, and alike in every placement and stage."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import DEVICE, data, model, train_torch

WORKER = Path(__file__).with_name("ranks_worker.py")
STEPS = 6

pytestmark = pytest.mark.skipif(DEVICE != "host", reason=(
    "the ranks' tests run on gloo and the host-emulated device"))


def launch(out: Path, settings: dict[str, Any], world: int = 2,
           timeout: float = 240) -> dict[str, dict[str, Any]]:
    """Runs ranks_worker.py as `world` ranks; each setting's results."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), STEPS=str(STEPS),
               PYTHONPATH=os.pathsep.join(
                   [str(WORKER.parent), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen(
        [sys.executable, str(WORKER), str(out), json.dumps(settings)],
        env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r}:\n{log}"
    return {name: torch.load(out / f"{name}.pt") for name in settings}


def test_two_ranks_train_like_one_with_both_batches(scratch: Path) -> None:
    swap = scratch / "swap"
    swap.mkdir()
    nvme = {"zero_optimization": {"offload_optimizer": {
        "device": "nvme", "nvme_path": str(swap)}}}
    clip = {"gradient_clipping": 0.5}
    runs = launch(scratch, {
        "stage3": clip,
        "stage3_nvme": dict(clip, **nvme),
        "stage2": dict(clip, zero_optimization={"stage": 2}),
        "stage1": dict(clip, zero_optimization={"stage": 1}),
    })
    ref = train_torch(model(), data(STEPS), clip=0.5)
    base = runs["stage3"]
    assert base["losses"][-1] < base["losses"][0]
    # The sum over the batch is split in two and the halves averaged: the
    # same sum in another order, so the last bits differ (and grow).
    for a, b in zip(base["losses"], ref.losses):
        assert a == pytest.approx(b, rel=1e-5)
    for key, value in ref.state.items():
        assert torch.allclose(base["state"][key], value, rtol=0,
                              atol=1e-4), key
    # The same ranks and batches: every placement bit-identical, every
    # stage too (they differ only in what is kept where).
    for name, run in runs.items():
        assert run["losses"] == base["losses"], name
        for key, value in base["state"].items():
            assert torch.equal(run["state"][key], value), (name, key)
    assert sorted(p.name for p in (scratch / "swap").iterdir()) == [
        "rank-0", "rank-1"]
