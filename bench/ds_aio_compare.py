#!/usr/bin/env python3
"""strata's aio engine vs DeepSpeed's async I/O handle, same file, same job.

Run:
    python3 bench/ds_aio_compare.py --path DIR [--size 1G] [--repeat 3]
        [--strata build/bin/strata-nvme-bench] [--venv /var/cache/strata/ds-venv]
        [--no-tune]

The job is the one an offload engine runs: read or write one large tensor
(--size bytes) sequentially, split into block-size requests with a queue of
them in flight per thread. DeepSpeed does it with one async_pread/async_pwrite
of a locked buffer and wait() (what its ds_io tool times); strata does it with
strata-nvme-bench at the same block size, queue depth and thread count.

Two settings are compared, each run --repeat times with strata and DeepSpeed
interleaved, medians reported:
  * DeepSpeed's default aio config: block_size 1M, queue_depth 8, one thread,
    single_submit off, overlap_events on;
  * the best config of a ds_nvme_tune-style sweep (block 1M/8M x queue 32/128
    x single_submit x overlap_events x threads 1/2/4/8, best read+write sum).

DeepSpeed comes from PyPI into a virtualenv (--venv, made by
bench/ds_venv.py when missing); its async_io op is compiled on first load
against libaio-dev, into /var/cache/strata/ds-ext (once per machine). If
that cannot be done, the script says why and exits 1. DeepSpeed never checks completion results, so every
DeepSpeed run is verified on sampled 4 KiB windows (outside the timing).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import ds_venv

DS_DEFAULT = {"bs": 1 << 20, "qd": 8, "threads": 1, "single_submit": False,
              "overlap_events": True}
WINDOW = 4096
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(msg):
    ds_venv.fail("ds_aio_compare", msg)


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def load_aio():
    print("ds_aio_compare: loading DeepSpeed's async_io op (compiled on first "
          "use, a few minutes)", file=sys.stderr)
    from deepspeed.ops.op_builder import AsyncIOBuilder
    builder = AsyncIOBuilder()
    if not builder.is_compatible(verbose=True):
        fail("DeepSpeed says its async_io op cannot be built here (libaio-dev?)")
    return builder.load(verbose=False)


class DeepSpeedJob:
    """One locked buffer of the whole job, allocated once."""

    def __init__(self, aio, path, size):
        import torch
        self.torch = torch
        self.aio, self.path, self.size = aio, path, size
        self.owner = aio.aio_handle()
        self.buf = self.owner.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
        if self.buf is None or self.buf.numel() != size:
            fail(f"DeepSpeed could not lock a {size}-byte buffer (ulimit -l?)")
        self.buf.random_(0, 256)

    def run(self, rw, cfg):
        """Seconds for one read or write of the whole file through a fresh handle."""
        h = self.aio.aio_handle(cfg["bs"], cfg["qd"], cfg["single_submit"],
                                cfg["overlap_events"], cfg["threads"])
        rng = random.Random(time.time_ns())
        windows = sorted({rng.randrange(self.size // WINDOW) * WINDOW for _ in range(16)})
        fd = os.open(self.path, os.O_RDONLY)
        if rw == "read":
            expected = {o: os.pread(fd, WINDOW, o) for o in windows}
            for o in windows:  # the read must overwrite these
                self.buf[o:o + WINDOW] = 255 - self.torch.frombuffer(
                    bytearray(expected[o]), dtype=self.torch.uint8)
        else:
            for o in windows:  # fresh bytes the file cannot already hold
                self.buf[o:o + 16] = self.torch.randint(0, 256, (16,), dtype=self.torch.uint8)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        submit = h.async_pread if rw == "read" else h.async_pwrite
        t0 = time.perf_counter()
        if submit(self.buf, self.path, 0) != 0 or h.wait() != 1:
            fail(f"DeepSpeed {rw} failed to submit or complete")
        seconds = time.perf_counter() - t0
        del h
        for o in windows:
            on_disk = os.pread(fd, WINDOW, o)
            in_buf = bytes(self.buf[o:o + WINDOW].numpy())
            if on_disk != in_buf:
                fail(f"DeepSpeed {rw} {cfg} did not move the bytes at offset {o} "
                     "(it ignores I/O errors); refusing to report its time")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        return self.size / seconds / 1e9


def strata_run(binary, path, rw, cfg, size):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [binary, "--path", path, "--overwrite", "--quiet", "--rw", rw,
               "--bs", str(cfg["bs"]), "--qd", str(cfg["qd"]),
               "--threads", str(cfg["threads"]), "--size", str(size),
               "--json", out.name]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"strata-nvme-bench failed:\n{proc.stdout}{proc.stderr}")
        return json.load(open(out.name))[0]["gb_per_s"]


def tune(job, size):
    """ds_nvme_tune's space; the best read+write sum wins."""
    best, best_sum = None, 0.0
    for bs in (1 << 20, 8 << 20):
        for qd in (32, 128):
            for single_submit in (False, True):
                for overlap in (True, False):
                    for threads in (1, 2, 4, 8):
                        if size % (threads * bs):
                            continue
                        cfg = {"bs": bs, "qd": qd, "threads": threads,
                               "single_submit": single_submit, "overlap_events": overlap}
                        total = job.run("read", cfg) + job.run("write", cfg)
                        print(f"  tune {cfg}: read+write {total:.3f} GB/s", file=sys.stderr)
                        if total > best_sum:
                            best, best_sum = cfg, total
    return best


def compare(args, job, name, cfg):
    rows = []
    for rw in ("read", "write"):
        ds, st = [], []
        for rep in range(args.repeat):
            order = (lambda: ds.append(job.run(rw, cfg)),
                     lambda: st.append(strata_run(args.strata, job.path, rw, cfg, args.size)))
            for step in (order if rep % 2 == 0 else order[::-1]):
                step()
        d, s = statistics.median(ds), statistics.median(st)
        rows.append((name, rw, cfg, d, s))
        print(f"{name:<8} {rw:<6}{cfg['bs'] >> 20:>4}M{cfg['qd']:>5}{cfg['threads']:>4}"
              f"  {d:>10.3f}  {s:>10.3f}  {s / d:>6.3f}   ds {['%.2f' % x for x in ds]}"
              f" strata {['%.2f' % x for x in st]}", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--path", required=True, help="directory for the scratch file")
    p.add_argument("--size", default="1G", help="bytes per job (default 1G)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--strata", default=os.path.join(REPO, "build/bin/strata-nvme-bench"))
    p.add_argument("--venv", default=ds_venv.DS_VENV)
    p.add_argument("--no-tune", action="store_true", help="compare DeepSpeed's defaults only")
    args = p.parse_args()
    args.size = parse_size(args.size)
    if not os.path.isdir(args.path):
        fail(f"--path {args.path} is not a directory; create it first")
    if not os.access(args.strata, os.X_OK):
        fail(f"{args.strata} not found: build strata first (scripts/main.sh or cmake --build)")
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        py = ds_venv.ensure_venv("ds_aio_compare", args.venv)
        os.execve(py, [py, os.path.abspath(__file__), *sys.argv[1:]],
                  ds_venv.ds_env(args.venv))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", ds_venv.DS_EXTENSIONS)
    aio = load_aio()

    path = os.path.join(args.path, "ds-aio-compare.dat")
    with open(path, "wb") as f:
        for _ in range(args.size // (8 << 20)):
            f.write(os.urandom(8 << 20))
        f.flush()
        os.fsync(f.fileno())
    try:
        job = DeepSpeedJob(aio, path, args.size)
        print(f"same file {path} ({args.size >> 20} MiB), medians of {args.repeat}, GB/s = 1e9 B/s")
        print(f"{'setting':<8} {'rw':<6}{'bs':>5}{'qd':>5}{'thr':>4}  {'DeepSpeed':>10}  {'strata':>10}  {'ratio':>6}")
        compare(args, job, "default", DS_DEFAULT)
        if not args.no_tune:
            best = tune(job, args.size)
            print(f"ds_nvme_tune-style best: {best}", file=sys.stderr)
            compare(args, job, "tuned", best)
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
