"""CUDA send/recv across hosts (gosym.hier.group.HierGroup._p2p_group, _p2p_connect): what each
rank asks of its inner NCCL groups, recorded by stand-ins. NCCL pairs a pair's unbatched ops on
one communicator in call order, send with receive, and makes the pair's communicator at its
first op, both ranks together; torch hands a Python group's batch_isend_irecv over one op at a
time. So for any order of one batch, each inner group must see, pair by pair, one rank's sends
matched by the other's receives in order, and both ranks must first use the inner groups in one
order. The real NCCL runs in tests/jobs/hier (test_cuda_across_hosts, the fuzzer on CUDA)."""

from __future__ import annotations

import itertools

import pytest
import torch

from gosym._errors import DistBackendError
from gosym.hier.group import HierGroup


class _Work:
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class _Inner:
    """An inner group that logs (kind, op, peer) into its rank's log."""

    def __init__(self, kind, log):
        self.kind, self.log = kind, log

    def send(self, tensors, peer, tag):
        self.log.append((self.kind, "send", peer))
        return _Work()

    def recv(self, tensors, peer, tag):
        self.log.append((self.kind, "recv", peer))
        return _Work()


def _rank(rank, size, per_host=1):
    """Rank `rank` of a group of `size` ranks, `per_host` a host, its inner groups and its
    host's gosym group (kind "local", by local index) logging."""
    g = HierGroup.__new__(HierGroup)
    g._rank, g._size, g._host = rank, size, rank // per_host
    g._where = {r: (r // per_host, r % per_host) for r in range(size)}
    g._cpu_p2p_local, g._broken, g._p2p_peers = False, None, set()
    g.log, inner = [], {}
    g._local = _Inner("local", g.log)

    def group(kind, dev):
        assert dev == "cuda", dev
        return inner.setdefault(kind, _Inner(kind, g.log))

    g._group = group
    return g


def _run(groups, batches):
    """Each rank's batch (a list of ("send" | "recv", peer)) posted op by op, as torch's
    batch_isend_irecv posts a Python group's."""
    t = torch.empty(4, device="meta")  # not a host tensor: the CUDA path, without a GPU
    for g, batch in zip(groups, batches):
        for op, peer in batch:
            (g.send if op == "send" else g.recv)([t], peer, 0)


def _check_matched(groups):
    """On every inner group, every pair's ops pair up in order, send with receive, and the
    pair's ranks first used the inner groups in one order (NCCL makes a pair's communicator
    at its first op there: two ranks making different ones first would wait on each other)."""
    for a, b in itertools.combinations(range(len(groups)), 2):
        def ops(me, peer):
            return [(k, op) for k, op, p in groups[me].log if p == peer]

        mine, theirs = ops(a, b), ops(b, a)
        for kind in {k for k, _ in mine + theirs}:
            sa = [op for k, op in mine if k == kind]
            sb = [op for k, op in theirs if k == kind]
            assert len(sa) == len(sb), (a, b, kind, sa, sb)
            assert all(x != y for x, y in zip(sa, sb)), (a, b, kind, sa, sb)
        first_a = list(dict.fromkeys(k for k, _ in mine))
        first_b = list(dict.fromkeys(k for k, _ in theirs))
        assert first_a == first_b, (a, b, first_a, first_b)


@pytest.mark.parametrize("order", ["sends first", "receives first", "mixed"])
def test_a_pairs_ops_pair_up_in_any_batch_order(order):
    groups = [_rank(r, 2) for r in range(2)]
    both = {"sends first": ([("send", 1), ("recv", 1)], [("send", 0), ("recv", 0)]),
            "receives first": ([("recv", 1), ("send", 1)], [("recv", 0), ("send", 0)]),
            "mixed": ([("send", 1), ("recv", 1)] * 3, [("recv", 0), ("send", 0)] * 3)}[order]
    _run(groups, both)
    _check_matched(groups)
    # each direction on an inner group of its own: one side only sends there
    for g in groups:
        for kind in {k for k, _, _ in g.log}:
            ops = {op for k, op, _ in g.log[2:] if k == kind}  # after the connect's two
            assert len(ops) <= 1, (g._rank, kind, g.log)


def test_every_pair_of_three_hosts_sends_first():
    """dist.batch_isend_irecv of every rank sending to every other, then receiving (the
    fuzzer's p2p_all): each pair's first ops are that pair's connect, in one order."""
    groups = [_rank(r, 3) for r in range(3)]
    batches = [[("send", p) for p in range(3) if p != r] + [("recv", p) for p in range(3) if p != r]
               for r in range(3)]
    _run(groups, batches)
    _check_matched(groups)
    for g, batch in zip(groups, batches):  # one connect (a byte each way) per peer, once
        assert len(g.log) == len(batch) + 2 * 2, g.log
        assert g._p2p_peers == {p for p in range(3) if p != g._rank}


def test_pairs_of_one_host_take_its_gosym_group():
    """2 hosts x 2 ranks, every rank sending to every other first: pairs of one host go
    through the host's gosym group (no NCCL communicator made for them), the others as
    above."""
    groups = [_rank(r, 4, per_host=2) for r in range(4)]
    batches = [[("send", p) for p in range(4) if p != r] + [("recv", p) for p in range(4) if p != r]
               for r in range(4)]
    _run(groups, batches)
    for g in groups:
        mate = g._rank ^ 1
        far = {p for p in range(4) if p // 2 != g._rank // 2}
        # the host's group names its peer by local index; NCCL's by group rank
        assert sorted((op, p) for k, op, p in g.log if k == "local") == [("recv", mate % 2),
                                                                         ("send", mate % 2)], g.log
        assert {p for k, _, p in g.log if k != "local"} == far, g.log
        assert g._p2p_peers == far
    for g in groups:  # the local group logs by local index: leave those out of the pairing
        g.log = [e for e in g.log if e[0] != "local"]
    _check_matched(groups)


class _Failing(_Inner):
    """A host group whose op raises at post ("post") or at its Work's wait ("wait")."""

    def __init__(self, log, when):
        super().__init__("local", log)
        self.when = when

    def send(self, tensors, peer, tag):
        super().send(tensors, peer, tag)
        if self.when == "post":
            raise DistBackendError("host group aborted")
        work = _Work()
        work.wait = lambda timeout=None: (_ for _ in ()).throw(RuntimeError("host group aborted"))
        return work


@pytest.mark.parametrize("when", ["post", "wait"])
def test_a_host_pairs_failure_is_the_groups(when):
    """A send to a rank of this host whose host group fails (its CUDA work aborted by the
    watch's news, session 51: 2 x 2 ranks, die-p2p) raises the group's error (_failed: the
    op, the peer and the lost ranks), not the host group's own words."""
    g = _rank(0, 4, per_host=2)
    g._local = _Failing(g.log, when)
    g._failed = lambda what, seq, e, keep=None: RuntimeError(f"group: {what}: {e}")
    t = torch.empty(4, device="meta")
    with pytest.raises(RuntimeError, match=r"^group: send to rank 1: host group aborted$"):
        g.send([t], 1, 0).wait()
    assert g.log == [("local", "send", 1)]


def test_news_stops_a_host_pairs_op_before_the_host_group():
    """With the watch's news kept (a rank lost elsewhere), a send to a rank of this host
    raises the group's failure naming it, without posting to the host group."""
    g = _rank(0, 4, per_host=2)
    g._news = RuntimeError("rank 2 closed its connections")
    g._failed = lambda what, seq, e, keep=None: RuntimeError(f"group: {what}: {e}")
    with pytest.raises(RuntimeError, match=r"^group: send: rank 2 closed"):
        g.send([torch.empty(4, device="meta")], 1, 0)
    assert g.log == []


def test_bad_arguments_to_a_host_pair_raise_as_they_are():
    """A send to a rank of this host that its host group refuses for its arguments raises
    that error unchanged, and the group is not failed for it (bad input is the caller's)."""
    g = _rank(0, 4, per_host=2)

    def refuse(tensors, peer, tag):
        raise ValueError("gosym: a tensor on another device")

    g._local.send = refuse
    g._failed = lambda what, seq, e, keep=None: AssertionError("the group was failed")
    with pytest.raises(ValueError, match="another device"):
        g.send([torch.empty(4, device="meta")], 1, 0)


def _run_batched(groups, batches):
    """As _run, inside start_coalescing/end_coalescing (torch's batch_isend_irecv on a
    group whose backend supports coalescing): the held Works, and each rank's batch Work."""
    t = torch.empty(4, device="meta")
    held, ends = [], []
    for g, batch in zip(groups, batches):
        g.start_coalescing()
        held.append([(g.send if op == "send" else g.recv)([t], peer, 0) for op, peer in batch])
        assert not [e for e in g.log if e[0] != "local"] or g._p2p_peers, g.log  # nothing posted yet
        ends.append(g.end_coalescing())
    return held, ends


def _contacts(g):
    """The peers of rank g's first contacts across hosts (its connect's first op with each
    on an NCCL group), in the order made."""
    return list(dict.fromkeys(p for k, _, p in g.log if k != "local"))


def _contacts_finish(groups):
    """Whether every rank's first contacts complete when a contact blocks until its peer
    makes the same one (NCCL makes a pair's communicator with both ranks): False where
    they wait on each other in a cycle."""
    todo = [_contacts(g) for g in groups]
    progress = True
    while progress:
        progress = False
        for a, seq in enumerate(todo):
            if seq and todo[seq[0]] and todo[seq[0]][0] == a:
                b = seq[0]
                todo[a].pop(0)
                todo[b].pop(0)
                progress = True
    return not any(todo)


def _rotated(size, r):
    """Rank r's batch of a ring in its own order: receive from each rank r-1, r-2, ... then
    send to r+1, r+2, ... (a pipeline's all-to-all, each rank starting at its neighbour)."""
    return ([("recv", (r - k) % size) for k in range(1, size)]
            + [("send", (r + k) % size) for k in range(1, size)])


@pytest.mark.parametrize("hosts", [3, 4, 5])
def test_a_batchs_first_contacts_come_first_in_one_order(hosts):
    """Inside a batch, every first contact across hosts is made before any op of the batch
    is posted, in ascending rank order on every rank, so the contacts complete whatever
    order each rank posted its batch in. Posted op by op, the same rotated batches make
    their contacts in a cycle (the gap session 51 noted for 3 or more hosts)."""
    batches = [_rotated(hosts, r) for r in range(hosts)]
    plain = [_rank(r, hosts) for r in range(hosts)]
    _run(plain, batches)
    assert not _contacts_finish(plain), [_contacts(g) for g in plain]
    groups = [_rank(r, hosts) for r in range(hosts)]
    _run_batched(groups, batches)
    for g in groups:
        assert _contacts(g) == sorted(_contacts(g)), g.log
        assert len(g.log) == len(batches[g._rank]) + 2 * (hosts - 1), g.log
    assert _contacts_finish(groups)
    _check_matched(groups)


def test_a_batchs_host_pairs_wait_for_its_contacts_across_hosts():
    """2 hosts x 2 ranks, each receiving from every rank, itself included, then sending
    (torch's conformance batch, session 51's hang at 2 x 2): no op with a rank of the same
    host is posted before the batch's first contacts across hosts, and every held Work
    joins its op."""
    groups = [_rank(r, 4, per_host=2) for r in range(4)]
    batches = [[("recv", p) for p in range(4)] + [("send", p) for p in range(4)] for _ in range(4)]
    held, ends = _run_batched(groups, batches)
    for g in groups:
        far = sorted(p for p in range(4) if p // 2 != g._rank // 2)
        assert _contacts(g) == far
        # the contacts (a byte each way per peer) open the log: no op of the host before them
        assert [p for _, _, p in g.log[:2 * len(far)]] == [p for p in far for _ in "ab"], g.log
    assert all(len(w._works) == 1 for ws in held for w in ws)
    assert [len(e._works) for e in ends] == [8] * 4
    assert _contacts_finish(groups)


def test_a_batch_checks_its_ops_when_posted_and_opens_once():
    """A batch's send to a rank out of range raises at its post, as outside a batch; a
    second start_coalescing, or an end without a start, is refused."""
    g = _rank(0, 2)
    g.start_coalescing()
    with pytest.raises(ValueError, match="out of range"):
        g.send([torch.empty(4, device="meta")], 5, 0)
    with pytest.raises(ValueError, match="already open"):
        g.start_coalescing()
    assert len(g.end_coalescing()._works) == 0
    with pytest.raises(ValueError, match="without start_coalescing"):
        g.end_coalescing()
