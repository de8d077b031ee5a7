"""A gosym group across (simulated) hosts: every op x dtype against gloo on the same ranks
and a float64 / exact reference, async Work and futures, send/recv within and across
hosts, recv from any source, the choice between the hierarchical schedule and the flat group
(sizes of either, the same paths on every rank), new_group across and within hosts,
split_group across and within hosts, DDP and FSDP2 against gloo's losses, teardown; or
(--scenario) a rank lost or late on either host.

Run by test_hier.py under simhosts.py (network namespaces on one switch) with
--hosts giving the ranks per host, host-major. GOSYM_HIER_RAIL_MIN and GOSYM_HIER_CHUNK
are set small by the test, so the sizes here take the rails, in several chunks, with
ragged ends, as well as the leaders' path; GOSYM_HIER_CHOICE=hier, so that every op takes
the hierarchical schedule but in the choice part's group.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import wcommon as wc
from collectives_worker import BITWISE, REDOPS, premul_factor, reduce_ref, supported
from wcommon import ALL_DTYPES, make_input

SIZES = [0, 1, 1025, 3 * 1024 + 5]
DEVICE = torch.device("cpu")  # --device cuda: this rank's GPU, and NCCL is the reference
DTYPES = ALL_DTYPES + [torch.complex64]
COMPLEX_OPS = ("SUM", "AVG")


def poison_like(exp):
    """wc.poison_like, complex tensors included (NaN parts)."""
    if exp.dtype.is_complex:
        return torch.full_like(exp, complex(float("nan"), float("nan")))
    return wc.poison_like(exp)


def real(t):
    """A complex tensor as its (real, imag) pairs, for compare(); others as they are."""
    return torch.view_as_real(t) if t.is_complex() else t


def ref_allreduce(xs, dtype, opname, world):
    """reduce_ref's expected value, with a tolerance for every float sum: across hosts a sum
    is rounded once per level (the host's, then the inter-host engine's)."""
    if dtype.is_complex:
        parts = [torch.view_as_real(x) for x in xs]
        exp, tol = ref_allreduce(parts, parts[0].dtype, opname, world)
        return torch.view_as_complex(exp.contiguous()), tol
    exp, tol = reduce_ref(xs, dtype, opname, world)
    if dtype.is_floating_point and opname not in ("PRODUCT", "MIN", "MAX"):
        f = premul_factor(opname) or 1.0
        spread = sum(x.double().abs() * f for x in xs)
        extra = 4 * (world + 1) * torch.finfo(dtype).eps * (spread + exp.double().abs())
        tol = extra if tol is None else tol + extra
    return exp, tol


class Ops:
    """The op matrix: each op on gosym (the default group) and on the reference group of the
    same ranks (gloo on CPU, NCCL on CUDA), with tensors on dev."""

    def __init__(self, ck, rank, world, gloo, dev, group=None):
        self.ck, self.rank, self.world, self.gloo, self.dev = ck, rank, world, gloo, dev
        self.group = group  # the gosym group under test (None: the default group)
        self.ref_ok = True

    def inputs(self, case, n, dtype, opname=""):
        if dtype.is_complex:
            parts = [make_input(case, r, 2 * n, torch.float32, opname) for r in range(self.world)]
            return [torch.view_as_complex(p.view(n, 2)).to(self.dev) for p in parts]
        return [make_input(case, r, n, dtype, opname).to(self.dev) for r in range(self.world)]

    def both(self, case, fn, exp, tol=None):
        """fn(group) -> the tensor to check; run on gosym (must match exp) and on gloo (must
        match exp too where gloo runs the op: the same ranks, the same data)."""
        got = real(fn(self.group))
        exp = real(exp)
        why = wc.compare(got, exp, tol)
        self.ck.check(f"{case} [gosym]", why is None, why or "")
        if not self.ref_ok:
            self.ck.info.setdefault("reference_lacks", []).append(f"{case}: not asked")
            return
        try:
            ref = real(fn(self.gloo))
        except (RuntimeError, ValueError, TypeError) as e:
            self.ck.info.setdefault("reference_lacks", []).append(f"{case}: {str(e)[:80]}")
            return
        if wc.compare(ref, exp, tol) is not None:
            # a second opinion only where it is right itself: NCCL 2.28 through torch 2.11
            # returns zeros for bf16 PREMUL_SUM with a host factor
            self.ck.info.setdefault("reference_off", []).append(case)
            return
        why = wc.compare(got, ref, tol)
        self.ck.check(f"{case} [vs reference]", why is None, why or "")

    def root(self, case):
        return wc.seed_of(case, "root") % self.world

    def run(self):
        if self.dev.type == "cuda":
            t = torch.ones(4, dtype=torch.int32, device=self.dev)
            self.ck.expect_error("BAND of CUDA tensors across hosts", dist.all_reduce, t,
                                 op=dist.ReduceOp.BAND)
        for dtype in DTYPES:
            # NCCL has no int16: torch 2.11 raises inside an open ncclGroupStart for some ops
            # (all_to_all, gather), which leaves later NCCL calls of this thread batched, the
            # inter-host steps of gosym's next ops among them. So no NCCL reference for it.
            self.ref_ok = not (self.dev.type == "cuda" and dtype == torch.int16)
            for n in SIZES:
                self.reductions(dtype, n)
                self.moves(dtype, n)
        if self.dev.type == "cpu":
            self.sparse()

    def sparse(self):
        """all_reduce of sparse COO tensors (DDP's sparse gradients), synchronous and not:
        each rank's own random rows of a 50 x 3 tensor (some shared), summed in float64."""
        def mine(r):
            g = torch.Generator().manual_seed(wc.seed_of("sparse", r))
            rows = torch.randperm(50, generator=g)[:7 + r]
            vals = torch.randn(len(rows), 3, generator=g, dtype=torch.float64)
            return torch.sparse_coo_tensor(rows.unsqueeze(0), vals, (50, 3))

        exp = sum(mine(r).to_dense() for r in range(self.world))
        for is_async in (False, True):
            def fn(group):
                t = mine(self.rank).float()
                w = dist.all_reduce(t, group=group, async_op=is_async)
                if w is not None:
                    w.wait()
                return t.to_dense().double()

            self.both(f"all_reduce sparse_coo async={is_async}", fn, exp,
                      torch.full_like(exp, 1e-4))

    def reductions(self, dtype, n):
        d = wc.dname(dtype)
        names = COMPLEX_OPS if dtype.is_complex else [o for o in REDOPS if supported(dtype, o)]
        if self.dev.type == "cuda":  # NCCL, the inter-host engine, has no bitwise reductions
            names = [o for o in names if o not in BITWISE]
        if self.dev.type == "cuda" and dtype == torch.int16:  # as NCCL: refused, group goes on
            t = self.inputs("int16", n, dtype)[self.rank]
            e = self.ck.expect_error(f"all_reduce {d} n={n} refused on CUDA", dist.all_reduce, t)
            self.ck.check(f"all_reduce {d} n={n}: says int16", "int16" in str(e), str(e))
            return
        for opname in names:
            case = f"all_reduce {d} n={n} {opname}"
            xs = self.inputs(case, n, dtype, opname)
            exp, tol = ref_allreduce(xs, dtype, opname, self.world)

            def ar(g, x=xs[self.rank], op=REDOPS[opname]):
                t = x.clone()
                dist.all_reduce(t, op=op(), group=g)
                return t
            self.both(case, ar, exp, tol)
        for opname in ("SUM", "AVG", "MAX") if dtype.is_floating_point else ("SUM", "MAX"):
            if dtype == torch.bool and opname != "MAX":
                continue
            if dtype.is_complex and opname == "MAX":
                continue
            case = f"reduce {d} n={n} {opname}"
            xs = self.inputs(case, n, dtype, opname)
            exp, tol = ref_allreduce(xs, dtype, opname, self.world)
            root = self.root(case)

            def red(g, x=xs[self.rank], op=REDOPS[opname], root=root):
                t = x.clone()
                dist.reduce(t, dst=root, op=op(), group=g)
                return t if self.rank == root else exp
            self.both(case, red, exp, tol)
            # reduce_scatter_tensor: rank r gets the reduction of every rank's block r
            case = f"reduce_scatter_tensor {d} n={n} {opname}"
            xs = self.inputs(case, n * self.world, dtype, opname)
            full, tol = ref_allreduce(xs, dtype, opname, self.world)
            mine = slice(self.rank * n, (self.rank + 1) * n)

            def rs(g, x=xs[self.rank], op=REDOPS[opname]):
                out = poison_like(full[mine])
                dist.reduce_scatter_tensor(out, x, op=op(), group=g)
                return out
            self.both(case, rs, full[mine], None if tol is None else tol[mine])
            if opname == "SUM":
                def rsl(g, x=xs[self.rank]):
                    out = poison_like(full[mine])
                    dist.reduce_scatter(out, list(x.chunk(self.world)) if n else
                                        [x[:0]] * self.world, group=g)
                    return out
                self.both(f"reduce_scatter {d} n={n}", rsl, full[mine],
                          None if tol is None else tol[mine])

    def all_to_all(self, dtype, n):
        """all_to_all_single of n elements a pair, even splits."""
        d, w, me = wc.dname(dtype), self.world, self.rank
        case = f"all_to_all_single {d} n={n}"
        xs = self.inputs(case, n * w, dtype)
        exp = torch.cat([xs[r][me * n:(me + 1) * n] for r in range(w)])

        def a2a(g):
            out = poison_like(exp)
            dist.all_to_all_single(out, xs[me], group=g)
            return out
        self.both(case, a2a, exp)

    def moves(self, dtype, n):
        d, w, me = wc.dname(dtype), self.world, self.rank
        case = f"broadcast {d} n={n}"
        xs = self.inputs(case, n, dtype)
        root = self.root(case)

        def bc(g):
            t = xs[me].clone()
            dist.broadcast(t, src=root, group=g)
            return t
        self.both(case, bc, xs[root])

        case = f"all_gather_into_tensor {d} n={n}"
        xs = self.inputs(case, n, dtype)
        allx = torch.cat(xs)

        def ag(g):
            out = poison_like(allx)
            dist.all_gather_into_tensor(out, xs[me], group=g)
            return out
        self.both(case, ag, allx)

        def agl(g):
            outs = [poison_like(x) for x in xs]
            dist.all_gather(outs, xs[me], group=g)
            return torch.cat(outs)
        self.both(f"all_gather {d} n={n}", agl, allx)

        # all_to_all_single, even and with splits that differ by pair (zeros included)
        self.all_to_all(dtype, n)
        split = [[(s * 7 + r * 3 + n) % 5 for r in range(w)] for s in range(w)]  # split[s][r]
        xs = [self.inputs(f"a2av {d} n={n}", sum(split[s]), dtype)[s] for s in range(w)]
        if n:
            pieces = [list(xs[s].split(split[s])) for s in range(w)]
            expv = torch.cat([pieces[s][me] for s in range(w)])

            def a2av(g):
                out = poison_like(expv)
                dist.all_to_all_single(out, xs[me], [split[s][me] for s in range(w)], split[me],
                                       group=g)
                return out
            self.both(f"all_to_all_single(v) {d} n={n}", a2av, expv)

            def a2al(g):
                outs = [poison_like(pieces[s][me]) for s in range(w)]
                dist.all_to_all(outs, [p.clone() for p in pieces[me]], group=g)
                return torch.cat(outs)
            self.both(f"all_to_all {d} n={n}", a2al, expv)

        case = f"gather {d} n={n}"
        xs = self.inputs(case, n, dtype)
        root = self.root(case)

        def ga(g):
            outs = [poison_like(x) for x in xs] if me == root else None
            dist.gather(xs[me], outs, dst=root, group=g)
            return torch.cat(outs) if me == root else torch.cat(xs)
        self.both(case, ga, torch.cat(xs))

        case = f"scatter {d} n={n}"
        xs = self.inputs(case, n, dtype)
        root = self.root(case)

        def sc(g):
            out = poison_like(xs[me])
            dist.scatter(out, [x.clone() for x in xs] if me == root else None, src=root, group=g)
            return out
        self.both(case, sc, xs[me])


def run_ops(ck, rank, world, gloo, counts):
    Ops(ck, rank, world, gloo, DEVICE).run()
    check_cpp_flat(ck)


def check_cpp_flat(ck):
    """Where gosym._c10d is built and on, torch's world group runs on its Hier backend, whose
    C++ flat path took ops the choice ran flat (the CUDA ops after the first, which takes the
    Python path and sets the device; the synchronous host ops), counted in the Python group's
    cells and in its stats."""
    import gosym
    from gosym import c10d
    from gosym.hier import schedule

    if c10d.module() is None or os.environ.get("GOSYM_C10D") == "0":
        return
    pg = dist.group.WORLD
    hier = gosym.group(pg)
    if not hasattr(hier, "_cells"):  # one host: not a HierGroup
        return
    backend = type(pg._get_backend(DEVICE)).__name__
    ran = {op: hier._cells[hier.COUNTS + i] for i, op in enumerate(schedule.FLAT_OPS)}
    paths = gosym.stats(pg)["hier"]["paths"]
    flat = sum(paths.get(f"{op}/flat", 0) for op in schedule.FLAT_OPS)
    ok = backend == "Hier" and (flat == 0 or sum(ran.values()) > 0) and all(
        paths.get(f"{op}/flat", 0) >= n for op, n in ran.items())
    ck.check("the C++ backend's flat path", ok, f"{backend} {ran} {paths}")


# check_choice's table: every op flat below 64 KiB of one rank's input, hierarchical from it;
# its sizes (elements): 1000 (flat: at most 8000 bytes a rank, reduce_scatter world x that),
# 40000 (hierarchical: at least 80000 bytes, int16).
CHOICE_POINTS = ((1024, 2.0, 1.0), (65536, 1.0, 2.0))
FLAT_N, HIER_N = 1000, 40000
# check_choice's mapped buffer for the rows from other hosts (algorithms.ROWS_MAPPED_MAX):
# all_to_all_single takes host blocks up to 2 MiB of input a rank at 2 hosts, 1.5 MiB at 3
# (_a2a_blocks_max), so at HIER_N (float32: 160000 x world bytes) for worlds up to 13 at 2
# hosts, and at A2A_BIG_N (4x) it runs flat at every world
ROWS_MAPPED, A2A_BIG_N = 1 << 20, 4 * HIER_N


def check_choice(ck, rank, world, gloo, counts):
    """GOSYM_HIER_CHOICE=table on a new group whose table (patched alike on every rank) has
    this shape's entry: each op at a flat-chosen size (every dtype) and at a hierarchical one
    (float32, int16) against the float64 / exact references and the reference group, each op
    on the path chosen (the group's stats), and the same paths on every rank."""
    import gosym
    from gosym.hier import algorithms, schedule

    # all_to_all_single's schedule takes host blocks: hosts of one rank count, more than one
    chosen = [op for op in schedule.OPS
              if op != "all_to_all_single" or (len(set(counts)) == 1 and counts[0] > 1)]
    want = {p: sorted(f"{op}/{p}" for op in chosen) for p in ("flat", "hier")}
    saved, env = schedule.TABLE, os.environ.get("GOSYM_HIER_CHOICE")
    schedule.TABLE = {("cpu", schedule.shape(counts), schedule.LOOPBACK): {
        "sources": ["hier_worker"], "hier": "-", "flat": "-",
        "ops": {op: CHOICE_POINTS for op in schedule.OPS}}}
    os.environ["GOSYM_HIER_CHOICE"] = "table"
    rows_mapped, algorithms.ROWS_MAPPED_MAX = algorithms.ROWS_MAPPED_MAX, ROWS_MAPPED
    try:
        g = dist.new_group()
    finally:
        if env is None:
            os.environ.pop("GOSYM_HIER_CHOICE")
        else:
            os.environ["GOSYM_HIER_CHOICE"] = env
    try:
        ops = Ops(ck, rank, world, gloo, DEVICE, g)
        for dtype in DTYPES:
            ops.reductions(dtype, FLAT_N)
            ops.moves(dtype, FLAT_N)
        link = os.environ.get("GOSYM_HIER_LINK") or "auto"
        ck.check("choice: simulated hosts share one machine's kernel: loopback, unless set",
                 gosym.stats(g)["hier"]["link"] == ("loopback" if link == "auto" else link),
                 f'{gosym.stats(g)["hier"]}')
        flat = gosym.stats(g)["hier"]["paths"]
        ck.check("choice: every op flat below 64 KiB", sorted(flat) == want["flat"], f"{flat}")
        for dtype in (torch.float32, torch.int16):
            ops.reductions(dtype, HIER_N)
            ops.moves(dtype, HIER_N)
        paths = gosym.stats(g)["hier"]["paths"]
        hier = sorted(k for k in paths if k.endswith("/hier"))
        ck.check("choice: every op hierarchical from 64 KiB",
                 hier == want["hier"] and all(paths[k] == n for k, n in flat.items()),
                 f"{paths}")
        if "all_to_all_single" in chosen:
            n = paths["all_to_all_single/hier"]
            ops.all_to_all(torch.float32, A2A_BIG_N)
            paths = gosym.stats(g)["hier"]["paths"]
            ck.check("choice: all_to_all_single whose blocks from other hosts outgrow the "
                     "mapped buffer runs flat", paths["all_to_all_single/hier"] == n, f"{paths}")
        seen = [None] * world
        dist.all_gather_object(seen, paths, group=gloo)
        ck.check("choice: the same paths on every rank", all(p == paths for p in seen), f"{seen}")
    finally:
        schedule.TABLE, algorithms.ROWS_MAPPED_MAX = saved, rows_mapped
        dist.destroy_process_group(g)


def check_anysource(ck, rank, world, gloo, counts):
    """recv from any source, as Gloo: each rank in turn takes every other rank's message, of
    its host and of the others, in whatever order they come (dist.recv without src returns
    the sender), into contiguous and non-contiguous tensors. On a group made with
    GOSYM_HIER_CPU_P2P=local a rank that shares its host gets a NotImplementedError saying
    why, at once, and the group goes on (its local pairs through gosym)."""
    for dst in range(world):
        if rank != dst:
            dist.send(torch.full((6,), float(rank * 10 + dst)), dst, tag=7)
            continue
        got = {}
        for i in range(world - 1):
            t = torch.zeros(6) if i % 2 else torch.zeros(6, 3)[:, 1]  # every other strided
            src = dist.recv(t, tag=7)
            got[src] = t.clone()
        others = sorted(set(range(world)) - {rank})
        ck.check("recv from any source: every sender once", sorted(got) == others, f"{sorted(got)}")
        for src, t in got.items():
            ck.check(f"recv from any source: rank {src}'s data", bool((t == src * 10 + dst).all()),
                     f"{t}")
    # an empty message from the next rank (gosym's host engine takes it; Gloo's own receive
    # from any source refuses an empty buffer, and a group across hosts uses it)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    works = [dist.isend(torch.zeros(0), nxt, tag=8), dist.irecv(torch.zeros(0), tag=8)]
    for w in works:
        w.wait()
    ck.check("recv from any source: an empty message names its sender",
             works[1]._source_rank() == prv, f"{works[1]._source_rank()}, want {prv}")
    dist.barrier()
    os.environ["GOSYM_HIER_CPU_P2P"] = "local"
    try:
        g = dist.new_group(backend="gosym")
    finally:
        del os.environ["GOSYM_HIER_CPU_P2P"]
    mine = next(h for h in host_ranks(counts) if rank in h)
    if len(mine) > 1:
        e = ck.expect_error("local p2p: recv from any source beside a rank of the host",
                            dist.recv, torch.zeros(5), group=g)
        ck.check("local p2p: says why", "alone on its host" in str(e), str(e))
    # the local pairs through gosym: a ring of sends and receives naming their peers
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    t = torch.zeros(4)
    works = [dist.isend(torch.full((4,), float(rank)), nxt, group=g),
             dist.irecv(t, prv, group=g)]
    for w in works:
        w.wait()
    ck.check("local p2p: the ring's data", bool((t == prv).all()), f"{t}")
    dist.barrier()
    dist.destroy_process_group(g)


def host_ranks(counts):
    """The ranks of each host, host-major."""
    hosts, start = [], 0
    for c in counts:
        hosts.append(list(range(start, start + c)))
        start += c
    return hosts


def check_layout(ck, rank, world, gloo, counts):
    import gosym
    from gosym.hier import HierGroup

    pg = dist.distributed_c10d._get_default_group()
    ck.check("layout: a HierGroup", isinstance(gosym.group(pg), HierGroup), f"got {pg!r}")
    hosts = host_ranks(counts)
    got = gosym.stats()["hier"]["hosts"]
    ck.check("layout: hosts", got == hosts, f"hosts {got}, want {hosts}")


def check_async(ck, rank, world, gloo, counts):
    """async all_reduce + futures (and a callback that posts another op), non-contiguous
    tensors, several ops in flight at once, a barrier."""
    xs = [torch.full((4097,), float(r + 1)) for r in range(world)]
    total = float(sum(range(1, world + 1)))
    works, ts = [], []
    for i in range(3):
        t = xs[rank].clone() * (i + 1)
        ts.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    fut = works[-1].get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        ck.check(f"async all_reduce {i}", bool((t == total * (i + 1)).all()), f"{t[:3]}")
    v = chained.wait()
    ck.check("future then", bool((v == total * 6).all()), f"{v[:3]}")
    ck.check("work completed", all(w.is_completed() for w in works))
    nc = torch.arange(40, dtype=torch.float32).view(8, 5).t()  # non-contiguous
    t = nc + rank
    dist.all_reduce(t)
    exp = nc * world + sum(range(world))
    ck.check("non-contiguous all_reduce", torch.equal(t, exp), f"{t.flatten()[:4]}")
    # bad input raises at once, a clear error, and the group goes on
    ck.expect_error("all_gather_into_tensor of a wrong size", dist.all_gather_into_tensor,
                    torch.empty(3), torch.ones(2))
    ck.expect_error("all_to_all_single with bad splits", dist.all_to_all_single,
                    torch.empty(world), torch.ones(world), [1] * world, [2] * world)
    w = dist.barrier(async_op=True)
    w.wait()
    dist.barrier()


def check_streams(ck, rank, world, gloo, counts):
    """CUDA: asynchronous ops issued on a side stream held back by a sleeping kernel, their
    tensors made on the default stream and dropped at once, the default stream then
    allocating and filling as much again: the op still reads and writes its own tensors
    (each must be marked as used on the side stream; session 33's fuzzer found the gathers'
    inputs overwritten). Host tensors have no streams: nothing to do there."""
    if DEVICE.type != "cuda":
        return
    side = torch.cuda.Stream()
    n = 50_000
    xs = [make_input("streams", r, world * n, torch.float32).to(DEVICE) for r in range(world)]
    mine = [xs[rank][i * n:(i + 1) * n] for i in range(world)]
    cases = {
        "gather": (lambda ins, outs: dist.gather(ins[0], outs if rank == 0 else None, dst=0,
                                                 async_op=True),
                   lambda: [x[:n] for x in xs] if rank == 0 else []),
        "scatter": (lambda ins, outs: dist.scatter(outs[0], ins if rank == 0 else None, src=0,
                                                   async_op=True),
                    lambda: [xs[0][rank * n:(rank + 1) * n]]),
        "all_to_all": (lambda ins, outs: dist.all_to_all(outs, ins, async_op=True),
                       lambda: [xs[r][rank * n:(rank + 1) * n] for r in range(world)]),
    }
    for name, (call, want) in cases.items():
        exp = want()
        ins = [m.clone() for m in mine]
        outs = [poison_like(mine[0]) for _ in range(world)]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # the op waits behind this on its stream
            work = call(ins, outs)
        del ins  # the caller's last reference: the op alone holds them now
        junk = [torch.full_like(mine[0], -7.0) for _ in range(2 * world)]
        work.wait()
        torch.cuda.current_stream().synchronize()
        for i, e in enumerate(exp):
            why = wc.compare(outs[i], e)
            ck.check(f"{name} on a side stream, inputs dropped [{i}]", why is None, why or "")
        del junk


def check_p2p(ck, rank, world, gloo, counts):
    """send/recv along the ring, isend/irecv both ways, across and within hosts, every dtype
    class (int16 and complex travel as bytes)."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if world < 2:
        return
    for dtype in (torch.float32, torch.int16, torch.bfloat16, torch.complex64, torch.bool):
        mine = make_input(f"p2p {dtype}", rank, 333, torch.float32).to(DEVICE, dtype)
        want = make_input(f"p2p {dtype}", prv, 333, torch.float32).to(DEVICE, dtype)
        got = poison_like(want)
        ops = [dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prv)]
        if DEVICE.type == "cuda" and rank % 2:  # NCCL's pairs: one side receives first
            ops.reverse()
        for q in ([o.op(o.tensor, o.peer) for o in ops] if DEVICE.type == "cuda"
                  else dist.batch_isend_irecv(ops)):
            q.wait()
        why = wc.compare(got, want)
        ck.check(f"ring isend/irecv {dtype}", why is None, why or "")
    # a batch in which every rank sends to every other before it receives: torch hands a
    # Python group's batch one op at a time, so on CUDA each pair's two sends come first (on
    # one NCCL communicator they paired with each other: session 33's fault); 8 MiB is more
    # than NCCL's buffers hold, so a send waits for its receive
    for n in (7, 2 << 20):
        peers = [p for p in range(world) if p != rank]
        mine = make_input(f"p2p all {n}", rank, n, torch.float32).to(DEVICE)
        got = {p: poison_like(mine) for p in peers}
        ops = ([dist.P2POp(dist.isend, mine, p) for p in peers]
               + [dist.P2POp(dist.irecv, got[p], p) for p in peers])
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        for p in peers:
            why = wc.compare(got[p], make_input(f"p2p all {n}", p, n, torch.float32).to(DEVICE))
            ck.check(f"batch, sends first, n={n} from {p}", why is None, why or "")
    # a batch each rank posts in its own rotated order: receive from r-1, r-2, ..., then send
    # to r+1, r+2, ... (a pipeline's exchange, every rank starting at its neighbour). Made op
    # by op, the first contacts of three or more hosts' pairs would wait on each other in a
    # cycle; a coalesced batch makes them first, in one order (HierGroup.end_coalescing)
    steps = range(1, world)
    mine = make_input("p2p rotated", rank, 257, torch.float32).to(DEVICE)
    got = {(rank - k) % world: poison_like(mine) for k in steps}
    ops = ([dist.P2POp(dist.irecv, got[(rank - k) % world], (rank - k) % world) for k in steps]
           + [dist.P2POp(dist.isend, mine, (rank + k) % world) for k in steps])
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    for p, t in got.items():
        why = wc.compare(t, make_input("p2p rotated", p, 257, torch.float32).to(DEVICE))
        ck.check(f"batch, rotated order, from {p}", why is None, why or "")
    # blocking send/recv, even ranks first (non-contiguous receive buffer)
    t = torch.zeros(6, 4, device=DEVICE)[:, 1]
    if rank % 2 == 0:
        dist.send(torch.full((6,), float(rank), device=DEVICE), nxt)
        dist.recv(t, prv)
    else:
        dist.recv(t, prv)
        dist.send(torch.full((6,), float(rank), device=DEVICE), nxt)
    ck.check("send/recv", bool((t == prv).all()), f"{t}")


def check_coalesced(ck, rank, world, gloo, counts):
    """Coalesced calls (dist._coalescing_manager, as FSDP2 issues them): all_gather_into_tensor,
    reduce_scatter_tensor and all_reduce of several tensors in one call, synchronous and
    async, sizes whose ops take different paths across hosts (an empty last tensor is done at
    once; the others are not): every output written when the call's Work is done."""
    dev = DEVICE

    def coalesced(name, calls, outs, exps, async_op, tag):
        with dist._coalescing_manager(async_ops=async_op) as cm:
            for call in calls:
                call()
        if async_op:
            cm.wait()
        for i, (o, e) in enumerate(zip(outs, exps)):
            why = wc.compare(o, e.to(dev))
            ck.check(f"coalesced {name} {tag} [{i}]", why is None, why or "")

    for sizes in ([2, 1, 0], [4096, 1, 0], [0, 3000, 5]):
        for async_op in (False, True):
            tag = f"sizes={sizes} async={async_op}"
            xs = [[make_input(f"coal ag {tag} {i}", r, n, torch.float32).to(dev)
                   for r in range(world)] for i, n in enumerate(sizes)]
            exps = [torch.cat(x) for x in xs]
            outs = [poison_like(e) for e in exps]
            coalesced("all_gather_into_tensor",
                      [lambda o=o, x=x: dist.all_gather_into_tensor(o, x[rank]) for o, x in zip(outs, xs)],
                      outs, exps, async_op, tag)
            ins = [[make_input(f"coal rs {tag} {i}", r, n * world, torch.int32).to(dev)
                    for r in range(world)] for i, n in enumerate(sizes)]
            exps = [torch.stack(x).sum(0).to(torch.int32)[rank * n:(rank + 1) * n]
                    for x, n in zip(ins, sizes)]  # int64 sums cut to int32: int32's wrap
            outs = [poison_like(e) for e in exps]
            coalesced("reduce_scatter_tensor",
                      [lambda o=o, x=x: dist.reduce_scatter_tensor(o, x[rank]) for o, x in zip(outs, ins)],
                      outs, exps, async_op, tag)
            outs = [make_input(f"coal ar {tag} {i}", rank, n, torch.int32).to(dev)
                    for i, n in enumerate(sizes)]
            exps = [sum(make_input(f"coal ar {tag} {i}", r, n, torch.int32) for r in range(world))
                    for i, n in enumerate(sizes)]
            coalesced("all_reduce", [lambda t=t: dist.all_reduce(t) for t in outs], outs, exps,
                      async_op, tag)


def check_groups(ck, rank, world, gloo, counts):
    """new_group across hosts (first and last rank: a HierGroup with one rank per host) and
    within a host (a plain ProcessGroupGosym: no inner groups), used, destroyed."""
    import gosym
    from gosym import ProcessGroupGosym
    from gosym.hier import HierGroup

    across = dist.new_group([0, world - 1])
    host0 = dist.new_group(list(range(counts[0])))
    if rank in (0, world - 1):
        pg = dist.distributed_c10d._get_default_group() if across is None else across
        ck.check("new_group across hosts is hierarchical", isinstance(gosym.group(pg), HierGroup),
                 repr(pg))
        t = torch.full((5000,), float(rank))
        dist.all_reduce(t, group=across)
        ck.check("new_group across hosts: all_reduce", bool((t == world - 1).all()), f"{t[:3]}")
    if rank < counts[0]:
        ck.check("new_group within a host is flat", type(gosym.group(host0)) is ProcessGroupGosym,
                 repr(host0))
        t = torch.full((7,), 1.0)
        dist.all_reduce(t, group=host0)
        ck.check("new_group within a host: all_reduce", bool((t == counts[0]).all()), f"{t}")
    dist.destroy_process_group(across)
    dist.destroy_process_group(host0)


def check_split(ck, rank, world, gloo, counts):
    """dist.split_group of the group across hosts (torch splits only when the default group is
    bound to a device: faked, as tests/jobs/clients/scenarios.py's split does on CPU): the whole
    group, every other rank, the first and last alone (the others get None), each host's
    ranks. A split spanning hosts is a HierGroup of its own inner groups, one within a host a
    plain ProcessGroupGosym; each all_reduces, is split again, and is destroyed."""
    import gosym
    from gosym import ProcessGroupGosym
    from gosym.hier import HierGroup

    host_of, start = {}, 0
    for h, c in enumerate(counts):
        host_of.update((r, h) for r in range(start, start + c))
        start += c
    layouts = [[list(range(world))], [list(range(j, world, 2)) for j in range(min(2, world))],
               [[0, world - 1]], [[r for r in range(world) if host_of[r] == h]
                                  for h in range(len(counts))]]
    pg = dist.distributed_c10d._get_default_group()
    pg.bound_device_id = torch.device("cuda", 0)
    try:
        for i, splits in enumerate(layouts):
            mine = next((r for r in splits if rank in r), None)
            sub = dist.split_group(split_ranks=splits)
            case = f"split {i} {splits}"
            if mine is None:
                ck.check(f"{case}: None outside", sub is None, repr(sub))
                continue
            across = len({host_of[r] for r in mine}) > 1
            want = HierGroup if across else ProcessGroupGosym
            ck.check(f"{case}: a {want.__name__}", type(gosym.group(sub)) is want, repr(sub))
            ck.check(f"{case}: ranks", dist.get_process_group_ranks(sub) == mine,
                     f"{dist.get_process_group_ranks(sub)}")
            t = torch.full((5000,), float(rank + 1))
            dist.all_reduce(t, group=sub)
            want_sum = float(sum(r + 1 for r in mine))
            ck.check(f"{case}: all_reduce", bool((t == want_sum).all()), f"{t[:3]}")
            if across:  # a split of the split (its group ranks): its first rank alone, the rest
                subsub = dist.split_group(sub, split_ranks=[[0], list(range(1, len(mine)))])
                t = torch.ones(3)
                dist.all_reduce(t, group=subsub)
                n = 1 if rank == mine[0] else len(mine) - 1
                ck.check(f"{case}: split of the split", bool((t == n).all()), f"{t}")
                dist.destroy_process_group(subsub)
            dist.destroy_process_group(sub)
    finally:
        pg.bound_device_id = None


def train_fsdp(group, rank, steps=12):
    """FSDP2 (fully_shard) over group on CPU; the per-step losses."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
    torch.manual_seed(4321)
    model = nn.Sequential(nn.Linear(32, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(),
                          nn.Linear(96, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    teacher = torch.randn(32, 4, generator=torch.Generator().manual_seed(7))
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(wc.seed_of("fsdp", step, rank))
        x = torch.randn(16, 32, generator=g)
        loss = nn.functional.mse_loss(model(x), x @ teacher)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def close(a, b, rel=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= rel * max(1.0, abs(y)) for x, y in zip(a, b))


def check_training(ck, rank, world, gloo, counts):
    import ddp_worker

    ddp_worker.STEPS = 15  # CI time: the loss curves part from step 2 on if anything is off
    train = ddp_worker.train
    losses, _, _ = train(None, rank, torch.device("cpu"))
    ref, _, _ = train(gloo, rank, torch.device("cpu"))
    ck.check("DDP losses match gloo's", close(losses, ref), f"gosym {losses[-3:]} gloo {ref[-3:]}")
    ck.info["ddp_last_loss"] = [losses[-1], ref[-1]]
    losses = train_fsdp(None, rank)
    ref = train_fsdp(gloo, rank)
    ck.check("FSDP2 losses match gloo's", close(losses, ref),
             f"gosym {losses[-3:]} gloo {ref[-3:]}")
    ck.info["fsdp_last_loss"] = [losses[-1], ref[-1]]


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def check_teardown(ck, rank, shm_before):
    """destroy_process_group shuts the inner groups and the worker thread down and leaves
    nothing in /dev/shm; each group's watch ends once the rank before it left too (every
    rank destroys its groups here)."""
    pg = dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()
    ck.check("inner groups gone", not getattr(pg, "_inner", {}), f"{getattr(pg, '_inner', None)}")
    time.sleep(0.2)
    alive = [t.name for t in threading.enumerate() if t.name.startswith("gosym-hier")]
    ck.check("worker thread gone", not alive, f"{alive}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        watching = [t.name for t in threading.enumerate() if t.name.startswith("gosym-watch")]
        if not watching:
            break
        time.sleep(0.05)
    ck.check("watch threads gone", not watching, f"{watching}")
    left = sorted(e for e in shm_entries() - shm_before if "gosym" in e or str(os.getpid()) in e)
    ck.check("nothing left in /dev/shm", not left, f"{left}")


def ring_step(t, rank, world):
    """One turn of a ring: each rank sends t to the next and receives the previous one's
    into t (even ranks send first), within and across hosts."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = torch.empty_like(t)
    if rank % 2 == 0:
        dist.send(t, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(t, nxt)
    t.copy_(got)


def scenario(args, ck, rank, world):
    """A rank lost (SIGKILL: die, die-p2p, die-async) or late (it sleeps past the timeout:
    late, or stall, which sleeps 20 timeouts, longer than the job waits) in the
    middle of a loop of all_reduces (die-async: asynchronous ones, waited for), or of sends
    and receives around a ring (die-p2p): every other rank must raise a gosym error naming
    the op and it."""
    victim = args.victim
    p2p = args.scenario.endswith("-p2p")
    asyn = args.scenario.endswith("-async")
    t = torch.ones(args.elems, device=DEVICE)
    err = None
    t0 = time.monotonic()
    for i in range(6):
        if rank == victim and i == 3:
            if args.scenario.startswith("die"):
                os.kill(os.getpid(), signal.SIGKILL)
            # late: back after 3 timeouts; stall: after 20, past any watchdog's cleanup
            time.sleep(args.timeout * (20 if args.scenario == "stall" else 3))
            break
        try:
            if p2p:
                ring_step(t, rank, world)
            elif asyn:
                dist.all_reduce(t, async_op=True).wait()
            else:
                dist.all_reduce(t)
            if DEVICE.type == "cuda":
                torch.cuda.synchronize()  # a CUDA op's failure shows at the host from here on
        except Exception as e:  # noqa: BLE001 - the error under test
            err = e
            break
        finally:  # the log says which step a survivor waited in, and how long
            print(f"scenario step {i} ended at {time.monotonic() - t0:.1f} s", file=sys.stderr,
                  flush=True)
    took = time.monotonic() - t0
    if rank != victim:
        msg = str(err) if err is not None else ""
        ck.check("raised", err is not None, "no error")
        ck.check("a gosym error", msg.startswith("gosym:"), msg[:300])
        ck.check("names the op", any(w in msg for w in (("send", "recv") if p2p else ("all_reduce",))),
                 msg[:300])
        ck.check("names the lost rank", f"ranks [{victim}] were lost" in msg, msg[:600])
        if args.scenario.startswith("die") and args.timeout >= 30:
            # no inner group's timeout can have named it: the ranks' watch did (issue 36)
            ck.check("named within 10 s", took < 10, f"{took:.1f} s")
        ck.info["error"] = msg[:1500]
        ck.info["seconds"] = round(took, 1)
    return err


def mismatch(args, ck, rank, world, counts):
    """The second host's ranks broadcast where the first host's all_reduce: every rank raises
    a gosym error naming a rank of each host with the op and tensors each posted (at the
    inter-host step's timeout: Gloo and NCCL wait there). Sizes that differ are not tried:
    Gloo's pair aborts the process on a message longer than the receive (args_differ: with
    TORCH_DISTRIBUTED_DEBUG=DETAIL they are caught before)."""
    far = rank >= counts[0]
    t = torch.ones(args.elems)
    err = None
    t0 = time.monotonic()
    try:
        for _ in range(3):  # a rank whose step happened to succeed fails in the next one
            if far:
                dist.broadcast(t, src=0)
            else:
                dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - the error under test
        err = e
    msg = str(err) if err is not None else ""
    ck.check("raised", err is not None, "no error")
    ck.check("a gosym error", msg.startswith("gosym:"), msg[:300])
    ck.check("names the mismatch", "the ranks posted different ops" in msg, msg[:1500])
    ops = [f"{op} (seq 1) of float32[{args.elems}]@cpu" for op in ("all_reduce", "broadcast")]
    ck.check("names both ranks' ops", all(o in msg for o in ops), msg[:1500])
    ck.info["error"] = msg[:1500]
    ck.info["seconds"] = round(time.monotonic() - t0, 1)


def args_differ(args, ck, rank, world, counts):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: the second host's ranks all_reduce one element more than
    the first host's. Every rank raises a ValueError naming a rank whose arguments differ from
    its own and both, before any inter-host step (where Gloo would abort the process on the
    longer message); no rank ran the op, so the group goes on: an all_reduce after it sums.
    On CUDA (--device cuda) the same: torch's check applies to NCCL as to Gloo."""
    far = rank >= counts[0]
    t = torch.ones(args.elems + int(far), device=DEVICE)
    err = None
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - the error under test
        err = e
    msg = str(err) if err is not None else ""
    ck.check("a ValueError", isinstance(err, ValueError), repr(err)[:300])
    ck.check("names the difference", "the ranks posted different arguments" in msg, msg[:1500])
    fps = [f"all_reduce of float32[{n}]@{DEVICE.type}" for n in (args.elems, args.elems + 1)]
    ck.check("names both ranks' arguments", all(f in msg for f in fps), msg[:1500])
    x = torch.full((args.elems,), float(rank + 1), device=DEVICE)
    dist.all_reduce(x)
    x = x.cpu()
    ck.check("the group goes on", bool((x == world * (world + 1) / 2).all()), str(x[:4]))
    ck.info["error"] = msg[:1500]


def main():
    def extra(p):
        p.add_argument("--hosts", default="2,2")
        p.add_argument("--parts", default="layout,ops,async,p2p,groups,split,training")
        p.add_argument("--scenario", default="")
        p.add_argument("--victim", type=int, default=-1)
        p.add_argument("--elems", type=int, default=100000)
        p.add_argument("--device", default="cpu")

    global DEVICE
    args = wc.setup(extra)
    if args.device == "cuda":
        DEVICE = wc.cuda_device()
    counts = [int(x) for x in args.hosts.split(",")]
    torch.set_num_threads(1)
    shm_before = shm_entries()
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    if args.scenario:
        if args.scenario == "mismatch":
            mismatch(args, ck, rank, world, counts)
        elif args.scenario == "args_differ":
            args_differ(args, ck, rank, world, counts)
        else:
            scenario(args, ck, rank, world)
        wc.write_result(ck.result())
        wc.print_summary(ck, f"hier {args.scenario}")
        if rank == 0:  # its process hosts the store: stay until the others reported
            for r in range(1, world):
                if r != args.victim:
                    wc.wait_for_marker(f"rank{r}.json", 60)
        os._exit(0)  # the group is broken: no teardown handshake to wait for
    gloo = dist.new_group(backend="nccl" if DEVICE.type == "cuda" else "gloo")
    part = wc.part_runner(ck, rank, world, gloo, counts)
    parts = {"layout": check_layout, "ops": run_ops, "async": check_async, "p2p": check_p2p, "streams": check_streams,
             "anysource": check_anysource, "coalesced": check_coalesced, "choice": check_choice, "groups": check_groups,
             "split": check_split, "training": check_training}
    for name in args.parts.split(","):
        t0 = time.monotonic()
        part(name, parts[name])
        ck.info.setdefault("part_seconds", {})[name] = round(time.monotonic() - t0, 1)
    if DEVICE.type == "cpu":  # the host group's bindings (the rails' shards, read in place)
        import gosym
        st = gosym.stats()
        ck.info["binds"] = {k: st.get(k, 0) for k in ("bindings_created", "peer_map_hits")}
        ck.info["maps"] = sorted(str(k) for k in getattr(gosym.group(), "_maps", {}))
    dist.destroy_process_group(gloo)
    ck.run("teardown", check_teardown, ck, rank, shm_before)
    wc.write_result(ck.result())
    wc.print_summary(ck, "hier")


if __name__ == "__main__":
    main()
