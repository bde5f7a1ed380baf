"""strata's optimizer state in fp32, bf16 and int8 against torch.optim.AdamW
and torchao's AdamW8bit, trained side by side on one GPT (issue #34 §4):
the loss curves in one plot, and each final loss against fp32's.

    python3 bench/state_dtype_convergence.py [--steps 300] [--width 768]
        [--layers 15] [--batch 4] [--seq 256] [--json out.json]
        [--plot out.png]

Variants, each a process of its own, from the same initial weights (seed
0) on the same byte-level batches (examples/gpt.py), AdamW with the
hyperparameters of bench/torch_offload_bench.py:
  torch    torch.optim.AdamW(foreach=True), fp32 state in memory: the
           reference;
  fp32, bf16, int8
           strata.torch with strata.state_dtype so, the state on the host
           (the format, not the tier, is what this compares);
  torchao  torchao.optim.AdamW8bit (block 256, the dynamic tree map: the
           method int8 follows), in memory, under the DeepSpeed venv of
           bench/ds_venv.py, which has torchao and the same torch (made
           on first use: a large download); left out, saying why, when
           it fails, and with --no-torchao.
Prints each variant's final loss (the mean of the last tenth of the
steps) and its difference to torch's, absolute and relative; --json
writes every loss, --plot the curves (matplotlib). Timings are not its
business: run it beside anything."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STRATA = ("fp32", "bf16", "int8")
VARIANTS = ("torch", *STRATA, "torchao")
HYPER = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--json", help="every variant's losses, to this file")
    ap.add_argument("--plot", help="the loss curves, to this PNG")
    ap.add_argument("--no-torchao", action="store_true",
                    help="leave torchao's variant out")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 10:
        ap.error("--steps must be >= 10")
    return args


def train(args: argparse.Namespace) -> list[float]:
    """The worker: the variant's losses, one a step."""
    for sub in ("python", "examples"):
        sys.path.insert(0, str(ROOT / sub))
    import torch

    from gpt import GPT, GPTConfig, batches, text_bytes
    torch.manual_seed(0)
    model = GPT(GPTConfig(width=args.width, layers=args.layers, seq=args.seq,
                          heads=max(1, args.width // 64)))
    data = batches(text_bytes(), args.batch, args.seq, args.steps)
    if args.variant in STRATA:
        import strata.torch as st
        engine = st.initialize(model, {
            "train_micro_batch_size_per_gpu": args.batch,
            "optimizer": {"type": "AdamW", "params": dict(
                HYPER, betas=list(HYPER["betas"]))},
            "strata": {"device": "host", "state_dtype": args.variant}})
        losses = []
        for x, y in data:
            loss = engine(x, y).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        engine.close()
        return losses
    if args.variant == "torch":
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **HYPER)
    else:
        from torchao.optim import AdamW8bit
        opt = AdamW8bit(model.parameters(), block_size=256, **HYPER)
    losses = []
    for x, y in data:
        loss = model(x, y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def python_for(variant: str) -> str:
    """torchao's variant runs under the DeepSpeed venv (it has torchao),
    the rest under strata's torch venv."""
    if variant == "torchao":
        sys.path.insert(0, str(ROOT / "bench"))
        from ds_venv import ensure_venv
        return ensure_venv("state_dtype_convergence")
    return os.path.join(os.environ.get("STRATA_TORCH_VENV",
                                       "/var/cache/strata/torch-venv"),
                        "bin", "python")


def run_all(args: argparse.Namespace) -> dict[str, list[float]]:
    """Every variant, one after another; a torchao failure is reported and
    left out, any other fails the run."""
    out: dict[str, list[float]] = {}
    for v in VARIANTS[:-1] if args.no_torchao else VARIANTS:
        argv = [python_for(v), __file__, "--variant", v, *sys.argv[1:]]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["?"])[-1]
            if v != "torchao":
                raise SystemExit(f"state_dtype_convergence: {v} failed: "
                                 f"{done.stderr[-2000:]}")
            print(f"torchao: left out, it failed: {why}")
            continue
        out[v] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{v}: {len(out[v])} steps, loss {out[v][0]:.4f} -> "
              f"{out[v][-1]:.4f}", flush=True)
    return out


def report(args: argparse.Namespace, losses: dict[str, list[float]]
           ) -> dict[str, Any]:
    tail = max(1, args.steps // 10)
    final = {v: sum(l[-tail:]) / tail for v, l in losses.items()}
    ref = final["torch"]
    print(f"final loss (mean of the last {tail} steps) against torch's "
          f"{ref:.4f}:")
    print("| variant | final loss | difference | relative |")
    print("|---|---|---|---|")
    for v, f in final.items():
        print(f"| {v} | {f:.4f} | {f - ref:+.4f} | {(f - ref) / ref:+.2e} |")
    return final


def plot(path: str, losses: dict[str, list[float]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for v, l in losses.items():
        ax.plot(range(1, len(l) + 1), l, label=v, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    title = "AdamW's state: fp32, bf16, int8 (strata)"
    if "torchao" in losses:
        title += ", torchao 8-bit"
    ax.set_title(title)
    ax.legend()
    fig.savefig(path, dpi=120)


def main() -> None:
    args = parse_args()
    if args.variant:
        print(json.dumps(train(args)))
        return
    losses = run_all(args)
    final = report(args, losses)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "losses": losses, "final": final}))
    if args.plot:
        plot(args.plot, losses)


if __name__ == "__main__":
    main()
