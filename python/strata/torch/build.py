"""Models larger than host memory (issue #32): a model built under init()
has its large parameters on the meta device, and initialize() makes each
group real only while it writes that group into strata's tiers, from the
modules' own initializers or from safetensors files.

    with strata.torch.init(config):
        model = MyModel(cfg)                 # no weight memory yet
    engine = strata.torch.initialize(model, config)   # group by group
    engine = strata.torch.initialize(model, config,
                                     init_from="model.safetensors")

Note [Materializing a group]
Under init(), every parameter of two or more dimensions goes to the meta
device as its module registers it (one-dimensional ones, biases and norm
weights, a small share of any model, stay real, with the values their
constructors gave them; buffers stay real too). initialize() then writes
group after group (strata.torch.groups): it gives the group's meta
parameters real memory filled with NaN, runs the initializers of every
module that holds one of the group's parameters, children before parents
(nn.Module.apply's order): the module's reset_parameters(), then the
model's _init_weights(module) (transformers' models and nanoGPT-style ones
have it); overwrites what the weights file holds; writes the group into
strata and puts its parameters back on the meta device before the next
group. An initializer meets the other groups' parameters on the meta
device, where torch computes nothing and draws no random numbers. A meta
parameter still NaN afterwards had no initializer: an error names it. So
host memory holds one group at a time beyond strata's own budget.

The random numbers are drawn in a forked RNG that starts from the state
the first parameter was registered in under init() (so a seed set inside
the with block counts; the caller's RNG is left as it was), group by
group in the plan's order: the same seed gives the same weights whatever
the placement. A model whose parameters are initialized by their modules'
reset_parameters() alone, as they are constructed, gets exactly the
weights of the same model built in memory; one whose constructor
initializes twice (an init pass after the modules are built, as
transformers' post_init) draws different but equally distributed ones, as
the numbers the first pass drew are never drawn."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional, Union

import torch
from torch import nn

from strata.torch import safetensors_io
from strata.torch.config import ConfigError
from strata.torch.groups import GroupPlan
from strata.torch.weights import set_memory

_META = torch.device("meta")
_original_register = nn.Module.register_parameter


class init:  # noqa: N801 (a context manager named as DeepSpeed's zero.Init)
    """Builds the modules created inside it with their parameters of two or
    more dimensions on the meta device (Note [Materializing a group]);
    strata.torch.initialize() materializes them into strata's tiers.
    `config` (a ds_config path or dict) is accepted for symmetry with
    deepspeed.zero.Init; `enabled=False` builds as usual. While it is
    entered, modules built by any thread are built so (it patches
    nn.Module.register_parameter, as DeepSpeed's zero.Init patches module
    construction); nested contexts share the outermost one's RNG state."""

    _depth = 0  # nested contexts patch once

    def __init__(self, config: Any = None, *, enabled: bool = True) -> None:
        self.config = config
        self.enabled = enabled
        self.rng: Optional[torch.Tensor] = None

    def __enter__(self) -> "init":
        if not self.enabled:
            return self
        if init._depth == 0:
            nn.Module.register_parameter = _registering(self)
        init._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        init._depth -= 1
        if init._depth == 0:
            nn.Module.register_parameter = _original_register


def _registering(context: init) -> Any:
    def register_parameter(module: nn.Module, name: str,
                           param: Optional[nn.Parameter]) -> None:
        _original_register(module, name, param)
        if param is None:
            return
        if context.rng is None:  # the state the first module starts from
            context.rng = torch.get_rng_state()
        module._strata_init_rng = context.rng  # type: ignore[attr-defined]
        if param.dim() >= 2 and not param.is_meta:
            module._parameters[name] = type(param)(
                param.detach().to(_META), requires_grad=param.requires_grad)
    return register_parameter


def init_rng(model: nn.Module) -> torch.Tensor:
    """The RNG state of the model's first parameter under init() (the
    current state for meta parameters made otherwise)."""
    for module in model.modules():
        rng = getattr(module, "_strata_init_rng", None)
        if rng is not None:
            return rng
    return torch.get_rng_state()


class Materializer:
    """Each group's values for initialize(): the parameters' own, the
    initializers' for meta ones, the weights file's where it has them
    (Note [Materializing a group])."""

    def __init__(self, model: nn.Module, plans: list[GroupPlan],
                 init_from: Union[None, str, os.PathLike],
                 strict: bool) -> None:
        self.model = model
        self.source = None
        if init_from is not None:
            self.source = safetensors_io.Source(init_from)
            self.source.check(model, plans, strict)
        self.rng: Optional[torch.Tensor] = None
        if any(p.is_meta for p in model.parameters()):
            self.rng = init_rng(model)
        if self.source is not None:
            self.source.load_buffers(model)

    @contextlib.contextmanager
    def group(self, plan: GroupPlan) -> Iterator[dict[str, torch.Tensor]]:
        """The group's values by parameter name, real only inside."""
        meta = [p for _, p in plan.params if p.is_meta]
        try:
            if meta:
                self._initialize(plan, meta)
            values = {name: p.detach() for name, p in plan.params}
            if self.source is not None:
                values.update(self.source.read(plan))
            yield values
        finally:
            for p in meta:
                set_memory(p, torch.empty(p.shape, dtype=p.dtype, device=_META))

    def _initialize(self, plan: GroupPlan, meta: list[nn.Parameter]) -> None:
        for p in meta:
            set_memory(p, torch.full(p.shape, float("nan"), dtype=p.dtype))
        ids = {id(p) for p in meta}
        unloaded = [(name, p) for name, p in plan.params if id(p) in ids
                    and not (self.source and self.source.has(name))]
        if not unloaded:
            return  # the file gives every one of them
        members = {id(p) for _, p in plan.params}
        run = getattr(self.model, "_init_weights", None)
        with torch.random.fork_rng(devices=[]):
            assert self.rng is not None
            torch.set_rng_state(self.rng)
            with torch.no_grad():
                for module in _post_order(self.model):
                    if not any(id(q) in members
                               for q in module.parameters()):
                        continue
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()
                    if run is not None:
                        run(module)
            self.rng = torch.get_rng_state()
        for name, p in unloaded:
            if bool(torch.isnan(p.detach()).any()):
                raise ConfigError(
                    f"parameter {name} was built on the meta device (under "
                    f"strata.torch.init) and no initializer set it: give "
                    f"its module a reset_parameters(), or the model an "
                    f"_init_weights(module) that initializes it, or load it "
                    f"with init_from")


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module
