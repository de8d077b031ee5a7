#!/usr/bin/env python3
"""What a host op across hosts pays for the ops that ran before it on other groups.

Session 47 measured gosym's flat path (Gloo's op through gosym._c10d.Hier) 4-14% slower than
a plain Gloo group at 1-256 KiB in gosym.bench's turns; session 48 found the flat path alone
as fast as Gloo (scripts/hier_flat_cost.py) and the cost on whichever backend's turn follows
gosym-hier's (Gloo's own group included). This probe times one target op, broadcast of
1 KiB on a plain Gloo group, in trials of: a barrier, five ops of a "before" kind, a barrier,
an optional idle gap, then five timed target ops; the kinds take turns trial by trial. Per
position in the five it reports the median over trials of the slowest rank's time. Kinds:

    same     the target op itself (the floor: nothing else ran)
    gloo     broadcast on a second plain Gloo group
    hier     broadcast on the default gosym group, hierarchical (GOSYM_HIER_CHOICE=hier)
    local    all_reduce on a gosym group of this rank's host (the engine only)
    hier+Nus hier, then N µs of idle before the target's first op

Run on every rank of (simulated) hosts:

    GOSYM_HIER_CHOICE=hier python tests/jobs/hier/simhosts.py --hosts 2,2 -- \\
        python scripts/switch_cost.py [--trials 200] [--json F]

Diagnostic; gosym.bench measures the ops themselves."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import gosym


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200, help="trials of each kind")
    p.add_argument("--numel", type=int, default=256, help="float32 elements of each op")
    p.add_argument("--gaps", default="500,2000,10000", help="µs of idle after hier (comma list)")
    p.add_argument("--json", default=None, help="rank 0 writes its rows here")
    a = p.parse_args()
    dist.init_process_group("gosym")
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts = gosym.stats()["hier"]["hosts"]
    local = None
    for h in hosts:  # every rank makes every host's group, in the same order
        g = dist.new_group(h, backend="gosym")
        if rank in h:
            local = g
    ctrl, target, other = (dist.new_group(backend="gloo") for _ in range(3))
    x = torch.zeros(a.numel)
    hier = lambda: dist.broadcast(x, 0)  # noqa: E731
    before = {  # kind: (its op, µs of idle after it)
        "same": (lambda: dist.broadcast(x, 0, group=target), 0),
        "gloo": (lambda: dist.broadcast(x, 0, group=other), 0),
        "hier": (hier, 0),
        "local": (lambda: dist.all_reduce(x, group=local), 0),
        **{f"hier+{g}us": (hier, int(g)) for g in a.gaps.split(",") if g},
    }
    kinds = list(before)
    clock = time.perf_counter_ns
    times = {k: [] for k in kinds}  # per trial: the five target ops' ns on this rank

    def trial(kind):
        fn, gap = before[kind]
        dist.barrier(group=ctrl)
        for _ in range(5):
            fn()
        dist.barrier(group=ctrl)
        if gap:
            time.sleep(gap / 1e6)
        row = []
        for _ in range(5):
            t0 = clock()
            dist.broadcast(x, 0, group=target)
            row.append(clock() - t0)
        return row

    for k in kinds:  # warm every path up
        for _ in range(3):
            trial(k)
    for t in range(a.trials):
        for k in kinds[t % len(kinds):] + kinds[:t % len(kinds)]:
            times[k].append(trial(k))
    rows = {}
    for k in kinds:
        mine = torch.tensor(times[k], dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=ctrl)
        slowest = torch.stack(every).max(dim=0).values / 1e3  # trials x 5, µs
        rows[k] = [statistics.median(slowest[:, i].tolist()) for i in range(5)]
        if rank == 0:
            print(f"{k:12} " + " ".join(f"{v:7.1f}" for v in rows[k]) +
                  f"   mean of 5 {sum(rows[k]) / 5:7.1f} us", flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"world": world, "hosts": hosts, "numel": a.numel, "trials": a.trials,
                       "us_by_position": rows}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
