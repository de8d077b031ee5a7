"""What a group across hosts says after a failure (gosym.hier.lifetime.HierBase._lost): every
rank reports the op it posted through the store, and the ranks that do not report within
GOSYM_HIER_REPORT_S are named as lost, a rank that reported another op with its op. The store
here is a dict; the real one runs in tests/jobs/hier (test_rank_lost, test_mismatch_*)."""

from __future__ import annotations

from dictstore import DictStore

from gosym.hier.group import HierGroup
from gosym.hier.lifetime import _P2P


def _group(rank, size, reports, global_ranks=None):
    g = HierGroup.__new__(HierGroup)
    g._rank, g._size, g._report_s = rank, size, 0
    g._global_ranks = global_ranks or list(range(size))
    g._store = DictStore({f"failed/{r}": op for r, op in reports.items()})
    return g


def test_the_ranks_that_do_not_report_are_named():
    op = "all_reduce (seq 4) of float32[8]"
    said = _group(0, 4, {1: op, 2: op})._lost(op)
    assert "ranks [3] were lost" in said and "different ops" not in said
    assert "no rank was lost" in _group(0, 2, {1: op})._lost(op)


def test_a_rank_that_posted_another_op_is_named_with_it():
    said = _group(0, 3, {1: "broadcast (seq 4) of float32[8]", 2: "all_reduce (seq 4) of float32[8]"}
                  )._lost("all_reduce (seq 4) of float32[8]")
    assert "the ranks posted different ops" in said and "rank 1 broadcast (seq 4)" in said


def test_sends_and_receives_are_not_compared():
    """A send's peer posted a receive, and a rank that failed in a collective may see its
    peer fail in a send: neither is an op posted differently (die-p2p in test_hier)."""
    said = _group(0, 3, {1: _P2P + "recv from rank 0", 2: "all_reduce (seq 2) of float32[8]"}
                  )._lost(_P2P + "send to rank 1")
    assert "different ops" not in said and "no rank was lost" in said


def test_a_subgroups_lost_ranks_are_named_by_their_global_ranks_too():
    op = "all_reduce (seq 1) of float32[8]"
    said = _group(0, 3, {1: op}, global_ranks=[1, 3, 6])._lost(op)
    assert "ranks [2] (global ranks [6]) were lost" in said
    assert "global" not in _group(0, 3, {1: op})._lost(op)


def test_ranks_that_failed_at_other_sequence_numbers_did_not_post_differently():
    """A broadcast's receivers finish it while its root fails to send to a lost rank, then fail
    in the next one: seq 4 on the root, seq 5 elsewhere, which is progress (a 2+2 run with
    rank 2 SIGKILLed named it a mismatch of ops)."""
    said = _group(0, 3, {1: "broadcast (seq 5) of float32[8]"})._lost("broadcast (seq 4) of float32[8]")
    assert "different ops" not in said and "ranks [2] were lost" in said
