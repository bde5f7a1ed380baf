"""Helpers of strata.torch's tests: a small GPT (examples/gpt.py) trained
through strata and through plain PyTorch from the same weights and data."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch
from torch import nn

import strata.torch as st
from gpt import GPT, GPTConfig, batches, text_bytes

TINY = GPTConfig(width=32, layers=2, heads=2, seq=16)
# "host" (the host-emulated device) or "cuda": the GPU check runs these
# tests on the GPU (scripts/gpu_check.py).
DEVICE = os.environ.get("STRATA_TEST_DEVICE", "host")
TORCH_DEVICE = torch.device("cuda" if DEVICE == "cuda" else "cpu")
BATCH = 8
STEPS = 20


@dataclass
class Run:
    """What a training run produced."""
    losses: list[float] = field(default_factory=list)
    reports: list[Any] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)


def model(cfg: GPTConfig = TINY, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg)


def gpt2(seed: int = 0) -> nn.Module:
    """A 2-layer transformers GPT-2 from a config (no dropout)."""
    import transformers
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def llama(seed: int = 0) -> nn.Module:
    """A 2-layer transformers Llama from a config (untied head, GQA)."""
    import transformers
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=32))


def data(steps: int = STEPS, cfg: GPTConfig = TINY
         ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.to(TORCH_DEVICE), y.to(TORCH_DEVICE))
            for x, y in batches(text_bytes(), BATCH, cfg.seq, steps)]


def config(**over: Any) -> dict[str, Any]:
    """A ds_config dict: AdamW fp32 on the host-emulated device, with
    `over` merged in (nested dicts merged key by key)."""
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": BATCH,
        "optimizer": {"type": "AdamW", "params": {
            "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
            "weight_decay": 0.1}},
        "strata": {"device": DEVICE, "threads": 1, "io_threads": 1},
    }
    _merge(out, over)
    return out


def _merge(into: dict[str, Any], over: dict[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def micro_batches(x: torch.Tensor, y: torch.Tensor, n: int
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(x.chunk(n), y.chunk(n)))


def loss_of(out: Any) -> torch.Tensor:
    return out.loss if hasattr(out, "loss") else out[0]


def forward(m: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    """transformers' models take (input_ids, labels), the others (x, y)."""
    module = getattr(m, "module", m)
    if hasattr(getattr(module, "config", None), "model_type"):
        return m(input_ids=x, labels=x)
    return m(x, y)


def train_strata(m: nn.Module, cfg: dict[str, Any],
                 batches_: list[tuple[torch.Tensor, torch.Tensor]],
                 engine: Optional[st.StrataEngine] = None,
                 close: bool = True) -> Run:
    """Trains `m` through strata on `batches_`, one step each."""
    engine = engine or st.initialize(m, cfg)
    run = Run()
    n = engine.ds_config.accumulation
    for x, y in batches_:
        total = 0.0
        for mx, my in micro_batches(x, y, n):
            loss = loss_of(forward(engine, mx, my))
            engine.backward(loss)
            total += loss.item() / n
            report = engine.step()
        run.losses.append(total)
        run.reports.append(report)
    run.state = {k: v.cpu() for k, v in engine.state_dict().items()}
    if close:
        engine.close()
    return run


def train_torch(m: nn.Module, batches_: list[tuple[torch.Tensor,
                                                    torch.Tensor]],
                lr: Callable[[int], float] = lambda step: 3e-3,
                clip: float = 0.0, accumulation: int = 1) -> Run:
    """The reference: torch.optim.AdamW, everything in memory, with the
    hyperparameters of config()."""
    m.to(TORCH_DEVICE)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad],
                            lr=lr(0), betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    run = Run()
    for step, (x, y) in enumerate(batches_):
        for g in opt.param_groups:
            g["lr"] = lr(step)
        total = 0.0
        for mx, my in micro_batches(x, y, accumulation):
            loss = loss_of(forward(m, mx, my))
            (loss / accumulation).backward()
            total += loss.item() / accumulation
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        opt.zero_grad()
        run.losses.append(total)
    run.state = {k: v.detach().cpu().clone()
                 for k, v in m.named_parameters()}
    return run


def twin(m: nn.Module) -> nn.Module:
    """A copy of `m` with the same weights (before initialize)."""
    return copy.deepcopy(m)


def assert_identical(a: Run, b: Run, what: str = "") -> None:
    assert a.losses == b.losses, what
    assert a.state.keys() == b.state.keys(), what
    for key in a.state:
        assert torch.equal(a.state[key], b.state[key]), f"{what}: {key}"


@pytest.fixture
def nvme(scratch: Path) -> Path:
    path = scratch / "nvme"
    path.mkdir()
    return path


