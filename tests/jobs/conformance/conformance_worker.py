"""The behaviours torch's own suite checks that gosym had to learn (test_conformance.py):
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


def ints(case, r, n, dev):
    """Rank r's integer-valued float64 data for case (sums exact in any order)."""
    g = torch.Generator().manual_seed(wc.seed_of(case, r))
    return torch.randint(-50, 50, (n,), generator=g).double().to(dev)


def call_forms(ck, rank, world, dev, case):
    """torch's short call forms of the ProcessGroup methods (pg.allreduce(tensor), ...) on
    gosym's group give what their full forms give: the results' float64 references."""
    pg = dist.group.WORLD
    n = 6
    every = [ints(case, r, n, dev) for r in range(world)]
    total = sum(every)
    forms = {
        "allreduce(tensor)": (lambda t: pg.allreduce(t), lambda: total),
        "allreduce(tensors, op)": (lambda t: pg.allreduce([t], dist.ReduceOp.MAX),
                                   lambda: torch.stack(every).amax(0)),
        "allreduce(tensor, op=)": (lambda t: pg.allreduce(t, op=dist.ReduceOp.MIN),
                                   lambda: torch.stack(every).amin(0)),
        "broadcast(tensor, root)": (lambda t: pg.broadcast(t, world - 1), lambda: every[-1]),
        "reduce(tensor, root, op)": (lambda t: pg.reduce(t, 0, dist.ReduceOp.SUM),
                                     lambda: total if rank == 0 else None),
    }
    for name, (call, want) in forms.items():
        t = every[rank].clone()
        call(t).wait()
        exp = want()
        if exp is not None:
            why = wc.compare(t, exp)
            ck.check(f"{case}: {name}", why is None, why or "")
    outs = [poison_like(every[0]) for _ in range(world)]
    pg.allgather(outs, every[rank]).wait()
    for r in range(world):
        why = wc.compare(outs[r], every[r])
        ck.check(f"{case}: allgather(outputs, tensor) from {r}", why is None, why or "")
    out = poison_like(every[0])
    pg.reduce_scatter(out, [every[rank] * (j + 1) for j in range(world)], dist.ReduceOp.SUM).wait()
    why = wc.compare(out, total * (rank + 1))
    ck.check(f"{case}: reduce_scatter(output, inputs, op)", why is None, why or "")
    pg.barrier(timeout=datetime.timedelta(seconds=30)).wait()
    e = ck.expect_error(f"{case}: a form torch does not bind", pg.allreduce, "x")
    # gosym.forms' text on the Python group, pybind's own on torch's C++ group (gosym._c10d)
    named = "(tensor, op, timeout)" in str(e) or "tensor: torch.Tensor, op:" in str(e)
    ck.check(f"{case}: TypeError naming the forms", isinstance(e, TypeError) and named, repr(e))


def uneven(ck, rank, world, dev, case):
    """all_gather into outputs of unequal sizes (rank j's output j as long as its input) and
    reduce_scatter from inputs of unequal sizes, as NCCL takes them, against float64
    references; non-contiguous outputs too."""
    rows = [j + 1 for j in range(world)]
    every = [ints(f"{case}/ag", r, rows[r] * 3, dev).view(rows[r], 3) for r in range(world)]
    for async_op in (True, False):
        flat = torch.full((sum(rows), 3), float("nan"), dtype=torch.float64, device=dev)
        w = dist.all_gather(list(torch.split(flat, rows)), every[rank], async_op=async_op)
        if async_op:
            w.wait()
        why = wc.compare(flat, torch.cat(every))
        ck.check(f"{case}: all_gather_v (async {async_op})", why is None, why or "")
    outs = [poison_like(e.t()).t() for e in every]  # non-contiguous views
    dist.all_gather(outs, every[rank])
    why = wc.compare(torch.cat(outs), torch.cat(every))
    ck.check(f"{case}: all_gather_v, non-contiguous outputs", why is None, why or "")
    for op, fold in ((dist.ReduceOp.SUM, lambda x: x.sum(0)), (dist.ReduceOp.MAX, lambda x: x.amax(0)),
                     (dist.ReduceOp.AVG, lambda x: x.sum(0) / world)):
        ins = [ints(f"{case}/rs/{j}", rank, rows[j] * 2, dev) for j in range(world)]
        keep = [t.clone() for t in ins]
        out = torch.full((rows[rank] * 2,), float("nan"), dtype=torch.float64, device=dev)
        dist.reduce_scatter(out, ins, op=op)
        exp = fold(torch.stack([ints(f"{case}/rs/{rank}", r, rows[rank] * 2, dev) for r in range(world)]))
        why = wc.compare(out, exp, torch.full_like(exp, 1e-12))
        ck.check(f"{case}: reduce_scatter_v {op}", why is None, why or "")
        ck.check(f"{case}: reduce_scatter_v {op} leaves the inputs", all(torch.equal(a, b) for a, b in zip(ins, keep)))
    e = ck.expect_error(f"{case}: own output of the wrong size", dist.all_gather,
                        [torch.empty(rows[r] + (r == rank), 3, dtype=torch.float64, device=dev)
                         for r in range(world)], every[rank])
    ck.check(f"{case}: says which", e is not None and "this rank's output" in str(e), str(e))


def self_p2p(ck, rank, world, dev, case):
    """batch_isend_irecv over every rank, this one included (its recv posted before its
    send), as NCCL runs it; then a send to itself before its recv; then a recv from itself
    with no send, which fails once waited on instead of hanging."""
    n = 33
    ops, got = [], {}
    for r in range(world):
        got[r] = torch.full((n,), float("nan"), dtype=torch.float64, device=dev)
        ops.append(dist.P2POp(dist.irecv, got[r], r))
    for r in range(world):
        ops.append(dist.P2POp(dist.isend, ints(f"{case}/{rank}->{r}", 0, n, dev), r))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for r in range(world):
        why = wc.compare(got[r], ints(f"{case}/{r}->{rank}", 0, n, dev))
        ck.check(f"{case}: from {r}{' (itself)' if r == rank else ''}", why is None, why or "")
    src, dst = ints(f"{case}/again", rank, n, dev), torch.zeros(n, dtype=torch.float64, device=dev)
    ws = dist.isend(src, rank, tag=4)
    wr = dist.irecv(dst, rank, tag=4)
    ws.wait()
    wr.wait()
    why = wc.compare(dst, src)
    ck.check(f"{case}: send, then recv, to itself", why is None, why or "")
    pg = dist.new_group(backend="gosym", timeout=datetime.timedelta(seconds=1))
    lone = dist.irecv(torch.zeros(n, dtype=torch.float64, device=dev), rank, group=pg, tag=8)
    e = ck.expect_error(f"{case}: recv from itself with no send", lone.wait)
    ck.check(f"{case}: a DistBackendError", isinstance(e, dist.DistBackendError), repr(e))
    dist.barrier()


def coalesced(ck, rank, world, dev, case):
    """torch's _coalescing_manager, on a group whose backend coalesces (a group across
    hosts; NCCL's does): two all_reduces in one (waited through the manager's Work, the only
    one it keeps), two all_gather_into_tensors in another (waited at its exit), each against
    float64 references. A group that does not coalesce (one host) refuses it clearly, as
    torch refuses it for any backend without it."""
    manager = dist.distributed_c10d._coalescing_manager
    backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
    if not backend.supports_coalescing:
        def enter():
            with manager(None, dev):
                pass
        e = ck.expect_error(f"{case}: refused", enter)
        ck.check(f"{case}: names the backend", e is not None and "gosym" in str(e), str(e))
        # torch's manager registers the group as coalescing before asking the backend, and a
        # refusal leaves it so: every later all_reduce on the group would be held, never run
        dist.distributed_c10d._world.pg_coalesce_state.pop(
            dist.distributed_c10d._get_default_group(), None)
        return
    sizes = {"a": 7, "b": 5}
    mine = {k: ints(f"{case}/{k}", rank, n, dev) for k, n in sizes.items()}
    with manager(None, dev, async_ops=True) as cm:
        for t in mine.values():
            dist.all_reduce(t)
    cm.wait()
    for k, n in sizes.items():
        want = sum(ints(f"{case}/{k}", r, n, dev) for r in range(world))
        why = wc.compare(mine[k], want)
        ck.check(f"{case}: all_reduce {k}", why is None, why or "")
    ins = {k: ints(f"{case}/g{k}", rank, n, dev) for k, n in sizes.items()}
    outs = {k: torch.full((world * n,), float("nan"), dtype=torch.float64, device=dev)
            for k, n in sizes.items()}
    with manager(None, dev):
        for k in sizes:
            dist.all_gather_into_tensor(outs[k], ins[k])
    for k, n in sizes.items():
        why = wc.compare(outs[k], torch.cat([ints(f"{case}/g{k}", r, n, dev) for r in range(world)]))
        ck.check(f"{case}: all_gather_into_tensor {k}", why is None, why or "")


def ddp_join(ck, rank, world, dev, case):
    """DDP under join() with uneven inputs (rank 0 stops two steps early): with
    divide_by_initial_world_size=False the grad is every active rank's mean, with True the
    sum over active ranks divided by the world size (DDP reads the join all_reduce's Work,
    made in forward, in backward: torch's test_ddp_grad_div_uneven_inputs)."""
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(5, 5, bias=False).to(dev), device_ids=[dev] if dev.type == "cuda" else None,
        bucket_cap_mb=1)
    inp = torch.ones(1, 5, device=dev) * 50
    steps = 3 if rank == 0 else 5
    for static in (False, True):
        with net.join(divide_by_initial_world_size=static):
            for i in range(steps):
                net(inp).sum().backward()
                active = world if i < 3 else world - 1
                want = torch.full((5, 5), 50.0 * (active / world if static else 1.0), device=dev)
                why = wc.compare(net.module.weight.grad, want, torch.full_like(want, 1e-4))
                ck.check(f"{case}: divide_by_initial_world_size={static}, step {i}", why is None, why or "")
                net.zero_grad()


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
    for part in (call_forms, uneven, self_p2p, coalesced, ddp_join):
        ck.run(f"cuda/{part.__name__}", part, ck, rank, world, dev, f"cuda/{part.__name__}")
        torch.cuda.synchronize(dev)


def main():
    def add(p):
        p.add_argument("--cuda", action="store_true")
        p.add_argument("--skip", default="", help="comma list of parts not to run (CPU)")
    args = wc.setup(add)
    skip = set(filter(None, args.skip.split(",")))
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
    for name, part in (("any_source", any_source), ("any_source_data", any_source_data),
                       ("monitored_barrier", monitored), ("profiler", profiled), ("timeout", timeout_error)):
        if name not in skip:
            ck.run(name, part, ck, rank, world, name)
    for part in (call_forms, uneven, self_p2p, coalesced, ddp_join):
        if part.__name__ not in skip:
            ck.run(part.__name__, part, ck, rank, world, torch.device("cpu"), part.__name__)
    wc.print_summary(ck, "conformance")
    wc.write_result(ck.result())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
