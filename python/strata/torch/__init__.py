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
by a placeholder (Note [Managed parameters] in weights.py): from then on
strata holds the weights, the module hooks (strata.torch.hooks) point the
parameters at fetched copies while their modules run, and model.state_dict()
reads the real values. strata.torch.deepspeed runs DeepSpeed scripts with
their import line changed."""
from __future__ import annotations

import atexit
import os
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

import strata
from strata.torch import optim, weights
from strata.torch.build import Materializer, init
from strata.torch.config import Config, ConfigError, load
from strata.torch.engine import StrataEngine
from strata.torch.flat import Flat, shard_size
from strata.torch.gathered import GatheredParameters
from strata.torch.groups import GroupPlan, UnitPlan, dtype_name, plan
from strata.torch.hooks import Group, Runtime
from strata.torch.optim import StrataOptimizer
from strata.torch.ranks import SHARD, CollectiveStats, Ranks, discover
from strata.torch.schedule import ConfigScheduler, Scheduler

__all__ = ["initialize", "init", "StrataEngine", "StrataOptimizer",
           "GatheredParameters", "Config", "ConfigError", "load",
           "CollectiveStats"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16}
_MIB = 1 << 20
# EngineOptions::swap_files: the NVMe tier spreads chunks over this many
# files of a quarter of its budget each, round robin.
_SWAP_FILES = 4
_STATES = {"adam": ("state1", "state2"), "adamw": ("state1", "state2"),
           "adagrad": ("state1",), "lion": ("state1",)}
# Engines not closed yet: their swap files go at the interpreter's exit.
# A forked child's exit must not free its parent's engines.
_open: "weakref.WeakSet[StrataEngine]" = weakref.WeakSet()
os.register_at_fork(after_in_child=_open.clear)


def initialize(model: nn.Module,
               config: Union[str, os.PathLike, dict[str, Any], Config],
               *, groups: Optional[list[str]] = None,
               optimizer: Optional[torch.optim.Optimizer] = None,
               model_parameters: Optional[Iterable[Any]] = None,
               lr_scheduler: Any = None,
               init_from: Union[None, str, os.PathLike] = None,
               strict: bool = True,
               process_group: Any = None) -> StrataEngine:
    """Hands `model`'s parameters to strata and returns the engine that
    trains it. `config` is a ds_config.json path, its dict, or a Config;
    `groups` (or the config's strata.groups) names the modules that each
    fetch one group, overriding the default (the blocks of the largest
    nn.ModuleList, then the other top-level modules). `optimizer` (a torch
    AdamW, Adam, Adagrad or Lion) is taken over with its param groups, or
    `model_parameters` (a list of parameters or of param-group dicts) gives
    the param groups of the config's optimizer; `lr_scheduler` is a
    scheduler built on that optimizer, or a callable that builds one on
    engine.optimizer. A model built under init() is made real group by
    group as strata takes it (Note [Materializing a group] in build.py);
    `init_from` (a safetensors file, or a directory with model.safetensors
    or a sharded set and its index) gives the weights, matched to the
    parameters by name: with `strict`, a parameter missing from the files
    or a tensor matching nothing is an error; a misshapen one always is.
    Under torchrun (or with a default process group, or `process_group`)
    each rank holds its partition of every group (Note [Partitions] in
    ranks.py) and the ranks train data-parallel."""
    if getattr(model, "_strata_engine", None) is not None:
        raise ConfigError(
            "this model is already trained through a strata.torch engine; "
            "close that one first (engine.close() puts the weights back)")
    cfg = config if isinstance(config, Config) else load(config)
    if cfg.ignored:
        warnings.warn("strata.torch: these config keys do not change what "
                      "strata computes and are ignored: "
                      + ", ".join(sorted(cfg.ignored)), stacklevel=2)
    facade, cfg.algo = optim.build(model, cfg, optimizer, model_parameters)
    plans, units = plan(model, groups or cfg.groups,
                        optim.group_index(facade))
    scheduler = _scheduler(cfg, facade, lr_scheduler)
    dtype = _DTYPES[cfg.dtype]
    ranks = discover(process_group, cfg.stage, _backend(cfg),
                     cfg.rank_timeout)
    _check_grad_buffers(cfg, plans, units, ranks.sharded())
    _check_nvme(cfg, ranks)
    source = Materializer(model, plans, init_from, strict)
    store = strata.Engine(**_engine_options(cfg, plans, dtype, ranks))
    try:
        runtime = _runtime(store, cfg, plans, units, dtype, source, ranks)
    except BaseException:
        store.close()
        raise
    device = runtime.device
    for buffer in model.buffers():
        buffer.data = buffer.data.to(device)
    for group in runtime.groups:
        for (_, p), empty in zip(group.plan.params, group.placeholders):
            weights.manage(p, runtime, empty)
            p.grad = None
    runtime.install()
    engine = StrataEngine(model, cfg, store, runtime, facade, scheduler)
    runtime.handles += weights.install_state_dict_hooks(runtime, engine)
    model._strata_engine = engine
    _open.add(engine)
    return engine


def _runtime(store: strata.Engine, cfg: Config, plans: list[GroupPlan],
             units: list[UnitPlan], dtype: torch.dtype,
             source: Materializer, ranks: Ranks) -> Runtime:
    """The groups registered and written, and the hooks' state over them
    with strata's optimizer (every step skipped exactly on non-finite
    gradients: Note [Recovery] in engine.py)."""
    flats = [Flat(p.name, [t.shape for _, t in p.params], ranks)
             if ranks.sharded() else None for p in plans]
    ids = [_register(store, cfg, p, dtype, flat)
           for p, flat in zip(plans, flats)]
    for gid, p, flat in zip(ids, plans, flats):
        with source.group(p) as values:
            if flat is not None:
                values = {SHARD: flat.pack([values[n] for n, _ in p.params])}
            _write_weights(store, gid, values)
    device = _torch_device(store)
    records = []
    for gid, p, flat in zip(ids, plans, flats):
        roles = _roles(cfg, p.trainable)
        records.append(Group(
            gid, p, [weights.placeholder(t.shape, dtype, device)
                     for _, t in p.params],
            [t.dtype for _, t in p.params], roles, "master" in roles,
            flat=flat))
    runtime = Runtime(store, device, records, units)
    runtime.ranks = ranks
    runtime.optimizer = strata.Optimizer(
        store, algo=cfg.algo, mode=cfg.mode,
        micro_batches=cfg.accumulation, clip_norm=cfg.clip_norm,
        skip_on_overflow=True, threads=cfg.threads,
        grad_buffers=cfg.grad_buffers)
    return runtime


def _scheduler(cfg: Config, facade: StrataOptimizer, given: Any) -> Any:
    """engine.lr_scheduler: the config's, or the one passed in (built on
    the optimizer passed in, which engine.optimizer shares), or one a
    callable passed in builds on engine.optimizer."""
    if given is not None and cfg.scheduler is not None:
        raise ConfigError(
            "an lr_scheduler was passed to initialize and the config has a "
            "\"scheduler\" section; keep one of them")
    if cfg.scheduler is not None:
        kind, params = cfg.scheduler
        return ConfigScheduler(Scheduler(kind, params, cfg.lr), facade)
    if given is not None and not hasattr(given, "step"):
        return given(facade)
    return given


@atexit.register
def _free_at_exit() -> None:
    """Swap files go at a normal exit too, not only at close()."""
    for engine in list(_open):
        engine.free()


def _check_grad_buffers(cfg: Config, plans: list[GroupPlan],
                        units: list[UnitPlan], sharded: bool) -> None:
    """On one rank backward holds a gradient buffer for each trainable
    group of the unit running and for each shared group (tied weights)
    whose gradient is not final until its last user ran: fewer buffers
    would wait forever. Across ranks one at a time (Note [When gradients
    get a buffer] in handoff.py)."""
    users: dict[int, int] = {}
    for unit in units:
        for g in unit.groups:
            users[g] = users.get(g, 0) + 1
    shared = sum(1 for g, n in users.items()
                 if n > 1 and plans[g].trainable)
    widest = max((sum(plans[g].trainable for g in u.groups) for u in units),
                 default=0)
    needed = 1 if sharded else max(1, shared + widest)
    why = "across ranks backward holds one at a time" if sharded else (
        f"backward holds up to {needed} at once ({shared} shared by "
        f"several modules, {widest} of one module)")
    if cfg.grad_buffers < needed:
        raise ConfigError(
            f"strata.grad_buffers {cfg.grad_buffers} is too few for this "
            f"model: {why}; set it to {needed} or more")


def _backend(cfg: Config) -> str:
    """The collectives' backend: NCCL for a GPU, gloo on the host."""
    cuda = cfg.device == "cuda" or (cfg.device == "auto"
                                    and torch.cuda.is_available())
    return "nccl" if cuda else "gloo"


def _check_nvme(cfg: Config, ranks: Ranks) -> None:
    """A clear error for a missing or unwritable nvme_path; across ranks
    each swaps in its own subdirectory rank-<r> of it. Several directories,
    one per drive, separated by ':' (or given as a list), get the swap
    files spread over them (Note [Several swap directories] in
    src/tier/nvme_store.cc)."""
    if "nvme" not in (cfg.param_tier, cfg.state_tier):
        return
    if not cfg.nvme_path:
        raise ConfigError(
            "offload to nvme needs zero_optimization.offload_optimizer."
            "nvme_path (or offload_param.nvme_path): a directory on the "
            "NVMe drive for strata's swap file")
    paths = [Path(p) for p in cfg.nvme_path.split(":") if p]
    for path in paths:
        _check_swap_dir(path)
    if ranks.sharded():
        own = [path / f"rank-{ranks.rank}" for path in paths]
        for path in own:
            path.mkdir(exist_ok=True)
        cfg.nvme_path = ":".join(str(path) for path in own)


def _check_swap_dir(path: Path) -> None:
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
    """A frozen group keeps an fp32 master beside a narrower compute copy,
    so that close() gives its weights back exactly. A trained group keeps
    its fp32 gradients (grad) until the step's global checks say whether
    it stands (every step is skipped exactly on non-finite gradients)."""
    if not trainable:
        return ["compute"] if cfg.dtype == "fp32" else ["compute", "master"]
    master = ["master"] if cfg.master_weights else []
    return ["compute", *master, *_STATES[cfg.algo], "grad"]


def _numel(p: GroupPlan, ranks: Ranks) -> int:
    """Elements of the group this process registers: all, or its shard."""
    if ranks.sharded():
        return shard_size([t.shape for _, t in p.params], ranks.world)
    return sum(t.numel() for _, t in p.params)


def _group_bytes(cfg: Config, p: GroupPlan, dtype: torch.dtype,
                 ranks: Ranks) -> tuple[int, int]:
    """(compute bytes, bytes of every other role) of one group."""
    numel = _numel(p, ranks)
    compute = numel * torch.empty(0, dtype=dtype).element_size()
    roles = [r for r in _roles(cfg, p.trainable) if r != "compute"]
    states = sum(r.startswith("state") for r in roles)
    return compute, 4 * numel * (len(roles) - states) + states * _state_bytes(
        cfg, [numel] if ranks.sharded() else
        [t.numel() for _, t in p.params])


def _state_bytes(cfg: Config, tensors: list[int]) -> int:
    """Bytes of one state role of tensors of these sizes (Note [8-bit
    state] in strata/cpu_adam.h; src/store/layout.h packs them), an upper
    bound."""
    if cfg.state_dtype != "int8":
        return sum(tensors) * (2 if cfg.state_dtype == "bf16" else 4)
    return sum(-(-n // 256) * 260 + 256 if n >= 4096 else 4 * n + 256
               for n in tensors)


def _engine_options(cfg: Config, plans: list[GroupPlan],
                    dtype: torch.dtype, ranks: Ranks) -> dict[str, Any]:
    """Budgets the config leaves out, from the model's sizes: the device
    holds every compute copy and the gradient buffers (set device_budget
    to stream a model larger than the GPU); the host holds what is homed
    there and the staging of the largest groups (none for fp32 gradients
    of one micro-batch, which go straight into their accumulators: Note
    [Gradients straight into the accumulator] in
    src/optim/pipeline_worker.cc), or, with the gradients
    homed on NVMe, every group's gradients (a step keeps them until its
    global checks say whether it stands; written down meanwhile, they
    would be bytes written for nothing) beside the largest group's other
    roles, whichever is more; NVMe what is homed there and a largest
    chunk for each swap file (the chunks go to the files round robin, so
    one file may fill while the others keep space), twice when steps
    speculate (they write a second copy)."""
    sizes = [_group_bytes(cfg, p, dtype, ranks) for p in plans]
    compute = sum(c for c, _ in sizes)
    state = sum(s for _, s in sizes)
    largest = max((c + s for c, s in sizes), default=0)
    largest_compute = max((c for c, _ in sizes), default=0)
    grads = [4 * _numel(p, ranks) if p.trainable else 0 for p in plans]
    kept = sum(grads) if cfg.state_tier == "nvme" else 0
    beside = max((c + s - g for (c, s), g in zip(sizes, grads)), default=0)
    homed = {"host": 0, "nvme": 0}
    homed[cfg.param_tier] += compute
    homed[cfg.state_tier] += state
    device = compute + (cfg.grad_buffers + 2) * largest_compute + 64 * _MIB
    staged = dtype != torch.float32 or cfg.accumulation > 1
    host = (homed["host"] + max(4 * largest, kept + beside)
            + (cfg.grad_buffers * largest_compute if staged else 0)
            + 64 * _MIB)
    copies = 2 if cfg.speculates else 1
    # Each swap file may end with up to a chunk it could not place.
    slack = _SWAP_FILES * max((4 * _numel(p, ranks) for p in plans),
                              default=0)
    nvme = copies * (homed["nvme"] + slack) + 64 * _MIB \
        if homed["nvme"] else 0
    return {"device": cfg.device, "cuda_device": ranks.cuda,
            "device_budget": _pick(cfg.device_budget, device),
            "host_budget": _pick(cfg.host_budget, host),
            "nvme_budget": _pick(cfg.nvme_budget, nvme),
            "swap_dir": cfg.nvme_path if homed["nvme"] else None,
            "home": cfg.homes(), "io_threads": cfg.io_threads,
            "state_dtype": cfg.state_dtype,
            "device_roles": "compute"}  # the optimizer is on the CPU


def _pick(given: Optional[int], default: int) -> int:
    return default if given is None else given


def _register(store: strata.Engine, cfg: Config, p: GroupPlan,
              dtype: torch.dtype, flat: Optional[Flat]) -> int:
    tensors = [(name, tuple(t.shape), dtype_name(dtype))
               for name, t in p.params] if flat is None else \
        [(SHARD, (flat.shard,), dtype_name(dtype))]
    return store.register_group(p.name, tensors,
                                roles=_roles(cfg, p.trainable))


def _write_weights(store: strata.Engine, gid: int,
                   values: dict[str, torch.Tensor]) -> None:
    """The group's weights into the compute copy (rounded) and master
    (fp32); optimizer state and accumulators zero."""
    with store.fetch(gid, "host", write=True) as view:
        for info in view.tensors:
            target = torch.from_dlpack(view.export(info.name, info.role))
            if info.role in ("compute", "master"):
                target.copy_(values[info.name].reshape(target.shape))
            else:
                target.zero_()


def _torch_device(store: strata.Engine) -> torch.device:
    info = store.info()
    if info["on_cuda"]:
        return torch.device("cuda", info["cuda_device"])
    return torch.device("cpu")
