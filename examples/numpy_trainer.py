"""A two-layer MLP trained with NumPy alone (no torch) through strata, as a
framework that embeds strata as its offload allocator would: the weights
are strata groups, the AdamW state (fp32 master, exp_avg, exp_avg_sq and
the gradient accumulator) lives on NVMe, and strata's CPU optimizer steps
each layer as soon as its gradients are handed off. Halfway, the run saves
a checkpoint, closes everything, reopens a new engine and optimizer, loads
it and goes on: the weights end bit-identical to a run without the resume
(python/tests/test_examples_numpy.py checks both against a plain NumPy
AdamW).

What it shows, in order:
- Engine(device="host", device_roles="compute", home=... "nvme"): a
  host-emulated device that holds only the compute copies, with the
  optimizer state homed in swap files under --swap-dir;
- the initial weights written into the compute copy only (the master
  takes their exact widening before the first step: Note [Masters from
  compute copies] in src/store/engine_internal.h);
- each step: compute copies fetched to the device (host memory here, so
  View.numpy reads them in place), forward and backward in NumPy, the
  gradients written into the optimizer's buffers (Gradients.numpy) and
  handed off, last layer first;
- Optimizer.save / load with a user_state that carries the next step.

It needs NumPy >= 2.1, whose from_dlpack asks for DLPack 1.x, the form
that says an array is writable (older NumPy makes every array read-only).

    python examples/numpy_trainer.py --steps 20 --resume-at 10 \\
        --swap-dir ./swap
"""
from __future__ import annotations

import argparse
import json
import os
from contextlib import ExitStack
from typing import Any, Optional

import numpy as np

import strata

SIZES = (64, 128, 10)  # inputs, hidden units, classes
LAYERS = ("fc1", "fc2")
BATCH = 32
SEED = 0
# AdamW with decoupled weight decay, the same every step.
HYPER = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
         "weight_decay": 0.1}
# Every role but the compute copy lives in the swap files.
STATE_ON_NVME = {"master": "nvme", "state1": "nvme", "state2": "nvme",
                 "grad": "nvme"}

Params = dict[str, dict[str, np.ndarray]]  # layer -> {"w": ..., "b": ...}


def shapes() -> dict[str, dict[str, tuple[int, ...]]]:
    """Each layer's tensors: w is (out, in), b is (out,)."""
    return {name: {"w": (out, inp), "b": (out,)}
            for name, inp, out in zip(LAYERS, SIZES, SIZES[1:])}


def initial_weights(seed: int = SEED) -> Params:
    """He-initialized weights and zero biases, fp32."""
    rng = np.random.default_rng(seed)
    params: Params = {}
    for name, tensors in shapes().items():
        out, inp = tensors["w"]
        w = rng.normal(0.0, np.sqrt(2.0 / inp), (out, inp))
        params[name] = {"w": w.astype(np.float32),
                        "b": np.zeros(out, np.float32)}
    return params


def batch(step: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Step `step`'s batch: Gaussian inputs labelled by a fixed random
    linear teacher. A function of the step alone, so a resumed run sees
    the batches the uninterrupted one saw."""
    teacher = np.random.default_rng(seed + 1).normal(
        size=(SIZES[-1], SIZES[0])).astype(np.float32)
    x = np.random.default_rng((seed, step)).normal(
        size=(BATCH, SIZES[0])).astype(np.float32)
    return x, np.argmax(x @ teacher.T, axis=1)


def forward_backward(params: Params, x: np.ndarray, y: np.ndarray
                     ) -> tuple[float, Params]:
    """Softmax cross-entropy of the MLP on (x, y), and its gradients, all
    in fp32."""
    w1, b1 = params["fc1"]["w"], params["fc1"]["b"]
    w2, b2 = params["fc2"]["w"], params["fc2"]["b"]
    h = x @ w1.T + b1
    a = np.maximum(h, np.float32(0))
    logits = a @ w2.T + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(p[rows, y]).mean())
    dlogits = p
    dlogits[rows, y] -= np.float32(1)
    dlogits /= np.float32(len(y))
    dh = (dlogits @ w2) * (h > 0)
    grads = {"fc2": {"w": dlogits.T @ a, "b": dlogits.sum(axis=0)},
             "fc1": {"w": dh.T @ x, "b": dh.sum(axis=0)}}
    return loss, grads


class Trainer:
    """An engine with one group per layer, and an AdamW optimizer over
    them. Close it (or use it in a with block) to remove its swap files."""

    def __init__(self, swap_dir: str) -> None:
        self.engine = strata.Engine(
            device="host", device_budget=4 << 20, host_budget=16 << 20,
            nvme_budget=32 << 20, swap_dir=swap_dir, home=STATE_ON_NVME,
            device_roles="compute")
        try:
            self.groups = {
                name: self.engine.register_group(
                    name, [(t, shape, "fp32") for t, shape in tensors.items()])
                for name, tensors in shapes().items()}
            self.optimizer = strata.Optimizer(self.engine, algo="adamw")
        except BaseException:
            self.engine.close(force=True)
            raise

    def close(self) -> None:
        self.optimizer.close()
        self.engine.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException],
                 traceback: Any) -> None:
        if error is None:
            self.close()
        else:  # the exception propagates; the swap files still go
            self.engine.__exit__(kind, error, traceback)

    def write_weights(self, params: Params) -> None:
        """Writes `params` into the compute copies, and only there."""
        for name, g in self.groups.items():
            with self.engine.fetch(g, "host", roles="compute",
                                   write=True) as view:
                for t, value in params[name].items():
                    view.numpy(t)[:] = value

    def weights(self) -> Params:
        """Copies of the compute copies (the weights the next step uses)."""
        out: Params = {}
        for name, g in self.groups.items():
            with self.engine.fetch(g, "host", roles="compute") as view:
                out[name] = {t: view.numpy(t).copy() for t in ("w", "b")}
        return out

    def step(self, step: int) -> float:
        """One training step on batch(step); returns its loss."""
        x, y = batch(step)
        self.engine.begin_step()
        self.optimizer.begin_step(**HYPER)
        with ExitStack() as views:
            params = {}
            for name, g in self.groups.items():
                view = views.enter_context(
                    self.engine.fetch(g, "device", roles="compute"))
                params[name] = {t: view.numpy(t) for t in ("w", "b")}
            loss, grads = forward_backward(params, x, y)
            del params  # the arrays hold their fetches
        for name in reversed(LAYERS):  # backward order: last layer first
            with self.optimizer.acquire_gradients(self.groups[name]) as buf:
                for t, value in grads[name].items():
                    buf.numpy(t)[:] = value
        report = self.optimizer.finish_step()
        self.engine.end_step()
        assert report.step == step + 1 and not report.skipped, report
        return loss

    def save(self, path: str, next_step: int) -> None:
        self.optimizer.save(path, json.dumps({"next_step": next_step}))

    def load(self, path: str) -> int:
        """Loads a checkpoint of save(); returns the step to go on with."""
        next_step = json.loads(self.optimizer.load(path))["next_step"]
        assert next_step == self.optimizer.step
        return next_step


def train(swap_dir: str, steps: int, resume_at: Optional[int] = None,
          checkpoint: Optional[str] = None, verbose: bool = False
          ) -> tuple[list[float], Params]:
    """Trains `steps` steps from initial_weights(); with `resume_at`, saves
    a checkpoint (to `checkpoint`, default <swap_dir>/checkpoint) after
    that many steps, closes everything, and goes on in a new engine and
    optimizer loaded from it. Returns the losses and the final weights."""
    checkpoint = checkpoint or os.path.join(swap_dir, "checkpoint")
    stop = steps if resume_at is None else resume_at
    losses: list[float] = []

    def run(trainer: Trainer, first: int, last: int) -> None:
        for step in range(first, last):
            losses.append(trainer.step(step))
            if verbose:
                print(f"step {step + 1:4d}  loss {losses[-1]:.6f}")

    with Trainer(swap_dir) as trainer:
        trainer.write_weights(initial_weights())
        run(trainer, 0, stop)
        if resume_at is None:
            return losses, trainer.weights()
        trainer.save(checkpoint, stop)
    if verbose:
        print(f"saved {checkpoint} after step {stop}; closed; reopening")
    with Trainer(swap_dir) as trainer:
        first = trainer.load(checkpoint)
        run(trainer, first, steps)
        return losses, trainer.weights()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--resume-at", type=int, default=None,
                    help="checkpoint after this many steps, close, reopen, "
                         "load and go on (default: steps // 2; -1: never)")
    ap.add_argument("--swap-dir", required=True,
                    help="the NVMe swap directory (made if missing)")
    ap.add_argument("--checkpoint", default=None,
                    help="checkpoint directory (default: "
                         "<swap-dir>/checkpoint)")
    args = ap.parse_args()
    if tuple(int(v) for v in np.__version__.split(".")[:2]) < (2, 1):
        ap.error(f"NumPy {np.__version__} gives read-only DLPack arrays; "
                 f"this needs NumPy >= 2.1")
    resume_at = args.steps // 2 if args.resume_at is None else args.resume_at
    if resume_at >= args.steps:
        ap.error("--resume-at must be below --steps")
    os.makedirs(args.swap_dir, exist_ok=True)
    train(args.swap_dir, args.steps, None if resume_at < 0 else resume_at,
          args.checkpoint, verbose=True)


if __name__ == "__main__":
    main()
