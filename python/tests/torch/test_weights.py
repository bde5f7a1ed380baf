"""The weights are never silently empty (issue #30 §3): while strata holds
them, model.state_dict(), torch.save and save_pretrained write the real
values; GatheredParameters reads and writes them; a stray read raises
naming the parameter, while the metadata stays true; close() gives frozen
weights back exactly."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import strata
import strata.torch as st
from conftest import (TINY, TORCH_DEVICE, config, data, gpt2, model,
                      twin)
from test_exact import LOSS_RTOL, PARAM_ATOL
from gpt import GPT

transformers = pytest.importorskip("transformers")


def trained(m: torch.nn.Module, steps: int = 3) -> st.StrataEngine:
    engine = st.initialize(m, config())
    for x, _ in data(steps):
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    return engine


def logits_of(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return m.to(x.device)(input_ids=x).logits


def same_logits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal on the CPU; on a GPU within kernel-choice noise."""
    if a.device.type == "cpu":
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_save_pretrained_and_torch_save_while_active(scratch: Path) -> None:
    """Both used to write every tensor with shape [0]; from_pretrained then
    failed on every key."""
    m = gpt2()
    engine = trained(m)
    x = data(1)[0][0]
    engine.eval()
    with torch.no_grad():
        expected = engine(input_ids=x).logits
    m.save_pretrained(scratch / "hf")
    torch.save(m.state_dict(), scratch / "model.pt")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(scratch / "hf")
    assert same_logits(logits_of(loaded, x), expected)
    plain = gpt2()
    plain.load_state_dict(torch.load(scratch / "model.pt"))
    assert same_logits(logits_of(plain, x), expected)
    engine.close()


def test_a_stray_read_raises_and_metadata_stays_true() -> None:
    m = model()
    shapes = {n: p.shape for n, p in m.named_parameters()}
    count = sum(p.numel() for p in m.parameters())
    engine = trained_gpt(m)
    weight = m.blocks[0].fc.weight
    assert {n: p.shape for n, p in m.named_parameters()} == shapes
    assert sum(p.numel() for p in m.parameters()) == count
    assert weight.dtype == torch.float32 and weight.dim() == 2
    with pytest.raises(strata.StrataError, match=r"blocks.0.fc.weight \(sum\)"
                       r" is held by strata .*GatheredParameters"):
        weight.sum()
    with pytest.raises(strata.StrataError, match="clip with gradient_"
                       "clipping in the config"):
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
    m.zero_grad()  # reads .grad only to clear it
    assert "held by strata.torch" in repr(weight)
    engine.close()
    assert torch.isfinite(weight.sum())


def trained_gpt(m: torch.nn.Module) -> st.StrataEngine:
    engine = st.initialize(m, config())
    for x, y in data(2):
        engine.backward(engine(x, y).loss)
        engine.step()
    return engine


def test_gathered_parameters_read_and_write_back() -> None:
    """Inside the context the weights are real; a change made under
    modifier_rank 0 goes into the master and the compute copy, so training
    goes on from it as plain PyTorch's does; without one it is dropped."""
    m = model()
    reference = twin(m).to(TORCH_DEVICE)
    opt = torch.optim.AdamW(reference.parameters(), lr=3e-3,
                            betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    engine = st.initialize(m, config())
    losses, ref_losses = [], []
    for i, (x, y) in enumerate(data(4)):
        if i == 2:
            weight = m.blocks[1].fc.weight
            with st.GatheredParameters([weight]):
                assert torch.allclose(weight.detach().cpu(),
                                      reference.blocks[1].fc.weight.cpu(),
                                      atol=PARAM_ATOL)
                weight.data.mul_(0.5)  # dropped: no modifier_rank
            with st.GatheredParameters(weight, modifier_rank=0):
                weight.data.mul_(0.5)
            with torch.no_grad():
                reference.blocks[1].fc.weight.mul_(0.5)
        loss = engine(x, y).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        ref_loss = reference(x, y).loss
        ref_loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(ref_loss.item())
    assert losses == pytest.approx(ref_losses, rel=LOSS_RTOL)
    state = engine.state_dict()
    for key, value in reference.state_dict().items():
        assert torch.allclose(state[key], value.cpu(), atol=PARAM_ATOL), key
    engine.close()


def test_close_gives_frozen_weights_back_exactly_in_bf16() -> None:
    """Frozen groups are stored in bf16 for the forward; close() used to
    give the user's fp32 weights back rounded."""
    m = model()
    for p in m.blocks[0].parameters():
        p.requires_grad_(False)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    engine = st.initialize(m, config(bf16={"enabled": True}))
    for x, y in data(2):
        engine.backward(engine(x, y).loss)
        engine.step()
    engine.close()
    for name, p in m.blocks[0].named_parameters():
        assert p.dtype == torch.float32
        assert torch.equal(p.detach().cpu(), before[f"blocks.0.{name}"]), name


def test_save_16bit_model_as_deepspeed(scratch: Path) -> None:
    """Only with stage3_gather_16bit_weights_on_model_save (False is
    DeepSpeed's default: nothing written, False returned); then the bf16
    compute copies under the model's keys."""
    m = model()
    engine = st.initialize(m, config(bf16={"enabled": True}))
    with pytest.warns(UserWarning, match="saved nothing"):
        assert engine.save_16bit_model(str(scratch)) is False
    engine.close()
    m = model()
    engine = st.initialize(m, config(
        bf16={"enabled": True}, zero_optimization={
            "stage3_gather_16bit_weights_on_model_save": True}))
    for x, y in data(2):
        engine.backward(engine(x, y).loss)
        engine.step()
    assert engine.save_16bit_model(str(scratch), "model.safetensors")
    assert engine.save_16bit_model(str(scratch))
    full = engine.state_dict()
    engine.close()
    from safetensors.torch import load_file
    for saved in (load_file(str(scratch / "model.safetensors")),
                  torch.load(scratch / "pytorch_model.bin")):
        assert saved.keys() == full.keys()
        for key, value in full.items():
            assert saved[key].dtype == torch.bfloat16, key
            assert torch.equal(saved[key], value.to(torch.bfloat16)), key
    plain = GPT(TINY).to(TORCH_DEVICE)
    plain.load_state_dict(
        {k: v.float() for k, v in torch.load(
            scratch / "pytorch_model.bin").items()})


def test_a_forward_inside_gathered_parameters_uses_them() -> None:
    """Inside the context the gathered values serve the forward too, and a
    forward leaves them in place (it used to put the placeholders back,
    which the exit then wrote into strata as a change: NaN)."""
    m = model()
    engine = trained_gpt(m)
    before = {k: v.clone() for k, v in engine.state_dict().items()}
    x, y = data(1)[0]
    engine.eval()
    with torch.no_grad():
        plain = engine(x, y).loss.item()
        with st.GatheredParameters(list(m.parameters()), modifier_rank=0):
            assert engine(x, y).loss.item() == plain
            m.blocks[0].fc.weight.data.zero_()
            assert engine(x, y).loss.item() != plain
    after = engine.state_dict()
    for key, value in before.items():
        expected = torch.zeros_like(value) \
            if key == "blocks.0.fc.weight" else value
        assert torch.equal(after[key], expected), key
    engine.close()
