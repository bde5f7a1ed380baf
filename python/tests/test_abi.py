"""The Python mirrors of strata.h's structs match the header: sizes and
field offsets as the C compiler lays them out (tests/capi/abi_layout.c,
whose path CTest passes in STRATA_ABI_LAYOUT)."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess

import pytest

from strata import _native


def c_layout() -> dict:
    program = os.environ.get("STRATA_ABI_LAYOUT")
    if not program:
        pytest.skip("STRATA_ABI_LAYOUT is not set; run through CTest")
    return json.loads(subprocess.run([program], check=True,
                                     capture_output=True, text=True).stdout)


def mismatches(layout: dict, structs: dict) -> list[str]:
    out = [f"{name}: only in C" for name in set(layout) - set(structs)]
    out += [f"{name}: only in Python" for name in set(structs) - set(layout)]
    for name in set(layout) & set(structs):
        struct, c = structs[name], layout[name]
        if ctypes.sizeof(struct) != c["size"]:
            out.append(f"{name}: {ctypes.sizeof(struct)} bytes in Python, "
                       f"{c['size']} in C")
        python = {f: getattr(struct, f).offset for f, _ in struct._fields_}
        if python != c["fields"]:
            out.append(f"{name}: offsets {python} in Python, "
                       f"{c['fields']} in C")
    return out


def test_every_struct_matches_the_header() -> None:
    assert mismatches(c_layout(), _native.STRUCTS) == []


def test_a_drifted_mirror_is_caught() -> None:
    fields = _native.StepReport._fields_
    for drifted in ([f for f in fields if f[0] != "undone"],
                    [fields[0], fields[2], fields[1]] + fields[3:]):
        structs = dict(_native.STRUCTS)
        structs["strata_step_report"] = _native._struct("Drifted", drifted)
        assert mismatches(c_layout(), structs) != []
