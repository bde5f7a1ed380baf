"""Tied weights, frozen parameters, activation checkpointing, clipping,
fp16 loss scaling, the scheduler, bf16 and inference through strata.torch."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import strata.torch as st
from conftest import (TINY, TORCH_DEVICE, assert_identical, config, data,
                      model, train_strata, train_torch, twin)
from gpt import GPT
from strata.torch.schedule import Scheduler
from test_exact import LOSS_RTOL, PARAM_ATOL


def agree(run, ref) -> None:
    for a, b in zip(run.losses, ref.losses):
        assert a == pytest.approx(b, rel=LOSS_RTOL)
    for key, value in ref.state.items():
        assert torch.allclose(run.state[key], value, atol=PARAM_ATOL), key


def test_the_tied_head_is_one_group_fetched_by_both_modules() -> None:
    m = model()
    engine = st.initialize(m, config())
    names = [name for g in engine.rt.groups for name, _ in g.plan.params]
    assert names.count("wte.weight") == 1 and "lm_head.weight" not in names
    units = {u.plan.name: u for u in engine.rt.units}
    assert units["lm_head"].groups == units["wte"].groups
    engine.close()
    assert m.lm_head.weight is m.wte.weight


def test_frozen_parameters_get_no_state_and_do_not_move() -> None:
    m = model()
    for p in (*m.wte.parameters(), *m.blocks[0].parameters()):
        p.requires_grad_(False)
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    ref = train_torch(twin(m), data(8))
    engine = st.initialize(m, config())
    frozen = [g for g in engine.rt.groups if not g.plan.trainable]
    assert {g.name for g in frozen} == {"wte (frozen)", "blocks.0 (frozen)"}
    run = train_strata(m, config(), data(8), engine=engine)
    agree(run, ref)
    for key in ("wte.weight", "blocks.0.fc.weight"):
        assert torch.equal(run.state[key], before[key])


@pytest.mark.parametrize("kind", ["reentrant", "nonreentrant"])
def test_activation_checkpointing_recomputes_through_the_hooks(
        kind: str) -> None:
    steps = data(6)
    plain = train_strata(model(), config(), steps)
    cfg = dataclasses.replace(TINY, checkpointing=kind)
    run = train_strata(model(cfg), config(), steps)
    assert_identical(run, plain)


@pytest.mark.parametrize("state", ["cpu", "nvme"])
def test_clipping_fires_on_some_steps_and_matches_torch(
        nvme: Path, state: str) -> None:
    """With the state on NVMe the steps speculate: those where clipping
    fires are undone and step again (Note [Exact steps under overlap] in
    src/optim/pipeline.h), after the kept ones read no master (Note [The
    master a speculative step does not read])."""
    steps = data(10)
    norms = [r.grad_norm for r in train_strata(model(), config(),
                                               steps).reports]
    clip = sorted(norms)[len(norms) // 2]
    m = model()
    ref = train_torch(twin(m), steps, clip=clip)
    run = train_strata(m, config(gradient_clipping=clip, zero_optimization={
        "offload_optimizer": {"device": state, "nvme_path": str(nvme)}}),
        steps)
    clipped = [r.clip_coef < 1 for r in run.reports]
    assert any(clipped) and not all(clipped)
    agree(run, ref)


def test_an_fp16_overflow_skips_the_step_and_halves_the_scale() -> None:
    m = model()
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    engine = st.initialize(m, config(fp16={
        "enabled": True, "loss_scale": 0, "initial_scale_power": 24,
        "hysteresis": 1, "loss_scale_window": 1000}))
    x, y = data(1)[0]
    engine.backward(engine(x, y).loss)
    report = engine.step()
    assert report.skipped and engine.loss_scale == 2.0 ** 23
    state = engine.state_dict()
    for key, value in before.items():
        assert torch.equal(state[key], value), key
    skipped = 1
    for x, y in data(20):
        engine.backward(engine(x, y).loss)
        skipped += engine.step().skipped
    assert 1 < skipped < 21 and engine.loss_scale < 2.0 ** 23
    assert engine.rt.optimizer.step == 21 - skipped
    engine.close()


def test_the_scheduler_sets_each_steps_lr() -> None:
    cfg = config(scheduler={"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
        "warmup_num_steps": 5, "warmup_type": "linear"}})
    engine = st.initialize(model(), cfg)
    lrs = []
    for x, y in data(8):
        lrs.append(engine.get_lr()[0])
        engine.backward(engine(x, y).loss)
        engine.step()
    engine.close()
    assert lrs == pytest.approx([0, 0, 6e-4, 1.2e-3, 1.8e-3, 2.4e-3, 3e-3,
                                 3e-3])
    m = model()
    ref = train_torch(twin(m), data(8), lr=lambda s: lrs[s])
    agree(train_strata(m, cfg, data(8)), ref)


# Each schedule's learning rates, step by step, as DeepSpeed's
# deepspeed/runtime/lr_schedules.py gives them (its scheduler stepped after
# each optimizer step, as DeepSpeed's engine does).
DEEPSPEED_LRS = [
    ("WarmupLR", {"warmup_num_steps": 5, "warmup_type": "linear"}, 3e-4,
     [0, 0, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3, 1e-3]),
    ("WarmupDecayLR", {"total_num_steps": 10, "warmup_max_lr": 3e-3,
                       "warmup_num_steps": 4}, 3e-3,
     [0, 0, 1.5e-3, 2.377e-3, 3e-3, 3e-3, 2.5e-3, 2e-3, 1.5e-3, 1e-3, 5e-4,
      0]),
    ("WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": 4,
                        "warmup_type": "linear"}, 2e-3,
     [0, 0, 5e-4, 1e-3, 1.5e-3, 1.8660e-3, 1.5e-3, 1e-3, 5e-4, 1.3416e-4,
      2e-7, 1.3416e-4, 5e-4, 1e-3]),
]


@pytest.mark.parametrize("kind,params,lr,expected", DEEPSPEED_LRS,
                         ids=[k for k, *_ in DEEPSPEED_LRS])
def test_schedules_match_deepspeeds(kind: str, params: dict, lr: float,
                                    expected: list[float]) -> None:
    sched = Scheduler(kind, params, lr)
    got = []
    for _ in expected:
        got.append(sched.lr())
        sched.step()
    assert got == pytest.approx(expected, rel=1e-3, abs=1e-9)


def test_a_bad_schedule_fails_before_the_model_is_touched() -> None:
    m = model()
    before = m.blocks[0].fc.weight.detach().clone()
    with pytest.raises(st.ConfigError, match="total_num_steps"):
        st.initialize(m, config(scheduler={"type": "WarmupDecayLR",
                                           "params": {}}))
    with pytest.raises(st.ConfigError, match="unknown params "
                       r"\['warmup_num_step'\]"):
        st.initialize(m, config(scheduler={"type": "WarmupLR", "params": {
            "warmup_num_step": 3}}))
    assert torch.equal(m.blocks[0].fc.weight, before)


def test_bf16_trains_with_fp32_masters() -> None:
    run = train_strata(model(), config(bf16={"enabled": True}), data())
    assert run.losses[-1] < run.losses[0] - 0.5
    assert all(v.dtype == torch.float32 for v in run.state.values())


@pytest.mark.parametrize("setup,roles", [
    ("fp32", {"compute", "state1", "state2", "grad"}),
    ("bf16", {"compute", "master", "state1", "state2", "grad"}),
    ("fp32 speculating", {"compute", "master", "state1", "state2", "grad"}),
])
def test_fp32_groups_keep_a_master_only_where_steps_speculate(
        nvme: Path, setup: str, roles: set[str]) -> None:
    """In fp32 the optimizer steps the compute copy in place (the exactness
    tests check the result); a bf16 compute copy needs its fp32 master, and
    so does undoing a speculative step (the state on NVMe in overlap mode:
    every step waits for the overflow check). The gradients are kept until
    that check (grad)."""
    over: dict[str, Any] = {
        "fp32": {},
        "bf16": {"bf16": {"enabled": True}},
        "fp32 speculating": {"zero_optimization": {
            "offload_optimizer": {"device": "nvme",
                                  "nvme_path": str(nvme)}}},
    }[setup]
    engine = st.initialize(model(), config(**over))
    try:
        for group in engine.rt.groups:
            with engine.store.fetch(group.id, "host") as view:
                assert {i.role for i in view.tensors} == roles, group.name
    finally:
        engine.close()


def test_inference_through_the_hooks_matches_the_weights() -> None:
    m = model()
    engine = st.initialize(m, config())
    train_strata(m, config(), data(3), engine=engine, close=False)
    x, y = data(1)[0]
    engine.eval()
    with torch.no_grad():
        logits = engine(x).logits
    plain = GPT(TINY).to(TORCH_DEVICE)
    plain.load_state_dict(engine.state_dict())  # every key, tied too
    plain.eval()
    with torch.no_grad():
        assert torch.equal(plain(x).logits, logits)
    engine.train()
    engine.backward(engine(x, y).loss)  # training goes on after eval
    assert engine.step() is not None
    engine.close()


class InPlace(nn.Module):
    """Changes each block's output in place, outside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        for block in self.blocks:
            x = block(x)
            x.relu_()
        return ((x - y) ** 2).mean(), x


def test_in_place_changes_of_a_modules_output_work() -> None:
    torch.manual_seed(0)
    m = InPlace().to(TORCH_DEVICE)
    steps = [(torch.randn(4, 16, device=TORCH_DEVICE),
              torch.randn(4, 16, device=TORCH_DEVICE)) for _ in range(5)]
    ref = train_torch(twin(m), steps)
    agree(train_strata(m, config(), steps), ref)


class Branch(nn.Module):
    """Two layers, one group; the second runs when `use_b` is true."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        x = torch.tanh(self.a(x))
        return self.b(x) if use_b else x


class Branches(nn.Module):
    """Three Branch blocks; the second layers run on the steps `use_b`
    says."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Branch() for _ in range(3))
        self.use_b = True

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        for block in self.blocks:
            x = block(x, self.use_b)
        return ((x - y) ** 2).mean(), x


def beside_torch(m: nn.Module, batches: list[tuple[torch.Tensor, ...]],
                 dense: Callable[[nn.Parameter], torch.Tensor],
                 each: Callable[[int, nn.Module], None] = lambda i, n: None
                 ) -> None:
    """Trains `m` through strata and its twin through torch.optim.AdamW
    on `batches`, with `each(step, model)` before each forward and the
    twin's gradients replaced by `dense(parameter)` before its step, and
    asserts the weights agree."""
    ref = twin(m)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    engine = st.initialize(m, config())
    for step, (x, y) in enumerate(batches):
        each(step, m)
        engine.backward(engine(x, y)[0])
        engine.step()
        each(step, ref)
        ref(x, y)[0].backward()
        for p in ref.parameters():
            p.grad = dense(p)
        opt.step()
        opt.zero_grad()
    state = engine.state_dict()
    engine.close()
    for key, value in ref.state_dict().items():
        assert torch.allclose(state[key].to(value.device), value,
                              rtol=0, atol=PARAM_ATOL), key


def test_a_parameter_without_a_gradient_steps_on_zeros() -> None:
    """Note [Gradients copied in] in handoff.py: gradient buffers come
    unzeroed, and the layers that got no gradient in a step get zeros at
    the hand-off, not what the buffer held before; AdamW then decays them
    (torch's reference is given zeros too: it skips a .grad of None)."""
    torch.manual_seed(0)
    batches = [tuple(torch.randn(4, 16, device=TORCH_DEVICE)
                     for _ in range(2)) for _ in range(6)]

    def use_b(step: int, model: nn.Module) -> None:
        model.use_b = step % 2 == 0
    beside_torch(Branches().to(TORCH_DEVICE), batches,
                 lambda p: torch.zeros_like(p) if p.grad is None else p.grad,
                 use_b)


class SparseBag(nn.Module):
    """A sparse embedding (its gradient a sparse tensor) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, 16, sparse=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return nn.functional.cross_entropy(self.head(self.emb(x)), y), None


def test_a_sparse_gradient_is_copied_in_dense() -> None:
    """Note [Gradients copied in]: a sparse gradient lands in the buffer
    densified, as torch.optim.AdamW sees it once made dense."""
    torch.manual_seed(0)
    batches = [(torch.randint(0, 256, (8,), device=TORCH_DEVICE),
                torch.randint(0, 4, (8,), device=TORCH_DEVICE))
               for _ in range(4)]
    beside_torch(SparseBag().to(TORCH_DEVICE), batches,
                 lambda p: p.grad.to_dense())


def test_close_puts_the_trained_weights_back() -> None:
    m = model()
    engine = st.initialize(m, config())
    train_strata(m, config(), data(3), engine=engine, close=False)
    trained = engine.state_dict()
    engine.close()
    for key, value in m.state_dict().items():
        assert torch.equal(value.cpu(), trained[key]), key


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_the_next_forward_finds_the_updated_weights_on_the_device(
        clip: float) -> None:
    """Note [Updates below the device] in src/store/residency_holds.cc: the
    optimizer's update of a compute copy at its home queues a prefetch of
    it to the device, so the next forward finds the new weights there,
    whether they landed under backward or (clipping) under the next
    forward; from the second step on, once there is a trace to follow."""
    engine = st.initialize(model(), config(gradient_clipping=clip))
    batches = data(3)
    for x, y in batches[:2]:
        engine.backward(engine(x, y).loss)
        engine.step()
    engine.store.drain()
    before = engine.store.stats()
    assert before["prefetches"] > 0
    x, y = batches[2]
    engine(x, y)
    after = engine.store.stats()
    assert after["prefetch_hits"] > before["prefetch_hits"]
    engine.close()


def test_the_host_budget_holds_the_gradients_a_step_keeps(nvme: Path
                                                          ) -> None:
    """With the state on NVMe a step keeps every group's gradients (homed
    there) until its global checks say whether it stands. Written down
    meanwhile under host pressure, they would be bytes written and dropped
    unread (issue #34 §1: 0.057 GB a step of the 107M GPT with int8
    state, whose small groups shrank the staging). So the default host
    budget holds them all beside the largest group's other roles, on top
    of the homes and the 64 MiB of slack: fp32 gradients of one
    micro-batch go straight into their accumulators, with no staging."""
    from strata.torch import _engine_options, _group_bytes
    from strata.torch.ranks import Ranks
    cfg = dataclasses.replace(TINY, width=64, layers=16)
    engine = st.initialize(model(cfg), config(
        strata={"state_dtype": "int8"},
        zero_optimization={"offload_optimizer": {
            "device": "nvme", "nvme_path": str(nvme)}}))
    try:
        ds, plans = engine.ds_config, [g.plan for g in engine.rt.groups]
    finally:
        engine.close()
    ranks = Ranks()
    sizes = [_group_bytes(ds, p, torch.float32, ranks) for p in plans]
    grads = [4 * sum(t.numel() for _, t in p.params) if p.trainable else 0
             for p in plans]
    beside = max(c + s - g for (c, s), g in zip(sizes, grads))
    compute = sum(c for c, _ in sizes)
    slack = 64 << 20
    host = _engine_options(ds, plans, torch.float32, ranks)["host_budget"]
    assert sum(grads) + beside > 4 * max(c + s for c, s in sizes)
    assert host == compute + sum(grads) + beside + slack
