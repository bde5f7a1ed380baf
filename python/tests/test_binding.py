"""The binding's surface (issue #31 §3, §5): ints beyond the C types are
errors; Engine.save/load and the bytes per tier pair."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import strata
from test_optimizer import model

NVME_HOMES = dict.fromkeys(strata.ROLES, "nvme")


def nvme_engine(swap_dir: Path) -> strata.Engine:
    return strata.Engine(device="host", device_budget=1 << 20,
                         host_budget=8 << 20, nvme_budget=8 << 20,
                         swap_dir=str(swap_dir), io_threads=1)


def fill(view: strata.View, value: float) -> None:
    """Writes `value` into every fp32 tensor of the view (the ctypes way:
    NumPy's legacy DLPack import is read-only)."""
    for t in view.tensors:
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * (t.bytes // 4))
                              .from_address(t.data))[:] = value


# ---- ints beyond the C types ------------------------------------------------

def test_int_arguments_beyond_the_c_types_are_errors(
        engine: strata.Engine) -> None:
    """ctypes keeps the low bits: a group id of 2**40 fetched group 0, a
    step of 2**64 set step 0."""
    model(engine)
    with pytest.raises(OverflowError, match=r"strata_group_fetch_on: "
                       r"argument 2 .*int32_t \(-2147483648 to 2147483647\)"):
        engine.fetch(2**40, "host")
    with pytest.raises(OverflowError, match="strata_group_prefetch"):
        engine.prefetch(-2**31 - 1, "host")
    with pytest.raises(TypeError, match="strata_group_evict: argument 2 "
                       "takes an int, not bool"):
        engine.evict(True, "host")
    with pytest.raises(OverflowError, match=r"tensor 'w' shape\[0\] = "
                       r"18446744073709551624 does not fit int64_t"):
        engine.register_group("big", [("w", (2**64 + 8,), "fp32")])
    with strata.Optimizer(engine, threads=1) as opt:
        with pytest.raises(OverflowError, match="strata_optimizer_set_step"):
            opt.step = 2**64
        assert opt.step == 0
        with pytest.raises(OverflowError, match=r"groups\[0\] = 4294967296 "
                           "does not fit int32_t"):
            opt.begin_step(groups={2**32: {"lr": 0.0}})
    assert engine.stats()["fetches"] == 0


@pytest.mark.parametrize("options,match", [
    ({"host_budget": 2**64},
     r"strata_engine_options.host_budget = 18446744073709551616 does not "
     r"fit uint64_t \(0 to 18446744073709551615\)"),
    ({"nvme_budget": -1}, "strata_engine_options.nvme_budget = -1"),
    ({"io_threads": 2**32 + 1}, "strata_engine_options.io_threads"),
])
def test_engine_options_beyond_the_c_types_are_errors(
        options: dict[str, Any], match: str) -> None:
    """-1 became a 16 EiB budget and 2**64 a budget of 0."""
    kwargs = {"device": "host", "device_budget": 1 << 20,
              "host_budget": 1 << 20, **options}
    with pytest.raises(OverflowError, match=match):
        strata.Engine(**kwargs)


def test_option_fields_name_a_float_or_bool_given_for_an_int(
        engine: strata.Engine) -> None:
    with pytest.raises(TypeError, match=r"strata_engine_options.device_budget"
                       r" takes an int, not float"):
        strata.Engine(device="host", device_budget=1.5e6, host_budget=1 << 20)
    with pytest.raises(OverflowError, match="strata_optimizer_options."
                       "micro_batches"):
        strata.Optimizer(engine, micro_batches=2**32 + 1)
    with pytest.raises(TypeError, match="strata_optimizer_options.threads "
                       "takes an int, not bool"):
        strata.Optimizer(engine, threads=True)


# ---- Engine.save/load and stats ---------------------------------------------

def test_engine_save_and_load_round_trip(scratch: Path) -> None:
    swap = scratch / "swap"
    swap.mkdir(mode=0o700)
    with nvme_engine(swap) as e:
        g = e.register_group("layer.0", [("w", (64,), "fp32")],
                             home=NVME_HOMES)
        with e.fetch(g, "host", write=True) as view:
            fill(view, 5.0)
        e.save(str(scratch / "ckpt"), user_state='{"epoch": 3}')
        with e.fetch(g, "host", write=True) as view:
            fill(view, -1.0)
        assert e.load(str(scratch / "ckpt")) == '{"epoch": 3}'
        with e.fetch(g, "host", roles="master") as view:
            assert np.all(np.from_dlpack(view.export("w", "master")) == 5.0)
        assert e.load(str(scratch / "ckpt")) == '{"epoch": 3}'
        with pytest.raises(strata.StrataError, match="strata_engine_load"):
            e.load(str(scratch / "missing"))


def test_stats_give_the_bytes_per_tier_pair(scratch: Path) -> None:
    with nvme_engine(scratch) as e:
        g = e.register_group("layer.0", [("w", (1024,), "fp32")],
                             roles="compute", home={"compute": "nvme"})
        with e.fetch(g, "host", write=True) as view:
            fill(view, 1.0)
        e.evict(g, "host")
        e.drain()
        with e.fetch(g, "device"):
            pass
        moved = e.stats()["bytes"]
    assert set(moved) == set(strata.TIERS)
    assert all(set(row) == set(strata.TIERS) for row in moved.values())
    # Written back to the swap file, read from it, copied to the device.
    assert moved["host"]["nvme"] == moved["nvme"]["host"] == 4096
    assert moved["host"]["device"] == 4096
    assert moved["device"]["nvme"] == moved["device"]["host"] == 0
