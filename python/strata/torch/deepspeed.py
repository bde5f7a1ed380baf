"""DeepSpeed's entry points over strata.torch, so that a DeepSpeed training
script runs with one line changed:

    import strata.torch.deepspeed as deepspeed     # was: import deepspeed

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(),
        training_data=dataset)
    with deepspeed.zero.GatheredParameters(model.lm_head.weight,
                                           modifier_rank=0):
        ...

initialize() takes DeepSpeed's arguments and returns its 4-tuple; the
engine is a StrataEngine (engine.py), which has DeepSpeed's engine methods.
Under torchrun (or the deepspeed launcher) init_distributed makes the
process group and initialize partitions the model across the ranks
(strata.torch.ranks).
zero.Init is strata.torch.init: the model's parameters wait on the meta
device and initialize() builds them group by group into strata's tiers.
docs/torch.md, "Coming from DeepSpeed", lists what differs and why."""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed as dist

from strata.torch import init, initialize as _initialize
from strata.torch.config import ConfigError
from strata.torch.engine import StrataEngine
from strata.torch.gathered import GatheredParameters

__all__ = ["initialize", "add_config_arguments", "init_distributed", "zero"]


def initialize(args: Any = None, model: Optional[torch.nn.Module] = None,
               optimizer: Any = None,
               model_parameters: Optional[Iterable[Any]] = None,
               training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int = 29500, mpu: Any = None,
               dist_init_required: Optional[bool] = None,
               collate_fn: Optional[Callable[..., Any]] = None,
               config: Any = None, mesh_param: Any = None,
               config_params: Any = None
               ) -> tuple[StrataEngine, Any, Any, Any]:
    """DeepSpeed's initialize: (engine, engine.optimizer, a DataLoader of
    training_data or None, engine.lr_scheduler). The config comes from
    `config`, `config_params` or args.deepspeed_config; `optimizer` (a
    torch optimizer, or a callable that builds one from the parameters) and
    `model_parameters` give the param groups, `lr_scheduler` (a scheduler
    or a callable taking the optimizer) the schedule."""
    if model is None:
        raise ConfigError("deepspeed.initialize needs model=")
    if mpu is not None or mesh_param is not None:
        raise ConfigError("mpu / mesh_param: strata runs data parallelism "
                          "only; remove them")
    config = config if config is not None else config_params
    if config is None:
        config = getattr(args, "deepspeed_config", None)
    if config is None:
        raise ConfigError(
            "no DeepSpeed config: pass config= (a dict or a JSON path), or "
            "--deepspeed_config with deepspeed.add_config_arguments")
    if callable(optimizer) and not isinstance(optimizer,
                                              torch.optim.Optimizer):
        optimizer = optimizer(list(model_parameters or model.parameters()))
        model_parameters = None
    engine = _initialize(model, config, optimizer=optimizer,
                         model_parameters=model_parameters,
                         lr_scheduler=lr_scheduler)
    loader = None
    if training_data is not None:  # each rank its part, as DeepSpeed's
        sampler = torch.utils.data.DistributedSampler(
            training_data, num_replicas=engine.world_size,
            rank=engine.global_rank) if engine.world_size > 1 else None
        loader = torch.utils.data.DataLoader(
            training_data,
            batch_size=engine.train_micro_batch_size_per_gpu(),
            shuffle=sampler is None, sampler=sampler, collate_fn=collate_fn)
    return engine, engine.optimizer, loader, engine.lr_scheduler


def add_config_arguments(parser: argparse.ArgumentParser
                         ) -> argparse.ArgumentParser:
    """DeepSpeed's --deepspeed and --deepspeed_config."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (strata.torch here)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed JSON configuration file")
    return parser


def init_distributed(dist_backend: Optional[str] = None,
                     auto_mpi_discovery: bool = True,
                     distributed_port: int = 29500, verbose: bool = True,
                     timeout: Any = None, init_method: Any = None,
                     dist_init_required: Optional[bool] = None,
                     config: Any = None, rank: int = -1,
                     world_size: int = -1) -> None:
    """DeepSpeed's: the default process group from the launcher's
    environment (torchrun's or deepspeed's), NCCL with a GPU and gloo
    without unless dist_backend says; nothing at one rank or when it is
    made already."""
    world = world_size if world_size > 0 else \
        int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        return
    backend = dist_backend or ("nccl" if torch.cuda.is_available()
                               else "gloo")
    dist.init_process_group(
        backend, init_method=init_method, timeout=timeout,
        rank=rank if rank >= 0 else int(os.environ["RANK"]),
        world_size=world)


class _Init(init):
    """deepspeed.zero.Init with DeepSpeed's arguments: strata.torch.init
    over the config (config_dict_or_path, or config); the placement
    arguments (remote_device, pin_memory, ...) are the config's business
    in strata and are ignored."""

    def __init__(self, module: Any = None, data_parallel_group: Any = None,
                 mem_efficient_linear: bool = True, remote_device: Any = None,
                 pin_memory: bool = False, config_dict_or_path: Any = None,
                 config: Any = None, enabled: bool = True,
                 dtype: Any = None, mpu: Any = None, **kwargs: Any) -> None:
        if module is not None:
            raise ConfigError(
                "zero.Init(module=...) partitions a model built already; "
                "strata.torch.initialize(model, config) takes such a model "
                "as it is: drop the module argument")
        super().__init__(config_dict_or_path if config is None else config,
                         enabled=enabled)


class zero:  # noqa: N801 (DeepSpeed's name)
    """deepspeed.zero's Init and GatheredParameters."""
    Init = _Init
    GatheredParameters = GatheredParameters
