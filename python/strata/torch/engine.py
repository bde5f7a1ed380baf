"""StrataEngine: a PyTorch model trained through strata, driven like
DeepSpeed's engine (engine(batch), engine.backward(loss), engine.step())."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import strata
from strata._native import StrataError
from strata.torch.config import Config
from strata.torch.hooks import Phase, Runtime
from strata.torch.schedule import LossScaler, make_scheduler

_FORMAT = "strata.torch/1"


class _Guard(TorchFunctionMode):
    """Fails a torch call that reads a managed parameter whose group is not
    fetched (Note [Parameters between hooks]); metadata reads pass."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.rt = runtime

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not self.rt.busy and getattr(func, "__name__", "") != "__get__":
            for x in (*args, *kwargs.values()):
                for y in (x if isinstance(x, (list, tuple)) else (x,)):
                    if isinstance(y, nn.Parameter):
                        self.rt.check_live(y)
        return func(*args, **kwargs)


class StrataEngine:
    """The model, its strata engine and optimizer; see initialize()."""

    def __init__(self, model: nn.Module, config: Config,
                 engine: strata.Engine, runtime: Runtime) -> None:
        self.module = model
        self.config = config
        self.store = engine
        self.rt = runtime
        self.device = runtime.device
        self.scaler = LossScaler(config.fp16) if config.dtype == "fp16" \
            else None
        self.scheduler = make_scheduler(config.scheduler, config.lr)
        self.micro_steps = 0
        self.global_steps = 0
        self.last_report: Optional[strata.StepReport] = None
        self._signature = self._model_signature()

    # ---- the training loop ---------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward through strata's hooks."""
        self._check_model()
        training = torch.is_grad_enabled() and self.module.training
        if training and self.rt.phase is Phase.IDLE:
            self._begin_step()
        if training:
            self.rt.phase = Phase.FORWARD
        try:
            with _Guard(self.rt), torch.autograd.graph.saved_tensors_hooks(
                    self.rt.pack, self.rt.unpack):
                return self.module(*args, **kwargs)
        except BaseException:
            self.rt.abort_forward()
            raise
        finally:
            if training:
                self.rt.phase = Phase.OPEN

    forward = __call__

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of `loss`, scaled by the fp16 loss scale and divided by
        gradient_accumulation_steps (DeepSpeed's semantics); each group's
        gradients are handed to the CPU optimizer as soon as final."""
        if self.rt.phase is not Phase.OPEN:
            raise StrataError(9, "failed precondition", (
                "strata.torch: engine.backward(loss) needs a training "
                "forward through engine(...) first (model.train(), grad "
                "enabled)"))
        scale = self.scaler.scale if self.scaler else 1.0
        if self.config.accumulation > 1 or scale != 1.0:
            loss = loss.float() * (scale / self.config.accumulation)
        self.rt.phase = Phase.BACKWARD
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.rt.pack,
                                                          self.rt.unpack):
                loss.backward()
            self.rt.end_backward()
        finally:
            self.rt.phase = Phase.OPEN
        self.micro_steps += 1

    def is_gradient_accumulation_boundary(self) -> bool:
        return self.micro_steps % self.config.accumulation == 0

    def step(self) -> Optional[strata.StepReport]:
        """Call after every backward; at the accumulation boundary it ends
        the optimizer step and returns its report (else None)."""
        if not self.is_gradient_accumulation_boundary() or \
                self.rt.phase is Phase.IDLE:
            return None
        assert self.rt.optimizer is not None
        report = self.rt.optimizer.finish_step()
        self.store.end_step()
        self.rt.phase = Phase.IDLE
        self.rt.end_step()
        if self.scaler:
            self.scaler.update(report.skipped)
        if not report.skipped and self.scheduler:
            self.scheduler.step()
        self.global_steps += 1
        self.last_report = report
        return report

    def _begin_step(self) -> None:
        assert self.rt.optimizer is not None
        c = self.config
        self.store.begin_step()
        self.rt.optimizer.begin_step(
            lr=self.get_lr(), beta1=c.betas[0], beta2=c.betas[1], eps=c.eps,
            weight_decay=c.weight_decay, lr_decay=c.lr_decay,
            loss_scale=self.scaler.scale if self.scaler else 1.0)

    def get_lr(self) -> float:
        """The learning rate of the next step."""
        return self.scheduler.lr() if self.scheduler else self.config.lr

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    def train(self, mode: bool = True) -> "StrataEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "StrataEngine":
        return self.train(False)

    # ---- checkpoints -----------------------------------------------------

    def save_checkpoint(self, save_dir: str, tag: Optional[str] = None,
                        client_state: Optional[dict[str, Any]] = None
                        ) -> str:
        """Writes every tensor, the optimizer's step, the loss scaler, the
        scheduler, the RNG states and `client_state` (JSON-serializable)
        to save_dir/tag (default "global_step<N>"), and names it in
        save_dir/latest. Between optimizer steps only."""
        self._require_idle("save_checkpoint")
        assert self.rt.optimizer is not None
        tag = tag or f"global_step{self.global_steps}"
        path = Path(save_dir) / tag
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"format": _FORMAT, "global_steps": self.global_steps,
                 "micro_steps": self.micro_steps,
                 "scaler": self.scaler.state() if self.scaler else None,
                 "scheduler": self.scheduler.iteration
                 if self.scheduler else None,
                 "rng": _rng_state(), "buffers": self._buffers(),
                 "client_state": client_state or {}}
        self.rt.optimizer.save(str(path), json.dumps(state))
        (Path(save_dir) / "latest").write_text(tag)
        return str(path)

    def load_checkpoint(self, load_dir: str, tag: Optional[str] = None
                        ) -> tuple[str, dict[str, Any]]:
        """Loads a checkpoint of save_checkpoint (tag default: the one named
        in load_dir/latest); returns its path and client_state. The run
        goes on bit-identically to the one that saved it."""
        self._require_idle("load_checkpoint")
        assert self.rt.optimizer is not None
        if tag is None:
            latest = Path(load_dir) / "latest"
            if not latest.exists():
                raise FileNotFoundError(
                    f"strata.torch: {latest} does not exist; pass the tag of "
                    f"the checkpoint to load")
            tag = latest.read_text().strip()
        path = str(Path(load_dir) / tag)
        try:
            state = json.loads(self.rt.optimizer.load(path) or "{}")
        except StrataError as e:
            if "does not fit this engine" not in e.message:
                raise
            raise StrataError(e.code, e.status, (
                f"{e.message}. strata.torch: a group's roles follow the "
                f"config (fp32 or bf16/fp16, gradient_clipping with the "
                f"optimizer on NVMe, gradient_accumulation_steps, mode): "
                f"load with the config the checkpoint was saved with"
                )) from e
        if state.get("format") != _FORMAT:
            raise StrataError(7, "data loss", (
                f"strata.torch: {path} was not written by "
                f"StrataEngine.save_checkpoint; load it with "
                f"strata.Optimizer.load"))
        self.global_steps = state["global_steps"]
        self.micro_steps = state["micro_steps"]
        if self.scaler and state["scaler"]:
            self.scaler.restore(state["scaler"])
        if self.scheduler and state["scheduler"] is not None:
            self.scheduler.iteration = state["scheduler"]
        _set_rng_state(state["rng"])
        self._set_buffers(state["buffers"])
        return path, state["client_state"]

    def _buffers(self) -> str:
        """The module's buffers (BatchNorm's running statistics, ...)."""
        raw = io.BytesIO()
        torch.save({k: b.cpu() for k, b in self.module.named_buffers()}, raw)
        return base64.b64encode(raw.getvalue()).decode()

    def _set_buffers(self, text: str) -> None:
        saved = torch.load(io.BytesIO(base64.b64decode(text)))
        for key, buffer in self.module.named_buffers():
            if key not in saved:
                raise StrataError(7, "data loss", (
                    f"strata.torch: the checkpoint has no buffer {key}; "
                    f"load it into the model that saved it"))
            buffer.copy_(saved[key])

    def _require_idle(self, what: str) -> None:
        if self.rt.phase is not Phase.IDLE:
            raise StrataError(9, "failed precondition", (
                f"strata.torch: {what} in the middle of an optimizer step; "
                f"call it after engine.step() ends one"))

    # ---- weights out -----------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """model.state_dict()'s keys (tied names included), on the CPU:
        fp32 master weights for trainable parameters (in fp32 training the
        compute copy, which is the master), the stored copy for frozen
        ones, and the module's buffers."""
        self._require_idle("state_dict")
        self.store.drain()
        weights: dict[int, torch.Tensor] = {}
        for group in self.rt.groups:
            role = "master" if group.plan.trainable \
                and self.config.master_weights else "compute"
            with self.store.fetch(group.id, "host", roles=role) as view:
                for name, p in group.plan.params:
                    weights[id(p)] = torch.from_dlpack(
                        view.export(name, role)).clone()
        out: dict[str, torch.Tensor] = {}
        for key, value in self.module.state_dict(keep_vars=True).items():
            out[key] = weights[id(value)] if id(value) in weights \
                else value.detach().cpu().clone()
        return out

    # ---- checks and teardown --------------------------------------------

    def _model_signature(self) -> list[tuple[str, int, bool]]:
        return [(name, id(p), p.requires_grad)
                for name, p in self.module.named_parameters()]

    def _check_model(self) -> None:
        now = self._model_signature()
        if now == self._signature:
            return
        before = {name: tuple(rest) for name, *rest in self._signature}
        after = {name: tuple(rest) for name, *rest in now}
        name = sorted(set(before.items()) ^ set(after.items()))[0][0]
        what = ("added" if name not in before else "removed"
                if name not in after else "replaced"
                if before[name][0] != after[name][0] else
                "frozen" if before[name][1] else "unfrozen")
        raise StrataError(9, "failed precondition", (
            f"strata.torch: parameter {name} was {what} after initialize(); "
            f"strata holds the parameters registered then. Change the model "
            f"before strata.torch.initialize: engine.close() puts the "
            f"trained weights back into the model, then initialize again"))

    def close(self) -> None:
        """Waits for the optimizer, puts the weights back into the model's
        parameters (between steps; in their dtype before initialize), and
        frees strata's memory."""
        if self.rt.optimizer is None:
            return
        weights = self.state_dict() if self.rt.phase is Phase.IDLE else {}
        self.rt.remove()
        for group in self.rt.groups:
            for (name, p), dtype in zip(group.plan.params, group.dtypes):
                if name in weights:
                    p.data = weights[name].to(self.device, dtype)
        self.rt.optimizer.close()
        self.rt.optimizer = None
        self.store.close()
        del self.module._strata_engine

    def __enter__(self) -> "StrataEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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

