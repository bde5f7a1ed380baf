"""Weights in from safetensors (init_from) and out (engine.export, and
python -m strata.torch.export from a checkpoint), streamed group by group,
in the Hugging Face layout that transformers loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import config, data, gpt2, train_strata, twin
from safetensors.torch import load_file, save_file, save_model

import strata.torch as st
from strata._native import StrataError
from strata.torch.config import ConfigError
from strata.torch.export import export_checkpoint

# strata's AdamW and torch's (foreach) round a few weights differently
# (ulps, test_transformers.py's PARAM_ATOL); the logits follow.
LOGIT_ATOL = 1e-5
SHARD = 40_000  # bytes: the 2-layer GPT-2 spans several shards


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_weights_come_in_from_one_file_or_shards(scratch: Path) -> None:
    source = gpt2(seed=1)
    save_model(source, str(scratch / "one.safetensors"))
    source.save_pretrained(scratch / "sharded", max_shard_size="40KB")
    assert (scratch / "sharded" / "model.safetensors.index.json").exists()
    for path in (scratch / "one.safetensors", scratch / "sharded"):
        with st.init(config()):
            m = gpt2(seed=9)
        engine = st.initialize(m, config(), init_from=path)
        state = engine.state_dict()
        engine.close()
        for key, value in source.state_dict().items():
            assert torch.equal(value, state[key]), (path.name, key)


def test_trained_and_exported_it_loads_in_transformers(scratch: Path
                                                       ) -> None:
    """The round trip of issue #32 §5.2, through the library."""
    import transformers
    source = gpt2(seed=1)
    save_model(source, str(scratch / "init.safetensors"))
    with st.init(config()):
        m = gpt2(seed=5)
    engine = st.initialize(m, config(), init_from=scratch / "init.safetensors")
    run = train_strata(m, config(), data(5), engine=engine, close=False)
    ref = train_strata(twin(source), config(), data(5))  # test_build.py
    assert run.losses == ref.losses
    files = engine.export(str(scratch / "out"), max_shard_bytes=SHARD)
    assert len(files) > 1 and (scratch / "out" / "config.json").exists()
    engine.save_checkpoint(str(scratch / "ckpt"))
    engine.close()
    flat: dict[str, torch.Tensor] = {}
    for f in files:
        flat.update(load_file(str(f)))
    for key, value in run.state.items():  # strata's weights, exactly
        assert torch.equal(flat.get(key, flat["transformer.wte.weight"]),
                           value), key
    loaded = transformers.GPT2LMHeadModel.from_pretrained(scratch / "out")
    ref_model = twin(source)
    ref_model.load_state_dict(ref.state, strict=False)
    x = data(1)[0][0]
    with torch.no_grad():  # torch's AdamW rounds differently: ulps apart
        assert torch.allclose(loaded(input_ids=x).logits,
                              ref_model(input_ids=x).logits, atol=LOGIT_ATOL)
    export_checkpoint(scratch / "ckpt", scratch / "offline",
                      max_shard_bytes=SHARD)
    assert files_of(scratch / "out") == files_of(scratch / "offline")


def test_export_in_the_compute_dtype(scratch: Path) -> None:
    m = gpt2()
    engine = st.initialize(m, config(bf16={"enabled": True}))
    engine.export(str(scratch / "bf16"), dtype="compute")
    engine.export(str(scratch / "fp32"))
    engine.close()
    low = load_file(str(scratch / "bf16" / "model.safetensors"))
    high = load_file(str(scratch / "fp32" / "model.safetensors"))
    assert low["transformer.h.0.mlp.c_fc.weight"].dtype == torch.bfloat16
    assert high["transformer.h.0.mlp.c_fc.weight"].dtype == torch.float32
    assert torch.equal(high["transformer.h.0.mlp.c_fc.weight"],
                       gpt2().state_dict()["transformer.h.0.mlp.c_fc.weight"])


def test_bad_weights_files_are_named(scratch: Path) -> None:
    state = {k: v.clone() for k, v in gpt2().state_dict().items()
             if k != "lm_head.weight"}
    wrong = dict(state)
    wrong["transformer.h.1.attn.c_attn.weight"] = torch.zeros(3, 3)
    save_file(wrong, str(scratch / "wrong.safetensors"))
    extra = dict(state, **{"transformer.h.9.mlp.c_fc.weight": torch.ones(2)})
    save_file(extra, str(scratch / "extra.safetensors"))
    missing = {k: v for k, v in state.items() if "h.1.mlp" not in k}
    save_file(missing, str(scratch / "missing.safetensors"))
    raw = (scratch / "extra.safetensors").read_bytes()
    (scratch / "cut.safetensors").write_bytes(raw[:len(raw) // 2])
    (scratch / "shards").mkdir()
    (scratch / "shards" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"transformer.wte.weight":
                                   "model-00002-of-00002.safetensors"}}))
    cases = {"wrong": "c_attn.weight has shape \\[3, 3\\]",
             "extra": "h.9.mlp.c_fc.weight matches no parameter",
             "missing": "parameter transformer.h.1.mlp.* is not in it",
             "cut": "cut.safetensors is not a readable safetensors file",
             "no-such": "no such safetensors file"}
    for name, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            st.initialize(gpt2(), config(),
                          init_from=scratch / f"{name}.safetensors")
    with pytest.raises(ConfigError, match="model-00002-of-00002.safetensors"
                       ", which does not exist"):
        st.initialize(gpt2(), config(), init_from=scratch / "shards")
    for name in ("extra", "missing"):  # strict=False lets them through
        with st.init(config()):
            m = gpt2(seed=4)
        engine = st.initialize(m, config(), strict=False,
                               init_from=scratch / f"{name}.safetensors")
        got = engine.state_dict()
        engine.close()
        assert torch.equal(got["transformer.wte.weight"],
                           state["transformer.wte.weight"])
        assert torch.isfinite(got["transformer.h.1.mlp.c_fc.weight"]).all()


def test_the_offline_export_checks_the_checkpoint(scratch: Path) -> None:
    engine = st.initialize(gpt2(), config())
    engine.save_checkpoint(str(scratch / "ckpt"), tag="t")
    engine.close()
    env = dict(os.environ)
    cli = [sys.executable, "-m", "strata.torch.export"]
    ok = subprocess.run(cli + [str(scratch / "ckpt"), str(scratch / "out")],
                        env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert (scratch / "out" / "model.safetensors").exists()
    group = scratch / "ckpt" / "t" / "group-000003.bin"
    raw = bytearray(group.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    group.write_bytes(bytes(raw))
    bad = subprocess.run(cli + [str(scratch / "ckpt"), str(scratch / "o2")],
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 1
    assert "checksum mismatch in" in bad.stderr and "group-000003" in \
        bad.stderr
    with pytest.raises(StrataError, match="checksum mismatch"):
        export_checkpoint(scratch / "ckpt" / "t", scratch / "o3")
    with pytest.raises(ConfigError, match="no strata checkpoint"):
        export_checkpoint(scratch / "nothing", scratch / "o4")
