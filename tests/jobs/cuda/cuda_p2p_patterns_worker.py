"""The point-to-point patterns NCCL completes, on CUDA tensors, each as the first p2p of a
fresh group (test_cuda.py::test_cuda_p2p_patterns), at any world size >= 2: rings in
both directions and both post orders (batch_isend_irecv), both rings in one batch,
all-pairs exchanges coalesced and as separate isend/irecv in rotated and reversed orders
(a cycle of first contacts), pipeline 1F1B and interleaved schedules (forward sends and
backward receives in one batch, in flight together), p2p on a subgroup, and a ring left
in flight while all_reduce runs on a side stream of the same group and of the default
group. Messages of 9 MiB and more outgrow a channel's slots (8 MiB), so a send waits on
the device for its receiver.

Every message is rebuilt from (case, sender) by its receiver (cuda_p2p_worker's _msg:
random bytes at an odd element offset) and compared bit for bit with what arrived in a
poisoned, guarded destination. After each pattern no channel recorded an error, and the
group opened a channel per peer it talked to.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
import wcommon as wc
from cuda_p2p_worker import _differ, _guards, _msg, _poisoned

BIG = (9 << 20) // 4 + 3  # float32 elements: past a channel's 8 MiB of slots
SMALL = 1025
GOSYM = True  # the stats checks (off when the worker runs on NCCL)
TIMEOUT = datetime.timedelta(seconds=60)  # of every group (--timeout)


class Pattern:
    """The messages of one pattern on this rank: sends (case, peer, n) and receives, posted
    by the pattern, checked by check()."""

    def __init__(self, ck, name, rank, dev, group):
        self.ck, self.name, self.rank, self.dev, self.group = ck, name, rank, dev, group
        self.recvs = []  # (case, src, n, raw, out)
        self.peers = set()

    def send_op(self, case, dst, n=BIG):
        self.peers.add(dst)
        t = _msg(f"{self.name}/{case}", self.rank, n, torch.float32, self.dev)
        return dist.P2POp(dist.isend, t, dst, self.group)

    def recv_op(self, case, src, n=BIG):
        self.peers.add(src)
        raw, out = _poisoned(n, torch.float32, self.dev)
        self.recvs.append((f"{self.name}/{case}", src, n, raw, out))
        return dist.P2POp(dist.irecv, out, src, self.group)

    def run(self, ops):
        """Posts ops as one batch_isend_irecv and waits for them."""
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    def check(self):
        torch.cuda.synchronize()
        for case, src, n, raw, out in self.recvs:
            why = _differ(out, _msg(case, src, n, torch.float32, self.dev))
            self.ck.check(case, why is None, why or "")
            _guards(self.ck, case, raw, out)
        if GOSYM:
            import gosym

            st = gosym.stats(self.group)
            self.ck.check(f"{self.name}: no channel error", st.get("gpu_p2p_error") is None,
                          str(st.get("gpu_p2p_error")))
            self.ck.check(f"{self.name}: a channel per peer", st.get("gpu_p2p_channels") ==
                          len(self.peers), f"{st.get('gpu_p2p_channels')} channels, "
                          f"peers {sorted(self.peers)}")


def fresh(ranks=None):
    """A new group (of ranks, default all): its first p2p is the pattern's."""
    return dist.new_group(ranks=ranks, timeout=TIMEOUT)


def rings(ck, rank, world, dev):
    """Rings forward and backward in both list orders, and both rings in one batch."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for name, dst, src, recv_first in (("ring/forward", nxt, prv, False),
                                       ("ring/forward_recv_first", nxt, prv, True),
                                       ("ring/backward", prv, nxt, False),
                                       ("ring/backward_recv_first", prv, nxt, True)):
        p = Pattern(ck, name, rank, dev, fresh())
        ops = [p.send_op("m", dst), p.recv_op("m", src)]
        p.run(ops[::-1] if recv_first else ops)
        p.check()
    p = Pattern(ck, "ring/both", rank, dev, fresh())
    p.run([p.send_op("fwd", nxt), p.send_op("bwd", prv, SMALL),
           p.recv_op("fwd", prv), p.recv_op("bwd", nxt, SMALL)])
    p.check()


def all_pairs(ck, rank, world, dev):
    """Every rank sends to every other, coalesced (rotated order: rank r talks to r+1
    first) and as separate isend/irecv waited at the end (reversed order)."""
    others = [(rank + k) % world for k in range(1, world)]
    p = Pattern(ck, "all_pairs/coalesced", rank, dev, fresh())
    p.run([p.send_op(f"to{d}", d) for d in others] +
          [p.recv_op(f"to{rank}", s) for s in others])
    p.check()
    p = Pattern(ck, "all_pairs/separate", rank, dev, fresh())
    works = []
    for d in reversed(others):
        works.append(dist.isend(p.send_op(f"to{d}", d).tensor, dst=d, group=p.group))
        s = (2 * rank - d) % world  # the rank for which this rank is d's counterpart
        works.append(dist.irecv(p.recv_op(f"to{rank}", s).tensor, src=s, group=p.group))
    for w in works:
        w.wait()
    p.check()


def pipeline(ck, rank, world, dev, interleaved, mb=4):
    """A 1F1B schedule over world stages (rank = stage) and mb micro-batches, each step's
    receives and sends in one batch_isend_irecv, as torch.distributed.pipelining posts
    them; interleaved puts a forward send and a backward receive in the same batch."""
    name = "pipeline/" + ("interleaved" if interleaved else "1f1b")
    p = Pattern(ck, name, rank, dev, fresh())
    s, last = rank, world - 1
    warm = min(last - s, mb)
    # Each step waits for its batch, which orders the caller's stream after it, as with NCCL.
    # Posted one op per step (not interleaved), stage s+1's backward send then waits for
    # stage s to receive, while stage s still waits for its own forward send: a message
    # larger than the channel's slots cannot complete there, on NCCL either (its sends of
    # more than its buffers also wait for the receiver). So that schedule moves messages
    # that fit the slots; the interleaved one (torch.distributed.pipelining's) moves BIG.
    n = BIG if interleaved and world <= 4 else SMALL * 64
    fwd_recv = lambda m: [p.recv_op(f"fwd{s - 1}.{m}", s - 1, n)] if s > 0 else []  # noqa: E731
    fwd_send = lambda m: [p.send_op(f"fwd{s}.{m}", s + 1, n)] if s < last else []  # noqa: E731
    bwd_recv = lambda m: [p.recv_op(f"bwd{s + 1}.{m}", s + 1, n)] if s < last else []  # noqa: E731
    bwd_send = lambda m: [p.send_op(f"bwd{s}.{m}", s - 1, n)] if s > 0 else []  # noqa: E731

    def step(ops):
        if ops:
            p.run(ops)

    f = b = 0
    for f in range(warm):
        step(fwd_recv(f))
        step(fwd_send(f))
    f = warm
    while f < mb:
        step(fwd_recv(f))
        if interleaved:
            step(fwd_send(f) + bwd_recv(b))
        else:
            step(fwd_send(f))
            step(bwd_recv(b))
        f += 1
        step(bwd_send(b))
        b += 1
    while b < mb:
        step(bwd_recv(b))
        step(bwd_send(b))
        b += 1
    p.check()


def subgroup(ck, rank, world, dev):
    """A ring on the group of ranks 1..world-1 (all ranks where world is 2): peers are
    global ranks, as torch names them."""
    members = list(range(1, world)) if world > 2 else [0, 1]
    g = fresh(members)
    if rank not in members:
        return
    i, k = members.index(rank), len(members)
    p = Pattern(ck, "subgroup/ring", rank, dev, g)
    p.run([p.send_op("m", members[(i + 1) % k]), p.recv_op("m", members[(i - 1) % k])])
    p.check()


def with_collectives(ck, rank, world, dev):
    """A ring posted and left in flight; all_reduce on a side stream of the same group
    and of the default group; then the ring's waits."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    p = Pattern(ck, "with_collectives", rank, dev, fresh())
    works = dist.batch_isend_irecv([p.send_op("m", nxt), p.recv_op("m", prv)])
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        a = torch.full((1 << 20,), float(rank + 1), device=dev)
        b = torch.full((4099,), float(rank + 1), device=dev)
        wa = dist.all_reduce(a, group=p.group, async_op=True)
        wb = dist.all_reduce(b, async_op=True)
    for w in works:
        w.wait()
    wa.wait()
    wb.wait()
    torch.cuda.current_stream(dev).wait_stream(side)
    want = float(world * (world + 1) // 2)
    ck.check("with_collectives: all_reduce of the group", bool((a == want).all()), str(a[:4].tolist()))
    ck.check("with_collectives: all_reduce of the default group", bool((b == want).all()),
             str(b[:4].tolist()))
    p.check()


def main():
    global GOSYM, TIMEOUT
    args = wc.setup()
    GOSYM = args.backend == "gosym"
    TIMEOUT = datetime.timedelta(seconds=args.timeout)
    dev = wc.cuda_device()
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    part = wc.part_runner(ck, rank, world, dev)
    for name, fn, extra in (("rings", rings, ()), ("all_pairs", all_pairs, ()),
                            ("pipeline_1f1b", pipeline, (False,)),
                            ("pipeline_interleaved", pipeline, (True,)),
                            ("subgroup", subgroup, ()), ("with_collectives", with_collectives, ())):
        t0 = time.perf_counter()
        part(name, fn, *extra)
        torch.cuda.synchronize()
        ck.info[f"{name}_s"] = round(time.perf_counter() - t0, 2)
    wc.finish_cuda(ck, "cuda_p2p_patterns", world=world)


if __name__ == "__main__":
    main()
