#!/usr/bin/env python3
"""What gosym adds to an op across hosts that runs flat (Gloo's own op on gosym's flat
inter-host group): host tensors, 256 x world float32 a rank, the HierGroup's flat Gloo group
replaced by one whose ops do nothing and return a done Work, timed beside torch's wrapper
over a registered do-nothing group (the floor of any Python backend). The difference is
gosym's own Python on that path (checks, the choice, the hand-off), without Gloo's time,
which is far larger and noisier. Run on every rank of (simulated) hosts of one rank each:

    python tests/jobs/hier/simhosts.py --hosts 1,1 -- python scripts/hier_flat_cost.py \\
        [--json F]

Diagnostic: gosym.bench measures the ops themselves."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import gosym  # noqa: F401 - registers the backend


class _Done:
    """A Work that is done: what the stand-in's ops return."""

    def wait(self, timeout=None):
        return True

    def get_future(self):
        f = torch.futures.Future()
        f.set_result(None)
        return f


_DONE = _Done()


class _Null(dist.ProcessGroup):
    """A group whose ops do nothing."""

    def __init__(self, rank, size):
        super().__init__(rank, size)

    def allreduce(self, tensors, opts=None):
        return _DONE

    def broadcast(self, tensors, opts=None):
        return _DONE

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's names
        return _DONE

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        return _DONE

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=None):
        return _DONE

    def getBackendName(self):
        return "gosym-null"


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
    dist.Backend.register_backend("gosymnull", lambda store, r, s, timeout: _Null(r, s),
                                  devices=["cpu"])
    dist.init_process_group("gosym")
    pg = dist.distributed_c10d._get_default_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if not hasattr(pg, "_flat_now"):
        raise SystemExit("hier_flat_cost: the group spans one host; run it across hosts")
    null = dist.new_group(backend="gosymnull")
    real = pg._group("flat", "cpu")
    pg._inner[("flat", "cpu")] = _Null(rank, world)
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
    try:
        for name, f in ops.items():
            # in turn, twice, the better of each: the host's noise only ever adds
            mine = min(_per_call_us(lambda: f(pg)) for _ in range(2))
            floor = min(_per_call_us(lambda: f(null)) for _ in range(2))
            rows[name] = {"gosym_flat_us": mine, "null_group_us": floor, "added_us": mine - floor}
            print(f"rank {rank} {name:24} gosym flat {mine:6.2f}  do-nothing group {floor:6.2f}  "
                  f"added {mine - floor:6.2f} us", flush=True)
    finally:
        pg._inner[("flat", "cpu")] = real
    print(f"rank {rank} paths {pg._paths}", flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"world": world, "numel": n, "us": rows, "paths": pg._paths}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
