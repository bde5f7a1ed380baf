"""strata.torch against plain PyTorch, and against itself across placements
and a checkpoint: the exactness the adapter promises."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import strata.torch as st
from strata._native import StrataError
from conftest import (TORCH_DEVICE, assert_identical, config, data, model,
                      train_strata, train_torch, twin)
from gpt import GPTConfig

# Tolerances against torch.optim.AdamW (fp32). strata's CPU Adam computes
# the same formula in fp32 but in another order (fused, vectorized, bias
# corrections folded into the step size), so each update differs from
# torch's in the last bits, and training carries that on. Measured over 20
# steps at lr 3e-3 (this GPT, GPT-2 and Llama): the losses within 1.2e-7
# relative, the parameters within 6e-6. The tolerances are ~10x that and
# still far below one step's update (~lr), so a wrong or missing gradient,
# a missed or doubled step or a wrong hyperparameter fails them.
PARAM_ATOL = 5e-5
LOSS_RTOL = 2e-6
# bf16 and int8 state against fp32 state over 12 steps of the tiny GPT:
# the losses measured within 1.6e-5 (bf16) and 7.3e-5 (int8) relative, as
# the loss falls from 5.50 to 4.10; the margins are ~10x.
STATE_LOSS_RTOL = {"bf16": 2e-4, "int8": 1e-3}


def test_twenty_steps_agree_with_torch_adamw() -> None:
    m = model()
    ref = train_torch(twin(m), data())
    run = train_strata(m, config(), data())
    assert run.losses[-1] < run.losses[0] - 0.5  # it learns
    for a, b in zip(run.losses, ref.losses):
        assert a == pytest.approx(b, rel=LOSS_RTOL)
    for key, value in ref.state.items():
        assert torch.allclose(run.state[key], value, rtol=0,
                              atol=PARAM_ATOL), key


PLACEMENTS = {
    "state on nvme": {"zero_optimization": {"offload_optimizer": {
        "device": "nvme"}}},
    "params on nvme": {"zero_optimization": {"offload_param": {
        "device": "nvme"}}},
    "after_backward": {"strata": {"mode": "after_backward"}},
}


@pytest.mark.parametrize("accumulation", [1, 4])
def test_placements_are_bit_identical(nvme: Path, accumulation: int) -> None:
    steps = data(8)
    base = config(gradient_accumulation_steps=accumulation,
                  train_micro_batch_size_per_gpu=8 // accumulation)
    reference = train_strata(model(), base, steps)
    for name, over in PLACEMENTS.items():
        cfg = config(**over, gradient_accumulation_steps=accumulation,
                     train_micro_batch_size_per_gpu=8 // accumulation)
        for key in ("offload_optimizer", "offload_param"):
            section = cfg.get("zero_optimization", {}).get(key)
            if section:
                section["nvme_path"] = str(nvme)
        run = train_strata(model(), cfg, steps)
        assert_identical(run, reference, name)


def test_speculative_steps_leave_the_master_unread(nvme: Path) -> None:
    """Note [The master a speculative step does not read] in
    src/optim/pipeline_worker.cc: with the state on NVMe an fp32 group's
    steps speculate, and each reads its compute copy, not its master. From
    the second step on (the first does not speculate) no master byte comes
    from NVMe, while m's do; the run stays bit-identical to one with the
    state on the host."""
    cfg = config(zero_optimization={"offload_optimizer": {
        "device": "nvme", "nvme_path": str(nvme)}})
    steps = data(6)
    engine = st.initialize(model(), cfg)

    def read(role: str) -> int:
        engine.store.drain()
        return engine.store.stats()["role_bytes"][role]["nvme"]["host"]
    for i, (x, y) in enumerate(steps):
        if i == 1:
            master, state1 = read("master"), read("state1")
        engine.backward(engine(x, y).loss)
        engine.step()
    assert read("master") == master and read("state1") > state1
    run = train_strata(engine.module, cfg, [], engine=engine)
    reference = train_strata(model(), config(), steps)
    assert_identical(run, type(run)([], [], reference.state))


def test_two_swap_directories_train_bit_identically(scratch: Path) -> None:
    """nvme_path as a list of directories, one per drive: the swap files
    spread over both (Note [Several swap directories] in
    src/tier/nvme_store.cc), and training is exactly as on one."""
    drives = [scratch / "nvme0", scratch / "nvme1"]
    for d in drives:
        d.mkdir()
    where = {"device": "nvme", "nvme_path": [str(d) for d in drives]}
    cfg = config(zero_optimization={"stage": 3, "offload_optimizer": where,
                                    "offload_param": where})
    steps = data(4)
    engine = st.initialize(model(), cfg)
    for d in drives:
        assert (d / "strata.lock").exists(), d
        assert any(p.name.startswith("strata-swap-") for p in d.iterdir()), d
    run = train_strata(engine.module, cfg, steps, engine=engine)
    assert_identical(run, train_strata(model(), config(), steps), "2 drives")
    assert not any(any(d.iterdir()) for d in drives), "swap files left"


WIDE = GPTConfig(width=256, layers=8, heads=4, seq=16)


def test_streaming_through_a_small_device_budget_is_bit_identical() -> None:
    """A device budget of 7 blocks (2 gradient buffers and, at the
    engine's minimum, the largest group's fetch with all its roles) for a
    model of 8 blocks and embeddings (24.4 MiB) makes the engine evict and
    refetch about half the blocks in every step (measured: 31 evictions
    in 4 steps), prefetching ahead; the result is the resident run's."""
    steps = data(4, WIDE)
    block = 4 * WIDE.block_parameters()
    reference = train_strata(model(WIDE), config(), steps)
    small = config(strata={"device_budget": 7 * block, "grad_buffers": 2})
    engine = st.initialize(model(WIDE), small)
    run = train_strata(engine.module, small, steps, engine, close=False)
    stats = engine.store.stats()
    engine.close()
    assert stats["evictions"] >= 4 * len(steps), "it did not stream"
    assert stats["prefetch_hits"] > 0
    assert_identical(run, reference, "streaming")


def test_four_micro_batches_agree_with_one() -> None:
    """Not bitwise: a loss averaged over 8 rows and 4 averages of 2 rows
    round differently (float addition is not associative)."""
    steps = data(8)
    one = train_strata(model(), config(), steps)
    four = train_strata(model(), config(
        gradient_accumulation_steps=4, train_micro_batch_size_per_gpu=2),
        steps)
    for a, b in zip(one.losses, four.losses):
        assert a == pytest.approx(b, rel=LOSS_RTOL)
    for key, value in one.state.items():
        assert torch.allclose(four.state[key], value, atol=PARAM_ATOL), key


@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_a_resumed_run_is_bit_identical(scratch: Path, nvme: Path,
                                        state: str) -> None:
    cfg = config(fp16={"enabled": False}, scheduler={
        "type": "WarmupDecayLR", "params": {
            "warmup_max_lr": 3e-3, "warmup_num_steps": 4,
            "total_num_steps": 20}},
        zero_optimization={"offload_optimizer": {
            "device": state, "nvme_path": str(nvme)}})
    steps = data(12)
    whole = train_strata(model(), cfg, steps)
    first = st.initialize(model(), cfg)
    train_strata(first.module, cfg, steps[:6], engine=first, close=False)
    first.save_checkpoint(str(scratch / "ckpt"), client_state={"epoch": 3})
    first.close()
    second = st.initialize(model(seed=1), cfg)  # other weights: all loaded
    path, client = second.load_checkpoint(str(scratch / "ckpt"))
    assert client == {"epoch": 3} and path.endswith("global_step6")
    assert second.global_steps == 6
    rest = train_strata(second.module, cfg, steps[6:], engine=second)
    assert rest.losses == whole.losses[6:]
    assert_identical(rest, type(rest)(rest.losses, [], whole.state))


class NormNet(nn.Module):
    """Byte embeddings through blocks with BatchNorm: a model with buffers
    (running statistics) that training changes."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.wte = nn.Embedding(256, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width),
                          nn.ReLU()) for _ in range(2))
        self.head = nn.Linear(width, 256)

    def forward(self, x: torch.Tensor, y: torch.Tensor
                ) -> tuple[torch.Tensor]:
        h = self.wte(x).flatten(0, 1)
        for block in self.blocks:
            h = block(h)
        return (nn.functional.cross_entropy(self.head(h), y.flatten()),)


def norm_net(seed: int) -> NormNet:
    torch.manual_seed(seed)
    return NormNet().to(TORCH_DEVICE)


def test_a_resumed_run_restores_the_buffers(scratch: Path) -> None:
    """BatchNorm's running statistics travel in the checkpoint: a run
    resumed into a model with other statistics is bit-identical."""
    steps, cfg = data(8), config()
    whole = train_strata(norm_net(0), cfg, steps)
    first = st.initialize(norm_net(0), cfg)
    train_strata(first.module, cfg, steps[:4], engine=first, close=False)
    first.save_checkpoint(str(scratch / "ckpt"))
    weights = {k: v.clone() for k, v in first.state_dict().items()}
    first.close()
    other = norm_net(1)
    for block in other.blocks:
        block[1].running_mean.fill_(5.0)
    second = st.initialize(other, cfg)
    second.load_checkpoint(str(scratch / "ckpt"))
    rest = train_strata(second.module, cfg, steps[4:], engine=second)
    assert "blocks.0.1.running_mean" in rest.state
    assert rest.losses == whole.losses[4:]
    assert_identical(rest, type(rest)(rest.losses, [], whole.state))


@pytest.mark.parametrize("state", ["bf16", "int8"])
def test_narrow_state_trains_near_fp32_and_resumes_bit_identically(
        scratch: Path, nvme: Path, state: str) -> None:
    """strata.state_dtype bf16 (m and v in 2 bytes each) and int8 (a byte
    and a scale per 256 for tensors of 4096 elements or more), on NVMe
    here. Not exact, so the losses follow fp32 state's within a margin;
    but bf16's stochastic rounding is a function of the step, the group
    and the element, and int8's quantization of the values alone, so a
    resumed run is bit-identical; an engine of fp32 state refuses the
    checkpoint, but loads its weights alone (load_module_only) with its
    own state zeroed."""
    cfg = config(strata={"state_dtype": state}, zero_optimization={
        "offload_optimizer": {"device": "nvme", "nvme_path": str(nvme)}})
    steps = data(12)
    exact = train_strata(model(), config(), steps)
    whole = train_strata(model(), cfg, steps)
    assert whole.losses != exact.losses, "the state was not narrowed"
    for a, b in zip(whole.losses, exact.losses):
        assert a == pytest.approx(b, rel=STATE_LOSS_RTOL[state])
    first = st.initialize(model(), cfg)
    dtypes = set()
    for group in first.rt.groups:
        if "state1" in group.roles:
            with first.store.fetch(group.id, "host", roles="state1") as view:
                dtypes |= {t.dtype for t in view.tensors}
    # int8: the tensors of 4096 elements or more are bytes, the rest fp32.
    assert dtypes == ({"bf16"} if state == "bf16" else {"u8", "fp32"})
    train_strata(first.module, cfg, steps[:6], engine=first, close=False)
    first.save_checkpoint(str(scratch / "ckpt"))
    weights = {k: v.clone() for k, v in first.state_dict().items()}
    first.close()
    second = st.initialize(model(seed=1), cfg)
    second.load_checkpoint(str(scratch / "ckpt"))
    rest = train_strata(second.module, cfg, steps[6:], engine=second)
    assert rest.losses == whole.losses[6:]
    assert_identical(rest, type(rest)(rest.losses, [], whole.state))
    fp32 = st.initialize(model(), config(zero_optimization={
        "offload_optimizer": {"device": "nvme", "nvme_path": str(nvme)}}))
    with pytest.raises(StrataError, match=f"state in {state} in the "
                       f"checkpoint but fp32 in this engine"):
        fp32.load_checkpoint(str(scratch / "ckpt"))
    fp32.load_checkpoint(str(scratch / "ckpt"), load_module_only=True)
    assert fp32.rt.optimizer.step == 0
    loaded = fp32.state_dict()
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key
    for group in fp32.rt.groups:
        if "state1" in group.roles:
            with fp32.store.fetch(group.id, "host", roles="state1") as view:
                for t in view.tensors:
                    assert not torch.from_dlpack(
                        view.export(t.name, t.role)).any(), group.name
    fp32.close()
