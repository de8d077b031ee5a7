#!/usr/bin/env python3
"""Where the time of one host-tensor op across hosts goes, in place: the op on gosym's group
back to back (as gosym.bench times it: one torch thread), first plain (per-op ms, the
slowest rank's, beside a plain Gloo group's), then with its steps timed (the host group's
calls, the rail's posts and waits, the folds: ms per op on each rank, wall clock, so what
overlaps shows as a sum above the op's time), then under cProfile on every rank (each
rank's functions by own time and by cumulative time). Run on every rank of (simulated)
hosts:

    python tests/jobs/hier/simhosts.py --hosts 2,2 -- python scripts/hier_profile.py \\
        --op all_reduce --sizes 1M --out DIR

Diagnostic: it chooses nothing; gosym.bench measures the ops."""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch
import torch.distributed as dist

import gosym
from gosym.bench import parse_size


def _op(name, x, world):
    """A function running op `name` on a float32 tensor of x bytes per rank's input."""
    n = x // 4
    if name == "all_reduce":
        t = torch.randn(n)
        return lambda g: dist.all_reduce(t, group=g)
    if name == "broadcast":
        t = torch.randn(n)
        return lambda g: dist.broadcast(t, 1 % world, group=g)
    if name == "all_gather_into_tensor":
        t, o = torch.randn(n), torch.empty(n * world)
        return lambda g: dist.all_gather_into_tensor(o, t, group=g)
    if name == "reduce_scatter_tensor":
        t, o = torch.randn(n * world), torch.empty(n)
        return lambda g: dist.reduce_scatter_tensor(o, t, group=g)
    raise SystemExit(f"hier_profile: unknown op {name}")


class _Steps:
    """Wall time per named step, summed over the timed ops: the HierGroup's host-group
    calls, rail posts and Work waits, and folds, wrapped on the instance (its methods call
    them through self) and in gosym.hier.algorithms."""

    def __init__(self, g):
        from gosym.hier import algorithms
        self.total, self.undo, self.events = {}, [], []
        for name in ("_reduce_scatter_base", "_allgather_base", "broadcast", "reduce"):
            self._wrap(g._local, name, f"host {name.strip('_')}")
        self._wrap(g, "_rail_swap", "rail post", works="rail wait")
        self._wrap(g, "_inter_allreduce", "rail all_reduce post", finisher="rail all_reduce wait")
        self._wrap(algorithms, "_wait", "inner wait")
        fold = algorithms._fold

        def timed_fold(*a, **k):
            f = fold(*a, **k)
            return None if f is None else self._timed(f, "fold")
        self._set(algorithms, "_fold", timed_fold)

    def _add(self, label, t):
        now = time.perf_counter()
        self.total[label] = self.total.get(label, 0.0) + now - t
        self.events.append((label, t, now))

    def _timed(self, fn, label):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self._add(label, t)
        return run

    def _set(self, obj, name, value):
        self.undo.append((obj, name, obj.__dict__.get(name)))
        setattr(obj, name, value)

    def _wrap(self, obj, name, label, works=None, finisher=None):
        """obj.name timed as label; works / finisher: the label of waiting for the Works it
        returns / of calling the function it returns."""
        timed = self._timed(getattr(obj, name), label)
        if works:
            def timed(*a, _t=timed, **k):
                return [_TimedWork(w, self, works) for w in _t(*a, **k)]
        elif finisher:
            def timed(*a, _t=timed, **k):
                return self._timed(_t(*a, **k), finisher)
        self._set(obj, name, timed)

    def restore(self):
        for obj, name, old in reversed(self.undo):
            if old is None:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


class _TimedWork:
    def __init__(self, w, steps, label):
        self.w, self.steps, self.label = w, steps, label

    def wait(self):
        t = time.perf_counter()
        try:
            return self.w.wait()
        finally:
            self.steps._add(self.label, t)


def _per_op(fn, g, iters, ctrl):
    """ms per op, the slowest rank's, over iters ops back to back after a barrier."""
    for _ in range(5):
        fn(g)
    dist.barrier(group=ctrl)
    t = time.perf_counter()
    for _ in range(iters):
        fn(g)
    ms = torch.tensor([(time.perf_counter() - t) * 1e3 / iters])
    dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=ctrl)
    return float(ms)


def _timeline(fn, g, ctrl, rank, world, ops):
    """Prints, on rank 0, every rank's timed steps of the last `ops` of 20 ops back to back on
    one clock (CLOCK_MONOTONIC: the ranks of simulated hosts share the machine's), µs from the
    first step's start: which step waits on which."""
    steps = _Steps(g)
    for _ in range(20):
        fn(None)
        steps.events.append(("-- op end", time.perf_counter(), time.perf_counter()))
    steps.restore()
    ends = [i for i, e in enumerate(steps.events) if e[0] == "-- op end"]
    mine = steps.events[ends[-ops - 1] + 1:]
    got = [None] * world
    dist.all_gather_object(got, mine, group=ctrl)
    if rank:
        return
    t0 = min(e[1] for evs in got for e in evs)
    rows = sorted((e[1] - t0, e[2] - t0, r, e[0]) for r, evs in enumerate(got) for e in evs)
    print(f"timeline of the last {ops} ops (µs from the first step's start):")
    for a, b, r, label in rows:
        print(f"  rank {r} {a * 1e6:9.1f} {b * 1e6:9.1f} {(b - a) * 1e6:8.1f}  {label}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--op", default="all_reduce")
    p.add_argument("--sizes", default="1M", help="bytes of one rank's input (float32)")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=None, help="folder for each rank's profile text")
    p.add_argument("--timeline", type=int, default=0, help="print every rank's steps of the last N ops")
    a = p.parse_args()
    torch.set_num_threads(1)  # as gosym.bench and torchrun's ranks
    dist.init_process_group("gosym")
    gl = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for s in a.sizes.split(","):
        fn = _op(a.op, parse_size(s), world)
        plain = _per_op(fn, None, a.iters, gl)
        ref = _per_op(fn, gl, a.iters, gl)
        steps = _Steps(gosym.group())  # the Python group under gosym._c10d's too
        stepped = _per_op(fn, None, a.iters, gl)
        steps.restore()
        lines = [f"rank {rank}: {a.op} {s} with its steps timed {stepped:.3f} ms/op"] + [
            f"  {k:28s} {v * 1e3 / (a.iters + 5):8.3f} ms/op"
            for k, v in sorted(steps.total.items(), key=lambda kv: -kv[1])]
        got = [None] * world
        dist.all_gather_object(got, "\n".join(lines), group=gl)
        if a.timeline:
            _timeline(fn, g=gosym.group(), ctrl=gl, rank=rank, world=world, ops=a.timeline)
        prof = cProfile.Profile()
        prof.enable()
        profiled = _per_op(fn, None, a.iters, gl)
        prof.disable()
        if rank == 0:
            print(f"== {a.op} {s}: gosym {plain:.3f} ms/op, gloo {ref:.3f}, "
                  f"gosym under cProfile {profiled:.3f}", flush=True)
        text = io.StringIO()
        text.write("\n".join(got) + "\n\n")
        st = pstats.Stats(prof, stream=text)
        st.sort_stats("tottime").print_stats(a.top)
        st.sort_stats("cumulative").print_stats(a.top)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"profile-{a.op}-{s}-rank{rank}.txt"), "w") as f:
                f.write(text.getvalue())
        if rank == 0:
            print(text.getvalue()[:6000], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
