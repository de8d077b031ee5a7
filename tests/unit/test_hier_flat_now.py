"""A CUDA op that a group across hosts runs flat is the flat NCCL group's own op, issued at the
call with the caller's tensors and options (gosym.hier.algorithms._flat_now): what a plain
NCCL group would do, with nothing of gosym's in between. Where the choice is hierarchical,
host ops are pending, or arguments are compared across ranks, it takes the general path. The
inner NCCL group here is a stand-in that records what it was given (this machine has no GPU);
the tensors count as CUDA ones through the device lookup."""

from __future__ import annotations

import pytest
import torch
from torch._C import _distributed_c10d as _c10d

from gosym.hier import algorithms
from gosym.hier.group import HierGroup
from gosym.hier.runner import Runner


class _Inner:
    """The flat group's stand-in: each op returns a token naming it and keeps its arguments."""

    def __init__(self, fail=None):
        self.calls, self._fail = [], fail

    def _op(self, name, *args):
        if self._fail is not None:
            raise self._fail
        self.calls.append((name, args))
        return ("work", name)

    def allreduce(self, ts, opts):
        return self._op("allreduce", ts, opts)

    def broadcast(self, ts, opts):
        return self._op("broadcast", ts, opts)

    def _allgather_base(self, out, inp, opts):
        return self._op("_allgather_base", out, inp, opts)

    def _reduce_scatter_base(self, out, inp, opts):
        return self._op("_reduce_scatter_base", out, inp, opts)


def _group(choice="flat", check_args=False, inner=None):
    """A HierGroup of 4 ranks on 2 hosts with only what the op's call path reads."""
    g = HierGroup.__new__(HierGroup)
    g._rank, g._size, g._name = 0, 4, "t"
    g._hosts, g._where = [[0, 1], [2, 3]], {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    g._shape, g._choice, g._check_args = "2x2", choice, check_args
    g._paths, g._seq, g._broken, g._cuda = {}, 0, None, None
    g._runner = Runner("t")
    g._inner = {("flat", "cuda"): inner if inner is not None else _Inner()}
    return g


@pytest.fixture(autouse=True)
def _on_cuda(monkeypatch):
    """The tensors below live on the CPU; the lookup says cuda:0, as for GPU tensors."""
    monkeypatch.setattr(algorithms, "_op_device", lambda keep: 0)


def _ops(g):
    w, x = g._size, torch.randn(8)
    out = torch.full((8 * w,), float("nan"))
    rs_in, rs_out = torch.randn(8 * w), torch.full((8,), float("nan"))
    ar = _c10d.AllreduceOptions()
    bc = _c10d.BroadcastOptions()
    bc.rootRank = 3
    ag, rs = _c10d.AllgatherOptions(), _c10d.ReduceScatterOptions()
    return [
        ("all_reduce", lambda: g.allreduce([x], ar), ("allreduce", ([x], ar))),
        ("broadcast", lambda: g.broadcast([x], bc), ("broadcast", ([x], bc))),
        ("all_gather_into_tensor", lambda: g._allgather_base(out, x, ag),
         ("_allgather_base", (out, x, ag))),
        ("reduce_scatter_tensor", lambda: g._reduce_scatter_base(rs_out, rs_in, rs),
         ("_reduce_scatter_base", (rs_out, rs_in, rs))),
    ]


def _same(a, b):
    """The very objects (a list's elements: the group passes the caller's tensors on)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return a is b


def test_flat_cuda_ops_are_the_inner_groups_own():
    g = _group()
    inner = g._inner[("flat", "cuda")]
    for i, (op, call, (name, args)) in enumerate(_ops(g)):
        w = call()
        assert w == ("work", name), op
        got_name, got = inner.calls[-1]
        assert got_name == name
        assert len(got) == len(args) and all(_same(a, b) for a, b in zip(got, args)), op
        assert g._paths[f"{op}/flat"] == 1
        assert g._seq == i + 1  # every op takes its sequence number, as on the general path
        assert g._cuda == 0


def test_hierarchical_choice_takes_the_general_path():
    g = _group(choice="hier")
    assert g._flat_now("all_reduce", 32, torch.zeros(8),
                       lambda pg: pytest.fail("issued flat")) is None
    assert g._seq == 0 and not g._paths


def test_odd_tensors_pending_host_ops_or_checked_arguments_take_the_general_path():
    g = _group()
    for odd in (torch.zeros(4, 2).t(), torch.zeros(0)):  # not contiguous; empty
        assert g._flat_now("all_reduce", 32, odd, lambda pg: pytest.fail("issued flat")) is None
    g._runner._pending = 1  # a host op posted earlier and not yet run goes first
    assert g._flat_now("all_reduce", 32, torch.zeros(8),
                       lambda pg: pytest.fail("issued flat")) is None
    g = _group(check_args=True)
    assert g._flat_now("all_reduce", 32, torch.zeros(8),
                       lambda pg: pytest.fail("issued flat")) is None


def test_a_failing_flat_op_is_the_groups_failure(monkeypatch):
    boom = RuntimeError("NCCL error: unhandled system error")
    g = _group(inner=_Inner(fail=boom))
    seen = []

    def failed(what, seq, e, keep=None):
        seen.append((what, seq, e))
        return RuntimeError(f"gosym: {what} (seq {seq}) failed: {e}")

    monkeypatch.setattr(g, "_failed", failed)
    with pytest.raises(RuntimeError, match=r"all_reduce \(seq 1\) failed: NCCL error"):
        g.allreduce([torch.randn(8)], _c10d.AllreduceOptions())
    assert seen == [("all_reduce", 1, boom)]
