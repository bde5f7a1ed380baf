"""One rank of test_ranks.py, started as torchrun starts it (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), with a job as JSON in argv[1]:

- {"train": {name: config overrides}, "out": DIR}: trains the tests' GPT
  data-parallel under each setting on its part of the global batches;
  rank 0 saves each one's losses (the ranks' mean) and final weights to
  DIR/<name>.pt.
- {"save": overrides, "steps": K, "ckpt": DIR, "dump": FILE}: trains K
  steps, saves a checkpoint to DIR and dumps every role (below) to FILE.
- {"load": overrides, "ckpt": DIR, "dump": FILE, "save_to": DIR2,
  "then": K}: loads DIR at this world size, dumps every role, saves it
  again to DIR2 (optional), then trains K more steps (optional), whose
  losses go into the dump.
- {"die": overrides, "ckpt": DIR}: trains a step, saves a checkpoint to
  DIR, and in the next step's forward the last rank exits (code 3).

A dump holds, per group and role, the group's parameters laid end to end
(without the padding of Note [Partitions]) and the optimizer's step: the
same for every world size when a checkpoint is resharded exactly."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conftest import config, data, forward, loss_of, model

import strata.torch as st
from strata.torch.ranks import SHARD

ROLES = ("compute", "master", "state1", "state2")


def engine_for(over: dict[str, Any], world: int) -> st.StrataEngine:
    cfg = config(**over)
    cfg["train_micro_batch_size_per_gpu"] = 8 // world
    return st.initialize(model(), cfg)


def train(engine: st.StrataEngine, steps: int, first: int = 0
          ) -> list[float]:
    ranked = dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if ranked \
        else (0, 1)
    mine = slice(rank * 8 // world, (rank + 1) * 8 // world)
    losses = []
    for x, y in data(first + steps)[first:]:
        loss = loss_of(forward(engine, x[mine], y[mine]))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        if ranked:
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    return losses


def dump(engine: st.StrataEngine) -> dict[str, Any]:
    """Every group's roles, its parameters end to end (a collective)."""
    out: dict[str, Any] = {"step": engine.rt.optimizer.step}
    for group in engine.rt.groups:
        for role in (r for r in ROLES if r in group.roles):
            with engine.store.fetch(group.id, "host", roles=role) as view:
                if group.flat is None:
                    values = [torch.from_dlpack(view.export(name, role))
                              for name, _ in group.plan.params]
                else:
                    values = group.flat.collect(
                        lambda mine: mine.copy_(torch.from_dlpack(
                            view.export(SHARD, role))),
                        group.placeholders[0].dtype if role == "compute"
                        else torch.float32, torch.device("cpu"))
                out[f"{group.name}/{role}"] = torch.cat(
                    [v.reshape(-1) for v in values]).clone()
    return out


def main() -> None:
    job = json.loads(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for name, over in job.get("train", {}).items():
        engine = engine_for(over, world)
        losses = train(engine, int(os.environ.get("STEPS", "6")))
        state = {k: v.cpu() for k, v in engine.state_dict().items()}
        engine.close()
        if rank == 0:
            torch.save({"losses": losses, "state": state},
                       Path(job["out"]) / f"{name}.pt")
    if "save" in job:
        engine = engine_for(job["save"], world)
        train(engine, job["steps"])
        engine.save_checkpoint(job["ckpt"])
    if "die" in job:
        engine = engine_for(job["die"], world)
        train(engine, 1)
        engine.save_checkpoint(job["ckpt"])
        x, y = data(2)[1]
        loss = loss_of(forward(engine, x[:1], y[:1]))
        if rank == world - 1:
            os._exit(3)
        engine.backward(loss)  # its reduce-scatters wait for the dead rank
        engine.step()
        raise AssertionError("the step went on without the last rank")
    if "load" in job:
        engine = engine_for(job["load"], world)
        assert engine.load_checkpoint(job["ckpt"])[0] is not None
    if "dump" in job:
        values = dump(engine)
        if "save_to" in job:
            engine.save_checkpoint(job["save_to"])
        first = engine.global_steps
        values["losses"] = train(engine, job.get("then", 0), first)
        engine.close()
        if rank == 0:
            torch.save(values, job["dump"])
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
