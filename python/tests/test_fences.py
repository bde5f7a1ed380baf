"""Fences through the Python API on the host-emulated device, with a stream
whose "kernels" run late (libstrata_fake_stream, tests/capi): strata must
order its copies after the work queued on the stream it was handed, as a
GPU's would run long after the CPU moved on."""
from __future__ import annotations

import ctypes as C
import os
import threading
import time
from typing import Iterator

import numpy as np
import pytest
import torch

import strata

N = 4096


class FakeStream:
    """A strata::HostStream whose queued copies run only on run()."""

    def __init__(self) -> None:
        path = os.environ.get("STRATA_FAKE_STREAM")
        if not path:
            pytest.fail("STRATA_FAKE_STREAM is not set: run the suite "
                        "through ctest (python.pytest)")
        self.lib = C.CDLL(path)
        self.lib.fake_stream_create.restype = C.c_void_p
        for name in ("destroy", "run"):
            getattr(self.lib, f"fake_stream_{name}").argtypes = [C.c_void_p]
        self.lib.fake_stream_queue_copy.argtypes = [
            C.c_void_p, C.c_void_p, C.c_void_p, C.c_size_t]
        self.address: int = self.lib.fake_stream_create()

    def queue_copy(self, dst: int, src: int, size: int) -> None:
        self.lib.fake_stream_queue_copy(self.address, dst, src, size)

    def run_later(self, seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, self.lib.fake_stream_run,
                                (self.address,))
        timer.start()
        return timer

    def close(self) -> None:
        self.lib.fake_stream_run(self.address)
        self.lib.fake_stream_destroy(self.address)


@pytest.fixture
def stream() -> Iterator[FakeStream]:
    s = FakeStream()
    yield s
    s.close()


def test_a_hand_off_waits_for_the_kernels_writing_the_gradients(
        engine: strata.Engine, stream: FakeStream) -> None:
    engine.register_group("layer", [("w", (N,), "fp32")])
    ones = np.ones(N, np.float32)
    with strata.Optimizer(engine, threads=1) as opt:
        opt.begin_step(lr=1e-3)
        grads = opt.acquire_gradients(0)
        stream.queue_copy(grads.tensors[0].data, ones.ctypes.data, ones.nbytes)
        opt.hand_off(grads, stream=stream.address)  # does not wait
        time.sleep(0.05)  # a pipeline ignoring the fence copies zeros now
        stream.run_later(0.0).join()
        report = opt.finish_step()
    assert not report.skipped and report.grad_norm == pytest.approx(
        np.sqrt(N))
    with engine.fetch(0, "host", roles="master") as view:
        master = np.from_dlpack(view.export("w", "master"))
        assert np.allclose(master, -1e-3, atol=1e-7)


def test_a_released_view_is_not_reused_before_its_readers_ran(
        stream: FakeStream) -> None:
    chunk = 64 << 10  # one group; the device holds two
    with strata.Engine(device="host", device_budget=2 * chunk,
                       host_budget=16 * chunk, io_threads=1) as engine:
        for g in range(3):
            engine.register_group(f"g{g}", [("w", (chunk // 4,), "fp32")],
                                  roles="compute")
            with engine.fetch(g, "host", write=True) as view:
                torch.from_dlpack(view.export("w")).fill_(g + 1)
        out = np.zeros(chunk // 4, np.float32)
        first = engine.fetch(0, "device")
        stream.queue_copy(out.ctypes.data, first.tensors[0].data, chunk)
        first.release(stream.address)  # the reader above has not run

        def others() -> None:  # both held: one must take group 0's room
            views = [engine.fetch(g, "device") for g in (1, 2)]
            for view in views:
                view.release()
        thread = threading.Thread(target=others)
        thread.start()
        thread.join(0.1)
        waited = thread.is_alive()
        stream.lib.fake_stream_run(stream.address)
        thread.join()
        assert waited, "group 0's device memory was reused before the " \
            "kernel reading it ran"
        assert np.all(out == 1), "the kernel read overwritten memory"
