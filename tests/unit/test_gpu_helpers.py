"""The GPU suite's pure-Python parts, on CPU at 2 to 8 ranks (no GPU, no gosym library):
the tolerance of reductions (tests/jobs/cuda/gpuref.py) holds for float reductions evaluated in
every order an engine may use (rank order, reversed, shuffled, a tree, NCCL's
premultiplied average) and rejects wrong results; exact cases stay bitwise; the world
sizes the GPU jobs run at; the p2p worker's pairings."""

from __future__ import annotations

import random

import gpuref
import pytest
import torch
from conftest import gpu_worlds_for
from cuda_p2p_worker import pairings
from cuda_worker import PREMUL, _input, _reference

pytestmark = pytest.mark.without_library

WORLDS = range(2, 9)
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SUMS = ["SUM", "AVG", "PREMUL_SUM"]
N = 1031


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _tree(xs):
    while len(xs) > 1:
        xs = [xs[i] + xs[i + 1] if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


def engines(ins, opname):
    """The op over ins as engines may evaluate it, in the accumulation type, rounded once
    to the output type: name -> result."""
    dtype, k = ins[0].dtype, len(ins)
    acc = _acc(dtype)
    xs = [x.to(acc) for x in ins]
    shuffled = list(range(k))
    random.Random(k).shuffle(shuffled)
    orders = {"rank": list(range(k)), "reversed": list(range(k))[::-1], "shuffled": shuffled}
    out = {}
    for name, order in orders.items():
        r = xs[order[0]].clone()
        for i in order[1:]:
            r = r * xs[i] if opname == "PRODUCT" else r + xs[i]
        out[name] = r
    if opname != "PRODUCT":
        out["tree"] = _tree(xs)
    scale = gpuref.scale_of(opname, k, PREMUL)
    for name in list(out):
        if opname == "AVG":
            out[name] = out[name] / k
        elif opname == "PREMUL_SUM":
            out[name] = out[name] * scale
    if opname in ("AVG", "PREMUL_SUM"):
        s = torch.tensor(scale, dtype=acc)
        out["premultiplied"] = _tree([x * s for x in xs])  # NCCL's: every input times fl(scale)
        out["postmultiplied"] = _tree(xs) * s  # the sum times fl(scale)
    return {name: r.to(dtype) for name, r in out.items()}


def _inputs(case, world, dtype, opname):
    return [_input(case, r, N, dtype, opname, "cpu") for r in range(world)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("opname", SUMS + ["PRODUCT"])
def test_every_order_within_tolerance(world, dtype, opname):
    ins = _inputs(f"t/{dtype}/{opname}", world, dtype, opname)
    ref = _reference(ins, opname, world)
    for name, got in engines(ins, opname).items():
        why = gpuref.compare_reduced(got, ref, ins, opname, PREMUL)
        assert why is None, f"{name} order: {why}"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("opname", SUMS)
def test_fp8_within_tolerance(world, dtype, opname):
    """fp8 accumulated in float32 (NCCL 2.28's way): one unit in the last place."""
    g = torch.Generator().manual_seed(world)
    ins = [(torch.randn(N, generator=g) * 4).to(dtype) for _ in range(world)]
    ref = _reference(ins, opname, world)
    for name, got in engines(ins, opname).items():
        why = gpuref.compare_reduced(got, ref, ins, opname, PREMUL)
        assert why is None, f"{name} order: {why}"


@pytest.mark.parametrize("world", WORLDS)
def test_exact_cases_are_bitwise(world):
    """None (the whole result bitwise): integers, MIN/MAX, float32 and float64 at 2 ranks,
    float16/bfloat16 sums of the workers' k/1024 and k/128 inputs (exact in float32),
    products of the workers' PRODUCT inputs (at most 8 factors of 3: 13 bits)."""
    for dtype in (torch.int32, torch.int64):
        assert gpuref.reduce_tolerance(_inputs("i", world, dtype, "SUM"), "SUM") is None
    for opname in ("MIN", "MAX"):
        assert gpuref.reduce_tolerance(_inputs("m", world, torch.float32, opname), opname) is None
    for dtype in FLOATS:
        assert gpuref.reduce_tolerance(_inputs("p", world, dtype, "PRODUCT"), "PRODUCT") is None, dtype
    for dtype in (torch.float16, torch.bfloat16):
        for opname in ("SUM", "PREMUL_SUM"):
            assert gpuref.reduce_tolerance(_inputs("h", world, dtype, opname), opname, PREMUL) is None
    for dtype in (torch.float32, torch.float64):
        tol = gpuref.reduce_tolerance(_inputs("f", world, dtype, "SUM"), "SUM")
        assert (tol is None) == (world == 2), (dtype, world)
    avg = gpuref.reduce_tolerance(_inputs("h", world, torch.float16, "AVG"), "AVG")
    assert (avg is None) == (world in (2, 4, 8)), world  # a power-of-two divisor is exact


def test_mixed_exactness_per_element():
    """Elements whose sums are exact in float32 compare bitwise, the others get a tolerance
    (but for the odd random element that happens to be exact too: every input a multiple of
    2^-20 and every partial sum below 16, say)."""
    g = torch.Generator().manual_seed(5)
    ins = []
    for _ in range(5):
        x = torch.randn(1000, generator=g) * 4
        x[:500] = torch.randint(-1000, 1000, (500,), generator=g) / 64  # few bits: exact sums
        ins.append(x)
    tol = gpuref.reduce_tolerance(ins, "SUM")
    assert tol is not None and bool((tol[:500] == 0).all()) and int((tol[500:] > 0).sum()) >= 490
    ref = _reference(ins, "SUM", 5)
    for name, got in engines(ins, "SUM").items():
        assert gpuref.compare_reduced(got, ref, ins, "SUM") is None, name
    # 2^-30 + 1: a partial sum that float32 cannot hold
    ins = [torch.tensor([2.0 ** -30]), torch.tensor([1.0]), torch.tensor([-1.0])]
    assert gpuref.reduce_tolerance(ins, "SUM") is not None


@pytest.mark.parametrize("world", [3, 4, 8])
def test_wrong_results_fail(world):
    """The tolerance is at most (k+1) float32 eps of the sum of magnitudes, and catches a
    lost rank, a 1e-5 relative error (float32 sums), one ulp (an exact float16 sum) and two
    ulps (a float16 average)."""
    ins = _inputs("w", world, torch.float32, "SUM")
    ref = _reference(ins, "SUM", world)
    assert gpuref.compare_reduced(_reference(ins[:-1], "SUM", world - 1), ref, ins, "SUM") is not None
    assert gpuref.compare_reduced(ref * (1 + 1e-5), ref, ins, "SUM") is not None
    tol = gpuref.reduce_tolerance(ins, "SUM")
    s_abs = torch.stack(ins).double().abs().sum(0)
    assert bool((tol <= (world + 1) * torch.finfo(torch.float32).eps * s_abs).all())
    h = _inputs("h", world, torch.float16, "SUM")
    href = _reference(h, "SUM", world)
    up = torch.nextafter(href.float(), torch.tensor(float("inf"))).half()  # not always one f16 ulp:
    up = torch.where(up == href, (href.float() + gpuref.ulp(href.double(), torch.float16)).half(), up)
    assert gpuref.compare_reduced(up, href, h, "SUM") is not None
    a = _inputs("a", world, torch.float16, "AVG")
    aref = _reference(a, "AVG", world)
    two = (aref.double() + 2 * gpuref.ulp(aref.double(), torch.float16)).half()
    assert gpuref.compare_reduced(two, aref, a, "AVG") is not None


def test_ulp():
    v = torch.tensor([0.0, 1.0, 1.5, -3.0, 2.0 ** -20, 65504.0], dtype=torch.float64)
    assert gpuref.ulp(v, torch.float16).tolist() == [2 ** -24, 2 ** -10, 2 ** -10, 2 ** -9, 2 ** -24, 32.0]
    assert gpuref.ulp(v[1:2], torch.bfloat16).item() == 2 ** -7
    assert gpuref.ulp(v[1:2], torch.float32).item() == 2 ** -23


def test_gpu_worlds():
    assert [gpu_worlds_for(n) for n in range(6)] == [[], [1], [2], [2, 3], [2, 3, 4], [2, 3, 5]]
    assert gpu_worlds_for(8) == [2, 3, 8]


@pytest.mark.parametrize("world", WORLDS)
def test_pairings(world):
    """Disjoint, symmetric pairs; every rank has a partner; 2 ranks: one pair, one round."""
    rounds = pairings(world)
    for rnd in rounds:
        assert all(rnd[rnd[r]] == r and rnd[r] != r for r in rnd), rnd
        assert all(0 <= r < world for r in rnd)
    assert set().union(*rounds) == set(range(world))
    assert len(rounds) == 1 + world % 2
    if world == 2:
        assert rounds == [{0: 1, 1: 0}]
