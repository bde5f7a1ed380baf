"""The model strata-train trains: a built-in preset or a transformers
config JSON, built with transformers.AutoModelForCausalLM.from_config
under strata.torch.init (its parameters start on the meta device and are
materialized straight into strata's tiers by strata.torch.initialize).
Nothing is downloaded: a config is a file or a directory on disk."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from torch import nn

import strata.torch as st


class TrainError(Exception):
    """Input strata-train cannot run with (a preset, a file, a flag): the
    message names it and the fix; the command exits 2, as argparse does."""


# Published shapes. GPT-2 (Radford et al. 2019; HF's gpt2, gpt2-medium,
# gpt2-large, gpt2-xl) without dropout, as pretraining from scratch runs it
# (nanoGPT's default). Llama 3.2 1B and 3B (tied embeddings, grouped-query
# attention, rope_theta 500000, without the long-context rope scaling) and
# Llama 2 7B. The tiny ones are for tests and smoke runs: bytes as tokens.
_NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
_LLAMA3 = {"model_type": "llama", "vocab_size": 128256,
           "max_position_embeddings": 131072, "rope_theta": 500000.0,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
           "bos_token_id": 128000, "eos_token_id": 128001}


def _gpt2(width: int, layers: int, heads: int) -> dict[str, Any]:
    return {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
            "n_embd": width, "n_layer": layers, "n_head": heads,
            **_NO_DROPOUT}


PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-tiny": {**_gpt2(32, 2, 2), "vocab_size": 256, "n_positions": 256,
                  "bos_token_id": None, "eos_token_id": None},
    "gpt2-124m": _gpt2(768, 12, 12),
    "gpt2-350m": _gpt2(1024, 24, 16),
    "gpt2-774m": _gpt2(1280, 36, 20),
    "gpt2-1.5b": _gpt2(1600, 48, 25),
    "llama-tiny": {"model_type": "llama", "vocab_size": 256,
                   "max_position_embeddings": 256, "hidden_size": 32,
                   "intermediate_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 2, "num_key_value_heads": 1,
                   "bos_token_id": None, "eos_token_id": None},
    "llama-1b": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192,
                 "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 64},
    "llama-3b": {**_LLAMA3, "hidden_size": 3072, "intermediate_size": 8192,
                 "num_hidden_layers": 28, "num_attention_heads": 24,
                 "num_key_value_heads": 8, "head_dim": 128},
    "llama-7b": {"model_type": "llama", "vocab_size": 32000,
                 "max_position_embeddings": 4096, "rope_theta": 10000.0,
                 "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                 "hidden_size": 4096, "intermediate_size": 11008,
                 "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 32},
}


def model_config(preset: Optional[str], config_path: Optional[str],
                 init_from: Optional[str]) -> tuple[Any, str]:
    """The transformers config to build and a name for it: the preset, the
    config JSON (a file, or a directory holding config.json), or the
    config.json beside the --init-from weights."""
    import transformers
    if preset is not None and config_path is not None:
        raise TrainError("give --preset or --model-config, not both")
    if preset is not None:
        if preset not in PRESETS:
            raise TrainError(f"unknown preset {preset!r}; the presets are "
                             f"{', '.join(PRESETS)}")
        return transformers.AutoConfig.for_model(**PRESETS[preset]), preset
    if config_path is None and init_from and Path(init_from).is_dir():
        config_path = init_from
    if config_path is None:
        raise TrainError("no model: give --preset NAME (one of "
                         f"{', '.join(PRESETS)}) or --model-config "
                         f"config.json")
    path = Path(config_path)
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TrainError(f"cannot read the model config {path}: {e}") from e
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise TrainError(f"{path} is not a transformers config: it has no "
                         f"\"model_type\" (e.g. \"gpt2\", \"llama\")")
    try:
        return transformers.AutoConfig.for_model(**raw), str(path)
    except (ValueError, KeyError) as e:
        raise TrainError(f"{path}: {e}") from e


def build_model(config: Any, ds_config: dict[str, Any]) -> nn.Module:
    """The causal LM of `config`, its parameters on the meta device until
    strata.torch.initialize materializes them into strata's tiers."""
    import transformers
    try:
        with st.init(ds_config):
            return transformers.AutoModelForCausalLM.from_config(config)
    except ValueError as e:  # a model_type with no causal LM
        raise TrainError(f"cannot build a causal LM from this config: {e}"
                         ) from e


def parameter_count(model: nn.Module) -> int:
    """Every parameter once (tied ones once)."""
    return sum(p.numel() for p in model.parameters())


def max_positions(config: Any) -> Optional[int]:
    """The longest sequence the model takes, when its config says."""
    return getattr(config, "max_position_embeddings", None)


def flops_per_token(config: Any, params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6*N for the matrix products of forward
    and backward over every parameter, plus 12*L*d*T for attention's
    scores and weighted sums (PaLM, appendix B; nanoGPT's estimate_mfu)."""
    layers = config.num_hidden_layers
    width = config.hidden_size
    return 6.0 * params + 12.0 * layers * width * seq_len
