"""cabi/gosym.h is the source of the ABI's constants and structs; python/gosym/_lib.py holds copies.

This checks the copies as Python sees them, after import: every integer #define of gosym.h against
_lib's constant of the same name (RED by operator name), and the layout of gosym_op_desc and
gosym_piece, computed with ctypes from the header's own field list, against _lib's structures and
its struct-packed descriptor. gobackend's TestABIConstants holds the engine's enums to the same
header, so the three agree.
"""

from __future__ import annotations

import ctypes
import re

from conftest import REPO
from gosym import _lib

HEADER = (REPO / "cabi" / "gosym.h").read_text()

CTYPES = {"uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
          "uint64_t": ctypes.c_uint64, "double": ctypes.c_double}


def header_defines() -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"(?m)^#define (GOSYM_\w+) \(?(-?\d+)u?\)?", HEADER)}


def header_struct(name: str) -> type[ctypes.Structure]:
    """A ctypes Structure built from the fields of `typedef struct name {...} name;` in gosym.h."""
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), HEADER, re.S)
    assert body, name
    fields = []
    for line in re.sub(r"/\*.*?\*/", "", body[1], flags=re.S).split(";"):
        m = re.fullmatch(r"\s*(?:const\s+)?(\w+)\s*(\*?)\s*(\w+)\s*", line)
        if m:
            fields.append((m[3], ctypes.c_void_p if m[2] else CTYPES[m[1]]))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def test_constants_match_header():
    defines = header_defines()
    assert len(defines) > 40, defines
    red = {f"GOSYM_RED_{k}": v for k, v in _lib.RED.items()}
    seen = set()
    for name, value in defines.items():
        short = name.removeprefix("GOSYM_")
        have = red[name] if short.startswith("RED_") else getattr(_lib, short, None)
        assert have == value, f"{name} is {value} in gosym.h, {have} in _lib"
        seen.add(name)
    assert set(red) <= seen, f"_lib.RED has operators gosym.h lacks: {set(red) - seen}"


def test_struct_layouts_match_header():
    for cname, ours in (("gosym_piece", _lib.Piece), ("gosym_op_desc", _lib.OpDesc)):
        theirs = header_struct(cname)
        assert [f[0] for f in theirs._fields_] == [f[0] for f in ours._fields_], cname
        for fname, _ in theirs._fields_:
            t, o = getattr(theirs, fname), getattr(ours, fname)
            assert (t.offset, t.size) == (o.offset, o.size), f"{cname}.{fname}"
        assert ctypes.sizeof(theirs) == ctypes.sizeof(ours), cname
    desc = header_struct("gosym_op_desc")
    assert _lib.DESC.size == ctypes.sizeof(desc)
    assert _lib.STREAM_AT == desc.stream.offset
