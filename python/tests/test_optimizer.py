"""The optimizer through Python: a step moves the weights as AdamW says,
the report, save and load, and misuse as exceptions."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import strata

N = 1000


def model(engine: strata.Engine, groups: int = 2) -> None:
    for g in range(groups):
        engine.register_group(f"layer.{g}", [("w", (N,), "fp32"),
                                             ("b", (7,), "fp32")])


def step(opt: strata.Optimizer, groups: int = 2, value: float = 1.0,
         per_group: Optional[dict[int, dict[str, float]]] = None
         ) -> strata.StepReport:
    opt.begin_step(lr=1e-3, groups=per_group)
    for g in reversed(range(groups)):
        grads = opt.acquire_gradients(g)
        whole = np.from_dlpack(grads.export())
        assert whole.nbytes == grads.bytes
        for t in grads.tensors:  # the padding between them stays zero
            np.ctypeslib.as_array(
                (np.ctypeslib.ctypes.c_float * (t.bytes // 4)).from_address(
                    t.data))[:] = value
        opt.hand_off(grads)
    return opt.finish_step()


def master(engine: strata.Engine, group: int) -> np.ndarray:
    with engine.fetch(group, "host", roles="master") as view:
        return np.from_dlpack(view.export("w", "master")).copy()


def test_a_step_moves_each_weight_by_lr(engine: strata.Engine) -> None:
    model(engine)
    with strata.Optimizer(engine, threads=1) as opt:
        report = step(opt)
        assert report.step == 1 and not report.skipped
        assert opt.step == 1
        assert np.allclose(master(engine, 0), -1e-3, atol=1e-7)


def test_save_step_load_is_exact(engine: strata.Engine,
                                 scratch: Path) -> None:
    model(engine)
    with strata.Optimizer(engine, threads=1) as opt:
        step(opt)
        opt.save(str(scratch / "ckpt"), user_state='{"lr": 1}')
        saved = master(engine, 1)
        step(opt, value=0.5)
        assert not np.array_equal(master(engine, 1), saved)
        assert opt.load(str(scratch / "ckpt")) == '{"lr": 1}'
        assert opt.step == 1
        assert np.array_equal(master(engine, 1), saved)


def test_clipping_is_reported(engine: strata.Engine) -> None:
    model(engine)
    with strata.Optimizer(engine, threads=1, clip_norm=1.0) as opt:
        report = step(opt)
        assert report.clip_coef < 1.0
        assert report.grad_norm == pytest.approx(np.sqrt(2 * (N + 7)))


def test_an_unzeroed_buffer_holds_the_last_gradients_and_zero_gaps(
        engine: strata.Engine) -> None:
    """zeroed=False: the tensors keep what the last hand-off left (the
    caller overwrites them), the bytes between them are zeros."""
    model(engine, groups=1)
    with strata.Optimizer(engine, threads=1, grad_buffers=1) as opt:
        step(opt, groups=1, value=1.0)
        opt.begin_step(lr=1e-3)
        grads = opt.acquire_gradients(0, zeroed=False)
        whole = np.from_dlpack(grads.export()).view(np.uint8)
        covered = np.zeros(grads.bytes, dtype=bool)
        for t in grads.tensors:
            begin = t.data - grads.data
            covered[begin:begin + t.bytes] = True
            assert np.all(whole[begin:begin + t.bytes].view(np.float32) == 1)
        assert not covered.all() and np.all(whole[~covered] == 0)
        del whole
        opt.hand_off(grads)
        assert opt.finish_step().step == 2


def test_misuse_is_an_exception(engine: strata.Engine) -> None:
    model(engine)
    with pytest.raises(ValueError, match="unknown optimizer"):
        strata.Optimizer(engine, algo="sgd")
    with pytest.raises(strata.StrataError, match="micro_batches"):
        strata.Optimizer(engine, micro_batches=0)
    opt = strata.Optimizer(engine, threads=1)
    opt.begin_step()
    grads = opt.acquire_gradients(0)
    with pytest.raises(strata.StrataError, match="hand each off"):
        opt.close()
    with pytest.raises(strata.StrataError, match="strata_optimizer_close"):
        engine.close()
    opt.hand_off(grads)
    with pytest.raises(strata.StrataError, match="handed off already"):
        opt.hand_off(grads)
    with pytest.raises(strata.StrataError, match="handed off"):
        opt.finish_step()  # group 1 never was
    opt.close()


def test_groups_step_with_their_own_hyperparameters(
        engine: strata.Engine) -> None:
    """Group 1 with lr 0 stays; group 0 moves by the common lr; a loss
    scale of a group's own is refused (the gradients are scaled once)."""
    model(engine)
    with strata.Optimizer(engine, threads=1) as opt:
        step(opt, per_group={1: {"lr": 0.0}})
        assert np.allclose(master(engine, 0), -1e-3, atol=1e-7)
        assert np.array_equal(master(engine, 1), np.zeros(N, np.float32))
        with pytest.raises(ValueError, match="not loss_scale"):
            opt.begin_step(groups={0: {"loss_scale": 2.0}})
        with pytest.raises(strata.StrataError, match="group 7 .* not a "
                           "trained group"):
            opt.begin_step(groups={7: {"lr": 0.1}})


def test_an_aborted_step_changes_nothing_and_frees_its_buffers(
        engine: strata.Engine) -> None:
    """abort_step after a partial backward (issue #30 §2): with clipping the
    steps wait for the norm, so nothing moved; the buffer still held is
    ended with the step, the optimizer closes and the next step runs."""
    model(engine)
    opt = strata.Optimizer(engine, threads=1, clip_norm=1.0)
    step(opt)
    before = [master(engine, g) for g in (0, 1)]
    opt.begin_step(lr=1e-3)
    opt.hand_off(opt.acquire_gradients(1))
    held = opt.acquire_gradients(0)
    report = opt.abort_step()
    assert report == strata.AbortReport(applied=0, completed=False)
    assert opt.abort_step() == report  # between steps: nothing
    for g in (0, 1):
        assert np.array_equal(master(engine, g), before[g])
    with pytest.raises(strata.StrataError, match="handed off already"):
        opt.hand_off(held)
    assert step(opt).step == 2
    opt.close()
