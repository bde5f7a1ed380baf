"""strata.torch across ranks at 1, 2 and 4 ranks, beside strata-plan
--gpus N, and against DeepSpeed ZeRO-3 at 2 ranks on the same model and
config (issue #33, section 4).

    python3 bench/ranks_bench.py [--worlds 1,2,4] [--setting nvme|host]
        [--ds-world 2] [--no-deepspeed] [--rounds 3] [--block 3]
        [--warmup 2] [--threads N] [--batch 2] [--seq 256] [--width 768]
        [--layers 15] [--model gpt|llama] [--nvme build/ranks-bench-swap]
        [--json FILE] [--schedule alone|together]

A variant is `world` rank processes, started as torchrun starts them
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT on loopback;
gloo; the host-emulated device), each with --threads / world torch
threads (at least one) and strata.threads alike: the ranks share this
machine's cores as the ranks of one GPU machine share its CPUs. Weak
scaling: each global batch is world x --batch rows, every rank trains
its --batch of them, and tokens/s counts world x batch x seq a step.

Phase 1 runs strata at every --worlds size; phase 2 runs torch's
DistributedDataParallel (AdamW in memory: data parallelism that
offloads and partitions nothing, the ceiling), DeepSpeed and strata at
--ds-world ranks (DeepSpeed from bench/ds_venv.py's venv, on its CPU
accelerator). Both frameworks get the same DeepSpeed config dict
(deepspeed_offload_bench.ds_config: stage 3, AdamW, fp32, the optimizer
state on --setting, each variant its own swap directory under --nvme).
Within a phase, --schedule as in torch_offload_bench.py: alone (the
default), one variant's ranks at a time, each exiting before the next
variant starts; together, every variant's processes started at once,
taking turns in rounds whose order rotates (torch_offload_bench.
run_rounds), which slows a variant that allocates every step.

Per variant, from rank 0 (the ranks are alike): median step, tokens/s,
median forward, backward and update; strata's collectives per step
(engine.collective_stats(): bytes across the rank's link under ring
algorithms, the seconds the rank waited in them, and the seconds from
each one's issue to the end of its wait: what that exceeds the wait by
ran under compute, Note [Gathering ahead]);
strata's bytes between tiers per step (engine.store.stats()); block-
device bytes read and written per step (/proc/self/io); peak RSS per
rank and over the ranks. Beside each strata world, strata-plan --gpus
N's prediction for the same model and placement (its --measure rates):
per-rank NVMe and network bytes and the floor. Then rank 0's losses of
DeepSpeed and strata at --ds-world side by side, and the target: strata
>= 1.5x DeepSpeed's tokens/s with the state on NVMe."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deepspeed_offload_bench as dob  # noqa: E402
import ds_venv  # noqa: E402
import torch_offload_bench as tob  # noqa: E402

ROOT = tob.ROOT
TARGET = 1.5  # strata/DeepSpeed tokens/s, state on NVMe
# strata-plan beside the libstrata in use ($STRATA_LIBRARY), else build/'s.
PLAN = (Path(os.environ["STRATA_LIBRARY"]).resolve().parents[1]
        if "STRATA_LIBRARY" in os.environ else ROOT / "build") / "bin" / \
    "strata-plan"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line; --worker makes this process one rank."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--setting", choices=("host", "nvme"), default="nvme")
    ap.add_argument("--ds-world", type=int, default=2)
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--model", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--nvme", default=str(ROOT / "build" / "ranks-bench-swap"))
    ap.add_argument("--json", help="also write the summary to this file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch threads over all the ranks of a variant")
    ap.add_argument("--batch", type=int, default=2, help="rows per rank")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--venv", default=ds_venv.DS_VENV)
    tob.add_schedule(ap)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.worlds = [int(w) for w in args.worlds.split(",")]
    if min(args.worlds + [args.ds_world]) < 1:
        ap.error("--worlds and --ds-world: ranks are >= 1")
    if min(args.block, args.rounds, args.warmup, args.threads) < 1:
        ap.error("--block, --rounds, --warmup and --threads must be >= 1")
    args.device = "cpu"  # gloo and the host-emulated device
    args.loss_rtol = 0.0
    return args


def world_of(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def per_rank_threads(args: argparse.Namespace, world: int) -> int:
    return max(1, args.threads // world)


# ---- a rank ----------------------------------------------------------------


def build(args: argparse.Namespace, name: str) -> Any:
    """tob.worker's `build`: this rank's step and close functions."""
    import torch
    torch.set_num_threads(args.threads)
    model = dob.make_model(args)
    cfg = dob.ds_config(args, args.setting, name)
    versions = {"torch": torch.__version__}
    if name.startswith("ds-"):
        return dob.ds_step(args, model, cfg, versions)
    if name.startswith("ddp-"):
        import torch.distributed as dist
        dist.init_process_group("gloo")
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        step = dob.torch_step(args, "torch", ddp, versions)
        return step, lambda: {"versions": versions}
    return dob.strata_step(args, model, cfg, versions)


# ---- the coordinator -------------------------------------------------------


def commands(args: argparse.Namespace, name: str, ds_python: str
             ) -> list[tob.Command]:
    """The command lines and environments of variant `name`'s ranks."""
    world = world_of(name)
    threads = per_rank_threads(args, world)
    forward = ["--model", args.model, "--setting", args.setting,
               "--nvme", args.nvme, "--rounds", str(args.rounds),
               "--block", str(args.block), "--warmup", str(args.warmup),
               "--threads", str(threads), "--batch", str(args.batch),
               "--seq", str(args.seq), "--width", str(args.width),
               "--layers", str(args.layers), "--worker", name]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(dob.free_port()),
               WORLD_SIZE=str(world))
    python = sys.executable
    if name.startswith("ds-"):
        python = ds_python
        env.update(ds_venv.ds_env(args.venv), DS_ACCELERATOR="cpu")
    return [([python, os.path.abspath(__file__), *forward, "--rank",
              str(r)], dict(env, RANK=str(r), LOCAL_RANK=str(r)))
            for r in range(world)]


def phases(args: argparse.Namespace) -> list[list[str]]:
    """The variants of each phase's rounds."""
    out = [[f"strata-{w}" for w in args.worlds]]
    if not args.no_deepspeed:
        out.append([f"ddp-{args.ds_world}", f"ds-{args.ds_world}",
                    f"strata-{args.ds_world}"])
    return out


def summarize(args: argparse.Namespace, name: str, run: dict[str, Any]
              ) -> dict[str, Any]:
    """One variant's medians and totals (rank 0's steps)."""
    measured = [s for s in run["steps"] if s["measured"]]
    world = world_of(name)

    def median(key: str) -> float:
        return statistics.median(s[key] for s in measured)
    step = median("seconds")
    row = {"world": world, "median_step_s": step,
           "tokens_per_s": world * args.batch * args.seq / step,
           "phases_s": {p: median(p)
                        for p in ("forward", "backward", "update")},
           "read_bytes_per_step": median("read_bytes"),
           "write_bytes_per_step": median("write_bytes"),
           "peak_rss_bytes": [p["peak_rss_bytes"] for p in run["processes"]],
           "threads_per_rank": run["threads"], "versions": run["versions"],
           "alive": run["alive"],
           "losses": [s["loss"] for s in run["steps"]]}
    if name.startswith("strata-"):
        pairs = {k for s in measured for k in s["tier_bytes"]}
        row.update(collective_s=median("collective_s"),
                   collective_in_flight_s=median("collective_in_flight_s"),
                   collective_bytes=median("collective_bytes"),
                   hidden_s=median("hidden"), optimizer_s=median("optimizer"),
                   tier_bytes={k: statistics.median(
                       s["tier_bytes"].get(k, 0) for s in measured)
                       for k in sorted(pairs)})
    return row


def predicted(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """strata-plan --gpus `world` for this model and placement (fp32;
    with --setting nvme no host budget, so that the master and m and v
    live on NVMe, where offload_optimizer nvme homes them), with its
    measured rates."""
    cmd = [str(PLAN), "--params", str(dob.params_of(args)), "--dtype",
           "fp32", "--gpus", str(world), "--measure", "--swap-dir",
           args.nvme, "--json"]
    if args.setting == "nvme":
        cmd += ["--host-budget", "0", "--nvme-budget", "1TiB"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 2):
        raise SystemExit(f"ranks_bench: {' '.join(cmd)} failed:\n"
                         f"{out.stderr}")
    plan = json.loads(out.stdout)
    links = plan["traffic"]
    return {"params_per_rank": plan["ranks"]["params_per_rank"],
            "nvme_read": links["nvme_read"]["bytes"],
            "nvme_write": links["nvme_write"]["bytes"],
            "network": links["network"]["bytes"],
            "floor_s": plan["floor"]["seconds"],
            "binding": plan["floor"]["binding"]}


def print_table(rows: dict[str, dict[str, Any]],
                plans: dict[int, dict[str, Any]]) -> None:
    """One line per variant (phase 2's strata line is its second run)."""
    print("| variant | ranks | step (s) | tokens/s | forward / backward / "
          "update (s) | collectives per step: MB, s waited, s in flight | "
          "block device per rank per step: read / written MB | peak RSS "
          "per rank, sum (GiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        ph = " / ".join(f"{v:.2f}" for v in r["phases_s"].values())
        net = (f"{r['collective_bytes'] / 1e6:.0f}, "
               f"{r['collective_s']:.2f}, {r['collective_in_flight_s']:.2f}"
               if "collective_s" in r else "-")
        rss = r["peak_rss_bytes"]
        print(f"| {name} | {r['world']} | {r['median_step_s']:.2f} | "
              f"{r['tokens_per_s']:.0f} | {ph} | {net} | "
              f"{r['read_bytes_per_step'] / 1e6:.0f} / "
              f"{r['write_bytes_per_step'] / 1e6:.0f} | "
              f"{max(rss) / 2**30:.2f}, {sum(rss) / 2**30:.2f} |")
    print("strata's bytes between tiers per rank per step (MB), and "
          "strata-plan --gpus N's prediction:")
    for name, r in rows.items():
        if "tier_bytes" not in r:
            continue
        p = plans[r["world"]]
        print(f"  {name}: " + ", ".join(
            f"{k} {v / 1e6:.0f}" for k, v in r["tier_bytes"].items()) +
            f"; plan: NVMe read {p['nvme_read'] / 1e6:.0f}, write "
            f"{p['nvme_write'] / 1e6:.0f}, network {p['network'] / 1e6:.0f}"
            f" (measured {r['collective_bytes'] / 1e6:.0f}), floor "
            f"{p['floor_s']:.2f} s ({p['binding']})")


def print_comparison(args: argparse.Namespace,
                     rows: dict[str, dict[str, Any]]) -> Optional[bool]:
    """Phase 2: losses side by side and the target; None without it."""
    ds, st = rows.get(f"ds-{args.ds_world}"), rows.get(
        f"strata-{args.ds_world} (vs ds)")
    if not ds or not st:
        return None
    drift = max(abs(a - b) / abs(b) for a, b in zip(st["losses"],
                                                     ds["losses"]))
    print("rank 0's losses, DeepSpeed / strata: " + ", ".join(
        f"{a:.4f}/{b:.4f}" for a, b in zip(ds["losses"], st["losses"])) +
        f" (largest relative difference {drift:.1e})")
    ddp = rows.get(f"ddp-{args.ds_world}")
    if ddp:
        base = ddp["median_step_s"]
        print(f"step over torch DDP's (AdamW in memory, nothing offloaded "
              f"or partitioned): strata {st['median_step_s'] / base:.2f}, "
              f"DeepSpeed {ds['median_step_s'] / base:.2f}")
    ratio = ds["median_step_s"] / st["median_step_s"]
    ok = ratio >= TARGET
    print(f"target ({args.setting}, {args.ds_world} ranks): strata/"
          f"DeepSpeed tokens/s {ratio:.2f} >= {TARGET}: "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def main() -> None:
    """Runs each phase's variants in rounds and reports (or is a rank)."""
    tob.bootstrap()
    args = parse_args()
    if args.worker:
        args.variant = args.worker
        tob.worker(args, build, args.rank, world_of(args.worker))
        return
    started = time.perf_counter()
    Path(args.nvme).mkdir(parents=True, exist_ok=True)
    ds_python = "" if args.no_deepspeed else ds_venv.ensure_venv(
        "ranks_bench", args.venv)
    rows: dict[str, dict[str, Any]] = {}
    for i, names in enumerate(phases(args)):
        runs = tob.run_workers(args, {
            n: commands(args, n, ds_python) for n in names})
        for name, run in runs.items():
            key = f"{name} (vs ds)" if i and name.startswith("strata") \
                else name
            rows[key] = summarize(args, name, run)
    plans = {w: predicted(args, w) for w in {r["world"] for r in
                                             rows.values()}}
    host = tob.machine(args.nvme)
    versions = {k: v for r in rows.values() for k, v in r["versions"].items()}
    print(f"ranks_bench: {args.model}, {dob.params_of(args) / 1e6:.1f}M "
          f"parameters, fp32, {args.batch} x {args.seq} tokens per rank, "
          f"state on {args.setting}, {args.threads} threads over each "
          f"variant's ranks; {host['cpu']}; swap on {host['swap_device']}; "
          + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    print(f"medians of {args.rounds} rounds x {args.block} steps after "
          f"{args.warmup} warm-up steps")
    print_table(rows, plans)
    ok = print_comparison(args, rows)
    print(f"wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "machine": host, "versions": versions,
            "variants": rows, "plans": plans, "target_met": ok}, indent=1))


if __name__ == "__main__":
    main()
