"""Process groups (groups_worker.py): overlapping subgroups created back
to back, interleaved and concurrent use, per-group stats, 20 create-use-destroy
cycles with flat fd/memfd counts, destroy_process_group() and re-init."""

from __future__ import annotations

from conftest import run_torchrun


def test_groups(outdir):
    res = run_torchrun("groups_worker", 4, ["--timeout", 60], timeout=420, outdir=outdir)
    res.assert_ok()
    assert all(r["passed"] >= 100 for r in res.results), "the worker ran suspiciously few checks"
