#!/usr/bin/env python3
"""strata's CPU AdamW vs DeepSpeed's DeepSpeedCPUAdam (0.19.8), same threads.

Run (any python3: this script needs only the standard library):
    python3 bench/cpu_adam_vs_deepspeed.py [--repeat 3] [--threads N] [--large]
        [--bench build/bin/cpu_adam_bench] [--venv build/ds-venv] [--json FILE]

Rows (params/s, medians of --repeat runs, peer and ours interleaved; column
roof/DS is the roofline cpu_adam_bench times beside ours, over DeepSpeed: the
highest ours/DS a kernel moving our bytes could reach on this machine):
  * fp32 AdamW at 1M, 16M, 64M, 256M params (512M with --large):
    DeepSpeedCPUAdam(adamw_mode=True).step() on one fp32 tensor vs our
    AdamW/fp32/<n>. weight_decay 0.01, lr 1e-3, grads set once.
  * the CPU side of a ZeRO-1/2 step with bf16 and offload_optimizer=cpu at
    --zero-n params (256M) vs our ZeroStep/bf16grad_bf16out/<n> (SumSquares
    over bf16 grads, then one fused AdamW pass with grad_scale and clip
    coefficient, fp32 master/m/v, bf16 params out). DeepSpeed's sequence,
    read from deepspeed/runtime/zero/stage_1_and_2.py of 0.19.8, per model
    parameter tensor (--tensor-numel elements each) and then per step:
      1. copy_grads_in_partition -> set_norm_for_param_grad_in_gpu: the
         tensor's bf16 grad converted to fp64 and its 2-norm taken
         (.to(double).norm(2); fp64 from get_norm_dtype);
      2. update_offload_overflow_tracker: has_inf_or_nan, an amax and an amin;
      3. async_inplace_copy_grad_to_fp32_buffer_from_gpu: the grad converted
         to fp32 into its slice of the fp32 gradient partition (copy_);
      4. step -> scaled_global_norm -> complete_grad_norm_calculation_for_
         cpu_offload: the per-tensor norms .item()'d, squared, summed, rooted
         (then combine_grad_norm_groups);
      5. unscale_and_clip_grads: with bf16 the loss scale is 1
         (CreateLossScaler), so with gradient_clipping > 0 (--clip-grad,
         default 1.0) one mul_(1/combined_scale) over the fp32 partition,
         clip coefficient clamp(((norm/scale)+1e-6)/clip, min=1) included;
      6. _optimizer_step -> DeepSpeedCPUAdam.step() on the fp32 partition;
      7. bit16_partition_buffer.copy_(fp32 partition): the bf16 copy of the
         params (its host-to-device copy is not CPU work and is not timed).
    In DeepSpeed 0.19.8 steps 1-3 run on the GPU (the bf16 grad is turned
    into fp32 there and crosses PCIe as fp32, 4 B/param); ours receives bf16
    grads (2 B/param) in host memory. Two DeepSpeed rows therefore:
      "bf16grad_cpu": steps 1-7, all on the CPU from bf16 grads in host
                      memory: the same input as ours;
      "cpu_only":     steps 4-7 only, from fp32 grads already in host memory:
                      what 0.19.8 really leaves to the CPU (a lower bound on
                      its CPU time, which ignores its doubled PCIe bytes).
    The grads' global norm is about 0.5, so the clip coefficient is 1 and
    values stay put from step to step, but every pass still runs.

DeepSpeed comes from the virtualenv --venv (PyPI torch, CPU use). Its
cpu_adam op is compiled by torch's JIT extension loader on first use (about
a minute, cached in VENV/torch_extensions): it needs ninja, g++ and the
Python headers; DS_ACCELERATOR=cpu keeps DeepSpeed on its CPU op builder
(-O3 -march=native -fopenmp -D__AVX512__ here). If that fails the script
says why and exits 1. Threads: --threads (default all cores) goes to
torch.set_num_threads and OMP_NUM_THREADS for DeepSpeed, STRATA_CPU_THREADS
for ours.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_adam_common import (MIB, REPO, Peer, compare, fail, json_row,  # noqa: E402
                             machine, parse_size, peer_env, resolve_ours,
                             row_head, row_text, run_ours, warn_if_busy)

PROG = "cpu_adam_vs_deepspeed"
DS_VERSION = "0.19.8"
SIZES = [1 << 20, 16 << 20, 64 << 20, 256 << 20]
CHECK = """
import deepspeed, torch
from torch.utils.cpp_extension import verify_ninja_availability
verify_ninja_availability()
from deepspeed.ops.op_builder import CPUAdamBuilder
b = CPUAdamBuilder()
print("deepspeed", deepspeed.__version__, "torch", torch.__version__, type(b).__module__)
print("cxx flags", " ".join(b.cxx_args()))
b.load(verbose=False)
print("cpu_adam op loaded")
"""


def check_deepspeed(venv, env):
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        fail(PROG, f"no virtualenv at {venv}: create it (/usr/bin/python3 -m venv {venv}; "
             f"{py} -m pip install torch; DS_BUILD_OPS=0 {py} -m pip install "
             f"--no-build-isolation deepspeed=={DS_VERSION}) or pass --venv")
    print(f"{PROG}: loading DeepSpeed's cpu_adam op (compiled on first use, about a minute)",
          file=sys.stderr)
    proc = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, env=env)
    out = [line for line in proc.stdout.splitlines() if not line.startswith("[")] or ["?"]
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-20:]
        fail(PROG, "DeepSpeed's cpu_adam op cannot be imported or built in "
             f"{venv} (needs deepspeed, ninja, g++, python3-dev headers):\n  " + "\n  ".join(tail))
    if f"deepspeed {DS_VERSION} " not in out[0]:
        print(f"{PROG}: warning: expected DeepSpeed {DS_VERSION}, found: {out[0]}", file=sys.stderr)
    return py, " / ".join(out[:2])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs per row (default 3)")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help=f"threads for every side (default: all cores, {os.cpu_count()})")
    p.add_argument("--large", action="store_true", help="also 512M params fp32 (8 GiB a side, one side at a time)")
    p.add_argument("--sizes", help="fp32 sizes, comma-separated, in elements with an optional "
                   "K/M/G suffix (powers of 1024; default 1M,16M,64M,256M)")
    p.add_argument("--zero-n", type=int, default=256 << 20, help="ZeRO-step size (default 256M)")
    p.add_argument("--no-zero", action="store_true", help="skip the ZeRO-step rows")
    p.add_argument("--tensor-numel", type=int, default=16 << 20,
                   help="elements per model tensor in the ZeRO step (default 16M = 4096x4096)")
    p.add_argument("--clip-grad", type=float, default=1.0,
                   help="DeepSpeed's gradient_clipping (default 1.0; 0 skips its mul_)")
    p.add_argument("--warmup", type=int, default=2, help="untimed peer steps first (default 2)")
    p.add_argument("--min-time", type=float, default=1.0,
                   help="seconds of peer steps per run (default 1.0)")
    p.add_argument("--mem-gib", type=float, default=14.0,
                   help="keep a peer's tensors between runs only if peer + ours fit (default 14)")
    p.add_argument("--bench", default=os.path.join(REPO, "build/bin/cpu_adam_bench"),
                   help="our Google Benchmark binary")
    p.add_argument("--venv", default=os.path.join(REPO, "build/ds-venv"),
                   help="virtualenv with torch and deepspeed")
    p.add_argument("--peers-only", action="store_true",
                   help="measure the peers alone (no cpu_adam_bench needed)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()

    sizes = [parse_size(PROG, s) for s in args.sizes.split(",")] if args.sizes else list(SIZES)
    if args.large and not args.sizes:
        sizes.append(512 << 20)
    # (label, peer spec, bytes/param of the peer, our benchmark, bytes/param of ours)
    jobs = [(f"fp32 AdamW {n // MIB}M", {"kind": "ds_adam", "n": n}, 16,
             f"AdamW/fp32/{n}", 16) for n in sizes]
    if not args.no_zero:
        for mode in ("bf16grad_cpu", "cpu_only"):
            jobs.append((f"ZeRO step {args.zero_n // MIB}M {mode}",
                         {"kind": "ds_zero", "n": args.zero_n, "mode": mode,
                          "tensor_numel": args.tensor_numel, "clip_grad": args.clip_grad},
                         20, f"ZeroStep/bf16grad_bf16out/{args.zero_n}", 16))
    names = {} if args.peers_only else resolve_ours(PROG, args.bench, [j[3] for j in jobs])

    env = peer_env(args.threads, args.venv)
    py, ds_info = check_deepspeed(args.venv, env)
    warn_if_busy(PROG)
    print(f"{machine()}; {args.threads} threads; {ds_info}; medians of {args.repeat}, params/s")
    print(row_head("row", 30, "DS"))
    rows = []
    for label, spec, peer_b, ours_name, ours_b in jobs:
        spec = dict(spec, threads=args.threads, lr=1e-3, wd=0.01, warmup=args.warmup,
                    min_time=args.min_time)
        fits = spec["n"] * (peer_b + ours_b) <= args.mem_gib * (1 << 30)
        peer = Peer(PROG, py, spec, env, keep_alive=fits)
        ours = None if args.peers_only else (
            lambda name=names[ours_name]: run_ours(PROG, args.bench, name, args.threads))
        got = compare(args.repeat, peer, ours)
        rows.append(dict(json_row(got, "ds"), row=label, n=spec["n"], threads=args.threads,
                         ours=ours_name))
        print(row_text(label, 30, got), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "deepspeed": ds_info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
