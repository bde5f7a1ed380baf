#!/usr/bin/env python3
"""strata's CPU AdamW kernel vs torch.optim.AdamW, same size, same threads.

Run (any python3: this script needs only the standard library):
    python3 bench/cpu_adam_vs_torch.py [--n 67108864] [--repeat 3] [--threads N]
        [--bench build/bin/cpu_adam_bench] [--venv build/ds-venv]
        [--system-python /usr/bin/python3] [--json FILE]

One fp32 tensor of --n parameters (64M by default), fixed random params and
grads set once, weight_decay 0.01, lr 1e-3. Only optimizer.step() is timed,
after --warmup steps (the first one allocates the state): each run takes
steps for --min-time seconds (at least 3) and keeps the median step.

Peers, each in a child process of the Python that has it:
  * torch 1.13 (Debian's python3-torch, in --system-python):
    AdamW(foreach=True); 1.13 has no fused CPU AdamW;
  * the newer torch of the virtualenv --venv (PyPI's CUDA build, used on the
    CPU), if it is there: AdamW(fused=True) and AdamW(foreach=True).
Ours is AdamW/fp32/<n> of cpu_adam_bench (Google Benchmark; its params_per_s
is the median over its iterations). Column roof/peer is the roofline that
cpu_adam_bench times beside ours (a plain stream over the same bytes) over
the peer: the highest ours/peer any fp32 AdamW could reach on this machine. Peers are pinned to --threads with
torch.set_num_threads and OMP_NUM_THREADS, ours with STRATA_CPU_THREADS.
Every row runs --repeat times, peers and ours interleaved (order reversed on
odd repeats); medians are printed with all values. A missing torch 1.13 is
an error (exit 1); a missing --venv only drops the newer-torch rows.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_adam_common import (REPO, Peer, compare, fail, json_row,  # noqa: E402
                             machine, peer_env, resolve_ours, row_head,
                             row_text, run_ours, warn_if_busy)

PROG = "cpu_adam_vs_torch"


def torch_version(python):
    proc = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--n", type=int, default=67108864, help="parameters (default 64M)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs per row (default 3)")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help=f"threads for every side (default: all cores, {os.cpu_count()})")
    p.add_argument("--warmup", type=int, default=2, help="untimed peer steps first (default 2)")
    p.add_argument("--min-time", type=float, default=1.0,
                   help="seconds of peer steps per run (default 1.0)")
    p.add_argument("--bench", default=os.path.join(REPO, "build/bin/cpu_adam_bench"),
                   help="our Google Benchmark binary")
    p.add_argument("--venv", default=os.path.join(REPO, "build/ds-venv"),
                   help="virtualenv with a newer torch (optional)")
    p.add_argument("--system-python", default="/usr/bin/python3",
                   help="the Python with Debian's torch 1.13")
    p.add_argument("--peers-only", action="store_true",
                   help="measure the peers alone (no cpu_adam_bench needed)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()

    ours = None
    if not args.peers_only:
        base = f"AdamW/fp32/{args.n}"
        name = resolve_ours(PROG, args.bench, [base])[base]
        ours = lambda: run_ours(PROG, args.bench, name, args.threads)  # noqa: E731
    old = torch_version(args.system_python)
    if old is None:
        fail(PROG, f"{args.system_python} cannot import torch: apt-get install python3-torch")
    venv_py = os.path.join(args.venv, "bin", "python")
    new = torch_version(venv_py) if os.path.exists(venv_py) else None
    if new is None:
        print(f"{PROG}: no torch in {args.venv}; newer-torch rows skipped", file=sys.stderr)

    base = {"kind": "torch", "n": args.n, "threads": args.threads, "lr": 1e-3, "wd": 0.01,
            "warmup": args.warmup, "min_time": args.min_time}
    peers = [(f"torch {old} AdamW(foreach=True)",
              Peer(PROG, args.system_python, dict(base, impl="foreach"), peer_env(args.threads)))]
    if new is not None:
        for impl in ("fused", "foreach"):
            peers.append((f"torch {new} AdamW({impl}=True)",
                          Peer(PROG, venv_py, dict(base, impl=impl),
                               peer_env(args.threads, args.venv))))

    warn_if_busy(PROG)
    print(f"{machine()}; {args.threads} threads; n = {args.n} fp32 params; "
          f"medians of {args.repeat}, params/s")
    print(row_head("peer", 40, "peer"))
    rows = []
    for label, peer in peers:
        # One peer process at a time: it keeps its tensors between runs, our
        # binary allocates its own (about 2 x 16 B/param in memory at once).
        got = compare(args.repeat, peer, ours)
        rows.append(dict(json_row(got, "peer"), peer=label, n=args.n, threads=args.threads))
        print(row_text(label, 40, got), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
