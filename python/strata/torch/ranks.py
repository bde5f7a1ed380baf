"""strata.torch across ranks: ZeRO data parallelism over torch.distributed
(NCCL on GPUs, gloo on the host-emulated device). The C++ core stays one
process; every collective is a torch one, issued here.

Note [Partitions]
At world size N > 1 a group's parameters are laid out flat, in the
group's order, each starting at a multiple of ALIGN elements, and the
flat vector is padded to N * S elements, S (the shard) a multiple of
ALIGN: the layout depends only on the group's shapes, so a checkpoint
can be cut again for another N. Rank r registers elements
[r * S, (r + 1) * S) as the group's one tensor SHARD, with every role
(compute copy, master, optimizer state), in its own strata engine with
the config's budgets (per rank) and its own swap subdirectory rank-<r>.
The padding is zeros, gets zero gradients and stays zero.

- Forward: a group's fetch all-gathers every rank's compute shard into a
  flat buffer (all_gather_into_tensor) and points the parameters at
  their ranges of it; the buffer goes when the group is released (stage
  3) or is kept until the next optimizer step changes the shards (stages
  1 and 2, whose compute copies stay whole on every rank).
- Backward: the parameters' .grad are ranges of a zeroed flat gradient
  buffer; when the group's gradients are final they are reduce-scattered,
  averaged over the ranks as DeepSpeed does, into this rank's strata
  gradient buffer (stage 1 all-reduces and keeps its shard) and handed to
  the CPU optimizer, which steps the shard.
- The step: the global norm and the overflow flag are one all-reduce of
  every rank's Optimizer.local_checks(), so every rank clips and skips
  alike (finish_step(global_checks)).
strata's memory never enters a collective: the shard is copied into its
slot of the flat buffer, which is gathered in place, and gradients are
reduce-scattered in place and then copied into strata's buffer, because
a backend may hold its tensors after the call returns (gloo's worker
thread does), which would keep strata's views pinned past a release.
Collectives are issued in module order in forward and in autograd's order
in backward, the same on every rank; a rank that fails makes the others
fail in the process group's timeout (strata.rank_timeout) naming the
collective, instead of waiting forever."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

import strata

ALIGN = 64  # elements: 256 B of fp32, each parameter and shard starts there
SHARD = "shard"


@dataclass
class Ranks:
    """This process's place among the ranks (world 1: no collectives)."""
    rank: int = 0
    world: int = 1
    stage: int = 3
    group: Any = None  # the torch process group; None: the default one

    def sharded(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def all_gather(self, shard: torch.Tensor, flat: torch.Tensor) -> None:
        """Every rank's `shard` into `flat`, in place."""
        mine = flat.view(self.world, -1)[self.rank]
        mine.copy_(shard)
        dist.all_gather_into_tensor(flat, mine, group=self.group)

    def reduce_scatter(self, flat: torch.Tensor, shard: torch.Tensor) -> None:
        """`flat`'s average over the ranks; this rank's part into `shard`."""
        mine = flat.view(self.world, -1)[self.rank]
        if self.stage == 1:
            dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.group)
        else:
            dist.reduce_scatter_tensor(mine, flat, op=dist.ReduceOp.AVG,
                                       group=self.group)
        shard.copy_(mine)

    def global_checks(self, local: strata.StepChecks) -> strata.StepChecks:
        """Every rank's checks: sum_squares added, overflow or-ed."""
        both = torch.tensor([local.sum_squares, float(local.overflow)],
                            dtype=torch.float64)
        dist.all_reduce(both, group=self.group)
        return strata.StepChecks(float(both[0]), bool(both[1] > 0))


def discover(process_group: Any = None, stage: int = 3,
             backend: str = "gloo", timeout_s: float = 300.0) -> Ranks:
    """The ranks of this run: the process group given, the default one
    already made, or one made here from the launcher's environment
    (torchrun's or deepspeed's RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT); world size 1 when there is none."""
    if process_group is None and not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return Ranks(stage=stage)
        dist.init_process_group(
            backend, timeout=datetime.timedelta(seconds=timeout_s))
    world = dist.get_world_size(process_group)
    if world <= 1:
        return Ranks(stage=stage)
    return Ranks(dist.get_rank(process_group), world, stage, process_group)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def offsets(shapes: list[torch.Size]) -> list[int]:
    """Each parameter's first element in the group's flat layout."""
    out, at = [], 0
    for shape in shapes:
        out.append(at)
        at = aligned(at + shape.numel())
    return out


def shard_size(shapes: list[torch.Size], world: int) -> int:
    """S of Note [Partitions]: every rank's part of the flat layout."""
    total = offsets(shapes + [torch.Size([0])])[-1]
    return aligned(-(-total // world))


class Flat:
    """One group's flat layout at a world size, and its buffers."""

    def __init__(self, shapes: list[torch.Size], ranks: Ranks) -> None:
        self.shapes = shapes
        self.offsets = offsets(shapes)
        self.ranks = ranks
        self.shard = shard_size(shapes, ranks.world)
        self.weights: Optional[torch.Tensor] = None  # gathered, if kept
        self.grads: Optional[torch.Tensor] = None    # being accumulated

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The parameters' ranges of a flat buffer, in their shapes."""
        return [flat[at:at + shape.numel()].view(shape)
                for at, shape in zip(self.offsets, self.shapes)]

    def pack(self, values: list[torch.Tensor]) -> torch.Tensor:
        """This rank's shard of `values` (the group's tensors, in order)."""
        flat = torch.zeros(self.shard * self.ranks.world,
                           dtype=values[0].dtype)
        for view, value in zip(self.views(flat), values):
            view.copy_(value.reshape(view.shape))
        r = self.ranks.rank
        return flat[r * self.shard:(r + 1) * self.shard]

    def gather(self, shard: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's compute shard gathered; the parameters' views."""
        if self.weights is None:
            flat = torch.empty(self.shard * self.ranks.world,
                               dtype=shard.dtype, device=shard.device)
            self.ranks.all_gather(shard, flat)
            self.weights = flat
        return self.views(self.weights)

    def collect(self, shard: torch.Tensor, device: torch.device
                ) -> list[torch.Tensor]:
        """Every rank's `shard` of one role gathered afresh (on `device`,
        where the backend can reach it); the parameters' views."""
        shard = shard.to(device)
        flat = torch.empty(self.shard * self.ranks.world, dtype=shard.dtype,
                           device=device)
        self.ranks.all_gather(shard, flat)
        return self.views(flat)

    def release(self) -> None:
        """After the group's last use: stage 3 drops the gathered copy."""
        if self.ranks.stage == 3:
            self.weights = None

    def stepped(self) -> None:
        """The optimizer changed the shards: no kept copy is current."""
        self.weights = None

    def gradients(self, like: torch.Tensor) -> list[torch.Tensor]:
        """A zeroed flat gradient buffer; the parameters' views of it."""
        self.grads = torch.zeros(self.shard * self.ranks.world,
                                 dtype=like.dtype, device=like.device)
        return self.views(self.grads)

    def reduce(self, shard: torch.Tensor) -> None:
        """The accumulated gradients, averaged over the ranks, into this
        rank's `shard` (its strata gradient buffer)."""
        assert self.grads is not None
        grads, self.grads = self.grads, None
        self.ranks.reduce_scatter(grads, shard)
