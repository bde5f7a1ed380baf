#!/usr/bin/python3
"""DLPack round trip through strata's C ABI, from Python via ctypes.

Usage: dlpack_roundtrip.py LIBSTRATA_SO SCRATCH_ROOT

Opens a host-emulated engine, registers a group homed on NVMe, fetches it
to the device for writing, exports its tensors with
strata_view_export_dlpack and wraps them with numpy.from_dlpack (fp32) and
torch.utils.dlpack.from_dlpack (bf16 and fp32, when torch imports). It
writes through those arrays, releases, evicts down to NVMe, fetches again
through the host and checks with the C API that every byte written through
numpy and torch is there: the exported arrays were strata's memory, not
copies.

Exit status: 0 pass, 1 fail, 77 skip (numpy is missing).
"""
import ctypes
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

try:
    import numpy as np
except ImportError as error:
    print(f"SKIP: numpy does not import ({error}); install python3-numpy")
    sys.exit(77)

try:
    import torch
    import torch.utils.dlpack
except ImportError as error:
    torch = None
    TORCH_MISSING = str(error)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
from strata._dlpack import Exported, sweep  # noqa: E402
from strata._native import (EngineOptions, GroupSpec,  # noqa: E402
                            Library, StrataError, TensorInfo, TensorSpec)

C = ctypes
NUM_ROLES = 5
TIER_DEVICE, TIER_HOST = 0, 1
TIER_NVME = 2
DTYPE_FLOAT32, DTYPE_BFLOAT16 = 0, 1
ROLE_COMPUTE, ROLE_MASTER = 0, 1
ALL_ROLES = (1 << NUM_ROLES) - 1
DEVICE_HOST = 2
INVALID_ARGUMENT = 1
MIB = 1 << 20


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)


def writable_alias(array):
    """numpy 1.24 makes from_dlpack arrays read-only (DLPack 0.6 has no
    read-only flag); an alias of the same memory is writable."""

    class Interface:
        pass

    interface = Interface()
    spec = dict(array.__array_interface__)
    spec["data"] = (spec["data"][0], False)
    interface.__array_interface__ = spec
    alias = np.asarray(interface)
    expect(np.shares_memory(alias, array), "the alias copied the array")
    return alias


class Strata:
    """The C calls through the package's ctypes mirror (python/strata)."""

    def __init__(self, path):
        self.library = Library(Path(path))
        self.lib = self.library._lib

    def call(self, name, *args):
        self.library.call(name, *args)

    def tensors(self, view):
        """{(name, role): (index, TensorInfo)} of a view."""
        count = C.c_int32()
        self.call("strata_view_count_tensors", view, C.byref(count))
        out = {}
        for index in range(count.value):
            info = TensorInfo(struct_size=C.sizeof(TensorInfo))
            self.call("strata_view_get_tensor", view, index, C.byref(info))
            out[(info.name.decode(), info.role)] = (index, info)
        return out

    def export(self, view, index):
        return Exported(lambda versioned, out: self.call(
            "strata_view_export_dlpack_versioned" if versioned
            else "strata_view_export_dlpack", view, index, out))


def open_engine(strata, swap_dir):
    options = EngineOptions()
    strata.call("strata_engine_options_init", C.byref(options))
    expect(options.struct_size == C.sizeof(EngineOptions),
           "EngineOptions here differs from strata_engine_options")
    options.device = DEVICE_HOST
    options.device_budget = 1 * MIB
    options.host_budget = 2 * MIB
    options.nvme_budget = 8 * MIB
    options.swap_dir = swap_dir.encode()
    options.home[ROLE_COMPUTE] = TIER_NVME
    options.home[ROLE_MASTER] = TIER_NVME
    engine = C.c_void_p()
    strata.call("strata_engine_open", C.byref(options), C.byref(engine))
    return engine


def register_group(strata, engine):
    both = (1 << ROLE_COMPUTE) | (1 << ROLE_MASTER)
    shapes = {"w": (C.c_int64 * 2)(64, 32), "b": (C.c_int64 * 1)(32)}
    specs = (TensorSpec * 2)(
        TensorSpec(b"w", shapes["w"], 2, DTYPE_BFLOAT16, both, 0),
        TensorSpec(b"b", shapes["b"], 1, DTYPE_FLOAT32, both, 0))
    spec = GroupSpec()
    strata.call("strata_group_spec_init", C.byref(spec))
    expect(spec.struct_size == C.sizeof(GroupSpec),
           "GroupSpec here differs from strata_group_spec")
    spec.name = b"layer.0"
    spec.tensors = specs
    spec.num_tensors = 2
    group = C.c_int32(-1)
    strata.call("strata_group_register", engine, C.byref(spec),
                C.byref(group))
    return group.value


def check_shape(array_shape, info, what):
    expect(tuple(array_shape) == tuple(info.shape[:info.ndim]),
           f"{what}: shape {tuple(array_shape)}")


def write_with_numpy(strata, view, tensors, expected):
    """Every fp32 tensor: from_dlpack, check, write a pattern."""
    for (name, role), (index, info) in tensors.items():
        if info.dtype != DTYPE_FLOAT32:
            continue  # numpy has no bfloat16
        array = np.from_dlpack(strata.export(view, index))
        what = f"numpy view of {name}/{role}"
        check_shape(array.shape, info, what)
        expect(array.dtype == np.float32, f"{what}: dtype {array.dtype}")
        expect(array.nbytes == info.bytes, f"{what}: {array.nbytes} bytes")
        expect(array.ctypes.data == info.data, f"{what}: not zero-copy")
        expect(not array.any(), f"{what}: a new chunk is not zeros")
        pattern = (np.arange(array.size, dtype=np.float32) * 0.25 +
                   100 * role + len(name)).reshape(array.shape)
        writable_alias(array)[...] = pattern
        expect(np.array_equal(array, pattern), f"{what}: write not visible")
        expected[(name, role)] = pattern.tobytes()


def write_with_torch(strata, view, tensors, expected):
    """The bf16 compute copy: from_dlpack, check, write; and torch reads
    back what numpy wrote into an fp32 tensor."""
    index, info = tensors[("w", ROLE_COMPUTE)]
    tensor = torch.utils.dlpack.from_dlpack(strata.export(view, index))
    check_shape(tensor.shape, info, "torch view of w")
    expect(tensor.dtype == torch.bfloat16, f"torch dtype {tensor.dtype}")
    expect(tensor.data_ptr() == info.data, "torch view is not zero-copy")
    pattern = (torch.arange(tensor.numel(), dtype=torch.float32) - 500)
    pattern = pattern.reshape(tensor.shape).to(torch.bfloat16)
    tensor.copy_(pattern)
    expected[("w", ROLE_COMPUTE)] = pattern.view(torch.int16).numpy().tobytes()

    index, info = tensors[("b", ROLE_MASTER)]
    master = torch.utils.dlpack.from_dlpack(strata.export(view, index))
    expect(master.dtype == torch.float32 and master.data_ptr() == info.data,
           "torch view of b/master")
    expect(master.numpy().tobytes() == expected[("b", ROLE_MASTER)],
           "torch does not see what numpy wrote")


def verify(strata, engine, group, expected):
    view = C.c_void_p()
    strata.call("strata_group_fetch", engine, group, TIER_HOST, ALL_ROLES, 0,
                C.byref(view))
    try:
        for key, (_, info) in strata.tensors(view).items():
            got = C.string_at(info.data, info.bytes)
            want = expected.get(key, bytes(info.bytes))
            expect(got == want, f"{key}: bytes differ after the round trip")
    finally:
        strata.call("strata_view_release", view)


def round_trip(strata, swap_dir):
    engine = open_engine(strata, swap_dir)
    group = register_group(strata, engine)
    view = C.c_void_p()
    status = strata.lib.strata_group_fetch(engine, group + 1, TIER_DEVICE,
                                           ALL_ROLES, 1, C.byref(view))
    expect(status == INVALID_ARGUMENT and strata.lib.strata_last_error(),
           "a bad group id is not STRATA_INVALID_ARGUMENT with a message")
    strata.call("strata_group_fetch", engine, group, TIER_DEVICE, ALL_ROLES,
                1, C.byref(view))
    tensors = strata.tensors(view)
    expect(len(tensors) == 4, f"{len(tensors)} tensors in the view")
    expected = {}
    write_with_numpy(strata, view, tensors, expected)
    if torch is not None:
        write_with_torch(strata, view, tensors, expected)
    else:
        print(f"note: torch does not import ({TORCH_MISSING}); "
              "the bf16 export is not checked")
    # A capsule nobody consumed frees its tensor at the next sweep.
    strata.export(view, 0).__dlpack__()
    # The arrays hold the fetch (Note [Exports hold their memory]): once
    # they are gone the release is whole and the group can be evicted.
    gc.collect()
    sweep()
    strata.call("strata_view_release", view)
    for tier in (TIER_DEVICE, TIER_HOST):
        strata.call("strata_group_evict", engine, group, tier)
    strata.call("strata_engine_drain", engine)
    verify(strata, engine, group, expected)
    strata.call("strata_engine_close", engine)
    return len(expected)


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    strata = Strata(argv[1])
    root = os.environ.get("STRATA_TEST_TMPDIR") or argv[2]
    os.makedirs(root, exist_ok=True)
    swap_dir = tempfile.mkdtemp(prefix="capi-py-", dir=root)
    try:
        checked = round_trip(strata, swap_dir)
    except (Failure, StrataError) as failure:
        print(f"FAILED: {failure}")
        return 1
    finally:
        shutil.rmtree(swap_dir, ignore_errors=True)
    print(f"dlpack_roundtrip: OK ({checked} tensors written through "
          "DLPack and read back through the C API)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
