"""A small GPT (decoder-only transformer, tied input embedding and LM head)
and byte-level text batches: the model of strata.torch's tests, the main
job (examples/train_gpt.py) and bench/torch_offload_bench.py. Plain
PyTorch, nothing strata-specific."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    vocab: int = 256      # bytes
    seq: int = 64
    width: int = 128
    layers: int = 4
    heads: int = 4
    # Activation checkpointing of each block: "", "reentrant" or
    # "nonreentrant" (torch.utils.checkpoint's use_reentrant).
    checkpointing: str = ""

    def block_parameters(self) -> int:
        """The parameter count of one block."""
        return 12 * self.width ** 2 + 13 * self.width

    def parameters(self) -> int:
        """The parameter count (the head is tied to the embedding)."""
        w = self.width
        return (self.vocab * w + self.seq * w
                + self.layers * self.block_parameters() + 2 * w)


class Output(NamedTuple):
    loss: Optional[torch.Tensor]
    logits: torch.Tensor


class Attention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.proj = nn.Linear(c.width, c.width)
        self.proj.residual = True  # GPT._init_weights scales it down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=2)
        shape = (b, t, self.heads, w // self.heads)
        q, k, v = (y.view(shape).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, w))


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.width)
        self.attn = Attention(c)
        self.ln2 = nn.LayerNorm(c.width)
        self.fc = nn.Linear(c.width, 4 * c.width)
        self.out = nn.Linear(4 * c.width, c.width)
        self.out.residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.width)
        self.wpe = nn.Embedding(c.seq, c.width)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.width)
        self.lm_head = nn.Linear(c.width, c.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2's initialization of one module (strata.torch.init calls it
        for each module as it builds the model group by group): weights
        N(0, 0.02), the residual projections scaled by 1/sqrt(2 layers)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = 0.02 / math.sqrt(2 * self.config.layers) \
                if getattr(module, "residual", False) else 0.02
            nn.init.normal_(module.weight, 0.0, std)

    def forward(self, idx: torch.Tensor,
                targets: Optional[torch.Tensor] = None) -> Output:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            if self.config.checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=(
                    self.config.checkpointing == "reentrant"))
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(),
                                   targets.flatten())
        return Output(loss, logits)


def text_bytes(path: Optional[str] = None) -> torch.Tensor:
    """A plain text as a uint8 tensor: `path`, else the first of a few texts
    every Debian system ships."""
    candidates = [path] if path else [
        "/usr/share/common-licenses/GPL-3",
        "/usr/share/common-licenses/Apache-2.0",
        "/usr/share/doc/bash/README"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            data = Path(candidate).read_bytes()
            return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    raise FileNotFoundError(f"none of {candidates} exists; pass a text file")


def batches(text: torch.Tensor, batch: int, seq: int, steps: int,
            seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` (input, target) batches of random windows of `text`, the
    same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, len(text) - seq - 1, (batch,), generator=g)
        window = torch.stack([text[s:s + seq + 1] for s in starts]).long()
        out.append((window[:, :-1], window[:, 1:]))
    return out
