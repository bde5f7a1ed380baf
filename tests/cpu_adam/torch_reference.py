#!/usr/bin/env python3
"""Runs torch.optim.{AdamW,Adam,Adagrad} on inputs written by
torch_parity_test.cc and writes the resulting parameters and state back.

    torch_reference.py IN OUT

IN:  int32 algo (0 Adam, 1 AdamW, 2 Adagrad), int32 n, int32 steps,
     float64 lr, beta1, beta2, eps, weight_decay,
     then float32 params[n] and float32 grads[steps][n].
OUT: float32 params[n], state1[n], state2[n] (state2 zero for Adagrad).
Exit status 77 when torch cannot be imported, so the test can skip.
"""
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"torch is not importable: {e}", file=sys.stderr)
    sys.exit(77)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        algo, n, steps = struct.unpack("<3i", f.read(12))
        lr, beta1, beta2, eps, wd = struct.unpack("<5d", f.read(40))
        params = np.frombuffer(f.read(4 * n), dtype="<f4").copy()
        grads = np.frombuffer(f.read(4 * n * steps), dtype="<f4").reshape(steps, n)
    p = torch.nn.Parameter(torch.from_numpy(params))
    if algo == 2:
        opt = torch.optim.Adagrad([p], lr=lr, eps=eps, weight_decay=wd)
        keys = ("sum", None)
    else:
        cls = torch.optim.AdamW if algo == 1 else torch.optim.Adam
        opt = cls([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
        keys = ("exp_avg", "exp_avg_sq")
    for s in range(steps):
        p.grad = torch.from_numpy(grads[s].copy())
        opt.step()
    state = opt.state[p]
    zeros = torch.zeros(n)
    with open(dst, "wb") as f:
        for t in (p.detach(), state[keys[0]], state[keys[1]] if keys[1] else zeros):
            f.write(t.numpy().astype("<f4").tobytes())
    print(f"torch {torch.__version__}: {type(opt).__name__} x {steps} steps")


if __name__ == "__main__":
    main()
