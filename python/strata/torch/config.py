"""The DeepSpeed-style configuration of strata.torch: the keys a single-GPU
ZeRO-3 offload user already has in ds_config.json, plus a "strata" block
for what DeepSpeed has no key for. docs/torch.md has the mapping table.

A key that would change the result and that strata does not implement is a
ConfigError naming it; keys that cannot change the result (logging,
DeepSpeed's buffer and bucket sizes) are accepted and listed once in
Config.ignored."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Optional, Union

from strata.torch.schedule import ScheduleError, Scheduler


class ConfigError(ValueError):
    """A configuration strata cannot run: the message names the key, the
    problem and the fix."""


# Keys accepted without effect: they tune DeepSpeed's own buffers, its
# communication or its logging, none of which changes what is computed.
_IGNORED_TOP = {
    "steps_per_print", "wall_clock_breakdown", "dump_state", "logging",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger",
    "flops_profiler", "memory_breakdown", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "communication_data_type",
    "gradient_predivide_factor", "sparse_gradients", "timers", "aio",
    "checkpoint", "prescale_gradients",
}
_IGNORED_ZERO = {
    "contiguous_gradients", "overlap_comm", "reduce_scatter",
    "reduce_bucket_size", "allgather_partitions", "allgather_bucket_size",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "sub_group_size",
    "round_robin_gradients", "memory_efficient_linear",
    "load_from_fp32_weights",
    "elastic_checkpoint", "ignore_unused_parameters", "prefetch_bucket_size",
    "param_persistence_threshold", "max_live_parameters", "max_reuse_distance",
    "cpu_offload_use_pin_memory",
}
_IGNORED_OFFLOAD = {"buffer_count", "buffer_size", "max_in_cpu",
                    "pipeline_read", "pipeline_write", "fast_init", "ratio",
                    "pipeline"}
_OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "adagrad": "adagrad",
               "lion": "lion"}
_SCHEDULERS = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.I)


def parse_bytes(value: Union[int, str], key: str) -> int:
    """128, "64M", "1.5G", "2GiB" -> bytes."""
    if isinstance(value, int) and value >= 0:
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ConfigError(f"{key}: {value!r} is not a size; write bytes as "
                          f"an integer or with a suffix, e.g. \"512M\"")
    scale = 1 << (10 * " KMGT".index(match.group(2).upper() or " "))
    return int(float(match.group(1)) * scale)


@dataclass
class Config:
    """What strata.torch.initialize runs with, parsed from the dict."""
    micro_batch: int = 1
    accumulation: int = 1
    algo: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    lr_decay: float = 0.0
    clip_norm: float = 0.0
    dtype: str = "fp32"  # of the compute copies: fp32, bf16 or fp16
    state_dtype: str = "fp32"  # of the optimizer state: fp32, bf16, int8
    fp16: dict[str, float] = field(default_factory=dict)
    scheduler: Optional[tuple[str, dict[str, Any]]] = None
    param_tier: str = "host"
    state_tier: str = "host"
    nvme_path: Optional[str] = None
    device: str = "auto"
    device_budget: Optional[int] = None  # None: from the model's sizes
    host_budget: Optional[int] = None
    nvme_budget: Optional[int] = None
    mode: str = "overlap"
    groups: Optional[list[str]] = None
    threads: int = 0
    grad_buffers: int = 4
    io_threads: Optional[int] = None
    # save_16bit_model writes only with this (DeepSpeed's ZeRO-3 rule).
    gather_16bit_on_save: bool = False
    optimizer_given: bool = False  # the config has an "optimizer" section
    # Steps skipped in a row for non-finite gradients (bf16, fp32) before
    # the run stops; fp16 stops at its minimum loss scale instead.
    max_consecutive_skips: int = 5
    stage: int = 3  # ZeRO stage: what is partitioned across ranks
    world: int = 1  # ranks of the job (WORLD_SIZE, or the default group)
    rank_timeout: float = 300.0  # s a collective waits for another rank
    ignored: list[str] = field(default_factory=list)

    @property
    def speculates(self) -> bool:
        """Whether trained groups step speculatively under backward (Note
        [Exact steps under overlap] in src/optim/pipeline.h): in overlap
        mode with the state on NVMe, since every step is skipped exactly
        when a gradient is not finite, so each waits for the global
        checks."""
        return self.state_tier == "nvme" and self.mode == "overlap"

    @property
    def master_weights(self) -> bool:
        """Whether trained groups keep an fp32 master beside the compute
        copy. In fp32 the optimizer steps the compute copy in place (4
        bytes a parameter less, and with the state on NVMe a third less
        I/O a step), unless steps speculate: undoing one needs the
        master."""
        return self.dtype != "fp32" or self.speculates

    def homes(self) -> dict[str, str]:
        """The home tier of each role strata.torch registers: compute
        copies where offload_param says, the fp32 roles where
        offload_optimizer says."""
        fp32 = ("master",) if self.master_weights else ()
        return {"compute": self.param_tier,
                **{role: self.state_tier
                   for role in (*fp32, "state1", "state2", "grad")}}


def _world_size() -> int:
    """The job's ranks: the default process group's, else the launcher's
    WORLD_SIZE (torchrun, deepspeed), else 1."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def load(config: Union[str, os.PathLike, dict[str, Any]]) -> Config:
    """Parses a ds_config.json path or dict."""
    if not isinstance(config, dict):
        try:
            config = json.loads(Path(config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read the config {config}: {e}") from e
    out = Config()
    out.world = _world_size()
    raw = dict(config)
    _top(raw, out)
    _zero(raw.pop("zero_optimization", None), out)
    _optimizer(raw.pop("optimizer", None), out)
    _precision(raw, out)
    _strata(raw.pop("strata", {}), out)
    if raw.get("scheduler") is not None:
        _scheduler(raw.pop("scheduler"), out)
    raw.pop("scheduler", None)
    for key in list(raw):
        if key in _IGNORED_TOP:
            out.ignored.append(key)
            raw.pop(key)
    if raw:
        key = sorted(raw)[0]
        raise ConfigError(
            f"unknown config key {key!r}: strata does not support it; remove "
            f"it (docs/torch.md lists the supported keys)")
    return out


def _number(value: Any, key: str, kind: type = float) -> Any:
    """int(value) or float(value), or a ConfigError naming the key (also
    for HF's "auto", which only its DeepSpeed integration fills in)."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number; write the "
                          f"value itself (strata fills in no \"auto\")"
                          ) from None


def _bool(value: Any, key: str) -> bool:
    """A JSON boolean, or a ConfigError naming the key: the string "false"
    is true in Python, and "auto" is HF's to fill in."""
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: {value!r} is not a boolean; write true or "
                      f"false (JSON booleans, not strings; strata fills in "
                      f"no \"auto\")")


def _take(section: Any, where: str, known: set[str],
          ignored: set[str], out: Config) -> dict[str, Any]:
    if not isinstance(section, dict):
        raise ConfigError(f"{where} must be an object ({{...}}), not "
                          f"{section!r}")
    for key in section:
        if key in ignored:
            out.ignored.append(f"{where}.{key}")
        elif key not in known:
            raise ConfigError(
                f"unknown config key '{where}.{key}': strata does not support "
                f"it; remove it (docs/torch.md lists the keys)")
    return {k: v for k, v in section.items() if k in known}


def _top(raw: dict[str, Any], out: Config) -> None:
    """The batch sizes (DeepSpeed derives a missing one from the other
    two: train_batch_size = micro x accumulation x ranks)."""
    sizes = {k: _number(raw.pop(k), k, int) for k in (
        "train_batch_size", "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps") if k in raw}
    total = sizes.get("train_batch_size")
    micro = sizes.get("train_micro_batch_size_per_gpu")
    steps = sizes.get("gradient_accumulation_steps")
    if total is not None and micro is None:
        micro = total // ((steps or 1) * out.world)
    if total is not None and steps is None:
        steps = total // ((micro or 1) * out.world)
    out.micro_batch, out.accumulation = micro or 1, steps or 1
    if out.micro_batch < 1 or out.accumulation < 1:
        raise ConfigError("train_micro_batch_size_per_gpu and "
                          "gradient_accumulation_steps must be >= 1")
    if total is not None and \
            total != out.micro_batch * out.accumulation * out.world:
        raise ConfigError(
            f"train_batch_size {total} != train_micro_batch_size_per_gpu "
            f"{out.micro_batch} x gradient_accumulation_steps "
            f"{out.accumulation} x {out.world} ranks; fix one of them")
    out.clip_norm = _number(raw.pop("gradient_clipping", 0.0),
                            "gradient_clipping")


def _zero(zero: Optional[dict[str, Any]], out: Config) -> None:
    zero = _take(zero or {"stage": 3}, "zero_optimization",
                 {"stage", "offload_param", "offload_optimizer",
                  "stage3_gather_16bit_weights_on_model_save",
                  "gather_16bit_weights_on_model_save"},
                 _IGNORED_ZERO, out)
    for key in ("stage3_gather_16bit_weights_on_model_save",
                "gather_16bit_weights_on_model_save"):
        if key in zero:
            out.gather_16bit_on_save = _bool(zero[key],
                                             f"zero_optimization.{key}")
    out.stage = zero.get("stage", 3)
    if out.stage not in (1, 2, 3):
        raise ConfigError(
            f"zero_optimization.stage {out.stage!r}: strata partitions the "
            f"optimizer state (1), also the gradients (2) or also the "
            f"parameters (3) across ranks; set it to 1, 2 or 3")
    for key, attr in (("offload_param", "param_tier"),
                      ("offload_optimizer", "state_tier")):
        section = _take(zero.get(key) or {}, f"zero_optimization.{key}",
                        {"device", "nvme_path", "pin_memory"},
                        _IGNORED_OFFLOAD, out)
        if "pin_memory" in section:
            _bool(section["pin_memory"], f"zero_optimization.{key}.pin_memory")
        device = section.get("device", "cpu")
        if device not in ("cpu", "nvme", "none"):
            raise ConfigError(f"zero_optimization.{key}.device {device!r}: "
                              f"use cpu or nvme")
        setattr(out, attr, "nvme" if device == "nvme" else "host")
        path = _nvme_path(section.get("nvme_path"), key)
        if path and out.nvme_path and str(path) != out.nvme_path:
            raise ConfigError(
                f"offload_param.nvme_path {out.nvme_path} and "
                f"offload_optimizer.nvme_path {path} differ: strata keeps "
                f"one set of swap directories; give both the same")
        if path:
            out.nvme_path = str(path)


def _nvme_path(path: Any, key: str) -> Optional[str]:
    """One directory, or several (one per drive) as a list or joined with
    ':', as one ':'-joined string: the engine spreads its swap files over
    them."""
    if isinstance(path, (list, tuple)):
        if not all(isinstance(p, (str, PurePath)) and str(p) for p in path):
            raise ConfigError(
                f"zero_optimization.{key}.nvme_path {path!r}: give a "
                f"directory, or a list of directories (one per drive)")
        return ":".join(str(p) for p in path)
    return str(path) if path else None


def _optimizer(opt: Optional[dict[str, Any]], out: Config) -> None:
    if opt is None:
        return
    opt = _take(opt, "optimizer", {"type", "params"}, set(), out)
    out.optimizer_given = True
    kind = str(opt.get("type", "AdamW")).lower()
    if kind not in _OPTIMIZERS:
        raise ConfigError(f"optimizer.type {opt.get('type')!r}: strata runs "
                          f"Adam, AdamW, Adagrad and Lion; pick one")
    params = _take(opt.get("params", {}), "optimizer.params",
                   {"lr", "betas", "eps", "weight_decay", "adam_w_mode",
                    "lr_decay", "bias_correction", "torch_adam"},
                   set(), out)
    out.algo = _OPTIMIZERS[kind]
    for key in ("adam_w_mode", "bias_correction", "torch_adam"):
        if key in params:
            _bool(params[key], f"optimizer.params.{key}")
    # DeepSpeed's "Adam" decouples weight decay unless adam_w_mode is false.
    if kind == "adam" and not params.get("adam_w_mode", True):
        out.algo = "adam"
    if not params.get("bias_correction", True):
        raise ConfigError("optimizer.params.bias_correction false: strata's "
                          "Adam always corrects the bias; remove the key")
    if out.algo == "adagrad":  # DeepSpeedCPUAdagrad's defaults
        out.lr, out.eps = 1e-2, 1e-10
    where = "optimizer.params."
    out.lr = _number(params.get("lr", out.lr), where + "lr")
    betas = params.get("betas", out.betas)
    if not isinstance(betas, (list, tuple)) or len(betas) != 2:
        raise ConfigError(f"{where}betas: {betas!r} is not two numbers")
    out.betas = (_number(betas[0], where + "betas"),
                 _number(betas[1], where + "betas"))
    out.eps = _number(params.get("eps", out.eps), where + "eps")
    out.weight_decay = _number(params.get("weight_decay", 0.0),
                               where + "weight_decay")
    out.lr_decay = _number(params.get("lr_decay", 0.0), where + "lr_decay")


def _precision(raw: dict[str, Any], out: Config) -> None:
    bf16 = raw.pop("bf16", None) or {}
    bf16 = raw.pop("bfloat16", None) or bf16
    fp16 = raw.pop("fp16", None) or {}
    bf16 = _take(bf16, "bf16", {"enabled"}, set(), out)
    fp16 = _take(fp16, "fp16", {"enabled", "loss_scale", "initial_scale_power",
                                "loss_scale_window", "hysteresis",
                                "consecutive_hysteresis", "min_loss_scale",
                                "auto_cast", "fp16_master_weights_and_grads"},
                 set(), out)
    for name, section in (("bf16", bf16), ("fp16", fp16)):
        for key in ("enabled", "auto_cast", "fp16_master_weights_and_grads",
                    "consecutive_hysteresis"):
            if key in section:
                section[key] = _bool(section[key], f"{name}.{key}")
    if bf16.get("enabled") and fp16.get("enabled"):
        raise ConfigError("bf16.enabled and fp16.enabled are both true; "
                          "enable one")
    if bf16.get("enabled"):
        out.dtype = "bf16"
    for key in ("auto_cast", "fp16_master_weights_and_grads"):
        if fp16.get(key):
            raise ConfigError(f"fp16.{key} true: strata keeps fp32 master "
                              f"weights and computes in the model's own "
                              f"code; remove the key or set it false")
    if fp16.get("enabled"):
        out.dtype = "fp16"
        out.fp16 = {
            "loss_scale": float(fp16.get("loss_scale", 0)),
            "initial_scale_power": float(fp16.get("initial_scale_power", 16)),
            "loss_scale_window": float(fp16.get("loss_scale_window", 1000)),
            "hysteresis": float(fp16.get("hysteresis", 2)),
            "consecutive_hysteresis": float(
                fp16.get("consecutive_hysteresis", False)),
            "min_loss_scale": float(fp16.get("min_loss_scale", 1))}


def _scheduler(sched: dict[str, Any], out: Config) -> None:
    sched = _take(sched, "scheduler", {"type", "params"}, set(), out)
    kind = sched.get("type")
    if kind not in _SCHEDULERS:
        raise ConfigError(f"scheduler.type {kind!r}: strata runs "
                          f"{', '.join(sorted(_SCHEDULERS))}")
    out.scheduler = (kind, dict(sched.get("params", {})))
    try:
        Scheduler(kind, out.scheduler[1], out.lr)
    except (ScheduleError, TypeError, ValueError) as e:
        raise ConfigError(f"{e}; fix scheduler.params") from e


def _strata(block: dict[str, Any], out: Config) -> None:
    # strata.prefetch (before issue #34) is ignored: the engine prefetches
    # the updated weights itself, and the all-gathers always run ahead.
    block = _take(block, "strata",
                  {"device", "device_budget", "host_budget", "nvme_budget",
                   "mode", "groups", "threads", "io_threads", "grad_buffers",
                   "max_consecutive_skips", "rank_timeout", "state_dtype"},
                  {"prefetch"}, out)
    out.device = str(block.get("device", out.device))
    if out.device not in ("auto", "cuda", "host"):
        raise ConfigError(f"strata.device {out.device!r}: use auto, cuda "
                          f"or host")
    for key in ("device_budget", "host_budget", "nvme_budget"):
        if key in block:
            setattr(out, key, parse_bytes(block[key], f"strata.{key}"))
    out.state_dtype = str(block.get("state_dtype", out.state_dtype))
    if out.state_dtype not in ("fp32", "bf16", "int8"):
        raise ConfigError(f"strata.state_dtype {out.state_dtype!r}: use "
                          f"fp32 (exact), bf16 (half the bytes) or int8 "
                          f"(a quarter)")
    if out.state_dtype == "int8" and out.algo not in ("adam", "adamw"):
        raise ConfigError(f"strata.state_dtype int8 steps Adam and AdamW "
                          f"only, not {out.algo}; use fp32 or bf16 state")
    out.mode = str(block.get("mode", out.mode))
    if out.mode not in ("overlap", "after_backward"):
        raise ConfigError(f"strata.mode {out.mode!r}: use overlap or "
                          f"after_backward")
    if block.get("groups") is not None:
        out.groups = [str(name) for name in block["groups"]]
    out.threads = _number(block.get("threads", 0), "strata.threads", int)
    out.grad_buffers = _number(block.get("grad_buffers", out.grad_buffers),
                               "strata.grad_buffers", int)
    out.max_consecutive_skips = _number(
        block.get("max_consecutive_skips", out.max_consecutive_skips),
        "strata.max_consecutive_skips", int)
    if out.max_consecutive_skips < 1:
        raise ConfigError("strata.max_consecutive_skips must be >= 1")
    out.rank_timeout = _number(block.get("rank_timeout", out.rank_timeout),
                               "strata.rank_timeout")
    if out.rank_timeout <= 0:
        raise ConfigError("strata.rank_timeout must be > 0 (seconds a "
                          "collective waits for the other ranks)")
    if block.get("io_threads") is not None:
        out.io_threads = _number(block["io_threads"], "strata.io_threads",
                                 int)
