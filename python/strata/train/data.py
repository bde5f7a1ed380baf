"""strata-train's data: a token stream on disk, memory-mapped, and the
batches drawn from it.

A file ending in .bin is a flat array of token ids as nanoGPT's prepare
scripts write them (uint16 unless --token-dtype says int32 or uint32); a
.npy file is a one-dimensional integer array. Any other file is text,
tokenized as its bytes: token ids 0-255, so the model's vocabulary must
hold at least 256 ids. A batch is `micro_batch` windows of seq_len + 1
tokens at random offsets (inputs: the first seq_len, targets: the last
seq_len), drawn from a seeded generator whose state goes into every
checkpoint, so a resumed run draws what the uninterrupted one would."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from strata.train.models import TrainError

TOKEN_DTYPES = {"uint16": np.uint16, "int32": np.int32, "uint32": np.uint32}


class Tokens:
    """The token ids of a data file, memory-mapped (never read whole)."""

    def __init__(self, path: str, token_dtype: Optional[str] = None) -> None:
        file = Path(path)
        if not file.is_file():
            raise TrainError(f"--data {path}: no such file")
        self.path = str(file)
        try:
            self.ids, self.kind = _open(file, token_dtype)
        except (OSError, ValueError) as e:
            raise TrainError(f"--data {path}: cannot read it: {e}") from e
        if self.ids.ndim != 1 or self.ids.dtype.kind not in "iu":
            raise TrainError(
                f"--data {path}: a .npy of token ids must be one-"
                f"dimensional integers, not {self.ids.dtype} of shape "
                f"{self.ids.shape}")

    @property
    def is_text(self) -> bool:
        return self.kind == "text"

    def __len__(self) -> int:
        return len(self.ids)

    def describe(self) -> str:
        what = "text, its bytes as tokens" if self.is_text \
            else f"{self.ids.dtype} token ids"
        return f"{self.path} ({len(self):,} tokens: {what})"


def _open(file: Path, token_dtype: Optional[str]
          ) -> tuple[np.ndarray, str]:
    if file.suffix == ".npy":
        if token_dtype:
            raise TrainError("--token-dtype is for .bin files; a .npy file "
                             "says its own dtype")
        return np.load(file, mmap_mode="r"), "npy"
    if file.suffix == ".bin":
        return np.memmap(file, dtype=TOKEN_DTYPES[token_dtype or "uint16"],
                         mode="r"), "bin"
    if token_dtype:
        raise TrainError(f"--token-dtype is for .bin files; {file} is read "
                         f"as text (its bytes are the tokens)")
    return np.memmap(file, dtype=np.uint8, mode="r"), "text"


class Batches:
    """Random windows of `tokens`, the same ones for the same seed and the
    same state (state() / restore())."""

    def __init__(self, tokens: Tokens, micro_batch: int, seq_len: int,
                 vocab: int, seed: int) -> None:
        if tokens.is_text and vocab < 256:
            raise TrainError(
                f"--data {tokens.path} is text, tokenized as bytes (ids "
                f"0-255), but the model's vocabulary has {vocab} ids; use a "
                f"model with vocab_size >= 256 or a token file (.bin/.npy)")
        if len(tokens) < seq_len + 1:
            raise TrainError(
                f"--data {tokens.path} holds {len(tokens)} tokens, fewer "
                f"than a window of --seq-len {seq_len} + 1 needs; give more "
                f"data or a shorter --seq-len")
        self.tokens = tokens
        self.micro_batch = micro_batch
        self.seq_len = seq_len
        self.vocab = vocab
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each micro_batch x seq_len int64 token ids."""
        last = len(self.tokens) - self.seq_len - 1  # the last window's start
        starts = torch.randint(0, last + 1, (self.micro_batch,),
                               generator=self.generator).tolist()
        window = torch.from_numpy(np.stack(
            [self.tokens.ids[s:s + self.seq_len + 1] for s in starts]
        ).astype(np.int64))
        largest = int(window.max())
        if largest >= self.vocab:
            raise TrainError(
                f"--data {self.tokens.path} has token id {largest}, outside "
                f"the model's vocabulary of {self.vocab}; check --token-"
                f"dtype and the tokenizer the file was written with")
        return window[:, :-1], window[:, 1:]

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def restore(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
