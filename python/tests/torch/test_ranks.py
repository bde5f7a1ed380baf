"""ZeRO across ranks (Note [Partitions] in strata/torch/ranks.py): two
processes on gloo, started as torchrun starts them, train like one rank
with their batches together, and alike in every placement and stage."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch
from safetensors.torch import load_file

from strata.torch.export import export_checkpoint
from strata.torch import ranks as ranks_module
from strata.torch.ranks import Ranks, cuda_index

import strata
import strata.torch as st
from conftest import DEVICE, config, data, llama, model, train_torch
from ranks_worker import Gates

WORKER = Path(__file__).with_name("ranks_worker.py")
STEPS = 4

pytestmark = pytest.mark.skipif(DEVICE != "host", reason=(
    "the ranks' tests run on gloo and the host-emulated device"))


def start(job: dict[str, Any], world: int) -> list[subprocess.Popen]:
    """Starts ranks_worker.py's `job` as `world` ranks, as torchrun
    would."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), STEPS=str(STEPS),
               PYTHONPATH=os.pathsep.join(
                   [str(WORKER.parent), os.environ.get("PYTHONPATH", "")]))
    return [subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(job)],
        env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)]


def launch(job: dict[str, Any], world: int = 2, timeout: float = 240,
           exits: Optional[list[int]] = None) -> list[str]:
    """Runs ranks_worker.py's `job` as `world` ranks and checks their
    exit codes (`exits`, default all 0); their logs."""
    procs = start(job, world)
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    want = exits or [0] * world
    failed = [r for r, p in enumerate(procs) if p.returncode != want[r]]
    assert not failed, "\n".join(f"rank {r} of {world} (exit "
                                  f"{procs[r].returncode}):\n{logs[r]}"
                                  for r in failed)
    return logs


def trained(out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Each setting's losses and final weights, trained by two ranks."""
    launch({"train": settings, "out": str(out)})
    return {name: torch.load(out / f"{name}.pt") for name in settings}


def test_two_ranks_train_like_one_with_both_batches(scratch: Path) -> None:
    swap = scratch / "swap"
    swap.mkdir()
    nvme = {"zero_optimization": {"offload_optimizer": {
        "device": "nvme", "nvme_path": str(swap)}}}
    clip = {"gradient_clipping": 0.5}
    runs = trained(scratch, {
        "stage3": clip,
        "stage3_nvme": dict(clip, **nvme),
        # Stage 1 differs from 2 in its all-reduce, which gloo makes for
        # both (Note [Waiting for the other ranks]). One gradient buffer
        # is enough across ranks, even with tied weights (Note [When
        # gradients get a buffer] in handoff.py).
        "stage2": dict(clip, zero_optimization={"stage": 2},
                       strata={"grad_buffers": 1}),
        "written": dict(clip, _scale=0.5),
        "llama": dict(clip, _model="llama"),
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
    ref = train_torch(llama(), data(STEPS), clip=0.5)
    for a, b in zip(runs.pop("llama")["losses"], ref.losses):
        assert a == pytest.approx(b, rel=1e-5)
    # A parameter written by rank 0 inside GatheredParameters reaches
    # every rank's shard: the ranks train like torch from the new value.
    scaled = model()
    with torch.no_grad():
        scaled.wte.weight.mul_(0.5)
    ref = train_torch(scaled, data(STEPS), clip=0.5)
    for a, b in zip(runs.pop("written")["losses"], ref.losses):
        assert a == pytest.approx(b, rel=1e-5)
    # The live export across ranks (rank 0 writes) holds the weights.
    exported = load_file(scratch / "export" / "model.safetensors")
    assert exported
    for key, value in exported.items():
        assert torch.equal(value, base["state"][key]), key
    # The same ranks and batches: every placement bit-identical, every
    # stage too (they differ only in what is kept where).
    for name, run in runs.items():
        assert run["losses"] == base["losses"], name
        for key, value in base["state"].items():
            assert torch.equal(run["state"][key], value), (name, key)
    assert sorted(p.name for p in (scratch / "swap").iterdir()) == [
        "rank-0", "rank-1"]
    # Each rank holds half of every group: its swap space, about half of
    # one rank's for the whole model.
    one = st.initialize(model(), config(**dict(clip, **nvme)))
    whole = one.store.stats()["tiers"]["nvme"]["used"]
    one.close()
    half = runs["stage3_nvme"]["tiers"]["nvme"]["used"]
    assert 0.4 * whole < half < 0.6 * whole, (half, whole)
    # Per step and group of F flat bytes, on gloo at 2 ranks: stage 2
    # gathers the stepped shards once (F/2 across the link) and
    # all-reduces the gradients (F); stage 3 gathers for forward and
    # backward, and the tied embedding once more for the head.
    flat = STEPS * runs["stage3"]["flat_bytes"]
    for name, low, high in (("stage2", 1.5, 1.5), ("stage3", 2.0, 2.5)):
        moved = runs[name]["collectives"]
        assert low * flat <= moved["bytes"] <= high * flat, (name, moved)
        assert moved["count"] > 0 and moved["seconds"] > 0, moved
    # A load drops the gathered copy stage 2 kept from a forward after
    # the step (ranks_worker.reload): the step after it trains again
    # from the loaded weights.
    first, again = runs["stage2"]["collectives"].pop("reload")
    assert first == again
    # Note [Gathering ahead]: from the second step on stage 3 starts its
    # gathers a unit ahead, and each one is taken (none is repeated: the
    # bytes above).
    assert runs["stage3"]["collectives"]["ahead"] > 0


@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_a_checkpoint_loads_at_any_world_size(scratch: Path, state: str
                                              ) -> None:
    """Saved at 4 ranks, loaded at 2 and at 1; saved at 1, loaded at 4:
    every role and the step as saved, bit for bit, with the optimizer
    state in fp32 or bf16; and a resume at the same world size goes on
    exactly (ranks_worker.py's reshard job)."""
    swap = scratch / "swap"
    swap.mkdir()
    over = {"bf16": {"enabled": True}, "gradient_clipping": 0.5,
            "strata": {"state_dtype": state},
            "zero_optimization": {"offload_optimizer": {
                "device": "nvme", "nvme_path": str(swap)}}}
    launch({"reshard": over, "out": str(scratch)}, world=4)
    saved = torch.load(scratch / "saved.pt")
    assert saved["step"] == 3 and len(saved) > 8
    for name in ("at2", "at1", "1to4"):
        loaded = torch.load(scratch / f"{name}.pt")
        for key, value in saved.items():
            if key == "step":
                assert loaded[key] == value, name
            elif key != "losses":
                assert torch.equal(loaded[key], value), (name, key)
    resumed = torch.load(scratch / "resumed.pt")["losses"]
    assert len(resumed) == 2
    assert resumed == torch.load(scratch / "at2.pt")["losses"]
    ckpt4 = scratch / "ckpt4"
    tag = ckpt4 / (ckpt4 / "latest").read_text()
    assert sorted(p.name for p in tag.iterdir()) == [
        "rank-0", "rank-1", "rank-2", "rank-3", "ranks.json"]
    # The offline export reads the parts of several ranks as one.
    exported = {}
    for name in ("4", "1"):
        export_checkpoint(scratch / f"ckpt{name}", scratch / f"hf{name}",
                          dtype="fp32")
        exported[name] = {k: v for f in (scratch / f"hf{name}").glob(
            "*.safetensors") for k, v in load_file(f).items()}
    assert exported["4"].keys() == exported["1"].keys()
    for key, value in exported["1"].items():
        assert torch.equal(exported["4"][key], value), key


def test_a_task_that_fails_on_one_rank_fails_on_every_rank(
        scratch: Path) -> None:
    """Note [Failing together] in ranks.py: a GatheredParameters body, an
    export, a save_16bit_model or a checkpoint's save that fails on one
    rank fails on the other at once, naming it (not after
    strata.rank_timeout, 100 s here), and nothing is written; a pass that
    failed on one rank ends its collectives (ranks_worker.py's fails
    job)."""
    logs = [dict(line.split(": ", 1) for line in log.splitlines()
                 if line.split(":")[0] in ("body", "shape", "export",
                                           "save16", "ckpt", "forward",
                                           "save"))
            for log in launch({"fails": {}, "out": str(scratch)},
                              timeout=90)]
    named = "failed on rank {} of 2 (its error says why), so {}"
    assert logs[1]["body"] == "the body failed"
    assert logs[0]["body"].endswith(named.format(
        1, "nothing was written on any rank")), logs[0]
    assert "was given shape (2, 32)" in logs[1]["shape"], logs[1]
    assert logs[0]["shape"].endswith(named.format(
        1, "nothing was written on any rank")), logs[0]
    assert "Not a directory" in logs[0]["export"], logs[0]
    assert logs[1]["export"].endswith(named.format(
        0, f"{scratch}/file/export is incomplete")), logs[1]
    assert logs[1]["save16"].endswith(named.format(
        0, f"{scratch}/file/pytorch_model.bin was not written")), logs[1]
    assert "pickle" in logs[1]["ckpt"], logs[1]
    assert logs[0]["ckpt"].endswith(named.format(
        1, f"nothing was saved to {scratch}/ckpt/global_step0")), logs[0]
    assert "index out of range" in logs[1]["forward"], logs[1]
    assert "left the forward after an error, so the ranks' collectives " \
        "are out of step" in logs[1]["save"], logs[1]
    assert "another rank failed or exited" in logs[0]["forward"], logs[0]


def test_a_parameter_without_a_gradient_on_one_rank(scratch: Path) -> None:
    """Note [The order of the reductions] in handoff.py: parameters that
    get a gradient on rank 0 only (Gates' b) add zeros on rank 1, and the
    ranks train like torch on the mean of their losses; where the ranks'
    reductions still went in different orders, the step fails on both."""
    logs = launch({"diverge": {}, "out": str(scratch)}, timeout=90)
    for log in logs:
        assert "step: failed precondition: strata.torch: the ranks " \
            "reduced their groups' gradients in different orders" in log, log
    run = torch.load(scratch / "diverge.pt")
    models = [Gates(), Gates()]
    models[1].load_state_dict(models[0].state_dict())
    params = list(models[0].parameters())
    opt = torch.optim.AdamW(params, **config()["optimizer"]["params"])
    for step in range(STEPS):
        losses = []
        for rank, m in enumerate(models):
            Gates.rank = rank
            losses.append(m(torch.ones(2, 16) * (1 + rank)))
        grads = [torch.autograd.grad(loss, list(m.parameters()),
                                     allow_unused=True)
                 for loss, m in zip(losses, models)]
        for p, g0, g1 in zip(params, *grads):
            p.grad = (g0 + (g1 if g1 is not None else 0)) / 2
        opt.step()
        models[1].load_state_dict(models[0].state_dict())
        assert run["losses"][step] == pytest.approx(losses[0].item(),
                                                    rel=1e-5)
    for key, value in models[0].state_dict().items():
        assert torch.allclose(run["state"][key], value, atol=1e-5), key


@pytest.mark.parametrize("when", ["step", "save"])
def test_a_rank_that_dies_stops_the_others(scratch: Path, when: str
                                           ) -> None:
    """A rank that exits mid-step or mid-save: the survivor's collective
    fails naming the cause, within the timeout (communicate's), it closes
    cleanly, and the last complete checkpoint loads (here, at one rank);
    the save cut short is refused as incomplete."""
    over = {"strata": {"rank_timeout": 60}}
    ckpt = scratch / "ckpt"
    logs = launch({"die": over, "ckpt": str(ckpt), "when": when},
                  exits=[1, 3], timeout=120)
    assert "failed on rank 0 of 2: another rank failed or exited" in \
        logs[0], logs[0]
    if when == "step":
        assert "afterwards: " in logs[0] and "out of step" in logs[0], \
            logs[0]
    assert "Exception ignored" not in logs[0], logs[0]
    engine = st.initialize(model(), config(**over))
    assert engine.load_checkpoint(str(ckpt))[0] is not None
    assert engine.rt.optimizer.step == 1
    if when == "save":
        assert (ckpt / "latest").read_text() == "global_step1"
        with pytest.raises(strata.StrataError, match="incomplete: a save "
                           "across ranks that did not finish"):
            engine.load_checkpoint(str(ckpt), tag="global_step2")
    engine.close()


def test_ctrl_c_stops_a_rank_waiting_for_the_others(scratch: Path) -> None:
    """A rank whose all-gather waits for a rank that never comes returns
    to Python often enough that SIGINT (Ctrl-C, torchrun's stop) ends it
    (Note [Waiting for the other ranks])."""
    procs = start({"interrupt": {}}, world=2)
    try:
        assert procs[0].stdout is not None
        lines = [procs[0].stdout.readline()]
        while lines[-1] and lines[-1].strip() != "waiting":
            lines.append(procs[0].stdout.readline())
        assert lines[-1], procs[0].communicate()[0]
        time.sleep(1)  # inside the all-gather's wait
        procs[0].send_signal(signal.SIGINT)
        log = procs[0].communicate(timeout=60)[0]
        assert procs[0].returncode != 0 and "KeyboardInterrupt" in log, log
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def test_each_rank_of_a_machine_gets_its_gpu() -> None:
    """On NCCL every rank's engine and collectives use the GPU of its
    LOCAL_RANK (as the launchers number a machine's processes), or the
    one it sees; a LOCAL_RANK without a GPU is an error naming the fix."""
    assert cuda_index("1", count=2, current=0) == 1
    assert cuda_index(None, count=2, current=1) == 1
    assert cuda_index("3", count=1, current=0) == 0  # CUDA_VISIBLE_DEVICES
    with pytest.raises(st.ConfigError, match="LOCAL_RANK 2 has no GPU: "
                       "this process sees 2; start at most 2 processes"):
        cuda_index("2", count=2, current=0)
    assert Ranks(world=2, cuda=1).device() == torch.device("cuda", 1)
    assert Ranks(world=2, gloo=True, cuda=1).device() == torch.device("cpu")
    engine = st.initialize(model(), config())
    options = st._engine_options(
        engine.ds_config, [g.plan for g in engine.rt.groups], torch.float32,
        Ranks(world=2, cuda=1))
    engine.close()
    assert options["cuda_device"] == 1
    with strata.Engine(device="host", device_budget=1 << 20,
                       host_budget=1 << 20, cuda_device=1) as store:
        assert store.info()["cuda_device"] == 1


def test_the_gpu_is_looked_for_only_where_the_device_is_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host run never asks CUDA (which would initialize it, or fail on
    a machine with fewer GPUs than ranks); a CUDA run at one rank takes
    torch's current device."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def no_gpu() -> int:
        raise AssertionError("asked for a GPU")
    monkeypatch.setattr(ranks_module, "this_gpu", no_gpu)
    monkeypatch.setattr(torch.cuda, "current_device", no_gpu)
    assert ranks_module.discover(backend="gloo").cuda == 0
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert ranks_module.discover(backend="nccl").cuda == 3  # one rank


def test_a_rank_interrupted_between_issue_and_wait_gives_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after a collective is issued and before its wait leaves
    it in flight: the rank is out of step (Note [Abandoned
    collectives])."""
    ranks = Ranks(world=2)
    monkeypatch.setattr(ranks, "start", lambda *a: object())

    def interrupted(pending: Any) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(ranks, "finish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ranks.run("a broadcast", lambda: None)
    assert ranks.broken == "stopped waiting in a broadcast"
    with pytest.raises(strata.StrataError, match="rank 0 of 2 stopped "
                       "waiting in a broadcast, so the ranks' collectives "
                       "are out of step and the next cannot run"):
        Ranks.start(ranks, "the next", lambda: None)
    ranks = Ranks(world=2)  # a shard that cannot be read: never issued

    def unreadable(mine: torch.Tensor) -> None:
        raise OSError("the shard's read failed")
    with pytest.raises(OSError):
        ranks.gather(torch.zeros(128), unreadable, "a gather")
    assert ranks.broken == "failed before a gather"


def test_an_export_whose_reads_fail_midway_gives_up(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Note [Failing together]: where this rank's own collectives stopped
    midway (its reads raised), nothing can drain them, so it tells no
    one (that collective would pair with another's gather) and gives
    up."""
    from strata.torch import export as export_module

    def reads(engine: Any, dtype: str) -> Any:
        yield "a", torch.zeros(1)
        raise OSError("the read failed")
    monkeypatch.setattr(export_module, "engine_tensors", reads)
    ranks = Ranks(rank=1, world=2)
    monkeypatch.setattr(ranks, "run", lambda *a: pytest.fail("told"))
    engine = SimpleNamespace(rt=SimpleNamespace(ranks=ranks))
    with pytest.raises(OSError, match="the read failed"):
        export_module.export(engine, tmp_path, "fp32", 1 << 20)
    assert ranks.broken == "failed in the export"
