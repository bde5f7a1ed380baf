"""Fixtures of the Python package's tests: a scratch directory on a real
disk (O_DIRECT), a small host-emulated engine, and a watchdog on every
test."""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import strata


# A test that runs this long hangs (the slowest takes seconds): every
# thread's stack is printed and the run ends failed, instead of stalling CI.
WATCHDOG_S = 300


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    # The process's own stderr: pytest's capture of sys.stderr would take
    # the stacks with it when the watchdog ends the run.
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True,
                                      file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


def pytest_configure(config: pytest.Config) -> None:
    """The Ctrl-C tests send SIGINT to this process and to the ranks it
    starts. A shell without job control starts a background command with
    SIGINT ignored, and Python then installs no handler for it, nor do the
    Python children, which inherit the ignored signal: the signal would
    never come and those tests would wait for their watchdogs. Handling
    SIGINT here as a foreground Python does gives the children the
    default disposition too (a handled signal is reset at exec)."""
    del config
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = os.environ.get("STRATA_TEST_TMPDIR") or None
    if root:
        os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix="py-") as path:
        yield Path(path)


@pytest.fixture
def engine() -> Iterator[strata.Engine]:
    with strata.Engine(device="host", device_budget=1 << 20,
                       host_budget=8 << 20, io_threads=1) as e:
        yield e
