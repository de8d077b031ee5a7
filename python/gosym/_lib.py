"""Loads libgosym.so once and declares every function of cabi/gosym.h.

ctypes.CDLL releases the GIL for the duration of every call, so a rank blocked
in gosym_work_wait or gosym_endpoint_connect never stalls other Python threads.
This module is the only place that knows the C ABI; everything else goes through
the names defined here.
"""

from __future__ import annotations

import ctypes
import pathlib
import struct
import threading
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_int32,
    c_int64,
    c_uint32,
    c_uint64,
    c_void_p,
)

from . import _settings

ABI_VERSION = 1

# Status codes (GOSYM_OK, GOSYM_ERR_*).
OK = 0
ERR_INVALID_ARG = -1
ERR_INVALID_HANDLE = -2
ERR_TIMEOUT = -3
ERR_PEER = -4
ERR_MISMATCH = -5
ERR_NOT_SUPPORTED = -6
ERR_SYSTEM = -7
ERR_INTERNAL = -8
ERR_NOT_READY = -9
ERR_CLOSED = -10

# Element types (GOSYM_DTYPE_*).
DTYPE_FLOAT32 = 0
DTYPE_FLOAT64 = 1
DTYPE_FLOAT16 = 2
DTYPE_BFLOAT16 = 3
DTYPE_INT8 = 4
DTYPE_UINT8 = 5
DTYPE_INT16 = 6
DTYPE_INT32 = 7
DTYPE_INT64 = 8
DTYPE_BOOL = 9
DTYPE_FLOAT8_E4M3FN = 10
DTYPE_FLOAT8_E5M2 = 11

# Reduction operators (GOSYM_RED_*), by the names torch's RedOpType uses.
RED = {
    "SUM": 0,
    "AVG": 1,
    "PRODUCT": 2,
    "MIN": 3,
    "MAX": 4,
    "PREMUL_SUM": 5,
    "BAND": 6,
    "BOR": 7,
    "BXOR": 8,
}

# Operations (GOSYM_OP_*).
OP_BARRIER = 0
OP_ALLREDUCE = 1
OP_REDUCE = 2
OP_BROADCAST = 3
OP_ALLGATHER = 4
OP_REDUCE_SCATTER = 5
OP_ALLTOALL = 6
OP_GATHER = 7
OP_SCATTER = 8
OP_SEND = 9
OP_RECV = 10
ANY_SOURCE = -1  # GOSYM_ANY_SOURCE: the peer of a host RECV from any rank


class Piece(ctypes.Structure):
    """gosym_piece: one contiguous piece of memory (address, element count)."""

    _fields_ = [("addr", c_uint64), ("count", c_uint64)]


class OpDesc(ctypes.Structure):
    """gosym_op_desc, field for field."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("op", c_int32),
        ("dtype", c_int32),
        ("red_op", c_int32),
        ("scale", c_double),
        ("root", c_int32),
        ("peer", c_int32),
        ("tag", c_int64),
        ("count", c_uint64),
        ("in_addr", c_uint64),
        ("out_addr", c_uint64),
        ("in_pieces", POINTER(Piece)),
        ("out_pieces", POINTER(Piece)),
        ("n_in", c_int32),
        ("n_out", c_int32),
        ("stream", c_uint64),
        ("device", c_int32),
        ("flags", c_int32),
    ]


# The hot path packs a gosym_op_desc with struct (one call, ~2x cheaper than
# filling an OpDesc field by field); native alignment reproduces the C layout,
# which the check below pins to the Structure above.
DESC = struct.Struct("@IiiidiiqQQQPPiiQii")
if DESC.size != ctypes.sizeof(OpDesc) or [
    getattr(OpDesc, name).offset for name, _ in OpDesc._fields_
] != [0, 4, 8, 12, 16, 24, 28, 32, 40, 48, 56, 64, 72, 80, 84, 88, 96, 100]:
    raise ImportError("gosym: gosym_op_desc layout of this platform is not the one packed by _lib")
DESC_SIZE = DESC.size


def pack_desc(op, dtype, red_op, scale, root, peer, tag, count, in_addr, out_addr,
              in_pieces, out_pieces, n_in, n_out, stream=0, device=-1):
    """A gosym_op_desc as bytes; pieces are addresses of arrays of (addr, count) uint64 pairs.
    device -1 is host memory; a CUDA op names its device ordinal and its CUstream."""
    return DESC.pack(DESC_SIZE, op, dtype, red_op, scale, root, peer, tag, count,
                      in_addr, out_addr, in_pieces, out_pieces, n_in, n_out, stream, device, 0)


STREAM_AT = 88  # offset of (stream, device, flags) at the end of a packed desc
_TAIL = struct.Struct("@Qii")


OP_CAPTURING = 1  # GOSYM_OP_CAPTURING


def stream_tail(stream: int, device: int, flags: int = 0) -> bytes:
    """The (stream, device, flags) that end a packed desc: CUstream stream of CUDA device
    ordinal device, flags GOSYM_OP_*. desc[:STREAM_AT] + tail moves desc onto the stream."""
    return _TAIL.pack(stream, device, flags)


def on_stream(desc: bytes, stream: int, device: int, flags: int = 0) -> bytes:
    """desc, moved onto CUstream stream of CUDA device ordinal device (flags: GOSYM_OP_*)."""
    return desc[:STREAM_AT] + stream_tail(stream, device, flags)


_u64p = POINTER(c_uint64)

# Every export of gosym.h: name -> (restype, argtypes). Output buffers are
# c_void_p so that both ctypes buffers and raw addresses can be passed.
_SIGNATURES = {
    "gosym_abi_version": (c_uint32, []),
    "gosym_last_error": (c_char_p, []),
    "gosym_version": (c_int32, [c_void_p, c_uint64]),
    "gosym_endpoint_create": (c_int32, [c_int32, c_int32, c_int64, c_char_p, _u64p]),
    "gosym_endpoint_blob": (c_int32, [c_uint64, c_void_p, c_uint64, _u64p]),
    "gosym_endpoint_connect": (c_int32, [c_uint64, c_char_p, _u64p, c_int32]),
    "gosym_endpoint_destroy": (c_int32, [c_uint64]),
    "gosym_endpoint_stats": (c_int32, [c_uint64, c_void_p, c_uint64, _u64p]),
    "gosym_endpoint_device_error": (c_int32, [c_uint64]),
    "gosym_endpoint_abort_cuda": (c_int32, [c_uint64, c_char_p]),
    # desc is passed as packed bytes, out_work as the address of a uint64.
    "gosym_op_post": (c_int32, [c_uint64, c_char_p, c_void_p]),
    "gosym_work_wait": (c_int32, [c_uint64, c_int64]),
    "gosym_work_test": (c_int32, [c_uint64]),
    "gosym_work_release": (c_int32, [c_uint64]),
    "gosym_work_finish": (c_int32, [c_uint64, c_int64]),
    "gosym_op_run": (c_int32, [c_uint64, c_char_p]),
    "gosym_stats": (c_int32, [c_void_p, c_uint64, _u64p]),
    "gosym_debug_stacks": (c_int32, [c_void_p, c_uint64, _u64p]),
    "gosym_host_reduce": (c_int32, [c_uint64, c_void_p, c_int32, c_uint64, c_int32, c_int32,
                                    ctypes.c_double, c_int32]),
    "gosym_driver_timing": (c_int32, [c_int32]),
    "gosym_mem_alloc": (c_int32, [c_uint64, _u64p, _u64p]),
    "gosym_mem_map": (c_int32, [c_uint64, c_uint64, c_int32, _u64p]),
    "gosym_mem_unmap": (c_int32, [c_uint64]),
    "gosym_mem_pack": (c_int32, [c_uint64, c_void_p, c_uint64, _u64p]),
    "gosym_mem_import": (c_int32, [c_char_p, c_uint64, c_int64, _u64p]),
    "gosym_mem_import_on": (c_int32, [c_char_p, c_uint64, c_int64, c_int32, _u64p]),
    "gosym_mem_blob_info": (c_int32, [c_char_p, c_uint64, c_void_p, c_uint64, _u64p]),
    "gosym_mem_info": (c_int32, [c_uint64, c_void_p, c_uint64, _u64p]),
    "gosym_cuda_alloc": (c_int32, [c_int32, c_uint64, _u64p, _u64p, _u64p]),
    "gosym_cuda_free": (c_int32, [c_uint64]),
    "gosym_contiguous_view": (c_int32, [c_uint64, c_uint64, c_uint64, _u64p, _u64p, _u64p]),
    "gosym_view_release": (c_int32, [c_uint64]),
    # torch's pluggable allocator calls these itself (memory.comm_empty): the types are
    # here for the export check and for anyone calling them through ctypes
    "gosym_pool_alloc": (c_void_p, [c_int64, c_int32, c_void_p]),
    "gosym_pool_free": (None, [c_void_p, c_int64, c_int32, c_void_p]),
}


def library_path() -> pathlib.Path:
    """GOSYM_LIBRARY if set, else libgosym.so next to this file."""
    env = _settings.library()
    if env:
        return pathlib.Path(env)
    return pathlib.Path(__file__).with_name("libgosym.so")


def _load() -> ctypes.CDLL:
    path = library_path()
    hint = ("Build it with `make lib` (or `pip install .`), or set GOSYM_LIBRARY to the "
            "path of a libgosym.so.")
    if not path.is_file():
        raise ImportError(f"gosym: engine library not found at {path}. {hint}")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise ImportError(f"gosym: cannot load the engine library {path}: {e}. {hint}") from e
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise ImportError(f"gosym: {path} does not export {name}; it is not a "
                              f"libgosym.so of ABI version {ABI_VERSION}. {hint}") from e
        fn.restype = restype
        fn.argtypes = argtypes
    got = lib.gosym_abi_version()
    if got != ABI_VERSION:
        raise ImportError(f"gosym: {path} has ABI version {got}, this Python package needs "
                          f"ABI version {ABI_VERSION}. Rebuild it with `make lib`.")
    return lib


lib = _load()

# Bound once: attribute lookups on a CDLL are not free.
last_error = lib.gosym_last_error
endpoint_create = lib.gosym_endpoint_create
endpoint_blob = lib.gosym_endpoint_blob
endpoint_connect = lib.gosym_endpoint_connect
endpoint_destroy = lib.gosym_endpoint_destroy
endpoint_stats = lib.gosym_endpoint_stats
endpoint_device_error = lib.gosym_endpoint_device_error
endpoint_abort_cuda = lib.gosym_endpoint_abort_cuda
op_post = lib.gosym_op_post
work_wait = lib.gosym_work_wait
work_test = lib.gosym_work_test
work_release = lib.gosym_work_release
work_finish = lib.gosym_work_finish
op_run = lib.gosym_op_run
_host_reduce = lib.gosym_host_reduce


def _exception_types():
    from ._errors import DistBackendError as backend_error

    return {
        ERR_INVALID_ARG: ValueError,
        ERR_MISMATCH: ValueError,
        ERR_NOT_SUPPORTED: NotImplementedError,
        ERR_TIMEOUT: backend_error,
        ERR_PEER: backend_error,
        ERR_CLOSED: backend_error,
        ERR_INVALID_HANDLE: RuntimeError,
        ERR_SYSTEM: RuntimeError,
        ERR_INTERNAL: RuntimeError,
    }


_EXC = _exception_types()


def error(status: int, context: str = "") -> Exception:
    """The exception for a failed call; must run on the failing thread, right after the call."""
    msg = last_error()
    text = msg.decode("utf-8", "replace") if msg else f"status {status}"
    text = text.removeprefix("gosym: ")
    if status == ERR_TIMEOUT and "Timed out" not in text:
        # torch's convention (gloo, NCCL): a timeout's text says "Timed out".
        text = text.replace("timed out", "Timed out", 1) if "timed out" in text else f"Timed out: {text}"
    if context:
        text = f"{context}: {text}"
    return _EXC.get(status, RuntimeError)(f"gosym: {text}")


def check(status: int, context: str = "") -> None:
    """Raises the mapped exception for a non-zero status."""
    if status:
        raise error(status, context)


_tls = threading.local()


def post(endpoint: int, desc: bytes) -> int:
    """gosym_op_post; returns the work handle. The out slot is per thread: the GIL is
    released during the call, so a shared one could be overwritten by another thread."""
    try:
        slot, addr = _tls.out
    except AttributeError:
        slot = c_uint64()
        addr = ctypes.addressof(slot)
        _tls.out = slot, addr
    st = op_post(endpoint, desc, addr)
    if st:
        if not endpoint:
            raise RuntimeError("gosym: the process group has been shut down")
        raise error(st)
    return slot.value


def run(endpoint: int, desc: bytes) -> None:
    """gosym_op_run: posts desc and waits until it is done, in one call (the GIL is
    released meanwhile); raises the op's error."""
    st = op_run(endpoint, desc)
    if st:
        if not endpoint:
            raise RuntimeError("gosym: the process group has been shut down")
        raise error(st)


def host_reduce(dst: int, srcs: list[int], count: int, dtype: int, red: int, scale: float,
                ranks: int) -> None:
    """gosym_host_reduce: count elements at address dst <- the sources' (addresses) reduced
    in order with red (GOSYM_RED_*) by the engine's CPU loops, on the threads a rank of
    ranks on this host gets (the GIL released meanwhile)."""
    arr = (c_uint64 * len(srcs))(*srcs)
    check(_host_reduce(dst, arr, len(srcs), count, dtype, red, scale, ranks), "host_reduce")


def _read(fn, args, cap: int, extra: int) -> bytes:
    """Calls a (…, buf, cap, *len) function of gosym.h, growing the buffer while it is short:
    the call fails with the length it needs (plus `extra` for a string's NUL), and what it
    reports may grow between calls (engine_stacks)."""
    n = c_uint64()
    while True:
        buf = ctypes.create_string_buffer(cap)
        st = fn(*args, buf, cap, ctypes.byref(n))
        if st and n.value + extra > cap:
            cap = n.value + extra + 4096
            continue
        check(st)
        return buf.raw[: n.value]


def read_string(fn, *args) -> str:
    """A string out of a (…, buf, cap, *len) function of gosym.h."""
    return _read(fn, args, 4096, 1).decode("utf-8", "replace")


def read_bytes(fn, *args) -> bytes:
    """Like read_string, for binary output (endpoint blobs)."""
    return _read(fn, args, 1024, 0)


def version() -> str:
    """The engine's version string."""
    buf = ctypes.create_string_buffer(256)
    check(lib.gosym_version(buf, len(buf)))
    return buf.value.decode("utf-8", "replace")


def process_stats_json() -> str:
    return read_string(lib.gosym_stats)


def engine_stacks() -> str:
    """Every goroutine's stack in the engine (gosym_debug_stacks), for a hang report: where
    a native call that does not return is waiting."""
    return read_string(lib.gosym_debug_stacks)
