"""A trained model's weights as Hugging Face safetensors (sharded, with
model.safetensors.index.json, and config.json for a transformers model),
one group at a time: from a live engine (engine.export) or offline from a
strata.torch checkpoint directory, without building the model (what
DeepSpeed users get from zero_to_fp32.py, which holds the whole model):

    python -m strata.torch.export CKPT OUT [--dtype fp32|compute]
                                           [--max-shard-size 2GB]

Both write the same files: the parameters in group order under their
names in the model (a tied parameter once, under its first name; the
model re-ties it), then the persistent buffers in state_dict order.
dtype "fp32" gives the fp32 master weights (the compute copy where a group
has no master, which then is exact), "compute" the compute copies."""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, TypeVar, Union

import numpy as np
import torch

import strata
from strata._native import StrataError
from strata.torch import safetensors_io
from strata.torch.config import ConfigError

if TYPE_CHECKING:
    from strata.torch.engine import StrataEngine

DEFAULT_SHARD_BYTES = 2 << 30
T = TypeVar("T")
_ROLE = {"fp32": "master", "compute": "compute"}
_NUMPY = {"fp32": (np.float32, torch.float32),
          "bf16": (np.uint16, torch.bfloat16),
          "fp16": (np.float16, torch.float16)}


def _role(dtype: str) -> str:
    if dtype not in _ROLE:
        raise ConfigError(f"export dtype {dtype!r}: choose \"fp32\" (the "
                          f"master weights) or \"compute\"")
    return _ROLE[dtype]


def engine_tensors(engine: "StrataEngine", dtype: str
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The live engine's parameters and persistent buffers."""
    from strata.torch.weights import StrataParameter, role_values
    want = _role(dtype)
    rt = engine.rt
    engine.store.drain()
    for group in rt.groups:
        role = want if want in group.roles else "compute"
        dtypes = [torch.float32 if dtype == "fp32" else p.dtype
                  for p in group.placeholders]
        values = role_values(rt, group, role, dtypes)  # across ranks too
        for (name, _), value in zip(group.plan.params, values):
            yield name, value
    with rt.inside():
        state = engine.module.state_dict(keep_vars=True)
    for key, value in state.items():
        if not isinstance(value, (StrataParameter, torch.nn.Parameter)):
            yield key, value.detach().cpu()


def export(engine: "StrataEngine", out_dir: Union[str, Path], dtype: str,
           max_shard_bytes: int) -> list[Path]:
    """engine.export: the files written (config.json beside them for a
    transformers model)."""
    tensors, stopped = _watched(engine_tensors(engine, dtype))
    ranks = engine.rt.ranks

    def write() -> list[Path]:
        if ranks.rank != 0:  # its part of every collective, no files
            collections.deque(tensors, maxlen=0)
            return []
        files = safetensors_io.write(tensors, out_dir, max_shard_bytes)
        config = model_config(engine.module)
        if config is not None:
            _write_config(out_dir, config)
        return files

    def drain() -> bool:  # Note [Failing together]
        if not stopped:
            collections.deque(tensors, maxlen=0)
        return not stopped
    return ranks.together("the export", write, f"{out_dir} is incomplete",
                          drain)


def _watched(items: Iterator[T]) -> tuple[Iterator[T], list[bool]]:
    """`items`, and a list that is non-empty once they raised (their
    collectives stopped midway: nothing can drain them)."""
    stopped: list[bool] = []

    def watch() -> Iterator[T]:
        try:
            yield from items
        except BaseException:
            stopped.append(True)
            raise
    return watch(), stopped


def model_config(model: torch.nn.Module) -> Optional[dict[str, Any]]:
    """A transformers model's config as its config.json holds it."""
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    return json.loads(to_json()) if to_json is not None else None


def _write_config(out_dir: Union[str, Path], config: dict[str, Any]) -> None:
    (Path(out_dir) / "config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n")


def _is_checkpoint(path: Path) -> bool:
    """One rank's checkpoint (manifest.json), or several ranks' (Note
    [Checkpoints across ranks] in reshard.py)."""
    return (path / "manifest.json").is_file() or \
        (path / "ranks.json").is_file()


def checkpoint_dir(path: Union[str, Path]) -> Path:
    """A checkpoint directory, or the one a save_dir's "latest" names."""
    path = Path(path)
    if not _is_checkpoint(path) and (path / "latest").is_file():
        path = path / (path / "latest").read_text().strip()
    if not _is_checkpoint(path):
        raise ConfigError(
            f"{path} is no strata checkpoint (no manifest.json, nor a "
            f"\"latest\" naming one); pass the directory save_checkpoint "
            f"wrote")
    return path


def _sharded_tensors(path: Path, dtype: str
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters of a checkpoint of several ranks (verified by
    Saved), each read from the parts that hold its range."""
    from strata.torch.flat import offsets
    from strata.torch.reshard import RANKS_FILE, Saved
    meta = json.loads((path / RANKS_FILE).read_text())
    saved = Saved(path, int(meta["world"]))
    want = _role(dtype)
    for group in meta["groups"]:
        shapes = [torch.Size(s) for _, s in group["params"]]
        (shard,) = saved.groups[0][group["name"]]["tensors"]
        role = want if want in shard["roles"] else "compute"
        kind = shard["dtype"] if role == "compute" else "fp32"
        for (name, _), shape, at in zip(group["params"], shapes,
                                        offsets(shapes)):
            raw = saved.read(group["name"], shapes, role, at, shape.numel(),
                             kind)
            value = torch.from_numpy(raw).view(_NUMPY[kind][1])
            value = value.reshape(shape)
            yield name, value.float() if dtype == "fp32" else value


def checkpoint_tensors(path: Path, dtype: str
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """A verified checkpoint's parameters and persistent buffers."""
    want = _role(dtype)
    sharded = (path / "ranks.json").is_file()
    manifest = json.loads(
        (path / ("rank-0" if sharded else "") / "manifest.json").read_text())
    for group in manifest["groups"] if not sharded else ():
        file = path / group["file"]
        for t in group["tensors"]:
            role = want if want in t["roles"] else "compute"
            kind = t["dtype"] if role == "compute" else "fp32"
            np_type, torch_type = _NUMPY[kind]
            count = int(np.prod(t["shape"], dtype=np.int64))
            raw = np.fromfile(file, dtype=np_type, count=count,
                              offset=t["roles"][role])
            value = torch.from_numpy(raw).view(torch_type).reshape(t["shape"])
            yield t["name"], value.float() if dtype == "fp32" else value
    if sharded:
        yield from _sharded_tensors(path, dtype)
    state = user_state(manifest)
    if "state_buffers" not in state:
        raise ConfigError(
            f"{path} was saved by a strata.torch that did not record the "
            f"model's buffers by name; export it with engine.export from "
            f"the model")
    from strata.torch.checkpoint import saved_buffers
    buffers = saved_buffers(state)
    for key in state["state_buffers"]:
        yield key, buffers[key]


def user_state(manifest: dict[str, Any]) -> dict[str, Any]:
    """strata.torch's state in a manifest (inside the optimizer's: Note
    [Optimizer checkpoint state] in src/optim/offload_optimizer.cc)."""
    outer = json.loads(manifest["user_state"])
    return json.loads(outer.get("user_state") or "{}")


def export_checkpoint(ckpt: Union[str, Path], out_dir: Union[str, Path],
                      dtype: str = "fp32",
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES
                      ) -> list[Path]:
    """Exports a strata.torch checkpoint (its directory, or a save_dir
    whose "latest" names one) after verifying every file's checksum."""
    path = checkpoint_dir(ckpt)
    sharded = (path / "ranks.json").is_file()
    if not sharded:  # Saved verifies every part of a sharded one
        strata.verify_checkpoint(str(path))
    files = safetensors_io.write(checkpoint_tensors(path, dtype), out_dir,
                                 max_shard_bytes)
    first = path / "rank-0" if sharded else path
    state = user_state(json.loads((first / "manifest.json").read_text()))
    if state.get("model_config") is not None:
        _write_config(out_dir, state["model_config"])
    return files


def parse_size(text: str) -> int:
    """"2GB", "500MB", "1GiB" or a byte count."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*",
                         text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is no size: write e.g. 2GB, 500MB or 1073741824")
    number, unit, binary = match.groups()
    base = 1024 if binary else 1000
    return int(float(number) * base ** " KMGT".index(unit.upper() or " "))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m strata.torch.export",
        description="Exports a strata.torch checkpoint as Hugging Face "
        "safetensors (sharded, with its index), group by group.")
    parser.add_argument("checkpoint", help="the checkpoint directory (or "
                        "the save_dir whose 'latest' names it)")
    parser.add_argument("out", help="the directory to write")
    parser.add_argument("--dtype", choices=sorted(_ROLE), default="fp32")
    parser.add_argument("--max-shard-size", type=parse_size,
                        default=DEFAULT_SHARD_BYTES)
    args = parser.parse_args(argv)
    try:
        files = export_checkpoint(args.checkpoint, args.out, args.dtype,
                                  args.max_shard_size)
    except (StrataError, ConfigError, OSError) as e:
        print(f"strata.torch.export: {e}", file=sys.stderr)
        return 1
    print(f"strata.torch.export: wrote {len(files)} file(s) to {args.out}")
    return 0

