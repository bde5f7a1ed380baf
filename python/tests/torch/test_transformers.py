"""transformers' GPT-2 (tied head) and Llama (untied), from a config with
random weights, trained through strata and through plain PyTorch."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import (config, data, gpt2, llama, train_strata, train_torch,
                      twin)
from test_exact import LOSS_RTOL, PARAM_ATOL

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_trains_like_torch_adamw(make: Any) -> None:
    torch.manual_seed(0)
    m = make()
    ref = train_torch(twin(m), data())
    run = train_strata(m, config(), data())
    assert run.losses[-1] < run.losses[0] - 0.5
    for a, b in zip(run.losses, ref.losses):
        assert a == pytest.approx(b, rel=LOSS_RTOL)
    for key, value in ref.state.items():
        assert torch.allclose(run.state[key], value, atol=PARAM_ATOL), key
