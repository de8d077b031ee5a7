"""What torch's dispatch costs a C++ backend against a Python one (one process, no GPU).

The question it answers: would a C++ c10d Backend (a torch extension calling
the C ABI) make an eager dist.all_reduce cheaper than gosym's Python
ProcessGroup? Both kinds are measured doing nothing: torch's own C++
FakeProcessGroup (backend "fake": returns a completed Work) and a Python
ProcessGroup whose allreduce returns None, as gosym's does for a
synchronous CUDA caller. Each figure is the median of 5 loops of N calls.

  python3 scripts/probe_dispatch.py [--json out.json] [-n N]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore


class NopGroup(dist.ProcessGroup):
    """A Python ProcessGroup that does nothing, as cheaply as Python can."""

    def allreduce(self, tensors, opts=None):
        return None

    def getBackendName(self):
        return "nop"


def per_call_us(fn, n, reps=5):
    for _ in range(2000):
        fn()
    loops = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        loops.append((time.perf_counter_ns() - t0) / n / 1e3)
    return sorted(loops)[reps // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("-n", type=int, default=100_000)
    args = p.parse_args()
    t = torch.zeros(16)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    cpp, py = dist.group.WORLD, NopGroup(0, 2)
    opts = dist.AllreduceOptions()
    res = {
        "C++ backend (fake): dist.all_reduce": per_call_us(lambda: dist.all_reduce(t, group=cpp), args.n),
        "C++ backend (fake): pg.allreduce": per_call_us(lambda: cpp.allreduce([t], opts), args.n),
        "Python group (nop): dist.all_reduce": per_call_us(lambda: dist.all_reduce(t, group=py), args.n),
        "Python group (nop): pg.allreduce": per_call_us(lambda: py.allreduce([t], opts), args.n),
    }
    dist.destroy_process_group()
    for k, v in res.items():
        print(f"{k:40s} {v:7.3f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "us_per_call": res}, f, indent=1)


if __name__ == "__main__":
    main()
