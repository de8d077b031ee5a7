"""The fuzzer (fuzz_worker.py): random programs of every collective and p2p op
over the world and random subgroups, sync and async, on one thread or several, strided, every dtype and size class,
each result against a float64 reference and across ranks bit for bit. Fixed seeds here, so
a failure replays; GOSYM_FUZZ_SEEDS (comma-separated) runs others, GOSYM_FUZZ_OPS longer
programs. test_hier.py runs it across simulated hosts."""

from __future__ import annotations

import os

import pytest
from conftest import cuda_ranks, run_torchrun

SEEDS = [int(s) for s in os.environ.get("GOSYM_FUZZ_SEEDS", "101,202").split(",")]
OPS = os.environ.get("GOSYM_FUZZ_OPS", "300")


def fuzz_args(seed, *extra):
    return ["--seed", seed, "--ops", OPS, *extra]


def check(res):
    res.assert_ok()
    # every member checks each of its ops; a program of OPS ops gives each rank dozens at least
    assert all(r["passed"] >= 50 for r in res.results), "the fuzzer ran suspiciously few checks"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_fuzz(world, seed, outdir):
    check(run_torchrun("fuzz_worker", world, fuzz_args(seed, "--timeout", 60), timeout=600, outdir=outdir))


@pytest.mark.parametrize("world", [2, 4])
def test_fuzz_threads(world, outdir):
    """Three programs at once, each on its own thread and groups (as torch allows)."""
    check(run_torchrun("fuzz_worker", world, fuzz_args(SEEDS[0], "--threads", 3, "--timeout", 60), timeout=600,
                       outdir=outdir))


def test_fuzz_turns(outdir):
    """Three programs at once taking turns to post, as on CUDA (NCCL's rule: one order of
    ops across communicators on every rank), here on the CPU (GOSYM_FUZZ_TURNS=1): every
    result checked, every step's turn granted, in the same order on every rank."""
    res = run_torchrun("fuzz_worker", 4, fuzz_args(SEEDS[0], "--threads", 3, "--timeout", 60), timeout=600,
                       outdir=outdir, env={"GOSYM_FUZZ_TURNS": "1"})
    check(res)
    turns = [r["info"].get("turns") for r in res.results]
    assert all(t and t["taken"] == 3 * int(OPS) for t in turns), f"turns not taken as the sequence says: {turns}"
    assert len({t["order"] for t in turns}) == 1, f"ranks granted the turns in different orders: {turns}"


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_cuda(seed, threads, outdir):
    """One rank per GPU (one GPU: world 1), ops on the current and on side streams, some on
    the CPU; two threads post by turns (as NCCL requires)."""
    world = cuda_ranks()
    if world < 1:
        pytest.skip("needs a GPU")
    check(run_torchrun("fuzz_worker", world, fuzz_args(seed, "--cuda", "--threads", threads, "--timeout", 180),
                       timeout=900, outdir=outdir))
