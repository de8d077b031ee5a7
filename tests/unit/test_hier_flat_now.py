"""An op that a group across hosts runs flat is the flat inner group's own op, issued at the
call with the caller's tensors and options (gosym.hier.algorithms._flat_now): what a plain
NCCL (CUDA) or Gloo (host) group would do, with nothing of gosym's in between but, on the
host, the wait and the naming of a failure. Where the choice is hierarchical, host ops are
pending, arguments are compared across ranks, or Gloo would not take the op as it is, it takes
the general path. The inner groups here are stand-ins that record what they were given (this
machine has no GPU; the real Gloo runs in tests/jobs/hier); the tensors count as CUDA ones
through the device lookup where the test says so."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from gosym.hier import algorithms, schedule
from gosym.hier.group import HierGroup
from gosym.hier.runner import Runner
from gosym.hier.tensors import _opts


class _Inner:
    """The flat NCCL group's stand-in: each op returns a token naming it and keeps its
    arguments."""

    def __init__(self, fail=None):
        self.calls, self._fail = [], fail

    def _op(self, name, *args):
        if self._fail is not None:
            raise self._fail
        self.calls.append((name, args))
        return ("work", name)

    def alltoall_base(self, out, inp, out_splits, in_splits, opts):
        return self._op("alltoall_base", out, inp, out_splits, in_splits, opts)

    def allreduce(self, ts, opts):
        return self._op("allreduce", ts, opts)

    def broadcast(self, ts, opts):
        return self._op("broadcast", ts, opts)

    def _allgather_base(self, out, inp, opts):
        return self._op("_allgather_base", out, inp, opts)

    def _reduce_scatter_base(self, out, inp, opts):
        return self._op("_reduce_scatter_base", out, inp, opts)

    def send(self, ts, peer, tag):
        return self._op("send", ts, peer, tag)

    def recv(self, ts, peer, tag):
        return self._op("recv", ts, peer, tag)

    def recv_anysource(self, ts, tag):
        return self._op("recv_anysource", ts, tag)


def _group(choice="flat", check_args=False, inner=None):
    """A HierGroup of 4 ranks on 2 hosts with only what the op's call path reads."""
    g = HierGroup.__new__(HierGroup)
    g._rank, g._size, g._name = 0, 4, "t"
    g._hosts, g._where = [[0, 1], [2, 3]], {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    g._shape, g._choice, g._link, g._check_args = "2x2", choice, "loopback", check_args
    g._n, g._balanced = 2, True
    g._paths, g._seq, g._broken, g._cuda, g._flat_host = {}, 0, None, None, {}
    g._runner = Runner("t")
    g._inner = {("flat", "cuda"): inner if inner is not None else _Inner()}
    return g


class _GlooWork:
    """Gloo's Work, as the stand-in hands it out: done at once, or when finish() is called
    (then with an error if given one). As torch 2.11's Gloo, reduce_scatter_tensor's has no
    future."""

    def __init__(self, name, later=False, error=None):
        self.name, self.waited, self._error = name, 0, error
        self._fut = torch.futures.Future()
        self._done = threading.Event()
        self._has_future = name != "_reduce_scatter_base"
        if not later:
            self.finish()

    def finish(self):
        if self._error is not None:
            self._fut.set_exception(self._error)
        else:
            self._fut.set_result([])
        self._done.set()

    def wait(self, timeout=None):
        """As Gloo's: with a timeout, RuntimeError while the op runs on (counted: waited)."""
        if timeout is not None and not self._done.wait(timeout.total_seconds()):
            raise RuntimeError("Operation timed out!")
        self.waited += 1
        self._fut.wait()
        return True

    def get_future(self):
        if not self._has_future:
            raise RuntimeError("Work::getFuture not implemented.")
        return self._fut

    def is_completed(self):
        return self._fut.done()

    def exception(self):
        return self._error if self._fut.done() else None


class _Gloo(_Inner):
    """The flat Gloo group's stand-in: each op returns a _GlooWork."""

    def __init__(self, later=False, error=None):
        super().__init__()
        self.works, self._later, self._error = [], later, error

    def _op(self, name, *args):
        super()._op(name, *args)
        self.works.append(_GlooWork(name, self._later, self._error))
        return self.works[-1]


def _host_group(inner, choice="flat"):
    g = _group(choice)
    g._inner = {("flat", "cpu"): inner}
    return g


@pytest.fixture
def _on_cuda(monkeypatch):
    """The tensors below live on the CPU; the lookup says cuda:0, as for GPU tensors."""
    monkeypatch.setattr(algorithms, "_op_device", lambda keep: 0)


def _ops(g, async_op=True):
    w, x = g._size, torch.randn(8)
    out = torch.full((8 * w,), float("nan"))
    rs_in, rs_out = torch.randn(8 * w), torch.full((8,), float("nan"))
    ar = _c10d.AllreduceOptions()
    bc = _c10d.BroadcastOptions()
    bc.rootRank = 3
    ag, rs = _c10d.AllgatherOptions(), _c10d.ReduceScatterOptions()
    a2a_in, a2a_out = torch.randn(2 * w, 3), torch.full((2 * w, 3), float("nan"))
    aa = _c10d.AllToAllOptions()
    for o in (ar, bc, ag, rs, aa):
        o.asyncOp = async_op
    return [
        ("all_reduce", lambda: g.allreduce([x], ar), ("allreduce", ([x], ar))),
        ("broadcast", lambda: g.broadcast([x], bc), ("broadcast", ([x], bc))),
        ("all_gather_into_tensor", lambda: g._allgather_base(out, x, ag),
         ("_allgather_base", (out, x, ag))),
        ("reduce_scatter_tensor", lambda: g._reduce_scatter_base(rs_out, rs_in, rs),
         ("_reduce_scatter_base", (rs_out, rs_in, rs))),
        ("all_to_all_single", lambda: g.alltoall_base(a2a_out, a2a_in, [], [], aa),
         ("alltoall_base", (a2a_out, a2a_in, [], [], aa))),
    ]


def _same(a, b):
    """The very objects (a list's elements: the group passes the caller's tensors on)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return a is b


@pytest.mark.usefixtures("_on_cuda")
def test_flat_cuda_ops_are_the_inner_groups_own():
    g = _group()
    inner = g._inner[("flat", "cuda")]
    for i, (op, call, (name, args)) in enumerate(_ops(g)):
        w = call()
        assert w == ("work", name), op
        got_name, got = inner.calls[-1]
        assert got_name == name
        assert len(got) == len(args) and all(_same(a, b) for a, b in zip(got, args)), op
        # all_to_all_single's schedule is for host tensors only: no choice asked on CUDA
        assert g._paths.get(f"{op}/flat", 0) == (op in schedule.OPS and op != "all_to_all_single")
        assert g._seq == i + 1  # every op takes its sequence number, as on the general path
        assert g._cuda == 0


@pytest.mark.usefixtures("_on_cuda")
def test_hierarchical_choice_takes_the_general_path():
    g = _group(choice="hier")
    assert g._flat_now("all_reduce", 32, torch.zeros(8),
                       lambda pg, v: pytest.fail("issued flat")) is algorithms.GENERAL
    assert g._seq == 0 and not g._paths


@pytest.mark.usefixtures("_on_cuda")
def test_odd_tensors_pending_host_ops_or_checked_arguments_take_the_general_path():
    g = _group()
    for odd in (torch.zeros(4, 2).t(), torch.zeros(0)):  # not contiguous; empty
        assert g._flat_now("all_reduce", 32, odd,
                           lambda pg, v: pytest.fail("issued flat")) is algorithms.GENERAL
    g._runner.pending = 1  # a host op posted earlier and not yet run goes first
    assert g._flat_now("all_reduce", 32, torch.zeros(8),
                       lambda pg, v: pytest.fail("issued flat")) is algorithms.GENERAL
    g = _group(check_args=True)
    assert g._flat_now("all_reduce", 32, torch.zeros(8),
                       lambda pg, v: pytest.fail("issued flat")) is algorithms.GENERAL


@pytest.mark.usefixtures("_on_cuda")
def test_premul_sum_on_cuda_takes_the_general_path(monkeypatch):
    """NCCL 2.28 through torch 2.11 returns zeros for bf16 PREMUL_SUM with a host factor: on
    CUDA tensors all_reduce and reduce_scatter_tensor with it take the general path (whose
    local step applies the factor) whatever the choice; SUM and AVG stay NCCL's own."""
    g = _group()
    general = []
    monkeypatch.setattr(g, "_in_place", lambda what, *a: general.append(what) or "general",
                        raising=False)
    monkeypatch.setattr(g, "_post", lambda what, *a: general.append(what) or "general",
                        raising=False)
    t, out = torch.zeros(16, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16)
    for op, flat in ((dist._make_nccl_premul_sum(0.5), False), (dist.ReduceOp.SUM, True),
                     (dist.ReduceOp.AVG, True)):
        general.clear()
        w = g.allreduce([t], _opts(_c10d.AllreduceOptions, reduceOp=op))
        assert (w == ("work", "allreduce"), general) == (flat, [] if flat else ["all_reduce"])
        general.clear()
        w = g._reduce_scatter_base(out, t, _opts(_c10d.ReduceScatterOptions, reduceOp=op))
        assert (w == ("work", "_reduce_scatter_base"), general) == (
            flat, [] if flat else ["reduce_scatter_tensor"])


@pytest.mark.usefixtures("_on_cuda")
def test_dtypes_nccl_does_not_move_as_themselves_take_the_general_path():
    g = _group()
    for dt in (torch.uint16, torch.uint32, torch.complex64, torch.float8_e4m3fn):
        t = torch.zeros(8, dtype=dt)
        assert g._flat_now("all_gather_into_tensor", 8, t,
                           lambda pg, v: pytest.fail("issued flat")) is algorithms.GENERAL, dt
    assert g._seq == 0


@pytest.mark.usefixtures("_on_cuda")
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


# ---- host tensors: Gloo's own op -------------------------------------------------------


def _as_given(got, want):
    """What the Gloo stand-in got against what the op was given: the very objects, or the
    1-D view over the very memory where the op flattens a two-buffer op's tensor."""
    if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and got is not want:
        return got.dim() == 1 and got.data_ptr() == want.data_ptr() and \
            got.numel() == want.numel()
    return _same(got, want)


def test_flat_host_ops_synchronous_are_glooes_own_waited_at_the_call():
    gloo = _Gloo()
    g = _host_group(gloo)
    for i, (op, call, (name, args)) in enumerate(_ops(g, async_op=False)):
        assert call() is None, op  # waited here: torch's wrapper has nothing to wait for
        got_name, got = gloo.calls[-1]
        assert got_name == name and len(got) == len(args), op
        assert all(_as_given(a, b) for a, b in zip(got, args)), op
        assert gloo.works[-1].waited == 1, op
        assert g._paths.get(f"{op}/flat", 0) == (op in schedule.OPS) and g._seq == i + 1


def test_flat_host_ops_asynchronous_finish_when_gloos_future_does():
    """(reduce_scatter_tensor's Gloo Work has no future: the worker waits for it.)"""
    gloo = _Gloo(later=True)
    g = _host_group(gloo)
    for op, call, _ in _ops(g):
        w = call()
        assert not w.is_completed(), op
        gloo.works[-1].finish()
        assert w.wait(timeout=10) and w.is_completed(), op
        assert w.get_future().wait() is not None, op
    g._runner.close()


def test_flat_host_op_without_a_future_is_waited_by_the_worker(monkeypatch):
    """Gloo's reduce_scatter_tensor Work has no future (torch 2.11): issued flat and
    asynchronous, it was left in the ops a barrier waits for, never finished, and the CPU
    fuzzer's next barrier across hosts (1+2, two programs) hung. The worker waits for it
    now: the ops after it take the general path (the worker is busy), the barrier has
    nothing of it to wait for, and a failure names the op."""
    gloo = _Gloo(later=True)
    g = _host_group(gloo)
    rs = _c10d.ReduceScatterOptions()
    w = g._reduce_scatter_base(torch.full((8,), float("nan")), torch.randn(8 * g._size), rs)
    assert [n for n, _ in gloo.calls] == ["_reduce_scatter_base"]  # issued at the call
    assert not g._flat_host and not g._runner.idle() and not w.is_completed()
    g._wait_flat_host()  # returns: nothing of the op's is left for the barrier
    gloo.works[-1].finish()
    assert w.wait(timeout=10) and w.is_completed()
    assert gloo.works[-1].waited == 1
    g._runner.close()

    seen = []

    def failed(what, seq, e, keep=None):
        seen.append((what, seq, e))
        return RuntimeError(f"gosym: {what} (seq {seq}) failed: {e}")

    boom = RuntimeError("Connection closed by peer")
    g = _host_group(_Gloo(error=boom))
    monkeypatch.setattr(g, "_failed", failed)
    w = g._reduce_scatter_base(torch.full((8,), float("nan")), torch.randn(8 * g._size), rs)
    with pytest.raises(RuntimeError, match=r"reduce_scatter_tensor \(seq 1\) failed: Connection"):
        w.wait(timeout=10)
    assert seen == [("reduce_scatter_tensor", 1, boom)]
    g._runner.close()


def test_barrier_waits_for_flat_host_ops_still_running():
    """As Gloo's barrier waits for the work posted before it."""
    gloo = _Gloo(later=True)
    g = _host_group(gloo)
    x = torch.randn(8)
    w = g.allreduce([x], _c10d.AllreduceOptions())
    assert list(g._flat_host) == [w]
    waiter = threading.Thread(target=g._wait_flat_host)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # the barrier's first step waits for the op
    gloo.works[-1].finish()
    waiter.join(10)
    assert not waiter.is_alive() and w.is_completed() and not g._flat_host


def test_flat_host_op_failure_names_the_op_sync_and_async(monkeypatch):
    boom = RuntimeError("Connection closed by peer [10.0.0.2]:1234")
    seen = []

    def failed(what, seq, e, keep=None):
        seen.append((what, seq, e))
        return RuntimeError(f"gosym: {what} (seq {seq}) failed: ranks [3] were lost; {e}")

    g = _host_group(_Gloo(error=boom))
    monkeypatch.setattr(g, "_failed", failed)
    x = torch.randn(8)
    sync = _c10d.AllreduceOptions()
    sync.asyncOp = False
    with pytest.raises(RuntimeError, match=r"all_reduce \(seq 1\) failed: ranks \[3\] were lost"):
        g.allreduce([x], sync)
    w = g.allreduce([x], _c10d.AllreduceOptions())  # fails later, on the worker
    with pytest.raises(RuntimeError, match=r"all_reduce \(seq 2\) failed: ranks \[3\]"):
        w.wait(timeout=30)
    assert seen == [("all_reduce", 1, boom), ("all_reduce", 2, boom)]
    g._runner.close()


def _lost(g):
    """What the watch does on hearing that rank 3 was lost (HierBase._watched, the parts a
    flat host op sees): the news kept, the flat path closed, pending host ops failed."""
    g._news = RuntimeError("rank 3 closed its connections without leaving the group")
    g._close_flat()
    g._fail_flat_host()


def test_flat_host_op_waiting_for_a_peer_that_gave_up_ends_on_the_watchs_news(monkeypatch):
    """Gloo's op waits for a peer until Gloo's timeout, and no abort of Gloo's ends it: at 2
    hosts x 2 ranks a rank lost on one host left a live rank of the other waiting in the flat
    all_reduce, and the others named it lost too. A synchronous flat host op waits in slices
    and raises the group's failure once the watch's news closes the flat path; an
    asynchronous one is failed with the news on the worker, and Gloo's late failure does not
    finish it again."""
    seen = []

    def failed(what, seq, e, keep=None):
        seen.append((what, seq, str(e)))
        return RuntimeError(f"gosym: {what} (seq {seq}) failed: ranks [3] were lost; {e}")

    gloo = _Gloo(later=True, error=RuntimeError("Connection closed by peer"))
    g = _host_group(gloo)
    g._news = None
    monkeypatch.setattr(g, "_failed", failed)
    sync = _c10d.AllreduceOptions()
    sync.asyncOp = False
    raised = []

    def call():
        try:
            g.allreduce([torch.randn(8)], sync)
        except RuntimeError as e:
            raised.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(0.35)
    assert caller.is_alive() and not raised  # still waiting: Gloo's op has not ended
    w = g.allreduce([torch.randn(8)], _c10d.AllreduceOptions())  # the caller's, on a thread
    assert not w.is_completed() and len(g._flat_host) == 1
    _lost(g)
    caller.join(5)
    assert not caller.is_alive() and len(raised) == 1
    assert "all_reduce (seq 1) failed: ranks [3] were lost" in str(raised[0])
    with pytest.raises(RuntimeError, match=r"all_reduce \(seq 2\) failed: ranks \[3\]"):
        w.wait(timeout=10)
    assert not g._flat_host
    for work in gloo.works:  # Gloo's ops end at last (its timeout, the peers' exit)
        work.finish()
    assert sorted(seen) == [("all_reduce", 1, str(g._news)), ("all_reduce", 2, str(g._news))]
    g._runner.close()


def test_flat_host_op_failing_after_shutdown_starts_no_worker():
    """An op still in flight when the group shuts down fails plainly: no worker thread is
    started again to ask the other ranks for reports (torn down too)."""
    gloo = _Gloo(later=True, error=RuntimeError("Connection closed by peer"))
    g = _host_group(gloo)
    w = g.allreduce([torch.randn(8)], _c10d.AllreduceOptions())
    g._runner.close()
    gloo.works[-1].finish()
    with pytest.raises(RuntimeError, match=r"all_reduce \(seq 1\) across hosts failed as the "
                       r"group was shut down: Connection closed"):
        w.wait(timeout=10)
    assert g._runner._thread is None


def test_what_gloo_does_not_take_as_it_is_takes_the_general_path(monkeypatch):
    """Host reductions Gloo does not run as they are (AVG, PREMUL_SUM) and dtypes it does
    not move as themselves go to the general path, through the ops' own checks; MAX runs
    flat."""
    gloo = _Gloo()
    g = _host_group(gloo)
    posted = []
    monkeypatch.setattr(g, "_post", lambda what, *a, **k: posted.append(what))

    for t, red in ((torch.randn(8), dist.ReduceOp.AVG),
                   (torch.randn(8), dist._make_nccl_premul_sum(2.0)),
                   (torch.zeros(8, dtype=torch.int16), dist.ReduceOp.SUM)):
        g.allreduce([t], _opts(_c10d.AllreduceOptions, True, reduceOp=red))
    g._reduce_scatter_base(torch.empty(2), torch.randn(8),
                           _opts(_c10d.ReduceScatterOptions, True, reduceOp=dist.ReduceOp.AVG))
    g.broadcast([torch.zeros(8, dtype=torch.complex64)], _c10d.BroadcastOptions())
    assert posted == ["all_reduce"] * 3 + ["reduce_scatter_tensor", "broadcast"], posted
    assert g._seq == 0 and not gloo.calls
    t = torch.randn(8)
    g.allreduce([t], _opts(_c10d.AllreduceOptions, True, reduceOp=dist.ReduceOp.MAX))
    assert posted == ["all_reduce"] * 3 + ["reduce_scatter_tensor", "broadcast"]
    assert g._seq == 1 and len(gloo.calls) == 1


def test_host_all_to_all_single_of_equal_splits_may_take_host_blocks(monkeypatch):
    """all_to_all_single of host tensors without split sizes asks the choice (hierarchical:
    the general path, where _a2a_blocks runs); with split sizes (even equal ones: another
    rank's may differ), an empty one, one whose blocks from the other hosts outgrow the
    mapped buffer, or a layout without host blocks it runs flat."""
    gloo = _Gloo()
    g = _host_group(gloo, choice="hier")
    posted = []
    monkeypatch.setattr(g, "_post", lambda what, *a, **k: posted.append(what))
    inp, out = torch.randn(8, 3), torch.empty(8, 3)
    aa = _c10d.AllToAllOptions()
    assert g._a2a_applies(inp, ())
    g.alltoall_base(out, inp, [], [], aa)
    assert posted == ["all_to_all_single"] and not gloo.calls
    for outs, ins in (([2, 2, 2, 2], [2, 2, 2, 2]), ([1, 3, 2, 2], [2, 2, 3, 1])):
        assert not g._a2a_applies(inp, (*outs, *ins))
        g.alltoall_base(out, inp, outs, ins, aa)
        assert gloo.calls[-1][0] == "alltoall_base" and len(posted) == 1
    assert not g._a2a_applies(torch.empty(0, 3), ())
    # blocks from the other hosts larger than the mapped buffer: flat (96 bytes a rank, half
    # of them from the other host)
    for most, applies in ((48, True), (47, False)):
        monkeypatch.setattr(algorithms, "ROWS_MAPPED_MAX", most)
        assert g._a2a_applies(inp, ()) is applies, most
    g.alltoall_base(out, inp, [], [], aa)
    assert gloo.calls[-1][0] == "alltoall_base" and len(posted) == 1
    monkeypatch.undo()
    g._hosts = [[0, 2], [1, 3]]  # a host's ranks not consecutive: no host blocks
    assert not g._a2a_applies(inp, ())
    assert g._a2a_blocks_max() == 0


@pytest.mark.parametrize("op", ["all_gather_into_tensor", "reduce_scatter_tensor"])
def test_coalesced_ops_are_done_when_every_one_is(op):
    """A coalesced call runs one op per tensor, and they may take different paths: an empty
    last tensor takes the general path and was done at once, while the flat ops before it
    still ran on Gloo's threads; its Work was the call's, so the caller read unwritten
    outputs (the CPU fuzzer across hosts 2+1, all_gather_into_tensor of sizes 2, 1, 0). The
    call's Work is now done when every op is."""
    gloo = _Gloo(later=True)
    g = _host_group(gloo)
    w, k = g._size, [2, 1, 0]
    if op == "all_gather_into_tensor":
        outs = [torch.full((m * w,), float("nan")) for m in k]
        ins = [torch.randn(m) for m in k]
        call = g.allgather_into_tensor_coalesced
    else:
        outs = [torch.full((m,), float("nan")) for m in k]
        ins = [torch.randn(m * w) for m in k]
        call = g.reduce_scatter_tensor_coalesced
    work = call(outs, ins)
    # the first op flat at the call; the second too (all_gather) or, after Gloo's
    # reduce_scatter_tensor Work that has no future, on the worker once that one is done
    assert len(gloo.works) == (2 if op == "all_gather_into_tensor" else 1)
    assert not work.is_completed()
    fut = work.get_future()
    waiter = threading.Thread(target=work.wait)
    waiter.start()
    gloo.works[0].finish()
    for _ in range(1000):
        if len(gloo.works) == 2:
            break
        threading.Event().wait(0.01)
    waiter.join(0.3)
    assert waiter.is_alive() and not work.is_completed() and not fut.done()  # op 1 still runs
    gloo.works[1].finish()
    waiter.join(10)
    assert not waiter.is_alive() and work.is_completed() and work.is_success()
    assert fut.wait() is outs
    g._runner.close()


def test_coalesced_synchronous_ops_have_no_work_and_a_failure_is_the_calls():
    g = _host_group(_Gloo())
    opts = _c10d.AllgatherOptions()
    opts.asyncOp = False
    assert g.allgather_into_tensor_coalesced([torch.zeros(8)], [torch.ones(2)], opts) is None
    boom = RuntimeError("Connection closed by peer")
    gloo = _Gloo(later=True, error=boom)
    g = _host_group(gloo)
    g._failed = lambda what, seq, e, keep=None: RuntimeError(f"gosym: {what} (seq {seq}): {e}")
    work = g.allgather_into_tensor_coalesced([torch.zeros(8), torch.zeros(4)],
                                             [torch.ones(2), torch.ones(1)])
    for gw in gloo.works:
        gw.finish()
    with pytest.raises(RuntimeError, match=r"all_gather_into_tensor \(seq 1\): Connection"):
        work.wait()
    with pytest.raises(RuntimeError, match="Connection closed"):
        work.get_future().wait()
    assert work.is_completed() and not work.is_success()
    g._runner.close()


def test_a_failed_send_or_receive_across_hosts_is_the_groups_failure():
    """A send or receive across hosts is the flat Gloo group's own, and its failure (a peer
    lost: "Connection reset by peer", or Gloo's timeout) was Gloo's words alone, where a
    collective's names the op and the lost ranks (hier_worker's die-p2p scenario: three
    ranks of four raised Gloo's errors). Each Work's failure is now the group's (_failed),
    asked once, named by the op and its peer; one at the call too."""
    boom = RuntimeError("Connection reset by peer")
    gloo = _Gloo(later=True, error=boom)
    g = _host_group(gloo)
    g._cpu_p2p_local, g._host = False, 0
    asked = []

    def failed(what, seq, e, keep=None):
        asked.append((what, seq))
        return RuntimeError(f"gosym: {what} across hosts failed: ranks [3] were lost; cause: {e}")
    g._failed = failed
    send = g.send([torch.ones(3)], 2, 0)
    recv = g.recv([torch.zeros(3)], 3, 0)
    anysrc = g.recv_anysource([torch.zeros(3)], 0)
    assert [c[0] for c in gloo.calls] == ["send", "recv", "recv_anysource"]
    assert not send.is_completed()
    for w in gloo.works:
        w.finish()
    with pytest.raises(RuntimeError, match=r"gosym: send to rank 2 across hosts .*lost; cause: Connection reset"):
        send.wait()
    with pytest.raises(RuntimeError, match=r"gosym: send to rank 2 "):
        send.wait()  # the same error again, not asked twice
    with pytest.raises(RuntimeError, match=r"gosym: recv from rank 3 .*Connection reset"):
        recv.get_future().wait()
    assert str(anysrc.exception()).startswith("gosym: recv from any source")
    assert asked == [("send to rank 2", None), ("recv from rank 3", None), ("recv from any source", None)]
    g = _host_group(_Gloo())
    g._cpu_p2p_local, g._host = False, 0
    g._group = lambda *a: _Inner(fail=boom)  # Gloo refuses at the call
    g._failed = failed
    with pytest.raises(RuntimeError, match=r"gosym: recv from rank 1 .*Connection reset"):
        g.recv([torch.zeros(2)], 1, 0)
    g._runner.close()
