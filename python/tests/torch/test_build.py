"""strata.torch.init and deepspeed.zero.Init: a model built on the meta
device and made real group by group as initialize() writes it into the
tiers (Note [Materializing a group] in strata/torch/build.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from conftest import TINY, config, data, gpt2, train_strata
from torch import nn

import strata.torch as st
import strata.torch.deepspeed as deepspeed
from gpt import GPT
from strata.torch.config import ConfigError


def nvme_config(path: Path) -> dict[str, Any]:
    where = {"device": "nvme", "nvme_path": str(path)}
    return config(zero_optimization={"stage": 3, "offload_optimizer": where,
                                     "offload_param": where})


def sequential() -> nn.Module:
    """Initialized by its modules' reset_parameters alone."""
    return nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32),
                         nn.LayerNorm(32), nn.Linear(32, 64))


def built(make: Callable[[], nn.Module], cfg: dict[str, Any],
          seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    with st.init(cfg):
        m = make()
    assert all(p.is_meta for p in m.parameters() if p.dim() >= 2)
    engine = st.initialize(m, cfg)
    try:
        return engine.state_dict()
    finally:
        engine.close()


def test_a_model_built_by_reset_parameters_gets_its_plain_weights() -> None:
    torch.manual_seed(5)
    plain = sequential().state_dict()
    got = built(sequential, config(), seed=5)
    assert plain.keys() == got.keys()
    for key in plain:
        assert torch.equal(plain[key], got[key]), key


def test_the_same_seed_gives_the_same_weights_on_any_tier(nvme: Path
                                                          ) -> None:
    host = built(lambda: GPT(TINY), config(), seed=3)
    disk = built(lambda: GPT(TINY), nvme_config(nvme), seed=3)
    other = built(lambda: GPT(TINY), config(), seed=4)
    for key in host:
        assert torch.equal(host[key], disk[key]), key
    assert not torch.equal(host["wte.weight"], other["wte.weight"])
    # GPT._init_weights ran: N(0, 0.02), the residual ones scaled down.
    assert abs(float(host["wte.weight"].std()) - 0.02) < 0.002
    proj = float(host["blocks.0.attn.proj.weight"].std())
    assert abs(proj - 0.01) < 0.002


def test_one_group_is_real_at_a_time(monkeypatch: pytest.MonkeyPatch
                                     ) -> None:
    torch.manual_seed(0)
    with st.init(config()):
        m = GPT(TINY)
    real: list[int] = []
    write = st._write_weights

    def counting(store: Any, gid: int, values: Any) -> None:
        real.append(sum(p.numel() for p in m.parameters()
                        if p.dim() >= 2 and not p.is_meta))
        write(store, gid, values)

    monkeypatch.setattr(st, "_write_weights", counting)
    rng = torch.get_rng_state()
    engine = st.initialize(m, config())
    assert torch.equal(rng, torch.get_rng_state())  # the caller's is kept
    largest = max(sum(p.numel() for _, p in g.plan.params if p.dim() >= 2)
                  for g in engine.rt.groups)
    assert len(real) == len(engine.rt.groups) and max(real) == largest
    assert not any(p.is_meta for p in m.parameters())
    engine.close()


def test_a_built_model_trains_like_the_plain_one() -> None:
    torch.manual_seed(2)
    with st.init(config()):
        m = gpt2(seed=2)
    weights = built(lambda: gpt2(seed=2), config(), seed=2)
    plain = gpt2(seed=2)
    plain.load_state_dict(weights)
    run = train_strata(m, config(), data(3))
    # Against the plain model through strata, not torch's AdamW: torch's
    # AVX-512 kernels round differently from its AVX2 ones, so only strata
    # against strata is bit-exact on every CPU.
    ref = train_strata(plain, config(), data(3))
    assert run.losses == ref.losses
    assert run.losses[-1] < run.losses[0]


class Uninitialized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.empty(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.table


def test_a_parameter_no_initializer_sets_is_an_error() -> None:
    with st.init(config()):
        m = Uninitialized()
    with pytest.raises(ConfigError, match="parameter table .*no initializer"):
        st.initialize(m, config())


def test_zero_init_builds_on_the_meta_device(nvme: Path) -> None:
    cfg = nvme_config(nvme)
    torch.manual_seed(3)
    with deepspeed.zero.Init(config_dict_or_path=cfg, remote_device="nvme",
                             pin_memory=True):
        m = GPT(TINY)
    assert m.wte.weight.is_meta and not m.blocks[0].ln1.weight.is_meta
    engine, *_ = deepspeed.initialize(model=m, config=cfg)
    state = engine.state_dict()
    engine.close()
    assert torch.equal(state["wte.weight"],
                       built(lambda: GPT(TINY), config(), seed=3)[
                           "wte.weight"])
    with deepspeed.zero.Init(enabled=False):
        assert not GPT(TINY).wte.weight.is_meta
    with pytest.raises(ConfigError, match="module"):
        deepspeed.zero.Init(module=GPT(TINY))


def test_a_transformers_llama_from_a_config(nvme: Path) -> None:
    """Llama's _init_weights (N(0, initializer_range), RMSNorm weights 1)
    gives the same weights on any tier."""
    from test_transformers import llama
    host = built(llama, config(), seed=6)
    disk = built(llama, nvme_config(nvme), seed=6)
    for key in host:
        assert torch.equal(host[key], disk[key]), key
    q = host["model.layers.0.self_attn.q_proj.weight"]
    assert abs(float(q.std()) - 0.02) < 0.004
    assert torch.equal(host["model.norm.weight"], torch.ones(32))


def test_the_default_nvme_budget_holds_uneven_chunks(nvme: Path) -> None:
    """The NVMe tier deals chunks to its four swap files round robin: one
    group of five chunks (bf16 compute, four fp32 roles) of a 12.6M-
    parameter layer gives one file a compute and a gradient chunk (75 MB)
    while a budget of the group's bytes and 64 MiB gives each file 72.5."""
    cfg = nvme_config(nvme)
    cfg["bf16"] = {"enabled": True}
    cfg["strata"]["mode"] = "after_backward"
    with st.init(cfg):
        m = nn.Linear(4096, 3072, bias=False)
    engine = st.initialize(m, cfg)
    assert engine.state_dict()["weight"].shape == (3072, 4096)
    engine.close()
