#!/usr/bin/env python3
"""What each step of a host-tensor op across hosts costs: the rail's inter-host moves (Gloo's
all_reduce, broadcast, all_gather, reduce_scatter and a point-to-point swap, in both posting
orders) and the host's gosym steps, beside the whole op on gosym (GOSYM_HIER_CHOICE as set)
and on a plain Gloo group of the same ranks. Median ms over --iters, rank 0's clock, after a
barrier per sample. Run on every rank of two (simulated) hosts of equal rank counts:

    python tests/jobs/hier/simhosts.py --hosts 2,2 -- python scripts/hier_steps.py --json F

Diagnostic: it chooses nothing; gosym.bench measures the ops."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c

import gosym


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="64K,1M,4M,16M", help="bytes of one rank's input (float32)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    dist.init_process_group("gosym")
    g = gosym.group()  # the Python HierGroup, under gosym._c10d's backend too
    gl = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    hosts = len(g._hosts)
    if hosts != 2 or any(len(rs) != g._n for rs in g._hosts):
        raise SystemExit("hier_steps: two hosts of equal rank counts")
    rail, local, peer = g._group("rail", "cpu"), g._local, 1 - g._host
    rows = []

    def timed(name, nbytes, fn):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(a.iters):
            dist.barrier(group=gl)
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        med = statistics.median(ts)
        rows.append({"step": name, "bytes": nbytes, "median_ms": med, "min_ms": min(ts)})
        if rank == 0:
            print(f"{name:26s} {nbytes:>10d} {med:9.3f} {min(ts):9.3f}", flush=True)

    def swap(first_send, x, y):
        def run():
            ws = ([rail.send([x], peer, 0), rail.recv([y], peer, 0)] if first_send else
                  [rail.recv([y], peer, 0), rail.send([x], peer, 0)])
            for w in ws:
                w.wait()
        return run

    if rank == 0:
        print(f"{'step':26s} {'bytes':>10s} {'median ms':>9s} {'min ms':>9s}")
    for s in a.sizes.split(","):
        nbytes = int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]] if s[-1] in "KM" else int(s)
        m = nbytes // 4
        x, y = torch.randn(m), torch.empty(m)
        big, out, shard = torch.randn(size * m), torch.empty(size * m), torch.empty(m // g._n)
        timed("rail swap send,recv", nbytes, swap(True, x, y))
        timed("rail swap recv,send", nbytes, swap(False, x, y))
        timed("rail all_reduce", nbytes, lambda: rail.allreduce([x], c.AllreduceOptions()).wait())
        timed("rail broadcast", nbytes, lambda: rail.broadcast([x], c.BroadcastOptions()).wait())
        timed("rail all_gather", nbytes, lambda: rail._allgather_base(
            big[:2 * m], x, c.AllgatherOptions()).wait())
        timed("rail reduce_scatter", nbytes, lambda: rail._reduce_scatter_base(
            y, big[:2 * m], c.ReduceScatterOptions()).wait())
        timed("host reduce_scatter", nbytes, lambda: local._reduce_scatter_base(
            shard, x, c.ReduceScatterOptions()).wait())
        timed("host all_gather", nbytes, lambda: local._allgather_base(
            x, shard, c.AllgatherOptions()).wait())
        timed("fold (add_)", nbytes, lambda: y.add_(x))
        for grp, tag in ((None, "gosym"), (gl, "gloo")):
            timed(f"{tag} all_reduce", nbytes, lambda grp=grp: dist.all_reduce(x, group=grp))
            timed(f"{tag} all_gather", nbytes,
                  lambda grp=grp: dist.all_gather_into_tensor(out, x, group=grp))
            timed(f"{tag} reduce_scatter", nbytes,
                  lambda grp=grp: dist.reduce_scatter_tensor(x, big, group=grp))
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"world": size, "hosts": [len(rs) for rs in g._hosts],
                       "choice": g._choice, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
