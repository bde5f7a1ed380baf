"""A DeepSpeed training script runs by changing its import line (issue #30
§4): deepspeed.initialize's signature and 4-tuple, engine.optimizer's
param groups (honoured from the next step), torch LR schedulers on it, a
torch optimizer taken over, the checkpoint API, the accessors, strict
configs, and swap files that go with the engine."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import strata.torch as st
import strata.torch.deepspeed as deepspeed
from conftest import TORCH_DEVICE, config, data, model, twin
from test_exact import LOSS_RTOL, PARAM_ATOL

BETAS = (0.9, 0.95)


def decay_groups(m: torch.nn.Module) -> list[dict[str, Any]]:
    """Weight decay on matrices only, the usual two groups."""
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1},
            {"params": rest, "weight_decay": 0.0, "lr": 1e-3}]


def torch_run(m: torch.nn.Module, opt: torch.optim.Optimizer,
              steps: list, each: Callable[[int, Any], None]) -> list[float]:
    """Plain PyTorch; each(step, opt) runs before each step's forward."""
    losses = []
    for i, (x, y) in enumerate(steps):
        each(i, opt)
        loss = m(x, y).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def strata_run(engine: Any, steps: list, each: Callable[[int, Any], None]
               ) -> list[float]:
    losses = []
    for i, (x, y) in enumerate(steps):
        each(i, engine.optimizer)
        loss = engine(x, y).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def agree(engine: Any, ref: torch.nn.Module, losses: list[float],
          ref_losses: list[float]) -> None:
    assert losses == pytest.approx(ref_losses, rel=LOSS_RTOL)
    state = engine.state_dict()
    for key, value in ref.state_dict().items():
        assert torch.allclose(state[key], value.cpu(), atol=PARAM_ATOL), key
    engine.close()


def no_change(step: int, opt: Any) -> None:
    pass


@pytest.mark.parametrize("how", ["optimizer", "model_parameters"])
def test_two_weight_decay_groups_train_as_torch(how: str) -> None:
    """A torch AdamW passed in is taken over with its param groups; or the
    config's optimizer runs over model_parameters' groups."""
    m = model()
    ref = twin(m).to(TORCH_DEVICE)
    ref_opt = torch.optim.AdamW(decay_groups(ref), lr=3e-3, betas=BETAS)
    cfg = config()
    if how == "optimizer":
        del cfg["optimizer"]
        client = torch.optim.AdamW(decay_groups(m), lr=3e-3, betas=BETAS)
        engine, opt, _, _ = deepspeed.initialize(model=m, optimizer=client,
                                                 config=cfg)
    else:
        engine, opt, _, _ = deepspeed.initialize(
            model=m, model_parameters=decay_groups(m), config=cfg)
    assert opt is engine.optimizer and len(opt.param_groups) == 2
    names = {g.name for g in engine.rt.groups}
    assert "blocks.0 (param group 1)" in names
    steps = data(6)
    agree(engine, ref, strata_run(engine, steps, no_change),
          torch_run(ref, ref_opt, steps, no_change))


def halve_at_3(step: int, opt: Any) -> None:
    if step == 3:
        for group in opt.param_groups:
            group["lr"] *= 0.5


def lambda_lr(opt: torch.optim.Optimizer) -> Callable[[int, Any], None]:
    """A torch LambdaLR on `opt`, stepped before every step but the
    first."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    return lambda step, _: sched.step() if step else None


@pytest.mark.parametrize("how", ["set mid-run", "LambdaLR"])
def test_learning_rates_of_engine_optimizer_are_honoured(how: str) -> None:
    """param_groups[0]["lr"] set by hand from step 3, or a torch LambdaLR
    built on engine.optimizer: each step uses it, as plain PyTorch's."""
    m = model()
    ref = twin(m).to(TORCH_DEVICE)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=BETAS,
                                weight_decay=0.1)
    engine = st.initialize(m, config())
    each, ref_each = halve_at_3, halve_at_3
    if how == "LambdaLR":
        each, ref_each = lambda_lr(engine.optimizer), lambda_lr(ref_opt)
    steps = data(6)
    losses = strata_run(engine, steps, each)
    ref_losses = torch_run(ref, ref_opt, steps, ref_each)
    assert engine.get_lr() == [g["lr"] for g in ref_opt.param_groups]
    assert engine.get_lr()[0] < 3e-3
    agree(engine, ref, losses, ref_losses)


def test_initialize_takes_deepspeeds_arguments(scratch: Path) -> None:
    path = scratch / "ds_config.json"
    path.write_text(json.dumps(config(train_micro_batch_size_per_gpu=4)))
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config",
                              str(path)])
    deepspeed.init_distributed()
    with deepspeed.zero.Init(remote_device="cpu", config_dict_or_path=args):
        m = model()
    dataset = torch.utils.data.TensorDataset(*data(1)[0])
    engine, opt, loader, sched = deepspeed.initialize(
        args=args, model=m, model_parameters=m.parameters(),
        training_data=dataset)
    assert opt is engine.optimizer and sched is None
    assert [len(x) for x, _ in loader] == [4, 4]
    assert engine.config is m.config  # the module's attributes pass through
    assert engine.train_batch_size() == 4
    for x, y in loader:
        engine.backward(engine(x.to(TORCH_DEVICE), y.to(TORCH_DEVICE)).loss)
        engine.step()
    assert engine.global_steps == 2 and engine.global_samples == 8
    assert engine.get_global_grad_norm() > 0
    assert (engine.global_rank, engine.world_size, engine.local_rank) == \
        (0, 1, 0)
    engine.close()
    deepspeed.init_distributed()  # one rank: nothing to make


def test_accumulation_boundary_as_deepspeed_counts() -> None:
    engine = st.initialize(model(), config(
        gradient_accumulation_steps=2, train_micro_batch_size_per_gpu=4))
    x, y = data(1)[0]
    seen = []
    for _ in range(4):
        seen.append(engine.is_gradient_accumulation_boundary())
        engine.backward(engine(x[:4], y[:4]).loss)
        seen.append(engine.is_gradient_accumulation_boundary())
        engine.step()
    assert seen == [False, False, True, True] * 2
    assert engine.gradient_accumulation_steps() == 2
    assert engine.train_micro_batch_size_per_gpu() == 4
    engine.close()


def test_checkpoints_as_deepspeed(scratch: Path) -> None:
    """Integer tags, any picklable client_state, the latest file, (None,
    None) when there is nothing, and load_module_only."""
    engine = st.initialize(model(), config())
    assert engine.load_checkpoint(str(scratch)) == (None, None)
    steps = data(3)
    x, y = steps[0]
    engine.backward(engine(x, y).loss)
    engine.step()
    state = {"epoch": 3, "seen": {1, 2}, "path": Path("a")}
    assert engine.save_checkpoint(str(scratch), tag=100, client_state=state)
    assert (scratch / "latest").read_text() == "100"
    engine.save_checkpoint(str(scratch), tag="other", save_latest=False)
    assert (scratch / "latest").read_text() == "100"
    path, loaded = engine.load_checkpoint(str(scratch))
    assert path == str(scratch / "100") and loaded == state
    assert engine.load_checkpoint(str(scratch), tag="none") == (None, None)
    engine.load_checkpoint(str(scratch), tag=100, load_module_only=True)
    assert engine.rt.optimizer.step == 0
    engine.close()


@pytest.mark.parametrize("over,key", [
    ({"fp16": {"enabled": "false"}}, "fp16.enabled"),
    ({"bf16": {"enabled": "true"}}, "bf16.enabled"),
    ({"train_micro_batch_size_per_gpu": "auto"},
     "train_micro_batch_size_per_gpu"),
    ({"zero_optimization": {
        "stage3_gather_16bit_weights_on_model_save": "auto"}},
     "stage3_gather_16bit_weights_on_model_save"),
])
def test_strings_for_booleans_and_auto_are_named(over: dict[str, Any],
                                                 key: str) -> None:
    """"enabled": "false" used to switch fp16 on."""
    with pytest.raises(st.ConfigError, match=key):
        st.initialize(model(), config(**over))


def swap_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()
                  if p.name.startswith("strata-swap-"))


def test_swap_files_go_at_close_and_at_exit(nvme: Path) -> None:
    cfg = config(zero_optimization={"offload_optimizer": {
        "device": "nvme", "nvme_path": str(nvme)}})
    engine = st.initialize(model(), cfg)
    assert swap_files(nvme)
    engine.close()
    assert swap_files(nvme) == []
    script = (
        "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
        "import strata.torch as st; from conftest import model; "
        "e = st.initialize(model(), json.loads(sys.argv[2])); "
        "assert any(p.startswith('strata-swap-') for p in "
        "__import__('os').listdir(sys.argv[3]))")
    here = Path(__file__).parent
    subprocess.run([sys.executable, "-c", script,
                    json.dumps([str(here), str(here.parent)] + sys.path),
                    json.dumps(cfg), str(nvme)], check=True)
    assert swap_files(nvme) == []
