#!/usr/bin/env python3
"""Shared parts of cpu_adam_vs_torch.py and cpu_adam_vs_deepspeed.py.

The parent scripts need only the standard library. Every peer (torch 1.13,
a newer torch, DeepSpeed) runs in a child process of the Python that has it:

    PYTHON bench/cpu_adam_common.py worker '{"kind": "torch", ...}'

The worker allocates its tensors once (fixed random data, grads set once),
takes --warmup steps, then answers each "run" line on stdin with one timed
run: optimizer steps until min_time has passed (at least 3), the median step
time turned into params/s. Protocol lines start with "@@ "; anything else the
peer prints is forwarded to stderr. Our side is build/bin/cpu_adam_bench
(Google Benchmark), one subprocess per run, read from its JSON.
"""

import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = "@@ "
MIB = 1 << 20


def fail(prog, msg):
    print(f"{prog}: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_size(prog, text):
    """Elements, with an optional K, M or G suffix (powers of 1024)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) == 0:
        fail(prog, f"size '{text}' is not a positive count like 1048576 or 1M")
    return int(digits) * scale


def machine():
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
            if not line.strip():
                break
    isa = "avx512f" if "avx512f" in info.get("flags", "").split() else "no avx512"
    return (f"{os.cpu_count()} CPUs, {info.get('model name', '?')} (family "
            f"{info.get('cpu family', '?')} model {info.get('model', '?')}, {isa})")


def warn_if_busy(prog, seconds=1.0):
    """Warns when something else keeps the CPUs busy: every figure would be low."""
    def busy():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4], sum(v)
    b0, t0 = busy()
    time.sleep(seconds)
    b1, t1 = busy()
    if t1 > t0 and (b1 - b0) / (t1 - t0) > 0.15:
        print(f"{prog}: warning: the CPUs are {100 * (b1 - b0) / (t1 - t0):.0f}% busy before "
              "we start; other work will lower every figure", file=sys.stderr)


def peer_env(threads, venv=None):
    """Environment for a peer: pinned to `threads`, DeepSpeed on its CPU path."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1")
    if venv:
        # ninja and the extension cache of the venv (the op is built with
        # -march=native: the cache must not move to another CPU model).
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
        env["TORCH_EXTENSIONS_DIR"] = os.path.join(venv, "torch_extensions")
    return env


class Peer:
    """A worker child process; `measure()` returns params/s of one run.

    keep_alive=False frees the worker's memory after every run (for sizes
    where the peer and our benchmark would not fit in memory together)."""

    def __init__(self, prog, python, spec, env, keep_alive=True):
        self.prog, self.python, self.spec, self.env = prog, python, spec, env
        self.keep_alive, self.proc, self.info = keep_alive, None, None

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith(TAG):
                msg = json.loads(line[len(TAG):])
                if "error" in msg:
                    self.close()
                    fail(self.prog, f"{self.spec['kind']} peer ({self.python}): {msg['error']}")
                return msg
            sys.stderr.write(line)
        code = self.proc.wait()
        fail(self.prog, f"{self.spec['kind']} peer ({self.python}) exited with {code}")

    def measure(self):
        if self.proc is None:
            self.proc = subprocess.Popen(
                [self.python, os.path.abspath(__file__), "worker", json.dumps(self.spec)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, text=True)
            self.info = self._read()
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        result = self._read()["params_per_s"]
        if not self.keep_alive:
            self.close()
        return result

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.wait()
            self.proc = None


def resolve_ours(prog, bench, bases):
    """Full names of our benchmarks: cpu_adam_bench registers them with a
    fixed iteration count, so AdamW/fp32/<n> is listed as
    AdamW/fp32/<n>/iterations:<k>. Returns {base: full name}."""
    if not os.access(bench, os.X_OK):
        fail(prog, f"{bench} not found: build strata first (cmake --build build "
             "--target cpu_adam_bench), or pass --bench")
    proc = subprocess.run([bench, "--benchmark_list_tests=true"], capture_output=True, text=True)
    if proc.returncode != 0:
        fail(prog, f"{bench} --benchmark_list_tests failed:\n{proc.stdout}{proc.stderr}")
    listed = proc.stdout.split()
    found = {}
    for base in bases:
        hits = [x for x in listed if x == base or x.startswith(base + "/")]
        if len(hits) != 1:
            fail(prog, f"{bench}: {len(hits)} benchmarks named {base}[/...] (want 1)")
        found[base] = hits[0]
    return found


def run_ours(prog, bench, name, threads):
    """One run of one of our benchmarks: (params/s, roofline params/s), both
    medians over its iterations. The roofline is a plain stream over the same
    bytes, timed beside ours (params_per_s / vs_roofline): about as fast as
    any implementation that reads and writes those bytes can go just then."""
    env = dict(os.environ, STRATA_CPU_THREADS=str(threads))
    cmd = [bench, f"--benchmark_filter=^{name}$", "--benchmark_format=json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        fail(prog, f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    try:
        doc = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError as e:
        fail(prog, f"cannot read the JSON of {' '.join(cmd)}: {e}")
    for b in doc.get("benchmarks", []):
        if b.get("name") == name and b.get("run_type", "iteration") == "iteration":
            if b.get("error_occurred"):
                fail(prog, f"{name}: {b.get('error_message')}")
            if "threads" in b and int(b["threads"]) != threads:
                print(f"{prog}: warning: {name} ran on {int(b['threads'])} threads, "
                      f"not {threads}", file=sys.stderr)
            pps = float(b["params_per_s"])
            return pps, pps / float(b["vs_roofline"])
    fail(prog, f"{name} produced no result (benchmarks: "
         f"{[b.get('name') for b in doc.get('benchmarks', [])]})")


def interleave(repeat, runners):
    """Runs each callable `repeat` times, order reversed on odd repeats;
    returns {name: [results in run order]}."""
    got = {name: [] for name in runners}
    names = list(runners)
    for rep in range(repeat):
        for name in (names if rep % 2 == 0 else names[::-1]):
            got[name].append(runners[name]())
    return got


def compare(repeat, peer, ours):
    """One row: the peer and ours (a run_ours-like callable, or None to skip
    it) interleaved. Returns a dict of (median, runs) pairs: "peer", and with
    ours also "ours" and "roofline"."""
    runners = {"peer": peer.measure}
    if ours is not None:
        runners["ours"] = ours
    got = interleave(repeat, runners)
    peer.close()
    series = {"peer": got["peer"]}
    if ours is not None:
        series["ours"] = [r[0] for r in got["ours"]]
        series["roofline"] = [r[1] for r in got["ours"]]
    return {key: (statistics.median(v), v) for key, v in series.items()}


def json_row(row, peer):
    """compare()'s result as flat JSON fields; `peer` prefixes the peer's."""
    pm, pv = row["peer"]
    (om, ov), (rm, rv) = row.get("ours", (None, [])), row.get("roofline", (None, []))
    return {f"{peer}_params_per_s": pm, "ours_params_per_s": om,
            "roofline_params_per_s": rm, "ratio": om / pm if om else None,
            "ceiling": rm / pm if rm else None, f"{peer}_runs": pv, "ours_runs": ov,
            "roofline_runs": rv}


def row_head(label, width, peer):
    """Header of row_text's columns; `peer` names the peer (e.g. "DS")."""
    return (f"{label:<{width}} {peer + ' G/s':>9} {'ours G/s':>9} {'ours/' + peer:>9} "
            f"{'roof/' + peer:>9}")


def row_text(label, width, row):
    """One printed row of compare()'s result. roof/<peer> is the ratio a kernel
    at the roofline would get: the ceiling of ours/<peer> on this machine."""
    pm, pv = row["peer"]
    g = lambda v: ["%.3f" % (x / 1e9) for x in v]  # noqa: E731
    if "ours" not in row:
        return f"{label:<{width}} {pm / 1e9:>9.3f} {'-':>9} {'-':>9} {'-':>9}   peer {g(pv)}"
    (om, ov), (rm, rv) = row["ours"], row["roofline"]
    return (f"{label:<{width}} {pm / 1e9:>9.3f} {om / 1e9:>9.3f} {om / pm:>9.2f} "
            f"{rm / pm:>9.2f}   peer {g(pv)} ours {g(ov)} roofline {g(rv)}")


# ----------------------------------------------------------------- worker side

def _timed_run(step, n, min_time, max_steps=1000):
    times, start = [], time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_time and len(times) < max_steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def _torch_step(torch, spec):
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(spec["n"], generator=gen) * 0.02)
    p.grad = torch.randn(spec["n"], generator=gen) * 1e-3
    opt = torch.optim.AdamW([p], lr=spec["lr"], weight_decay=spec["wd"],
                            **{spec["impl"]: True})
    return opt.step


def _ds_adam_step(torch, spec):
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(spec["n"], generator=gen) * 0.02)
    p.grad = torch.randn(spec["n"], generator=gen) * 1e-3
    opt = DeepSpeedCPUAdam([p], lr=spec["lr"], weight_decay=spec["wd"], adamw_mode=True)
    return opt.step


def _ds_zero_step(torch, spec):
    """The CPU side of a ZeRO-1/2 offload step with bf16, op for op as
    DeepSpeed 0.19.8's stage_1_and_2.py runs it (see the docstring of
    cpu_adam_vs_deepspeed.py). bf16 means loss scale 1 (CreateLossScaler)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    n, chunk, mode, clip_grad = spec["n"], spec["tensor_numel"], spec["mode"], spec["clip_grad"]
    gen = torch.Generator().manual_seed(0)
    master = torch.nn.Parameter(torch.randn(n, generator=gen) * 0.02)  # fp32 partition
    master.grad = torch.empty(n)                                        # its fp32 grad
    bit16_out = torch.empty(n, dtype=torch.bfloat16)                    # bf16 buffer
    opt = DeepSpeedCPUAdam([master], lr=spec["lr"], weight_decay=spec["wd"], adamw_mode=True)
    # The model's bf16 gradients, one tensor per parameter of tensor_numel.
    # Global norm ~0.5 < clip_grad: the clip coefficient is 1, so mul_ runs
    # every step but leaves the values (and cpu_only's reused grads) alone.
    bf16 = (torch.randn(n, generator=gen) * (0.5 / n ** 0.5)).to(torch.bfloat16)
    grads, dests = list(bf16.split(chunk)), list(master.grad.split(chunk))
    if mode == "cpu_only":  # 0.19.8 converts and takes norms on the GPU
        for g, d in zip(grads, dests):
            d.copy_(g)
    norms = [g.to(torch.double).norm(2) for g in grads]

    def step():
        if mode == "bf16grad_cpu":
            for i, (g, d) in enumerate(zip(grads, dests)):
                norms[i] = g.to(torch.double).norm(2)       # set_norm_for_param_grad_in_gpu
                if bool(torch.isfinite(g.amax()).logical_and(torch.isfinite(g.amin()))
                        .logical_not()):                    # update_offload_overflow_tracker
                    raise RuntimeError("overflow")
                d.copy_(g)                                  # async_inplace_copy_grad_to_fp32_...
        total = sum(x.item() ** 2 for x in norms) ** 0.5    # complete_grad_norm_calculation_...
        norm = torch.linalg.vector_norm(torch.tensor([total]), ord=2)  # combine_grad_norm_groups
        if clip_grad > 0.0:                                 # unscale_and_clip_grads
            combined = torch.clamp((norm + 1e-6) / clip_grad, min=1.0)
            master.grad.mul_(1.0 / combined)
        opt.step()                                          # _optimizer_step
        bit16_out.copy_(master)                             # bit16_partition_buffer.copy_
    return step


def worker(spec):
    def say(msg):
        sys.stdout.write(TAG + json.dumps(msg) + "\n")
        sys.stdout.flush()
    try:
        import torch
        torch.set_num_threads(spec["threads"])
        make = {"torch": _torch_step, "ds_adam": _ds_adam_step, "ds_zero": _ds_zero_step}
        with torch.no_grad():
            step = make[spec["kind"]](torch, spec)
            for _ in range(spec.get("warmup", 2)):
                step()
    except Exception as e:  # reported to the parent, which exits 1 with it
        say({"error": f"{type(e).__name__}: {e}"})
        return
    say({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads()})
    for line in sys.stdin:
        if line.strip() != "run":
            break
        with torch.no_grad():
            say({"params_per_s": _timed_run(step, spec["n"], spec.get("min_time", 1.0))})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        worker(json.loads(sys.argv[2]))
    else:
        sys.exit(__doc__)
