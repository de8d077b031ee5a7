"""Host cost per CUDA op, layer by layer (run under torchrun, 2 GPUs).

Each loop enqueues N ops and stops its clock before synchronizing, with N
small enough that the launch queue never fills: the figure is the host's
time per call, not the GPU's. Layers: torch's dispatch (dist.*), the
backend's Python (pg.*), the native post (Go + one driver launch), and the
pieces of Python glue. --profile adds a cProfile of the dist.* loops.

  torchrun --nproc-per-node 2 scripts/cuda_overhead.py --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time

import torch
import torch.distributed as dist

import gosym  # noqa: F401 - registers the backend
from gosym import _lib
from gosym._dtypes import move_dtype
from gosym.backend import _raw_stream


def per_call(fn, n):
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    return (t1 - t0) / n / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("gosym")
    pg = dist.distributed_c10d._get_default_group()
    be = pg._get_backend(torch.device("cuda", rank)) if hasattr(pg, "_get_backend") else pg
    w = dist.get_world_size()
    t = torch.randn(256, device="cuda")
    big = torch.randn(256 * w, device="cuda")
    out = torch.empty(256 * w, device="cuda")
    ar_opts = dist.AllreduceOptions()
    dist.all_reduce(t)  # sets the group up
    torch.cuda.synchronize()

    raw = _raw_stream(rank)
    desc = _lib.on_stream(_lib.pack_desc(_lib.OP_ALLREDUCE, 0, 0, 1.0, 0, 0, 0, t.numel(), t.data_ptr(),
                                         t.data_ptr(), 0, 0, 0, 0), raw, rank)
    h = be._endpoint() if hasattr(be, "_endpoint") else pg._endpoint()

    desc0 = _lib.on_stream(_lib.pack_desc(_lib.OP_ALLREDUCE, 0, 0, 1.0, 0, 0, 0, 0, t.data_ptr(),
                                          t.data_ptr(), 0, 0, 0, 0), raw, rank)

    def native():
        _lib.work_release(_lib.post(h, desc))

    side = torch.cuda.Stream()
    desc_side = _lib.on_stream(desc, side.cuda_stream, rank)

    def on_side(fn):
        with torch.cuda.stream(side):
            fn()

    def native_side():
        _lib.work_release(_lib.post(h, desc_side))

    def native0():
        _lib.work_release(_lib.post(h, desc0))

    def run1():
        _lib.run(h, desc)

    # The two-buffer ops on tensors sliced once, layer by layer, as all_reduce above.
    rs_out, rs_in, a2a_out = t[: 256 // w], big[:256], out[:256]
    rs_opts = dist.ReduceScatterOptions()
    code, mult = move_dtype(t)
    # bench.py's skewed split: the bulk to the next rank, a sliver to every other
    minor = 256 // (8 * w)
    ins = [256 - (w - 1) * minor if d == (rank + 1) % w else minor for d in range(w)]
    outs = [256 - (w - 1) * minor if q == (rank - 1) % w else minor for q in range(w)]
    two = {
        "all_gather_into_tensor": (lambda: dist.all_gather_into_tensor(out, t),
                                   lambda: be._allgather_base(out, t),
                                   be._allgather_base_desc(out, t)[0]),
        "reduce_scatter_tensor": (lambda: dist.reduce_scatter_tensor(rs_out, rs_in),
                                  lambda: be._reduce_scatter_base(rs_out, rs_in, rs_opts),
                                  be._reduce_scatter_base_desc(rs_out, rs_in, rs_opts)[0]),
        "all_to_all_single": (lambda: dist.all_to_all_single(a2a_out, t),
                              lambda: be.alltoall_base(a2a_out, t, [], []),
                              (_lib.OP_ALLTOALL, code, 0, 1.0, 0, 0, 0, 256 * mult // w,
                               t.data_ptr(), a2a_out.data_ptr(), 0, 0, 0, 0)),
    }

    cases = {
        "dist.all_reduce 1K": lambda: dist.all_reduce(t),
        "pg.allreduce 1K (no torch dispatch)": lambda: be.allreduce([t], ar_opts),
        "native post+release 1K (Go + launch)": native,
        "native post+release, count 0 (Go, no driver)": native0,
        "native run 1K (one call: post, wait, release)": run1,
        "dist.broadcast 1K": lambda: dist.broadcast(t, 0),
        "dist.all_gather_into_tensor 1K": lambda: dist.all_gather_into_tensor(out, t),
        "dist.reduce_scatter_tensor 1K": lambda: dist.reduce_scatter_tensor(t[: 256 // w], big[:256]),
        "dist.all_to_all_single 1K": lambda: dist.all_to_all_single(out[:256], t),
        **{f"{layer}{name} 1K{note}": fn
           for name, (d, p, fields) in two.items()
           for layer, note, fn in (
               ("dist.", " (views made once)", d), ("pg.", " (no torch dispatch)", p),
               ("native run ", "", lambda dd=_lib.pack_desc(*fields, raw, rank): _lib.run(h, dd)))},
        "dist.all_to_all_single 1K, skewed splits": lambda: dist.all_to_all_single(a2a_out, t, outs, ins),
        "pg.alltoall_base 1K, skewed splits": lambda: be.alltoall_base(a2a_out, t, outs, ins),
        "t.add_(1) (one torch kernel)": lambda: t.add_(1),
        "torch.cuda._sleep(0) (one bare launch)": lambda: torch.cuda._sleep(0),
        "pg.allreduce 1K on a side stream": lambda: on_side(lambda: be.allreduce([t], ar_opts)),
        "native post+release 1K on a side stream": lambda: on_side(native_side),
        "t.add_(1) on a side stream": lambda: on_side(lambda: t.add_(1)),
        "torch.cuda.is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "_raw_stream": lambda: _raw_stream(rank),
    }
    res = {}
    for name, fn in cases.items():
        res[name] = min(per_call(fn, a.n) for _ in range(a.reps))
    if a.profile and rank == 0:
        for name in ("dist.all_reduce 1K", "dist.all_to_all_single 1K", "dist.all_to_all_single 1K, skewed splits"):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(2000):
                cases[name]()
            pr.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
            res[f"profile {name}"] = s.getvalue()
    elif a.profile:
        for name in ("dist.all_reduce 1K", "dist.all_to_all_single 1K", "dist.all_to_all_single 1K, skewed splits"):
            for _ in range(2000):
                cases[name]()
        torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        for k, v in res.items():
            print(f"{k:45s} {v:8.2f} us" if isinstance(v, float) else f"== {k}\n{v}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
