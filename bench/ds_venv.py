"""DeepSpeed's virtual environment for the benches that compare against it
(bench/ds_aio_compare.py, bench/deepspeed_offload_bench.py).

It lives outside the clone, once per machine, like strata's torch venv
(scripts/setup.sh): DS_VENV (/var/cache/strata/ds-venv, or
$STRATA_DS_VENV) with the torch of strata's venv (STRATA_TORCH, so both
sides run the same torch), DeepSpeed DS_VERSION, ninja, transformers (the
Llama) and torchao (its CPUOffloadOptimizer, a GPU-only peer).
DeepSpeed's ops (cpu_adam, async_io, ...) are JIT-built on first load into
DS_EXTENSIONS (/var/cache/strata/ds-ext, or $STRATA_DS_EXT), so they are
built once per machine, not once per run.
"""
from __future__ import annotations

import os
import subprocess
import sys

DS_VERSION = "0.19.8"
STRATA_TORCH = "2.11.0"  # scripts/setup.sh's STRATA_TORCH_PIP
DS_VENV = os.environ.get("STRATA_DS_VENV", "/var/cache/strata/ds-venv")
DS_EXTENSIONS = os.environ.get("STRATA_DS_EXT", "/var/cache/strata/ds-ext")
DEBIAN = ("libaio-dev", "python3-venv", "python3-dev", "g++")


def fail(prog: str, msg: str) -> None:
    """Says what went wrong, on stderr, and exits 1."""
    print(f"{prog}: {msg}", file=sys.stderr)
    sys.exit(1)


def run(prog: str, cmd: list[str], what: str,
        env: dict[str, str] | None = None) -> None:
    """Runs `cmd`, saying `what` first; exits with its output's tail when
    it fails."""
    print(f"{prog}: {what}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        fail(prog, f"{what} failed (exit {proc.returncode}):\n  "
             + "\n  ".join(tail))


def ds_env(venv: str = DS_VENV) -> dict[str, str]:
    """os.environ plus what DeepSpeed needs on this CPU-only machine: its
    CPU accelerator, the venv's ninja on PATH and the shared op cache."""
    return dict(os.environ, DS_ACCELERATOR="cpu",
                TORCH_EXTENSIONS_DIR=DS_EXTENSIONS,
                PATH=os.path.join(venv, "bin") + os.pathsep
                + os.environ.get("PATH", ""))


def ensure_venv(prog: str, venv: str = DS_VENV) -> str:
    """The venv's python, after creating the venv (torch STRATA_TORCH,
    deepspeed DS_VERSION, ninja, transformers, torchao) when it cannot
    import them;
    exits saying why when that fails."""
    py = os.path.join(venv, "bin", "python")
    check = [py, "-c", "import torch, deepspeed, transformers, ninja, torchao"]
    if os.path.exists(py) and \
            subprocess.run(check, capture_output=True).returncode == 0:
        return py
    need = [p for p in DEBIAN if subprocess.run(
        ["dpkg", "-s", p], capture_output=True).returncode != 0]
    if need:
        fail(prog, f"missing Debian packages {' '.join(need)}: run "
             "scripts/setup.sh, which installs them (STRATA_PACKAGES)")
    os.makedirs(DS_EXTENSIONS, exist_ok=True)
    if not os.path.exists(py):
        run(prog, ["/usr/bin/python3", "-m", "venv", venv],
            f"creating {venv}")
    pip = [py, "-m", "pip", "install", "-q"]
    run(prog, pip + ["-U", "pip", "setuptools", "wheel"], "updating pip")
    # PyPI's torch is a CUDA build (several GB) but runs on the CPU; the same
    # version as strata's venv, so both sides of a comparison run one torch.
    run(prog, pip + [f"torch=={STRATA_TORCH}", "ninja", "transformers",
                     "torchao"],
        f"installing torch {STRATA_TORCH}, ninja, transformers, torchao "
        "(large download)")
    # Prebuilding ops on the CPU accelerator links async_io without -laio;
    # build nothing now and let each op compile (correctly) on first load.
    run(prog, pip + ["--no-build-isolation", "--no-cache-dir",
                     f"deepspeed=={DS_VERSION}"],
        f"installing deepspeed {DS_VERSION}",
        dict(ds_env(venv), DS_BUILD_OPS="0"))
    if subprocess.run(check, capture_output=True).returncode != 0:
        fail(prog, f"{venv} still cannot import torch, deepspeed, "
             "transformers, ninja and torchao")
    return py


def main() -> None:
    """Creates the venv (and nothing else): `python3 bench/ds_venv.py`."""
    print(ensure_venv("ds_venv"))


if __name__ == "__main__":
    main()
