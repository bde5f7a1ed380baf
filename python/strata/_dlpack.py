"""DLPack exports of strata memory for torch.from_dlpack and
numpy.from_dlpack: the capsules, and NumPy arrays that cannot outlive it.

Note [Exports from Python]
An Exported makes its DLPack tensor at once (so that its device is known)
and hands it out once, through __dlpack__: as DLPack 1.0's versioned
tensor ("dltensor_versioned") to a consumer that asks for it with
max_version (NumPy >= 2.1, torch >= 2.6), else as the legacy
DLManagedTensor. Only the versioned form carries the read-only flag, so
NumPy gives a writable array for a write view or a gradient buffer and a
read-only one for a read view. The capsules have no destructor (see
sweep()). Every export holds the memory it points into until its deleter
runs (Note [Exports hold their memory] in
src/capi/handles.h): an array outliving its view's release keeps the
fetch pinned instead of reading memory given to another group."""
from __future__ import annotations

import ctypes as C
import sys
import threading
from typing import Any, Callable, Optional

from strata._native import DLManagedTensor, DLManagedTensorVersioned

_capsule_new = C.pythonapi.PyCapsule_New
_capsule_is_valid = C.pythonapi.PyCapsule_IsValid
_capsule_get_pointer = C.pythonapi.PyCapsule_GetPointer
_CapsuleDestructor = C.CFUNCTYPE(None, C.c_void_p)
_capsule_new.restype = C.py_object
_capsule_new.argtypes = [C.c_void_p, C.c_char_p, _CapsuleDestructor]
_capsule_is_valid.restype = C.c_int
_capsule_is_valid.argtypes = [C.py_object, C.c_char_p]
_capsule_get_pointer.restype = C.c_void_p
_capsule_get_pointer.argtypes = [C.py_object, C.c_char_p]
# Capsules have no destructor: a consumer that refuses the tensor (NumPy
# and bf16) drops the capsule with its exception set, when Python code run
# by ctypes fails. Capsules handed out and not yet consumed are kept here
# instead, and freed by sweep() once only this list holds them (nothing can
# consume them any more); a consumer renames the capsule it takes.
_NO_DESTRUCTOR = _CapsuleDestructor(0)
_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"
_USED = {_LEGACY: b"used_dltensor", _VERSIONED: b"used_dltensor_versioned"}
_KDL_UINT = 1  # DLDataTypeCode kDLUInt
_KDL_BFLOAT = 4  # kDLBfloat
_handed_out: list[tuple[Any, bytes]] = []
_lock = threading.Lock()  # over _handed_out
_capsule_set_name = C.pythonapi.PyCapsule_SetName
_capsule_set_name.restype = C.c_int
_capsule_set_name.argtypes = [C.py_object, C.c_char_p]


def _delete(pointer: int, versioned: bool) -> None:
    struct = DLManagedTensorVersioned if versioned else DLManagedTensor
    struct.from_address(pointer).deleter(pointer)


def sweep() -> None:
    """Frees the tensors of capsules that were handed out and dropped
    unconsumed, and forgets the consumed ones. Each is renamed as used
    before its tensor is freed, so a late consumer gets an error, not
    freed memory."""
    with _lock:
        pending = list(_handed_out)
        _handed_out.clear()
    kept, dead = [], []
    for entry in pending:
        capsule, name = entry
        if not _capsule_is_valid(capsule, name):
            continue  # consumed: the consumer calls the deleter
        if sys.getrefcount(capsule) > 3:  # pending, `capsule`, the call
            kept.append(entry)
            continue
        dead.append((_capsule_get_pointer(capsule, name), name))
        _capsule_set_name(capsule, _USED[name])
    with _lock:
        _handed_out.extend(kept)
    for pointer, name in dead:
        _delete(pointer, name == _VERSIONED)


# export(versioned, out): the C export call writing its pointer to `out`.
ExportFn = Callable[[bool, Any], None]


class Exported:
    """One strata tensor, handed out once through the DLPack protocol
    (`torch.from_dlpack(exported)`, `numpy.from_dlpack(exported)`). It
    holds the memory it points into until the consumer's tensor (or this
    object, if never consumed) is gone."""

    def __init__(self, export: ExportFn) -> None:
        sweep()
        self._export = export
        self._pointer: Optional[int] = None  # __del__ runs if export fails
        self._pointer = self._make(True)
        tensor = DLManagedTensorVersioned.from_address(self._pointer).dl_tensor
        self._device = (tensor.device.device_type, tensor.device.device_id)
        self._bf16 = (tensor.dtype.code, tensor.dtype.bits) == (_KDL_BFLOAT,
                                                                16)
        self._bits = False  # hand a bf16 tensor out as uint16

    def _make(self, versioned: bool) -> int:
        managed = C.c_void_p()
        self._export(versioned, C.byref(managed))
        assert managed.value is not None
        return managed.value

    def __dlpack__(self, stream: Any = None,
                   max_version: Optional[tuple[int, int]] = None,
                   dl_device: Any = None, copy: Optional[bool] = None) -> Any:
        if self._pointer is None:
            raise RuntimeError("this strata export was consumed already; "
                               "export the tensor again")
        if copy:
            raise BufferError("a strata export is zero-copy; copy the "
                              "tensor the consumer returns instead")
        pointer, self._pointer = self._pointer, None
        if max_version is not None and max_version[0] >= 1:
            return self._hand_out(pointer, True)
        _delete(pointer, True)
        return self._hand_out(self._make(False), False)

    def _hand_out(self, pointer: int, versioned: bool) -> Any:
        struct = DLManagedTensorVersioned if versioned else DLManagedTensor
        if self._bits:
            struct.from_address(pointer).dl_tensor.dtype.code = _KDL_UINT
        name = _VERSIONED if versioned else _LEGACY
        capsule = _capsule_new(pointer, name, _NO_DESTRUCTOR)
        with _lock:
            _handed_out.append((capsule, name))
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device

    def as_bits(self) -> "Exported":
        """A bf16 tensor's export relabelled as uint16 (its raw bits), for
        consumers without a bfloat16 dtype."""
        self._bits = self._bf16
        return self

    def __del__(self) -> None:
        if self._pointer is not None:
            _delete(self._pointer, True)


def to_numpy(exported: Exported, what: str) -> Any:
    """numpy.from_dlpack of `exported`; bf16 through ml_dtypes when it is
    installed, else an error naming the ways out."""
    import numpy
    if not exported._bf16 or exported._bits:
        return numpy.from_dlpack(exported)
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(
            f"{what} is bf16, which NumPy has no dtype for: pass "
            f"bf16_bits=True for its raw bits as uint16, install ml_dtypes "
            f"(then it comes as ml_dtypes.bfloat16), or use "
            f"torch.from_dlpack") from None
    return numpy.from_dlpack(exported.as_bits()).view(ml_dtypes.bfloat16)
