"""A DeepSpeed training script, as its users write them: a transformers
GPT-2 built from a config learns a text, with gradient accumulation,
clipping, a WarmupLR schedule and offloaded optimizer state from
ds_config_gpt2.json; a checkpoint with client state every --save-every
steps, --resume from the latest, and the 16-bit weights saved at the end.
It runs through strata with one line changed: the deepspeed import.

    python examples/ds_train_gpt2.py --deepspeed \
        --deepspeed_config examples/ds_config_gpt2.json --steps 8
    torchrun --nproc-per-node 2 examples/ds_train_gpt2.py ...  # 2 ranks

Each step prints one JSON line: {"step": n, "loss": ..., "lr": ...}.
"""
from __future__ import annotations

import argparse
import json

import torch
import transformers

import strata.torch.deepspeed as deepspeed  # was: import deepspeed
from gpt import text_bytes

SEQ = 32


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--checkpoints", default="checkpoints")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--output", default="gpt2-16bit")
    parser.add_argument("--seed", type=int, default=0)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def text() -> torch.Tensor:
    """A text every Debian system ships, as bytes (the tokens)."""
    return text_bytes().long()


def micro_batch(tokens: torch.Tensor, step: int, micro: int, size: int,
                seed: int, rank: int = 0) -> torch.Tensor:
    """The same windows of the text for the same (step, micro-batch,
    rank): each rank of a data-parallel run trains its own."""
    g = torch.Generator().manual_seed(
        seed * 100003 + step * 101 + micro + rank * 1000003)
    starts = torch.randint(0, len(tokens) - SEQ, (size,), generator=g)
    return torch.stack([tokens[s:s + SEQ] for s in starts])


def main() -> None:
    args = parse()
    deepspeed.init_distributed()
    with deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config):
        model = build_model(args.seed)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters())
    start = 0
    if args.resume:
        path, client_state = engine.load_checkpoint(args.checkpoints)
        if path is not None:
            start = client_state["step"]
    tokens = text()
    size = engine.train_micro_batch_size_per_gpu()
    engine.train()
    for step in range(start, args.steps):
        total = 0.0
        for micro in range(engine.gradient_accumulation_steps()):
            ids = micro_batch(tokens, step, micro, size, args.seed,
                              engine.global_rank)
            loss = engine(input_ids=ids.to(engine.device),
                          labels=ids.to(engine.device)).loss
            engine.backward(loss)
            engine.step()
            total += loss.item() / engine.gradient_accumulation_steps()
        print(json.dumps({"step": step + 1, "loss": total,
                          "lr": engine.get_lr()[0],
                          "grad_norm": engine.get_global_grad_norm()}),
              flush=True)
        if (step + 1) % args.save_every == 0:
            engine.save_checkpoint(args.checkpoints, tag=step + 1,
                                   client_state={"step": step + 1})
    engine.save_16bit_model(args.output)


if __name__ == "__main__":
    main()
