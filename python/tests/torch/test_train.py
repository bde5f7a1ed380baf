"""strata-train (python/strata/train, issue #32 §3) on the tiny presets:
it trains from a text or token file and writes its log, plot and
checkpoints; bad input is exit status 2 with a message naming it; a resume
(after a finished run, or after Ctrl-C) goes on bit-identically, the
exported weights included; --init-from loads what --export wrote."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from conftest import DEVICE
from gpt import text_bytes

transformers = pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
safetensors = pytest.importorskip("safetensors.torch")
from strata.train import main  # noqa: E402

FIELDS = {"step", "loss", "lr", "grad_norm", "skipped", "tokens",
          "tokens_per_s", "tflops", "mfu", "step_s", "compute_s",
          "stall_fetch_s", "stall_update_s", "stall_grad_buffer_s",
          "stall_optimizer_s", "optimizer_s", "optimizer_hidden_s"}
# The deadline of a subprocess run: far above what it takes (seconds), so
# a hang fails the test instead of stalling the suite.
DEADLINE_S = 120


@pytest.fixture
def text(scratch: Path) -> Path:
    path = scratch / "corpus.txt"
    path.write_bytes(text_bytes().numpy().tobytes())
    return path


@pytest.fixture
def ds(scratch: Path) -> Path:
    path = scratch / "ds.json"
    path.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "strata": {"device": DEVICE, "threads": 1, "io_threads": 1}}))
    return path


def args(out: Path, data: Path, ds: Path, *more: str,
         preset: str = "gpt2-tiny") -> list[str]:
    return ["--preset", preset, "--data", str(data), "--config", str(ds),
            "--seq-len", "32", "--out", str(out), *more]


def log(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line)
            for line in (out / "log.jsonl").read_text().splitlines()]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(safetensors.load_file(str(path)))
    assert out, f"no safetensors in {directory}"
    return out


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def test_console_script_is_main() -> None:
    root = Path(__file__).resolve().parents[3]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["strata-train"] == \
        "strata.train:main"


def test_trains_a_text_file(scratch: Path, text: Path, ds: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    out = scratch / "run"
    assert main(args(out, text, ds, "--steps", "4")) == 0
    records = log(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert FIELDS <= r.keys()
        assert r["tokens"] == 2 * 32 and r["mfu"] is None  # no known peak
        assert np.isfinite(r["loss"]) and r["tflops"] > 0
        assert not r["skipped"]
    assert records[-1]["loss"] < records[0]["loss"]
    assert (out / "train.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "ckpt" / "latest").read_text() == "global_step4"
    printed = capsys.readouterr().out
    assert "plan:" in printed and "step floor" in printed
    assert "compute" in printed and "state1" in printed


@pytest.mark.parametrize("suffix", [".bin", ".npy"])
def test_trains_a_token_file(scratch: Path, ds: Path, suffix: str) -> None:
    ids = np.random.default_rng(0).integers(0, 256, 4096)
    data = scratch / f"tokens{suffix}"
    if suffix == ".bin":
        ids.astype(np.uint16).tofile(data)
    else:
        np.save(data, ids.astype(np.int32))
    out = scratch / "run"
    assert main(args(out, data, ds, "--steps", "2", "--grad-accum", "2",
                     preset="llama-tiny")) == 0
    records = log(out)
    assert [r["tokens"] for r in records] == [2 * 2 * 32] * 2
    assert all(np.isfinite(r["loss"]) for r in records)


def bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs strata-train expecting exit status 2; its message."""
    assert main(argv) == 2
    return capsys.readouterr().err


def test_bad_input(scratch: Path, text: Path, ds: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    out = scratch / "run"
    err = bad(args(out, text, ds, preset="gpt2-huge"), capsys)
    assert "unknown preset 'gpt2-huge'" in err and "gpt2-tiny" in err \
        and "llama-7b" in err
    err = bad(args(out, scratch / "missing.txt", ds), capsys)
    assert "missing.txt: no such file" in err
    err = bad(args(out, text, ds, "--seq-len", "4096"), capsys)
    assert "--seq-len 4096 is longer than the model's 256" in err
    small = scratch / "config.json"
    small.write_text(json.dumps({"model_type": "gpt2", "vocab_size": 100,
                                 "n_embd": 16, "n_layer": 1, "n_head": 1}))
    err = bad(["--model-config", str(small), "--data", str(text),
               "--config", str(ds), "--out", str(out)], capsys)
    assert "vocabulary has 100 ids" in err
    small.write_text(json.dumps({"n_embd": 16}))
    err = bad(["--model-config", str(small), "--data", str(text),
               "--out", str(out)], capsys)
    assert "no \"model_type\"" in err
    err = bad(args(out, text, ds, "--resume"), capsys)
    assert "no checkpoint" in err
    err = bad(["--data", str(text), "--out", str(out)], capsys)
    assert "no model: give --preset" in err


def test_refuses_to_overwrite_a_run(scratch: Path, text: Path, ds: Path,
                                    capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    out = scratch / "run"
    assert main(args(out, text, ds, "--steps", "1")) == 0
    assert main(args(out, text, ds, "--steps", "2")) == 2
    assert "holds a run already; --resume" in capsys.readouterr().err


def test_resume_is_bit_identical(scratch: Path, text: Path, ds: Path
                                 ) -> None:
    straight, resumed = scratch / "straight", scratch / "resumed"
    assert main(args(straight, text, ds, "--steps", "6", "--export",
                     str(straight / "export"))) == 0
    assert main(args(resumed, text, ds, "--steps", "3")) == 0
    assert main(args(resumed, text, ds, "--steps", "6", "--resume",
                     "--export", str(resumed / "export"))) == 0
    a, b = log(straight), log(resumed)
    assert [r["step"] for r in b] == list(range(1, 7))
    assert [(r["loss"], r["grad_norm"]) for r in a] == \
        [(r["loss"], r["grad_norm"]) for r in b]
    assert_same_weights(straight / "export", resumed / "export")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        resumed / "export")
    exported = weights(resumed / "export")
    for name, value in model.state_dict().items():
        if name in exported:
            assert torch.equal(value, exported[name]), name


def test_init_from_an_export(scratch: Path, text: Path, ds: Path) -> None:
    """--init-from DIR takes the model from DIR/config.json and its
    weights; with lr 0 the next export is the same weights."""
    first = scratch / "first"
    assert main(args(first, text, ds, "--steps", "2", "--export",
                     str(first / "export"))) == 0
    second = scratch / "second"
    assert main(["--init-from", str(first / "export"), "--data", str(text),
                 "--config", str(ds), "--seq-len", "32", "--out",
                 str(second), "--steps", "1", "--lr", "0", "--export",
                 str(second / "export")]) == 0
    assert_same_weights(first / "export", second / "export")


def start(out: Path, data: Path, ds: Path, *more: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen(
        [sys.executable, "-m", "strata.train", *args(out, data, ds, *more)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        stdout, stderr = process.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"strata-train did not end in {DEADLINE_S} s: "
                    f"{stderr[-2000:]}")
    return process.returncode, stdout + stderr


def assert_resumes_straight(scratch: Path, out: Path, text: Path, ds: Path,
                            stopped: int) -> None:
    """The run in `out`, stopped after step `stopped` and saved there,
    resumed for two more steps logs the losses of a run never stopped."""
    assert (out / "ckpt" / "latest").read_text() == f"global_step{stopped}"
    assert main(args(out, text, ds, "--steps", str(stopped + 2),
                     "--resume")) == 0
    straight = scratch / "straight"
    assert main(args(straight, text, ds, "--steps", str(stopped + 2))) == 0
    assert [r["loss"] for r in log(out)] == \
        [r["loss"] for r in log(straight)]


@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_saves_and_resume_goes_on(scratch: Path, text: Path,
                                         ds: Path, signals: int) -> None:
    """SIGINT after the second logged step: the step in progress ends (a
    second SIGINT abandons it), a checkpoint is saved, exit 130; --resume
    then matches a run never interrupted, bit for bit."""
    out = scratch / "interrupted"
    process = start(out, text, ds, "--steps", "100000")
    deadline = time.monotonic() + DEADLINE_S
    while not ((out / "log.jsonl").exists() and len(log(out)) >= 2):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no second step logged: {finish(process)[1]}")
        time.sleep(0.02)
    for _ in range(signals):  # apart, or Python sees one
        process.send_signal(signal.SIGINT)
        time.sleep(0.02)
    status, printed = finish(process)
    assert status == 130, printed
    stopped = len(log(out))
    assert f"stopped at step {stopped}" in printed
    assert_resumes_straight(scratch, out, text, ds, stopped)


@pytest.mark.parametrize("where", ["loss", "settled"])
def test_ctrl_c_anywhere_in_a_step_stops_cleanly(
        scratch: Path, text: Path, ds: Path, where: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The KeyboardInterrupt of a second Ctrl-C lands wherever the loop is:
    in its own code between forward and backward (the loss: the engine
    cannot see it), or after the step settled in engine.step(). Exit 130,
    the checkpoint is of the last step counted, and --resume matches a run
    never interrupted."""
    from strata.torch import StrataEngine
    from strata.train import loop
    calls = [0]

    def third(call: Any) -> Any:  # the third call raises as it returns
        def wrapped(*a: Any, **k: Any) -> Any:
            out = call(*a, **k)
            calls[0] += 1
            if calls[0] == 3:
                raise KeyboardInterrupt
            return out
        return wrapped
    if where == "loss":
        monkeypatch.setattr(loop, "F", SimpleNamespace(
            cross_entropy=third(loop.F.cross_entropy)))
    else:
        monkeypatch.setattr(StrataEngine, "step", third(StrataEngine.step))
    out = scratch / "interrupted"
    assert main(args(out, text, ds, "--steps", "10")) == 130
    monkeypatch.undo()
    stopped = 2 if where == "loss" else 3
    assert [r["step"] for r in log(out)] == list(range(1, stopped + 1))
    assert_resumes_straight(scratch, out, text, ds, stopped)


def test_a_second_ctrl_c_abandons_only_a_step_not_yet_counted() -> None:
    from strata.train import loop
    engine = SimpleNamespace(global_steps=5)
    stop = loop.Stop(engine)  # type: ignore[arg-type]
    stop._handle(signal.SIGINT, None)
    assert stop.requested  # the first only asks
    stop.counted = 5
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)
    engine.global_steps = 6  # counted: the step stands
    stop._handle(signal.SIGINT, None)
    stop.counted = None  # between steps: the checkpoint is being written
    stop._handle(signal.SIGINT, None)


def test_no_save_writes_no_checkpoint(scratch: Path, text: Path,
                                      ds: Path) -> None:
    out = scratch / "run"
    assert main(args(out, text, ds, "--steps", "2", "--no-save")) == 0
    assert len(log(out)) == 2 and (out / "train.png").stat().st_size > 0
    assert not (out / "ckpt").exists() or not any((out / "ckpt").iterdir())


def test_a_transformers_model_round_trip(scratch: Path, text: Path) -> None:
    """Issue #32 §5.2: a GPT-2 with random weights saved by transformers
    (safetensors), --init-from, 5 steps, --export: transformers loads the
    export, and its logits are plain PyTorch's after the same 5 steps
    within LOGIT_ATOL (torch's AdamW rounds some weights an ulp apart);
    the offline export of the checkpoint writes the same files."""
    from conftest import gpt2, twin
    from test_safetensors import LOGIT_ATOL
    from strata.train.data import Batches, Tokens
    source = gpt2(seed=1)
    source.save_pretrained(scratch / "init")
    adamw = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
             "weight_decay": 0.1}
    config = scratch / "ds.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": adamw},
        "strata": {"device": DEVICE, "threads": 1, "io_threads": 1}}))
    out = scratch / "run"
    assert main(["--init-from", str(scratch / "init"), "--data", str(text),
                 "--config", str(config), "--seq-len", "16", "--steps", "5",
                 "--out", str(out), "--export", str(out / "export")]) == 0
    ref = twin(source)
    opt = torch.optim.AdamW(ref.parameters(), **{
        **adamw, "betas": tuple(adamw["betas"])})
    batches = Batches(Tokens(str(text)), 2, 16, 256, seed=0)
    for _ in range(5):
        x, y = batches.next()
        logits = ref(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                          y.flatten()).backward()
        opt.step()
        opt.zero_grad()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out / "export")
    x, _ = batches.next()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=x).logits,
                              ref(input_ids=x).logits, atol=LOGIT_ATOL)
    offline = subprocess.run(
        [sys.executable, "-m", "strata.torch.export", str(out / "ckpt"),
         str(scratch / "offline")], capture_output=True, text=True)
    assert offline.returncode == 0, offline.stderr
    for file in sorted((out / "export").iterdir()):
        assert file.read_bytes() == (scratch / "offline" /
                                     file.name).read_bytes(), file.name
