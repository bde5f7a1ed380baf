"""Fixtures of the Python package's tests: a scratch directory on a real
disk (O_DIRECT), a small host-emulated engine, and a watchdog on every
test."""
from __future__ import annotations

import faulthandler
import os
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
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


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
