"""Nothing gets stuck (issue #30 §2): a step with non-finite gradients is
skipped exactly in every precision and training goes on; any error or
interrupt inside a pass leaves the engine able to step, save, load and
close; a Ctrl-C while strata waits reaches Python."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import strata
import strata.torch as st
from conftest import assert_identical, config, data, model, train_strata

BAD = {"nan": float("nan"), "inf": float("inf")}


def run_with_a_bad_step(cfg: dict[str, Any], bad: float) -> st.StrataEngine:
    """Four steps; the second one's loss is multiplied by `bad`."""
    engine = st.initialize(model(), cfg)
    for i, (x, y) in enumerate(data(4)):
        loss = engine(x, y).loss
        engine.backward(loss * bad if i == 1 else loss)
        report = engine.step()
        assert engine.was_step_applied() == (i != 1), i
        assert report is not None and report.skipped == (i == 1)
    return engine


@pytest.mark.parametrize("mode", ["overlap", "after_backward"])
@pytest.mark.parametrize("state", ["host", "nvme"])
@pytest.mark.parametrize("precision,bad", [
    ("fp32", "nan"), ("bf16", "inf"), ("fp16", "nan")])
def test_a_step_with_non_finite_gradients_is_skipped_exactly(
        nvme: Path, precision: str, bad: str, state: str, mode: str) -> None:
    """The run equals one that never saw the bad batch, bit for bit (fp16
    with a static loss scale, so that the skip does not change it)."""
    over: dict[str, Any] = {"strata": {"mode": mode}}
    if precision == "bf16":
        over["bf16"] = {"enabled": True}
    if precision == "fp16":
        over["fp16"] = {"enabled": True, "loss_scale": 128}
    if state == "nvme":
        over["zero_optimization"] = {"offload_optimizer": {
            "device": "nvme", "nvme_path": str(nvme)}}
    cfg = config(**over)
    with pytest.warns(UserWarning, match=r"step 2 skipped: the gradients "
                      r"of group '[\w.]+' are not finite"):
        engine = run_with_a_bad_step(cfg, BAD[bad])
    state_dict = {k: v.clone() for k, v in engine.state_dict().items()}
    engine.close()
    steps = data(4)
    reference = train_strata(model(), cfg, steps[:1] + steps[2:])
    assert state_dict.keys() == reference.state.keys()
    for key, value in reference.state.items():
        assert torch.equal(state_dict[key], value), key


def test_a_run_that_only_skips_stops_and_stays_usable(scratch: Path) -> None:
    cfg = config(strata={"max_consecutive_skips": 2})
    engine = st.initialize(model(), cfg)
    engine.save_checkpoint(str(scratch), tag="start")
    x, y = data(1)[0]
    engine.backward(engine(x, y).loss * float("nan"))
    with pytest.warns(UserWarning):
        engine.step()
    engine.backward(engine(x, y).loss * float("nan"))
    with pytest.warns(UserWarning), pytest.raises(
            strata.StrataError, match="2 steps in a row were skipped"):
        engine.step()
    assert engine.load_checkpoint(str(scratch), tag="start")[0] is not None
    engine.backward(engine(x, y).loss)
    assert engine.step().skipped is False
    engine.close()


class Failing(torch.nn.Module):
    """The tests' GPT, whose forward raises once when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = model()
        self.fail: BaseException | None = None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        out = self.gpt(x, y)
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        return out


@pytest.mark.parametrize("where", ["forward", "backward", "step", "caller"])
@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_every_error_in_a_pass_leaves_the_engine_usable(
        scratch: Path, where: str, error: BaseException) -> None:
    """After the error the step is dropped: the run goes on as if the
    failed micro-batches never came, and save, load and close work. An
    error in the caller's own code between backward and step needs
    engine.abandon_step(), which does nothing between steps."""
    cfg = config(gradient_accumulation_steps=2,
                 train_micro_batch_size_per_gpu=4)
    m = Failing()
    engine = st.initialize(m, cfg)
    steps = data(3)
    x, y = steps[0]
    micro = [(x[:4], y[:4]), (x[4:], y[4:])]
    engine.backward(engine(*micro[0]).loss)
    engine.step()
    with pytest.raises(type(error)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if where == "forward":
            m.fail = error
            engine(*micro[1])
        elif where == "backward":
            loss = engine(*micro[1]).loss
            engine.rt.optimizer.acquire_gradients = _raising(error)
            try:
                engine.backward(loss)
            finally:
                del engine.rt.optimizer.acquire_gradients
        elif where == "step":
            engine.backward(engine(*micro[1]).loss)
            engine.rt.optimizer.finish_step = _raising(error)
            try:
                engine.step()
            finally:
                del engine.rt.optimizer.finish_step
        else:
            engine.backward(engine(*micro[1]).loss)
            raise error
    if where == "caller":  # the step is still open, and the error says so
        with pytest.raises(strata.StrataError,
                           match=r"drop the step with engine.abandon_step"):
            engine.save_checkpoint(str(scratch), tag=6)
    assert engine.abandon_step() == (where == "caller")
    saved = engine.save_checkpoint(str(scratch), tag=7)
    assert saved and (scratch / "7").is_dir()
    rest = train_strata(m, cfg, steps[1:], engine=engine, close=False)
    assert engine.load_checkpoint(str(scratch), tag=7)[0] == str(scratch / "7")
    again = train_strata(m, cfg, steps[1:], engine=engine, close=False)
    assert_identical(rest, again, "after load")
    expected = engine.state_dict()
    engine.close()
    for name, p in m.named_parameters():
        assert type(p) is torch.nn.Parameter and torch.equal(
            p.detach().cpu(), expected[name]), name
    reference = train_strata(Failing(), cfg, steps[1:])
    assert_identical(rest, reference, "against a run without the error")


def _raising(error: BaseException) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise error
    return call


def test_after_close_every_call_says_the_engine_is_closed() -> None:
    engine = st.initialize(model(), config())
    engine.close()
    x, y = data(1)[0]
    for call in (lambda: engine(x, y), lambda: engine.step(),
                 lambda: engine.save_checkpoint("unused")):
        with pytest.raises(strata.StrataError, match="the engine is closed"):
            call()
    engine.close()  # a second close does nothing


def test_a_step_without_backward_says_so() -> None:
    engine = st.initialize(model(), config())
    x, y = data(1)[0]
    engine(x, y)
    with pytest.raises(strata.StrataError, match=r"engine.step\(\) needs "
                       r"engine.backward\(loss\) first"):
        engine.step()
    engine.close()


@contextlib.contextmanager
def state_held_elsewhere(engine: st.StrataEngine) -> Iterator[None]:
    """Another thread holds group 0's compute copy for writing on the
    device until the block ends: the group's update, which writes it at
    its home, waits for it."""
    held, go = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.store.fetch(0, "device", roles="compute", write=True):
            held.set()
            go.wait()
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        yield
    finally:
        go.set()
        holder.join()


def interrupted(call: Callable[[], object]) -> None:
    """`call` raises KeyboardInterrupt once this process gets a SIGINT."""
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
    finally:
        timer.cancel()


def test_ctrl_c_while_a_forward_waits_for_an_update(scratch: Path) -> None:
    """The last step's update of a group lands under the next forward,
    whose fetch waits for it; another thread holds the group's compute copy
    for writing, so the update (and the fetch) wait until it lets go. A
    SIGINT meanwhile raises KeyboardInterrupt from engine(...); then
    training, saving and closing go on."""
    engine = st.initialize(model(), config())
    steps = data(3)
    x, y = steps[0]
    engine.backward(engine(x, y).loss)
    with state_held_elsewhere(engine):
        engine.step()  # queues the updates, which wait for the holder
        interrupted(lambda: engine(*steps[1]))
    train_strata(engine.module, config(), steps[1:], engine=engine,
                 close=False)
    engine.save_checkpoint(str(scratch))
    engine.close()


def finish_then_sigint(engine: st.StrataEngine) -> None:
    """The optimizer's finish_step gets a SIGINT as it returns."""
    optimizer = engine.rt.optimizer
    assert optimizer is not None
    finish = optimizer.finish_step

    def call(*args: Any) -> Any:
        report = finish(*args)
        signal.raise_signal(signal.SIGINT)  # its handler runs here
        return report
    optimizer.finish_step = call  # type: ignore[method-assign]


@pytest.mark.parametrize("when", ["waiting", "finished"])
def test_ctrl_c_in_engine_step_counts_a_settled_step(when: str) -> None:
    """In after_backward mode engine.step() waits for the groups' updates;
    with one held up, a SIGINT raises KeyboardInterrupt from step(). The
    step had settled, so it stands and counts as one (the scheduler
    advances, as after any step): the run then equals one never
    interrupted. So too for a SIGINT as the optimizer's finish returns
    (Note [Ctrl-C as a step finishes]): it is raised after the count."""
    cfg = config(strata={"mode": "after_backward"}, scheduler={
        "type": "WarmupLR", "params": {"warmup_max_lr": 3e-3,
                                       "warmup_num_steps": 4,
                                       "warmup_type": "linear"}})
    steps = data(4)
    reference = train_strata(model(), cfg, steps)
    engine = st.initialize(model(), cfg)
    first = train_strata(engine.module, cfg, steps[:1], engine=engine,
                         close=False)
    x, y = steps[1]
    engine.backward(engine(x, y).loss)
    if when == "waiting":
        with state_held_elsewhere(engine):
            interrupted(engine.step)
    else:
        finish_then_sigint(engine)
        with pytest.raises(KeyboardInterrupt):
            engine.step()
        del engine.rt.optimizer.finish_step  # type: ignore[union-attr]
    assert engine.global_steps == 2
    assert not engine.abandon_step()
    rest = train_strata(engine.module, cfg, steps[2:], engine=engine)
    assert first.losses + rest.losses == [reference.losses[i]
                                          for i in (0, 2, 3)]
    for key, value in reference.state.items():
        assert torch.equal(rest.state[key], value), key
