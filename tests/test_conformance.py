"""Conformance with torch's own backend test suite.

test_dist_suite runs torch's DistributedTest._DistTestBase (shipped in the torch wheel) on
gloo and on gosym with gloo's test selection (tests/conformance/run_dist_suite.py) and fails
when a test's outcome on gosym differs from gloo's, except for the tests torch restricts to
gloo (tests/conformance/restricted.json). test_fixes checks, against gloo, the behaviours the
suite needed (workers/conformance_worker.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, base_env, run_torchrun

RUNNER = REPO / "tests" / "conformance" / "run_dist_suite.py"


@pytest.mark.parametrize("world", [2, 3])
def test_dist_suite(world, tmp_path):
    """Every test of torch's suite has on gosym the outcome it has on gloo (restricted.json
    aside). Both backends run here, one after the other, so the reference is this torch's."""
    env = base_env()
    ref = tmp_path / "gloo.json"
    for backend, extra in (("gloo", ["--json", str(ref)]), ("gosym", ["--against", str(ref)])):
        p = subprocess.run([sys.executable, str(RUNNER), "--backend", backend, "--world", str(world),
                            *extra], env=env, capture_output=True, text=True, timeout=1500)
        out = p.stdout + p.stderr
        assert p.returncode == 0, f"{backend} at world {world}: exit {p.returncode}\n" + "\n".join(
            line for line in out.splitlines() if not line.startswith(("ERROR:", "    ")))[-12000:]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fixes(world, outdir):
    res = run_torchrun("conformance_worker", world, ["--timeout", 60], timeout=300, outdir=outdir)
    res.assert_ok()
    assert all(r["passed"] >= 20 for r in res.results), "the worker ran suspiciously few checks"
