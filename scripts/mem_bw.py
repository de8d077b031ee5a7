#!/usr/bin/env python3
"""What one machine's memory moves when several processes copy at once: --procs processes
(the ranks of simulated hosts share one machine's memory), each copying a private buffer of
--sizes bytes into another with one torch thread (as a rank's staged copy does), back to back
after a common start. Prints GB/s of copy traffic (read + write) per process and in all, the
median of --reps runs; --json for the rows.

Why: on simulated hosts the "network" (Gloo's loopback sockets) and gosym's host steps copy
through the same memory, so an op across them is bound by bytes moved in memory, not by a
link; this gives that bound.

  python3 scripts/mem_bw.py --procs 1,2,4,8 --sizes 1M,16M,64M
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time


def _run(nbytes, iters, start, q):
    import torch
    torch.set_num_threads(1)
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # pages touched before the clock
    start.wait()
    t = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    q.put(time.perf_counter() - t)


def _measure(procs, nbytes, iters):
    """Seconds each process took for iters copies of nbytes, all started together."""
    ctx = mp.get_context("spawn")
    start, q = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_run, args=(nbytes, iters, start, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    times = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    return times


def main():
    from gosym.bench import parse_size
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", default="1,2,4,8")
    p.add_argument("--sizes", default="1M,16M,64M")
    p.add_argument("--bytes-per-run", default="4G", help="copied by each process per run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows = []
    print(f"{'procs':>5} {'size':>6} {'GB/s a process':>15} {'GB/s in all':>12}")
    for s in a.sizes.split(","):
        nbytes = parse_size(s)
        iters = max(1, parse_size(a.bytes_per_run) // nbytes)
        for procs in [int(x) for x in a.procs.split(",")]:
            per = []
            for _ in range(a.reps):
                times = _measure(procs, nbytes, iters)
                # read + write of every byte copied; the slowest process bounds the total
                per.append(2 * nbytes * iters / max(times) / 1e9)
            gbs = statistics.median(per)
            rows.append({"procs": procs, "size": s, "gbs_per_proc": gbs, "gbs_total": gbs * procs})
            print(f"{procs:>5} {s:>6} {gbs:>15.1f} {gbs * procs:>12.1f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
