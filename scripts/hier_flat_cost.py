#!/usr/bin/env python3
"""What gosym adds to an op across hosts that runs flat (Gloo's own op on gosym's flat
inter-host group): host tensors, 256 x world float32 a rank, synchronous, the HierGroup's
flat Gloo group replaced by torch's FakeProcessGroup (a C++ group whose ops do nothing and
return a done Work), timed beside dist.<op> on a FakeProcessGroup of its own (the floor of
any backend torch calls). Two gosym groups: the default one (gosym._c10d.Hier where that is
built: the flat op issued and waited for in C++) and one made with GOSYM_C10D=0 (the Python
group's _flat_now). The difference to the floor is gosym's own path, without Gloo's time,
which is far larger and noisier. Run on every rank of (simulated) hosts of one rank each:

    python tests/jobs/hier/simhosts.py --hosts 1,1 -- python scripts/hier_flat_cost.py \\
        [--json F]

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
    a = p.parse_args()
    dist.init_process_group("gosym")
    rank, world = dist.get_rank(), dist.get_world_size()
    hier = gosym.group()
    if not hasattr(hier, "_flat_now"):
        raise SystemExit("hier_flat_cost: the group spans one host; run it across hosts")
    os.environ["GOSYM_C10D"] = "0"  # read at creation: this group is the Python one itself
    python_group = dist.new_group(backend="gosym")
    del os.environ["GOSYM_C10D"]
    floor_group = dist.new_group(backend="fake")
    groups = {"default": dist.distributed_c10d._get_default_group(), "python": python_group}
    backend = {k: type(g._get_backend(torch.device("cpu"))).__name__ for k, g in groups.items()}
    for g in groups.values():  # before any flat host op: gosym._c10d.Hier asks for it once
        gosym.group(g)._inner[("flat", "cpu")] = _c10d.FakeProcessGroup._create_internal(rank,
                                                                                          world)
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
    for name, f in ops.items():
        # in turn, twice, the better of each: the host's noise only ever adds
        floor = min(_per_call_us(lambda: f(floor_group)) for _ in range(2))
        rows[name] = {"floor_us": floor}
        for k, g in groups.items():
            us = min(_per_call_us(lambda g=g: f(g)) for _ in range(2))
            rows[name][f"{k}_us"] = us
        print(f"rank {rank} {name:24} default ({backend['default']}) "
              f"{rows[name]['default_us']:6.2f}  Python group {rows[name]['python_us']:6.2f}  "
              f"do-nothing C++ group {floor:6.2f}  added {rows[name]['default_us'] - floor:6.2f} "
              f"/ {rows[name]['python_us'] - floor:6.2f} us", flush=True)
    paths = {k: gosym.stats(g)["hier"]["paths"] for k, g in groups.items()}
    print(f"rank {rank} paths {paths}", flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"world": world, "numel": n, "backends": backend, "us": rows,
                       "paths": paths}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
