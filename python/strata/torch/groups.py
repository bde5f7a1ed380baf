"""How a PyTorch model becomes strata groups: which modules fetch (units),
and which parameters each group holds.

Default: each block of the model's largest nn.ModuleList (by parameter
count; the transformer layers) is a unit; so is every other child of the
modules on the path from the root to that list (embeddings, final norm,
head), and each module on that path that has parameters of its own. A
unit fetches the groups of every parameter in its region (its subtree
without the subtrees of other units), also a parameter registered first in
another unit (tied weights: the LM head fetches the embedding's group).
A parameter belongs to the group of the first unit that holds it, so each
is stored once. Frozen parameters (requires_grad False) go into a
separate group of the unit, which has no optimizer state; trainable ones
of different optimizer param groups (weight decay off for biases and
norms, per-layer learning rates) into separate groups too, since a group
steps with one set of hyperparameters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch
from torch import nn


@dataclass
class GroupPlan:
    """One strata group: `params` are (qualified name, parameter);
    `param_group` the optimizer param group they are in (0 when frozen)."""
    name: str
    trainable: bool
    param_group: int = 0
    params: list[tuple[str, nn.Parameter]] = field(default_factory=list)


@dataclass
class UnitPlan:
    """A module whose forward fetches `groups` (indices into the plan)."""
    name: str
    module: nn.Module
    own_children: bool  # False: only its direct parameters are its region
    groups: list[int] = field(default_factory=list)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _largest_list(model: nn.Module) -> Optional[str]:
    best, size = None, 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and _numel(module) > size:
            best, size = name, _numel(module)
    return best


def _default_units(model: nn.Module) -> list[tuple[str, bool]]:
    """(module name, own_children) in forward-ish (definition) order."""
    target = _largest_list(model)
    if target is None:
        units = [(name, True) for name, child in model.named_children()]
        return [("", False)] + units
    path = target.split(".")
    units: list[tuple[str, bool]] = []
    for depth in range(len(path)):
        prefix = ".".join(path[:depth])
        parent = model.get_submodule(prefix)
        units.append((prefix, False))
        for child_name, _ in parent.named_children():
            full = f"{prefix}.{child_name}" if prefix else child_name
            if child_name != path[depth]:
                units.append((full, True))
            elif depth == len(path) - 1:
                lst = model.get_submodule(full)
                units += [(f"{full}.{i}", True) for i in range(len(lst))]
    return units


def _region(model: nn.Module, unit: str, own_children: bool,
            units: set[str]) -> Iterator[nn.Parameter]:
    module = model.get_submodule(unit)
    yield from module.parameters(recurse=False)
    if not own_children:
        return
    stack = [(f"{unit}.{n}" if unit else n, c)
             for n, c in module.named_children()]
    while stack:
        name, child = stack.pop(0)
        if name in units:
            continue
        yield from child.parameters(recurse=False)
        stack += [(f"{name}.{n}", c) for n, c in child.named_children()]


def plan(model: nn.Module, modules: Optional[list[str]] = None,
         param_group: Optional[Callable[[nn.Parameter], int]] = None
         ) -> tuple[list[GroupPlan], list[UnitPlan]]:
    """The groups and units of `model`; `modules` overrides the units (each
    named module is one; parameters outside them go to the root's);
    `param_group` gives a trainable parameter's optimizer param group
    (default: all in 0)."""
    param_group = param_group or (lambda p: 0)
    if modules is None:
        unit_specs = _default_units(model)
    else:
        for name in modules:
            model.get_submodule(name)  # AttributeError names a bad one
        unit_specs = [("", False)] + [(name, True) for name in modules]
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    unit_specs.sort(key=lambda spec: order[spec[0]])
    names = {id(p): n for n, p in model.named_parameters()}
    unit_set = {name for name, own in unit_specs if own}
    groups: list[GroupPlan] = []
    units: list[UnitPlan] = []
    owner: dict[int, int] = {}
    for unit_name, own in unit_specs:
        unit = UnitPlan(unit_name or "<root>", model.get_submodule(unit_name),
                        own)
        region = list(_region(model, unit_name, own, unit_set))
        if modules is not None and unit_name == "":
            region = [p for p in model.parameters() if id(p) not in owner
                      and not _in_units(model, p, unit_set)]
        local: dict[tuple[bool, int], int] = {}
        for p in region:
            if id(p) not in owner:
                trainable = bool(p.requires_grad)
                key = (trainable, param_group(p) if trainable else 0)
                if key not in local:
                    groups.append(GroupPlan(unit.name + _suffix(*key),
                                            trainable, key[1]))
                    local[key] = len(groups) - 1
                owner[id(p)] = local[key]
                groups[local[key]].params.append((names[id(p)], p))
            if owner[id(p)] not in unit.groups:
                unit.groups.append(owner[id(p)])
        if unit.groups:
            units.append(unit)
    missing = [n for n, p in model.named_parameters() if id(p) not in owner]
    if missing:
        raise ValueError(f"parameters {missing[:3]} are in no group; name "
                         f"their modules in strata.groups")
    return groups, units


def _suffix(trainable: bool, param_group: int) -> str:
    if not trainable:
        return " (frozen)"
    return f" (param group {param_group})" if param_group else ""


def _in_units(model: nn.Module, p: nn.Parameter, units: set[str]) -> bool:
    for name in units:
        if any(q is p for q in model.get_submodule(name).parameters()):
            return True
    return False


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16",
            torch.float16: "fp16"}[dtype]
