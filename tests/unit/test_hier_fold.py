"""The fold that finishes a reduction by hand across hosts (gosym.hier.tensors._fold, the
engine's gosym_host_reduce: the rail swap of an all_reduce between hosts, the host blocks'
reduce_scatter) does what Gloo's reduction of the same two values does, for every reduction
and dtype it takes, over buffers the engine splits across threads too, and refuses (None)
the dtypes the inter-host engine does not reduce as themselves; the swaps' fold over any
number of hosts leaves every host the same bits (_fold_hosts); bad input to the engine's
reduction raises; and which host layouts take host blocks (algorithms.HierAlgorithms._blocks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from gosym import _lib
from gosym.hier.algorithms import HierAlgorithms
from gosym.hier.tensors import _fold, _fold_hosts

OPS = {
    "SUM": lambda a, b: a + b,
    "PRODUCT": lambda a, b: a * b,
    "MIN": torch.minimum,
    "MAX": torch.maximum,
    "BAND": torch.bitwise_and,
    "BOR": torch.bitwise_or,
    "BXOR": torch.bitwise_xor,
}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def _pair(dtype, seed, n=257):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return [torch.randint(0, 2, (n,), generator=g).bool() for _ in range(2)]
    if dtype.is_floating_point:
        return [torch.randn(n, generator=g, dtype=torch.float64).to(dtype) for _ in range(2)]
    info = torch.iinfo(dtype)
    return [torch.randint(max(info.min, -100), min(info.max, 100), (n,), generator=g,
                          dtype=torch.int64).to(dtype) for _ in range(2)]


# 257 elements: one share; 600,001 (2.4 MB of float32 and up): shares of 256 KiB or more on
# as many threads as the machine gives one rank (two on CI), the last one short
@pytest.mark.parametrize("n", [257, 600_001])
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool], ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_fold_is_the_reduction(dtype, name, n):
    if name.startswith("B") and (dtype.is_floating_point):
        pytest.skip("bitwise reductions of floats do not exist")
    a, b = _pair(dtype, hash((str(dtype), name)) % 1000, n)
    want = OPS[name](a, b) if dtype != torch.bool or name not in ("SUM", "PRODUCT") else (
        (a | b) if name == "SUM" else (a & b))  # Gloo's bool sum is OR, its product AND
    fold = _fold(getattr(dist.ReduceOp, name), a)
    assert fold is not None
    acc = torch.full_like(a, 3)  # poisoned: every element must be written
    fold(acc, [a.data_ptr(), b.data_ptr()])
    assert acc.dtype == dtype
    assert torch.equal(acc, want.to(dtype)), f"{name} {dtype}"
    if name in ("SUM", "PRODUCT", "MIN", "MAX") and dtype.is_floating_point:
        other = b.clone()
        fold(other, [other.data_ptr(), a.data_ptr()])  # in place, the sources the other way round
        assert torch.equal(other, acc), "a folded into b differs from b into a"


def test_fold_complex_sum():
    a = torch.randn(33, dtype=torch.complex64)
    b = torch.randn(33, dtype=torch.complex64)
    acc = a.clone()
    _fold(dist.ReduceOp.SUM, a)(acc, [acc.data_ptr(), b.data_ptr()])
    assert torch.equal(acc, a + b)


def test_host_reduce_refuses_bad_input():
    x = torch.zeros(8)
    f32, f8 = _lib.DTYPE_FLOAT32, _lib.DTYPE_FLOAT8_E4M3FN
    with pytest.raises(ValueError, match="host_reduce"):
        _lib.host_reduce(x.data_ptr(), [], 8, f32, _lib.RED["SUM"], 1.0, 1)
    with pytest.raises(ValueError, match="source 1 is null"):
        _lib.host_reduce(x.data_ptr(), [x.data_ptr(), 0], 8, f32, _lib.RED["SUM"], 1.0, 1)
    with pytest.raises(NotImplementedError, match="fp8|float8|e4m3"):
        _lib.host_reduce(x.data_ptr(), [x.data_ptr()], 8, f8, _lib.RED["SUM"], 1.0, 1)
    with pytest.raises(NotImplementedError, match="BAND"):
        _lib.host_reduce(x.data_ptr(), [x.data_ptr()], 8, f32, _lib.RED["BAND"], 1.0, 1)


def test_fold_refuses_other_dtypes():
    t = torch.zeros(4, dtype=torch.float8_e4m3fn)
    assert _fold(dist.ReduceOp.SUM, t) is None


def _shape(hosts):
    """What _blocks reads of a group (a HierGroup is a ProcessGroup: not made here)."""
    return SimpleNamespace(_hosts=hosts, _balanced=len({len(rs) for rs in hosts}) == 1,
                           _n=len(hosts[0]))


@pytest.mark.parametrize("hosts,dev,want", [
    ([[0, 1], [2, 3]], "cpu", True),
    ([[0, 1, 2, 3], [4, 5, 6, 7]], "cpu", True),
    ([[0, 1], [2, 3], [4, 5]], "cpu", True),
    ([[0, 1], [2, 3]], "cuda", False),       # CUDA keeps the paths measured for it
    ([[0, 2], [1, 3]], "cpu", False),        # a host's ranks not consecutive
    ([[1, 0], [2, 3]], "cpu", False),        # not in local-index order
    ([[2, 3], [0, 1]], "cpu", False),        # host 0's rows not block 0
    ([[0], [1]], "cpu", False),              # one rank a host: nothing in the host to do
    ([[0], [1, 2]], "cpu", False),           # unequal hosts
])
def test_which_layouts_take_host_blocks(hosts, dev, want):
    assert HierAlgorithms._blocks(_shape(hosts), dev) is want


@pytest.mark.parametrize("hosts", [2, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
@pytest.mark.parametrize("name", ["SUM", "PRODUCT", "MAX"])
def test_swap_fold_gives_every_host_the_same_bits(hosts, dtype, name):
    """Each host folds the others' buffers into its own (_fold_hosts): every host's result is
    bitwise the host-order reduction ((x0 . x1) . x2) ..., whichever host computes it."""
    g = torch.Generator().manual_seed(hosts * 31 + len(name))
    if dtype.is_floating_point:
        xs = [torch.randn(1031, generator=g, dtype=torch.float64).to(dtype) for _ in range(hosts)]
    else:
        xs = [torch.randint(-50, 50, (1031,), generator=g, dtype=torch.int32) for _ in range(hosts)]
    # float16 and bfloat16 are reduced in float32 and rounded once (the engine's loops)
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    want = xs[0].to(wide)
    for x in xs[1:]:
        want = OPS[name](want, x.to(wide))
    fold = _fold(getattr(dist.ReduceOp, name), xs[0])
    for me in range(hosts):
        own = xs[me].clone()
        got = torch.stack(xs).clone()
        got[me].fill_(7)  # never read: the slot of this host's own buffer
        _fold_hosts(fold, own, me, got)
        assert torch.equal(own, want.to(dtype)), f"host {me} of {hosts}: {name} {dtype}"
