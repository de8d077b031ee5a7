"""The tolerance of a CUDA reduction at any world size (the GPU workers' float checks).

A reduction over k ranks is compared with a float64 reference rounded to the output
dtype (cuda_worker._reference). Where every order of evaluation gives that reference
bit for bit, the comparison is bitwise; elsewhere it allows what any order of float
arithmetic may differ by, elementwise:

- integers, MIN and MAX: bitwise (exact in any order);
- one rounding: float32/float64 at k <= 2 with a power-of-two scale (a+b, a*b, halving
  and the 0.5 premul are exact or rounded once, whatever the order): bitwise;
- exact accumulation: where every partial sum (product) of the inputs is representable
  in the accumulation type (float32 for float32 and narrower, float64 for float64) and
  the scale is a power of two, the output is the exact value rounded once: bitwise. Sums:
  all inputs are multiples of 2^a (a: the lowest set bit of any input), every partial
  sum lies within S = sum |x_i|, so S < 2^(a+p) keeps them all exact (p: the
  accumulation's precision, 24 or 53). Products: the significant bits of the factors
  add up to at most p and no partial product leaves the normal range;
- otherwise, float32 and float64 sums (SUM, AVG = SUM/k, PREMUL_SUM = s*SUM):
  tol = eps * (k * s * S + |ref|), eps = finfo(acc).eps = 2u. Any order of k-1 additions
  errs by at most (k-1) u S (Higham's gamma_{k-1}), a premultiplied scale (NCCL's AVG
  multiplies each input by fl(1/k)) adds 2u s S, the final scaling u |ref|, rounding
  the reference u |ref|: together at most (k+1) u s S + 2u |ref| <= tol. PRODUCT:
  tol = eps * k * |ref| (k-1 roundings of relative u each, and the reference's);
- narrower floats (float16, bfloat16, fp8), accumulated in float32: one unit in the last
  place of the output at |ref| plus the float32 term above: the float32 value is within
  that term of the exact one, and rounding it and rounding the reference to the output
  type each move at most half a unit (a float32 value just past a power of two rounds to
  that power, within the term).

Inputs must be finite. Pure torch, any device: tests/unit/test_gpu_helpers.py checks it on
CPU at 2 to 8 ranks against float32 reductions in several orders.
"""

from __future__ import annotations

import math

import torch

from wcommon import compare

_NO_BIT = 1 << 20  # the "lowest set bit" of a zero: above any exponent


def _bits(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(significant bits, exponent of the lowest set bit) per element of float64 x
    (0 and _NO_BIT for zeros)."""
    m, e = torch.frexp(x)
    whole = (m.abs() * 2.0 ** 53).to(torch.int64)  # the significand as an integer, exact
    low = whole & -whole  # its lowest set bit
    tz = torch.frexp(low.double())[1].to(torch.int64) - 1
    zero = x == 0
    sig = (53 - tz).masked_fill(zero, 0)
    lsb = (e.to(torch.int64) - 53 + tz).masked_fill(zero, _NO_BIT)
    return sig, lsb


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of dtype's values at |v| (v float64), subnormals included."""
    fi = torch.finfo(dtype)
    e = torch.frexp(v)[1].to(torch.float64)  # |v| in [2^(e-1), 2^e)
    u = torch.clamp(torch.exp2(e - 1), min=fi.tiny) * fi.eps
    return torch.where(v == 0, torch.full_like(u, fi.tiny * fi.eps), u)


def _power_of_two(s: float) -> bool:
    return s != 0 and abs(math.frexp(s)[0]) == 0.5


def scale_of(opname: str, k: int, premul: float = 0.5) -> float:
    return {"SUM": 1.0, "PRODUCT": 1.0, "AVG": 1.0 / k, "PREMUL_SUM": premul}[opname]


def reduce_tolerance(ins: list[torch.Tensor], opname: str, premul: float = 0.5) -> torch.Tensor | None:
    """The elementwise absolute tolerance (float64, shaped like ins[0]; 0 where the
    result must match bitwise) of op over every rank's input ins, as the module says;
    None where every element must match bitwise."""
    dtype, k = ins[0].dtype, len(ins)
    if not dtype.is_floating_point or opname in ("MIN", "MAX"):
        return None
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    fa = torch.finfo(acc)
    p = round(-math.log2(fa.eps)) + 1  # 24 or 53
    scale = scale_of(opname, k, premul)
    scale_exact = _power_of_two(scale)
    narrow = torch.finfo(dtype).bits < 32
    if not narrow and k <= 2 and scale_exact:
        return None
    xs = torch.stack([x.detach().double() for x in ins])
    sig, lsb = _bits(xs)
    a = xs.abs()
    if opname == "PRODUCT":
        v = xs.prod(0)
        bound = fa.eps * k * v.abs()
        nz = a != 0
        one = torch.ones_like(a)
        hi = torch.where(nz, a.clamp(min=1), one).prod(0)
        lo = torch.where(nz, a.clamp(max=1), one).prod(0)
        exact = ((sig.sum(0) <= p) & (hi <= fa.max) & (lo >= fa.tiny)) | ~nz.all(0)
    else:
        s_abs = a.sum(0)
        v = xs.sum(0) * scale
        bound = fa.eps * (k * scale * s_abs + v.abs())
        low = lsb.min(0).values
        finest = round(math.log2(fa.tiny * fa.eps))  # the accumulation's smallest subnormal
        fits = (s_abs < torch.exp2(low.double().clamp(max=2000) + p)) & (low >= finest)
        exact = (s_abs == 0) | (fits & (s_abs * max(scale, 1.0) <= fa.max))
    bitwise = exact & scale_exact
    tol = bound + ulp(v, dtype) if narrow else bound
    if bool(bitwise.all()):
        return None
    return torch.where(bitwise, torch.zeros_like(tol), tol)


def compare_reduced(got: torch.Tensor, ref: torch.Tensor, ins: list[torch.Tensor], opname: str,
                    premul: float = 0.5, part: slice | None = None) -> str | None:
    """wcommon.compare of got with ref within reduce_tolerance(ins, ...); part: the slice
    of the whole reduction that got and ref hold (reduce_scatter)."""
    tol = reduce_tolerance(ins, opname, premul)
    if tol is not None and part is not None:
        tol = tol[part]
    return compare(got, ref, tol)
