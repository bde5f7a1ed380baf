"""bench/plot_nvme_log.py and bench/plot_nvme_sweep.py on records of the
shapes strata-nvme-bench writes (docs/cli.md): each draws a PNG, and a
file that is not one is named in a clear error."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / script), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(autouse=True)
def needs_matplotlib() -> None:
    pytest.importorskip("matplotlib")


def figures(gbps: float, runs: list[float]) -> dict:
    return {"bytes": int(gbps * 3e9), "seconds": 3.0, "gb_per_s": gbps,
            "iops": gbps * 1e9 / 4096, "runs_gb_per_s": runs,
            "lat_us": {"p50": 200.0}, "cpu": {"usr": 5.0, "sys": 60.0},
            "device": {"disk": "vda", "requests": 1000, "merges": 0,
                       "bytes": 4096000, "iops": 333.0,
                       "mean_request_bytes": 4096.0}}


def test_a_sweep_with_fio_beside_it_is_drawn(tmp_path: Path) -> None:
    records = []
    for rw, gbps in (("randread", 0.55), ("write", 8.4)):
        r = figures(gbps, [gbps * 0.97, gbps, gbps * 1.02])
        r.update(rw=rw, bs=4096, qd=32, threads=1)
        r["fio"] = figures(gbps * 1.01, [gbps, gbps * 1.01, gbps * 1.03])
        r["strata_over_fio"] = 1 / 1.01
        records.append(r)
    records.append(dict(figures(4.0, [4.0]), rw="read", bs=1 << 20, qd=32,
                        threads=2))  # no --vs-fio
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(records))
    done = run("plot_nvme_sweep.py", str(sweep))
    assert done.returncode == 0, done.stderr
    png = tmp_path / "sweep.png"
    assert done.stdout.strip() == str(png)
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_a_log_over_time_is_drawn(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    lines = [{"rw": "randread", "bs": 4096, "qd": 32, "threads": 1,
              "run": run_, "t": t, "bytes": 250_000_000, "ios": 61_000,
              "gb_per_s": 0.5, "iops": 122_000.0, "lat_mean_us": 260.0}
             for run_ in (1, 2) for t in (0.5, 1.0, 1.5, 1.52)]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "over-time.png"
    done = run("plot_nvme_log.py", str(log), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_log_with_fios_runs_draws_them_dashed_beside_stratas(
        tmp_path: Path) -> None:
    log = tmp_path / "vs-fio.jsonl"
    lines = [{"engine": engine, "rw": rw, "bs": 65536, "qd": 4, "threads": 2,
              "run": 1, "t": t, "bytes": 1_500_000_000, "ios": 22_900,
              "gb_per_s": 3.0, "iops": 45_800.0, "lat_mean_us": 170.0}
             for rw in ("randrw", "read") for engine in ("strata", "fio")
             for t in (0.5, 1.0, 1.2, 1.201)]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "vs-fio.png"
    done = run("plot_nvme_log.py", str(log), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)

    spec = importlib.util.spec_from_file_location(
        "plot_nvme_log", BENCH / "plot_nvme_log.py")
    plot_nvme_log = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_nvme_log)
    series = plot_nvme_log.read_log(str(log))
    assert [engine for _, engine in series] == ["strata", "fio"] * 2
    fig = plot_nvme_log.plot(series, str(tmp_path / "again.png"), "t")
    lines_drawn = {x.get_label(): x for x in fig.axes[0].get_lines()}
    for rw in ("randrw", "read"):
        label = f"{rw} bs=64K qd=4 thr=2"
        strata, fio = lines_drawn[label], lines_drawn[f"{label} fio"]
        assert strata.get_linestyle() == "-"
        assert fio.get_linestyle() == "--"
        assert strata.get_color() == fio.get_color()
    assert (lines_drawn["randrw bs=64K qd=4 thr=2"].get_color()
            != lines_drawn["read bs=64K qd=4 thr=2"].get_color())


def test_a_file_that_is_not_the_benchs_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("not json\n")
    for script in ("plot_nvme_sweep.py", "plot_nvme_log.py"):
        done = run(script, str(bad))
        assert done.returncode != 0
        assert str(bad) in done.stderr and "strata-nvme-bench" in done.stderr
