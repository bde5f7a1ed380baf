"""strata-train's command line: the flags, the run's setup (model, data,
engine, plan), and the exit statuses: 0 done, 1 a failure while running
(strata's message), 2 bad input (a preset, a file, a flag, the config),
130 stopped by Ctrl-C after saving a checkpoint."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import torch

import strata
import strata.torch as st
from strata.torch import ConfigError, StrataEngine
from strata.train import dsconfig, loop, models, report
from strata.train.data import TOKEN_DTYPES, Batches, Tokens
from strata.train.models import TrainError

USAGE_ERROR = 2
_EXAMPLE = """examples:
  strata-train --preset gpt2-124m --data input.txt --steps 200
  strata-train --preset llama-3b --data corpus.txt --nvme /mnt/nvme/swap \\
      --steps 1000 --save-every 100 --export out/
  strata-train --model-config config.json --data train.bin \\
      --config ds_config.json --resume

docs/train.md describes every flag and output."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="strata-train", epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a causal language model (a preset or a "
                    "transformers config) on a text or token file through "
                    "strata's tiers (device, host memory, NVMe).")
    model = ap.add_argument_group("model")
    model.add_argument("--preset", help="one of: " + ", ".join(
        models.PRESETS))
    model.add_argument("--model-config", metavar="JSON|DIR",
                       help="a transformers config.json (or its directory)")
    model.add_argument("--init-from", metavar="SAFETENSORS|DIR",
                       help="start from these weights (model.safetensors, "
                            "or a directory with an index); a directory's "
                            "config.json gives the model if no other does")
    data = ap.add_argument_group("data")
    data.add_argument("--data", required=True, metavar="FILE",
                      help="a text file (its bytes are the tokens) or "
                           "token ids (.bin, .npy)")
    data.add_argument("--token-dtype", choices=list(TOKEN_DTYPES),
                      help="of a .bin file (default uint16, as nanoGPT)")
    data.add_argument("--seq-len", type=int,
                      help="tokens per sequence (default: 1024, or the "
                           "model's positions if fewer)")
    data.add_argument("--seed", type=int, default=0,
                      help="of the initial weights and the data order")
    _training_flags(ap)
    return ap


def _training_flags(ap: argparse.ArgumentParser) -> None:
    run = ap.add_argument_group("training (given flags win over --config)")
    run.add_argument("--config", metavar="ds_config.json",
                     help="a DeepSpeed-style config (README: strata.torch)")
    run.add_argument("--steps", type=int, default=100,
                     help="train until this many optimizer steps in all")
    run.add_argument("--micro-batch", type=int,
                     help="sequences per micro-batch")
    run.add_argument("--grad-accum", type=int,
                     help="micro-batches per optimizer step")
    run.add_argument("--lr", type=float, help="learning rate")
    run.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"],
                     help="compute dtype (default without --config: auto, "
                          "bf16 on a GPU that has it, else fp32)")
    run.add_argument("--device", choices=["auto", "cuda", "host"],
                     help="strata's device (host: emulated in host memory)")
    run.add_argument("--nvme", metavar="DIR",
                     help="home parameters and optimizer state on the NVMe "
                          "drive, DIR their swap directory")
    out = ap.add_argument_group("output")
    out.add_argument("--out", default="strata-train-out", metavar="DIR",
                     help="log.jsonl, train.png and ckpt/ (default "
                          "./strata-train-out)")
    out.add_argument("--save-every", type=int, default=0, metavar="N",
                     help="a checkpoint every N steps (and always at the "
                          "end)")
    out.add_argument("--no-save", action="store_true",
                     help="no checkpoint at all, not even at the end or on "
                          "Ctrl-C (a benchmark of a model whose checkpoint "
                          "the disk cannot hold)")
    out.add_argument("--keep", type=int, default=2, metavar="N",
                     help="checkpoints kept, newest first (0: all)")
    out.add_argument("--resume", action="store_true",
                     help="go on from the latest checkpoint in --out")
    out.add_argument("--export", metavar="DIR",
                     help="at the end, the weights as Hugging Face "
                          "safetensors and config.json")
    out.add_argument("--export-dtype", choices=["fp32", "compute"],
                     default="fp32", help="of --export (default fp32)")
    out.add_argument("--peak-tflops", type=float,
                     help="the device's peak for MFU (default: known GPUs)")


def main(argv: Optional[list[str]] = None) -> int:
    """strata-train's entry point; returns the exit status."""
    ap = parser()
    args = ap.parse_args(argv)
    for flag in ("steps", "seq_len", "save_every", "keep"):
        value = getattr(args, flag)
        if value is not None and \
                value < (1 if flag in ("steps", "seq_len") else 0):
            ap.error(f"--{flag.replace('_', '-')} {value} is too small")
    try:
        return _run(args)
    except (TrainError, ConfigError) as e:
        print(f"strata-train: {e}", file=sys.stderr)
        return USAGE_ERROR
    except strata.StrataError as e:
        print(f"strata-train: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("strata-train: interrupted", file=sys.stderr)
        return loop.INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    out = _check_out(args)
    ds = dsconfig.ds_config(args)
    config, name = models.model_config(args.preset, args.model_config,
                                       args.init_from)
    limit = models.max_positions(config)
    if args.seq_len is None:
        args.seq_len = min(1024, limit or 1024)
    if limit is not None and args.seq_len > limit:
        raise TrainError(f"--seq-len {args.seq_len} is longer than the "
                         f"model's {limit} positions")
    batches = Batches(Tokens(args.data, args.token_dtype),
                      st.load(ds).micro_batch, args.seq_len,
                      config.vocab_size, args.seed)
    torch.manual_seed(args.seed)
    model = models.build_model(config, ds)
    params = models.parameter_count(model)
    engine = st.initialize(model, ds, init_from=args.init_from)
    try:
        run = loop.Run(
            out=out, steps=args.steps,
            save_every=0 if args.no_save else args.save_every,
            save=not args.no_save,
            keep=args.keep, seq_len=args.seq_len,
            flops_per_token=models.flops_per_token(config, params,
                                                   args.seq_len),
            peak_tflops=report.peak_tflops(engine, args.peak_tflops),
            title=f"{name}: {params / 1e6:.4g}M parameters")
        return _train(engine, args, run, name, batches, params)
    finally:
        engine.free()


def _check_out(args: argparse.Namespace) -> Path:
    """The output directory: a fresh run refuses one that holds a run
    already, so that --resume is never forgotten silently."""
    out = Path(args.out)
    fresh = not (out / "log.jsonl").exists() and \
        not (out / "ckpt" / "latest").exists()
    if not args.resume and not fresh:
        raise TrainError(f"--out {out} holds a run already; --resume goes "
                         f"on with it, or choose another --out")
    if args.resume and not (out / "ckpt" / "latest").exists():
        raise TrainError(f"--resume: no checkpoint in {out / 'ckpt'}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _train(engine: StrataEngine, args: argparse.Namespace, run: loop.Run,
           name: str, batches: Batches, params: int) -> int:
    print(f"strata-train: {name} ({engine.module.config.model_type}), "
          f"{params:,} parameters; data {batches.tokens.describe()}; "
          f"{engine.train_batch_size()} x {args.seq_len} tokens a step")
    print(f"throughput: TFLOPS = (6 N + 12 L d T) x tokens/s (N "
          f"parameters, L layers, d width, T = --seq-len); MFU against "
          + (f"{run.peak_tflops} TFLOPS" if run.peak_tflops else
             "no known peak (shown as -; --peak-tflops sets one)"))
    print("\n".join(report.plan_lines(engine, params)))
    if args.resume:
        try:
            step = loop.resume(engine, batches, run)
        except (LookupError, ValueError) as e:
            raise TrainError(str(e)) from e
        print(f"strata-train: resumed at step {step} from {run.ckpt}")
    status = loop.train(engine, batches, run)
    if status == 0 and args.export:
        engine.export(args.export, dtype=args.export_dtype)  # +config.json
        print(f"strata-train: exported the weights to {args.export}")
    if status == 0:
        print(f"strata-train: done at step {engine.global_steps}; log "
              f"{run.log}, plot {run.out / 'train.png'}")
    return status
