#!/usr/bin/env python3
"""The fold that finishes a reduction across hosts (gosym.hier.tensors._fold), timed: the
engine's loops (gosym_host_reduce, what the fold is) against torch's in-place ops (what it
was before session 30), in --procs processes at once (the ranks of one host, each folding
its own buffers), with torch's intra-op threads as the launcher left them (torchrun: 1; else
one per core) or --torch-threads. Median µs per fold of --hosts sources, a table and JSON.

  python3 scripts/fold_bench.py --procs 4 --sizes 64K,512K,4M,16M [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time


def _run(args, size, q, start):
    import torch

    from gosym import bench
    from gosym.hier.tensors import _fold, _fold_hosts

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    n = bench.parse_size(size) // 4
    own = torch.randn(n)
    got = torch.randn(args.hosts, n)
    engine = _fold(torch.distributed.ReduceOp.SUM, own, args.procs)

    def by_torch():
        for h in range(1, args.hosts):
            own.add_(got[h])

    def by_engine():
        _fold_hosts(engine, own, 0, got)

    start.wait()
    out = {}
    for name, fn in (("torch", by_torch), ("engine", by_engine)):
        ts = []
        for _ in range(args.iters):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out[name] = statistics.median(ts[args.iters // 5:]) * 1e6
    q.put((out, torch.get_num_threads()))


def main():
    from gosym import bench

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=2, help="processes folding at once (a host's ranks)")
    p.add_argument("--hosts", type=int, default=2, help="sources per fold")
    p.add_argument("--sizes", default="64K,512K,4M,16M", help="bytes of float32 per source")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    rows = []
    print(f"{'size':>6} {'torch us':>10} {'engine us':>10} {'torch/engine':>12}  (procs {args.procs}, "
          f"hosts {args.hosts})")
    for size in args.sizes.split(","):
        q, start = ctx.Queue(), ctx.Barrier(args.procs)
        ps = [ctx.Process(target=_run, args=(args, size, q, start)) for _ in range(args.procs)]
        for x in ps:
            x.start()
        got = [q.get(timeout=600) for _ in ps]
        for x in ps:
            x.join()
        tt = statistics.median(g[0]["torch"] for g in got)
        te = statistics.median(g[0]["engine"] for g in got)
        rows.append({"bytes": bench.parse_size(size), "torch_us": tt, "engine_us": te,
                     "torch_threads": got[0][1], "procs": args.procs, "hosts": args.hosts})
        print(f"{size:>6} {tt:10.1f} {te:10.1f} {tt / te:12.2f}  (torch threads {got[0][1]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
