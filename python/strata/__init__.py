"""strata: a heterogeneous-memory offload engine (device, pinned host, NVMe)
with an overlapped CPU optimizer, from Python.

A binding over libstrata's C ABI (include/strata/strata.h) through ctypes,
so one build of the library serves every Python. Errors are StrataError,
carrying strata's status name and message.

    import numpy as np
    import strata
    with strata.Engine(device="host", device_budget=64 << 20,
                       host_budget=256 << 20,
                       device_roles="compute") as engine:
        g = engine.register_group("layer.0", [("w", (1024, 1024), "fp32")])
        with engine.fetch(g, "host", roles="compute", write=True) as view:
            w = view.numpy("w")        # strata's memory, zero-copy
            w[:] = np.random.default_rng(0).normal(0, 0.02, w.shape)
            del w                      # an array holds the fetch
        with strata.Optimizer(engine) as optimizer:
            ...  # begin_step, acquire_gradients, hand_off, finish_step

A group registered with every role (the default) has an fp32 master; one
whose compute copy alone was written starts training from those weights
(the master takes the exact widening: Note [Masters from compute copies]).
"""
from __future__ import annotations

import ctypes as C
from dataclasses import dataclass
from typing import (Any, ContextManager, Iterable, Optional, Sequence,
                    Union)

from strata import _native
from strata._cint import int_array
from strata._dlpack import Exported, to_numpy
from strata._lifetime import (Loan, Tracked, open_engine, untracked,
                              warn_failed)
from strata._native import StrataError, lib, sized

__all__ = ["Engine", "View", "Optimizer", "Gradients", "StepReport",
           "StepChecks", "AbortReport",
           "StrataError", "Exported", "TIERS", "ROLES", "DTYPES", "info",
           "version", "verify_checkpoint", "interrupts_held",
           "__version__"]

TIERS = {"device": 0, "host": 1, "nvme": 2}
ROLES = {"compute": 0, "master": 1, "state1": 2, "state2": 3, "grad": 4}
DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2}
VIEW_DTYPES = {**DTYPES, "u8": 3}  # u8: a view of int8 optimizer state
STATE_DTYPES = {"fp32": 0, "bf16": 1, "int8": 2}
ALL_ROLES = (1 << len(ROLES)) - 1
_DEVICES = {"auto": 0, "cuda": 1, "host": 2}
_ALGOS = {"adam": 0, "adamw": 1, "adagrad": 2, "lion": 3}
_MODES = {"overlap": 0, "after_backward": 1}


def version() -> str:
    """libstrata's version, "major.minor.patch"."""
    parts = [C.c_int32() for _ in range(3)]
    lib().call("strata_version_get", *[C.byref(p) for p in parts])
    return ".".join(str(p.value) for p in parts)


__version__ = "0.1.0"


def interrupts_held() -> ContextManager[None]:
    """SIGINT held back from the code inside until the block ends, except
    in the waits of strata's blocking calls: a Ctrl-C there still ends the
    wait and raises from the call, having changed nothing. Wrap
    Optimizer.finish_step() and your bookkeeping of the step (its count,
    the learning rate schedule) in it, so that a Ctrl-C as the step
    finishes is raised after you counted it, not as if the step had failed
    (Note [Ctrl-C as a step finishes] in strata/_native.py). On the main
    thread with a Python SIGINT handler; elsewhere it does nothing."""
    return lib().interrupts_held()


def verify_checkpoint(path: str) -> None:
    """Checks the checkpoint at `path` (its manifest and every data file's
    size and checksum) as a load does, without an engine; a damaged one
    raises StrataError naming the file."""
    lib().call("strata_checkpoint_verify", path.encode())


def _choice(table: dict[str, int], value: str, what: str) -> int:
    if value not in table:
        raise ValueError(f"unknown {what} {value!r}; use one of "
                         f"{', '.join(table)}")
    return table[value]


def _roles(roles: Union[None, str, Iterable[str]]) -> int:
    if roles is None:
        return ALL_ROLES
    if isinstance(roles, str):
        roles = [roles]
    mask = 0
    for role in roles:
        mask |= 1 << _choice(ROLES, role, "role")
    return mask


def _stream(stream: Any) -> Optional[int]:
    """A cudaStream_t from a torch.cuda.Stream (or an int)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    return int(stream.cuda_stream)


@dataclass
class TensorInfo:
    """One tensor of a view or gradient buffer (strata_tensor_info)."""
    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]
    data: int
    bytes: int
    tier: str
    on_cuda: bool


def _tensor_info(raw: Any) -> TensorInfo:
    by_value = {v: k for k, v in ROLES.items()}
    dtypes = {v: k for k, v in VIEW_DTYPES.items()}
    tiers = {v: k for k, v in TIERS.items()}
    return TensorInfo(raw.name.decode(), by_value[raw.role],
                      dtypes[raw.dtype],
                      tuple(raw.shape[i] for i in range(raw.ndim)),
                      raw.data or 0, raw.bytes, tiers[raw.tier],
                      bool(raw.on_cuda))


class Engine(Tracked):
    """A tiered store (strata::Engine): groups of tensors with a home tier
    per role, fetched to the device or host and released, under budgets.

    Budgets are bytes. `home` maps roles to their home tier (default: the
    host). `swap_dir` is required with `nvme_budget` > 0. `device_roles`
    are the roles that may be fetched to the device (default all): the
    device budget must hold the largest group's fetch of them, so with the
    optimizer on the CPU, device_roles="compute" lets it count the compute
    copies alone. `cuda_device` is the GPU's index (torch's cuda:N) when
    the device is CUDA. `state_dtype` is how the state roles are stored:
    "fp32" (exact), "bf16" (half the bytes, rounded stochastically by the
    optimizer's step) or "int8" (a byte an element and a scale per 256,
    for tensors of 4096 elements or more: views of it are "u8" bytes); a
    checkpoint loads only at its own.

    close() frees it and removes its swap files; it refuses while views
    or optimizers of it are open, unless close(force=True), which releases
    them first (and aborts an optimizer's open step). A with block that an
    exception ends closes with force, so the exception propagates and the
    swap files go; one that ends normally closes without. An engine still
    open at the interpreter's exit is closed with force then."""

    _what = "engine"
    _close_fn = "strata_engine_close"

    def __init__(self, *, device: str = "auto", device_budget: int,
                 host_budget: int, nvme_budget: int = 0,
                 swap_dir: Optional[str] = None,
                 home: Optional[dict[str, str]] = None,
                 device_roles: Union[None, str, Iterable[str]] = None,
                 io_threads: Optional[int] = None,
                 cuda_device: int = 0, state_dtype: str = "fp32") -> None:
        options = _native.EngineOptions()
        lib().call("strata_engine_options_init", C.byref(options))
        options.device = _choice(_DEVICES, device, "device")
        options.cuda_device = cuda_device
        options.device_budget = device_budget
        options.host_budget = host_budget
        options.nvme_budget = nvme_budget
        options.swap_dir = swap_dir.encode() if swap_dir else None
        for role, tier in (home or {}).items():
            options.home[_choice(ROLES, role, "role")] = _choice(
                TIERS, tier, "tier")
        self._homes = list(options.home)  # a group's `home` starts here
        options.device_roles = _roles(device_roles)
        if io_threads is not None:
            options.io_threads = io_threads
        options.state_format = _choice(STATE_DTYPES, state_dtype,
                                       "state_dtype")
        handle = C.c_void_p()
        lib().call("strata_engine_open", C.byref(options), C.byref(handle))
        self._handle: Optional[int] = handle.value
        self._loan = open_engine(self.handle, self)

    def info(self) -> dict[str, Any]:
        """The device, its kind and why it was chosen, the host backing and
        the I/O backend (strata_engine_info)."""
        raw = sized(_native.EngineInfo)
        lib().call("strata_engine_get_info", self.handle, C.byref(raw))
        return {name: (getattr(raw, name).decode()
                       if isinstance(getattr(raw, name), bytes)
                       else getattr(raw, name))
                for name, _ in raw._fields_ if name != "struct_size"}

    def stats(self) -> dict[str, Any]:
        """Counters since open (strata_engine_stats): "tiers" has each
        tier's budget, use and peak; "bytes"[from][to] the bytes moved from
        one tier to another ("bytes"["nvme"]["host"]: read from the swap
        files into host memory); "role_bytes"[role][from][to] the same by
        the role of what moved (the gradient hand-off counts as "grad");
        "discarded_bytes" the dirty bytes dropped unwritten because their
        contents ended (the optimizer's gradients after their step);
        "nvme_bytes_hashed" the bytes the NVMe tier hashed for its
        checksums (every read, and the writes whose checksums the
        optimizer's pass did not take)."""
        raw = sized(_native.EngineStats)
        lib().call("strata_engine_get_stats", self.handle, C.byref(raw))
        tiers = {name: {"budget": raw.tiers[i].budget,
                        "used": raw.tiers[i].used, "peak": raw.tiers[i].peak}
                 for name, i in TIERS.items()}

        def moved(table: Any) -> dict[str, dict[str, int]]:
            return {src: {dst: table[i][j] for dst, j in TIERS.items()}
                    for src, i in TIERS.items()}
        out: dict[str, Any] = {
            "tiers": tiers, "bytes": moved(raw.bytes),
            "role_bytes": {role: moved(raw.role_bytes[r])
                           for role, r in ROLES.items()}}
        for name, _ in raw._fields_:
            if name not in ("struct_size", "reserved", "tiers", "bytes",
                            "role_bytes"):
                out[name] = getattr(raw, name)
        return out

    def explain(self) -> str:
        """The printable plan."""
        needed = C.c_size_t()
        lib().call("strata_engine_explain", self.handle, None, 0,
                   C.byref(needed))
        text = C.create_string_buffer(needed.value)
        lib().call("strata_engine_explain", self.handle, text, needed.value,
                   C.byref(needed))
        return text.value.decode()

    def register_group(self, name: str,
                       tensors: Sequence[tuple[str, Sequence[int], str]],
                       roles: Union[None, str, Iterable[str]] = None,
                       home: Optional[dict[str, str]] = None) -> int:
        """Registers a group of (name, shape, dtype) tensors, each with
        `roles` (default all); `home` overrides some of the engine's homes
        for this group (its device_roles stay the engine's). Returns the
        group's id."""
        specs = (_native.TensorSpec * len(tensors))()
        keep = []
        for spec, (tensor, shape, dtype) in zip(specs, tensors):
            extents = int_array(C.c_int64, shape, f"strata_group_register: "
                                f"tensor {tensor!r} shape")
            keep += [extents, tensor.encode()]
            spec.name = keep[-1]
            spec.shape = extents
            spec.ndim = len(shape)
            spec.dtype = _choice(DTYPES, dtype, "dtype")
            spec.roles = _roles(roles)
        group = _native.GroupSpec()
        lib().call("strata_group_spec_init", C.byref(group))
        group.name = name.encode()
        group.tensors = specs
        group.num_tensors = len(tensors)
        if home:  # over the engine's homes; its device_roles stay
            group.use_default_placement = 0
            group.home[:] = self._homes
            for role, tier in home.items():
                group.home[_choice(ROLES, role, "role")] = _choice(
                    TIERS, tier, "tier")
        out = C.c_int32()
        lib().call("strata_group_register", self.handle, C.byref(group),
                   C.byref(out))
        return out.value

    def fetch(self, group: int, tier: str,
              roles: Union[None, str, Iterable[str]] = None,
              write: bool = False, stream: Any = None) -> "View":
        """Makes the group's `roles` valid at `tier` ("device" or "host")
        and pins them until the view is released."""
        view = C.c_void_p()
        lib().call("strata_group_fetch_on", self.handle, group,
                   _choice(TIERS, tier, "tier"), _roles(roles), int(write),
                   _stream(stream), C.byref(view))
        return View(view.value, self)

    def prefetch(self, group: int, tier: str,
                 roles: Union[None, str, Iterable[str]] = None) -> None:
        """Starts making the group's `roles` valid at `tier` in the
        background, without pinning them; a later fetch waits only for
        what is still in flight. It may evict other groups' unpinned
        copies to make room, and is given up (not an error) when nothing
        can go; an I/O error it meets is raised by the next drain()."""
        lib().call("strata_group_prefetch", self.handle, group,
                   _choice(TIERS, tier, "tier"), _roles(roles))

    def drain(self) -> None:
        """Waits for prefetches, write-behind and queued updates."""
        lib().call("strata_engine_drain", self.handle)

    def begin_step(self) -> None:
        """Starts a training step: the fetches until end_step() are
        recorded as the trace that prefetching follows."""
        lib().call("strata_step_begin", self.handle)

    def end_step(self) -> None:
        """Ends the step begin_step() started."""
        lib().call("strata_step_end", self.handle)

    def evict(self, group: int, tier: str) -> None:
        """Drops the group's copies at `tier` (written back first where
        they are the only valid copy); the group must not be fetched."""
        lib().call("strata_group_evict", self.handle, group,
                   _choice(TIERS, tier, "tier"))

    def save(self, path: str, user_state: str = "") -> None:
        """A checkpoint of every tensor of every group, and `user_state`,
        in the directory `path`; every view must be released. On failure
        the previous checkpoint at `path` is kept."""
        lib().call("strata_engine_save", self.handle, path.encode(),
                   user_state.encode())

    def load(self, path: str) -> str:
        """Loads a checkpoint written by save() into the same groups and
        tensors; returns its user_state. A damaged or mismatched
        checkpoint changes nothing."""
        return _load_checkpoint("strata_engine_load", self.handle, path)


def _load_checkpoint(function: str, handle: int, path: str) -> str:
    """Runs strata_engine_load or strata_optimizer_load and returns the
    checkpoint's user_state (one over 1 MiB costs a second load)."""
    needed = C.c_size_t()
    capacity = 1 << 20
    while True:
        text = C.create_string_buffer(capacity)
        lib().call(function, handle, path.encode(), text, capacity,
                   C.byref(needed))
        if needed.value <= capacity:
            return text.value.decode()
        capacity = needed.value


def _release(handle: int) -> None:
    lib().call("strata_view_release_after", handle, None, None)


class View:
    """One fetched group, pinned until release() (or the end of a with
    block). Its tensors' memory is strata's: do not use it afterwards.
    Made by Engine.fetch; a view its engine does not know of (made by
    hand) is not released by Engine.close(force=True)."""

    def __init__(self, handle: int, engine: Optional[Engine] = None) -> None:
        self._handle = handle  # stays: strata names a released handle
        self._released = False
        self._loan: Loan = (untracked(handle, self) if engine is None else
                            engine._loan.lend(handle, self, _release))
        count = C.c_int32()
        lib().call("strata_view_count_tensors", handle, C.byref(count))
        self.tensors: list[TensorInfo] = []
        for index in range(count.value):
            raw = sized(_native.TensorInfo)
            lib().call("strata_view_get_tensor", handle, index, C.byref(raw))
            self.tensors.append(_tensor_info(raw))

    def _index(self, name: str, role: str) -> int:
        for i, t in enumerate(self.tensors):
            if t.name == name and t.role == role:
                return i
        raise KeyError(f"the view has no tensor {name!r} in role {role}")

    def export(self, name: str, role: str = "compute") -> Exported:
        """Tensor `name` of `role` for torch.from_dlpack or
        numpy.from_dlpack, zero-copy. The tensor made from it holds the
        fetch: after release() the memory stays pinned (never given to
        another group) until that tensor is gone."""
        index = self._index(name, role)
        handle = self._handle
        return Exported(lambda versioned, out: lib().call(
            "strata_view_export_dlpack_versioned" if versioned
            else "strata_view_export_dlpack", handle, index, out))

    def numpy(self, name: str, role: str = "compute", *,
              bf16_bits: bool = False) -> Any:
        """Tensor `name` of `role` as a NumPy array on strata's memory
        (host views only), writable for a write view and read-only for a
        read view; it holds the fetch as export() does. NumPy has no
        bfloat16: a bf16 tensor comes as ml_dtypes.bfloat16 where ml_dtypes
        is installed, or as its raw bits (uint16) with bf16_bits=True."""
        exported = self.export(name, role)
        if bf16_bits:
            return to_numpy(exported.as_bits(), name)
        return to_numpy(exported, f"tensor {name!r} ({role})")

    def release(self, stream: Any = None) -> None:
        """Releases the fetch; with `stream`, after the work queued on it."""
        if not self._released:
            lib().call("strata_view_release_after", self._handle,
                       _stream(stream), None)
            self._loan.forget()

    def _ended(self) -> None:
        self._released = True

    def __enter__(self) -> "View":
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException],
                 traceback: Any) -> None:
        """release(); when an exception ended the block, a failure to
        release is a RuntimeWarning, never raised over the exception."""
        if error is None:
            self.release()
            return
        try:
            self.release()
        except Exception as failure:  # the user's exception goes on
            warn_failed("releasing the view", failure, error)


from strata.optimizer import (AbortReport, Gradients, Optimizer,  # noqa: E402
                              StepChecks, StepReport)
from strata._info import info  # noqa: E402
