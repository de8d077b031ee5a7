"""Conformance with torch's own backend test suite.

test_dist_suite runs torch's DistributedTest._DistTestBase (shipped in the torch wheel) on
gosym with gloo's test selection (run_dist_suite.py) and fails when a
test's outcome differs from gloo's, as committed in tests/jobs/conformance/expected/ for this torch
version, except for the tests torch itself restricts to gloo (restricted.json).
test_reference runs gloo and checks that the committed outcomes are still gloo's (world 2 in
CI, both sizes with GOSYM_CONFORMANCE_REFERENCE=1). test_fixes checks, against gloo, the
behaviours that the suite needed of gosym (conformance_worker.py). test_dist_suite_across_hosts
runs the suite with its ranks split into simulated hosts, so that every group is a HierGroup:
gloo's outcomes too (world 2 in CI, world 3 as well with GOSYM_CONFORMANCE_HOSTS=1).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, base_env, cuda_device_count, run_torchrun

RUNNER = REPO / "tests" / "jobs" / "conformance" / "run_dist_suite.py"


def run_suite(backend: str, world: int, *extra: str, env=None) -> None:
    p = subprocess.run([sys.executable, str(RUNNER), "--backend", backend, "--world", str(world), *extra],
                       env={**base_env(), **(env or {})}, capture_output=True, text=True, timeout=1500)
    if p.returncode != 0:
        # the per-test lines, the comparison and the summary; not the ranks' logs
        keep = [ln for ln in (p.stdout + p.stderr).splitlines()
                if ln.startswith(("test_", "DIFFERS", "note:", "reference", backend, "every", "Traceback"))
                or " outcomes differ" in ln or "regenerate" in ln]
        pytest.fail(f"{backend} at world {world}: exit {p.returncode}\n" + "\n".join(keep)[-15000:])


@pytest.mark.parametrize("world", [2, 3])
def test_dist_suite(world):
    """Every test of torch's suite has gloo's outcome on gosym (restricted.json aside)."""
    run_suite("gosym", world)


@pytest.mark.parametrize("world,per_host", [(2, 1), (3, 2)], ids=["1+1", "2+1"])
def test_dist_suite_across_hosts(world, per_host):
    """The same across simulated hosts (GOSYM_HOST_ID=ranks-per-host: hosts of per_host
    consecutive ranks): every group of the suite a HierGroup, gloo's outcomes all the same
    (session 35: it found sparse all_reduce across hosts missing)."""
    if world != 2 and os.environ.get("GOSYM_CONFORMANCE_HOSTS") != "1":
        pytest.skip("hosts of 2+1 ranks run with GOSYM_CONFORMANCE_HOSTS=1 (CI time)")
    against = RUNNER.parent / "expected" / f"gloo-cpu-w{world}.json"
    run_suite("gosym", world, "--against", str(against),
              env={"GOSYM_HOST_ID": f"ranks-per-host:{per_host}"})


@pytest.mark.parametrize("world", [2, 3])
def test_reference(world):
    """gloo's outcomes under the installed torch are the committed ones."""
    if world != 2 and os.environ.get("GOSYM_CONFORMANCE_REFERENCE") != "1":
        pytest.skip("gloo at world 3 runs with GOSYM_CONFORMANCE_REFERENCE=1 (CI time)")
    run_suite("gloo", world, "--against", str(RUNNER.parent / "expected" / f"gloo-cpu-w{world}.json"))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fixes(world, outdir):
    res = run_torchrun("conformance_worker", world, ["--timeout", 60], timeout=300, outdir=outdir)
    res.assert_ok()
    assert all(r["passed"] >= 20 for r in res.results), "the worker ran suspiciously few checks"


@pytest.mark.gpu
def test_fixes_cuda(outdir):
    """CUDA: recv from any source refused clearly (as NCCL), profiler ranges of CUDA ops."""
    world = cuda_device_count()
    if world < 2:
        pytest.skip(f"needs 2 GPUs, found {world}")
    res = run_torchrun("conformance_worker", world, ["--timeout", 60, "--cuda"], timeout=300, outdir=outdir)
    res.assert_ok()
    # rank 0 also checks the refusal (2 checks), every rank the all_reduce and the ranges
    want = [4] + [2] * (world - 1)
    assert [r["passed"] >= w for r, w in zip(res.results, want)] == [True] * world, \
        f"the worker ran suspiciously few checks: {[r['passed'] for r in res.results]}"
