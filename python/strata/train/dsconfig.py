"""The DeepSpeed-style config strata-train runs with: --config's file, or
without one a default (AdamW at lr 3e-4, betas 0.9/0.95, weight decay
0.1, gradient clipping at 1.0, micro-batch 4, bf16 where the GPU has it,
else fp32, optimizer state and parameters homed in host memory), and on
top of either the flags given explicitly (--micro-batch, --grad-accum,
--lr, --dtype, --nvme, --device)."""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import torch

from strata.train.models import TrainError

DEFAULT: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {
        "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
        "weight_decay": 0.1}},
    "zero_optimization": {"stage": 3},
}


def ds_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config dict, its flags applied (strata.torch.config checks
    it when the engine starts)."""
    if args.config:
        try:
            raw = json.loads(Path(args.config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise TrainError(f"cannot read --config {args.config}: {e}"
                             ) from e
        if not isinstance(raw, dict):
            raise TrainError(f"--config {args.config} is not a JSON object")
    else:
        raw = copy.deepcopy(DEFAULT)
    _batch(raw, args)
    if args.lr is not None:
        optimizer = raw.setdefault("optimizer", {"type": "AdamW"})
        optimizer.setdefault("params", {})["lr"] = args.lr
    if args.device is not None:
        raw.setdefault("strata", {})["device"] = args.device
    _precision(raw, args)
    if args.nvme is not None:
        _nvme(raw, args.nvme)
    return raw


def _batch(raw: dict[str, Any], args: argparse.Namespace) -> None:
    """--micro-batch and --grad-accum; a train_batch_size that would
    contradict them goes (strata.torch derives it again)."""
    for value, key in ((args.micro_batch, "train_micro_batch_size_per_gpu"),
                       (args.grad_accum, "gradient_accumulation_steps")):
        if value is not None:
            raw[key] = value
            raw.pop("train_batch_size", None)


def _precision(raw: dict[str, Any], args: argparse.Namespace) -> None:
    """--dtype: bf16, fp16 or fp32; "auto" (the default without --config)
    picks bf16 on a GPU that has it, else fp32 (a CPU computes bf16 slowly
    and the host-emulated device gains nothing from it)."""
    dtype = args.dtype
    if dtype is None and not args.config:
        dtype = "auto"
    if dtype is None:
        return
    if dtype == "auto":
        device = raw.get("strata", {}).get("device", "auto")
        gpu = device != "host" and torch.cuda.is_available()
        dtype = "bf16" if gpu and torch.cuda.is_bf16_supported() else "fp32"
    raw.pop("bfloat16", None)
    raw["bf16"] = {"enabled": dtype == "bf16"}
    if dtype == "fp16":
        raw["fp16"] = {**raw.get("fp16", {}), "enabled": True}
    else:
        raw.pop("fp16", None)


def _nvme(raw: dict[str, Any], path: str) -> None:
    """--nvme DIR: parameters and optimizer state homed on the drive, DIR
    their swap directory (made if missing)."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainError(f"--nvme {path}: cannot create it: {e}") from e
    zero = raw.setdefault("zero_optimization", {"stage": 3})
    for key in ("offload_param", "offload_optimizer"):
        zero[key] = {**zero.get(key, {}), "device": "nvme",
                     "nvme_path": path}
