"""bench/deepspeed_offload_bench.py and bench/ranks_bench.py end to end on
a tiny GPT: their workers start, train the same batches, agree with torch
and report every figure (the timings are the benchmark's business, not a
test's). DeepSpeed's side
runs only where bench/ds_venv.py's venv and its JIT-built ops already are:
building them takes minutes, which a test must not."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[3] / "bench"
BENCH = BENCH_DIR / "deepspeed_offload_bench.py"
RANKS = BENCH_DIR / "ranks_bench.py"
TINY = ["--width", "64", "--layers", "2", "--seq", "32", "--batch", "2",
        "--rounds", "2", "--block", "1", "--warmup", "1", "--threads", "1"]

pytestmark = pytest.mark.skipif(not BENCH.is_file(), reason="no bench/ "
                                "beside the tests (the GPU bundle has none)")


def run_bench(scratch: Path, *extra: str) -> dict[str, Any]:
    """The bench's JSON summary, after checking it exited 0."""
    out = scratch / "bench.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--nvme", str(scratch / "swap"),
         "--json", str(out), *TINY, *extra],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "losses per step" in done.stdout
    return json.loads(out.read_text())


def check_rows(summary: dict[str, Any], names: set[str]) -> None:
    """Every figure of every worker is there and plausible."""
    rows = summary["workers"]
    assert set(rows) == names
    for name, row in rows.items():
        assert row["median_step_s"] > 0 and row["peak_rss_bytes"] > 0, name
        assert len(row["losses"]) == 3 and row["threads"] == 1, name
        assert 0 < sum(row["phases_s"].values()) <= max(
            row["step_seconds"]), name
        if name.startswith("strata-"):
            assert 0 <= row["hidden_s"] <= row["optimizer_s"], name
            assert summary["loss_drift"][name] <= 1e-5, name


def test_strata_side_runs_and_reports(scratch: Path) -> None:
    summary = run_bench(scratch, "--no-deepspeed", "--settings",
                        "param-nvme")
    check_rows(summary, {"torch", "strata-param-nvme"})
    # One worker at a time (--schedule alone, the default).
    alive = sorted(row["alive"] for row in summary["workers"].values())
    assert alive[0][1] <= alive[1][0], alive
    assert summary["workers"]["strata-param-nvme"]["write_bytes_per_step"] \
        > 0
    assert (scratch / "swap" / "strata-param-nvme").is_dir()


def ds_ready() -> str:
    """Why DeepSpeed's side cannot run here now, or "" when it can."""
    sys.path.insert(0, str(BENCH_DIR))
    import ds_venv
    python = Path(ds_venv.DS_VENV) / "bin" / "python"
    ops = Path(ds_venv.DS_EXTENSIONS)
    if not python.is_file():
        return f"no DeepSpeed venv at {ds_venv.DS_VENV} (bench/ds_venv.py)"
    if not list(ops.glob("cpu_adam/*.so")):
        return f"DeepSpeed's cpu_adam op is not built in {ops} yet"
    return ""


def test_deepspeed_side_runs_and_reports(scratch: Path) -> None:
    why = ds_ready()
    if why:
        pytest.skip(why)
    summary = run_bench(scratch, "--settings", "host")
    check_rows(summary, {"torch", "ds-host", "strata-host"})
    assert summary["versions"]["deepspeed"]
    assert summary["loss_drift"]["ds-host"] < 0.1


def test_the_ranks_bench_runs_and_reports(scratch: Path) -> None:
    """strata at 1 and 2 ranks, with DeepSpeed at 2 where it is ready."""
    out = scratch / "ranks.json"
    ds = [] if ds_ready() else ["--no-deepspeed"]
    done = subprocess.run(
        [sys.executable, str(RANKS), "--nvme", str(scratch / "swap"),
         "--json", str(out), "--worlds", "1,2", *TINY[:-2], *ds],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(out.read_text())
    rows, plans = summary["variants"], summary["plans"]
    names = {"strata-1", "strata-2"} | (
        set() if ds else {"ddp-2", "ds-2", "strata-2 (vs ds)"})
    assert set(rows) == names
    # One variant at a time (--schedule alone, the default).
    alive = sorted(row["alive"] for row in rows.values())
    assert all(a[1] <= b[0] for a, b in zip(alive, alive[1:])), alive
    for name, row in rows.items():
        assert row["median_step_s"] > 0, name
        assert len(row["peak_rss_bytes"]) == row["world"], name
        assert len(row["losses"]) == 3, name
    one, two = rows["strata-1"], rows["strata-2"]
    assert one["collective_bytes"] == 0 < two["collective_bytes"]
    # Each of two ranks reads and writes about half the swap bytes of one.
    for pair in ("nvme->host", "host->nvme"):
        assert 0.3 < two["tier_bytes"][pair] / one["tier_bytes"][pair] < 0.7
    assert plans["1"]["network"] == 0 < plans["2"]["network"]
    assert plans["2"]["params_per_rank"] * 2 >= plans["1"]["params_per_rank"]
    if not ds:
        assert summary["target_met"] in (True, False)
