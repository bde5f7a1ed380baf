"""Bad input to strata.torch: each a clear error naming the problem and
the fix."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import strata
import strata.torch as st
from conftest import config, data, model


def test_an_unknown_key_is_named() -> None:
    with pytest.raises(st.ConfigError, match="'zero_optimization.offload_"
                       "optimizer.ratio2'.*remove it"):
        st.initialize(model(), config(zero_optimization={
            "offload_optimizer": {"ratio2": 1}}))
    with pytest.raises(st.ConfigError, match="unknown config key 'amp'"):
        st.initialize(model(), config(amp={"enabled": True}))
    with pytest.warns(UserWarning, match="ignored: strata.prefetch"):
        st.initialize(model(), config(strata={"prefetch": False})).close()
    with pytest.raises(st.ConfigError, match="strata.threads: 'no' is not "
                       "a number"):
        st.initialize(model(), config(strata={"threads": "no"}))
    with pytest.raises(st.ConfigError, match="strata.state_dtype 'fp8': "
                       "use fp32 .*, bf16 .* or int8"):
        st.initialize(model(), config(strata={"state_dtype": "fp8"}))
    with pytest.raises(st.ConfigError, match="int8 steps Adam and AdamW "
                       "only, not lion; use fp32 or bf16 state"):
        st.initialize(model(), config(
            strata={"state_dtype": "int8"},
            optimizer={"type": "Lion", "params": {"lr": 1e-4}}))


def test_resharding_refuses_int8_and_another_state_dtype() -> None:
    """A checkpoint loaded at another world size with its optimizer state:
    int8 state (quantized in blocks of each rank's part) and a state dtype
    other than the engine's are refused before anything is written
    (reshard.load checks first), naming the fix."""
    from types import SimpleNamespace

    from strata.torch import reshard

    def saved(dtype: str) -> SimpleNamespace:
        tensor = {"roles": {"compute": 0, "state1": 64}}
        if dtype != "fp32":
            tensor["state_dtype"] = dtype
        return SimpleNamespace(groups=[{"g": {"tensors": [tensor]}}],
                               parts=["rank-0", "rank-1"])

    for dtype, want in (("int8", "fp32"), ("fp32", "int8")):
        with pytest.raises(strata.StrataError, match=(
                r"int8 optimizer state loads only at the world size it was "
                r"saved at \(2 ranks, not 1\): resume at that size")):
            reshard._check_state(saved(dtype), want, 1)
    with pytest.raises(strata.StrataError, match=(
            "optimizer state is bf16, this engine's fp32: load it with the "
            "strata.state_dtype it was saved with")):
        reshard._check_state(saved("bf16"), "fp32", 1)
    reshard._check_state(saved("bf16"), "bf16", 1)


def test_ranks_keys_are_checked() -> None:
    with pytest.raises(st.ConfigError, match="stage 0: strata partitions"
                       ".*set it to 1, 2 or 3"):
        st.initialize(model(), config(zero_optimization={"stage": 0}))
    with pytest.raises(st.ConfigError, match="strata.rank_timeout must be"):
        st.initialize(model(), config(strata={"rank_timeout": 0}))
    with pytest.raises(st.ConfigError, match="train_batch_size 12 != .* "
                       "gradient_accumulation_steps 2 x 1 ranks"):
        st.initialize(model(), config(train_batch_size=12,
                                      gradient_accumulation_steps=2))


def test_keys_that_change_nothing_are_listed_once() -> None:
    with pytest.warns(UserWarning, match="steps_per_print, "
                      "zero_optimization.overlap_comm"):
        engine = st.initialize(model(), config(
            steps_per_print=10, zero_optimization={"overlap_comm": True}))
    engine.close()


@pytest.mark.parametrize("budget, message", [
    # Only compute copies go to the device: the gradient buffers run out
    # before any group's fetch does.
    ("device_budget", r"gradient buffers of [\d.]+ KiB need [\d.]+ KiB; "
                      r"raise the device budget"),
    ("host_budget", r"group '[\w. ()]+' needs [\d.]+ [KMG]iB.*"
                    r"budget is .*Raise")])
def test_a_budget_too_small_names_the_group_and_the_bytes(
        budget: str, message: str) -> None:
    with pytest.raises(strata.StrataError, match=message) as e:
        st.initialize(model(), config(strata={budget: "64K"}))
    assert budget.split("_")[0] in str(e.value)


def test_a_missing_or_unwritable_nvme_path(scratch: Path) -> None:
    def offload(path: object) -> dict:
        return config(zero_optimization={"offload_optimizer": {
            "device": "nvme", "nvme_path": str(path)}})
    with pytest.raises(st.ConfigError, match="needs .*nvme_path"):
        st.initialize(model(), config(zero_optimization={
            "offload_optimizer": {"device": "nvme"}}))
    with pytest.raises(st.ConfigError, match="not a directory; create it"):
        st.initialize(model(), offload(scratch / "missing"))
    with pytest.raises(st.ConfigError, match="not writable"):
        st.initialize(model(), offload("/proc"))
    # Several directories: each is checked, and the bad one named.
    with pytest.raises(st.ConfigError,
                       match=f"nvme_path {scratch / 'gone'} is not a dir"):
        st.initialize(model(), offload(f"{scratch}:{scratch / 'gone'}"))
    with pytest.raises(st.ConfigError, match="a list of directories"):
        st.initialize(model(), config(zero_optimization={"offload_optimizer": {
            "device": "nvme", "nvme_path": [str(scratch), 3]}}))


class Peeking(nn.Module):
    """Uses a block's weight outside the block: not allowed."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = model()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.gpt(x, y)
        return out.loss + self.gpt.blocks[0].fc.weight.sum()


def test_a_parameter_used_outside_its_module_is_named() -> None:
    engine = st.initialize(Peeking(), config())
    x, y = data(1)[0]
    with pytest.raises(strata.StrataError,
                       match="gpt.blocks.0.fc.weight was used outside"):
        engine(x, y)
    engine.close()


def test_a_training_forward_outside_the_engine_is_refused() -> None:
    m = model()
    engine = st.initialize(m, config())
    x, y = data(1)[0]
    with pytest.raises(strata.StrataError, match="call engine"):
        m(x, y)
    engine.close()


def test_a_model_changed_after_initialize_is_named() -> None:
    m = model()
    engine = st.initialize(m, config())
    m.blocks[1].fc.weight = nn.Parameter(torch.zeros(128, 32))
    x, y = data(1)[0]
    with pytest.raises(strata.StrataError, match="blocks.1.fc.weight was "
                       "replaced after initialize"):
        engine(x, y)
    engine.close()


def test_backward_without_a_forward_is_refused() -> None:
    engine = st.initialize(model(), config())
    with pytest.raises(strata.StrataError, match="needs a training forward"):
        engine.backward(torch.zeros((), requires_grad=True))
    engine.close()


def test_too_few_gradient_buffers_for_a_tied_model_are_refused() -> None:
    with pytest.raises(st.ConfigError, match="strata.grad_buffers 1 is too "
                       "few.*set it to 2"):
        st.initialize(model(), config(strata={"grad_buffers": 1}))


def test_freezing_a_parameter_after_initialize_is_named() -> None:
    m = model()
    engine = st.initialize(m, config())
    m.blocks[0].fc.bias.requires_grad_(False)
    x, y = data(1)[0]
    with pytest.raises(strata.StrataError, match="blocks.0.fc.bias was "
                       "frozen after initialize"):
        engine(x, y)
    engine.close()


def test_a_model_is_trained_by_one_engine_at_a_time() -> None:
    m = model()
    engine = st.initialize(m, config())
    with pytest.raises(st.ConfigError, match="already trained through"):
        st.initialize(m, config())
    engine.close()
    st.initialize(m, config()).close()


def test_overflowing_at_the_minimum_loss_scale_stops_the_run() -> None:
    engine = st.initialize(model(), config(fp16={
        "enabled": True, "initial_scale_power": 24, "hysteresis": 1,
        "min_loss_scale": 2.0 ** 23}))
    x, y = data(1)[0]
    engine.backward(engine(x, y).loss)
    assert engine.step().skipped and engine.loss_scale == 2.0 ** 23
    engine.backward(engine(x, y).loss)
    with pytest.raises(strata.StrataError, match="minimum loss scale.*"
                       "diverged"):
        engine.step()


def test_a_checkpoint_of_another_config_names_the_cause(
        scratch: Path, nvme: Path) -> None:
    """fp32 state on the host keeps no master; clipping with the state on
    NVMe does (its steps speculate): the roles differ, and the error says
    the config is why."""
    first = st.initialize(model(), config())
    first.save_checkpoint(str(scratch / "ckpt"))
    first.close()
    second = st.initialize(model(), config(
        gradient_clipping=1.0, zero_optimization={"offload_optimizer": {
            "device": "nvme", "nvme_path": str(nvme)}}))
    with pytest.raises(strata.StrataError, match="load it with the model "
                       "and config it was saved with"):
        second.load_checkpoint(str(scratch / "ckpt"))
    second.close()
