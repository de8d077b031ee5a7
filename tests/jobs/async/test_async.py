"""async_op=True semantics (async_worker.py): wait() blocks until done,
futures complete with the tensors, issue order within a group, the GIL is
released while waiting, deep queues and back-to-back ops stay correct."""

from __future__ import annotations

import pytest
from conftest import run_torchrun


@pytest.mark.parametrize("world", [2, 4])
def test_async(world, outdir):
    res = run_torchrun("async_worker", world, ["--timeout", 60], timeout=300, outdir=outdir)
    res.assert_ok()
    assert all(r["passed"] >= 12 for r in res.results), "the worker ran suspiciously few checks"
