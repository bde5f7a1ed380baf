"""Routing a module's tensors through one autograd node whose backward
calls a hook: how strata.torch's forward post-hook learns that a unit's
backward is about to run (Note [Backward fetch and hand-off] in
hooks.py)."""
from __future__ import annotations

from typing import Any, Callable

import torch


class BackwardFetch(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hook: Callable[[], None], *xs: torch.Tensor
                ) -> Any:
        ctx.hook = hook
        # Not views of the inputs: the model may change them in place
        # (ReLU(inplace=True) after a unit).
        return tuple(x.detach() for x in xs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        ctx.hook()
        return (None,) + grads


def wrap(args: tuple, kwargs: dict, hook: Callable[[], None]) -> Any:
    """Routes the tensors needing gradients among args and kwargs (also in
    tuples, lists and dicts, HF's ModelOutput included) through one
    BackwardFetch whose backward calls `hook`."""
    found: list[torch.Tensor] = []

    def collect(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            if x.requires_grad:
                found.append(x)
        elif isinstance(x, (tuple, list)):
            for y in x:
                collect(y)
        elif isinstance(x, dict):
            for y in x.values():
                collect(y)

    collect((args, kwargs))
    if not found:
        return None
    out = iter(BackwardFetch.apply(hook, *found))

    def rebuild(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return next(out) if x.requires_grad else x
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*[rebuild(y) for y in x])
        if isinstance(x, (tuple, list)):
            return type(x)(rebuild(y) for y in x)
        if isinstance(x, dict):
            for key in list(x.keys()):
                x[key] = rebuild(x[key])
            return x
        return x

    return rebuild(args), rebuild(kwargs)
