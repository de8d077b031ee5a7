"""What a group across hosts does with its watch's news (gosym.hier.lifetime.HierBase._watched,
_usable, _abort_all, _nccl_group), with stand-in inner groups and a dict store: the part of the
CUDA lost-rank path that needs no GPU. The watch itself runs on real Gloo groups in
test_hier_watch.py, and the whole path on CUDA in tests/jobs/hier (test_cuda_rank_lost)."""

from __future__ import annotations

import os
import threading

import pytest
from dictstore import DictStore

from gosym._errors import DistBackendError
from gosym.hier import lifetime
from gosym.hier.group import HierGroup
from gosym.hier.lifetime import GroupFailed, RankLost


class _Inner:
    """An inner group that counts its aborts; with `meet` its abort waits (at most 5 s) until
    every other group sharing that barrier is being aborted too."""

    def __init__(self, meet=None):
        self.aborted, self.meet = 0, meet

    def abort(self):
        if self.meet is not None:
            self.meet.wait(timeout=5)
        self.aborted += 1

    def shutdown(self):
        pass


class _Watch:
    def __init__(self):
        self.told = []

    def tell_dead(self, rank):
        self.told.append(("dead", rank))

    def tell_failed(self, origin):
        self.told.append(("failed", origin))


class _Runner:
    closed = False


class _Local:
    """The host group: its shutdown-abort, and its CUDA work's abort (with `meet`, as
    _Inner's)."""

    def __init__(self, meet=None):
        self.aborted, self.cuda_aborted, self.meet = False, [], meet

    def abort(self):
        self.aborted = True

    def abort_cuda(self, why):
        if self.meet is not None:
            self.meet.wait(timeout=5)
        self.cuda_aborted.append(why)


def _group(rank=0, size=3, meet=None):
    """Rank `rank` of a group of `size`, one rank a host, with NCCL (flat, down) and Gloo
    (flat, rail) inner groups."""
    g = HierGroup.__new__(HierGroup)
    g._rank, g._size, g._name, g._report_s = rank, size, "g", 5
    g._hosts, g._host, g._global_ranks = [[r] for r in range(size)], rank, list(range(size))
    g._broken, g._news, g._dead, g._flat_host = None, None, set(), {}
    g._store, g._watch, g._runner, g._local = DictStore(), _Watch(), _Runner(), _Local(meet)
    g._inner = {("flat", "cuda"): _Inner(meet), ("down", "cuda"): _Inner(meet),
                ("flat", "cpu"): _Inner(), ("rail", "cpu"): _Inner()}
    return g


def test_a_dead_predecessor_is_passed_on_recorded_and_its_nccl_groups_aborted():
    g = _group()
    g._watched(2, None, 2, RuntimeError("Connection closed by peer"))
    assert g._watch.told == [("dead", 2)]
    assert g._store.check(["dead/2"])
    assert isinstance(g._news, RankLost) and "rank 2 closed its connections" in str(g._news)
    assert [g._inner[k].aborted for k in (("flat", "cuda"), ("down", "cuda"))] == [1, 1]
    assert [g._inner[k].aborted for k in (("flat", "cpu"), ("rail", "cpu"))] == [0, 0]
    assert g._broken is None  # the next op reports it


def test_a_failure_told_elsewhere_is_passed_on_with_its_origin():
    g = _group()
    g._watched(2, 1, None, None)
    assert g._watch.told == [("failed", 1)]
    assert isinstance(g._news, GroupFailed) and "rank 1" in str(g._news)
    assert not g._store.keys


@pytest.mark.parametrize("how", ["news", "failure"])
def test_the_nccl_groups_and_the_host_groups_cuda_work_are_aborted_together(how):
    """One NCCL communicator's abort waits for the device while another's kernel still spins
    there (session 34: 60 s), a kernel of the host group's too (session 50: the survivor
    whose rail peer had failed, 2 x 2 ranks on one H200): each abort here waits until the
    other two started too, which one at a time never happens; on the watch's news and on
    this rank's own failure alike."""
    meet = threading.Barrier(3)
    g = _group(meet=meet)
    nccl = [pg for (_, dev), pg in g._inner.items() if dev == "cuda"]
    if how == "news":
        g._watched(2, None, 2, RuntimeError("closed"))
    else:
        g._failed("all_reduce", 3, RuntimeError("boom"))
    assert not meet.broken, "the aborts ran one after the other"
    # the reason names what the watch heard, where it heard it
    why = "the group across hosts 'g' failed"
    assert g._local.cuda_aborted == ([f"{why}: {g._news}"] if how == "news" else [why])
    assert [pg.aborted for pg in nccl] == [1, 1]


def test_a_host_only_group_keeps_its_host_groups_work():
    """Without NCCL groups (host tensors only) nothing waits for a device: the host group's
    work is left to its own failure."""
    g = _group()
    g._inner = {k: pg for k, pg in g._inner.items() if k[1] == "cpu"}
    g._watched(2, None, 2, RuntimeError("closed"))
    assert g._local.cuda_aborted == []


def test_the_next_op_raises_naming_the_dead_rank_without_waiting_for_its_report():
    g = _group(rank=0, size=3)
    g._store.set("failed/1", "all_reduce")  # rank 1 reported; rank 2 never will
    g._watched(2, None, 2, RuntimeError("closed"))
    with pytest.raises(DistBackendError) as e:
        g._usable("all_reduce")
    msg = str(e.value)
    assert msg.startswith("gosym: all_reduce across hosts failed on rank 0 of 3"), msg
    assert "ranks [2] were lost (they exited without leaving the group" in msg, msg
    assert "RankLost" in msg and g._local.aborted and not g._inner
    with pytest.raises(DistBackendError, match="unusable after an earlier failure"):
        g._usable("broadcast")


def test_news_on_a_group_that_failed_already_records_the_dead_rank_and_nothing_more():
    g = _group()
    g._broken = "gosym: all_reduce (seq 3) ... failed"
    g._watched(2, None, 2, RuntimeError("closed"))
    assert 2 in g._dead and g._store.check(["dead/2"])
    assert g._watch.told == [] and g._news is None
    assert all(pg.aborted == 0 for pg in g._inner.values())


def _alive(refs):
    return {k for k, r in refs.items() if r() is not None}


@pytest.mark.parametrize("then", ["op", "shutdown"])
def test_aborted_inner_groups_outlive_the_group(monkeypatch, then):
    """ProcessGroupNCCL's destructor, run where the last reference goes, waits for its
    watchdog, which after a timeout needs the GIL the destructor holds: neither the failed
    op (then=op; session 35 hung there for good) nor a shutdown after the watch's news
    (then=shutdown) may be the one to release an aborted NCCL group. Gloo groups are
    released: that closes their connections, which fails a peer's Gloo step at once."""
    import weakref

    monkeypatch.setattr(lifetime, "_PARKED", [])
    g = _group(rank=0, size=3)
    refs = {k: weakref.ref(pg) for k, pg in g._inner.items()}
    g._watched(2, None, 2, RuntimeError("closed"))
    if then == "op":
        with pytest.raises(DistBackendError):
            g._usable("all_reduce")
    else:
        g._close_inner(abort=False)
    assert not g._inner
    assert _alive(refs) == {("flat", "cuda"), ("down", "cuda")}, _alive(refs)


@pytest.mark.parametrize("users", [None, "3"])
def test_inner_nccl_groups_clean_up_and_raise_unless_the_user_chose(monkeypatch, users):
    seen = []
    monkeypatch.setattr(lifetime._c10d, "ProcessGroupNCCL",
                        lambda *a: seen.append(os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")))
    if users is None:
        monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    else:
        monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", users)
    lifetime._nccl_group(None, 0, 2, None)
    assert seen == ["2" if users is None else users]
    assert os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == users
