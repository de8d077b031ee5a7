#!/usr/bin/env python3
"""What gosym adds to an op across hosts that runs flat (Gloo's own op on gosym's flat
inter-host group): host tensors, 256 x world float32 a rank, synchronous, the HierGroup's
flat Gloo group replaced by torch's FakeProcessGroup (a C++ group whose ops do nothing and
return a done Work), timed beside dist.<op> on a FakeProcessGroup of its own (the floor of
any backend torch calls). Two gosym groups: the default one (gosym._c10d.Hier where that is
built: the flat op issued and waited for in C++) and one made with GOSYM_C10D=0 (the Python
group's _flat_now). The difference to the floor is gosym's own path, without Gloo's time,
which is far larger and noisier. With --gloo the flat group stays Gloo's and the floor is a
plain Gloo group of the same ranks, each timed in turn over six rounds (medians): what a
user sees of the op, Gloo's noise included; two more rows then call the two Gloo groups'
backends themselves from Python (no torch.distributed function, no dispatcher), which splits
the difference between the paths to Gloo from a difference between the Gloo groups (session
47 saw the flat path 20-40 µs over a plain Gloo group in gosym.bench; session 48 found that
the bench's order of turns: scripts/switch_cost.py), and a third the default
gosym group's backend (gosym._c10d.Hier) the same way: its flat path without torch.distributed's
function and the dispatcher. Every direct call is synchronous (asyncOp False), as
torch.distributed's functions ask. Run on every rank of
(simulated) hosts:

    GOSYM_HIER_CHOICE=flat python tests/jobs/hier/simhosts.py --hosts 1,1 -- \\
        python scripts/hier_flat_cost.py [--gloo] [--json F]

Diagnostic: gosym.bench measures the ops themselves."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch.testing._internal.distributed import fake_pg  # noqa: F401 - registers "fake"

import gosym


def _per_call_us(fn, calls=300, bursts=15):
    """Median µs per call over bursts of back-to-back calls (two untimed bursts first)."""
    samples = []
    for b in range(bursts + 2):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        if b >= 2:
            samples.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(samples)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="rank 0 writes its rows here")
    p.add_argument("--gloo", action="store_true",
                   help="the real flat Gloo group against a plain Gloo group")
    a = p.parse_args()
    dist.init_process_group("gosym")
    rank, world = dist.get_rank(), dist.get_world_size()
    hier = gosym.group()
    if not hasattr(hier, "_flat_now"):
        raise SystemExit("hier_flat_cost: the group spans one host; run it across hosts")
    os.environ["GOSYM_C10D"] = "0"  # read at creation: this group is the Python one itself
    python_group = dist.new_group(backend="gosym")
    del os.environ["GOSYM_C10D"]
    floor_group = dist.new_group(backend="gloo" if a.gloo else "fake")
    floor_name = "plain Gloo group" if a.gloo else "do-nothing C++ group"
    groups = {"default": dist.distributed_c10d._get_default_group(), "python": python_group}
    backend = {k: type(g._get_backend(torch.device("cpu"))).__name__ for k, g in groups.items()}
    for g in groups.values():  # before any flat host op: gosym._c10d.Hier asks for it once
        if not a.gloo:
            gosym.group(g)._inner[("flat", "cpu")] = _c10d.FakeProcessGroup._create_internal(
                rank, world)
    n = 256 * world
    x, o, part = torch.zeros(n), torch.zeros(n * world), torch.zeros(n // world)
    ops = {
        "all_reduce": lambda g: dist.all_reduce(x, group=g),
        "broadcast": lambda g: dist.broadcast(x, 0, group=g),
        "all_gather_into_tensor": lambda g: dist.all_gather_into_tensor(o, x, group=g),
        "reduce_scatter_tensor": lambda g: dist.reduce_scatter_tensor(part, x, group=g),
        "all_to_all_single": lambda g: dist.all_to_all_single(o[:n], x, group=g),
    }
    rows = {}
    every = [("floor", floor_group), *groups.items()]
    if a.gloo:  # the Gloo groups' backends called by themselves
        direct = {"floor_direct": floor_group._get_backend(torch.device("cpu")),
                  "flat_direct": gosym.group(groups["default"])._group("flat", "cpu"),
                  "default_direct": groups["default"]._get_backend(torch.device("cpu"))}
        every += list(direct.items())

        def sync(options, **fields):  # as torch.distributed's functions fill them
            opts = options()
            opts.asyncOp = False
            for k, v in fields.items():
                setattr(opts, k, v)
            return opts

        def waited(work):  # a synchronous op of a Python backend returns None
            return work is None or work.wait()

        backend_ops = {
            "all_reduce": lambda b: waited(b.allreduce([x], sync(_c10d.AllreduceOptions))),
            "broadcast": lambda b: waited(b.broadcast([x], sync(_c10d.BroadcastOptions, rootRank=0,
                                                                 rootTensor=0))),
            "all_gather_into_tensor": lambda b: waited(b._allgather_base(
                o, x, sync(_c10d.AllgatherOptions))),
            "reduce_scatter_tensor": lambda b: waited(b._reduce_scatter_base(
                part, x, sync(_c10d.ReduceScatterOptions))),
            "all_to_all_single": lambda b: waited(b.alltoall_base(
                o[:n], x, [], [], sync(_c10d.AllToAllOptions))),
        }
    for name, f in ops.items():
        if a.gloo:  # in turn, each first in some rounds: real ops drift; medians
            got = {k: [] for k, _ in every}
            for r in range(6):
                turn = r % len(every)
                for k, g in every[turn:] + every[:turn]:
                    call = (lambda g=g: backend_ops[name](g)) if k in direct else (lambda g=g: f(g))
                    got[k].append(_per_call_us(call, calls=100, bursts=5))
            rows[name] = {f"{k}_us": statistics.median(v) for k, v in got.items()}
        else:  # in turn, twice, the better of each: the host's noise only ever adds
            rows[name] = {f"{k}_us": min(_per_call_us(lambda g=g: f(g)) for _ in range(2))
                          for k, g in every}
        floor = rows[name]["floor_us"]
        print(f"rank {rank} {name:24} default ({backend['default']}) "
              f"{rows[name]['default_us']:7.2f}  Python group {rows[name]['python_us']:7.2f}  "
              f"{floor_name} {floor:7.2f}  added {rows[name]['default_us'] - floor:6.2f} "
              f"/ {rows[name]['python_us'] - floor:6.2f} us" + (
                  f"; the backends called directly: plain {rows[name]['floor_direct_us']:7.2f}"
                  f"  flat {rows[name]['flat_direct_us']:7.2f}"
                  f"  gosym {rows[name]['default_direct_us']:7.2f}" if a.gloo else ""), flush=True)
    paths = {k: gosym.stats(g)["hier"]["paths"] for k, g in groups.items()}
    print(f"rank {rank} paths {paths}", flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"world": world, "numel": n, "floor": floor_name, "backends": backend,
                       "us": rows,
                       "paths": paths}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
