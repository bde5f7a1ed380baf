"""Patterns of training scripts that used to hang strata.torch (issue #30):
each must finish, and match plain PyTorch."""
from __future__ import annotations

import copy

import pytest
import torch

import strata.torch as st
from conftest import TORCH_DEVICE, config, data, gpt2
from test_exact import LOSS_RTOL, PARAM_ATOL

transformers = pytest.importorskip("transformers")


def test_two_forwards_then_one_backward_sum_their_gradients() -> None:
    """R-drop and contrastive losses run the model twice and back-propagate
    the sum: every group's gradient is complete only after the backward of
    its second use. With the default config (2 gradient buffers) this hung
    in acquire_gradients."""
    m = gpt2()
    ref = copy.deepcopy(m).to(TORCH_DEVICE)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    engine = st.initialize(m, config())
    steps = data(4)
    for (x1, _), (x2, _) in zip(steps, steps[1:] + steps[:1]):
        a = engine(input_ids=x1, labels=x1)
        b = engine(input_ids=x2, labels=x2)
        engine.backward(a.loss + b.loss)
        engine.step()
        ra = ref(input_ids=x1, labels=x1)
        rb = ref(input_ids=x2, labels=x2)
        (ra.loss + rb.loss).backward()
        opt.step()
        opt.zero_grad()
        assert a.loss.item() == pytest.approx(ra.loss.item(), rel=LOSS_RTOL)
        assert b.loss.item() == pytest.approx(rb.loss.item(), rel=LOSS_RTOL)
    state = engine.state_dict()
    for key, value in ref.state_dict().items():
        assert torch.allclose(state[key].to(value.device), value,
                              atol=PARAM_ATOL), key
    engine.close()
