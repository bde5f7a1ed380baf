"""strata-train's loop: one optimizer step after another, each logged as
one JSON line (Step.record) and shown on the progress bar, a checkpoint
every --save-every steps and at the end, and Ctrl-C.

Note [Ctrl-C in strata-train]
The first SIGINT only asks the loop to stop: the step in progress runs to
its end, as any other, and the checkpoint saved then is the state an
uninterrupted run has after that step, so --resume goes on
bit-identically. A second SIGINT abandons the step: KeyboardInterrupt
comes out of wherever the loop is, in the engine's pass (which recovers,
Note [Recovery] in strata/torch/engine.py) or in the loop's own code
between the engine's calls (the loss, the batches), where
engine.abandon_step() drops the step; either way the step changed
nothing, the data generator and torch's RNG states go back to where they
were before it, and that is what is saved. Once the step is counted
(engine.global_steps moved) SIGINT no longer raises; a step that settled
before the interrupt reached the engine stands, is logged, and its state
saved. Further SIGINTs outside a step (while the checkpoint is written)
are only noted: a checkpoint half written would be worse. The command
exits 130, as a shell does for a Ctrl-C."""
from __future__ import annotations

import json
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm

from strata.torch import StrataEngine
from strata.train import report
from strata.train.data import Batches

INTERRUPTED = 130


@dataclass
class Run:
    """What the loop needs besides the engine and the data."""
    out: Path
    steps: int
    save_every: int
    save: bool  # False: no checkpoint, also not at the end (--no-save)
    keep: int
    seq_len: int
    flops_per_token: float
    peak_tflops: Optional[float]
    title: str

    @property
    def ckpt(self) -> Path:
        return self.out / "ckpt"

    @property
    def log(self) -> Path:
        return self.out / "log.jsonl"


class Stop:
    """SIGINT while the loop runs: Note [Ctrl-C in strata-train]."""

    def __init__(self, engine: StrataEngine) -> None:
        self.engine = engine
        self.requested = False
        # engine.global_steps when the step in progress began (None
        # between steps): a second SIGINT abandons the step until counted
        self.counted: Optional[int] = None

    def __enter__(self) -> "Stop":
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if not self.requested:
            self.requested = True
            tqdm.write("strata-train: Ctrl-C: the step in progress ends, "
                       "then a checkpoint is saved (Ctrl-C again abandons "
                       "the step)")
        elif self.counted == self.engine.global_steps:
            raise KeyboardInterrupt
        else:
            tqdm.write("strata-train: saving the checkpoint; it ends soon")


def train(engine: StrataEngine, batches: Batches, run: Run) -> int:
    """Steps until engine.global_steps reaches run.steps or Ctrl-C;
    returns the exit status (0, or 130 after Ctrl-C)."""
    bar = tqdm(total=run.steps, initial=engine.global_steps, unit="step",
               dynamic_ncols=True)
    with Stop(engine) as stop, run.log.open("a") as log:
        while engine.global_steps < run.steps and not stop.requested:
            before, tally = _snapshot(batches), Tally.now(engine)
            counted = stop.counted = engine.global_steps
            try:
                step(engine, batches, tally)
            except KeyboardInterrupt:
                stop.counted, stop.requested = None, True  # no more raises
                engine.abandon_step()
                if engine.global_steps == counted:
                    _restore(batches, before)
                    break
            finally:
                stop.counted = None
            record = tally.record(engine, batches, run)
            log.write(json.dumps(record) + "\n")
            log.flush()
            bar.update(1)
            bar.set_postfix_str(_postfix(record))
            if run.save_every and record["step"] % run.save_every == 0 \
                    and record["step"] < run.steps:
                save(engine, batches, run)
        bar.close()
        where = run.ckpt / f"global_step{engine.global_steps}"
        if run.save and not where.exists():  # else resumed there, no step
            save(engine, batches, run)
        elif not run.save:
            plot(run)
    if stop.requested:
        saved = (f"checkpoint {where}; --resume goes on from it"
                 if run.save else "no checkpoint (--no-save)")
        print(f"strata-train: stopped at step {engine.global_steps}; "
              f"{saved}")
        return INTERRUPTED
    return 0


@dataclass
class Tally:
    """One step's progress so far, kept by step() outside it: a step that
    settled as Ctrl-C came is logged all the same."""
    lr: float
    stats: dict[str, Any]
    start: float
    loss: float = 0.0  # the sum over the micro-batches
    fwd_bwd: float = 0.0

    @staticmethod
    def now(engine: StrataEngine) -> "Tally":
        return Tally(engine.get_lr()[0], engine.store.stats(),
                     time.perf_counter())

    def record(self, engine: StrataEngine, batches: Batches, run: Run
               ) -> dict[str, Any]:
        """The step's log record, after engine.step() ended it. The loss
        is the mean next-token cross entropy in fp32 over the
        micro-batches."""
        seconds = time.perf_counter() - self.start
        stepped = engine.last_report
        assert stepped is not None  # the last micro-batch ends the step
        accumulation = engine.gradient_accumulation_steps()
        tokens = accumulation * batches.micro_batch * run.seq_len
        return {"step": engine.global_steps,
                "loss": self.loss / accumulation, "lr": self.lr,
                "grad_norm": stepped.grad_norm, "skipped": stepped.skipped,
                "tokens": tokens, **_rates(tokens / seconds, run),
                "step_s": seconds,
                **_breakdown(self.fwd_bwd, stepped, self.stats,
                             engine.store.stats())}


def step(engine: StrataEngine, batches: Batches, tally: Tally) -> None:
    """One optimizer step (gradient_accumulation_steps micro-batches),
    counted in `tally` as it goes."""
    for _ in range(engine.gradient_accumulation_steps()):
        x, y = batches.next()
        began = time.perf_counter()
        logits = engine(input_ids=x.to(engine.device)).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(),
                               y.to(engine.device).flatten())
        engine.backward(loss)
        tally.fwd_bwd += time.perf_counter() - began
        tally.loss += loss.item()
        engine.step()


def _rates(tokens_per_s: float, run: Run) -> dict[str, Any]:
    tflops = run.flops_per_token * tokens_per_s / 1e12
    mfu = tflops / run.peak_tflops if run.peak_tflops else None
    return {"tokens_per_s": tokens_per_s, "tflops": tflops, "mfu": mfu}


def _breakdown(fwd_bwd: float, stepped: Any, before: dict[str, Any],
               after: dict[str, Any]) -> dict[str, Any]:
    """Where the step's time went. Forward and backward's wall time holds
    the waits for fetched data (stall_fetch_s), for optimizer updates of
    the last step still running (stall_update_s) and for a free gradient
    buffer (stall_grad_buffer_s); compute_s is the rest. engine.step()'s
    wait for the optimizer (stall_optimizer_s) comes after them. Of the
    optimizer's time (optimizer_s), optimizer_hidden_s ran under compute."""
    fetch = after["stall_seconds"] - before["stall_seconds"]
    update = after["update_wait_seconds"] - before["update_wait_seconds"]
    grad = stepped.acquire_wait_seconds
    moved = {f"{src}_to_{dst}_bytes":
             after["bytes"][src][dst] - before["bytes"][src][dst]
             for src, dst in (("host", "device"), ("device", "host"),
                              ("nvme", "host"), ("host", "nvme"))}
    return {"compute_s": max(0.0, fwd_bwd - fetch - update - grad),
            "stall_fetch_s": fetch, "stall_update_s": update,
            "stall_grad_buffer_s": grad,
            "stall_optimizer_s": stepped.finish_wait_seconds,
            "optimizer_s": stepped.step_seconds,
            "optimizer_hidden_s": stepped.hidden_seconds, **moved}


def _postfix(r: dict[str, Any]) -> str:
    """loss, tokens/s, TFLOPS, MFU, and the step's breakdown: compute,
    the stalls by cause (those over a millisecond), optimizer hidden."""
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
    causes = {"fetch": r["stall_fetch_s"], "update": r["stall_update_s"],
              "grad buffer": r["stall_grad_buffer_s"],
              "optimizer": r["stall_optimizer_s"]}
    named = ", ".join(f"{k} {v:.3f}" for k, v in causes.items() if v > 1e-3)
    return (f"loss {r['loss']:.4f} | {r['tokens_per_s']:,.0f} tok/s | "
            f"{r['tflops']:.3g} TFLOPS | MFU {mfu} | compute "
            f"{r['compute_s']:.3f}s, stalls {sum(causes.values()):.3f}s"
            + (f" ({named})" if named else "")
            + f", optimizer hidden {r['optimizer_hidden_s']:.3f}s")


def _snapshot(batches: Batches) -> dict[str, Any]:
    """What a step draws from: the data generator and torch's RNGs
    (dropout)."""
    out = {"data": batches.state(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _restore(batches: Batches, snapshot: dict[str, Any]) -> None:
    batches.restore(snapshot["data"])
    torch.set_rng_state(snapshot["cpu"])
    if "cuda" in snapshot:
        torch.cuda.set_rng_state_all(snapshot["cuda"])


def save(engine: StrataEngine, batches: Batches, run: Run) -> None:
    """A checkpoint under run.ckpt (the data generator's state in its
    client_state), the plot of the log so far, and the oldest checkpoints
    beyond run.keep removed."""
    engine.save_checkpoint(str(run.ckpt), client_state={
        "data": batches.state(), "seq_len": run.seq_len})
    plot(run)
    _prune(run.ckpt, run.keep)


def plot(run: Run) -> None:
    """train.png from the log so far."""
    report.plot(read_log(run.log), run.out / "train.png", run.title)


def _prune(ckpt: Path, keep: int) -> None:
    """Removes all but the newest `keep` checkpoints (keep 0: none)."""
    if keep <= 0:
        return
    tags = sorted((int(p.name[len("global_step"):]), p)
                  for p in ckpt.glob("global_step*")
                  if p.name[len("global_step"):].isdigit())
    for _, path in tags[:-keep]:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()
            if line.strip()]


def resume(engine: StrataEngine, batches: Batches, run: Run) -> int:
    """Loads the latest checkpoint under run.ckpt and the data generator's
    state; cuts the log back to its step (lines after it are of steps
    this run does again). Returns the step; raises LookupError when
    there is no checkpoint."""
    path, state = engine.load_checkpoint(str(run.ckpt))
    if path is None:
        raise LookupError(f"no checkpoint in {run.ckpt} to resume from")
    if state.get("seq_len") != run.seq_len:
        raise ValueError(
            f"the checkpoint {path} was trained at --seq-len "
            f"{state.get('seq_len')}, not {run.seq_len}; resume with the "
            f"flags it was saved with")
    batches.restore(state["data"])
    kept = [r for r in read_log(run.log) if r["step"] <= engine.global_steps]
    run.log.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return engine.global_steps
