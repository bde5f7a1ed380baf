"""What changes from step to step outside strata's optimizer: the fp16
dynamic loss scale and the learning-rate schedule, with DeepSpeed's
semantics, and their state for checkpoints."""
from __future__ import annotations

import math
from typing import Any, Optional

from strata._native import StrataError


class LossScaler:
    """DeepSpeed's dynamic loss scaler (fp16.loss_scale 0), or a static one.

    On an overflow the step is skipped and, once `hysteresis` overflows
    were tolerated, the scale halves (not below min_loss_scale); after
    loss_scale_window steps without one it doubles."""

    def __init__(self, fp16: dict[str, float]) -> None:
        self.dynamic = fp16.get("loss_scale", 0) == 0
        self.scale = (2.0 ** fp16.get("initial_scale_power", 16)
                      if self.dynamic else fp16["loss_scale"])
        self.window = int(fp16.get("loss_scale_window", 1000))
        self.min_scale = fp16.get("min_loss_scale", 1)
        self.hysteresis = int(fp16.get("hysteresis", 2))
        self.consecutive = bool(fp16.get("consecutive_hysteresis", False))
        self.left = self.hysteresis
        self.iteration = 0
        self.last_overflow = -1

    def update(self, overflow: bool) -> None:
        """After a step: adjusts the scale for the next one."""
        if self.dynamic and overflow:
            if self.scale <= self.min_scale:
                raise StrataError(9, "failed precondition", (
                    f"strata.torch: the fp16 gradients overflowed at the "
                    f"minimum loss scale {self.min_scale:g}: the run "
                    f"diverged (as DeepSpeed, strata stops here); lower "
                    f"the learning rate, use bf16, or lower "
                    f"fp16.min_loss_scale"))
            if self.hysteresis == 1 or self.left == 1:
                self.scale = max(self.scale / 2, self.min_scale)
            else:
                self.left -= 1
            self.last_overflow = self.iteration
        elif self.dynamic:
            if self.consecutive:
                self.left = self.hysteresis
            if (self.iteration - self.last_overflow) % self.window == 0:
                if not self.consecutive:
                    self.left = self.hysteresis
                self.scale *= 2
        self.iteration += 1

    def state(self) -> dict[str, Any]:
        return {"scale": self.scale, "left": self.left,
                "iteration": self.iteration,
                "last_overflow": self.last_overflow}

    def restore(self, state: dict[str, Any]) -> None:
        self.scale = state["scale"]
        self.left = state["left"]
        self.iteration = state["iteration"]
        self.last_overflow = state["last_overflow"]


class ScheduleError(ValueError):
    """A scheduler section strata cannot run (config.ConfigError's base)."""


_PARAMS = {
    "WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                 "warmup_type"},
    "WarmupDecayLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                      "warmup_type", "total_num_steps"},
    "WarmupCosineLR": {"warmup_min_ratio", "warmup_num_steps",
                       "cos_min_ratio", "warmup_type", "total_num_steps"},
}


class Scheduler:
    """DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR, step for step
    as deepspeed/runtime/lr_schedules.py: `iteration` starts at -1 (the
    first step runs at the minimum) and advances after each applied step;
    skipped steps (fp16 overflow) do not advance it, as in DeepSpeed."""

    def __init__(self, kind: str, params: dict[str, Any],
                 base_lr: float) -> None:
        unknown = sorted(set(params) - _PARAMS.get(kind, set()))
        if kind not in _PARAMS or unknown:
            raise ScheduleError(
                f"scheduler {kind}: unknown params {unknown}; it takes "
                f"{', '.join(sorted(_PARAMS.get(kind, ())))}")
        self.kind = kind
        self.base_lr = base_lr
        self.min_lr = float(params.get("warmup_min_lr", 0.0))
        self.max_lr = float(params.get("warmup_max_lr", 0.001))
        self.warmup = max(2, int(params.get("warmup_num_steps", 1000)))
        self.warmup_type = params.get("warmup_type", "log")
        if self.warmup_type not in ("log", "linear"):
            raise ScheduleError(f"scheduler.params.warmup_type "
                                f"{self.warmup_type!r}: use log or linear")
        self.total = int(params.get("total_num_steps", 0))
        if kind != "WarmupLR" and self.total <= self.warmup:
            raise ScheduleError(
                f"scheduler {kind}: params.total_num_steps ({self.total}) "
                f"must be above warmup_num_steps ({self.warmup})")
        self.min_ratio = float(params.get("warmup_min_ratio", 0.0))
        self.cos_min_ratio = float(params.get("cos_min_ratio", 1e-4))
        self.iteration = -1

    def _warmup(self) -> float:
        if self.warmup_type == "log":
            return math.log(self.iteration + 1) / math.log(self.warmup)
        return self.iteration / self.warmup

    def lr(self) -> float:
        """The learning rate of the next step."""
        it = self.iteration
        if self.kind == "WarmupCosineLR":
            if it < 0:
                return 0.0
            if it < self.warmup:
                ratio = self.min_ratio + (1 - self.min_ratio) * self._warmup()
            else:
                done = (it - self.warmup + 1) / (self.total - self.warmup)
                ratio = max(0.0, self.cos_min_ratio + (1 - self.cos_min_ratio)
                            * (1 + math.cos(math.pi * done)) / 2)
            return self.base_lr * ratio
        if it < 0:
            return self.min_lr
        if it < self.warmup:
            gamma = self._warmup()
        elif self.kind == "WarmupDecayLR":
            gamma = max(0.0, (self.total - it) / (self.total - self.warmup))
        else:
            gamma = 1.0
        return self.min_lr + (self.max_lr - self.min_lr) * gamma

    def step(self) -> None:
        self.iteration += 1


class ConfigScheduler:
    """engine.lr_scheduler for the config's "scheduler" section: a
    Scheduler that sets the learning rate of every param group of
    `optimizer` (as DeepSpeed's do) now, and after each applied step."""

    def __init__(self, schedule: Scheduler, optimizer: Any) -> None:
        self.schedule = schedule
        self.optimizer = optimizer
        # WarmupCosineLR scales each group's own learning rate; the others
        # set absolute ones.
        self.base = [group["lr"] for group in optimizer.param_groups]
        self._apply()

    def _apply(self) -> None:
        lr = self.schedule.lr()
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = lr * base / self.schedule.base_lr \
                if self.schedule.kind == "WarmupCosineLR" else lr

    def step(self, **_: Any) -> None:
        self.schedule.step()
        self._apply()

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return self.get_lr()

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.schedule.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.iteration = state["iteration"]
        self._apply()
