"""How far strata.torch drifts from torch.optim.AdamW: the tests' GPT,
transformers' GPT-2 and Llama, 20 steps each through both from the same
weights and data (python/tests/torch's helpers); prints the largest
relative loss difference and parameter difference (docs/PERF.md).

    PYTHONPATH=python:examples:python/tests/torch \\
      STRATA_LIBRARY=build/lib/libstrata.so \\
      /var/cache/strata/torch-venv/bin/python bench/torch_drift.py
"""
from __future__ import annotations

import torch

import test_transformers
from conftest import config, data, model, train_strata, train_torch, twin


def main() -> None:
    for name, make in (("gpt", model), ("gpt2", test_transformers.gpt2),
                       ("llama", test_transformers.llama)):
        torch.manual_seed(0)
        m = make()
        ref = train_torch(twin(m), data())
        run = train_strata(m, config(), data())
        loss = max(abs(a - b) / abs(b)
                   for a, b in zip(run.losses, ref.losses))
        param = max((run.state[k] - v).abs().max().item()
                    for k, v in ref.state.items())
        print(f"{name}: loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}, "
              f"largest relative loss difference {loss:.2e}, largest "
              f"parameter difference {param:.2e}")


if __name__ == "__main__":
    main()
