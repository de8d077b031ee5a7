"""async_op=True semantics: Work.wait blocks until done, futures carry the
tensors, ops of one group run in issue order, other Python threads run while a
rank waits, and deep queues of uneven all-to-alls survive a delayed rank.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import wcommon as wc
from wcommon import make_input

import gosym

DELAY = 1.5  # seconds the late rank sleeps before joining


def issue_order(ck, rank, world):
    """Each op reads what the previous one wrote; nothing is waited for until the end."""
    t = torch.full((1025,), float(rank + 1), dtype=torch.float64)
    gathered = torch.full((world * 1025,), float("nan"), dtype=torch.float64)
    works = [dist.all_reduce(t, async_op=True)]  # t = S = w(w+1)/2
    works.append(dist.all_gather_into_tensor(gathered, t, async_op=True))  # must see S
    works.append(dist.all_reduce(t, async_op=True))  # t = w*S
    works.append(dist.broadcast(t, src=world - 1, async_op=True))
    for _ in range(12):
        works.append(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True))
    works.append(dist.all_reduce(t, async_op=True))  # t = w*w*S
    for w in reversed(works):
        w.wait()
    s = world * (world + 1) / 2
    ck.check("issue_order/all_gather saw the first all_reduce", bool((gathered == s).all()),
             f"got values {gathered.unique().tolist()[:5]}, wanted {s}")
    ck.check("issue_order/final", bool((t == world * world * s).all()),
             f"got {t.unique().tolist()[:5]}, wanted {world * world * s}")


def wait_blocks(ck, rank, world):
    """The last rank joins late: others see an incomplete Work, then wait() returns the result."""
    late = world - 1
    if rank == late:
        time.sleep(DELAY)
    t = torch.full((9,), float(rank))
    t0 = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    if rank != late:
        ck.check("wait_blocks/not completed early", not work.is_completed(), "completed before the late rank joined")
    work.wait()
    took = time.monotonic() - t0
    ck.check("wait_blocks/is_completed after wait", work.is_completed())
    ck.check("wait_blocks/value", bool((t == world * (world - 1) / 2).all()), str(t.tolist()))
    if rank != late:
        ck.check("wait_blocks/waited for the late rank", took >= DELAY * 0.5, f"wait() returned after {took:.3f}s")


def wait_timeout(ck, rank, world):
    """A wait with a time limit on an op that another thread is running (blocked on a late
    rank) raises when its time is up and leaves the op's native handle live; a later wait()
    finishes it with the right value."""
    late = world - 1
    if rank == late:
        time.sleep(DELAY)
    t = torch.full((7,), float(rank + 1))
    u = torch.full((3,), float(rank))
    first = dist.all_reduce(t, async_op=True)
    second = dist.all_reduce(u, async_op=True)
    runner = threading.Thread(target=second.wait)  # runs the queue: first, then second
    runner.start()
    if rank != late:
        time.sleep(0.3)  # let the runner start the first op (the late rank sleeps 1.5 s)
        try:
            first.wait(timeout=timedelta(milliseconds=200))
            ck.check("wait_timeout/raised", False, "wait(200 ms) returned before the late rank joined")
        except RuntimeError as e:  # DistBackendError is a RuntimeError
            ck.check("wait_timeout/says still running", "still running" in str(e), str(e))
        ck.check("wait_timeout/not completed", not first.is_completed())
    first.wait()
    runner.join()
    # torch's binding of a C++ Work's exception() cannot return it (NCCL's, Gloo's, and
    # gosym._c10d's): the Python group's Work is asked
    pg = dist.distributed_c10d._get_default_group()
    ok = first.is_completed() and (pg is not gosym.group(pg) or first.exception() is None)
    ck.check("wait_timeout/completed", ok)
    ck.check("wait_timeout/value", bool((t == world * (world + 1) / 2).all()), str(t.tolist()))
    ck.check("wait_timeout/second", bool((u == world * (world - 1) / 2).all()), str(u.tolist()))


def futures(ck, rank, world):
    t = torch.full((5,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    val = fut.wait()
    s = world * (world + 1) / 2
    ck.check("future/value is [tensor]", isinstance(val, list) and len(val) == 1 and val[0] is not None
             and bool((val[0] == s).all()), repr(val))
    ck.check("future/then", bool((chained.wait() == 2 * s).all()), repr(chained.value()))
    ck.check("future/done", fut.done())

    out = torch.full((world * 3,), -1.0)
    w2 = dist.all_gather_into_tensor(out, torch.full((3,), float(rank)), async_op=True)
    w3 = dist.barrier(async_op=True)
    torch.futures.wait_all([w2.get_future(), w3.get_future()])
    exp = torch.arange(world, dtype=torch.float32).repeat_interleave(3)
    ck.check("future/wait_all all_gather", bool((out == exp).all()), str(out.tolist()))

    # all_gather's and gather's values are the gathered list itself, as gloo's
    outs = [torch.full((3,), -1.0) for _ in range(world)]
    val = dist.all_gather(outs, torch.full((3,), float(rank)), async_op=True).get_future().wait()
    ck.check("future/all_gather value is the list", isinstance(val, list) and len(val) == world
             and all(isinstance(v, torch.Tensor) and bool((v == r).all()) for r, v in enumerate(val)), repr(val))
    got = [torch.full((3,), -1.0) for _ in range(world)] if rank == 0 else None
    val = dist.gather(torch.full((3,), float(rank)), got, dst=0, async_op=True).get_future().wait()
    if rank == 0:
        ck.check("future/gather value is the list", isinstance(val, list) and len(val) == world
                 and all(isinstance(v, torch.Tensor) and bool((v == r).all()) for r, v in enumerate(val)), repr(val))


def completers_joined(ck, rank, world):
    """A group's completer thread (it settles futures) is gone once the group is destroyed:
    a daemon thread still inside torch's Future at interpreter exit aborts the process."""
    g = dist.new_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(4), group=g, async_op=True).get_future().wait()
    name = f"gosym-completer-{g.group_name}"
    ck.check("completers/started", any(t.name == name for t in threading.enumerate()),
             str([t.name for t in threading.enumerate()]))
    dist.destroy_process_group(g)
    left = [t.name for t in threading.enumerate() if t.name == name]
    ck.check("completers/joined at destroy", not left, str(left))


def threads_run_while_waiting(ck, rank, world):
    """While rank 0 waits for a late peer, a Python thread of rank 0 keeps running."""
    late = world - 1
    ticks = 0
    stop = threading.Event()

    def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.005)

    th = threading.Thread(target=ticker, daemon=True)
    th.start()
    if rank == late:
        time.sleep(DELAY)
    t = torch.ones(4)
    cpu0, t0 = time.process_time(), time.monotonic()
    dist.all_reduce(t)
    took, cpu = time.monotonic() - t0, time.process_time() - cpu0
    stop.set()
    th.join()
    if rank != late:
        # ~DELAY/5ms ticks if the GIL is released during the wait, ~0 if it is held.
        ck.check("threads/ticker ran during the wait", ticks >= 20,
                 f"{ticks} ticks in {took:.2f}s")
        ck.info["wait_cpu_fraction"] = round(cpu / max(took, 1e-9), 2)
    ck.check("threads/value", bool((t == world).all()))


def deep_queue_alltoall(ck, rank, world):
    """64 uneven all_to_all_single in flight at once, rank 0 slow to wait (seed b's race)."""
    rounds = 64
    case = "deep_alltoall"
    outs, exps, works = [], [], []
    for k in range(rounds):
        s = [[((i * 3 + j * 5 + k) % 4) * 3 for j in range(world)] for i in range(world)]
        xs = [make_input(f"{case}/{k}", i, sum(s[i]), torch.float32) for i in range(world)]
        exp = torch.cat([xs[i][sum(s[i][:rank]) : sum(s[i][: rank + 1])] for i in range(world)])
        out = torch.full_like(exp, float("nan"))
        works.append(dist.all_to_all_single(out, xs[rank].clone(), [s[i][rank] for i in range(world)], s[rank],
                                            async_op=True))
        outs.append(out)
        exps.append(exp)
    if rank == 0:
        time.sleep(0.5)
    for w in works:
        w.wait()
    bad = [k for k in range(rounds) if wc.compare(outs[k], exps[k]) is not None]
    ck.check(case, not bad, f"wrong results in rounds {bad[:10]}")


def back_to_back(ck, rank, world):
    """1000 small all_reduces with random per-rank hiccups (seed e's ABA scenario, scaled down)."""
    rng = random.Random(rank)
    bad = []
    for i in range(1000):
        if rng.random() < 0.02:
            time.sleep(rng.random() * 0.01)
        t = torch.full((8,), float(i + rank))
        dist.all_reduce(t)
        if not bool((t == world * i + world * (world - 1) / 2).all()):
            bad.append(i)
    ck.check("back_to_back", not bad, f"wrong results at iterations {bad[:10]}")


def two_groups_interleaved(ck, rank, world):
    """Async ops on two groups at once complete independently and correctly."""
    ga, gb = dist.new_group(), dist.new_group()
    a = torch.full((100,), float(rank + 1))
    b = torch.full((100,), float(10 * (rank + 1)))
    works = []
    for _ in range(4):
        works.append(dist.all_reduce(a, op=dist.ReduceOp.MAX, group=ga, async_op=True))
        works.append(dist.all_reduce(b, op=dist.ReduceOp.MIN, group=gb, async_op=True))
    for w in works:
        w.wait()
    ck.check("two_groups/a", bool((a == world).all()), str(a[:3].tolist()))
    ck.check("two_groups/b", bool((b == 10).all()), str(b[:3].tolist()))
    dist.destroy_process_group(ga)
    dist.destroy_process_group(gb)


def sync_gets_no_work(ck, rank, world):
    """A synchronous caller (torch's asyncOp false) gets no Work from the Python group, with
    the result already in place (torch's wrappers skip the wait then), and from torch's C++
    group (gosym._c10d's backend) a Work already complete, as ProcessGroupNCCL's; an
    asynchronous one gets a Work to wait on."""
    pg = dist.distributed_c10d._get_default_group()
    t = torch.full((1025,), float(rank + 1))
    s = world * (world + 1) / 2
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    w = pg.allreduce([t], opts)
    if pg is gosym.group(pg):
        ck.check("sync_gets_no_work/none", w is None, f"got {w!r}")
    else:
        ck.check("sync_gets_no_work/done", w.is_completed() and w.wait(), f"got {w!r}")
    ck.check("sync_gets_no_work/value", bool((t == s).all()), str(t.unique().tolist()[:5]))
    opts.asyncOp = True
    w = pg.allreduce([t], opts)
    ck.check("sync_gets_no_work/async gets a Work", w is not None and hasattr(w, "wait"), f"got {w!r}")
    w.wait()
    ck.check("sync_gets_no_work/async value", bool((t == world * s).all()), str(t.unique().tolist()[:5]))
    out = torch.full((world * 1025,), float("nan"))
    ck.check("sync_gets_no_work/dist wrapper", dist.all_gather_into_tensor(out, t) is None)
    ck.check("sync_gets_no_work/dist wrapper value", bool((out == world * s).all()),
             str(out.unique().tolist()[:5]))


def main():
    args = wc.setup()
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    for fn in (issue_order, wait_blocks, wait_timeout, futures, threads_run_while_waiting, deep_queue_alltoall, back_to_back,
               two_groups_interleaved, sync_gets_no_work, completers_joined):
        ck.run(fn.__name__, fn, ck, rank, world)
        dist.barrier()
    wc.print_summary(ck, "async")
    wc.write_result(ck.result())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
