"""Python ints checked against the C integer types they go to: the
binding's one guard against ctypes' silent truncation. Internal; used by
strata._native's calls and structs.
"""
from __future__ import annotations

import ctypes as C
import operator
from typing import Any, NamedTuple, Optional, Sequence

# Note [Ints at the C boundary]
# ctypes converts a Python int to a C integer by keeping its low bits: a
# group id of 2**40 fetched group 0, a budget of -1 became 16 EiB and one
# of 2**64 became 0, silently. So every int the binding hands to C goes
# through c_int() first: a function's argument (Library.call, by the
# argtypes declared in _PROTOTYPES), a struct field (Struct.__setattr__)
# and an array's element (int_array). One out of its C type's range raises
# OverflowError, a bool or a non-integer TypeError, naming where it was
# going and the range. Pointer arguments and fields are checked only when
# given an int (a handle or a stream); NULL is None.


class IntRange(NamedTuple):
    """The values a C integer type holds; `pointer`: only ints are
    checked (None and ctypes objects pass as ctypes takes them)."""
    low: int
    high: int
    name: str
    pointer: bool = False


def int_range(ctype: Any) -> Optional[IntRange]:
    """The range of an integer ctypes type (or a pointer's), or None."""
    code = getattr(ctype, "_type_", None)
    if not isinstance(code, str) or code not in "bBhHiIlLqQP":
        return None
    bits = 8 * C.sizeof(ctype)
    if code == "P":
        return IntRange(0, (1 << bits) - 1, "a pointer", pointer=True)
    if code.islower():
        return IntRange(-(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                        f"int{bits}_t")
    return IntRange(0, (1 << bits) - 1, f"uint{bits}_t")


def c_int(value: Any, bounds: IntRange, where: str) -> Any:
    """`value` as an int within `bounds` (Note [Ints at the C boundary])."""
    if bounds.pointer and not isinstance(value, int):
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{where} takes an int, not "
                        f"{type(value).__name__} {value!r}")
    number = operator.index(value)
    if not bounds.low <= number <= bounds.high:
        raise OverflowError(f"{where} = {number} does not fit {bounds.name} "
                            f"({bounds.low} to {bounds.high})")
    return number


def int_array(ctype: Any, values: Sequence[Any], where: str) -> Any:
    """A ctypes array of `values`, each checked like an argument."""
    bounds = int_range(ctype)
    assert bounds is not None, ctype
    return (ctype * len(values))(*[c_int(v, bounds, f"{where}[{i}]")
                                   for i, v in enumerate(values)])


class Struct(C.Structure):
    """A mirror of a C struct whose integer fields take only ints that fit
    (Note [Ints at the C boundary])."""

    _c_name = ""
    _ints: dict[str, IntRange] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        bounds = self._ints.get(name)
        if bounds is not None:
            value = c_int(value, bounds, f"{self._c_name}.{name}")
        super().__setattr__(name, value)
