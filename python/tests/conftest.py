"""Fixtures of the Python package's tests: a scratch directory on a real
disk (O_DIRECT) and a small host-emulated engine."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import strata


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
