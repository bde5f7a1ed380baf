"""StrataEngine: a PyTorch model trained through strata, driven as
DeepSpeed's engine is (engine(batch), engine.backward(loss), engine.step(),
its accessors, checkpoints and weights out); docs/torch.md, "Coming
from DeepSpeed", says where it differs and why.

Note [Recovery]
Any exception out of a pass (an error in the model's code, an I/O error,
Ctrl-C, a NaN check of the user's) leaves the engine usable: the views
the passes hold are released, the gradient buffers not handed off are
ended, the open optimizer step is aborted (strata.Optimizer.abort_step),
the micro-batches of the step are dropped and the phase is IDLE again, so
the next forward starts a new step and save_checkpoint, load_checkpoint,
state_dict and close work. Every step waits for the global checks (an
overflow skips it exactly), so an aborted step has changed nothing; in
the one case where groups were already updated (it cannot happen with the
configs strata.torch builds) the engine says so and refuses to save that
mixed state. A step whose gradients are not finite is skipped, in every
precision, changing nothing: was_step_applied() is false and a warning
names the group; strata.max_consecutive_skips skips in a row stop the run
(fp16 stops at its minimum loss scale instead).

Across ranks an exception out of a pass ends the job: the other ranks
went on without this one, so from then on every collective fails naming
the error (Ranks.give_up in ranks.py); stop every rank and load the last
checkpoint."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import torch
from torch import nn

import strata
from strata._native import StrataError
from strata.torch import checkpoint, export as _export, weights
from strata.torch.config import Config
from strata.torch.hooks import Phase, Runtime
from strata.torch.optim import StrataOptimizer
from strata.torch.ranks import CollectiveStats
from strata.torch.schedule import LossScaler


def _error(message: str) -> StrataError:
    return StrataError(9, "failed precondition", f"strata.torch: {message}")


class StrataEngine:
    """The model, its strata engine and optimizer; see initialize()."""

    def __init__(self, model: nn.Module, config: Config,
                 engine: strata.Engine, runtime: Runtime,
                 optimizer: StrataOptimizer, lr_scheduler: Any) -> None:
        self.module = model
        self.ds_config = config
        self.store = engine
        self.rt = runtime
        self.device = runtime.device
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.scaler = LossScaler(config.fp16) if config.dtype == "fp16" \
            else None
        self.micro_steps = 0      # micro-batches stepped, as DeepSpeed's
        self.global_steps = 0     # optimizer steps, skipped ones included
        self.global_samples = 0
        self.skipped_steps = 0
        self.last_report: Optional[strata.StepReport] = None
        self._consecutive_skips = 0
        self._backward_since_step = False
        self._mixed = 0           # groups a failed step had updated
        self._closed = False
        self._signature = self._model_signature()

    def __getattr__(self, name: str) -> Any:
        """The module's attributes (engine.generate, engine.config)."""
        module = self.__dict__.get("module")
        if module is None:
            raise AttributeError(name)
        return getattr(module, name)

    # ---- the training loop ---------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward through strata's hooks."""
        self._check_open()
        self._check_model()
        training = torch.is_grad_enabled() and self.module.training
        with self._recovering("the forward", abandon_step=training):
            if training and self.rt.phase is Phase.IDLE:
                self._begin_step()
            if training:
                self.rt.phase = Phase.FORWARD
            try:
                with torch.autograd.graph.saved_tensors_hooks(
                        self.rt.pack, self.rt.unpack):
                    return self.module(*args, **kwargs)
            finally:
                if training:
                    self.rt.phase = Phase.OPEN

    forward = __call__

    def backward(self, loss: torch.Tensor, retain_graph: bool = False,
                 scale_wrt_gas: bool = True) -> None:
        """Backward of `loss`, scaled by the fp16 loss scale and (with
        scale_wrt_gas, as DeepSpeed) divided by
        gradient_accumulation_steps; each group's gradients are handed to
        the CPU optimizer as soon as they are complete."""
        self._check_open()
        if self.rt.phase is not Phase.OPEN:
            raise _error("engine.backward(loss) needs a training forward "
                         "through engine(...) first (model.train(), grad "
                         "enabled)")
        scale = self.scaler.scale if self.scaler else 1.0
        if scale_wrt_gas and self.ds_config.accumulation > 1:
            scale /= self.ds_config.accumulation
        if scale != 1.0:
            loss = loss.float() * scale
        with self._recovering("backward", abandon_step=True):
            self.rt.phase = Phase.BACKWARD
            try:
                with torch.autograd.graph.saved_tensors_hooks(
                        self.rt.pack, self.rt.unpack):
                    loss.backward(retain_graph=retain_graph)
                self.rt.end_backward()
            finally:
                self.rt.phase = Phase.OPEN
        self._backward_since_step = True

    def step(self, lr_kwargs: Optional[dict[str, Any]] = None
             ) -> Optional[strata.StepReport]:
        """Call after every backward; at the accumulation boundary it ends
        the optimizer step and returns its report (else None)."""
        self._check_open()
        if not self._backward_since_step:
            raise _error("engine.step() needs engine.backward(loss) first: "
                         "it steps with the gradients of the backward "
                         "passes since the last step")
        self._backward_since_step = False
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if not boundary:
            return None
        assert self.rt.optimizer is not None
        with contextlib.ExitStack() as held:  # the count, then any Ctrl-C
            with self._recovering("engine.step()", abandon_step=True):
                report = self.rt.finish_step(held)
                self.store.end_step()
            self.rt.phase = Phase.IDLE
            self.rt.end_step()
            self._after_step(report, lr_kwargs or {})
        return report

    def _begin_step(self) -> None:
        assert self.rt.optimizer is not None
        self.store.begin_step()
        per_group = {g.id: self.optimizer.hyper(g.plan.param_group)
                     for g in self.rt.groups
                     if g.plan.trainable and g.plan.param_group != 0}
        try:
            self.rt.optimizer.begin_step(
                **self.optimizer.hyper(0), groups=per_group,
                loss_scale=self.scaler.scale if self.scaler else 1.0)
        except BaseException:
            self.store.end_step()
            raise

    def _after_step(self, report: strata.StepReport,
                    lr_kwargs: dict[str, Any]) -> None:
        self.global_steps += 1
        self.global_samples += self.train_batch_size()
        self.last_report = report
        self.optimizer._opt_called = True  # torch LR schedulers check it
        if self.scaler:
            self.scaler.update(report.skipped)
        if not report.skipped:
            self._consecutive_skips = 0
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**lr_kwargs)
            return
        self.skipped_steps += 1
        self._consecutive_skips += 1
        group = self.rt.groups[report.overflow_group].name \
            if report.overflow_group >= 0 else "?"
        warnings.warn(
            f"strata.torch: step {self.global_steps} skipped: the gradients "
            f"of group {group!r} are not finite (inf or NaN); nothing "
            f"changed", stacklevel=3)
        limit = self.ds_config.max_consecutive_skips
        if self.scaler is None and self._consecutive_skips >= limit:
            raise _error(
                f"{self._consecutive_skips} steps in a row were skipped for "
                f"non-finite gradients (last in group {group!r}): the run "
                f"only skips. Load the last good checkpoint, lower the "
                f"learning rate or check the data (strata.max_consecutive_"
                f"skips is {limit})")

    # ---- Note [Recovery] -----------------------------------------------

    @contextlib.contextmanager
    def _recovering(self, where: str, abandon_step: bool) -> Iterator[None]:
        try:
            yield
        except BaseException as error:
            self._abandon(where, error, abandon_step)
            raise

    def abandon_step(self) -> bool:
        """Drops the optimizer step in progress as an error in a pass does
        (Note [Recovery]): for an exception, Ctrl-C above all, raised in
        the caller's own code between forward, backward and step, where
        the engine cannot see it. The step's micro-batches are dropped and
        nothing changes, so save_checkpoint works after it; a step that
        had already settled stands and is counted. Returns whether a step
        was open; between steps it does nothing. Across ranks it ends the
        job, as any error in a pass does."""
        self._check_open()
        if self.rt.phase is Phase.IDLE:
            return False
        self._drop("abandon_step()", abort=True)
        return True

    def _abandon(self, where: str, error: BaseException,
                 abandon_step: bool) -> None:
        """Note [Recovery]."""
        in_step = abandon_step and self.rt.phase is not Phase.IDLE
        try:
            self._drop(f"{where} after an error", abort=in_step)
        except BaseException as cleanup:  # the first error is the news
            note = getattr(error, "add_note", None)
            if note:
                note(f"strata.torch: cleaning up after it failed too: "
                     f"{cleanup}")
            return
        if in_step:
            warnings.warn(
                f"strata.torch: the optimizer step in progress was abandoned "
                f"after an error in {where}: its micro-batches are dropped, "
                f"and the next forward starts a new step", stacklevel=4)

    def _drop(self, left: str, abort: bool) -> None:
        if self.rt.ranks.sharded():
            self.rt.ranks.give_up(f"left {left}")
        self.rt.reset()
        if abort:
            self._abort_step()

    def _abort_step(self) -> None:
        assert self.rt.optimizer is not None
        report = self.rt.optimizer.abort_step()
        self.store.end_step()
        self.rt.phase = Phase.IDLE
        self.micro_steps -= self.micro_steps % self.ds_config.accumulation
        self._backward_since_step = False
        if report.completed:  # it had settled and stands, as a step does
            self._after_step(strata.StepReport(
                step=self.rt.optimizer.step, skipped=report.skipped,
                grad_norm=report.grad_norm, clip_coef=1.0, step_seconds=0,
                hidden_seconds=0, finish_wait_seconds=0,
                acquire_wait_seconds=0, speculated=0, undone=0,
                overflow_group=report.overflow_group), {})
        self._mixed += report.applied

    # ---- DeepSpeed's accessors -----------------------------------------

    def train(self, mode: bool = True) -> "StrataEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "StrataEngine":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: strata's buffers take the gradients."""

    def get_lr(self) -> list[float]:
        """Each param group's learning rate for the next step."""
        return [g["lr"] for g in self.optimizer.param_groups]

    def gradient_accumulation_steps(self) -> int:
        return self.ds_config.accumulation

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.ds_config.micro_batch

    @property
    def global_rank(self) -> int:
        """This process's rank (0 at one rank), as DeepSpeed's engine."""
        return self.rt.ranks.rank

    @property
    def world_size(self) -> int:
        """The data-parallel ranks (DeepSpeed's world_size and
        dp_world_size)."""
        return self.rt.ranks.world

    dp_world_size = world_size

    @property
    def local_rank(self) -> int:
        """The rank on this machine (the launcher's LOCAL_RANK)."""
        return int(os.environ.get("LOCAL_RANK", "0"))

    def collective_stats(self) -> CollectiveStats:
        """The collectives this rank has taken part in so far (a copy;
        all zero at world size 1): count, bytes across its link, and the
        seconds spent in them."""
        return dataclasses.replace(self.rt.ranks.stats)

    def train_batch_size(self) -> int:
        return (self.ds_config.micro_batch * self.ds_config.accumulation
                * self.rt.ranks.world)

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the micro-batch in progress (whose step() comes next)
        ends the accumulation, as DeepSpeed counts."""
        return (self.micro_steps + 1) % self.ds_config.accumulation == 0

    def get_global_grad_norm(self) -> Optional[float]:
        """The last step's gradient norm (unscaled, before clipping)."""
        return self.last_report.grad_norm if self.last_report else None

    def was_step_applied(self) -> bool:
        return self.last_report is not None and not self.last_report.skipped

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        return self.module.parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any
                         ) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters(*args, **kwargs)

    # ---- checkpoints (strata.torch.checkpoint) --------------------------

    def save_checkpoint(self, save_dir: str,
                        tag: Union[None, str, int] = None,
                        client_state: Any = None,
                        save_latest: bool = True) -> bool:
        """Writes every tensor, the optimizer, the scaler, the scheduler,
        the RNG states and `client_state` (anything picklable) to
        save_dir/tag (default "global_step<N>") and, with save_latest,
        names it in save_dir/latest. Between steps only."""
        self._check_open()
        self._require_idle("save_checkpoint")
        if self._mixed:
            raise _error(
                f"a failed step had updated {self._mixed} groups before it "
                f"was abandoned, so the model mixes two steps and is no "
                f"state worth saving; load the last checkpoint")
        checkpoint.save(self, save_dir, tag, client_state or {}, save_latest)
        return True

    def load_checkpoint(self, load_dir: str,
                        tag: Union[None, str, int] = None,
                        load_module_strict: bool = True,
                        load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False
                        ) -> tuple[Optional[str], Optional[Any]]:
        """Loads a checkpoint of save_checkpoint (tag default: the one
        named in load_dir/latest); returns (its path, client_state), or
        (None, None) when there is none. The run goes on bit-identically
        to the one that saved it. load_module_only (or not
        load_optimizer_states) loads the weights alone and starts the
        optimizer's state afresh, so it also takes a checkpoint of another
        strata.state_dtype."""
        self._check_open()
        self._require_idle("load_checkpoint")
        out = checkpoint.load(
            self, load_dir, tag,
            load_optimizer_states and not load_module_only,
            load_lr_scheduler_states and not load_module_only)
        if out[0] is not None:
            self._mixed = 0
        return out

    def reset_optimizer_state(self) -> None:
        """Zeroes every group's optimizer state and the step count (a
        fresh optimizer over the loaded weights)."""
        assert self.rt.optimizer is not None
        for group in self.rt.groups:
            if not group.plan.trainable:
                continue
            states = [r for r in ("state1", "state2") if r in group.roles]
            with self.store.fetch(group.id, "host", roles=states,
                                  write=True) as view:
                for info in view.tensors:
                    torch.from_dlpack(view.export(info.name,
                                                  info.role)).zero_()
        self.rt.optimizer.step = 0

    # ---- weights out (strata.torch.weights) -----------------------------

    def state_dict(self) -> dict[str, Any]:
        """model.state_dict() with every parameter's real value, on the CPU
        in its dtype before initialize (fp32 masters, exact frozen
        weights); between steps."""
        self._check_open()
        return self.module.state_dict()

    def real_weights(self) -> dict[int, torch.Tensor]:
        """Every managed parameter's value, by id (tied ones once)."""
        self._require_idle("reading the model's weights")
        self.store.drain()
        out: dict[int, torch.Tensor] = {}
        for group in self.rt.groups:
            for (_, p), value in zip(group.plan.params,
                                     weights.read_group(self.rt, group)):
                out[id(p)] = value
        return out

    def save_16bit_model(self, save_dir: str,
                         save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """DeepSpeed's: the model's weights in the compute dtype (bf16 or
        fp16; fp32 when training in fp32) as save_dir/save_filename
        (torch.save, or safetensors for a .safetensors name). As with
        DeepSpeed's ZeRO-3, only with zero_optimization.
        stage3_gather_16bit_weights_on_model_save true; else it warns and
        returns False."""
        self._check_open()
        if not self.ds_config.gather_16bit_on_save:
            warnings.warn(
                "strata.torch: save_16bit_model saved nothing: set zero_"
                "optimization.stage3_gather_16bit_weights_on_model_save "
                "true (as DeepSpeed's ZeRO-3 needs)", stacklevel=2)
            return False
        self._require_idle("save_16bit_model")
        weights.save_16bit(self, save_dir, save_filename,
                           exclude_frozen_parameters)
        return True

    def export(self, out_dir: str, dtype: str = "fp32",
               max_shard_bytes: int = _export.DEFAULT_SHARD_BYTES
               ) -> list[Path]:
        """Writes the model's weights as Hugging Face safetensors into
        out_dir (one model.safetensors, or shards of at most
        max_shard_bytes and model.safetensors.index.json; config.json for
        a transformers model), group by group: dtype "fp32" the master
        weights, "compute" the compute copies. transformers'
        from_pretrained(out_dir) loads it. Between steps; returns the
        files. Across ranks every rank calls it (collectives), rank 0
        writes, and the others return []."""
        self._check_open()
        self._require_idle("export")
        return _export.export(self, out_dir, dtype, max_shard_bytes)

    # ---- checks and teardown --------------------------------------------

    def _require_idle(self, what: str) -> None:
        if self.rt.phase is not Phase.IDLE:
            raise _error(f"{what} in the middle of an optimizer step; call "
                         f"it after engine.step() ends one, or drop the "
                         f"step with engine.abandon_step() (after an "
                         f"exception between forward and step)")

    def _check_open(self) -> None:
        if self._closed:
            raise _error("the engine is closed (close() gave the model its "
                         "weights back); initialize the model again to go "
                         "on training it")

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
        raise _error(
            f"parameter {name} was {what} after initialize(); strata holds "
            f"the parameters registered then. Change the model before "
            f"strata.torch.initialize: engine.close() puts the trained "
            f"weights back into the model, then initialize again")

    def close(self) -> None:
        """Ends a step in progress, puts every parameter's real value back
        (in its dtype before initialize; frozen ones exactly as they were),
        and frees strata's memory and swap files; raises, keeping the
        engine open, if the weights cannot be read."""
        if self._closed:
            return
        if self.rt.phase is not Phase.IDLE:
            self.rt.reset()
            self._abort_step()
        values = self.real_weights()
        self.rt.remove()
        with self.rt.inside():
            for group in self.rt.groups:
                for _, p in group.plan.params:
                    weights.unmanage(p, values[id(p)].to(self.device))
        del self.module._strata_engine
        self.free()

    def free(self) -> None:
        """Frees strata's memory and swap files, leaving the model as it
        is (close() first gives the weights back); at the interpreter's
        exit for engines never closed."""
        if self.rt.optimizer is not None:
            if self.rt.phase is not Phase.IDLE:
                self.rt.optimizer.abort_step()
            self.rt.optimizer.close()
            self.rt.optimizer = None
        self.store.close()
        self._closed = True

    def __enter__(self) -> "StrataEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
