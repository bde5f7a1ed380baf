"""ctypes mirror of strata's C ABI (include/strata/strata.h and
strata_optimizer.h): the library loader, the structs, the prototypes and
the status check. Internal; the public API is strata/__init__.py.

One binding serves every Python: it loads libstrata.so at run time, so the
same library works from Debian's Python 3.11 and any other CPython 3.9+.
python/tests/test_abi.py checks every struct here against the header's
sizes and offsets (tests/capi/abi_layout.c prints them)."""
from __future__ import annotations

import contextlib
import ctypes as C
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator, Optional

from strata._cint import IntRange, Struct, c_int, int_range

NUM_TIERS = 3
NUM_ROLES = 5
WHOLE_BUFFER = -1
GRADIENTS_ZEROED = 0  # strata_gradient_fill
GRADIENTS_UNWRITTEN = 1


CANCELLED = 11  # STRATA_CANCELLED: the interrupt check stopped a wait


class StrataError(Exception):
    """A failed strata call: `status` is the status name ("invalid
    argument", ...), `code` its number, and the message names the problem
    and the fix, prefixed with the C function's name."""

    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.code = code
        self.status = status
        self.message = message


def _struct(name: str, fields: list[tuple[str, Any]]) -> type[Struct]:
    ints = {field: bounds for field, ctype in fields
            if (bounds := int_range(ctype)) is not None}
    return type(name, (Struct,), {"_fields_": fields, "_ints": ints,
                                  "_c_name": name})


EngineOptions = _struct("EngineOptions", [
    ("struct_size", C.c_uint32), ("device", C.c_int32),
    ("cuda_device", C.c_int32), ("swap_files", C.c_int32),
    ("device_budget", C.c_uint64), ("host_budget", C.c_uint64),
    ("nvme_budget", C.c_uint64), ("swap_dir", C.c_char_p),
    ("home", C.c_int32 * NUM_ROLES), ("io_threads", C.c_int32),
    ("prefetch", C.c_int32), ("lock_host", C.c_int32),
    ("numa_node", C.c_int32), ("device_roles", C.c_uint32),
    ("host_to_device_gbps", C.c_double), ("device_to_host_gbps", C.c_double),
    ("nvme_read_gbps", C.c_double), ("nvme_write_gbps", C.c_double),
    ("state_format", C.c_int32)])

EngineInfo = _struct("EngineInfo", [
    ("struct_size", C.c_uint32), ("on_cuda", C.c_int32),
    ("cuda_device", C.c_int32), ("host_locked", C.c_int32),
    ("device", C.c_char_p), ("device_name", C.c_char_p),
    ("device_reason", C.c_char_p), ("host_backing", C.c_char_p),
    ("aio_backend", C.c_char_p)])

TierStats = _struct("TierStats", [
    ("budget", C.c_uint64), ("used", C.c_uint64), ("peak", C.c_uint64)])

EngineStats = _struct("EngineStats", [
    ("struct_size", C.c_uint32), ("reserved", C.c_uint32),
    ("tiers", TierStats * NUM_TIERS),
    ("bytes", (C.c_uint64 * NUM_TIERS) * NUM_TIERS),
    ("fetches", C.c_uint64), ("hits", C.c_uint64),
    ("prefetch_hits", C.c_uint64), ("late_prefetches", C.c_uint64),
    ("prefetches", C.c_uint64), ("evictions", C.c_uint64),
    ("writebacks", C.c_uint64), ("trace_invalidations", C.c_uint64),
    ("steps", C.c_uint64), ("stall_seconds", C.c_double),
    ("update_wait_seconds", C.c_double),
    ("abandoned_prefetches", C.c_uint64),
    ("role_bytes", ((C.c_uint64 * NUM_TIERS) * NUM_TIERS) * NUM_ROLES),
    ("discarded_bytes", C.c_uint64), ("nvme_bytes_hashed", C.c_uint64)])

TensorSpec = _struct("TensorSpec", [
    ("name", C.c_char_p), ("shape", C.POINTER(C.c_int64)),
    ("ndim", C.c_int32), ("dtype", C.c_int32), ("roles", C.c_uint32),
    ("reserved", C.c_uint32)])

GroupSpec = _struct("GroupSpec", [
    ("struct_size", C.c_uint32), ("num_tensors", C.c_int32),
    ("name", C.c_char_p), ("tensors", C.POINTER(TensorSpec)),
    ("use_default_placement", C.c_int32), ("home", C.c_int32 * NUM_ROLES),
    ("device_roles", C.c_uint32)])

TensorInfo = _struct("TensorInfo", [
    ("struct_size", C.c_uint32), ("role", C.c_int32), ("dtype", C.c_int32),
    ("ndim", C.c_int32), ("name", C.c_char_p),
    ("shape", C.POINTER(C.c_int64)), ("data", C.c_void_p),
    ("bytes", C.c_uint64), ("tier", C.c_int32), ("on_cuda", C.c_int32)])

OptimizerOptions = _struct("OptimizerOptions", [
    ("struct_size", C.c_uint32), ("algo", C.c_int32), ("mode", C.c_int32),
    ("micro_batches", C.c_int32), ("skip_on_overflow", C.c_int32),
    ("threads", C.c_int32), ("grad_buffers", C.c_int32),
    ("read_ahead", C.c_int32), ("speculate", C.c_int32),
    ("reserved", C.c_int32), ("clip_norm", C.c_double)])

StepHyper = _struct("StepHyper", [
    ("struct_size", C.c_uint32), ("reserved", C.c_uint32),
    ("lr", C.c_double), ("beta1", C.c_double), ("beta2", C.c_double),
    ("eps", C.c_double), ("weight_decay", C.c_double),
    ("lr_decay", C.c_double), ("loss_scale", C.c_double)])

StepReport = _struct("StepReport", [
    ("struct_size", C.c_uint32), ("skipped", C.c_int32),
    ("step", C.c_int64), ("grad_norm", C.c_double),
    ("clip_coef", C.c_double), ("step_seconds", C.c_double),
    ("hidden_seconds", C.c_double), ("finish_wait_seconds", C.c_double),
    ("acquire_wait_seconds", C.c_double), ("speculated", C.c_int32),
    ("undone", C.c_int32), ("overflow_group", C.c_int32),
    ("reserved", C.c_int32)])

StepChecks = _struct("StepChecks", [
    ("struct_size", C.c_uint32), ("overflow", C.c_int32),
    ("sum_squares", C.c_double)])

AbortReport = _struct("AbortReport", [
    ("struct_size", C.c_uint32), ("applied", C.c_int32),
    ("completed", C.c_int32), ("skipped", C.c_int32),
    ("overflow_group", C.c_int32), ("reserved", C.c_int32),
    ("grad_norm", C.c_double)])

GradientsInfo = _struct("GradientsInfo", [
    ("struct_size", C.c_uint32), ("group", C.c_int32), ("data", C.c_void_p),
    ("bytes", C.c_uint64), ("on_cuda", C.c_int32),
    ("num_tensors", C.c_int32)])

DLDevice = _struct("DLDevice", [
    ("device_type", C.c_int32), ("device_id", C.c_int32)])
DLDataType = _struct("DLDataType", [
    ("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)])
DLTensor = _struct("DLTensor", [
    ("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
    ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
    ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)])
DLManagedTensor = _struct("DLManagedTensor", [
    ("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p),
    ("deleter", C.CFUNCTYPE(None, C.c_void_p))])
DLPackVersion = _struct("DLPackVersion", [
    ("major", C.c_uint32), ("minor", C.c_uint32)])
DLManagedTensorVersioned = _struct("DLManagedTensorVersioned", [
    ("version", DLPackVersion), ("manager_ctx", C.c_void_p),
    ("deleter", C.CFUNCTYPE(None, C.c_void_p)), ("flags", C.c_uint64),
    ("dl_tensor", DLTensor)])

# The structs test_abi.py checks, by their C names.
STRUCTS = {
    "strata_engine_options": EngineOptions,
    "strata_engine_info": EngineInfo,
    "strata_tier_stats": TierStats,
    "strata_engine_stats": EngineStats,
    "strata_tensor_spec": TensorSpec,
    "strata_group_spec": GroupSpec,
    "strata_tensor_info": TensorInfo,
    "strata_optimizer_options": OptimizerOptions,
    "strata_step_hyper": StepHyper,
    "strata_step_report": StepReport,
    "strata_step_checks": StepChecks,
    "strata_abort_report": AbortReport,
    "strata_gradients_info": GradientsInfo,
    "strata_dlpack_versioned": DLManagedTensorVersioned,
}
for _c_name, _mirror in STRUCTS.items():
    _mirror._c_name = _c_name

_P = C.c_void_p
_PROTOTYPES: dict[str, list[Any]] = {
    "strata_version_get": [C.POINTER(C.c_int32)] * 3,
    "strata_set_interrupt_fd": [C.c_int32],
    "strata_engine_options_init": [C.POINTER(EngineOptions)],
    "strata_engine_open": [C.POINTER(EngineOptions), C.POINTER(_P)],
    "strata_engine_close": [_P],
    "strata_engine_close_after_exports": [_P],
    "strata_engine_get_info": [_P, C.POINTER(EngineInfo)],
    "strata_engine_get_stats": [_P, C.POINTER(EngineStats)],
    "strata_engine_explain": [_P, C.c_char_p, C.c_size_t,
                              C.POINTER(C.c_size_t)],
    "strata_engine_drain": [_P],
    "strata_step_begin": [_P],
    "strata_step_end": [_P],
    "strata_group_spec_init": [C.POINTER(GroupSpec)],
    "strata_group_register": [_P, C.POINTER(GroupSpec),
                              C.POINTER(C.c_int32)],
    "strata_group_count": [_P, C.POINTER(C.c_int32)],
    "strata_group_get_bytes": [_P, C.c_int32, C.c_int32,
                               C.POINTER(C.c_uint64)],
    "strata_group_fetch_on": [_P, C.c_int32, C.c_int32, C.c_uint32,
                              C.c_int32, _P, C.POINTER(_P)],
    "strata_group_prefetch": [_P, C.c_int32, C.c_int32, C.c_uint32],
    "strata_group_evict": [_P, C.c_int32, C.c_int32],
    "strata_view_release_after": [_P, _P, _P],
    "strata_view_count_tensors": [_P, C.POINTER(C.c_int32)],
    "strata_view_get_tensor": [_P, C.c_int32, C.POINTER(TensorInfo)],
    "strata_view_export_dlpack": [_P, C.c_int32, C.POINTER(_P)],
    "strata_view_export_dlpack_versioned": [_P, C.c_int32, C.POINTER(_P)],
    "strata_engine_save": [_P, C.c_char_p, C.c_char_p],
    "strata_checkpoint_verify": [C.c_char_p],
    "strata_engine_load": [_P, C.c_char_p, C.c_char_p, C.c_size_t,
                           C.POINTER(C.c_size_t)],
    "strata_optimizer_options_init": [C.POINTER(OptimizerOptions)],
    "strata_step_hyper_init": [C.POINTER(StepHyper)],
    "strata_optimizer_create": [_P, C.POINTER(OptimizerOptions),
                                C.POINTER(_P)],
    "strata_optimizer_close": [_P],
    "strata_optimizer_begin_step": [_P, C.POINTER(StepHyper)],
    "strata_optimizer_begin_step_groups": [
        _P, C.POINTER(StepHyper), C.POINTER(C.c_int32), C.POINTER(StepHyper),
        C.c_int32],
    "strata_optimizer_acquire_gradients": [_P, C.c_int32, C.POINTER(_P)],
    "strata_optimizer_acquire_gradients_filled": [_P, C.c_int32, C.c_int32,
                                                  C.POINTER(_P)],
    "strata_optimizer_hand_off": [_P, _P, _P, _P],
    "strata_optimizer_finish_step": [_P, C.POINTER(StepReport)],
    "strata_optimizer_local_checks": [_P, C.POINTER(StepChecks)],
    "strata_optimizer_finish_step_global": [_P, C.POINTER(StepChecks),
                                            C.POINTER(StepReport)],
    "strata_optimizer_abort_step": [_P, C.POINTER(AbortReport)],
    "strata_optimizer_get_step": [_P, C.POINTER(C.c_int64)],
    "strata_optimizer_set_step": [_P, C.c_int64],
    "strata_optimizer_save": [_P, C.c_char_p, C.c_char_p],
    "strata_optimizer_load": [_P, C.c_char_p, C.c_char_p, C.c_size_t,
                              C.POINTER(C.c_size_t)],
    "strata_gradients_get_info": [_P, C.POINTER(GradientsInfo)],
    "strata_gradients_get_tensor": [_P, C.c_int32, C.POINTER(TensorInfo)],
    "strata_gradients_export_dlpack": [_P, C.c_int32, C.POINTER(_P)],
    "strata_gradients_export_dlpack_versioned": [_P, C.c_int32,
                                                 C.POINTER(_P)],
}


def _candidates() -> list[Path]:
    """Where libstrata.so may be: $STRATA_LIBRARY, beside this package (a
    wheel), then the source tree's build directories."""
    here = Path(__file__).resolve().parent
    out = []
    if os.environ.get("STRATA_LIBRARY"):
        out.append(Path(os.environ["STRATA_LIBRARY"]))
    out.append(here / "lib" / "libstrata.so")
    root = here.parent.parent
    out += [root / "build" / "lib" / "libstrata.so",
            root / "build" / "default" / "lib" / "libstrata.so"]
    return out


# Note [Ctrl-C in strata's waits]
# A thread blocked in a ctypes call runs no Python signal handler, so a
# Ctrl-C during a long wait in strata did nothing. While the main thread
# is in a call that may wait (BLOCKING), Python's wakeup fd (which its
# signal handler writes a byte to for every signal with a Python handler)
# is a pipe that strata watches (strata.h, strata_set_interrupt_fd): the
# wait ends within 100 ms and the call fails with STRATA_CANCELLED, having
# changed nothing. Back in Python the pending handlers run as usual (the
# default SIGINT handler raises KeyboardInterrupt from the call), and when
# none raises the call is made again. The bytes read from the pipe are
# passed on to the wakeup fd that was set before (asyncio's), so no one
# misses a signal. Other threads' calls are not interrupted: Python runs
# signal handlers on the main thread only, and strata looks at the pipe
# only from the thread that set it.
BLOCKING = frozenset({
    "strata_group_fetch_on", "strata_group_evict", "strata_engine_drain",
    "strata_engine_save", "strata_engine_load", "strata_checkpoint_verify",
    "strata_optimizer_acquire_gradients",
    "strata_optimizer_acquire_gradients_filled", "strata_optimizer_finish_step",
    "strata_optimizer_local_checks", "strata_optimizer_finish_step_global",
    "strata_optimizer_abort_step", "strata_optimizer_begin_step",
    "strata_optimizer_begin_step_groups",
    "strata_optimizer_save", "strata_optimizer_load"})
# Note [Ctrl-C as a step finishes]
# A KeyboardInterrupt raised after a blocking call succeeded, on its way
# back up through Python, would tell the caller that the call failed when
# it did not: after strata_optimizer_finish_step, a step that stands in
# strata but not in strata.torch's count, its LR schedule or the caller's
# data (abort_step between steps does nothing). Inside interrupts_held()
# SIGINT's handler only records the signal. One that comes during a
# blocking call still ends its wait (the wakeup fd is written whatever the
# handler) and is handed to the real handler then, as is one recorded just
# before such a call; one recorded after a call succeeded is handed over
# when the block ends, once the caller's bookkeeping is done.
Handler = Callable[[int, Optional[FrameType]], Any]
_check_signals = C.pythonapi.PyErr_CheckSignals
_check_signals.restype = C.c_int
_check_signals.argtypes = []


class Library:
    """The loaded libstrata with typed functions; `call` raises
    StrataError on a failed status, or what a signal handler raises when a
    signal ends one of its waits (Note [Ctrl-C in strata's waits])."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = C.CDLL(str(path))
        self._lib.strata_last_error.restype = C.c_char_p
        self._lib.strata_status_name.restype = C.c_char_p
        self._lib.strata_status_name.argtypes = [C.c_int]
        self._ints: dict[str, list[tuple[int, IntRange]]] = {}
        for name, argtypes in _PROTOTYPES.items():
            function = getattr(self._lib, name)
            function.argtypes = argtypes
            function.restype = C.c_int
            self._ints[name] = [(i, bounds) for i, t in enumerate(argtypes)
                                if (bounds := int_range(t)) is not None]
        self._wake_read, self._wake_write = os.pipe2(
            os.O_NONBLOCK | os.O_CLOEXEC)
        self._armed = False  # the main thread's waits look at the pipe
        # Inside interrupts_held(): SIGINT's real handler and the frames
        # of the signals recorded (Note [Ctrl-C as a step finishes]).
        self._held: Optional[tuple[Handler, list[Optional[FrameType]]]] = None

    def status_name(self, code: int) -> str:
        return self._lib.strata_status_name(code).decode()

    def call(self, name: str, *args: Any) -> None:
        function = getattr(self._lib, name)
        if self._ints.get(name):  # undeclared (tests): unchecked
            args = self._checked(name, args)
        blocking = name in BLOCKING and \
            threading.current_thread() is threading.main_thread()
        if blocking:
            self._hand_over()
        code = self._watched(function, args) if blocking else function(*args)
        while code == CANCELLED and blocking:
            _check_signals()  # raises what a handler raises
            self._hand_over()
            code = self._watched(function, args)
        if code != 0:
            raise StrataError(code, self.status_name(code),
                              self._lib.strata_last_error().decode())

    @contextlib.contextmanager
    def interrupts_held(self) -> Iterator[None]:
        """SIGINT held back from the code inside, but not from its blocking
        calls' waits (Note [Ctrl-C as a step finishes]). On the main
        thread, with a Python handler for SIGINT; else it does nothing."""
        previous = signal.getsignal(signal.SIGINT)
        if self._held is not None or not callable(previous) or \
                threading.current_thread() is not threading.main_thread():
            yield
            return
        self._held = (previous, [])
        signal.signal(signal.SIGINT, self._record)
        try:
            yield
        finally:
            try:  # a signal pending here goes to `previous` at once
                signal.signal(signal.SIGINT, previous)
                self._hand_over()
            finally:
                self._held = None

    def _record(self, signum: int, frame: Optional[FrameType]) -> None:
        assert self._held is not None
        self._held[1].append(frame)

    def _hand_over(self) -> None:
        """The SIGINTs recorded so far to the real handler, which may
        raise."""
        if self._held is None:
            return
        handler, frames = self._held
        taken, frames[:] = list(frames), []
        for frame in taken:
            handler(signal.SIGINT, frame)

    def _checked(self, name: str,
                 args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The int arguments checked against their C types (Note [Ints at
        the C boundary]), numbered from 1 as in strata.h."""
        out = list(args)
        for i, bounds in self._ints[name]:
            if i < len(out):
                out[i] = c_int(out[i], bounds, f"{name}: argument {i + 1}")
        return tuple(out)

    def _watched(self, function: Any, args: tuple) -> int:
        """function(*args) with signals waking strata's waits (on the main
        thread; a call from a signal handler inside one is already
        watched)."""
        if not self._armed:
            self._lib.strata_set_interrupt_fd(self._wake_read)
            self._armed = True
        previous = signal.set_wakeup_fd(self._wake_write,
                                        warn_on_full_buffer=False)
        if previous == self._wake_write:
            return function(*args)
        try:
            return function(*args)
        finally:
            signal.set_wakeup_fd(previous)
            self._drain(previous)

    def _drain(self, forward: int) -> None:
        while True:
            try:
                data = os.read(self._wake_read, 512)
            except BlockingIOError:
                return
            if forward >= 0:
                try:
                    os.write(forward, data)
                except OSError:
                    pass  # its reader's buffer is full: it has signals


_library: Optional[Library] = None


def lib() -> Library:
    """The process's libstrata, loaded on first use."""
    global _library
    if _library is None:
        tried = _candidates()
        found = next((p for p in tried if p.is_file()), None)
        if found is None:
            raise ImportError(
                "libstrata.so not found; looked at " +
                ", ".join(str(p) for p in tried) +
                "; build it (cmake --preset default && cmake --build "
                "--preset default), install the package with `pip install "
                ".`, or set STRATA_LIBRARY to its path")
        _library = Library(found)
    return _library


class Owned:
    """A strata object behind a C handle, freed by the C function named
    `_close_fn` (close(), or the end of a with block)."""

    _what = "object"
    _close_fn = ""
    _handle: Optional[int] = None

    @property
    def handle(self) -> int:
        """The C handle, until close()."""
        if self._handle is None:
            raise StrataError(9, "failed precondition",
                              f"the {self._what} is closed")
        return self._handle

    def close(self) -> None:
        """Frees it; a second close does nothing. strata refuses while
        something still borrows it (an optimizer, a view, a gradient
        buffer), naming what to close first."""
        if self._handle is not None:
            lib().call(self._close_fn, self._handle)
            self._handle = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def sized(struct: type) -> Any:
    """An output struct, zeroed, with struct_size set."""
    out = struct()
    out.struct_size = C.sizeof(struct)
    return out
