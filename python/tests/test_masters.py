"""Initial weights are never silently dropped (issue #31 §1): a group
registered with a master whose compute copy alone was written starts
training from those weights (Note [Masters from compute copies])."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import strata

ELEMENTS = 1000


def engine_with(dtype: str, state_home: str = "host",
                swap: Path | None = None) -> tuple[strata.Engine, int]:
    home = {r: state_home for r in ("master", "state1", "state2", "grad")}
    engine = strata.Engine(device="host", device_budget=1 << 20,
                           host_budget=16 << 20,
                           nvme_budget=(16 << 20) if swap else 0,
                           swap_dir=str(swap) if swap else None, home=home,
                           device_roles="compute", io_threads=1)
    return engine, engine.register_group("layer", [("w", (ELEMENTS,), dtype)])


def write_compute(engine: strata.Engine, group: int, values: np.ndarray
                  ) -> None:
    with engine.fetch(group, "host", roles="compute", write=True) as view:
        array = view.numpy("w", bf16_bits=True)
        array[:] = values
        del array


def read_compute(engine: strata.Engine, group: int) -> np.ndarray:
    with engine.fetch(group, "host", roles="compute") as view:
        return view.numpy("w", bf16_bits=True).copy()


def one_step_without_gradient(engine: strata.Engine, group: int) -> None:
    """AdamW with zero gradients and no weight decay leaves the weights."""
    with strata.Optimizer(engine, mode="after_backward") as optimizer:
        engine.begin_step()
        optimizer.begin_step(lr=1e-3)
        optimizer.hand_off(optimizer.acquire_gradients(group))
        optimizer.finish_step()
        engine.end_step()


WEIGHTS = {"fp32": np.float32(5.0),
           "bf16": np.uint16(0x40A0),  # 5.0 in bf16
           "fp16": np.float16(5.0)}


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_a_compute_copy_written_alone_is_what_training_starts_from(
        dtype: str) -> None:
    """Today: weights written as 5.0 came back as -0.001 after one step
    (the master was zeros)."""
    engine, g = engine_with(dtype)
    write_compute(engine, g, WEIGHTS[dtype])
    one_step_without_gradient(engine, g)
    assert (read_compute(engine, g) == WEIGHTS[dtype]).all()
    with engine.fetch(g, "host", roles="master") as view:
        assert (view.numpy("w", "master") == 5.0).all()
    engine.close()


def test_a_checkpoint_saved_before_the_first_step_keeps_them(
        scratch: Path) -> None:
    (scratch / "swap").mkdir()
    engine, g = engine_with("bf16", "nvme", scratch / "swap")
    write_compute(engine, g, WEIGHTS["bf16"])
    engine.save(str(scratch / "ckpt"))
    engine.close()
    engine, g = engine_with("bf16", "nvme", scratch / "swap")
    engine.load(str(scratch / "ckpt"))
    one_step_without_gradient(engine, g)
    assert (read_compute(engine, g) == WEIGHTS["bf16"]).all()
    engine.close()


@pytest.mark.parametrize("through_a_checkpoint", [False, True])
def test_every_role_fetched_for_writing_and_the_compute_copy_written(
        scratch: Path, through_a_checkpoint: bool) -> None:
    """The package docstring's pattern: fetch(write=True) of every role,
    then only the compute copy written. The master holds only zeros while
    the compute copy does not, which no step or load leaves: the first
    step widens it (also after a checkpoint saved before that step)."""
    engine, g = engine_with("bf16")
    with engine.fetch(g, "host", write=True) as view:
        array = view.numpy("w", bf16_bits=True)
        array[:] = WEIGHTS["bf16"]
        del array
    if through_a_checkpoint:
        engine.save(str(scratch / "ckpt"))
        engine.close()
        engine, g = engine_with("bf16")
        engine.load(str(scratch / "ckpt"))
    one_step_without_gradient(engine, g)
    assert (read_compute(engine, g) == WEIGHTS["bf16"]).all()
    engine.close()


def test_a_master_once_written_is_the_truth() -> None:
    """Writing the master sets the weights; a later write of the compute
    copy alone does not reach training (the step rewrites it from the
    master), as the headers say."""
    engine, g = engine_with("fp32")
    with engine.fetch(g, "host", roles=("compute", "master"),
                      write=True) as view:
        view.numpy("w")[:] = 1.0
        view.numpy("w", "master")[:] = 2.0
    write_compute(engine, g, np.float32(3.0))
    one_step_without_gradient(engine, g)
    assert (read_compute(engine, g) == 2.0).all()
    engine.close()


def test_a_master_written_alone_as_zeros_is_kept() -> None:
    """A master the caller wrote on its own is meant, zeros included (a
    zero-initialised adapter): only one fetched for writing together with
    the compute copy and left all zero is taken as unset."""
    engine, g = engine_with("fp32")
    write_compute(engine, g, np.float32(3.0))
    with engine.fetch(g, "host", roles="master", write=True) as view:
        view.numpy("w", "master")[:] = 0.0
    one_step_without_gradient(engine, g)
    assert (read_compute(engine, g) == 0.0).all()
    engine.close()
