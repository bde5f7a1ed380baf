"""engine.save_checkpoint and engine.load_checkpoint with DeepSpeed's
signatures and return values: a directory per tag under save_dir, the tag
named in save_dir/latest, any picklable client_state; and everything a
resume needs to go on bit-identically (every tensor of every role, the
optimizer's step, the param groups' hyperparameters, the loss scaler, the
LR scheduler, the RNG states and the module's buffers)."""
from __future__ import annotations

import base64
import io
import json
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from strata._native import StrataError
from strata.torch import reshard
from strata.torch.export import model_config

if TYPE_CHECKING:
    from strata.torch.engine import StrataEngine

_FORMAT = "strata.torch/2"
_HYPER = ("lr", "betas", "eps", "weight_decay", "lr_decay")


def save(engine: "StrataEngine", save_dir: str, tag: Union[None, str, int],
         client_state: Any, save_latest: bool) -> str:
    """Writes save_dir/tag; returns its path. Across ranks a failure on
    any rank fails every rank (Note [Failing together] in ranks.py)."""
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    path = Path(save_dir) / tag
    ranks = engine.rt.ranks
    what = "the checkpoint's save"
    state = ranks.together(what, lambda: _state(engine, path, client_state),
                           f"nothing was saved to {path}")
    if ranks.sharded():
        reshard.save(engine, path, state)
    else:
        engine.rt.optimizer.save(str(path), state)
    ranks.together(  # every rank sees the new latest, or fails
        what, lambda: _write_latest(save_dir, tag)
        if save_latest and ranks.rank == 0 else None,
        f"{save_dir}/latest may not name {tag}")
    return str(path)


def _state(engine: "StrataEngine", path: Path, client_state: Any) -> str:
    """strata.torch's state beside the engine's, as JSON; across ranks
    the tag's directory made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if engine.rt.ranks.sharded():
        path.mkdir(exist_ok=True)
    scheduler = engine.lr_scheduler
    return json.dumps({
        "format": _FORMAT, "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "micro_steps": engine.micro_steps,
        "skipped_steps": engine.skipped_steps,
        "scaler": engine.scaler.state() if engine.scaler else None,
        "lr_scheduler": _pickled(scheduler.state_dict()
                                 if scheduler is not None else None),
        "param_groups": [{k: g[k] for k in _HYPER if k in g}
                         for g in engine.optimizer.param_groups],
        "rng": _rng_state(), "buffers": _buffers(engine),
        "state_buffers": _state_buffers(engine),
        "model_config": model_config(engine.module),
        "client_state": _pickled(client_state)})


def _write_latest(save_dir: str, tag: str) -> None:
    (Path(save_dir) / "latest").write_text(tag)


def load(engine: "StrataEngine", load_dir: str, tag: Union[None, str, int],
         optimizer_states: bool, scheduler_states: bool
         ) -> tuple[Optional[str], Optional[Any]]:
    """Loads load_dir/tag (default: the tag in load_dir/latest); (None,
    None) when there is nothing to load, as DeepSpeed returns."""
    if tag is None:
        latest = Path(load_dir) / "latest"
        if not latest.exists():
            warnings.warn(f"strata.torch: {latest} does not exist, so "
                          f"there is no checkpoint to load; pass its tag",
                          stacklevel=3)
            return None, None
        tag = latest.read_text().strip()
    path = Path(load_dir) / str(tag)
    if not path.exists() and not Path(f"{path}.old").exists():
        warnings.warn(f"strata.torch: no checkpoint {path}", stacklevel=3)
        return None, None
    state = _read(engine, str(path), optimizer_states)
    engine.global_steps = state["global_steps"]
    engine.global_samples = state["global_samples"]
    engine.micro_steps = state["micro_steps"]
    engine.skipped_steps = state["skipped_steps"]
    if engine.scaler and state["scaler"]:
        engine.scaler.restore(state["scaler"])
    for group, saved in zip(engine.optimizer.param_groups,
                            state["param_groups"] if optimizer_states else ()):
        group.update({k: tuple(v) if k == "betas" else v
                      for k, v in saved.items()})
    scheduler = _unpickled(state["lr_scheduler"])
    if scheduler_states and scheduler is not None and \
            engine.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(scheduler)
    if not optimizer_states:
        engine.reset_optimizer_state()
    _set_rng_state(state["rng"])
    _set_buffers(engine, state["buffers"])
    return str(path), _unpickled(state["client_state"])


def _read(engine: "StrataEngine", path: str, optimizer_states: bool
          ) -> dict[str, Any]:
    try:
        state = json.loads(
            reshard.load(engine, Path(path), optimizer_states) or "{}")
    except StrataError as e:
        if "does not fit this engine" not in e.message:
            raise
        raise StrataError(e.code, e.status, (
            f"{e.message}. strata.torch: the checkpoint is of another model, "
            f"or of this one under another config (a group's roles follow "
            f"the precision, the offload devices, gradient_accumulation_"
            f"steps and the param groups): load it with the model and config "
            f"it was saved with")) from e
    if state.get("format") != _FORMAT:
        raise StrataError(7, "data loss", (
            f"strata.torch: {path} was not written by this strata.torch's "
            f"engine.save_checkpoint (format {state.get('format')!r}, this "
            f"one reads {_FORMAT}); load it with strata.Optimizer.load"))
    return state


def _pickled(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode()


def _unpickled(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


def _buffers(engine: "StrataEngine") -> str:
    """The module's buffers (BatchNorm's running statistics, ...)."""
    return _pickled({k: b.cpu() for k, b in engine.module.named_buffers()})


def _state_buffers(engine: "StrataEngine") -> list[str]:
    """The buffers model.state_dict() holds (the persistent ones), in its
    order: what an offline export writes (strata.torch.export)."""
    with engine.rt.inside():
        keys = engine.module.state_dict(keep_vars=True).items()
    return [k for k, v in keys if not isinstance(v, torch.nn.Parameter)]


def saved_buffers(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The buffers of a checkpoint's state, by name."""
    return _unpickled(state["buffers"])


def _set_buffers(engine: "StrataEngine", text: str) -> None:
    saved = _unpickled(text)
    for key, buffer in engine.module.named_buffers():
        if key not in saved:
            raise StrataError(7, "data loss", (
                f"strata.torch: the checkpoint has no buffer {key}; load it "
                f"into the model that saved it"))
        buffer.copy_(saved[key])


def _rng_state() -> dict[str, str]:
    out = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes())
           .decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        buf = io.BytesIO()
        torch.save(torch.cuda.get_rng_state_all(), buf)
        out["cuda"] = base64.b64encode(buf.getvalue()).decode()
    return out


def _set_rng_state(state: dict[str, str]) -> None:
    raw = base64.b64decode(state["cpu"])
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        states = torch.load(io.BytesIO(base64.b64decode(state["cuda"])))
        torch.cuda.set_rng_state_all(states)
