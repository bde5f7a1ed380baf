"""Ctrl-C in strata's waits (issue #30 §1): a SIGINT while a call blocks
in strata raises KeyboardInterrupt in the calling thread, and the engine
goes on: views release, fetches succeed, steps finish, checkpoints save
and the engine closes. Each wait here is ended only by the holder thread,
which lets go once the interrupt came: without it, the test would hang
(and the watchdog would fail it)."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

import strata
from test_optimizer import master, model, step


class WriteViewHolder:
    """Holds a write view of `group`'s `roles` at `tier` in a thread of its
    own until let go."""

    def __init__(self, engine: strata.Engine, group: int, tier: str,
                 roles: str) -> None:
        self.held = threading.Event()
        self.go = threading.Event()
        self.error: list[BaseException] = []

        def hold() -> None:
            try:
                with engine.fetch(group, tier, roles=roles, write=True):
                    self.held.set()
                    self.go.wait()
            except BaseException as e:  # reported by let_go
                self.error.append(e)
                self.held.set()
        self.thread = threading.Thread(target=hold)
        self.thread.start()
        assert self.held.wait(30)

    def let_go(self) -> None:
        self.go.set()
        self.thread.join()
        assert not self.error, self.error


def interrupted(call: Callable[[], object]) -> None:
    """Runs `call`, sending this process a SIGINT once it blocks; it must
    raise KeyboardInterrupt (conftest.py's pytest_configure makes sure
    Python handles SIGINT, even in a background run)."""
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()


@pytest.fixture
def two_groups(engine: strata.Engine) -> Iterator[strata.Engine]:
    model(engine)
    yield engine


def test_a_fetch_waiting_for_another_threads_view(
        two_groups: strata.Engine) -> None:
    engine = two_groups
    holder = WriteViewHolder(engine, 0, "device", "compute")
    interrupted(lambda: engine.fetch(0, "host", roles="compute"))
    holder.let_go()
    with engine.fetch(0, "host", roles="compute") as view:
        assert view.tensors[0].name == "w"


def second_step_held_up(engine: strata.Engine, opt: strata.Optimizer
                        ) -> WriteViewHolder:
    """One step, then a second whose groups are handed off: the worker's
    step of group 0 waits for the write view of its master the holder
    returned keeps."""
    step(opt)
    holder = WriteViewHolder(engine, 0, "device", "master")
    opt.begin_step(lr=1e-3)
    for g in (1, 0):
        opt.hand_off(opt.acquire_gradients(g))
    return holder


def test_a_finish_step_waiting_for_the_cpu_optimizer(
        two_groups: strata.Engine, scratch: Path) -> None:
    """The worker's step of group 0 waits for a write view of its master;
    finish_step waits for the worker."""
    engine = two_groups
    with strata.Optimizer(engine, threads=1) as opt:
        holder = second_step_held_up(engine, opt)
        interrupted(opt.finish_step)
        holder.let_go()
        report = opt.finish_step()
        assert report.step == 2
        opt.save(str(scratch / "ckpt"))
        before = master(engine, 0)
        step(opt)
        assert not np.array_equal(master(engine, 0), before)
        opt.load(str(scratch / "ckpt"))
        assert np.array_equal(master(engine, 0), before)


def test_held_interrupts_end_waits_and_come_after_the_bookkeeping(
        two_groups: strata.Engine) -> None:
    """strata.interrupts_held(): a SIGINT while finish_step waits inside it
    still ends the wait and raises from the call; one as finish_step
    returns is raised when the block ends, after the caller counted the
    step."""
    engine = two_groups
    with strata.Optimizer(engine, threads=1) as opt:
        holder = second_step_held_up(engine, opt)
        with strata.interrupts_held():
            interrupted(opt.finish_step)
        holder.let_go()
        counted: list[int] = []
        with pytest.raises(KeyboardInterrupt):
            with strata.interrupts_held():
                report = opt.finish_step()
                signal.raise_signal(signal.SIGINT)
                counted.append(report.step)
        assert counted == [2] and opt.step == 2


def test_a_handler_that_does_not_raise_lets_every_wait_go_on(
        two_groups: strata.Engine) -> None:
    """A signal whose handler only notes it (SLURM's SIGUSR1, say), and
    makes a strata call of its own, ends no wait: the main thread's fetch
    goes on once the view is released, and so does another thread's (the
    interrupt descriptor is the main thread's only)."""
    engine = two_groups
    holder = WriteViewHolder(engine, 0, "device", "compute")
    noted: list[int] = []

    def note(signum: int, frame: object) -> None:
        with engine.fetch(1, "host", roles="compute"):  # nested, watched
            noted.append(signum)
        holder.go.set()
    previous = signal.signal(signal.SIGUSR1, note)
    other: list[object] = []
    waiter = threading.Thread(target=lambda: other.append(
        engine.fetch(0, "host", roles="compute")))
    waiter.start()
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        with engine.fetch(0, "host", roles="compute"):
            assert noted == [signal.SIGUSR1]
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
        holder.let_go()
        waiter.join()
    assert len(other) == 1 and isinstance(other[0], strata.View)
    other[0].release()
