"""Point-to-point messaging (p2p_worker.py): send/recv, isend/irecv in
both orders, tag matching, FIFO per tag, batch_isend_irecv, subgroups."""

from __future__ import annotations

import pytest
from conftest import run_torchrun


@pytest.mark.parametrize("world", [2, 4])
def test_p2p(world, outdir):
    res = run_torchrun("p2p_worker", world, ["--timeout", 60], timeout=300, outdir=outdir)
    res.assert_ok()
    assert all(r["passed"] >= 60 for r in res.results), "the worker ran suspiciously few checks"
