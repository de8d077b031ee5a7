"""The behaviours torch's own suite checks that gosym had to learn (tests/test_conformance.py):
all_gather_coalesced's layout, recv from any source, monitored_barrier, timeout errors and
gosym:<op> profiler ranges. Results are compared with a gloo group of the same ranks on the
same fresh random data; outputs are poisoned first.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
import wcommon as wc
from wcommon import poison_like


def rand(case, rank, shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(wc.seed_of(case, rank, time.time_ns()))
    return (torch.randn(shape, generator=g) * 100).to(dtype)


def all_gather_coalesced(ck, rank, world, gloo, case, shapes):
    """output_lists[r][i] is rank r's input i, as gloo gives it (shapes: the inputs')."""
    ins = [rand(f"{case}/{i}", rank, s) for i, s in enumerate(shapes)]
    got = [[poison_like(t) for t in ins] for _ in range(world)]
    ref = [[poison_like(t) for t in ins] for _ in range(world)]
    dist.all_gather_coalesced(got, ins)
    dist.all_gather_coalesced(ref, ins, group=gloo)
    for r in range(world):
        for i in range(len(ins)):
            why = wc.compare(got[r][i], ref[r][i])
            ck.check(f"{case}: rank {r}'s input {i}", why is None, why or "")


def any_source(ck, rank, world, case):
    """Every rank but 0 sends messages a, b (tag 5) and c (tag 9); rank 0 first receives from
    each rank by name (its a), then with src=None: blocking (tag 5: the b's) and irecv (tag 9:
    the c's), learning each sender, whose data it must be."""
    n = 17

    def msg(part, r):
        return wc.make_input(f"{case}/{part}", r, n, torch.float32)

    if rank != 0:
        for part, tag in (("a", 5), ("b", 5), ("c", 9)):
            dist.send(msg(part, rank), 0, tag=tag)
        return
    for r in range(1, world):
        t = poison_like(msg("a", r))
        dist.irecv(t, src=r, tag=5).wait()
        why = wc.compare(t, msg("a", r))
        ck.check(f"{case}: named recv from {r}", why is None, why or "")
    seen = {"b": [], "c": []}
    for part, tag in (("b", 5), ("c", 9)):
        for _ in range(1, world):
            t = poison_like(msg(part, 0))
            if part == "b":
                src = dist.recv(t, tag=tag)
            else:
                w = dist.irecv(t, tag=tag)
                w.wait()
                src = w._source_rank()
            seen[part].append(src)
            ok = 0 < src < world
            why = wc.compare(t, msg(part, src)) if ok else f"source {src}"
            ck.check(f"{case}: {part} from {src}", why is None, why or "")
    for part, got in seen.items():
        ck.check(f"{case}: each sender once ({part})", sorted(got) == list(range(1, world)), str(got))


def any_source_data(ck, rank, world, case):
    """The data of a receive from any source is the sender's (deterministic per sender)."""
    n = 1000
    if rank != 0:
        dist.send(wc.make_input(case, rank, n, torch.float64), 0, tag=3)
        return
    for _ in range(1, world):
        t = poison_like(wc.make_input(case, 0, n, torch.float64))
        src = dist.recv(t, tag=3)
        why = wc.compare(t, wc.make_input(case, src, n, torch.float64))
        ck.check(f"{case}: data from {src}", why is None, why or "")


def monitored(ck, rank, world, case):
    """monitored_barrier: passes when every rank comes; with timeout 0 rank 0 fails at once
    naming the ranks that did not arrive (here: all, they never call it)."""
    pg = dist.new_group(backend="gosym", timeout=datetime.timedelta(seconds=30))
    pg.monitored_barrier(datetime.timedelta(seconds=20))
    ck.check(f"{case}: all arrived", True)
    pg2 = dist.new_group(backend="gosym", timeout=datetime.timedelta(seconds=30))
    if rank == 0:
        t0 = time.monotonic()
        e = ck.expect_error(f"{case}: timeout 0", pg2.monitored_barrier, datetime.timedelta(0))
        took = time.monotonic() - t0
        ck.check(f"{case}: timeout 0 fails at once", took < 2.0, f"{took:.2f} s")
        msg = str(e)
        ck.check(f"{case}: gloo's wording", "Rank 0 timed out in monitoredBarrier" in msg, msg)
        ck.check(f"{case}: names the missing ranks", f"{list(range(1, world))}" in msg, msg)
        ck.check(f"{case}: a DistBackendError", isinstance(e, dist.DistBackendError), repr(e))
    dist.barrier()
    dist.destroy_process_group(pg2)
    # The suite's test_monitored_barrier_gloo, on the group method (dist.monitored_barrier
    # refuses other backends): rank 1 stays away; rank 0 names it, the others learn that
    # rank 0 failed.
    pg3 = dist.new_group(backend="gosym", timeout=datetime.timedelta(seconds=30))
    wait = datetime.timedelta(seconds=2)
    if rank == 0:
        e = ck.expect_error(f"{case}: rank 1 away", pg3.monitored_barrier, wait)
        ck.check(f"{case}: names rank 1", "Rank 1 failed to pass monitoredBarrier" in str(e), str(e))
    elif rank != 1:
        e = ck.expect_error(f"{case}: rank 0 failed", pg3.monitored_barrier, wait)
        want = f"Rank {rank} successfully reached monitoredBarrier, but received errors"
        ck.check(f"{case}: rank {rank} told", want in str(e), str(e))
    dist.barrier()
    dist.destroy_process_group(pg3)


def timeout_error(ck, rank, world, case):
    """A barrier that the last rank skips fails on the others with a DistBackendError whose
    text says "Timed out" and names the op, its sequence number and the missing rank."""
    pg = dist.new_group(backend="gosym", timeout=datetime.timedelta(seconds=2))
    late = world - 1
    if rank != late:
        try:
            pg.barrier().wait()
            ck.fail(case, "did not raise")
        except Exception as e:  # noqa: BLE001 - inspected below
            msg = str(e)
            ck.check(f"{case}: DistBackendError", isinstance(e, dist.DistBackendError), repr(e))
            for word in ("Timed out", "barrier", "seq", f"[{late}]"):
                ck.check(f"{case}: says {word!r}", word in msg, msg)
    dist.barrier()  # the default group is unaffected


def profiled(ck, rank, world, case):
    """Each op records one async gosym:<op> range with its input shapes, in both profilers."""
    t = rand(case, rank, (3, 4))
    ops = {
        "all_reduce": lambda: dist.all_reduce(t),
        "broadcast": lambda: dist.broadcast(t, 0),
        "all_gather": lambda: dist.all_gather([torch.empty_like(t) for _ in range(world)], t),
        "barrier": lambda: dist.barrier(),
    }
    for name, prof in (("autograd", lambda: torch.autograd.profiler.profile(record_shapes=True)),
                       ("torch", lambda: torch.profiler.profile(
                           activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True))):
        for op, fn in ops.items():
            with prof() as p:
                fn()
                w = dist.all_reduce(t, async_op=True)
                w.wait()
            evs = p.function_events if name == "autograd" else p.events()
            got = [e for e in evs if e.name == f"gosym:{op}"]
            extra = 1 if op == "all_reduce" else 0
            ck.check(f"{case}/{name}/{op}: one range", len(got) == 1 + extra, str([e.name for e in evs if e.name.startswith("gosym")]))
            for e in got:
                ck.check(f"{case}/{name}/{op}: async", e.is_async, str(e))
                if op != "barrier":
                    ck.check(f"{case}/{name}/{op}: shapes", e.input_shapes == [[3, 4]], str(e.input_shapes))


def cuda_cases(ck, rank, world, dev):
    """On CUDA: a receive from any source is refused clearly (as NCCL refuses it) and the
    group goes on; CUDA ops record their gosym:<op> ranges, as host ops."""
    t = torch.ones(8, device=dev)
    if rank == 0:
        e = ck.expect_error("cuda any_source refused", dist.recv, t)
        ck.check("cuda any_source: says so", e is not None and "any source" in str(e), str(e))
    dist.all_reduce(t)
    torch.cuda.synchronize(dev)
    ck.check("cuda all_reduce after refusal", bool((t == world).all()), str(t))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as p:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        torch.cuda.synchronize(dev)
    names = [e.name for e in p.events() if e.name.startswith("gosym:")]
    ck.check("cuda ranges", sorted(names) == ["gosym:all_reduce", "gosym:broadcast"], str(names))


def main():
    args = wc.setup(lambda p: p.add_argument("--cuda", action="store_true"))
    if args.cuda:
        rank, world, dev, _ = wc.init_cuda(args)
        ck = wc.Checker(rank)
        ck.run("cuda", cuda_cases, ck, rank, world, dev)
        wc.print_summary(ck, "conformance cuda")
        wc.write_result(ck.result())
        dist.destroy_process_group()
        return
    rank, world = wc.init(args.backend, args.timeout)
    gloo = dist.new_group(backend="gloo")
    ck = wc.Checker(rank)
    for shapes in ([(5,)], [(2, 3), (7,)], [(4,)] * world, [(0,), (3,), (0, 2)]):
        case = f"all_gather_coalesced/{len(shapes)} inputs"
        ck.run(case, all_gather_coalesced, ck, rank, world, gloo, case, shapes)
    ck.run("any_source", any_source, ck, rank, world, "any_source")
    ck.run("any_source_data", any_source_data, ck, rank, world, "any_source_data")
    ck.run("monitored_barrier", monitored, ck, rank, world, "monitored_barrier")
    ck.run("profiler", profiled, ck, rank, world, "profiler")
    ck.run("timeout", timeout_error, ck, rank, world, "timeout")
    wc.print_summary(ck, "conformance")
    wc.write_result(ck.result())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
