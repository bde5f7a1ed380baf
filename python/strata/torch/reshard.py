"""Checkpoints across ranks, loadable at any world size.

Note [Checkpoints across ranks]
At world size N > 1, save_dir/tag holds one strata checkpoint per rank,
rank-<r>/ (each written, fsynced and checksummed by the engine's Save, as
at one rank), and ranks.json, which rank 0 writes last, atomically, once
every rank's part is complete (the ranks agree on each step's outcome
between: Note [Failing together] in ranks.py): a tag without it is
incomplete and is refused. ranks.json gives the world size and each
group's parameters (names, shapes) and shard size, which fix the flat
layout (Note [Partitions] in ranks.py).

Loading at the saved world size, each rank loads its own part through the
engine's Load. At another world size (a checkpoint of one rank included,
whose groups hold their parameters one tensor each), every part's
checksums are verified first, then each rank reads, group by group and
role by role, the ranges of the flat layout its own tensors cover, from
whichever parts hold them (padding reads as zeros), and writes them into
its engine; the step count comes from the saved optimizer state, the rest
of strata.torch's state (scheduler, scaler, counters) from rank 0's part.
Master weights, optimizer state, compute copies and the step are then
bit-identical to the saved ones; RNG states are rank 0's.

Without the optimizer's state (load_module_only, or load_optimizer_states
false), every world size takes the second way for the weights alone
(compute copies and masters): the state roles are not read, so a
checkpoint of another strata.state_dtype (or of int8 state at another
world size) loads its weights; the caller then zeroes the state."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import strata
from strata._native import StrataError
from strata.torch.flat import offsets

if TYPE_CHECKING:
    from strata.torch.engine import StrataEngine
    from strata.torch.hooks import Group

RANKS_FILE = "ranks.json"
_FORMAT = "strata.torch.ranks/1"
_NUMPY = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16}


def _error(message: str) -> StrataError:
    return StrataError(7, "data loss", f"strata.torch: {message}")


def save(engine: "StrataEngine", path: Path, state: str) -> None:
    """Every rank's part of save_dir/tag, then ranks.json (rank 0); a
    failure on any rank fails every rank (Note [Failing together])."""
    ranks = engine.rt.ranks
    what = "the checkpoint's save"
    undone = f"{path} is incomplete, and a load refuses it"
    first = ranks.rank == 0  # all are here: checkpoint.save agreed
    ranks.together(what, lambda: _unmark(path) if first else None, undone)
    ranks.together(what, lambda: engine.rt.optimizer.save(
        str(path / f"rank-{ranks.rank}"), state), undone)
    ranks.together(what, lambda: _mark(engine, path) if first else None,
                   undone)


def _unmark(path: Path) -> None:
    """The tag is incomplete until _mark."""
    if (path / RANKS_FILE).exists():
        (path / RANKS_FILE).unlink()
        _sync_dir(path)


def _mark(engine: "StrataEngine", path: Path) -> None:
    """Every rank's part is written: ranks.json makes the tag complete."""
    groups = [{"name": g.name, "shard": g.flat.shard,
               "params": [[name, list(t.shape)]
                          for name, t in g.plan.params]}
              for g in engine.rt.groups if g.flat is not None]
    _write_atomically(path / RANKS_FILE, json.dumps(
        {"format": _FORMAT, "world": engine.rt.ranks.world,
         "groups": groups}))


def load(engine: "StrataEngine", path: Path, optimizer_states: bool = True
         ) -> str:
    """Loads save_dir/tag at this world size; strata.torch's user state.
    Without optimizer_states, the weights alone: the optimizer's state and
    step are left as they were."""
    ranks = engine.rt.ranks
    saved = _saved_world(path)
    if saved == ranks.world and optimizer_states:
        part = path / f"rank-{ranks.rank}" if saved > 1 else path
        state = engine.rt.optimizer.load(str(part))
    else:
        source = Saved(path, saved)
        if optimizer_states:
            _check_state(source, engine.ds_config.state_dtype, ranks.world)
        for group in engine.rt.groups:
            _fill(engine, group, source, optimizer_states)
        if optimizer_states:
            engine.rt.optimizer.step = source.step
        state = source.user_state
    for group in engine.rt.groups:
        if group.flat is not None:
            group.flat.stepped()  # no gathered copy from before the load
    return state


# The roles a load without the optimizer's state reads.
WEIGHT_ROLES = ("compute", "master")


def _saved_world(path: Path) -> int:
    if (path / RANKS_FILE).is_file():
        meta = json.loads((path / RANKS_FILE).read_text())
        if meta.get("format") != _FORMAT:
            raise _error(f"{path / RANKS_FILE} is of format "
                         f"{meta.get('format')!r}, this strata.torch reads "
                         f"{_FORMAT}")
        return int(meta["world"])
    if (path / "rank-0").exists():
        raise _error(
            f"{path} is incomplete: a save across ranks that did not finish "
            f"(no {RANKS_FILE}); load the checkpoint before it")
    return 1


class Saved:
    """A checkpoint's tensors as ranges of each group's flat layout."""

    def __init__(self, path: Path, world: int) -> None:
        parts = [path / f"rank-{r}" for r in range(world)] \
            if world > 1 else [path]
        for part in parts:
            strata.verify_checkpoint(str(part))
        manifests = [json.loads((p / "manifest.json").read_text())
                     for p in parts]
        outer = json.loads(manifests[0]["user_state"])
        self.step = int(outer["strata_optimizer"]["step"])
        self.user_state = outer.get("user_state") or ""
        self.parts = parts
        self.groups = [{g["name"]: g for g in m["groups"]} for m in manifests]
        self.world = world
        self.layout: dict[str, list[torch.Size]] = {}
        if world > 1:
            meta = json.loads((path / RANKS_FILE).read_text())
            self.layout = {g["name"]: [torch.Size(s) for _, s in g["params"]]
                           for g in meta["groups"]}

    def segments(self, name: str, shapes: list[torch.Size]
                 ) -> list[tuple[int, int, Path, dict[str, Any]]]:
        """(first flat element, elements, file, tensor entry) of each
        piece of group `name` in the saved files."""
        if name not in self.groups[0]:
            raise _error(f"the checkpoint has no group {name!r}: it is of "
                         f"another model, or of this one under other "
                         f"strata.groups")
        entries = [g[name] for g in self.groups]
        if self.world > 1:
            if self.layout.get(name) != shapes:
                raise _error(f"group {name!r} of the checkpoint has shapes "
                             f"{self.layout.get(name)}, the model {shapes}: "
                             f"another model")
            (shard,) = entries[0]["tensors"]
            size = int(shard["shape"][0])
            return [(r * size, size, self.parts[r] / e["file"],
                     e["tensors"][0]) for r, e in enumerate(entries)]
        tensors = entries[0]["tensors"]
        saved = [torch.Size(t["shape"]) for t in tensors]
        if saved != shapes:
            raise _error(f"group {name!r} of the checkpoint has shapes "
                         f"{saved}, the model {shapes}: another model")
        return [(at, s.numel(), self.parts[0] / entries[0]["file"], t)
                for at, s, t in zip(offsets(saved), saved, tensors)]

    def read(self, name: str, shapes: list[torch.Size], role: str,
             start: int, count: int, want: str) -> np.ndarray:
        """Elements [start, start + count) of the flat layout of `role`,
        whose dtype in the engine is `want`."""
        out: np.ndarray = np.zeros(0)
        for first, size, file, tensor in self.segments(name, shapes):
            if role not in tensor["roles"]:
                raise _error(f"group {name!r} of the checkpoint has no "
                             f"{role}: it was saved under another config")
            saved = (tensor["dtype"] if role == "compute"
                     else tensor.get("state_dtype", "fp32")
                     if role.startswith("state") else "fp32")
            if saved != want:
                raise StrataError(9, "failed precondition", (
                    f"strata.torch: group {name!r}: {role} is {saved} in "
                    f"the checkpoint but {want} in this engine; load it "
                    f"with the config it was saved with (dtype, "
                    f"strata.state_dtype)"))
            kind = _NUMPY[saved]
            if out.size == 0:
                out = np.zeros(count, dtype=kind)
            lo, hi = max(first, start), min(first + size, start + count)
            if lo < hi:
                item = np.dtype(kind).itemsize
                out[lo - start:hi - start] = np.fromfile(
                    file, dtype=kind, count=hi - lo,
                    offset=tensor["roles"][role] + (lo - first) * item)
        return out


def _check_state(source: Saved, want: str, world: int) -> None:
    """Before anything is written: the saved optimizer state is in the
    engine's format, and not int8, which is quantized in blocks of each
    rank's part and so loads only at the world size that saved it."""
    saved = {t.get("state_dtype", "fp32")
             for groups in source.groups for g in groups.values()
             for t in g["tensors"] if "state1" in t["roles"]}
    if "int8" in saved | {want}:
        raise StrataError(9, "failed precondition", (
            f"strata.torch: int8 optimizer state loads only at the world "
            f"size it was saved at ({len(source.parts)} ranks, not "
            f"{world}): resume at that size, or train with fp32 or bf16 "
            f"state (strata.state_dtype) to change it"))
    if saved - {want}:
        raise StrataError(9, "failed precondition", (
            f"strata.torch: the checkpoint's optimizer state is "
            f"{', '.join(sorted(saved))}, this engine's {want}: load it "
            f"with the strata.state_dtype it was saved with"))


def _fill(engine: "StrataEngine", group: "Group", source: Saved,
          optimizer_states: bool) -> None:
    """One group's roles from the saved files: every one, or the weights
    alone."""
    rt = engine.rt
    shapes = [t.shape for _, t in group.plan.params]
    at = offsets(shapes)
    index = {name: i for i, (name, _) in enumerate(group.plan.params)}
    roles = group.roles if optimizer_states else \
        [r for r in group.roles if r in WEIGHT_ROLES]
    with rt.engine.fetch(group.id, "host", roles=roles,
                         write=True) as view:
        for info in view.tensors:
            target = torch.from_dlpack(view.export(info.name, info.role))
            if group.flat is None:
                i = index[info.name]
                start, count = at[i], shapes[i].numel()
            else:
                start = rt.ranks.rank * group.flat.shard
                count = group.flat.shard
            raw = source.read(group.name, shapes, info.role, start, count,
                              info.dtype)
            value = torch.from_numpy(raw)
            if target.dtype == torch.bfloat16:
                value = value.view(torch.bfloat16)
            target.view(-1).copy_(value)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
