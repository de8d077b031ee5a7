"""gosym.contiguous_view on CPU tensors (view_worker.py), at 2 and 3 ranks."""

from __future__ import annotations

import pytest
from conftest import run_torchrun


@pytest.mark.parametrize("world", [2, 3])
def test_contiguous_view_cpu(world, outdir):
    res = run_torchrun("view_worker", world, ["--timeout", 60], timeout=300, outdir=outdir)
    res.assert_ok()
    assert all(r["passed"] >= 10 for r in res.results), [r["passed"] for r in res.results]
