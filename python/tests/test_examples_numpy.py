"""examples/numpy_trainer.py (issue #31 §6, §7.2): the NumPy trainer's
weights, with its AdamW state on NVMe and a checkpoint, close, reopen and
load in the middle, are bit-identical to a plain NumPy AdamW written here
from include/strata/cpu_adam.h, and to the same run without the resume."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import strata

try:  # python.pytest puts examples/ on PYTHONPATH (in the tree and bundle)
    import numpy_trainer as ex
except ImportError:
    sys.path.append(str(Path(__file__).resolve().parents[2] / "examples"))
    import numpy_trainer as ex

STEPS = 12
RESUME_AT = 5
F32 = np.float32


def adamw(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray,
          t: int, lr: float, beta1: float, beta2: float, eps: float,
          weight_decay: float) -> None:
    """One AdamW step in place, as cpu_adam.h specifies it: the step
    scalars computed in double and rounded to fp32 once (MakeStepConsts in
    cpu_adam/optimizer.cc), then fp32 operations in torch 1.13's order with
    no fused multiply-add (UpdateVector in cpu_adam/kernel_body.h):
      p = p * (1 - lr * wd)
      m = m * beta1 + (1 - beta1) * g
      v = v * beta2 + ((1 - beta2) * g) * g
      p = p + (-lr / (1 - beta1^t) * m) / (sqrt(v) * (1/sqrt(1 - beta2^t))
                                           + eps)
    The gradient's prescale (1 / loss_scale times the clip coefficient) is
    1.0 here, which multiplies exactly, so it is left out."""
    decay = F32(1.0 - lr * weight_decay)
    neg_lr = F32(-(lr / (1.0 - beta1 ** t)))
    inv_bc2_sqrt = F32(1.0 / math.sqrt(1.0 - beta2 ** t))
    p[...] = p * decay
    m[...] = m * F32(beta1) + F32(1.0 - beta1) * g
    v[...] = v * F32(beta2) + (F32(1.0 - beta2) * g) * g
    denom = np.sqrt(v) * inv_bc2_sqrt + F32(eps)
    p[...] = p + (neg_lr * m) / denom


def reference(steps: int) -> tuple[list[float], ex.Params]:
    """The example's model, batches and gradients, stepped by adamw()."""
    params = ex.initial_weights()
    m = {k: {t: np.zeros_like(a) for t, a in d.items()}
         for k, d in params.items()}
    v = {k: {t: np.zeros_like(a) for t, a in d.items()}
         for k, d in params.items()}
    losses = []
    for step in range(steps):
        loss, grads = ex.forward_backward(params, *ex.batch(step))
        losses.append(loss)
        for layer, tensors in params.items():
            for t, p in tensors.items():
                assert p.dtype == grads[layer][t].dtype == np.float32
                adamw(p, grads[layer][t], m[layer][t], v[layer][t],
                      step + 1, **{k: ex.HYPER[k] for k in (
                          "lr", "beta1", "beta2", "eps", "weight_decay")})
    return losses, params


def assert_bits_equal(got: ex.Params, want: ex.Params) -> None:
    for layer, tensors in want.items():
        for t, w in tensors.items():
            g = got[layer][t]
            assert g.dtype == w.dtype and g.shape == w.shape
            same = g.view(np.uint32) == w.view(np.uint32)
            assert same.all(), (
                f"{layer}.{t}: {np.count_nonzero(~same)} of {same.size} "
                f"elements differ, e.g. {g[~same][:3]} vs {w[~same][:3]}")


@pytest.fixture
def swap(scratch: Path) -> Path:
    (scratch / "swap").mkdir()
    return scratch / "swap"


def test_resumed_run_matches_numpy_adamw_bit_for_bit(swap: Path) -> None:
    losses, weights = ex.train(str(swap), STEPS, resume_at=RESUME_AT)
    want_losses, want = reference(STEPS)
    assert_bits_equal(weights, want)
    assert losses == want_losses
    assert losses[-1] < losses[0]  # it learns
    assert not any(p.name.startswith("strata-swap")
                   for p in swap.iterdir())  # closed: swap files gone


def test_resume_changes_no_bit(swap: Path) -> None:
    _, straight = ex.train(str(swap), STEPS)
    _, resumed = ex.train(str(swap), STEPS, resume_at=RESUME_AT,
                          checkpoint=str(swap.parent / "ckpt"))
    assert_bits_equal(resumed, straight)
    assert (swap.parent / "ckpt" / "manifest.json").is_file()


def test_the_state_lives_on_nvme_and_the_device_holds_compute_copies(
        swap: Path) -> None:
    """What the example claims about placement: a step writes the AdamW
    state to the swap files, and a device fetch gives host memory that
    View.numpy reads in place."""
    with ex.Trainer(str(swap)) as trainer:
        trainer.write_weights(ex.initial_weights())
        trainer.step(0)
        trainer.step(1)
        stats = trainer.engine.stats()
        assert stats["bytes"]["host"]["nvme"] > 0
        assert stats["bytes"]["nvme"]["host"] > 0
        with trainer.engine.fetch(trainer.groups["fc1"], "device",
                                  roles="compute") as view:
            assert {t.tier for t in view.tensors} == {"device"}
            assert view.numpy("w").shape == (128, 64)
        with pytest.raises(strata.StrataError, match="device_roles"):
            trainer.engine.fetch(trainer.groups["fc1"], "device",
                                 roles="master")


def test_the_command_line_prints_losses_without_torch(swap: Path) -> None:
    """The script as a user runs it, in a fresh interpreter that never
    imports torch."""
    argv = ["numpy_trainer.py", "--steps", "4", "--resume-at", "2",
            "--swap-dir", str(swap)]
    code = ("import runpy, sys; sys.argv = %r; "
            "runpy.run_path(%r, run_name='__main__'); "
            "assert 'torch' not in sys.modules, 'the example imported torch'"
            % (argv, ex.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert [line.split()[1] for line in out if line.startswith("step")] \
        == ["1", "2", "3", "4"]
    assert any(line.startswith("saved ") for line in out)
