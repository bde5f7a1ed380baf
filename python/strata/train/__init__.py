"""strata-train: train a causal language model (a built-in preset or a
transformers config) on a text or token file through strata.torch, from
the command line, with a DeepSpeed-style config; docs/train.md has every
flag and output.

    strata-train --preset gpt2-124m --data input.txt --steps 200
    python -m strata.train --help

The package: cli (the flags, setup and exit statuses), models (presets,
building under strata.torch.init), data (token files and batches),
dsconfig (the default config and the flags over it), loop (the steps, the
log, checkpoints and Ctrl-C) and report (the plan, peak FLOPS, the
plot)."""
from __future__ import annotations

from strata.train.cli import main

__all__ = ["main"]
