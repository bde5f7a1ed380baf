"""What strata-train tells: the plan at start (where each role lives,
the bytes each tier holds, the predicted step floor from strata-plan), the
peak FLOPS that MFU is measured against, and the loss and throughput plot
of a run's log."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

import torch

from strata._native import lib
from strata.torch import StrataEngine

# Dense peaks in TFLOPS from the vendors' datasheets (SXM parts unless
# named), by the compute dtype: bf16/fp16 on the tensor cores, fp32 without
# TF32 (torch's default for matrix products). The first name found in the
# GPU's name wins.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
]
_GB = 1e9
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# strata-plan's assumed rates (tools/plan/cli.h), for the estimate made
# here when it is not found: NVMe read and write GB/s, CPU Adam Gparam/s.
_NVME_READ, _NVME_WRITE, _ADAM = 6.0, 4.0, 1.8


def peak_tflops(engine: StrataEngine, given: Optional[float]
                ) -> Optional[float]:
    """--peak-tflops, else the table's figure for the engine's GPU and
    compute dtype; None (MFU not shown) on a CPU or an unknown GPU."""
    if given is not None:
        return given
    if engine.device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(engine.device)
    for key, peaks in PEAK_TFLOPS:
        if key in name:
            return peaks[engine.ds_config.dtype]
    return None


def role_bytes(engine: StrataEngine, params: int) -> dict[str, int]:
    """The bytes of each role strata holds: the compute copies in the
    compute dtype, the fp32 master, optimizer state and gradients."""
    compute = params * _DTYPE_BYTES[engine.ds_config.dtype]
    return {role: compute if role == "compute" else 4 * params
            for role in engine.ds_config.homes()}


def plan_lines(engine: StrataEngine, params: int) -> list[str]:
    """The plan printed at start."""
    cfg = engine.ds_config
    homes = cfg.homes()
    sizes = role_bytes(engine, params)
    device = "GPU " + torch.cuda.get_device_name(engine.device) \
        if engine.device.type == "cuda" else "host-emulated device (no GPU)"
    lines = [f"plan: {device}, compute in {cfg.dtype}, optimizer "
             f"{cfg.algo} on the CPU ({cfg.mode})",
             "  role      home   bytes"]
    lines += [f"  {role:<9} {homes[role]:<6} {_size(sizes[role])}"
              for role in homes]
    budgets = engine.store.stats()["tiers"]
    lines.append("  tier      homed      budget")
    for tier in ("device", "host", "nvme"):
        homed = sum(sizes[r] for r, t in homes.items() if t == tier)
        lines.append(f"  {tier:<9} {_size(homed):<10} "
                     f"{_size(budgets[tier]['budget'])}")
    lines.append("  " + step_floor(engine, params, sizes))
    return lines


def step_floor(engine: StrataEngine, params: int,
               sizes: dict[str, int]) -> str:
    """The predicted step floor: strata-plan's, run with this model's
    numbers when it is found (on PATH or beside libstrata), else estimated
    here from the bytes homed on NVMe and the CPU optimizer's rate."""
    binary = _strata_plan()
    if binary is not None:
        plan = _run_plan(binary, engine, params)
        if plan is not None:
            floor = plan["floor"]
            return (f"step floor {floor['seconds']:.3g} s, bound by "
                    f"{floor['binding'].replace('_', ' ')} ({binary} with "
                    f"its assumed rates; `strata-plan --measure` measures "
                    f"this machine's)")
    nvme = sum(b for r, b in sizes.items()
               if engine.ds_config.homes()[r] == "nvme")
    drive = nvme / (_NVME_READ * _GB) + nvme / (_NVME_WRITE * _GB)
    adam = params / (_ADAM * _GB)
    binding = "NVMe (reads + writes)" if drive > adam else "CPU optimizer"
    return (f"step floor {max(drive, adam):.3g} s, bound by {binding} "
            f"(estimated here: strata-plan not found on PATH or beside "
            f"libstrata; rates assumed as strata-plan's)")


def _strata_plan() -> Optional[str]:
    found = shutil.which("strata-plan")
    if found:
        return found
    library = Path(lib().path).resolve().parent
    for candidate in (library / "strata-plan",
                      library.parent / "bin" / "strata-plan"):
        if candidate.is_file():
            return str(candidate)
    return None


def _run_plan(binary: str, engine: StrataEngine, params: int
              ) -> Optional[dict[str, Any]]:
    """strata-plan --json with the model's size, dtype and optimizer bytes
    per parameter; the optimizer's roles homed on NVMe when they are here
    (a host budget too small for them), the device budget when on a GPU.
    None when it fails (the plan is then estimated here)."""
    cfg = engine.ds_config
    states = 2 if cfg.algo in ("adam", "adamw") else 1
    k = 4 * states + (4 if cfg.master_weights else 0)
    cmd = [binary, "--json", "--params", str(params), "--dtype", cfg.dtype,
           "--k", str(max(k, 4))]
    if cfg.state_tier == "nvme":
        cmd += ["--host-budget", "1MiB"]
    if engine.device.type == "cuda":
        budget = engine.store.stats()["tiers"]["device"]["budget"]
        cmd += ["--device-budget", str(budget)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return json.loads(out.stdout) if out.returncode in (0, 2) else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None


def _size(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def plot(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """The loss and tokens/s against the step, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in records]
    fig, (loss, rate) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    loss.plot(steps, [r["loss"] for r in records])
    loss.set_ylabel("loss")
    loss.set_title(title)
    rate.plot(steps, [r["tokens_per_s"] for r in records], color="tab:green")
    rate.set_ylabel("tokens/s")
    rate.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
