"""The offloaded optimizer (strata::OffloadOptimizer) from Python: steps
each group on the CPU as soon as its gradients are handed off."""
from __future__ import annotations

import ctypes as C
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Optional

import weakref

from strata import _native
from strata._cint import int_array
from strata._dlpack import Exported, to_numpy
from strata._lifetime import Loan, Tracked, untracked
from strata._native import StrataError, lib, sized

if TYPE_CHECKING:
    from strata import Engine, TensorInfo


@dataclass
class StepReport:
    """What FinishStep reports (strata_step_report)."""
    step: int
    skipped: bool
    grad_norm: float
    clip_coef: float
    step_seconds: float
    hidden_seconds: float
    finish_wait_seconds: float
    acquire_wait_seconds: float
    speculated: int
    undone: int
    overflow_group: int  # the first group with non-finite gradients, or -1


@dataclass
class StepChecks:
    """One step's gradient checks (strata_step_checks): what finish_step
    decides the norm, clipping and skipping from."""
    sum_squares: float  # of the scaled gradients
    overflow: bool      # some gradient is not finite


@dataclass
class AbortReport:
    """What abort_step left of the step (strata_abort_report). When
    `completed` (it had settled, and stands), the rest is what its
    finish_step would have said."""
    applied: int     # groups whose update stays: the model mixes two steps
    completed: bool  # the step had settled and stands (counted as taken)
    skipped: bool = False
    overflow_group: int = -1
    grad_norm: float = 0.0


class Gradients:
    """A zeroed device buffer for one group's gradients of one micro-batch,
    in the group's compute dtype, each tensor at its compute offset; valid
    until Optimizer.hand_off, or until abort_step ends the step.

    As a context manager it is handed off at the end of the block, as
    hand_off(gradients) with no stream does: the gradients must be written
    by then (on CUDA, hand it off inside the block with the stream that
    wrote them instead). A block that an exception ends leaves it to
    abort_step (Optimizer's with block runs it), so that gradients half
    written never reach an update. Made by Optimizer.acquire_gradients;
    one made by hand, Gradients(handle), does not know its optimizer and
    is no context manager."""

    def __init__(self, handle: int,
                 optimizer: Optional["Optimizer"] = None) -> None:
        from strata import _tensor_info
        self._handle: Optional[int] = handle
        self._arrays: list[weakref.ref] = []  # numpy() arrays, until hand-off
        self._optimizer = optimizer
        self._loan: Loan = (untracked(handle, self) if optimizer is None
                            else optimizer._loan.lend(handle, self))
        raw = sized(_native.GradientsInfo)
        lib().call("strata_gradients_get_info", handle, C.byref(raw))
        self.group: int = raw.group
        self.data: int = raw.data or 0
        self.bytes: int = raw.bytes
        self.on_cuda = bool(raw.on_cuda)
        self.tensors: list[TensorInfo] = []
        for index in range(raw.num_tensors):
            tensor = sized(_native.TensorInfo)
            lib().call("strata_gradients_get_tensor", handle, index,
                       C.byref(tensor))
            self.tensors.append(_tensor_info(tensor))

    @property
    def handle(self) -> int:
        """The strata_gradients handle, until the buffer is handed off."""
        if self._handle is None:
            raise StrataError(9, "failed precondition",
                              "the gradient buffer was handed off already "
                              "(or its step aborted); acquire another")
        return self._handle

    def _ended(self) -> None:
        self._handle = None
        self._end_arrays()

    def __enter__(self) -> "Gradients":
        if self._optimizer is None:
            raise StrataError(9, "failed precondition",
                              "this gradient buffer does not know its "
                              "optimizer (it was made by Gradients(handle)); "
                              "hand it off with optimizer.hand_off, or use "
                              "the one acquire_gradients returns")
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException],
                 traceback: Any) -> None:
        """Hands the buffer off unless it was, or an exception ended the
        block."""
        if error is None and self._handle is not None \
                and self._optimizer is not None:
            self._optimizer.hand_off(self)

    def _export_index(self, name: Optional[str]) -> int:
        if name is None:
            return _native.WHOLE_BUFFER
        names = [t.name for t in self.tensors]
        if name not in names:
            raise KeyError(f"group {self.group} has no tensor {name!r}; "
                           f"it has {', '.join(names)}")
        return names.index(name)

    def export(self, name: Optional[str] = None) -> Exported:
        """Tensor `name`'s slice, or the whole buffer (a 1-D tensor), for
        torch.from_dlpack or numpy.from_dlpack, zero-copy. Write it only
        before hand_off: from then on strata copies the buffer and reuses
        it, and a tensor made from it must be neither written nor read
        (the optimizer's close waits for it to be gone)."""
        index = self._export_index(name)
        handle = self.handle
        return Exported(lambda versioned, out: lib().call(
            "strata_gradients_export_dlpack_versioned" if versioned
            else "strata_gradients_export_dlpack", handle, index, out))

    def numpy(self, name: Optional[str] = None, *,
              bf16_bits: bool = False) -> Any:
        """export(name) as a writable NumPy array (host buffers only). At
        hand_off the array becomes read-only; arrays derived from it
        (views, slices) are the caller's to stop using."""
        exported = self.export(name)
        what = f"the gradients of group {self.group}"
        array = to_numpy(exported.as_bits() if bf16_bits else exported, what)
        self._arrays.append(weakref.ref(array))
        return array

    def _end_arrays(self) -> None:
        """Makes the arrays numpy() handed out read-only (the hand-off)."""
        for ref in self._arrays:
            array = ref()
            if array is not None:
                array.flags.writeable = False
        self._arrays.clear()


def _hyper(values: dict[str, float]) -> Any:
    """A strata_step_hyper with its defaults, then `values`."""
    hyper = _native.StepHyper()
    lib().call("strata_step_hyper_init", C.byref(hyper))
    for name, value in values.items():
        setattr(hyper, name, value)
    return hyper


def _abort_and_close(handle: int) -> None:
    lib().call("strata_optimizer_abort_step", handle,
               C.byref(sized(_native.AbortReport)))
    lib().call("strata_optimizer_close", handle)


class Optimizer(Tracked):
    """CPU Adam, AdamW, Adagrad or Lion over every trainable group of an
    Engine (a group whose tensors carry the state1 role; an fp32 group
    without a master is stepped in place; a group without state1 is
    frozen, and a master of its only keeps its exact fp32 values).

    mode "overlap" steps each group as soon as its gradients are final;
    "after_backward" waits for finish_step. clip_norm > 0 clips the global
    gradient norm; skip_on_overflow skips a step with non-finite gradients.
    Results are bit-identical to the same optimizer in memory.

    close() refuses while gradient buffers are acquired, unless close(
    force=True), which aborts the open step first; a with block that an
    exception ends closes with force, so the exception propagates."""

    _what = "optimizer"
    _close_fn = "strata_optimizer_close"

    def __init__(self, engine: "Engine", *, algo: str = "adamw",
                 mode: str = "overlap", micro_batches: int = 1,
                 clip_norm: float = 0.0, skip_on_overflow: bool = False,
                 threads: int = 0, grad_buffers: int = 2,
                 read_ahead: int = 1, speculate: bool = True) -> None:
        from strata import _ALGOS, _MODES, _choice
        options = _native.OptimizerOptions()
        lib().call("strata_optimizer_options_init", C.byref(options))
        options.algo = _choice(_ALGOS, algo, "optimizer")
        options.mode = _choice(_MODES, mode, "mode")
        options.micro_batches = micro_batches
        options.clip_norm = clip_norm
        options.skip_on_overflow = int(skip_on_overflow)
        options.threads = threads
        options.grad_buffers = grad_buffers
        options.read_ahead = read_ahead
        options.speculate = int(speculate)
        handle = C.c_void_p()
        lib().call("strata_optimizer_create", engine.handle,
                   C.byref(options), C.byref(handle))
        self.engine = engine
        self._handle: Optional[int] = handle.value
        self._loan = engine._loan.lend(self.handle, self, _abort_and_close)

    def begin_step(self, *, lr: float = 1e-3, beta1: float = 0.9,
                   beta2: float = 0.999, eps: float = 1e-8,
                   weight_decay: float = 0.0, lr_decay: float = 0.0,
                   loss_scale: float = 1.0,
                   groups: Optional[dict[int, dict[str, float]]] = None
                   ) -> None:
        """Starts a step with its hyperparameters; the gradients are
        divided by loss_scale. `groups` maps a group id to the
        hyperparameters it steps with instead (any of lr, beta1, beta2,
        eps, weight_decay, lr_decay; the others as given here)."""
        common = {"lr": lr, "beta1": beta1, "beta2": beta2, "eps": eps,
                  "weight_decay": weight_decay, "lr_decay": lr_decay,
                  "loss_scale": loss_scale}
        hyper = _hyper(common)
        if not groups:
            lib().call("strata_optimizer_begin_step", self.handle,
                       C.byref(hyper))
            return
        ids = int_array(C.c_int32, list(groups),
                        "strata_optimizer_begin_step_groups: groups")
        hypers = (_native.StepHyper * len(groups))()
        for i, over in enumerate(groups.values()):
            unknown = set(over) - set(common) | ({"loss_scale"} & set(over))
            if unknown:
                raise ValueError(f"per-group hyperparameters take "
                                 f"{', '.join(sorted(set(common) - {'loss_scale'}))}, "
                                 f"not {', '.join(sorted(unknown))}")
            hypers[i] = _hyper({**common, **over})
        lib().call("strata_optimizer_begin_step_groups", self.handle,
                   C.byref(hyper), ids, hypers, len(groups))

    def acquire_gradients(self, group: int, zeroed: bool = True
                          ) -> Gradients:
        """A gradient buffer for `group`: zeroed, or with `zeroed` False
        holding what its last user left (then write every element of every
        tensor before hand_off: a first gradient copied in, not added,
        saves a pass over the buffer; the bytes between tensors are
        zeroed)."""
        handle = C.c_void_p()
        lib().call("strata_optimizer_acquire_gradients_filled", self.handle,
                   group, _native.GRADIENTS_ZEROED if zeroed
                   else _native.GRADIENTS_UNWRITTEN, C.byref(handle))
        return Gradients(handle.value, self)

    def hand_off(self, gradients: Gradients, stream: Any = None) -> None:
        """Hands the buffer back; `stream` (a torch.cuda.Stream, a
        cudaStream_t as int, or on the host-emulated device a
        strata::HostStream address) is where the kernels writing it were
        queued: the copy waits for them, the call does not."""
        from strata import _stream
        optimizer, handle = self.handle, gradients.handle
        if gradients._optimizer not in (None, self):
            raise StrataError(1, "invalid argument",
                              "the gradient buffer was acquired from another "
                              "optimizer; hand it off to the one it came from")
        gradients._loan.forget()  # the handle ends even if this fails
        lib().call("strata_optimizer_hand_off", optimizer, handle,
                   _stream(stream), None)

    def local_checks(self) -> StepChecks:
        """After every hand-off: this process's gradient checks (the step
        stays open), for ranks to combine and give to finish_step."""
        raw = sized(_native.StepChecks)
        lib().call("strata_optimizer_local_checks", self.handle,
                   C.byref(raw))
        return StepChecks(raw.sum_squares, bool(raw.overflow))

    def finish_step(self, global_checks: Optional[StepChecks] = None
                    ) -> StepReport:
        """Ends the step once every group was handed off; with
        `global_checks` (every rank's local_checks combined: sum_squares
        added, overflow or-ed) it clips and skips by those."""
        raw = sized(_native.StepReport)
        if global_checks is None:
            lib().call("strata_optimizer_finish_step", self.handle,
                       C.byref(raw))
        else:
            checks = sized(_native.StepChecks)
            checks.sum_squares = global_checks.sum_squares
            checks.overflow = int(global_checks.overflow)
            lib().call("strata_optimizer_finish_step_global", self.handle,
                       C.byref(checks), C.byref(raw))
        values = {f.name: getattr(raw, f.name) for f in fields(StepReport)}
        values["skipped"] = bool(values["skipped"])
        return StepReport(**values)

    def abort_step(self) -> AbortReport:
        """Ends the open step without finishing it (after an error or an
        interrupt in forward or backward): hand-offs not yet consumed are
        dropped, speculative updates undone; updates already applied stay
        (counted in `applied`). Between steps it does nothing."""
        raw = sized(_native.AbortReport)
        lib().call("strata_optimizer_abort_step", self.handle, C.byref(raw))
        self._loan.forget_children()
        return AbortReport(raw.applied, bool(raw.completed),
                           bool(raw.skipped), raw.overflow_group,
                           raw.grad_norm)

    @property
    def step(self) -> int:
        """Steps applied so far."""
        out = C.c_int64()
        lib().call("strata_optimizer_get_step", self.handle, C.byref(out))
        return out.value

    @step.setter
    def step(self, value: int) -> None:
        lib().call("strata_optimizer_set_step", self.handle, value)

    def save(self, path: str, user_state: str = "") -> None:
        """A checkpoint of every tensor, the step and `user_state`."""
        lib().call("strata_optimizer_save", self.handle, path.encode(),
                   user_state.encode())

    def load(self, path: str) -> str:
        """Loads a checkpoint written by save(); returns its user_state."""
        from strata import _load_checkpoint
        return _load_checkpoint("strata_optimizer_load", self.handle, path)
