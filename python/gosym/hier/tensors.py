"""Tensors as the inter-host engines take them (dtypes they move and reduce, bytes for the
rest), a reduction split into its intra- and inter-host steps, and the small helpers of a
HierGroup's op steps."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .. import _lib
from .._dtypes import reduce_op, reduce_types

_RED_NAMES = {code: name for name, code in _lib.RED.items()}
# dtypes both Gloo and NCCL move and reduce as themselves; the rest travel as bytes, and
# reductions over int16 (which neither reduces) as int32 (the low bits wrap the same).
_WIRE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
         torch.int32, torch.int64, torch.bool}
_SUM = dist.ReduceOp.SUM


def _opts(cls, async_op=False, **kw):
    o = cls()
    o.asyncOp = async_op
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def _wait(w):
    if w is not None:
        w.wait()


def _split_op(op, t):
    """(the local step's op, the inter-host step's op, whether to divide by the world at the
    end, PREMUL_SUM's factor or None) of reduction op on t; TypeError for what gosym does not
    reduce. The factor is applied by the local step, or by hand where a host has one rank."""
    red, scale = reduce_op(op)
    reduce_types(t, red)  # raises for dtypes and ops gosym cannot reduce
    name = _RED_NAMES[red]
    if t.is_cuda and t.dtype == torch.int16:
        # refused at the call, as gosym's CUDA kernels and NCCL refuse it: the group goes on
        raise NotImplementedError(f"gosym: {name} of int16 CUDA tensors is not supported (nor "
                                  "by NCCL); int16 reduces on CPU tensors")
    if t.is_cuda and name in ("BAND", "BOR", "BXOR"):
        raise ValueError(f"gosym: {name} of CUDA tensors across hosts is not supported: NCCL, "
                         "the inter-host engine, has no bitwise reductions")
    if name == "AVG":
        return _SUM, _SUM, True, None
    if name == "PREMUL_SUM":
        return op, _SUM, False, scale
    return op, op, False, None


def _fold(op, t, ranks=1):
    """The step that finishes a reduction op by hand (the inter-host step's op of _split_op)
    on tensors like t: fold(dst, srcs) leaves in dst (which may be one of them) the sources
    (their addresses, tensors like dst) reduced in their order, ((s0 . s1) . s2) ..., by the
    engine's CPU loops (gosym_host_reduce: what Gloo does to the values of one element,
    bool's SUM an OR and PRODUCT an AND; float16 and bfloat16 summed in float32) on the
    threads a rank of the `ranks` of its host gets. Not torch's ops: their intra-op threads,
    one per core in every rank of a job torchrun did not launch, made a 512 KiB fold of 4
    ranks on 16 cores take 19 ms (session 29). None where there is no fold: a dtype the
    inter-host engine does not reduce as itself, where the caller keeps to the engine's own
    reduction. Every tensor contiguous, on the CPU."""
    if t.dtype not in _WIRE and not t.is_complex() and t.dtype != torch.int16:
        return None
    red = reduce_op(op)[0]
    code, per = reduce_types(t, red)

    def fold(dst, srcs):
        _lib.host_reduce(dst.data_ptr(), srcs, dst.numel() * per, code, red, 1.0, ranks)
    return fold


def _rows(t):
    """The addresses of the rows of t (contiguous, rows along dim 0)."""
    base, step = t.data_ptr(), t.stride(0) * t.element_size()
    return [base + i * step for i in range(t.shape[0])]


def _fold_hosts(fold, own, me, got):
    """own (host me's buffer) <- every host's buffer reduced in host order, ((x0 . x1) . x2)
    . ..., got[h] being host h's (got[me] unused), so that every host ends with the same
    bits."""
    srcs = _rows(got)
    srcs[me] = own.data_ptr()
    fold(own, srcs)


def _red_wire(t):
    """t as the inter-host engine reduces it, and whether the result must be copied back."""
    if t.dtype in _WIRE:
        return t, False
    if t.is_complex():
        return torch.view_as_real(_packed(t)), False
    if t.dtype == torch.int16:
        return t.to(torch.int32), True
    raise TypeError(f"gosym: reductions across hosts do not support dtype {t.dtype}")


def _packed(t):
    """A contiguous t with the strides of its shape's packed layout: torch calls a tensor
    contiguous whatever the strides of its dims of size 1 (a one-element slice of a strided
    view keeps its stride of 2), which a view to another element size or to real parts
    refuses ("self.stride(-1) must be 1"); the same elements either way."""
    if not t.dim() or t.stride(-1) == 1:
        return t
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.append(step)
        step *= n
    return t.as_strided(t.shape, strides[::-1])


def _bytes(t):
    """A contiguous t as rows of bytes along dim 0 (as the inter-host engine moves any dtype;
    splits along dim 0 keep their meaning): t itself for dtypes it knows."""
    if t.dtype in _WIRE:
        return t
    rows = t.shape[0] if t.dim() else 1
    return _packed(t.reshape(rows, math.prod(t.shape[1:]))).view(torch.uint8)


def _flat_bytes(t):
    """A contiguous t as one row of bytes."""
    return _packed(t.reshape(-1)).view(torch.uint8)


def _contig(t, cb):
    """A contiguous t (a temporary whose contents go back into t through cb)."""
    if t.is_contiguous():
        return t
    tmp = t.contiguous()
    cb.append((t, tmp))
    return tmp


def _copy_back(cb):
    for t, tmp in cb:
        t.copy_(tmp)


def _divide(t, n):
    if t.is_floating_point() or t.is_complex():
        t.div_(n)
    else:
        t.copy_(torch.div(t, n, rounding_mode="trunc"))

