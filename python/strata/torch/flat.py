"""A group's flat layout across ranks and its buffers: Note [Partitions]
in ranks.py."""
from __future__ import annotations

from typing import Optional

import torch

from strata.torch.ranks import Fill, Pending, Ranks

ALIGN = 64  # elements: 256 B of fp32, each parameter and shard starts there


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

    def __init__(self, name: str, shapes: list[torch.Size], ranks: Ranks
                 ) -> None:
        self.name = name
        self.shapes = shapes
        self.offsets = offsets(shapes)
        self.ranks = ranks
        self.shard = shard_size(shapes, ranks.world)
        self.weights: Optional[torch.Tensor] = None  # gathered, if kept
        # A gather started ahead: its buffer and collective.
        self.ahead: Optional[tuple[torch.Tensor, Pending]] = None
        self.what = f"the all-gather of group {name!r}"
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

    def gather(self, fill: Fill, dtype: torch.dtype, device: torch.device
               ) -> list[torch.Tensor]:
        """Every rank's compute shard gathered (kept, stages 1 and 2;
        started ahead, Note [Gathering ahead]); the parameters' views."""
        if self.weights is None:
            self.weights = self._landed()
        if self.weights is None:
            self.weights = self._gathered(fill, dtype, device)
        return self.views(self.weights)

    def gather_ahead(self, fill: Fill, dtype: torch.dtype,
                     device: torch.device) -> None:
        """Starts the gather the next gather() needs, unless a gathered
        copy is kept or one is under way: Note [Gathering ahead]."""
        if self.weights is None and self.ahead is None:
            flat = self._empty(dtype, device)
            self.ahead = (flat, self.ranks.all_gather(flat, fill, self.what))
            self.ranks.stats.ahead += 1

    def idle(self) -> bool:
        """Neither a gathered copy nor a gather under way."""
        return self.weights is None and self.ahead is None

    def _landed(self) -> Optional[torch.Tensor]:
        """The buffer of the gather started ahead, once it is done."""
        if self.ahead is None:
            return None
        (flat, pending), self.ahead = self.ahead, None
        self.ranks.finish(pending)
        return flat

    def settle(self) -> None:
        """Ends a gather started ahead that no gather() took (the pass
        went another way, or failed): waits for it, drops its buffer."""
        self._landed()

    def forget(self) -> None:
        """After an error (its rank may be gone): drops a gather started
        ahead without waiting (Note [Abandoned collectives]; the backend
        keeps the buffer until the collective ends), and a kept copy (the
        step may have stood without end_step)."""
        if self.ahead is not None:
            self.ranks.abandon(self.ahead[1])
            self.ahead = None
        self.weights = None

    def collect(self, fill: Fill, dtype: torch.dtype, device: torch.device
                ) -> list[torch.Tensor]:
        """Every rank's shard of one role gathered afresh (on `device`,
        where the backend can reach it); the parameters' views."""
        return self.views(self._gathered(fill, dtype, device))

    def _gathered(self, fill: Fill, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
        flat = self._empty(dtype, device)
        self.ranks.gather(flat, fill, self.what)
        return flat

    def _empty(self, dtype: torch.dtype, device: torch.device
               ) -> torch.Tensor:
        return torch.empty(self.shard * self.ranks.world, dtype=dtype,
                           device=device)

    def release(self) -> None:
        """After the group's last use: stage 3 drops the gathered copy."""
        if self.ranks.stage == 3:
            self.weights = None

    def stepped(self) -> None:
        """The optimizer changed the shards: no kept copy is current, nor
        one gathered ahead before the step."""
        self.settle()
        self.weights = None

    def write(self, mine: torch.Tensor, values: dict[int, torch.Tensor]
              ) -> None:
        """Copies the part of each value (by parameter index, whole) that
        lies in this rank's shard into `mine`, the shard."""
        low = self.ranks.rank * self.shard
        for index, value in values.items():
            at = self.offsets[index]
            begin = max(at, low)
            end = min(at + self.shapes[index].numel(), low + self.shard)
            if begin < end:
                mine[begin - low:end - low].copy_(
                    value.reshape(-1)[begin - at:end - at])

    def gradients(self, like: torch.Tensor) -> list[torch.Tensor]:
        """A zeroed flat gradient buffer; the parameters' views of it."""
        self.grads = torch.zeros(self.shard * self.ranks.world,
                                 dtype=like.dtype, device=like.device)
        return self.views(self.grads)

    def reduce(self) -> tuple[torch.Tensor, Pending]:
        """Starts averaging the accumulated gradients over the ranks: this
        rank's part, for its strata gradient buffer, once the collective
        is done (Note [Reducing behind])."""
        assert self.grads is not None
        grads, self.grads = self.grads, None
        return self.ranks.reduce_scatter(
            grads, f"the gradients' reduce-scatter of group {self.name!r}")
