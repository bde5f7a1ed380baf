"""The model's real weights while strata holds them (issue #30 §3): the
managed parameters' class, which makes a stray read an error instead of a
silent zero, and the ways to read and write the real values:
model.state_dict() (and so torch.save and transformers' save_pretrained)
and save_16bit_model (GatheredParameters is gathered.py's).

Note [Managed parameters]
While strata.torch trains a model, each managed parameter's .data is a
placeholder with the parameter's true shape and dtype but one NaN element
(zero strides), and its class is StrataParameter. Its __torch_function__
lets metadata through (shape, dtype, numel, ...) and every other torch call
only while the parameter's group is fetched (inside its module's forward
or backward, or a GatheredParameters context), else it raises naming the
parameter and how to read it; its .grad raises likewise (gradients live in
strata's buffers, so clip_grad_norm_ on the model used to return 0 and clip
nothing), except for zero_grad. close() puts the real values and the
class back. A read of .data itself goes around the check and meets the
NaN placeholder."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import torch
from torch import nn

from strata._native import StrataError
from strata.torch.ranks import SHARD, fill_from

if TYPE_CHECKING:
    from strata.torch.hooks import Group, Runtime

# Calls that read no value: the guard lets them through.
_METADATA = frozenset({
    "__get__", "__set__", "numel", "nelement", "size", "dim", "ndimension",
    "stride", "element_size", "is_floating_point", "is_complex",
    "requires_grad_", "__hash__", "register_hook",
    "register_post_accumulate_grad_hook"})
# Functions that read .grad only to clear it.
_ZERO_GRAD = frozenset({"zero_grad"})


class StrataParameter(nn.Parameter):
    """A parameter whose values strata holds (Note [Managed
    parameters])."""

    _strata: "Runtime"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") not in _METADATA:
            for p in _managed_in((*args, *kwargs.values())):
                p._strata.check_usable(p, getattr(func, "__name__", "?"))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def __repr__(self) -> str:
        rt = self._strata
        if rt.usable(self):
            with torch._C.DisableTorchFunctionSubclass():
                return torch.Tensor.__repr__(self)
        return (f"Parameter {rt.name_of[id(self)]} held by strata.torch "
                f"(shape {tuple(self.shape)}, {self.dtype}); read it with "
                f"model.state_dict() or strata.torch.GatheredParameters")

    @property  # type: ignore[override]
    def grad(self) -> Optional[torch.Tensor]:
        rt = self._strata
        if not rt.grad_readable(self) and \
                sys._getframe(1).f_code.co_name not in _ZERO_GRAD:
            raise StrataError(9, "failed precondition", (
                f"strata.torch: the gradient of {rt.name_of[id(self)]} is "
                f"strata's (each group's goes to the CPU optimizer as soon "
                f"as it is complete); clip with gradient_clipping in the "
                f"config, and read the norm with "
                f"engine.get_global_grad_norm()"))
        return torch.Tensor.grad.__get__(self)

    @grad.setter
    def grad(self, value: Optional[torch.Tensor]) -> None:
        torch.Tensor.grad.__set__(self, value)


def _managed_in(values: Iterable[Any]) -> Iterator[StrataParameter]:
    for value in values:
        if isinstance(value, StrataParameter):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, StrataParameter))


def set_memory(p: nn.Parameter, value: torch.Tensor) -> None:
    """Gives `p` the memory of `value`, keeping the parameter object (the
    optimizer and tied modules hold it), also from or to the meta
    device."""
    if p.is_meta == value.is_meta:
        p.data = value
        return
    other = type(p)(value, requires_grad=p.requires_grad)
    other.__dict__.update(p.__dict__)  # swap_tensors swaps them too
    torch.utils.swap_tensors(p, other)


def manage(p: nn.Parameter, runtime: "Runtime",
           placeholder: torch.Tensor) -> None:
    """Makes `p` a StrataParameter over `placeholder`."""
    set_memory(p, placeholder)
    p.__class__ = StrataParameter
    p._strata = runtime  # type: ignore[attr-defined]


def unmanage(p: nn.Parameter, value: torch.Tensor) -> None:
    """Gives `p` its real `value` and its class back."""
    p.__class__ = nn.Parameter
    del p._strata  # type: ignore[attr-defined]
    p.data = value


def placeholder(shape: torch.Size, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """The true shape and dtype over one NaN element."""
    return torch.full((), float("nan"), dtype=dtype,
                      device=device).expand(shape)


def read_group(runtime: "Runtime", group: "Group",
               role: Optional[str] = None) -> list[torch.Tensor]:
    """Each parameter of `group` on the CPU in its dtype before
    initialize: from the fp32 master where there is one (else the compute
    copy, which then is exact), or from `role`."""
    role = role or ("master" if group.has_master else "compute")
    return role_values(runtime, group, role, group.dtypes)


def role_values(runtime: "Runtime", group: "Group", role: str,
                dtypes: list[torch.dtype]) -> list[torch.Tensor]:
    """Each parameter's values of `role`, as copies on the CPU in `dtypes`
    (across ranks gathered: a collective, every rank reads the group)."""
    with runtime.engine.fetch(group.id, "host", roles=role) as view:
        if group.flat is None:
            values = [torch.from_dlpack(view.export(name, role))
                      for name, _ in group.plan.params]
        else:
            values = group.flat.collect(
                fill_from(view, role),
                group.placeholders[0].dtype if role == "compute"
                else torch.float32, runtime.device)
        return [value.to("cpu", dtype, copy=True)
                for value, dtype in zip(values, dtypes)]


def write_group(runtime: "Runtime", group: "Group",
                values: dict[int, torch.Tensor]) -> None:
    """Writes `values` (by parameter index, whole) into the group's master
    and compute copy (rounded); the other parameters keep theirs. Across
    ranks each rank writes the part in its shard (no collective)."""
    roles = ["compute", "master"] if group.has_master else ["compute"]
    with runtime.engine.fetch(group.id, "host", roles=roles,
                              write=True) as view:
        for role in roles:
            if group.flat is not None:
                group.flat.write(torch.from_dlpack(view.export(SHARD, role)),
                                 values)
                continue
            for index, value in values.items():
                target = torch.from_dlpack(
                    view.export(group.plan.params[index][0], role))
                target.copy_(value.reshape(target.shape))
    if group.flat is not None:
        group.flat.stepped()  # a gathered copy kept is out of date


def install_state_dict_hooks(runtime: "Runtime", engine: Any) -> list[Any]:
    """model.state_dict() (of the model or any submodule) gives managed
    parameters their real values (engine.real_weights()), the same tensor
    for tied names; with keep_vars the parameters themselves."""
    cache: dict[int, torch.Tensor] = {}
    keep_vars: list[bool] = []
    handles = []

    def pre(module: nn.Module, prefix: str, keep: bool) -> None:
        if runtime.saving == 0:  # the outermost: what an error cut off
            keep_vars.clear()
            cache.clear()
        keep_vars.append(keep)
        runtime.saving += 1  # lets _save_to_state_dict detach them

    def post(module: nn.Module, state: dict[str, Any], prefix: str,
             local_metadata: Any) -> None:
        runtime.saving -= 1
        keep = keep_vars.pop()
        try:
            if not keep:
                fill(module, state, prefix)
        except BaseException:
            runtime.saving = 0  # the outer ones end here too
            raise
        if not keep_vars:
            cache.clear()  # the outermost state_dict() is done

    def fill(module: nn.Module, state: dict[str, Any], prefix: str) -> None:
        for name, p in module.named_parameters(recurse=False):
            if isinstance(p, StrataParameter) and prefix + name in state:
                if not cache:
                    with runtime.inside():
                        cache.update(engine.real_weights())
                state[prefix + name] = cache[id(p)]

    for module in engine.module.modules():
        handles.append(module.register_state_dict_pre_hook(pre))
        handles.append(module._register_state_dict_hook(post))
    return handles


def save_16bit(engine: Any, save_dir: str, filename: str,
               exclude_frozen: bool) -> None:
    """engine.save_16bit_model's file: compute copies (exact in their
    dtype) and buffers, under model.state_dict()'s keys; across ranks
    gathered by every rank and written by rank 0."""
    runtime = engine.rt
    engine.store.drain()
    values: dict[int, torch.Tensor] = {}
    for group in runtime.groups:
        if exclude_frozen and not group.plan.trainable:
            continue
        compute = [group.placeholders[0].dtype] * len(group.plan.params)
        for (_, p), value in zip(group.plan.params,
                                 role_values(runtime, group, "compute",
                                             compute)):
            values[id(p)] = value
    path = Path(save_dir) / filename
    runtime.ranks.together(  # Note [Failing together] in ranks.py
        "save_16bit_model", lambda: _write_16bit(engine, values, path)
        if runtime.ranks.rank == 0 else None, f"{path} was not written")


def _write_16bit(engine: Any, values: dict[int, torch.Tensor], path: Path
                 ) -> None:
    """save_16bit's file at `path`: `values` (by id of the parameter)
    under model.state_dict()'s keys, with the buffers."""
    state: dict[str, torch.Tensor] = {}
    with engine.rt.inside():
        named = engine.module.state_dict(keep_vars=True)
    for key, value in named.items():
        if id(value) in values:
            state[key] = values[id(value)]
        elif not isinstance(value, StrataParameter):
            state[key] = value.detach().cpu()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file({k: v.clone() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
