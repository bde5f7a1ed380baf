"""Tied weights, frozen parameters, activation checkpointing, clipping,
fp16 loss scaling, the scheduler, bf16 and inference through strata.torch."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import strata.torch as st
from conftest import (TINY, TORCH_DEVICE, assert_identical, config, data,
                      model, train_strata, train_torch, twin)
from gpt import GPT
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


def test_clipping_fires_on_some_steps_and_matches_torch() -> None:
    steps = data(10)
    norms = [r.grad_norm for r in train_strata(model(), config(),
                                               steps).reports]
    clip = sorted(norms)[len(norms) // 2]
    m = model()
    ref = train_torch(twin(m), steps, clip=clip)
    run = train_strata(m, config(gradient_clipping=clip), steps)
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
        lrs.append(engine.get_lr())
        engine.backward(engine(x, y).loss)
        engine.step()
    engine.close()
    assert lrs == pytest.approx([0, 6e-4, 1.2e-3, 1.8e-3, 2.4e-3, 3e-3,
                                 3e-3, 3e-3])
    m = model()
    ref = train_torch(twin(m), data(8), lr=lambda s: lrs[s])
    agree(train_strata(m, cfg, data(8)), ref)


def test_bf16_trains_with_fp32_masters() -> None:
    run = train_strata(model(), config(bf16={"enabled": True}), data())
    assert run.losses[-1] < run.losses[0] - 0.5
    assert all(v.dtype == torch.float32 for v in run.state.values())


def test_inference_through_the_hooks_matches_the_weights() -> None:
    m = model()
    engine = st.initialize(m, config())
    train_strata(m, config(), data(3), engine=engine, close=False)
    x, y = data(1)[0]
    engine.eval()
    with torch.no_grad():
        logits = engine(x).logits
    plain = GPT(TINY).to(TORCH_DEVICE)
    plain.load_state_dict(engine.state_dict(), strict=False)
    plain.eval()
    with torch.no_grad():
        assert torch.equal(plain(x).logits, logits)
    engine.train()
    engine.backward(engine(x, y).loss)  # training goes on after eval
    assert engine.step() is not None
    engine.close()
