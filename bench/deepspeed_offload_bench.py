"""DeepSpeed ZeRO-3 against strata.torch on one model, one data set and one
DeepSpeed config dict, in one invocation (issue #32, section 4).

    python3 bench/deepspeed_offload_bench.py [--model gpt|llama]
        [--settings host,nvme,param-nvme] [--nvme build/ds-bench-swap]
        [--rounds 3] [--block 5] [--warmup 2] [--threads N] [--json FILE]
        [--batch 4] [--seq 256] [--width 768] [--layers 15]
        [--device cpu|cuda] [--venv /var/cache/strata/ds-venv]
        [--schedule alone|together]

Settings, each a DeepSpeed config dict that both frameworks get (stage 3,
AdamW, fp32, with `strata.device`/`threads` added for strata, and each
framework's own subdirectory of --nvme as nvme_path):
  host        offload_optimizer cpu;
  nvme        offload_optimizer nvme;
  param-nvme  offload_optimizer nvme and offload_param nvme.
Plus `torch` (torch.optim.AdamW(foreach=True), all in memory: the loss
reference, and the forward and backward strata should hide its optimizer
under) and, with --device cuda, `torchao` (torchao's CPUOffloadOptimizer)
where the model fits the GPU.

The models are torch_offload_bench.py's GPT (--model gpt, 107M parameters
by default) or a transformers Llama of about the same size (--model
llama: hidden --width, --layers layers, vocab 256, no tied head), built
from seed 0, trained on the same byte-level batches (examples/gpt.py).
strata and torch run under strata's torch venv (torch_offload_bench's
bootstrap); DeepSpeed and torchao under bench/ds_venv.py's venv, which
this script creates when missing (torch as strata's, DeepSpeed 0.19.8;
its ops JIT-build into /var/cache/strata/ds-ext once per machine, about
10 minutes). DeepSpeed runs on its CPU accelerator with gloo, one rank.
Every worker gets OMP_NUM_THREADS and torch.set_num_threads --threads,
and strata's `strata.threads` is set to it too.

Each framework and setting is a worker process (peak RSS of its own).
One setting at a time (two DeepSpeed workers at once would not fit
small machines); `torch` joins the first setting. --schedule as in
torch_offload_bench.py: alone (the default), one worker at a time, each
exiting before the next starts; together, the setting's workers alive
at once and taking turns in rounds whose order rotates (a worker's
memory then stays allocated while the others step, which slows a
framework that allocates every step: torch's AdamW 2-3x there).
Per worker: median step, tokens/s, the median forward, backward and
optimizer step (strata's engine.step(), with the part of its optimizer
hidden under backward: StepReport.hidden_seconds), peak RSS
(getrusage), and the bytes the worker read and wrote on block devices
per step (/proc/self/io). Then the loss curves side by side with the
largest relative difference to torch's: strata's must agree within
--loss-rtol (exit 1 otherwise); DeepSpeed's are reported as they are.
Then the targets of issue #32: strata's tokens/s >= 1.35x DeepSpeed's
with the state on the host and >= 1.75x on NVMe, each with a lower
peak RSS, and strata's step against torch's forward+backward.

--device cuda (no run yet): DeepSpeed on its CUDA accelerator with nccl,
strata on the GPU; without --layers the GPT gets --width 4096 and as
many layers as make its fp32 training state (16 B a parameter)
--gpu-factor times the GPU's memory; torch and torchao run only where
the model fits (skipped, saying so, otherwise)."""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds_venv  # noqa: E402
import torch_offload_bench as tob  # noqa: E402

ROOT = tob.ROOT
SETTINGS = ("host", "nvme", "param-nvme")
TARGETS = {"host": 1.35, "nvme": 1.75}  # strata/DeepSpeed tokens/s
HYPER = tob.HYPER
Stepper = Callable[[Any, Any], dict[str, float]]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line; --worker makes this process one worker."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--model", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--nvme", default=str(ROOT / "build" / "ds-bench-swap"),
                    help="swap directory: each NVMe worker uses its own "
                    "subdirectory")
    ap.add_argument("--json", help="also write the summary to this file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=5,
                    help="steps per worker per round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--width", type=int, help="768 (cpu), 4096 (cuda)")
    ap.add_argument("--layers", type=int, help="15 (cpu), from "
                    "--gpu-factor (cuda)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--gpu-factor", type=float, default=2.0)
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--no-deepspeed", action="store_true",
                    help="strata and torch only (DeepSpeed's venv absent)")
    ap.add_argument("--venv", default=ds_venv.DS_VENV)
    tob.add_schedule(ap)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.settings = tuple(args.settings.split(","))
    if set(args.settings) - set(SETTINGS) or not args.settings:
        ap.error(f"--settings: choose from {', '.join(SETTINGS)}")
    if min(args.block, args.rounds, args.warmup, args.threads) < 1:
        ap.error("--block, --rounds, --warmup and --threads must be >= 1")
    args.width = args.width or (4096 if args.device == "cuda" else 768)
    return args


# ---- the worker ------------------------------------------------------------


def make_model(args: argparse.Namespace) -> Any:
    """The model from seed 0: torch_offload_bench's GPT or a Llama."""
    import torch
    torch.manual_seed(0)
    if args.model == "gpt":
        from gpt import GPT, GPTConfig
        return GPT(GPTConfig(width=args.width, layers=args.layers,
                             seq=args.seq, heads=max(1, args.width // 64)))
    import transformers
    heads = max(1, args.width // 64)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=args.width,
        intermediate_size=64 * round(8 * args.width / 3 / 64),
        num_hidden_layers=args.layers, num_attention_heads=heads,
        num_key_value_heads=heads, max_position_embeddings=args.seq))


def loss_of(args: argparse.Namespace, model: Any, x: Any, y: Any) -> Any:
    """The model's next-byte loss: GPT's own; Llama's logits against y
    (the same loss as GPT's; HF's `labels` would shift by one more)."""
    if args.model == "gpt":
        return model(x, y).loss
    import torch.nn.functional as F
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def ds_config(args: argparse.Namespace, setting: str, framework: str
              ) -> dict[str, Any]:
    """The DeepSpeed config dict of a setting, with the framework's own
    swap subdirectory."""
    pin = args.device == "cuda"
    swap = Path(args.nvme) / f"{framework}-{setting}"
    nvme = {"device": "nvme", "nvme_path": str(swap), "pin_memory": pin}
    zero: dict[str, Any] = {"stage": 3, "offload_optimizer":
                            {"device": "cpu", "pin_memory": pin}}
    if setting != "host":
        swap.mkdir(parents=True, exist_ok=True)
        zero["offload_optimizer"] = dict(nvme)
    if setting == "param-nvme":
        zero["offload_param"] = dict(nvme)
    return {"train_micro_batch_size_per_gpu": args.batch,
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": dict(
                HYPER, betas=list(HYPER["betas"]))},
            "zero_optimization": zero, "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False}


def timed(args: argparse.Namespace, forward: Callable[[Any, Any], Any],
          backward: Callable[[Any], None], update: Callable[[], Any],
          extra: Callable[[Any], dict[str, Any]] = lambda r: {}
          ) -> Stepper:
    """One training step split into forward, backward and update, with
    the worker's block-device bytes (/proc/self/io) and `extra(update's
    result)` added."""
    def step(x: Any, y: Any) -> dict[str, float]:
        x, y = x.to(args.device), y.to(args.device)
        io = proc_io()
        t = [time.perf_counter()]
        loss = forward(x, y)
        t.append(time.perf_counter())
        backward(loss)
        t.append(time.perf_counter())
        result = update()
        out = {"loss": loss.item(), **tob.phases(t), **extra(result)}
        after = proc_io()
        return dict(out, read_bytes=after[0] - io[0],
                    write_bytes=after[1] - io[1])
    return step


def proc_io() -> tuple[int, int]:
    """Bytes this process (every thread) read from and wrote to block
    devices so far."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def build(args: argparse.Namespace, name: str
          ) -> tuple[Stepper, Callable[[], dict[str, Any]]]:
    """tob.worker's `build`: the worker's step and close functions."""
    import torch
    torch.set_num_threads(args.threads)
    model = make_model(args)
    versions = {"torch": torch.__version__}
    if name in ("torch", "torchao"):
        step = torch_step(args, name, model.to(args.device), versions)
        return step, lambda: {"versions": versions}
    framework, setting = name.split("-", 1)
    cfg = ds_config(args, setting, framework)
    if framework == "ds":
        return ds_step(args, model, cfg, versions)
    return strata_step(args, model, cfg, versions)


def torch_step(args: argparse.Namespace, name: str, model: Any,
               versions: dict[str, str]) -> Stepper:
    """Plain torch AdamW in memory, or torchao's CPUOffloadOptimizer."""
    import torch
    if name == "torch":
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **HYPER)
    else:
        import torchao
        from torchao.optim import CPUOffloadOptimizer
        versions["torchao"] = torchao.__version__
        opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW,
                                  fused=True, **HYPER)

    def update() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return timed(args, lambda x, y: loss_of(args, model, x, y),
                 lambda loss: loss.backward(), update)


def ds_step(args: argparse.Namespace, model: Any, cfg: dict[str, Any],
            versions: dict[str, str]
            ) -> tuple[Stepper, Callable[[], dict[str, Any]]]:
    """DeepSpeed ZeRO-3, one rank (gloo on the CPU, nccl on a GPU)."""
    import deepspeed
    versions["deepspeed"] = deepspeed.__version__
    deepspeed.init_distributed(
        dist_backend="nccl" if args.device == "cuda" else "gloo")
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg)
    step = timed(args, lambda x, y: loss_of(args, engine, x, y),
                 engine.backward, engine.step)
    return step, lambda: {"versions": versions}


def strata_step(args: argparse.Namespace, model: Any, cfg: dict[str, Any],
                versions: dict[str, str]
                ) -> tuple[Stepper, Callable[[], dict[str, Any]]]:
    """strata.torch from the same dict, plus its own `strata` block."""
    import strata
    import strata.torch as st
    versions["strata"] = getattr(strata, "__version__", "tree")
    device = "cuda" if args.device == "cuda" else "host"
    engine = st.initialize(model, dict(cfg, strata={
        "device": device, "threads": args.threads}))
    before = [(engine.collective_stats(), tier_bytes(engine))]

    def extra(report: Any) -> dict[str, Any]:
        """The report's optimizer figures, the step's collectives and its
        bytes between tiers ("nvme->host": ...)."""
        (net, moved), before[0] = before[0], (engine.collective_stats(),
                                              tier_bytes(engine))
        return {"hidden": report.hidden_seconds,
                "optimizer": report.step_seconds,
                "collective_s": before[0][0].seconds - net.seconds,
                "collective_in_flight_s": before[0][0].in_flight_seconds
                - net.in_flight_seconds,
                "collective_bytes": before[0][0].bytes - net.bytes,
                "tier_bytes": {k: v - moved.get(k, 0)
                               for k, v in before[0][1].items()}}
    step = timed(args, lambda x, y: loss_of(args, engine, x, y),
                 engine.backward, engine.step, extra)

    def close() -> dict[str, Any]:
        engine.close()
        return {"versions": versions}
    return step, close


def tier_bytes(engine: Any) -> dict[str, int]:
    """strata's bytes moved so far between each pair of tiers."""
    moved = engine.store.stats()["bytes"]
    return {f"{a}->{b}": n for a, row in moved.items()
            for b, n in row.items() if n}


# ---- the coordinator -------------------------------------------------------


def free_port() -> int:
    """A TCP port nothing listens on now (for torch.distributed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(args: argparse.Namespace, name: str, ds_python: str
                   ) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of worker `name`."""
    forward = [a for a in sys.argv[1:] if a != "--no-deepspeed"]
    forward += ["--width", str(args.width), "--layers", str(args.layers),
                "--worker", name]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    python = sys.executable
    if name.startswith("ds-") or name == "torchao":
        python = ds_python
        env.update(ds_venv.ds_env(args.venv), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                   LOCAL_RANK="0", DS_ACCELERATOR=args.device)
    return [python, os.path.abspath(__file__), *forward], env


def run_setting(args: argparse.Namespace, names: list[str], ds_python: str
                ) -> dict[str, dict[str, Any]]:
    """The workers `names`, in rounds (tob.run_workers: --schedule)."""
    return tob.run_workers(args, {
        name: [worker_command(args, name, ds_python)] for name in names})


def plan(args: argparse.Namespace) -> tuple[list[list[str]], list[str]]:
    """The workers of each setting's rounds, and why any were left out."""
    skipped = []
    frameworks = ["strata"] if args.no_deepspeed else ["ds", "strata"]
    groups = [[f"{f}-{s}" for f in frameworks] for s in args.settings]
    extra = ["torch"]
    if args.device == "cuda":
        import torch
        memory = torch.cuda.get_device_properties(0).total_memory
        need = params_of(args) * 16  # weights, grads, m, v in fp32
        extra.append("torchao")
        if need > 0.8 * memory:
            skipped.append(f"torch and torchao: {need / 2**30:.0f} GiB of "
                           f"training state, GPU {memory / 2**30:.0f} GiB")
            extra = []
    groups[0] = extra + groups[0]
    return groups, skipped


def params_of(args: argparse.Namespace) -> int:
    """The model's parameter count, from its config."""
    if args.model == "gpt":
        from gpt import GPTConfig
        return GPTConfig(width=args.width, layers=args.layers,
                         seq=args.seq).parameters()
    import torch
    with torch.device("meta"):
        return sum(p.numel() for p in make_model(args).parameters())


def gpu_layers(args: argparse.Namespace) -> int:
    """Layers of width --width whose fp32 training state (16 B a
    parameter) is --gpu-factor times the GPU's memory."""
    import torch
    memory = torch.cuda.get_device_properties(0).total_memory
    block = 12 * args.width * args.width  # attention 4 w^2, MLP 8 w^2
    return max(1, math.ceil(args.gpu_factor * memory / (16 * block)))


def summarize(args: argparse.Namespace, runs: dict[str, dict[str, Any]]
              ) -> dict[str, dict[str, Any]]:
    """Per worker: medians of its measured steps and its totals."""
    out = {}
    for name, run in runs.items():
        measured = [s for s in run["steps"] if s["measured"]]
        step = statistics.median(s["seconds"] for s in measured)
        row = {"median_step_s": step,
               "tokens_per_s": args.batch * args.seq / step,
               "phases_s": {p: statistics.median(s[p] for s in measured)
                            for p in ("forward", "backward", "update")},
               "peak_rss_bytes": run["peak_rss_bytes"],
               "threads": run["threads"], "versions": run["versions"],
               "alive": run["alive"],
               "others_cpus": (run["load"]["busy"] - run["load"]["own"])
               / run["load"]["wall"],
               "read_bytes_per_step": statistics.mean(
                   s["read_bytes"] for s in measured),
               "write_bytes_per_step": statistics.mean(
                   s["write_bytes"] for s in measured),
               "losses": [s["loss"] for s in run["steps"]],
               "step_seconds": [s["seconds"] for s in run["steps"]]}
        if name.startswith("strata-"):
            row["hidden_s"] = statistics.median(s["hidden"] for s in measured)
            row["optimizer_s"] = statistics.median(
                s["optimizer"] for s in measured)
        out[name] = row
    return out


def loss_drift(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each worker's largest relative loss difference to torch's."""
    if "torch" not in rows:
        return {}
    ref = rows["torch"]["losses"]
    return {n: max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref))
            for n, r in rows.items() if n != "torch"}


def print_table(args: argparse.Namespace, rows: dict[str, dict[str, Any]]
                ) -> None:
    """The figures, one line per worker."""
    print("| setting | framework | median step (s) | tokens/s | strata/DS "
          "tokens/s | forward / backward / optimizer (s) | hidden (s) | "
          "peak RSS (GiB) | swap read / written (MiB per step) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        framework, _, setting = name.partition("-")
        ds = rows.get(f"ds-{setting}")
        ratio = (f"{ds['median_step_s'] / r['median_step_s']:.2f}"
                 if framework == "strata" and ds else "-")
        hidden = (f"{r['hidden_s']:.2f} of {r['optimizer_s']:.2f}"
                  if "hidden_s" in r else "-")
        ph = " / ".join(f"{v:.2f}" for v in r["phases_s"].values())
        print(f"| {setting or 'memory'} | {framework} | "
              f"{r['median_step_s']:.2f} | {r['tokens_per_s']:.0f} | "
              f"{ratio} | {ph} | {hidden} | "
              f"{r['peak_rss_bytes'] / 2**30:.2f} | "
              f"{r['read_bytes_per_step'] / 2**20:.0f} / "
              f"{r['write_bytes_per_step'] / 2**20:.0f} |")


def print_losses(rows: dict[str, dict[str, Any]], drift: dict[str, float]
                 ) -> None:
    """The loss curves side by side and their distance to torch's."""
    names = list(rows)
    print("losses per step (warm-up included):")
    print("| step | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    steps = min(len(r["losses"]) for r in rows.values())
    for i in range(steps):
        print(f"| {i} | " + " | ".join(
            f"{rows[n]['losses'][i]:.5f}" for n in names) + " |")
    if drift:
        print("largest relative difference to torch AdamW's loss: " + ", ".join(
            f"{n} {d:.1e}" for n, d in drift.items()))
        for n, d in drift.items():
            if n.startswith("ds-") and d > 1e-3:
                first = next(i for i, (a, b) in enumerate(zip(
                    rows[n]["losses"], rows["torch"]["losses"]))
                    if abs(a - b) > 1e-3 * abs(b))
                print(f"{n}: DeepSpeed's losses leave torch AdamW's at step "
                      f"{first} (relative difference > 1e-3)")


def print_targets(rows: dict[str, dict[str, Any]]) -> bool:
    """Issue #32's targets, each PASS or FAIL; True when all hold."""
    ok = True
    for setting, limit in TARGETS.items():
        st, ds = rows.get(f"strata-{setting}"), rows.get(f"ds-{setting}")
        if not st or not ds:
            continue
        ratio = ds["median_step_s"] / st["median_step_s"]
        lower = st["peak_rss_bytes"] < ds["peak_rss_bytes"]
        ok &= ratio >= limit and lower
        print(f"target {setting}: strata/DeepSpeed tokens/s {ratio:.2f} >= "
              f"{limit} and lower peak RSS ({st['peak_rss_bytes'] / 2**30:.2f}"
              f" < {ds['peak_rss_bytes'] / 2**30:.2f} GiB): "
              f"{'PASS' if ratio >= limit and lower else 'FAIL'}")
    if "torch" in rows:
        fb = sum(list(rows["torch"]["phases_s"].values())[:2])
        steps = {n: r["median_step_s"] for n, r in rows.items()
                 if n.startswith("strata-")}
        print(f"torch's forward+backward: {fb:.2f} s; strata's step: " +
              ", ".join(f"{n} {s:.2f} s ({s / fb:.2f}x)"
                        for n, s in steps.items()))
    return ok


def main() -> None:
    """Runs every setting's workers in turn and reports (or is a worker)."""
    tob.bootstrap()
    args = parse_args()
    if args.device == "cuda" and args.layers is None and not args.worker:
        args.layers = gpu_layers(args)
    args.layers = args.layers or 15
    if args.worker:
        args.variant = args.worker
        tob.worker(args, build)
        return
    ds_python = "" if args.no_deepspeed else ds_venv.ensure_venv(
        "deepspeed_offload_bench", args.venv)
    started = time.perf_counter()
    groups, skipped = plan(args)
    runs: dict[str, dict[str, Any]] = {}
    for names in groups:
        runs.update(run_setting(args, names, ds_python))
    rows = summarize(args, runs)
    drift = loss_drift(rows)
    host = tob.machine(args.nvme)
    versions = {k: v for r in rows.values() for k, v in r["versions"].items()}
    print(f"deepspeed_offload_bench: {args.model}, {params_of(args) / 1e6:.1f}"
          f"M parameters, fp32, batch {args.batch} x seq {args.seq}, "
          f"{args.threads} threads, {args.device}; {host['cpu']}; swap on "
          f"{host['swap_device']}; " + ", ".join(
              f"{k} {v}" for k, v in sorted(versions.items())))
    print(f"medians of {args.rounds} rounds x {args.block} steps after "
          f"{args.warmup} warm-up steps; skipped: {'; '.join(skipped) or '-'}")
    print_table(args, rows)
    print("other processes during each worker's turns (CPUs busy): " +
          ", ".join(f"{n} {r['others_cpus']:.2f}" for n, r in rows.items()))
    print_losses(rows, drift)
    ok = print_targets(rows)
    print(f"wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "machine": host, "versions": versions,
            "loss_drift": drift, "workers": rows, "targets_met": ok,
            "skipped": skipped}, indent=1))
    bad = {n: d for n, d in drift.items()
           if n.startswith("strata-") and d > args.loss_rtol}
    if bad:
        raise SystemExit(f"deepspeed_offload_bench: strata's losses differ "
                         f"from torch's by more than {args.loss_rtol}: {bad}")


if __name__ == "__main__":
    main()
