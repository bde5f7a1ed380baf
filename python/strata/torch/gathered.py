"""GatheredParameters: DeepSpeed's zero.GatheredParameters over the
weights strata holds (Note [Managed parameters] in weights.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from strata._native import StrataError
from strata.torch.weights import StrataParameter, read_group, write_group

if TYPE_CHECKING:
    from strata.torch.hooks import Group, Runtime
    from strata.torch.ranks import Ranks

_WHAT = "a GatheredParameters write"
_UNDONE = "nothing was written on any rank"


class GatheredParameters:
    """DeepSpeed's zero.GatheredParameters: inside the context the managed
    parameters among `params` hold their real values (in their dtype
    before initialize, on the engine's device); with a modifier_rank, the
    ones that rank changed are written back into strata when it exits,
    master and compute copy both, on every rank. Between optimizer steps.

    Across ranks every rank enters and leaves the context (collectives);
    modifier_rank is a rank of the data-parallel group, as DeepSpeed's,
    and only its changes count. If the context fails on any rank, nothing
    is written on any, and every rank raises (Note [Failing together] in
    ranks.py); if writing fails on a rank, every rank raises and gives up
    (the shards differ)."""

    def __init__(self, params: Any, modifier_rank: Optional[int] = None,
                 fwd_module: Any = None, enabled: bool = True) -> None:
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params = [p for p in params if isinstance(p, StrataParameter)] \
            if enabled else []
        self.write = modifier_rank is not None
        self.modifier_rank = modifier_rank or 0
        self.groups: list[tuple["Runtime", "Group"]] = []
        self.before: dict[int, torch.Tensor] = {}

    def __enter__(self) -> None:
        groups: dict[int, tuple[Any, Any]] = {}
        for p in self.params:
            group = p._strata.group_of[id(p)]
            groups.setdefault(id(group), (p._strata, group))
        for runtime, group in groups.values():
            self._check(runtime, group)
        try:
            for runtime, group in groups.values():
                self._gather(runtime, group)
        except BaseException:
            self._release(write=False, error=None)  # what it gathered
            for runtime, group in groups.values():
                if group.flat is not None:  # the others gather on
                    runtime.ranks.give_up(
                        "failed in a GatheredParameters gather")
            raise

    def __exit__(self, *exc: Any) -> None:
        self._release(write=self.write, error=exc[1])

    def _check(self, runtime: "Runtime", group: "Group") -> None:
        """What fails alike on every rank, before any collective."""
        runtime.check_gatherable(group)
        ranks = runtime.ranks
        if self.write and group.flat is not None and \
                not 0 <= self.modifier_rank < ranks.world:
            raise StrataError(3, "invalid argument", (
                f"strata.torch: GatheredParameters' modifier_rank "
                f"{self.modifier_rank} is no rank of the {ranks.world}; "
                f"pass a rank of the data-parallel group (0 to "
                f"{ranks.world - 1}), as for DeepSpeed"))

    def _gather(self, runtime: "Runtime", group: "Group") -> None:
        if group.gathered == 0:
            values = read_group(runtime, group)
            with runtime.inside():
                for (_, p), value in zip(group.plan.params, values):
                    p.data = value.to(runtime.device)
        group.gathered += 1
        self.groups.append((runtime, group))
        if self._modifies(runtime, group):
            with runtime.inside():
                for _, p in group.plan.params:
                    self.before[id(p)] = p.data.clone()

    def _modifies(self, runtime: "Runtime", group: "Group") -> bool:
        """Whether this rank's changes to `group` are written."""
        return self.write and (group.flat is None
                               or runtime.ranks.rank == self.modifier_rank)

    def _release(self, write: bool, error: Optional[BaseException]
                 ) -> None:
        """Writes the changes back (`write`; not after an `error` in the
        context), then ends this context's gathering of each group,
        whatever fails."""
        groups, self.groups = self.groups, []
        try:
            if write:
                self._write(groups, error)
        finally:
            self.before = {}
            for runtime, group in groups:
                group.gathered -= 1
                if group.gathered == 0:
                    with runtime.inside():
                        for (_, p), empty in zip(group.plan.params,
                                                 group.placeholders):
                            p.data = empty

    def _write(self, groups: list[tuple["Runtime", "Group"]],
               error: Optional[BaseException]) -> None:
        """Across ranks: the ranks agree whether the context failed on any
        (then nobody writes), the modifier rank's changes are broadcast,
        each rank writes its part, and the ranks agree again: a write
        that failed on some leaves the shards differing, so every rank
        fails and gives up (Note [Failing together] in ranks.py)."""
        ranks = {id(rt.ranks): rt.ranks for rt, g in groups
                 if g.flat is not None}.values()
        try:
            changes = [] if error else [self._changed(rt, g)
                                        for rt, g in groups]
        except BaseException as e:
            for each in ranks:
                each.agree(_WHAT, e, _UNDONE)
            raise
        for each in ranks:
            each.agree(_WHAT, error, _UNDONE)
        if error is not None:
            return
        try:
            changes = [self._broadcast(rt, g, changed)
                       for (rt, g), changed in zip(groups, changes)]
        except BaseException:  # the others may broadcast on
            for each in ranks:
                each.give_up(f"failed in {_WHAT}")
            raise
        self._write_all(groups, changes, list(ranks))

    def _broadcast(self, runtime: "Runtime", group: "Group",
                   changed: dict[int, torch.Tensor]
                   ) -> dict[int, torch.Tensor]:
        if group.flat is None:
            return changed
        shapes = [(empty.shape, dtype) for empty, dtype
                  in zip(group.placeholders, group.dtypes)]
        return runtime.ranks.broadcast_changed(changed, shapes,
                                               self.modifier_rank)

    @staticmethod
    def _write_all(groups: list[tuple["Runtime", "Group"]],
                   changes: list[dict[int, torch.Tensor]],
                   ranks: list["Ranks"]) -> None:
        halves = "the ranks' weights differ now: stop the job on every " \
            "rank and load the last checkpoint"
        try:
            for (runtime, group), changed in zip(groups, changes):
                if changed:
                    write_group(runtime, group, changed)
        except BaseException as e:
            for each in ranks:
                each.agree(_WHAT, e, halves)
                each.give_up(f"failed in {_WHAT}")
            raise
        for each in ranks:
            try:
                each.agree(_WHAT, None, halves)
            except StrataError:
                each.give_up(f"saw {_WHAT} fail on another rank")
                raise

    def _changed(self, runtime: "Runtime", group: "Group"
                 ) -> dict[int, torch.Tensor]:
        """The parameters of `group` this rank changed and whose changes
        count, by index: on the CPU, in their shape and dtype."""
        if not self._modifies(runtime, group):
            return {}
        out = {}
        with runtime.inside():
            for i, (name, p) in enumerate(group.plan.params):
                value, before = p.data, self.before[id(p)]
                if value.shape == before.shape and \
                        value.dtype == before.dtype and \
                        torch.equal(value, before):
                    continue
                shape = group.placeholders[i].shape
                if value.numel() != shape.numel():
                    raise StrataError(3, "invalid argument", (
                        f"strata.torch: parameter {name} was given shape "
                        f"{tuple(value.shape)} inside GatheredParameters, "
                        f"but its shape is {tuple(shape)}; write values of "
                        f"its shape (p.data.copy_(...))"))
                out[i] = value.detach().to("cpu", group.dtypes[i]) \
                    .reshape(shape).contiguous()
        return out
