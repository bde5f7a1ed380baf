"""strata.torch: train a PyTorch model through strata, driven like
DeepSpeed's engine, from a DeepSpeed-style config.

    import strata.torch as st
    engine = st.initialize(model, config="ds_config.json")  # or a dict
    for batch in loader:
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("ckpt/")

initialize() splits the model into groups (strata.torch.groups), registers
them with a strata.Engine (compute copies homed where offload_param says,
fp32 master weights and optimizer state where offload_optimizer says),
writes the model's weights into them, and replaces every parameter's memory
by an empty placeholder: from then on strata holds the weights, and the
module hooks (strata.torch.hooks) point the parameters at fetched copies
while their modules run."""
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

import strata
from strata.torch.config import Config, ConfigError, load
from strata.torch.engine import StrataEngine
from strata.torch.groups import GroupPlan, UnitPlan, dtype_name, plan
from strata.torch.hooks import Group, Runtime

__all__ = ["initialize", "StrataEngine", "Config", "ConfigError", "load"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16}
_MIB = 1 << 20
_STATES = {"adam": ("state1", "state2"), "adamw": ("state1", "state2"),
           "adagrad": ("state1",), "lion": ("state1",)}


def initialize(model: nn.Module,
               config: Union[str, os.PathLike, dict[str, Any], Config],
               *, groups: Optional[list[str]] = None) -> StrataEngine:
    """Hands `model`'s parameters to strata and returns the engine that
    trains it. `config` is a ds_config.json path, its dict, or a Config;
    `groups` (or the config's strata.groups) names the modules that each
    fetch one group, overriding the default (the blocks of the largest
    nn.ModuleList, then the other top-level modules)."""
    if getattr(model, "_strata_engine", None) is not None:
        raise ConfigError(
            "this model is already trained through a strata.torch engine; "
            "close that one first (engine.close() puts the weights back)")
    cfg = config if isinstance(config, Config) else load(config)
    if cfg.ignored:
        warnings.warn("strata.torch: these config keys do not change what "
                      "strata computes and are ignored: "
                      + ", ".join(sorted(cfg.ignored)), stacklevel=2)
    plans, units = plan(model, groups or cfg.groups)
    _check_grad_buffers(cfg, plans, units)
    dtype = _DTYPES[cfg.dtype]
    _check_nvme(cfg)
    store = strata.Engine(**_engine_options(cfg, plans, dtype))
    try:
        ids = [_register(store, cfg, p, dtype) for p in plans]
        for gid, p in zip(ids, plans):
            _write_weights(store, gid, p)
        device = _torch_device(store)
        records = [Group(gid, p, [torch.empty(0, dtype=dtype, device=device)
                                  for _ in p.params],
                         [t.dtype for _, t in p.params])
                   for gid, p in zip(ids, plans)]
        runtime = Runtime(store, device, records, units, cfg.prefetch)
        runtime.optimizer = strata.Optimizer(
            store, algo=cfg.algo, mode=cfg.mode,
            micro_batches=cfg.accumulation, clip_norm=cfg.clip_norm,
            skip_on_overflow=cfg.dtype == "fp16", threads=cfg.threads,
            grad_buffers=cfg.grad_buffers)
    except BaseException:
        store.close()
        raise
    for buffer in model.buffers():
        buffer.data = buffer.data.to(device)
    for group in records:
        for (_, p), empty in zip(group.plan.params, group.placeholders):
            p.data = empty
            p.grad = None
    runtime.install()
    engine = StrataEngine(model, cfg, store, runtime)
    model._strata_engine = engine
    return engine


def _check_grad_buffers(cfg: Config, plans: list[GroupPlan],
                        units: list[UnitPlan]) -> None:
    """Backward holds a gradient buffer for each trainable group of the
    unit running and for each shared group (tied weights) whose gradient
    is not final until its last user ran: fewer buffers would wait
    forever."""
    users: dict[int, int] = {}
    for unit in units:
        for g in unit.groups:
            users[g] = users.get(g, 0) + 1
    shared = sum(1 for g, n in users.items()
                 if n > 1 and plans[g].trainable)
    widest = max((sum(plans[g].trainable for g in u.groups) for u in units),
                 default=0)
    needed = max(1, shared + widest)
    if cfg.grad_buffers < needed:
        raise ConfigError(
            f"strata.grad_buffers {cfg.grad_buffers} is too few for this "
            f"model: backward holds up to {needed} at once ({shared} "
            f"shared by several modules, {widest} of one module); set it "
            f"to {needed} or more")


def _check_nvme(cfg: Config) -> None:
    """A clear error for a missing or unwritable nvme_path."""
    if "nvme" not in (cfg.param_tier, cfg.state_tier):
        return
    if not cfg.nvme_path:
        raise ConfigError(
            "offload to nvme needs zero_optimization.offload_optimizer."
            "nvme_path (or offload_param.nvme_path): a directory on the "
            "NVMe drive for strata's swap file")
    path = Path(cfg.nvme_path)
    if not path.is_dir():
        raise ConfigError(
            f"nvme_path {path} is not a directory; create it (mkdir -p "
            f"{path}) or point nvme_path at one on the NVMe drive")
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(
            f"nvme_path {path} is not writable ({e.strerror}); fix its "
            f"permissions or mount, or point nvme_path elsewhere") from e


def _roles(cfg: Config, trainable: bool) -> list[str]:
    if not trainable:
        return ["compute"]
    master = ["master"] if cfg.master_weights else []
    roles = ["compute", *master, *_STATES[cfg.algo]]
    if (cfg.accumulation > 1 or cfg.mode == "after_backward"
            or cfg.clip_norm > 0 or cfg.dtype == "fp16"):
        roles.append("grad")
    return roles


def _group_bytes(cfg: Config, p: GroupPlan, dtype: torch.dtype
                 ) -> tuple[int, int]:
    """(compute bytes, bytes of every other role) of one group."""
    numel = sum(t.numel() for _, t in p.params)
    compute = numel * torch.empty(0, dtype=dtype).element_size()
    return compute, 4 * numel * (len(_roles(cfg, p.trainable)) - 1)


def _engine_options(cfg: Config, plans: list[GroupPlan],
                    dtype: torch.dtype) -> dict[str, Any]:
    """Budgets the config leaves out, from the model's sizes: the device
    holds every compute copy and the gradient buffers (set device_budget
    to stream a model larger than the GPU); the host holds what is homed
    there and the staging of the largest groups; NVMe what is homed there,
    twice when steps speculate (they write a second copy)."""
    sizes = [_group_bytes(cfg, p, dtype) for p in plans]
    compute = sum(c for c, _ in sizes)
    state = sum(s for _, s in sizes)
    largest = max((c + s for c, s in sizes), default=0)
    largest_compute = max((c for c, _ in sizes), default=0)
    homed = {"host": 0, "nvme": 0}
    homed[cfg.param_tier] += compute
    homed[cfg.state_tier] += state
    device = compute + (cfg.grad_buffers + 2) * largest_compute + 64 * _MIB
    host = (homed["host"] + 4 * largest
            + cfg.grad_buffers * largest_compute + 64 * _MIB)
    copies = 2 if cfg.speculates else 1
    nvme = copies * homed["nvme"] + 64 * _MIB if homed["nvme"] else 0
    return {"device": cfg.device,
            "device_budget": _pick(cfg.device_budget, device),
            "host_budget": _pick(cfg.host_budget, host),
            "nvme_budget": _pick(cfg.nvme_budget, nvme),
            "swap_dir": cfg.nvme_path if homed["nvme"] else None,
            "home": cfg.homes(), "io_threads": cfg.io_threads}


def _pick(given: Optional[int], default: int) -> int:
    return default if given is None else given


def _register(store: strata.Engine, cfg: Config, p: GroupPlan,
              dtype: torch.dtype) -> int:
    tensors = [(name, tuple(t.shape), dtype_name(dtype))
               for name, t in p.params]
    return store.register_group(p.name, tensors,
                                roles=_roles(cfg, p.trainable))


def _write_weights(store: strata.Engine, gid: int, p: GroupPlan) -> None:
    """The model's weights into the compute copy (rounded) and master
    (fp32); optimizer state and accumulators zero."""
    with store.fetch(gid, "host", write=True) as view:
        for info in view.tensors:
            target = torch.from_dlpack(view.export(info.name, info.role))
            if info.role in ("compute", "master"):
                source = dict(p.params)[info.name].detach()
                target.copy_(source.reshape(target.shape))
            else:
                target.zero_()


def _torch_device(store: strata.Engine) -> torch.device:
    info = store.info()
    if info["on_cuda"]:
        return torch.device("cuda", info["cuda_device"])
    return torch.device("cpu")
