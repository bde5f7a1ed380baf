"""The main job's training: a GPT (gpt.py) learns a plain text, byte by
byte, through strata.torch with its optimizer state on NVMe (the swap
directory) and its parameters streamed through a device budget smaller
than the model. Prints the loss and tokens/s of every step, and writes the
loss curve as a PNG.

    python examples/train_gpt.py --swap ./swap --png loss.png
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm

import strata.torch as st
from gpt import GPT, GPTConfig, batches, text_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--swap", default="swap", help="NVMe swap directory")
    ap.add_argument("--png", default="loss.png", help="loss curve output")
    ap.add_argument("--text", help="a plain text (default: a Debian one)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda",
                                                         "host"])
    args = ap.parse_args()
    if args.steps < 3:
        ap.error("--steps must be at least 3 (the warm-up takes 2)")
    cfg = GPTConfig(width=args.width, layers=args.layers, seq=args.seq,
                    heads=max(1, args.width // 64))
    torch.manual_seed(0)
    model = GPT(cfg)
    Path(args.swap).mkdir(parents=True, exist_ok=True)
    # Half the model's fp32 weights, plus room for the gradient buffers
    # (4 by default, each a block's size) and two blocks in flight.
    block = 4 * cfg.block_parameters()
    device_budget = 2 * cfg.parameters() + 6 * block
    engine = st.initialize(model, {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {
            "lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": args.steps,
            "warmup_num_steps": min(10, args.steps // 4)}},
        "zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "nvme", "nvme_path": args.swap}},
        "strata": {"device": args.device,
                   "device_budget": device_budget},
    })
    text = text_bytes(args.text)
    device = engine.device
    print(f"strata.torch: GPT {cfg.parameters() / 1e6:.1f}M parameters, "
          f"{len(text)} bytes of text, device {device}, optimizer state "
          f"on {args.swap}")
    losses = train(engine, batches(text, args.batch, cfg.seq, args.steps),
                   device)
    stats = engine.store.stats()
    engine.close()
    device_tier = stats["tiers"]["device"]
    print(f"device budget {device_tier['budget'] >> 20} MiB (the model: "
          f"{4 * cfg.parameters() >> 20} MiB), peak "
          f"{device_tier['peak'] >> 20} MiB, {stats['evictions']} evictions")
    plot(losses, args.png)
    print(f"loss {losses[0]:.3f} -> {min(losses[-10:]):.3f}; "
          f"curve in {args.png}")
    if not min(losses[-10:]) < losses[0] - 1.0:
        raise SystemExit("the loss did not fall")


def train(engine: st.StrataEngine, data: list, device: torch.device
          ) -> list[float]:
    losses = []
    bar = tqdm(data, unit="step")
    for step, (x, y) in enumerate(bar):
        start = time.perf_counter()
        loss = engine(x.to(device), y.to(device)).loss
        engine.backward(loss)
        report = engine.step()
        seconds = time.perf_counter() - start
        losses.append(loss.item())
        rate = x.numel() / seconds
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:.0f}")
        tqdm.write(f"step {step + 1} loss {losses[-1]:.4f} tokens/s "
                   f"{rate:.0f} hidden {report.hidden_seconds:.3f}s "
                   f"lr {engine.get_lr()[0]:.2e}")
    return losses


def plot(losses: list[float], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title("GPT through strata.torch")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
