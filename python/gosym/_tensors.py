"""Tensor checks and marshalling: which tensors gosym can address, and tensors turned into
the contiguous buffers, element counts and (address, count) pieces a gosym_op_desc names."""

from __future__ import annotations

from array import array

import torch

from . import descriptors
from ._dtypes import DTYPES as _DTYPES
from ._dtypes import move_dtype, reduce_op, reduce_types

_strided = torch.strided
_Tensor = torch.Tensor


def _check(t) -> None:
    """The one place that decides whether gosym can address a tensor's memory: host
    memory, or CUDA memory (the CUDA data plane; _op_device keeps one op on one device)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gosym: expected a torch.Tensor, got {type(t).__name__}")
    if not (t.is_cpu or t.is_cuda):
        raise NotImplementedError(f"gosym: tensors on device {t.device} are not supported")
    if t.layout is not _strided:
        raise TypeError(f"gosym: only strided (dense) tensors are supported, got {t.layout}")


def _op_device(keep):
    """-1 when every tensor an op touches (those in keep, nested in lists and tuples) is in
    host memory, else the CUDA device index they all share: the engine reads addresses as
    the op's device says, so a mix is refused here. On the path of every op: exact type
    tests first, one pass, no set."""
    if isinstance(keep, _Tensor):  # the common single-buffer op
        return keep.get_device()
    if keep.__class__ is tuple and len(keep) == 2:  # (src, dst) of the common two-buffer ops
        a, b = keep
        if a.__class__ is _Tensor and b.__class__ is _Tensor:
            d = a.get_device()
            if b.get_device() != d:
                raise _mixed(keep)
            return d
    dev = None
    todo = [keep]
    for x in todo:  # grows as nested lists and tuples are met
        c = x.__class__
        if c is tuple or c is list:
            todo += x
        elif c is _Tensor or isinstance(x, _Tensor):
            d = x.get_device()
            if dev is None:
                dev = d
            elif d != dev:
                raise _mixed(keep)
        elif isinstance(x, (list, tuple)):
            todo += x
    return -1 if dev is None else dev


def _mixed(keep):
    """The error for an op whose tensors (in keep) lie on several devices."""
    devs, stack = set(), [keep]
    while stack:
        x = stack.pop()
        if isinstance(x, _Tensor):
            devs.add(x.get_device())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    devs = sorted(devs)
    names = ", ".join("cpu" if d < 0 else f"cuda:{d}" for d in devs)
    return ValueError(f"gosym: the tensors of one op must be on one device, got {names}")


def _src(t):
    """A contiguous tensor holding t's data, for the engine to read."""
    _check(t)
    if t.is_contiguous():
        return t
    _read_here(t)
    return t.contiguous()


def _read_here(t):
    """Marks CUDA tensor t as read on the current stream (by a copy made for an op), so that
    the caching allocator does not hand its memory out before that copy ran, should the
    caller drop it after the call (_streams.record says why)."""
    if t.is_cuda:
        t.record_stream(torch.cuda.current_stream(t.device))


def _dst(t, cb, init):
    """A contiguous tensor for the engine to write t's result into. For a
    non-contiguous t that is a temporary (holding t's data when init is set) and
    (t, temporary) is appended to the copy-back list cb."""
    _check(t)
    if t.is_contiguous():
        return t
    tmp = t.contiguous() if init else torch.empty_like(t, memory_format=torch.contiguous_format)
    cb.append((t, tmp))
    return tmp


def _in_place_types(build, buf, opts):
    """(dtype code, elements per torch element, GOSYM_RED_*, scale) of the op that build
    (descriptors.all_reduce, reduce or broadcast) describes, in place on buf."""
    if build is descriptors.broadcast:
        code, mult = move_dtype(buf)
        return code, mult, 0, 1.0
    red, scale = reduce_op(opts.reduceOp)
    code = _DTYPES.get(buf.dtype)  # reduce_types' common case, without its frame
    if code is not None:
        return code, 1, red, scale
    return *reduce_types(buf, red), red, scale


def _padded(t, dim, n):
    """t with zeros appended along dim up to n (its own storage when it is that long)."""
    if t.shape[dim] == n:
        return t.contiguous()
    shape = list(t.shape)
    shape[dim] = n
    out = t.new_zeros(shape)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    _read_here(t)
    return out


def _one(seq, what):
    """The single element of a per-process tensor list (one device per process)."""
    if len(seq) != 1:
        raise ValueError(f"gosym: {what} takes exactly one tensor (list) per process, got "
                         f"{len(seq)}")
    return seq[0]


def _same_dtype(a, b, what):
    if a.dtype != b.dtype:
        raise TypeError(f"gosym: {what}: dtype mismatch, {a.dtype} vs {b.dtype}")


def _pieces(pairs):
    """A flat uint64 (addr, count) array and its address, for in_pieces/out_pieces."""
    arr = array("Q", pairs)
    return arr, arr.buffer_info()[0]


def _even_pieces(base, step_bytes, count, world):
    return _pieces([v for r in range(world) for v in (base + r * step_bytes, count)])
