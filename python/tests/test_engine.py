"""The Engine through Python: groups, views, DLPack, and errors that are
exceptions carrying strata's status and message, never a crash."""
from __future__ import annotations

import numpy as np
import pytest

import strata


def test_version_and_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert strata.version() == strata.__version__
    text = strata.info()
    assert "device:" in text and "aio_backend:" in text
    assert capsys.readouterr().out.strip() == text


def test_a_write_through_dlpack_is_read_back(
        engine: strata.Engine) -> None:
    g = engine.register_group("layer.0", [("w", (3, 5), "fp32")])
    with engine.fetch(g, "device", roles="compute", write=True) as view:
        w = view.numpy("w")
        assert w.shape == (3, 5) and w.dtype == np.float32
        w[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
    del w  # it held the fetch
    engine.evict(g, "device")
    with engine.fetch(g, "host", roles="compute") as view:
        w = np.from_dlpack(view.export("w"))
        assert (w.reshape(-1) == np.arange(15)).all()


def test_errors_are_exceptions_with_status_and_fix(
        engine: strata.Engine) -> None:
    with pytest.raises(strata.StrataError) as error:
        engine.fetch(7, "host")
    assert error.value.status == "invalid argument"
    assert "strata_group_register" in error.value.message
    with pytest.raises(strata.StrataError) as error:
        strata.Engine(device="host", device_budget=0, host_budget=1 << 20)
    assert "device_budget" in str(error.value)
    with pytest.raises(ValueError, match="unknown tier"):
        engine.fetch(0, "disk")
    with pytest.raises(strata.StrataError, match="does not fit|budget"):
        engine.register_group("huge", [("w", (1 << 30,), "fp32")])


def test_a_released_view_cannot_be_exported(engine: strata.Engine) -> None:
    g = engine.register_group("layer.0", [("w", (8,), "bf16")])
    view = engine.fetch(g, "host")
    view.release()
    view.release()  # a second release of the Python object is a no-op
    with pytest.raises(strata.StrataError, match="released already"):
        view.export("w")


def test_a_prefetch_makes_the_next_fetch_a_hit(
        engine: strata.Engine) -> None:
    g = engine.register_group("layer.0", [("w", (64,), "fp32")])
    with engine.fetch(g, "host", roles="compute", write=True):
        pass
    engine.evict(g, "device")
    engine.prefetch(g, "device", "compute")
    engine.drain()
    assert engine.stats()["prefetches"] == 1
    with engine.fetch(g, "device", roles="compute"):
        pass
    assert engine.stats()["prefetch_hits"] == 1
    with pytest.raises(strata.StrataError, match="strata_group_register"):
        engine.prefetch(9, "device")
