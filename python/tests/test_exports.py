"""What the binding hands out cannot outlive its memory (issue #31 §2-§4):
arrays exported from a view hold its fetch past release() and close(),
NumPy writes through write views only, bf16 gets a clear way out, and a
gradient buffer's arrays go read-only at its hand-off."""
from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import strata

F32 = 16 * 1024  # elements: 64 KiB a group


def one_group_device() -> strata.Engine:
    """The device holds one group's fetch at a time (plus two gradient
    buffers of the small trained group 't')."""
    engine = strata.Engine(device="host", device_budget=F32 * 4 + (32 << 10),
                           host_budget=4 << 20, io_threads=1,
                           device_roles="compute")
    for name in "ac":
        engine.register_group(name, [("w", (F32,), "fp32")],
                              roles="compute")
    return engine


def fill(engine: strata.Engine, group: int, tier: str, value: float) -> None:
    with engine.fetch(group, tier, roles="compute", write=True) as view:
        array = view.numpy("w")
        array[:] = value
        del array


def values(engine: strata.Engine, group: int) -> set[float]:
    with engine.fetch(group, "host", roles="compute") as view:
        out = set(view.numpy("w").tolist())
    gc.collect()
    return out


def test_an_array_kept_past_release_holds_its_fetch() -> None:
    """The issue's case: today group a's released array read group c's 99,
    and a late write through it landed in c."""
    engine = one_group_device()
    fill(engine, 0, "host", 5.0)
    fill(engine, 1, "host", 1.0)
    view = engine.fetch(0, "device", roles="compute", write=True)
    kept = np.from_dlpack(view.export("w"))
    view.release()
    with pytest.raises(strata.StrataError, match="resource exhausted"):
        engine.fetch(1, "device", roles="compute", write=True)
    kept[:] = 6.0  # a late write lands in a, pinned
    del kept
    fill(engine, 1, "device", 99.0)
    engine.drain()
    assert values(engine, 0) == {6.0}
    assert values(engine, 1) == {99.0}
    engine.close()


def test_close_with_a_live_array_refuses_instead_of_crashing() -> None:
    """Reading the array after close() killed Python with SIGSEGV."""
    engine = one_group_device()
    fill(engine, 0, "host", 3.0)
    with engine.fetch(0, "host", roles="compute") as view:
        kept = view.numpy("w")
    with pytest.raises(strata.StrataError, match="pinned by DLPack exports"):
        engine.close()
    assert kept[7] == 3.0
    del kept
    engine.close()


def test_numpy_writes_through_write_views_only() -> None:
    """np.from_dlpack gave read-only arrays for every view (the legacy
    capsule); writing took a ctypes address trick."""
    engine = one_group_device()
    with engine.fetch(0, "host", roles="compute", write=True) as view:
        written = np.from_dlpack(view.export("w"))
        assert written.flags.writeable
        written[:] = 2.0
        del written
    with engine.fetch(0, "host", roles="compute") as view:
        read = view.numpy("w")
        assert not read.flags.writeable and read[0] == 2.0
        with pytest.raises(ValueError, match="read-only"):
            read[0] = 1.0
        del read
    engine.close()


def test_bf16_names_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 tensor through NumPy was a SystemError."""
    import ml_dtypes
    engine = strata.Engine(device="host", device_budget=1 << 20,
                           host_budget=4 << 20, io_threads=1)
    g = engine.register_group("b", [("w", (4, 4), "bf16")], roles="compute")
    with engine.fetch(g, "host", roles="compute", write=True) as view:
        with pytest.raises(RuntimeError, match="Unsupported dtype"):
            np.from_dlpack(view.export("w"))
        typed = view.numpy("w")
        assert typed.dtype == ml_dtypes.bfloat16 and typed.flags.writeable
        typed[:] = 2.0
        del typed
        with monkeypatch.context() as without:
            without.setitem(sys.modules, "ml_dtypes", None)  # not installed
            with pytest.raises(TypeError, match="bf16_bits=True.*ml_dtypes"):
                view.numpy("w")
        assert set(view.numpy("w", bf16_bits=True).ravel()) == {0x4000}
        bits = view.numpy("w", bf16_bits=True)
        assert bits.dtype == np.uint16 and bits.shape == (4, 4)
        bits[:] = 0x3F80  # 1.0 in bf16
        del bits
    with engine.fetch(g, "host", roles="compute") as view:
        assert set(view.numpy("w", bf16_bits=True).ravel()) == {0x3F80}
    gc.collect()
    engine.close()  # the refused capsule was freed: nothing holds the view


def test_gradient_arrays_go_read_only_at_hand_off() -> None:
    """A write after hand_off raced the copy: ignored 11 runs in 12."""
    engine = one_group_device()
    t = engine.register_group(
        "t", [("w", (F32 // 4,), "fp32")],
        roles=("compute", "master", "state1", "state2", "grad"))
    optimizer = strata.Optimizer(engine, mode="after_backward")
    engine.begin_step()
    optimizer.begin_step(lr=1e-3)
    grads = optimizer.acquire_gradients(t)
    array = grads.numpy("w")
    assert array.flags.writeable and array.shape == (F32 // 4,)
    array[:] = 1.0
    optimizer.hand_off(grads)
    assert not array.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 5.0
    optimizer.finish_step()
    engine.end_step()
    with pytest.raises(strata.StrataError, match="gradient buffers are alive"):
        optimizer.close()
    del array
    optimizer.close()
    engine.close()


def test_device_roles_size_the_device_budget() -> None:
    """A 1M-parameter bf16 layer with every role needed an 18 MiB device
    budget for 2 MiB of weights."""
    layer = [("w", (1024, 1024), "bf16")]
    with pytest.raises(strata.StrataError, match="device_roles"):
        with strata.Engine(device="host", device_budget=3 << 20,
                           host_budget=64 << 20) as engine:
            engine.register_group("layer", layer)
    with strata.Engine(device="host", device_budget=3 << 20,
                       host_budget=64 << 20,
                       device_roles="compute") as engine:
        g = engine.register_group("layer", layer)
        engine.fetch(g, "device", roles="compute").release()
        with pytest.raises(strata.StrataError, match="device_roles"):
            engine.fetch(g, "device", roles="master")


def test_a_group_of_its_own_homes_keeps_the_engines_device_roles() -> None:
    """register_group(home=...) counted every role on the device again,
    and advised the device_roles the engine already had."""
    with strata.Engine(device="host", device_budget=3 << 20,
                       host_budget=64 << 20,
                       device_roles="compute") as engine:
        g = engine.register_group("layer", [("w", (1024, 1024), "bf16")],
                                  home={"state1": "host"})
        engine.fetch(g, "device", roles="compute").release()


def test_an_export_dropped_unconsumed_is_swept_at_close() -> None:
    """NumPy refuses a bf16 tensor and drops the capsule: the fetch it
    held goes at the next sweep (close), and a late consumer of the
    capsule gets an error, not freed memory."""
    engine = strata.Engine(device="host", device_budget=1 << 20,
                           host_budget=4 << 20, io_threads=1)
    g = engine.register_group("b", [("w", (4, 4), "bf16")], roles="compute")
    with engine.fetch(g, "host", roles="compute") as view:
        capsule = view.export("w").__dlpack__(max_version=(1, 0))
        with pytest.raises(RuntimeError, match="Unsupported dtype"):
            np.from_dlpack(view.export("w"))
    with pytest.raises(strata.StrataError, match="pinned by DLPack exports"):
        engine.close()  # `capsule` is still held: it may be consumed
    del capsule
    engine.close()
