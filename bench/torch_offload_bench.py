"""Plain PyTorch against strata.torch on one GPT and one data set, in one
invocation (issue #19, section 5).

    python3 bench/torch_offload_bench.py [--swap ./swap] [--json out.json]
        [--rounds 12] [--block 1] [--warmup 2] [--batch 4] [--seq 256]
        [--width 768] [--layers 15] [--schedule alone|together]

It imports strata and the GPT from the tree (python/, examples/), loads
libstrata from build/ (or $STRATA_LIBRARY), and runs under the Python of
the venv scripts/setup.sh makes ($STRATA_TORCH_VENV, by default
/var/cache/strata/torch-venv) when the one it was started with has no
torch >= 2.1.

Variants, each from the same initial weights (the same seed) on the same
byte-level batches (examples/gpt.py):
  torch  torch.optim.AdamW(foreach=True), everything in memory;
  nvme   strata.torch, optimizer state (m, v: in fp32 the compute copy is
         the master) on NVMe in --swap;
  nvme-bf16  the same with strata.state_dtype bf16 (m and v in 2 bytes
         each, rounded stochastically: its losses are held to
         --lossy-rtol);
  nvme-int8  the same with strata.state_dtype int8 (m and v in a byte
         each and a scale per 256: held to --lossy-rtol too);
  host   strata.torch, optimizer state on the host.
strata runs on the host-emulated device (no GPU needed), with the budgets
strata.torch derives from the model.

Each variant is a worker process (this script with --variant), so its peak
RSS is its own. --schedule says when they run:
  alone (the default)  one worker at a time, in the order above: it
         starts, takes --warmup unmeasured steps, then --rounds blocks of
         --block steps, and exits before the next one starts. Each
         variant has the machine, and its memory, to itself, as a user
         training one model has.
  together  the workers start together and take turns: after --warmup
         steps each, every round asks each worker for --block steps, in
         an order that rotates from round to round, so they share the
         load the machine has at the moment. But every worker's memory
         stays allocated while the others step, and torch's step (whose
         optimizer allocates and frees its temporaries each step) is then
         slower than alone: its AdamW update took 0.42-0.60 s a step
         beside the other four workers against 0.18 s alone, which
         flatters strata's ratio by 5-10%. What a worker leaves running
         when its turn ends (the nvme variant's write-behind) also runs
         under the next worker's step.

Before any figure, the per-step losses of the three are compared: the
strata variants must match torch's within --loss-rtol (the optimizers
round differently). Prints per variant the median step, tokens/s, the
ratio to torch's median step, the peak RSS and how much of strata's
optimizer step was hidden under backward (the means per step of
StepReport.hidden_seconds and of step_seconds), the NVMe bytes a step
read and wrote and the dirty bytes it dropped unwritten (EngineStats),
the median forward, backward and update (torch's optimizer step,
strata's step()) of each, then the acceptance of
issue #19: strata/torch <= 1.0 with state on the host and <= 1.1 with it
on NVMe, each PASS or FAIL. Exits 0 with either (timings are the
reader's to judge), non-zero when the losses disagree or a worker
fails."""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("torch", "nvme", "nvme-bf16", "nvme-int8", "host")
LOSSY = {"nvme-bf16": "bf16", "nvme-int8": "int8"}  # their state_dtype
LIMITS = {"host": 1.0, "nvme": 1.1}
HYPER = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line; --variant makes this process one worker."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--swap", default="swap",
                    help="NVMe swap directory: each nvme variant uses a "
                    "subdirectory named after it")
    ap.add_argument("--json", help="also write the summary to this file")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=1,
                    help="steps per worker per round")
    ap.add_argument("--warmup", type=int, default=2,
                    help="unmeasured steps of each worker first")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=15)
    add_schedule(ap)
    ap.add_argument("--loss-rtol", type=float, default=1e-5,
                    help="largest relative loss difference to torch")
    ap.add_argument("--lossy-rtol", type=float, default=1e-2,
                    help="the same for the variants of bf16 and int8 "
                    "state")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.variants = VARIANTS
    if min(args.block, args.rounds, args.warmup) < 1:
        ap.error("--block, --rounds and --warmup must be >= 1")
    return args


def add_schedule(ap: argparse.ArgumentParser) -> None:
    """--schedule, which run_workers reads (this script's and its peers')."""
    ap.add_argument("--schedule", choices=("alone", "together"),
                    default="alone",
                    help="one worker at a time (alone), or all alive and "
                    "taking turns (together)")


def bootstrap() -> None:
    """Puts python/ and examples/ on the path and, when this Python has no
    torch >= 2.1, runs the script again under the venv's."""
    for sub in ("python", "examples"):
        if str(ROOT / sub) not in sys.path:
            sys.path.insert(0, str(ROOT / sub))
    try:
        import torch
        major, minor = torch.__version__.split(".")[:2]
        if (int(major), int(minor)) >= (2, 1):
            return
    except ImportError:
        pass
    venv = Path(os.environ.get("STRATA_TORCH_VENV",
                               "/var/cache/strata/torch-venv"))
    python = venv / "bin" / "python"
    if not python.is_file() or Path(sys.executable) == python:
        raise SystemExit(
            f"torch_offload_bench: needs torch >= 2.1, which {sys.executable}"
            f" lacks and no venv at {venv} has; run `source scripts/"
            f"setup.sh && strata_torch_venv` (scripts/test.sh does) or "
            f"start it with a Python that has torch >= 2.1")
    os.execv(str(python), [str(python), *sys.argv])


# ---- the worker ------------------------------------------------------------


def build_stepper(args: argparse.Namespace, variant: str
                  ) -> tuple[Callable[[Any, Any], dict[str, float]],
                             Callable[[], dict[str, Any]]]:
    """The variant's model, built from seed 0: a function that trains one
    step on (x, y) and reports it, and one that closes the variant and
    returns its extra figures."""
    import torch

    from gpt import GPT, GPTConfig
    cfg = GPTConfig(width=args.width, layers=args.layers, seq=args.seq,
                    heads=max(1, args.width // 64))
    torch.manual_seed(0)
    model = GPT(cfg)
    if variant == "torch":
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **HYPER)

        def torch_step(x: Any, y: Any) -> dict[str, float]:
            t = [time.perf_counter()]
            loss = model(x, y).loss
            t.append(time.perf_counter())
            loss.backward()
            t.append(time.perf_counter())
            opt.step()
            opt.zero_grad(set_to_none=True)
            return {"loss": loss.item(), **phases(t)}
        return torch_step, lambda: {}
    return strata_stepper(args, variant, model)


def phases(t: list[float]) -> dict[str, float]:
    """A step's forward, backward and update seconds, from the times its
    forward and backward started (`t`) and now."""
    t = [*t, time.perf_counter()]
    return {name: t[i + 1] - t[i]
            for i, name in enumerate(("forward", "backward", "update"))}


def strata_stepper(args: argparse.Namespace, variant: str, model: Any
                   ) -> tuple[Callable[[Any, Any], dict[str, float]],
                              Callable[[], dict[str, Any]]]:
    """build_stepper's strata variants: state on the host or on NVMe."""
    import strata.torch as st
    offload: dict[str, Any] = {"device": "cpu"}
    if variant.startswith("nvme"):
        swap = Path(args.swap) / variant  # one engine per swap directory
        swap.mkdir(parents=True, exist_ok=True)
        offload = {"device": "nvme", "nvme_path": str(swap)}
    params = dict(HYPER, betas=list(HYPER["betas"]))
    engine = st.initialize(model, {
        "train_micro_batch_size_per_gpu": args.batch,
        "optimizer": {"type": "AdamW", "params": params},
        "zero_optimization": {"stage": 3, "offload_optimizer": offload},
        "strata": {"device": "host",
                   "state_dtype": LOSSY.get(variant, "fp32")}})

    def step(x: Any, y: Any) -> dict[str, float]:
        before = engine.store.stats()
        t = [time.perf_counter()]
        loss = engine(x, y).loss
        t.append(time.perf_counter())
        engine.backward(loss)
        t.append(time.perf_counter())
        report = engine.step()
        after = engine.store.stats()
        return {"loss": loss.item(), **phases(t),
                "hidden": report.hidden_seconds,
                "optimizer": report.step_seconds,
                "finish_wait": report.finish_wait_seconds,
                "stall": after["stall_seconds"] - before["stall_seconds"],
                **{k: after["bytes"][a][b] - before["bytes"][a][b]
                   for k, a, b in (("nvme_read", "nvme", "host"),
                                   ("nvme_written", "host", "nvme"))},
                **{k: after[s] - before[s]
                   for k, s in (("discarded", "discarded_bytes"),
                                ("nvme_hashed", "nvme_bytes_hashed"))}}

    def close() -> dict[str, Any]:
        tiers = engine.store.stats()["tiers"]
        engine.close()
        return {"strata_peak_bytes": {t: tiers[t]["peak"] for t in tiers}}
    return step, close


def worker(args: argparse.Namespace,
           build: Callable[[argparse.Namespace, str], Any] = build_stepper,
           rank: int = 0, world: int = 1) -> None:
    """Answers "run N" on stdin with N steps (one JSON line on stdout), and
    "end" with the peak RSS; the batches follow one another across runs.
    `build` makes the variant's step and close functions (build_stepper's
    contract; bench/deepspeed_offload_bench.py passes its own). With
    ranks, each batch is `world` times --batch rows and rank `rank`
    trains on its --batch of them."""
    import torch

    from gpt import batches, text_bytes
    total = args.warmup + args.rounds * args.block
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    data = [(x[mine], y[mine]) for x, y in batches(
        text_bytes(), args.batch * world, args.seq, total)]
    started = time.time()
    step, close = build(args, args.variant)
    done = 0
    for line in sys.stdin:
        if line.split()[0] == "end":
            break
        steps = []
        for x, y in data[done:done + int(line.split()[1])]:
            start = time.perf_counter()
            out = step(x, y)
            steps.append({"seconds": time.perf_counter() - start, **out})
        done += len(steps)
        print(json.dumps({"steps": steps}), flush=True)
    extra = close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    print(json.dumps({"peak_rss_bytes": rss,
                      "threads": torch.get_num_threads(),
                      "alive": [started, time.time()], **extra}),
          flush=True)


# ---- the coordinator -------------------------------------------------------


Worker = list[subprocess.Popen]  # a variant's processes: one, or its ranks
Command = tuple[list[str], Optional[dict[str, str]]]  # argv, environment


def commands(args: argparse.Namespace) -> dict[str, list[Command]]:
    """One worker process per variant, with the same model arguments."""
    forward = ["--swap", args.swap, "--rounds", str(args.rounds),
               "--block", str(args.block), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--seq", str(args.seq),
               "--width", str(args.width), "--layers", str(args.layers)]
    return {v: [([sys.executable, os.path.abspath(__file__), *forward,
                  "--variant", v], None)] for v in args.variants}


def run_workers(args: argparse.Namespace,
                variants: dict[str, list[Command]]
                ) -> dict[str, dict[str, Any]]:
    """Runs the rounds (run_rounds over args.warmup, args.rounds,
    args.block and the variants in this order): with args.schedule
    "alone", one variant's processes at a time, each started after the
    last one's exited; otherwise all of them started together."""
    if getattr(args, "schedule", "together") != "alone":
        return run_together(args, variants)
    runs: dict[str, dict[str, Any]] = {}
    for name, cmds in variants.items():
        runs.update(run_together(args, {name: cmds}))
    return runs


def run_together(args: argparse.Namespace,
                 variants: dict[str, list[Command]]
                 ) -> dict[str, dict[str, Any]]:
    """Starts every variant's processes together, runs the rounds, and
    kills whatever is left at the end."""
    procs: dict[str, Worker] = {}
    try:
        for name, cmds in variants.items():
            procs[name] = [subprocess.Popen(
                argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True) for argv, env in cmds]
        group = argparse.Namespace(variants=tuple(variants),
                                   warmup=args.warmup, rounds=args.rounds,
                                   block=args.block)
        return run_rounds(group, procs)
    finally:
        for worker in procs.values():
            for proc in worker:
                if proc.poll() is None:
                    proc.kill()


def ask(worker: Worker, command: str) -> list[dict[str, Any]]:
    """Sends one command to every process of a worker (all before any
    answer: ranks wait for one another), then reads each one's JSON
    answer; lines before it that are not JSON (a library logging to
    stdout, as DeepSpeed does) are passed on to stderr."""
    for proc in worker:
        assert proc.stdin is not None
        try:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # reported below, with its exit status
    answers = []
    for proc in worker:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("{"):
            sys.stderr.write(line)
            line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"torch_offload_bench: a worker died (exit "
                             f"{proc.wait()}); its error is above")
        answers.append(json.loads(line))
    return answers


def cpu_ticks(pids: list[int]) -> dict[str, int]:
    """Clock ticks so far: the machine's busy and stolen time (every CPU,
    /proc/stat) and the time of processes `pids` (every thread)."""
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:9]]
    own = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        own += int(fields[11]) + int(fields[12])
    return {"busy": t[0] + t[1] + t[2] + t[5] + t[6], "steal": t[7],
            "own": own}


def run_block(worker: Worker, steps: int, load: dict[str, float]
              ) -> list[dict[str, Any]]:
    """`steps` steps of one worker (its first process's figures); adds
    the block's wall time and CPU ticks (its own, everything else's,
    stolen) to `load`."""
    pids = [proc.pid for proc in worker]
    before, start = cpu_ticks(pids), time.perf_counter()
    out = ask(worker, f"run {steps}")[0]["steps"]
    after = cpu_ticks(pids)
    load["wall"] += time.perf_counter() - start
    for key in before:
        load[key] += (after[key] - before[key]) / os.sysconf("SC_CLK_TCK")
    return out


def run_rounds(args: argparse.Namespace, procs: dict[str, Worker]
               ) -> dict[str, dict[str, Any]]:
    """Warm-up, then the interleaved rounds; every step of every variant,
    each marked measured or not, and the machine's load in its rounds.
    A worker of several processes reports its first one's steps and end
    figures, and every one's end figures as "processes"."""
    variants = args.variants
    runs: dict[str, dict[str, Any]] = {v: {"steps": []} for v in variants}
    for v in variants:
        for s in ask(procs[v], f"run {args.warmup}")[0]["steps"]:
            runs[v]["steps"].append(dict(s, measured=False, round=-1))
        runs[v]["load"] = dict.fromkeys(("wall", "busy", "steal", "own"),
                                        0.0)
    for r in range(args.rounds):
        turn = r % len(variants)
        order = variants[turn:] + variants[:turn]
        for v in order:
            block = run_block(procs[v], args.block, runs[v]["load"])
            for s in block:
                runs[v]["steps"].append(dict(s, measured=True, round=r))
    for v in variants:
        ends = ask(procs[v], "end")
        runs[v].update(ends[0], processes=ends)
        for proc in procs[v]:
            proc.wait()
    return runs


def summarize(args: argparse.Namespace, runs: dict[str, dict[str, Any]]
              ) -> dict[str, dict[str, Any]]:
    """Per variant: median measured step, tokens/s, ratio to torch, peak
    RSS, the hidden share of the optimizer, per-round medians."""
    def median_of(v: str, r: Optional[int] = None) -> float:
        return statistics.median(
            s["seconds"] for s in runs[v]["steps"]
            if s["measured"] and (r is None or s["round"] == r))
    base = median_of("torch")
    out: dict[str, dict[str, Any]] = {}
    for v in args.variants:
        measured = [s for s in runs[v]["steps"] if s["measured"]]
        load = runs[v]["load"]
        step = median_of(v)
        row = {"median_step_s": step,
               "tokens_per_s": args.batch * args.seq / step,
               "ratio_to_torch": step / base,
               "round_ratios": [median_of(v, r) / median_of("torch", r)
                                for r in range(args.rounds)],
               "peak_rss_bytes": runs[v]["peak_rss_bytes"],
               "others_cpus": (load["busy"] - load["own"]) / load["wall"],
               "steal_cpus": load["steal"] / load["wall"],
               "torch_threads": runs[v]["threads"],
               "alive": runs[v]["alive"],
               "phases_s": {p: statistics.median(s[p] for s in measured)
                            for p in ("forward", "backward", "update")},
               "step_seconds": [s["seconds"] for s in runs[v]["steps"]]}
        if v != "torch":
            hidden = sum(s["hidden"] for s in measured)
            total = sum(s["optimizer"] for s in measured)
            row.update(hidden_s=hidden / len(measured),
                       optimizer_s=total / len(measured),
                       finish_wait_s=statistics.median(
                           s["finish_wait"] for s in measured),
                       fetch_stall_s=statistics.median(
                           s["stall"] for s in measured),
                       **{f"{k}_bytes": statistics.median(
                           s[k] for s in measured)
                          for k in ("nvme_read", "nvme_written",
                                    "discarded", "nvme_hashed")},
                       strata_peak_bytes=runs[v]["strata_peak_bytes"])
        out[v] = row
    return out


def loss_drift(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The largest relative difference of each strata variant's per-step
    loss to torch's (the same batches, in the same order)."""
    ref = [s["loss"] for s in runs["torch"]["steps"]]
    return {v: max(abs(s["loss"] - r) / abs(r)
                   for s, r in zip(runs[v]["steps"], ref))
            for v in runs if v != "torch"}


def machine(swap: str) -> dict[str, Any]:
    """nproc, the CPU (cpu_adam_common.machine), the kernel, torch's
    version and the block device under the swap directory."""
    import torch

    from cpu_adam_common import machine as cpu
    path, device = os.path.realpath(swap), "?"
    with open("/proc/mounts") as f:
        mounts = [line.split()[:3] for line in f]
    best = ""
    for dev, point, fs in mounts:
        if (path + "/").startswith(point.rstrip("/") + "/") and \
                len(point) > len(best):
            best, device = point, f"{dev} ({fs}, mounted on {point})"
    return {"nproc": os.cpu_count(), "cpu": cpu(),
            "kernel": os.uname().release, "torch": torch.__version__,
            "swap_device": device}


def report(args: argparse.Namespace, rows: dict[str, dict[str, Any]],
           drift: dict[str, float], host: dict[str, Any]) -> bool:
    """Prints the table and the acceptance; True when it holds."""
    from gpt import GPTConfig
    params = GPTConfig(width=args.width, layers=args.layers,
                       seq=args.seq).parameters()
    print(f"torch_offload_bench: GPT width {args.width}, {args.layers} "
          f"layers, {params / 1e6:.1f}M parameters, batch {args.batch} x "
          f"seq {args.seq}, workers {args.schedule}; {host['cpu']}, torch "
          f"{host['torch']}, swap on {host['swap_device']}")
    print("losses: largest relative difference to torch "
          + ", ".join(f"{v} {d:.2e}" for v, d in drift.items()))
    print("| variant | median step (s) | tokens/s | strata/torch | "
          "peak RSS (GiB) | optimizer hidden (s per step) | other "
          "processes, stolen (CPUs) |")
    print("|---|---|---|---|---|---|---|")
    strata = [v for v in args.variants if v != "torch"]
    for v in args.variants:
        r = rows[v]
        hidden = (f"{r['hidden_s']:.3f} of {r['optimizer_s']:.3f}"
                  if v != "torch" else "-")
        print(f"| {v} | {r['median_step_s']:.3f} | {r['tokens_per_s']:.0f} "
              f"| {r['ratio_to_torch']:.3f} | "
              f"{r['peak_rss_bytes'] / (1 << 30):.2f} | {hidden} | "
              f"{r['others_cpus']:.2f}, {r['steal_cpus']:.2f} |")
    print("strata's fetches waited (median s per step): " + ", ".join(
        f"{v} {rows[v]['fetch_stall_s']:.3f}" for v in strata) + "; the "
        "optimizer's finish: " + ", ".join(
        f"{v} {rows[v]['finish_wait_s']:.3f}" for v in strata))
    print("NVMe bytes a step (median, GB: read / written / dirty and "
          "dropped unwritten / hashed by the store): " + ", ".join(
              f"{v} " + " / ".join(f"{rows[v][k + '_bytes'] / 1e9:.3f}"
                                   for k in ("nvme_read", "nvme_written",
                                             "discarded", "nvme_hashed"))
              for v in strata))
    print("phases (median s per step: forward, backward, update): " +
          ", ".join(f"{v} " + "/".join(
              f"{x:.3f}" for x in rows[v]["phases_s"].values())
              for v in args.variants))
    ok = True
    for v, limit in LIMITS.items():
        ratio = rows[v]["ratio_to_torch"]
        ok &= ratio <= limit
        rounds = rows[v]["round_ratios"]
        print(f"acceptance: {v} strata/torch {ratio:.3f} <= {limit}: "
              f"{'PASS' if ratio <= limit else 'FAIL'} (round by round: "
              f"median {statistics.median(rounds):.3f}, "
              f"{min(rounds):.3f} to {max(rounds):.3f})")
    return ok


def main() -> None:
    """Runs the workers (--schedule) and reports (or is a worker)."""
    bootstrap()
    args = parse_args()
    if args.variant:
        worker(args)
        return
    started = time.perf_counter()
    runs = run_workers(args, commands(args))
    drift = loss_drift(runs)
    if any(d > (args.lossy_rtol if v in LOSSY else args.loss_rtol)
           for v, d in drift.items()):
        raise SystemExit(f"torch_offload_bench: the losses differ from "
                         f"torch's by more than --loss-rtol "
                         f"{args.loss_rtol} (--lossy-rtol {args.lossy_rtol} "
                         f"with bf16 or int8 state): {drift}")
    rows = summarize(args, runs)
    host = machine(args.swap)
    ok = report(args, rows, drift, host)
    wall = time.perf_counter() - started
    print(f"wall time {wall:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "machine": host, "loss_drift": drift,
            "variants": rows, "acceptance": ok, "wall_s": wall}, indent=1))


if __name__ == "__main__":
    main()
