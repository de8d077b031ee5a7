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


def test_print_program_is_the_programs_steps(outdir):
    """--print-program draws a run's programs with no group or device (where a failing step
    sits in its program, and what ran before it: session 32 replayed a GPU run's program this
    way): the cases a real run of two programs at world 3 names as it begins each step."""
    import subprocess
    import sys

    from conftest import base_env, worker_script

    args = ["--seed", SEEDS[0], "--ops", 40, "--groups", 4, "--threads", 2]
    res = run_torchrun("fuzz_worker", 3, [*args, "--timeout", 60], timeout=300, outdir=outdir,
                       env={"GOSYM_FUZZ_TRACE": "1"}, launcher="spawn")
    res.assert_ok()  # the run passes: its trace is the program's
    ran = sorted(line.split(": begins ", 1)[1] for line in (outdir / "rank0.log").read_text().splitlines()
                 if line.startswith("fuzz rank 0: begins "))
    printed = subprocess.run([sys.executable, str(worker_script("fuzz_worker")), "--print-program", "3",
                              *map(str, args)], env=base_env(), capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    steps = [line for line in printed.stdout.splitlines() if not line.startswith("program ")]
    assert len(steps) == 80 and sorted(steps) == ran


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
