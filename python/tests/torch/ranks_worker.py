"""One rank of test_ranks.py, started as torchrun starts it (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), with a job as JSON in argv[1]:

- {"train": {name: config overrides}, "out": DIR}: trains the tests' GPT
  (their Llama with "_model": "llama"; with "_scale": s, its wte weight
  first multiplied by s on rank 0 in a GatheredParameters context)
  data-parallel under each setting on its part of the global batches;
  "stage3" is exported live to DIR/export after training, and "stage2"
  reloads a checkpoint (reload());
  rank 0 saves each one's losses (the ranks' mean), final weights, tier
  use, collective stats and flat fp32 bytes to DIR/<name>.pt.
- {"reshard": overrides, "out": DIR} at 4 ranks: trains 3 steps and saves
  a checkpoint; ranks 0-1 (a process group of their own) load it, save
  it again and train 2 steps; rank 0 alone loads it and saves it as one
  rank's; ranks 0-1 load their own checkpoint and train the same 2 steps;
  all 4 load the one-rank checkpoint. Each load dumps (below) to
  DIR/<phase>.pt.
- {"die": overrides, "ckpt": DIR, "when": "step" | "save"}: trains a
  step and saves a checkpoint to DIR; then the last rank exits (code 3)
  in the next step's forward, or after writing its part of the next
  step's checkpoint.
- {"fails": overrides, "out": DIR}: a task fails on one rank only, and
  each rank prints "<task>: <its error>" (fails()).
- {"diverge": overrides, "out": DIR}: Gates, whose parameters b get a
  gradient on rank 0 only, trains STEPS steps on x = ones * (1 + rank);
  rank 0 saves the losses and weights to DIR/diverge.pt. Then rank 1's
  hash of its reductions' order is changed, and the next step fails on
  both ranks, which print "step: <the error>".
- {"interrupt": overrides}: rank 1 sleeps; rank 0 prints "waiting" and
  runs a forward, whose first all-gather waits for rank 1 (the test
  stops it with SIGINT).

A dump holds, per group and role, the group's parameters laid end to end
(without the padding of Note [Partitions]), the optimizer's step and the
losses of the steps trained after it: the roles and step are the same at
every world size when a checkpoint is resharded exactly."""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from conftest import config, data, forward, llama, loss_of, model

import strata.torch as st
from strata._native import StrataError
from strata.torch.weights import role_values

ROLES = ("compute", "master", "state1", "state2")


def engine_for(over: dict[str, Any], world: int,
               group: Any = None) -> st.StrataEngine:
    """The tests' GPT (or with "_model": "llama", their Llama) through
    strata, each rank's micro-batch its part of 8."""
    over = dict(over)
    make = llama if over.pop("_model", "gpt") == "llama" else model
    cfg = config(**over)
    cfg["train_micro_batch_size_per_gpu"] = 8 // world
    return st.initialize(make(), cfg, process_group=group)


def train(engine: st.StrataEngine, steps: int, first: int = 0
          ) -> list[float]:
    """Steps on each rank's part of the batches; the ranks' mean losses."""
    rank, world = engine.global_rank, engine.world_size
    mine = slice(rank * 8 // world, (rank + 1) * 8 // world)
    losses = []
    for x, y in data(first + steps)[first:]:
        loss = loss_of(forward(engine, x[mine], y[mine]))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        if world > 1:
            dist.all_reduce(mean, op=dist.ReduceOp.AVG,
                            group=engine.rt.ranks.group)
        losses.append(mean.item())
    return losses


def dump(engine: st.StrataEngine) -> dict[str, Any]:
    """Every group's roles, its parameters end to end (a collective)."""
    out: dict[str, Any] = {"step": engine.rt.optimizer.step}
    for group in engine.rt.groups:
        for role in (r for r in ROLES if r in group.roles):
            dtype = group.placeholders[0].dtype if role == "compute" \
                else torch.float32
            values = role_values(engine.rt, group, role,
                                 [dtype] * len(group.plan.params))
            out[f"{group.name}/{role}"] = torch.cat(
                [v.reshape(-1) for v in values])
    return out


def phase(over: dict[str, Any], out: Path, name: str, world: int,
          group: Any, load: Optional[str], save: Optional[str] = None,
          then: int = 0) -> None:
    """A fresh engine over `world` ranks: loads `load` (or trains 3
    steps), dumps to out/<name>.pt, saves to `save`, trains `then`."""
    engine = engine_for(over, world, group)
    if load is None:
        train(engine, 3)
    else:
        assert engine.load_checkpoint(load)[0] is not None
    values = dump(engine)
    if save is not None:
        engine.save_checkpoint(save)
    values["losses"] = train(engine, then, engine.global_steps)
    engine.close()
    if engine.global_rank == 0:
        torch.save(values, out / f"{name}.pt")


def reshard(over: dict[str, Any], out: Path) -> None:
    """The "reshard" job (module docstring), at 4 ranks."""
    rank = dist.get_rank()
    pair, alone = dist.new_group([0, 1]), dist.new_group([0])
    ckpt = {n: str(out / f"ckpt{n}") for n in (4, 2, 1)}
    phase(over, out, "saved", 4, None, None, ckpt[4])
    if rank < 2:
        phase(over, out, "at2", 2, pair, ckpt[4], ckpt[2], then=2)
    if rank == 0:
        phase(over, out, "at1", 1, alone, ckpt[4], ckpt[1])
    if rank < 2:
        phase(over, out, "resumed", 2, pair, ckpt[2], then=2)
    dist.barrier()
    phase(over, out, "1to4", 4, None, ckpt[1])


def die(over: dict[str, Any], ckpt: str, when: str) -> None:
    """The "die" job (module docstring)."""
    engine = engine_for(over, dist.get_world_size())
    last = engine.global_rank == engine.world_size - 1
    train(engine, 1)
    engine.save_checkpoint(ckpt)
    if when == "save":
        train(engine, 1, 1)
        if last:  # its part written, not the checkpoint's ranks.json
            save = engine.rt.optimizer.save
            engine.rt.optimizer.save = lambda *a: (save(*a), os._exit(3))
        engine.save_checkpoint(ckpt)
        raise AssertionError("the save went on without the last rank")
    x, y = data(2)[1]
    loss = loss_of(forward(engine, x[:1], y[:1]))
    if last:
        os._exit(3)
    try:
        engine.backward(loss)  # its reductions wait for the dead rank
    except StrataError:
        try:  # the ranks are out of step: no collective runs any more
            forward(engine, x[:1], y[:1])
        except StrataError as again:
            print(f"afterwards: {again}", flush=True)
        raise
    raise AssertionError("the step went on without the last rank")


def reload(engine: st.StrataEngine, ckpt: str) -> list[float]:
    """Saves, trains a step, runs an eval forward (stage 2 keeps its
    gathered copy), loads the checkpoint and trains the same step again:
    the two losses, equal when the load dropped the kept copy."""
    at = engine.global_steps
    engine.save_checkpoint(ckpt)
    first = train(engine, 1, at)
    x, y = data(at + 2)[at + 1]
    with torch.no_grad():
        forward(engine, x[:1], y[:1])
    engine.load_checkpoint(ckpt)
    return first + train(engine, 1, at)


def fails(over: dict[str, Any], out: Path) -> None:
    """The "fails" job: rank 1's GatheredParameters body raises (nothing
    is written); rank 1 writes wte as float64 and flat (written in its
    dtype and shape), then one of the wrong size; rank 0 cannot write the
    export, nor save_16bit_model's file; rank 1 cannot pickle its
    client_state; rank 1's forward fails, and its save afterwards."""
    rank = dist.get_rank()
    engine = engine_for(dict(over, strata={"rank_timeout": 100},
                             zero_optimization={
                                 "stage3_gather_16bit_weights_on_model_save":
                                 True}), 2)
    weight = engine.module.wte.weight
    before = gathered(weight)

    def modify(change: Callable[[], None], at: int = 1) -> str:
        try:
            with st.GatheredParameters([weight], modifier_rank=1):
                if rank == at:
                    change()
        except (StrataError, ValueError) as e:
            return str(e)
        return "no error"

    def fail() -> None:
        raise ValueError("the body failed")
    print(f"body: {modify(fail)}", flush=True)
    assert torch.equal(gathered(weight), before)
    assert modify(lambda: setattr(weight, "data", weight.data.double()
                                  .mul(3).flatten())) == "no error"
    assert torch.equal(gathered(weight), before * 3)
    print(f"shape: {modify(lambda: setattr(weight, 'data', weight[:2]))}",
          flush=True)
    (out / "file").write_text("")
    try:
        engine.export(str(out / "file" / "export"))
    except (StrataError, OSError) as e:
        print(f"export: {e}", flush=True)
    try:
        engine.save_16bit_model(str(out / "file"))
    except (StrataError, OSError) as e:
        print(f"save16: {e}", flush=True)
    try:  # a lambda does not pickle
        engine.save_checkpoint(str(out / "ckpt"), client_state=(
            lambda: 0) if rank == 1 else None)
    except (StrataError, pickle.PicklingError, AttributeError) as e:
        print(f"ckpt: {e}", flush=True)
    x, y = data(1)[0]
    try:
        forward(engine, x[:1].clamp(max=0) - 9 * rank, y[:1])
    except (StrataError, IndexError) as e:
        print(f"forward: {e}", flush=True)
    if rank == 1:
        try:
            engine.save_checkpoint(str(out / "ckpt"))
        except StrataError as e:
            print(f"save: {e}", flush=True)
        os._exit(0)  # the ranks are out of step: no collective ends


def gathered(weight: torch.Tensor) -> torch.Tensor:
    with st.GatheredParameters([weight]):
        return weight.data.clone()


class Gate(torch.nn.Module):
    """A layer whose bias b joins in on rank 0 only (a branch some ranks
    take)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Parameter(torch.full((16,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b if rank_now() == 0 else self.a(x)


def rank_now() -> int:
    """This process's rank; the tests' reference sets it by hand."""
    return dist.get_rank() if dist.is_initialized() else Gates.rank


class Gates(torch.nn.Module):
    """Three Gates of one size, a group each."""
    rank = 0

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(Gate() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.square().mean()


def diverge(over: dict[str, Any], out: Path) -> None:
    """The "diverge" job (module docstring)."""
    engine = st.initialize(Gates(), config(**over))
    x = torch.ones(2, 16) * (1 + dist.get_rank())
    losses = []
    for _ in range(int(os.environ["STEPS"])):
        loss = engine(x)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    state = {k: v.clone() for k, v in engine.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save({"losses": losses, "state": state}, out / "diverge.pt")
    engine.backward(engine(x))
    engine.rt.handoffs.order += dist.get_rank()
    try:
        engine.step()
    except StrataError as e:
        print(f"step: {e}", flush=True)


def interrupt(over: dict[str, Any]) -> None:
    """The "interrupt" job (module docstring)."""
    engine = engine_for(over, dist.get_world_size())
    if engine.global_rank == 1:
        time.sleep(600)
    x, y = data(1)[0]
    print("waiting", flush=True)
    forward(engine, x[:1], y[:1])
    raise AssertionError("the gather went on without rank 1")


def main() -> None:
    job = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    for name, over in job.get("train", {}).items():
        over = dict(over)
        scale = over.pop("_scale", None)
        engine = engine_for(over, dist.get_world_size())
        if scale is not None:  # rank 0 scales wte, every rank gets it
            weight = engine.module.wte.weight
            with st.GatheredParameters([weight], modifier_rank=0):
                if dist.get_rank() == 0:
                    weight.data.mul_(scale)
        losses = train(engine, int(os.environ.get("STEPS", "6")))
        moved = dataclasses.asdict(engine.collective_stats())
        if name == "stage3":
            engine.export(str(Path(job["out"]) / "export"))
        flat = sum(g.flat.shard * g.flat.ranks.world * 4
                   for g in engine.rt.groups if g.flat is not None)
        state = {k: v.cpu() for k, v in engine.state_dict().items()}
        tiers = engine.store.stats()["tiers"]
        if name == "stage2":
            moved["reload"] = reload(engine, str(Path(job["out"]) / "ckpt"))
        engine.close()
        if dist.get_rank() == 0:
            torch.save({"losses": losses, "state": state, "tiers": tiers,
                        "collectives": moved, "flat_bytes": flat},
                       Path(job["out"]) / f"{name}.pt")
    if "reshard" in job:
        reshard(job["reshard"], Path(job["out"]))
    if "die" in job:
        die(job["die"], job["ckpt"], job["when"])
    if "fails" in job:
        fails(job["fails"], Path(job["out"]))
        return
    if "diverge" in job:
        diverge(job["diverge"], Path(job["out"]))
        return
    if "interrupt" in job:
        interrupt(job["interrupt"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
