"""What changes from step to step outside strata's optimizer: the fp16
dynamic loss scale and the learning-rate schedule, with DeepSpeed's
semantics, and their state for checkpoints."""
from __future__ import annotations

import math
from typing import Any, Optional


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


class Scheduler:
    """DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR: the learning
    rate of the step after `iteration` applied steps. Skipped steps (fp16
    overflow) do not advance it, as in DeepSpeed."""

    def __init__(self, kind: str, params: dict[str, Any],
                 base_lr: float) -> None:
        self.kind = kind
        self.base_lr = base_lr
        self.min_lr = float(params.get("warmup_min_lr", 0.0))
        self.max_lr = float(params.get("warmup_max_lr", base_lr))
        self.warmup = max(2, int(params.get("warmup_num_steps", 1000)))
        self.warmup_type = params.get("warmup_type", "log")
        if self.warmup_type not in ("log", "linear"):
            raise ValueError(f"scheduler.params.warmup_type "
                             f"{self.warmup_type!r}: use log or linear")
        self.total = int(params.get("total_num_steps", 0))
        if kind != "WarmupLR" and self.total <= 0:
            raise ValueError(f"scheduler {kind} needs "
                             f"params.total_num_steps > 0")
        self.min_ratio = float(params.get("warmup_min_ratio", 0.0))
        self.cos_min_ratio = float(params.get("cos_min_ratio", 1e-4))
        self.iteration = 0

    def _gamma(self) -> float:
        if self.iteration >= self.warmup:
            return 1.0
        if self.warmup_type == "log":
            return math.log(self.iteration + 1) / math.log(self.warmup)
        return self.iteration / self.warmup

    def lr(self) -> float:
        """The learning rate of the next step."""
        it = self.iteration
        if self.kind == "WarmupCosineLR":
            if it < self.warmup:
                ratio = self.min_ratio + (1 - self.min_ratio) * self._gamma()
            else:
                done = min(1.0, (it - self.warmup)
                           / max(1, self.total - self.warmup))
                ratio = self.cos_min_ratio + 0.5 * (1 - self.cos_min_ratio) \
                    * (1 + math.cos(math.pi * done))
            return self.base_lr * ratio
        gamma = self._gamma()
        if self.kind == "WarmupDecayLR" and it >= self.warmup:
            gamma = max(0.0, (self.total - it)
                        / max(1.0, self.total - self.warmup))
        return self.min_lr + (self.max_lr - self.min_lr) * gamma

    def step(self) -> None:
        self.iteration += 1


def make_scheduler(spec: Optional[tuple[str, dict[str, Any]]],
                   base_lr: float) -> Optional[Scheduler]:
    return Scheduler(spec[0], spec[1], base_lr) if spec else None
