"""The binding's surface (issue #31 §3, §5): ints beyond the C types are
errors; Engine.save/load and the bytes per tier pair; a with block ended by
an exception raises that exception and frees what it held, swap files go at
the interpreter's exit, Gradients as a context manager; the public API typed
and documented; the distribution's name."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import strata
from strata import _native
from test_optimizer import master, model

ROOT = Path(__file__).resolve().parents[2]
NVME_HOMES = dict.fromkeys(strata.ROLES, "nvme")


def nvme_engine(swap_dir: Path) -> strata.Engine:
    return strata.Engine(device="host", device_budget=1 << 20,
                         host_budget=8 << 20, nvme_budget=8 << 20,
                         swap_dir=str(swap_dir), io_threads=1)


def fill(view: strata.View, value: float) -> None:
    """Writes `value` into every fp32 tensor of the view (the ctypes way:
    NumPy's legacy DLPack import is read-only)."""
    for t in view.tensors:
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * (t.bytes // 4))
                              .from_address(t.data))[:] = value


# ---- ints beyond the C types ------------------------------------------------

def test_int_arguments_beyond_the_c_types_are_errors(
        engine: strata.Engine) -> None:
    """ctypes keeps the low bits: a group id of 2**40 fetched group 0, a
    step of 2**64 set step 0."""
    model(engine)
    with pytest.raises(OverflowError, match=r"strata_group_fetch_on: "
                       r"argument 2 .*int32_t \(-2147483648 to 2147483647\)"):
        engine.fetch(2**40, "host")
    with pytest.raises(OverflowError, match="strata_group_prefetch"):
        engine.prefetch(-2**31 - 1, "host")
    with pytest.raises(TypeError, match="strata_group_evict: argument 2 "
                       "takes an int, not bool"):
        engine.evict(True, "host")
    with pytest.raises(OverflowError, match=r"tensor 'w' shape\[0\] = "
                       r"18446744073709551624 does not fit int64_t"):
        engine.register_group("big", [("w", (2**64 + 8,), "fp32")])
    with strata.Optimizer(engine, threads=1) as opt:
        with pytest.raises(OverflowError, match="strata_optimizer_set_step"):
            opt.step = 2**64
        assert opt.step == 0
        with pytest.raises(OverflowError, match=r"groups\[0\] = 4294967296 "
                           "does not fit int32_t"):
            opt.begin_step(groups={2**32: {"lr": 0.0}})
    assert engine.stats()["fetches"] == 0


@pytest.mark.parametrize("options,match", [
    ({"host_budget": 2**64},
     r"strata_engine_options.host_budget = 18446744073709551616 does not "
     r"fit uint64_t \(0 to 18446744073709551615\)"),
    ({"nvme_budget": -1}, "strata_engine_options.nvme_budget = -1"),
    ({"io_threads": 2**32 + 1}, "strata_engine_options.io_threads"),
])
def test_engine_options_beyond_the_c_types_are_errors(
        options: dict[str, Any], match: str) -> None:
    """-1 became a 16 EiB budget and 2**64 a budget of 0."""
    kwargs = {"device": "host", "device_budget": 1 << 20,
              "host_budget": 1 << 20, **options}
    with pytest.raises(OverflowError, match=match):
        strata.Engine(**kwargs)


def test_option_fields_name_a_float_or_bool_given_for_an_int(
        engine: strata.Engine) -> None:
    with pytest.raises(TypeError, match=r"strata_engine_options.device_budget"
                       r" takes an int, not float"):
        strata.Engine(device="host", device_budget=1.5e6, host_budget=1 << 20)
    with pytest.raises(OverflowError, match="strata_optimizer_options."
                       "micro_batches"):
        strata.Optimizer(engine, micro_batches=2**32 + 1)
    with pytest.raises(TypeError, match="strata_optimizer_options.threads "
                       "takes an int, not bool"):
        strata.Optimizer(engine, threads=True)


# ---- Engine.save/load and stats ---------------------------------------------

def test_engine_save_and_load_round_trip(scratch: Path) -> None:
    swap = scratch / "swap"
    swap.mkdir(mode=0o700)
    with nvme_engine(swap) as e:
        g = e.register_group("layer.0", [("w", (64,), "fp32")],
                             home=NVME_HOMES)
        with e.fetch(g, "host", write=True) as view:
            fill(view, 5.0)
        e.save(str(scratch / "ckpt"), user_state='{"epoch": 3}')
        with e.fetch(g, "host", write=True) as view:
            fill(view, -1.0)
        assert e.load(str(scratch / "ckpt")) == '{"epoch": 3}'
        with e.fetch(g, "host", roles="master") as view:
            assert np.all(np.from_dlpack(view.export("w", "master")) == 5.0)
        assert e.load(str(scratch / "ckpt")) == '{"epoch": 3}'
        with pytest.raises(strata.StrataError, match="strata_engine_load"):
            e.load(str(scratch / "missing"))


def test_stats_give_the_bytes_per_tier_pair_and_role(scratch: Path) -> None:
    with nvme_engine(scratch) as e:
        g = e.register_group("layer.0", [("w", (1024,), "fp32")],
                             roles="compute", home={"compute": "nvme"})
        with e.fetch(g, "host", write=True) as view:
            fill(view, 1.0)
        e.evict(g, "host")
        e.drain()
        with e.fetch(g, "device"):
            pass
        stats = e.stats()
    moved = stats["bytes"]
    assert set(moved) == set(strata.TIERS)
    assert all(set(row) == set(strata.TIERS) for row in moved.values())
    # Written back to the swap file, read from it, copied to the device.
    assert moved["host"]["nvme"] == moved["nvme"]["host"] == 4096
    assert moved["host"]["device"] == 4096
    assert moved["device"]["nvme"] == moved["device"]["host"] == 0
    # All of it the compute copy's: per role, as the C++ API counts.
    assert set(stats["role_bytes"]) == set(strata.ROLES)
    assert stats["role_bytes"]["compute"] == moved
    assert all(n == 0 for role, table in stats["role_bytes"].items()
               if role != "compute" for row in table.values()
               for n in row.values())


# ---- with blocks ended by an exception, and the interpreter's exit ----------

class Mine(Exception):
    pass


def test_an_exception_ends_the_engine_and_frees_what_it_held(
        scratch: Path) -> None:
    """The user's exception propagates (it used to be replaced by the
    close's "views unreleased"); the view held is released, an open step
    aborted, the optimizer and engine closed, and the swap files go."""
    with pytest.raises(Mine):
        with nvme_engine(scratch) as e:
            g = e.register_group("layer.0", [("w", (1024,), "fp32")],
                                 home=NVME_HOMES)
            view = e.fetch(g, "host")
            opt = strata.Optimizer(e, threads=1)
            opt.begin_step()
            grads = opt.acquire_gradients(g)
            assert os.listdir(scratch)
            raise Mine()
    assert os.listdir(scratch) == []
    view.release()  # released by the engine's exit already: a no-op
    opt.close()
    with pytest.raises(strata.StrataError, match="handed off already"):
        grads.handle
    with pytest.raises(strata.StrataError, match="engine is closed"):
        e.fetch(g, "host")


def test_without_an_exception_a_held_view_still_refuses_close(
        scratch: Path) -> None:
    """A view left unreleased by code that ran to its end is a bug to see;
    close(force=True) is how to free everything anyway."""
    with pytest.raises(strata.StrataError, match="release"):
        with nvme_engine(scratch) as e:
            e.fetch(e.register_group("g", [("w", (8,), "fp32")]), "host")
    assert os.listdir(scratch)
    e.close(force=True)
    assert os.listdir(scratch) == []


def test_a_close_failing_after_an_exception_is_a_warning(
        scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _native.Library.call

    def failing_close(self: Any, name: str, *args: Any) -> None:
        if name == "strata_engine_close":
            raise strata.StrataError(13, "internal", "close failed here")
        real(self, name, *args)

    monkeypatch.setattr(_native.Library, "call", failing_close)
    with pytest.warns(RuntimeWarning, match="after Mine.*close failed here"):
        with pytest.raises(Mine):
            with nvme_engine(scratch) as e:
                raise Mine()
    monkeypatch.undo()
    e.close()
    assert os.listdir(scratch) == []


def test_an_exception_ends_the_optimizer_with_its_step_aborted(
        engine: strata.Engine) -> None:
    model(engine)
    before = master(engine, 0)
    with pytest.raises(Mine):
        with strata.Optimizer(engine, threads=1, clip_norm=1.0) as opt:
            opt.begin_step()
            opt.acquire_gradients(1)
            raise Mine()
    assert np.array_equal(master(engine, 0), before)
    engine.close()  # nothing of the optimizer is left


def test_gradients_are_handed_off_at_the_end_of_their_with(
        engine: strata.Engine) -> None:
    model(engine)
    with strata.Optimizer(engine, threads=1) as opt:
        opt.begin_step(lr=1e-3)
        for g in (1, 0):
            with opt.acquire_gradients(g) as grads:
                assert isinstance(grads, strata.Gradients)
                np.ctypeslib.as_array(
                    (np.ctypeslib.ctypes.c_float * (grads.bytes // 4))
                    .from_address(grads.data))[:] = 1.0
        assert opt.finish_step().step == 1
        assert np.allclose(master(engine, 0), -1e-3, atol=1e-7)
        # Handed off inside the block: the exit leaves it.
        opt.begin_step()
        for g in (1, 0):
            with opt.acquire_gradients(g) as grads:
                opt.hand_off(grads)
        opt.finish_step()
        # An exception leaves the buffer to abort_step: gradients half
        # written must not reach an update.
        opt.begin_step()
        with pytest.raises(Mine):
            with opt.acquire_gradients(1) as grads:
                raise Mine()
        with pytest.raises(strata.StrataError, match="hand each off"):
            opt.close()
        opt.abort_step()
        # One made by hand does not know where to hand itself off.
        opt.begin_step()
        grads = opt.acquire_gradients(1)
        with pytest.raises(strata.StrataError, match="does not know its "
                           "optimizer"):
            with strata.Gradients(grads.handle):
                pass
        opt.abort_step()


EXIT_SCRIPT = """
import os, sys, strata
homes = dict.fromkeys(strata.ROLES, "nvme")
def engine(swap_dir):
    e = strata.Engine(device="host", device_budget=1 << 20,
                      host_budget=8 << 20, nvme_budget=8 << 20,
                      swap_dir=swap_dir, io_threads=1)
    return e, e.register_group("layer.0", [("w", (1024,), "fp32")],
                               home=homes)
kept, g = engine(sys.argv[1])
view = kept.fetch(g, "host")
array = view.numpy("w")  # a global: alive when the atexit handlers run
opt = strata.Optimizer(kept, threads=1)
opt.begin_step()
grads = opt.acquire_gradients(g)
engine(sys.argv[2])[0].fetch(0, "host")  # no one holds them
assert os.listdir(sys.argv[1]) and os.listdir(sys.argv[2])
if sys.argv[3] == "raise":
    raise RuntimeError("the script's own error")
"""


@pytest.mark.parametrize("end", ["return", "raise"])
def test_swap_files_go_at_the_interpreters_exit(scratch: Path,
                                                end: str) -> None:
    """An engine never closed, with a view held (and an array of it in a
    global), an optimizer with a buffer acquired mid-step, and one no
    Python object refers to any more: at exit every swap file and lock
    goes (they used to stay until the next open of the directory)."""
    kept, dropped = scratch / "kept", scratch / "dropped"
    kept.mkdir(mode=0o700)
    dropped.mkdir(mode=0o700)
    out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(kept),
                          str(dropped), end], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == (1 if end == "raise" else 0), out.stderr
    assert "the script's own error" in out.stderr or end == "return"
    assert "Warning" not in out.stderr and "ignored" not in out.stderr
    assert os.listdir(kept) == [] and os.listdir(dropped) == []


FORK_SCRIPT = """
import os, sys, strata
e = strata.Engine(device="host", device_budget=1 << 20, host_budget=8 << 20,
                  nvme_budget=8 << 20, swap_dir=sys.argv[1], io_threads=1)
g = e.register_group("layer.0", [("w", (1024,), "fp32")],
                     home=dict.fromkeys(strata.ROLES, "nvme"))
child = os.fork()
if child == 0:
    sys.exit(0)  # the child's exit runs the atexit handlers
assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
assert os.listdir(sys.argv[1])
with e.fetch(g, "host"):
    pass
e.close()
"""


def test_a_forked_childs_exit_leaves_the_parents_engine(
        scratch: Path) -> None:
    """The child's exit must not close the engine it inherited (removing
    the swap files the parent still uses)."""
    out = subprocess.run([sys.executable, "-c", FORK_SCRIPT, str(scratch)],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr
    assert os.listdir(scratch) == []


# ---- the package ------------------------------------------------------------

def public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    yield "info", strata.info
    yield "version", strata.version
    for cls in (strata.Engine, strata.View, strata.Optimizer,
                strata.Gradients, strata.TensorInfo, strata.StrataError):
        for name, member in inspect.getmembers(cls):
            if name.startswith("_") and name not in (
                    "__init__", "__enter__", "__exit__"):
                continue
            if isinstance(member, property):
                yield f"{cls.__name__}.{name}", member.fget
            elif inspect.isfunction(member) and \
                    member.__module__.startswith("strata"):
                yield f"{cls.__name__}.{name}", member


def test_the_public_api_is_typed_and_documented() -> None:
    """py.typed tells type checkers the hints are there (PEP 561), and
    every public function and method has them and a docstring."""
    assert (Path(strata.__file__).parent / "py.typed").is_file()
    untyped, undocumented = [], []
    for name, function in public_callables():
        signature = inspect.signature(function)
        params = [p for p in signature.parameters.values()
                  if p.name != "self"]
        if signature.return_annotation is inspect.Signature.empty or any(
                p.annotation is inspect.Parameter.empty for p in params):
            untyped.append(name)
        if not name.split(".")[-1].startswith("_") and not function.__doc__:
            undocumented.append(name)
    assert untyped == [] and undocumented == []


def test_the_distribution_is_strata_offload_and_ships_py_typed() -> None:
    """`strata` on the package index is someone else's project."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["name"] == "strata-offload"
    assert "distribution is named `strata-offload`" in " ".join(
        (ROOT / "README.md").read_text().split())
    # scikit-build-core puts every file of wheel.packages that git does not
    # ignore into the wheel.
    packages = project["tool"]["scikit-build"]["wheel"]["packages"]
    assert "python/strata" in packages
    ignored = subprocess.run(["git", "check-ignore", "-q",
                              "python/strata/py.typed"], cwd=ROOT)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 1, "python/strata/py.typed is git-ignored"
