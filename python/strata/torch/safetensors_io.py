"""Weights in and out as safetensors files in the Hugging Face layout (one
model.safetensors, or shards model-0000i-of-0000N.safetensors named by
model.safetensors.index.json's weight_map), one tensor or one shard in
memory at a time. The format is the safetensors package's (safe_open reads
one tensor of a file, save_file writes a shard)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Union

import torch
from torch import nn

from strata.torch.config import ConfigError
from strata.torch.groups import GroupPlan

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class Source:
    """A safetensors file, or a directory holding model.safetensors or a
    sharded set with its index; which file holds each tensor."""

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        from safetensors import safe_open
        self._open = safe_open
        self.path = Path(path)
        self.file_of = self._files()
        self.shape: dict[str, tuple[int, ...]] = {}
        for file in sorted(set(self.file_of.values())):
            with self._opened(file) as f:
                held = set(f.keys())
                for key in (k for k, v in self.file_of.items() if v == file):
                    if key not in held:
                        raise ConfigError(
                            f"{self.path}: the index maps {key} to "
                            f"{file.name}, which does not hold it; the "
                            f"index and the shards disagree")
                    self.shape[key] = tuple(f.get_slice(key).get_shape())
        self.key_of: dict[str, str] = {}  # parameter name -> file key

    def _files(self) -> dict[str, Path]:
        """Which file holds each tensor."""
        if self.path.is_dir() and (self.path / INDEX).is_file():
            return self._index()
        if self.path.is_dir() and (self.path / SINGLE).is_file():
            self.path = self.path / SINGLE
        if not self.path.is_file():
            raise ConfigError(
                f"init_from {self.path}: no such safetensors file, nor a "
                f"directory holding {SINGLE} or {INDEX}")
        with self._opened(self.path) as f:
            return {key: self.path for key in f.keys()}

    def _index(self) -> dict[str, Path]:
        index = self.path / INDEX
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            out = {str(k): self.path / str(v) for k, v in weight_map.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(
                f"{index} is no safetensors index (it needs a "
                f"\"weight_map\" of tensor names to files): {e}") from e
        for key, file in out.items():
            if not file.is_file():
                raise ConfigError(
                    f"{index} maps {key} to {file.name}, which does not "
                    f"exist in {self.path}; copy the missing shard there")
        return out

    def _opened(self, file: Path) -> Any:
        try:
            return self._open(str(file), framework="pt")
        except Exception as e:  # the package raises its own error types
            raise ConfigError(
                f"{file} is not a readable safetensors file ({e}); it is "
                f"truncated or of another format: export it again") from e

    def has(self, name: str) -> bool:
        """Whether the file holds parameter `name` (after check())."""
        return name in self.key_of

    def check(self, model: nn.Module, plans: list[GroupPlan],
              strict: bool) -> None:
        """Matches every parameter (by any of its names; tied ones once) to
        a tensor of the file: a misshapen one is an error, and so (with
        strict) is a parameter without one or a tensor matching nothing."""
        aliases: dict[int, list[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
        missing = []
        for plan in plans:
            for name, p in plan.params:
                key = next((a for a in aliases[id(p)] if a in self.shape),
                           None)
                if key is None:
                    missing.append(name)
                    continue
                if self.shape[key] != tuple(p.shape):
                    raise ConfigError(
                        f"{self.file_of[key]}: tensor {key} has shape "
                        f"{list(self.shape[key])}, the model's parameter "
                        f"{name} {list(p.shape)}; the file is of another "
                        f"model or configuration")
                self.key_of[name] = key
        known = set(model.state_dict(keep_vars=True))
        unexpected = sorted(k for k in self.shape if k not in known)
        if strict and (missing or unexpected):
            what = (f"the model's parameter {missing[0]} is not in it "
                    f"({len(missing)} missing)" if missing else
                    f"its tensor {unexpected[0]} matches no parameter or "
                    f"buffer of the model ({len(unexpected)} unexpected)")
            raise ConfigError(
                f"init_from {self.path}: {what}; pass strict=False to "
                f"initialize the missing ones and ignore the unexpected")

    def read(self, plan: GroupPlan) -> dict[str, torch.Tensor]:
        """The group's parameters the file holds, by parameter name."""
        by_file: dict[Path, list[str]] = {}
        for name, _ in plan.params:
            if name in self.key_of:
                by_file.setdefault(self.file_of[self.key_of[name]],
                                   []).append(name)
        out = {}
        for file, names in by_file.items():  # each file opened once
            with self._opened(file) as f:
                for name in names:
                    out[name] = f.get_tensor(self.key_of[name])
        return out

    def load_buffers(self, model: nn.Module) -> None:
        """Copies the buffers the file holds into the model's."""
        for name, buffer in model.state_dict(keep_vars=True).items():
            if name in self.shape and not isinstance(buffer, nn.Parameter):
                with self._opened(self.file_of[name]) as f:
                    buffer.data.copy_(f.get_tensor(name))


class Writer:
    """Writes tensors, in the order added, into shards of at most
    `max_shard_bytes` (a larger tensor gets a shard of its own) in
    `out_dir`, with the index when there are several."""

    def __init__(self, out_dir: Union[str, os.PathLike],
                 max_shard_bytes: int) -> None:
        if max_shard_bytes <= 0:
            raise ConfigError(f"max_shard_bytes {max_shard_bytes}: give a "
                              f"positive size")
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.limit = max_shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[list[str]] = []
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.limit:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total += size

    def _flush(self) -> None:
        from safetensors.torch import save_file
        save_file(self.pending, str(self._temp(len(self.shards))),
                  metadata={"format": "pt"})
        self.shards.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def _temp(self, index: int) -> Path:
        return self.out / f".strata-shard-{index}.tmp"

    def close(self) -> list[Path]:
        """Ends the last shard, gives the files their names (replacing an
        earlier export's) and writes the index; returns the files."""
        if self.pending or not self.shards:
            self._flush()
        for old in list(self.out.glob("model*.safetensors")) + \
                [self.out / INDEX]:
            if old.exists():
                old.unlink()
        count = len(self.shards)
        names = [SINGLE] if count == 1 else [
            f"model-{i + 1:05d}-of-{count:05d}.safetensors"
            for i in range(count)]
        for i, name in enumerate(names):
            os.replace(self._temp(i), self.out / name)
        if count > 1:
            weight_map = {key: name for name, keys in zip(names, self.shards)
                          for key in keys}
            (self.out / INDEX).write_text(json.dumps(
                {"metadata": {"total_size": self.total},
                 "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
        return [self.out / n for n in names]


def write(items: Iterable[tuple[str, torch.Tensor]],
          out_dir: Union[str, os.PathLike], max_shard_bytes: int
          ) -> list[Path]:
    """Writes (name, tensor) pairs as Writer does."""
    writer = Writer(out_dir, max_shard_bytes)
    for name, tensor in items:
        writer.add(name, tensor)
    return writer.close()
