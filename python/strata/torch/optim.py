"""engine.optimizer: strata's CPU optimizer seen as a torch.optim.Optimizer,
so that code written for one works: its param_groups carry each group's
lr, betas, eps and weight decay, which a user or a torch LR scheduler
(LambdaLR, ...) may change and the next step honours; the steps themselves
are strata's (engine.step()).

The param groups come from the config's "optimizer" section (one group of
every trainable parameter), from `model_parameters` (lists or param-group
dicts, as torch optimizers take them), or from a torch optimizer passed in,
whose algorithm, hyperparameters and param groups strata takes over (its
param_groups list is shared, so a scheduler built on it goes on working)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn

from strata._native import StrataError
from strata.torch.config import Config, ConfigError

# torch optimizer classes strata runs, by name: the algorithm, and the
# options of a param group that would change the result if ignored.
_TAKEN = {"AdamW": "adamw", "Adam": "adam", "Adagrad": "adagrad",
          "Lion": "lion"}
_UNSUPPORTED = {"amsgrad": False, "maximize": False, "nesterov": False,
                "initial_accumulator_value": 0, "differentiable": False}


class StrataOptimizer(torch.optim.Optimizer):
    """The param groups strata steps; see the module docstring."""

    def __init__(self, param_groups: list[dict[str, Any]], algo: str,
                 defaults: dict[str, Any]) -> None:
        super().__init__(param_groups, defaults)
        self.algo = algo

    @classmethod
    def sharing(cls, client: torch.optim.Optimizer,
                algo: str) -> "StrataOptimizer":
        """One over `client`'s own param_groups list (shared)."""
        out = cls.__new__(cls)
        out.__dict__.update(client.__dict__)
        out.algo = algo
        return out

    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:
        raise StrataError(9, "failed precondition", (
            "strata.torch: the optimizer steps inside engine.step() (each "
            "group on the CPU as soon as its gradients are complete); call "
            "engine.step() instead of engine.optimizer.step()"))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: the gradients are strata's (engine.step()
        consumed them)."""

    def hyper(self, index: int) -> dict[str, float]:
        """Param group `index`'s hyperparameters, as strata's begin_step
        takes them."""
        group = self.param_groups[index]
        beta1, beta2 = group.get("betas", (0.9, 0.999))
        return {"lr": float(group["lr"]), "beta1": float(beta1),
                "beta2": float(beta2), "eps": float(group.get("eps", 1e-8)),
                "weight_decay": float(group.get("weight_decay", 0.0)),
                "lr_decay": float(group.get("lr_decay", 0.0))}


def config_defaults(cfg: Config) -> dict[str, Any]:
    """The config's optimizer hyperparameters as a param group's keys."""
    return {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps,
            "weight_decay": cfg.weight_decay, "lr_decay": cfg.lr_decay}


def build(model: nn.Module, cfg: Config, client: Optional[Any],
          model_parameters: Optional[Iterable[Any]]
          ) -> tuple[StrataOptimizer, str]:
    """engine.optimizer and its algorithm, from the client optimizer, the
    model_parameters, or the config."""
    if client is not None:
        if cfg.optimizer_given:
            raise ConfigError(
                "an optimizer was passed to initialize and the config has "
                "an \"optimizer\" section; keep one of them")
        algo = _algorithm(client)
        for index, group in enumerate(client.param_groups):
            _check_group(group, index, type(client).__name__)
        out = StrataOptimizer.sharing(client, algo)
    else:
        defaults = config_defaults(cfg)
        groups = _param_groups(model, model_parameters)
        out = StrataOptimizer(groups, cfg.algo, defaults)
        algo = cfg.algo
    _check_covers(model, out)
    return out, algo


def _algorithm(client: Any) -> str:
    name = type(client).__name__
    if name not in _TAKEN:
        raise ConfigError(
            f"optimizer {name}: strata runs AdamW, Adam, Adagrad and Lion on "
            f"the CPU; pass one of those (or leave the optimizer to the "
            f"config's \"optimizer\" section)")
    algo = _TAKEN[name]
    if algo == "adam" and any(g.get("decoupled_weight_decay")
                              for g in client.param_groups):
        algo = "adamw"
    return algo


def _check_group(group: dict[str, Any], index: int, name: str) -> None:
    for key, plain in _UNSUPPORTED.items():
        if group.get(key, plain) != plain:
            raise ConfigError(
                f"optimizer {name}: param group {index} sets {key}="
                f"{group[key]!r}, which strata's optimizer does not run; "
                f"leave it at {plain!r}")


def _param_groups(model: nn.Module, given: Optional[Iterable[Any]]
                  ) -> list[dict[str, Any]]:
    if given is None:
        return [{"params": [p for p in model.parameters()
                            if p.requires_grad]}]
    given = list(given)
    if given and isinstance(given[0], dict):
        return [dict(g, params=list(g["params"])) for g in given]
    return [{"params": given}]


def _check_covers(model: nn.Module, optimizer: StrataOptimizer) -> None:
    """Every trainable parameter is in exactly one param group."""
    seen: dict[int, int] = {}
    for index, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            seen[id(p)] = index
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            raise ConfigError(
                f"parameter {name} needs gradients but is in no param group "
                f"of the optimizer; add it to one, or set its requires_grad "
                f"to False to freeze it")


def group_index(optimizer: StrataOptimizer) -> Callable[[nn.Parameter], int]:
    """A parameter's param group, for strata.torch.groups.plan."""
    index = {id(p): i for i, g in enumerate(optimizer.param_groups)
             for p in g["params"]}
    return lambda p: index[id(p)]
