"""The package around the binding: `python -m strata`, strata.info() and
pyproject.toml (checked against the tree, not built: a wheel rebuilds the
whole library)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import strata
from strata.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m strata ARGS` in a fresh interpreter, from /."""
    return subprocess.run([sys.executable, "-m", "strata", *args], cwd="/",
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


def _tier_line(text: str, tier: str) -> str:
    return next(line for line in text.splitlines()
                if line.startswith(f"  {tier} "))


def test_version_command_names_package_and_library() -> None:
    out = _run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (f"strata {strata.__version__} "
                          f"(libstrata {strata.version()})\n")


def test_info_names_device_tiers_budgets_and_homes(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = strata.info()
    assert capsys.readouterr().out.strip() == text
    assert "device: " in text and "device_reason: " in text
    assert "tiers (the probe engine's" in text
    assert "budget 1.0 MiB (1048576 B)" in _tier_line(text, "device")
    host = _tier_line(text, "host")
    assert "1.0 MiB" in host
    assert "home of: compute, master, state1, state2, grad" in host
    assert "(no NVMe tier)" in _tier_line(text, "nvme")


def test_info_shows_the_budgets_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = strata.info(budgets={"device": 8 << 30, "host": 64 << 30})
    assert "tiers (the budgets given)" in text
    assert "8.0 GiB (8589934592 B)" in _tier_line(text, "device")
    assert "64.0 GiB" in _tier_line(text, "host")
    assert "not given" in _tier_line(text, "nvme")
    with pytest.raises(ValueError, match="unknown tier 'disk'"):
        strata.info(budgets={"disk": 1})
    with pytest.raises(ValueError, match="not both"):
        strata.info({}, budgets={"host": 1})


def test_info_command_reads_a_ds_config(
        scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    config = scratch / "ds_config.json"
    config.write_text(json.dumps({
        "zero_optimization": {
            "stage": 3, "offload_param": {"device": "cpu"},
            "offload_optimizer": {"device": "nvme",
                                  "nvme_path": str(scratch)}},
        "strata": {"device": "host", "host_budget": "3G"}}))
    assert main(["info", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "device_reason: host-emulated device requested" in out
    assert f"tiers ({config})" in out
    assert "from the model's sizes" in _tier_line(out, "device")
    host = _tier_line(out, "host")
    assert "3.0 GiB" in host and host.endswith("home of: compute")
    nvme = _tier_line(out, "nvme")
    # fp32 with the state on NVMe in overlap mode: steps speculate (each
    # waits for the overflow check), so there is a master.
    assert "home of: master, state1, state2, grad" in nvme
    assert f"swap_dir {scratch}" in nvme
    assert main(["info", "--config", str(scratch / "missing.json")]) == 1
    assert "cannot read the config" in capsys.readouterr().err


def test_a_config_without_torch_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torch", "strata.torch", "strata.torch.config"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"strata-offload\[torch\]"):
        strata.info({"strata": {"device": "host"}})


def test_import_strata_and_info_leave_torch_alone() -> None:
    code = ("import sys, strata; strata.info(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "False"


def test_pyproject_declares_what_the_tree_has() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    skbuild = project["tool"]["scikit-build"]
    cmake = (ROOT / "CMakeLists.txt").read_text()
    cmake_version = re.search(r"project\(strata VERSION (\S+)", cmake)
    assert cmake_version is not None
    assert (project["project"]["version"] == strata.__version__
            == cmake_version.group(1))
    assert (ROOT / project["project"]["readme"]).is_file()
    for package in skbuild["wheel"]["packages"]:
        assert (ROOT / package / "__init__.py").is_file()
        assert (ROOT / package / "torch" / "__init__.py").is_file()
    for option in skbuild["cmake"]["define"]:
        assert f"option({option} " in cmake
    for component in skbuild["install"]["components"]:
        assert f"COMPONENT {component}" in cmake
    sources = "".join(p.read_text() for p in ROOT.glob("*/CMakeLists.txt"))
    for target in skbuild["build"]["targets"]:
        assert f"add_library({target} SHARED" in sources
    build_dir = Path(skbuild["build-dir"])
    assert build_dir.parts[0] == "build" and len(build_dir.parts) > 2
