"""examples/ds_train_gpt2.py, a DeepSpeed training script with its import
line changed (issue #30 §5.3): it runs, its losses match plain PyTorch's
(AdamW, the same WarmupLR, gradient accumulation, clipping), a resume from
its checkpoint goes on bit-identically, and its 16-bit weights load into
transformers."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import gpt
import strata.torch as st
from strata.torch.schedule import Scheduler
from test_exact import LOSS_RTOL

transformers = pytest.importorskip("transformers")
EXAMPLES = Path(gpt.__file__).resolve().parent  # in the tree or the GPU bundle
import ds_train_gpt2 as script  # noqa: E402

CONFIG = json.loads((EXAMPLES / "ds_config_gpt2.json").read_text())


def run(cwd: Path, *args: str, ranks: int = 1) -> list[dict]:
    """The script's step lines; with `ranks`, under torchrun."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    logs = cwd / f"logs-{len(list(cwd.glob('logs-*')))}"
    launcher = [sys.executable] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
        str(ranks), "--master-port", str(free_port()), "--redirects", "1",
        "--log-dir", str(logs)]  # each rank's stdout a file of its own
    out = subprocess.run(
        [*launcher, str(EXAMPLES / "ds_train_gpt2.py"), "--deepspeed",
         "--deepspeed_config", str(EXAMPLES / "ds_config_gpt2.json"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    texts = [out.stdout] if ranks == 1 else [
        f.read_text() for f in sorted(logs.rglob("stdout.log"))]
    return [json.loads(line) for text in texts
            for line in text.splitlines() if line.startswith("{")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain_pytorch(steps: int) -> list[float]:
    """The same training in plain PyTorch, from the weights the script's
    zero.Init builds (close() gives them to the model)."""
    with st.init(CONFIG):
        model = script.build_model(0)
    with warnings.catch_warnings():  # the ignored steps_per_print
        warnings.simplefilter("ignore")
        st.initialize(model, CONFIG).close()
    params = CONFIG["optimizer"]["params"]
    opt = torch.optim.AdamW(model.parameters(), lr=params["lr"],
                            betas=tuple(params["betas"]), eps=params["eps"],
                            weight_decay=params["weight_decay"])
    schedule = Scheduler("WarmupLR", CONFIG["scheduler"]["params"],
                         params["lr"])
    gas = CONFIG["gradient_accumulation_steps"]
    size = CONFIG["train_micro_batch_size_per_gpu"]
    tokens = script.text()
    losses = []
    for step in range(steps):
        total = 0.0
        for micro in range(gas):
            ids = script.micro_batch(tokens, step, micro, size, 0)
            loss = model(input_ids=ids, labels=ids).loss
            (loss / gas).backward()
            total += loss.item() / gas
        torch.nn.utils.clip_grad_norm_(model.parameters(),
                                       CONFIG["gradient_clipping"])
        for group in opt.param_groups:
            group["lr"] = schedule.lr()
        opt.step()
        opt.zero_grad()
        schedule.step()
        losses.append(total)
    return losses


def test_the_deepspeed_script_runs_resumes_and_matches_pytorch(
        scratch: Path) -> None:
    for name in ("full", "resumed"):
        (scratch / name).mkdir()
    full = run(scratch / "full", "--steps", "8")
    assert [r["step"] for r in full] == list(range(1, 9))
    assert full[-1]["loss"] < full[0]["loss"]
    reference = plain_pytorch(8)
    assert [r["loss"] for r in full] == pytest.approx(reference,
                                                      rel=LOSS_RTOL)
    run(scratch / "resumed", "--steps", "4")
    resumed = run(scratch / "resumed", "--steps", "8", "--resume")
    assert resumed == full[4:]
    weights = torch.load(scratch / "full" / "gpt2-16bit" /
                         "pytorch_model.bin")
    model = script.build_model(1)
    model.load_state_dict(weights)


def test_the_script_runs_unchanged_under_torchrun(scratch: Path) -> None:
    """Two ranks, each on its own batches, one global norm; a checkpoint
    of both ranks' parts and the 16-bit weights (resuming across ranks:
    test_ranks.py)."""
    lines = run(scratch, "--steps", "3", "--save-every", "3", ranks=2)
    assert sorted(r["step"] for r in lines) == [1, 1, 2, 2, 3, 3]
    first = [r for r in lines if r["step"] == 1]
    assert first[0]["loss"] != first[1]["loss"]
    assert first[0]["grad_norm"] == first[1]["grad_norm"] > 0
    assert (scratch / "checkpoints" / "3" / "ranks.json").is_file()
    weights = torch.load(scratch / "gpt2-16bit" / "pytorch_model.bin")
    model = script.build_model(0)
    model.load_state_dict(weights)
