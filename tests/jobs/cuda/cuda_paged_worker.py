"""Collectives on torch's expandable segments (test_cuda_reg.py), one rank per GPU.

Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: every tensor is paged VMM
memory (pages of 2 MiB or 20 MiB, each its own allocation, no legacy IPC handle), which
the direct path shares as runs of pages (gobackend/internal/gpu/pages.go).

Parts (each records itself in info["parts_done"] when it ran to its end):

- segments: the allocator really made expandable segments;
- collectives: all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
  all_to_all_single and broadcast at 1 MiB (staged), 8 MiB + 5 elements and 48 MiB + 3
  elements per rank (direct; the largest spans several pages), three times each on the
  same buffers with fresh inputs, against the reference and NCCL (cuda_reg_worker's
  against_nccl), outputs poisoned; from
  gosym.stats: the large ops go direct, the first op of a buffer publishes a run (or finds
  one of the same pages, published for an earlier buffer) and maps the peers' runs, the
  later ones reuse them (no new run, no new mapping);
- registered: tensors of 1 MiB + 3 elements mem_map'ed on every rank (private: paged memory
  has no legacy handle) go direct as runs all the same, between GOSYM_GPU_REG_DIRECT_MIN and
  GOSYM_GPU_DIRECT_MIN, against NCCL bitwise;
- churn: buffers of changing sizes are all_reduced, freed and given back to the driver
  (empty_cache) five times over, so torch maps new pages where old runs were: every
  result right (a stale mapping would read the old pages), and the old runs retired;
- captured: a CUDA graph captures an all_reduce of a tensor in the first page of a run
  that a larger tensor's op bound; the larger tensor is freed, its pages go back to the
  driver, new buffers are all_reduced over the same addresses, and the graph replays
  right: the run was kept (pages held, the peers' mappings open), not retired.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
import wcommon as wc
from cuda_reg_worker import OPS, against_nccl, delta, direct_reads
from cuda_worker import _input, _reference
from gpuref import compare_reduced

import gosym

KEYS = ("gpu_direct_ops", "gpu_relay_ops", "gpu_page_runs_made", "gpu_page_runs_retired", "gpu_peer_map_hits",
        "gpu_peer_map_misses", "gpu_peer_map_dropped", "gpu_page_runs_kept")
DIRECT_MIN = 8 << 20
# Elements per rank (float32): 1 MiB (staged), 8 MiB + 5, 48 MiB + 3 (several 20 MiB pages).
SIZES = [1 << 18, DIRECT_MIN // 4 + 5, (48 << 20) // 4 + 3]
REPS = 3


def stats() -> dict:
    s = gosym.stats()
    return {k: int(s.get(k, 0)) for k in KEYS}


def segments(ck, rank, world, dev):
    x = torch.empty(1 << 22, device=dev)
    segs = [s for s in torch.cuda.memory._snapshot()["segments"] if s["device"] == dev.index]
    owner = [s for s in segs if s["address"] <= x.data_ptr() < s["address"] + s["total_size"]]
    ck.check("segments: the tensor lies in an expandable segment",
             len(owner) == 1 and bool(owner[0].get("is_expandable")), str(owner))
    del x


def collectives(ck, rank, world, dev, nccl):
    for name, (fin, fout, call) in OPS.items():
        nin = {1: 1, "world": world}[fin]
        nout = {0: 0, 1: 1, "world": world}[fout]
        for k in SIZES:
            case = f"paged/{name}/{k}"
            x = torch.empty(nin * k, device=dev)
            out = torch.empty(nout * k, device=dev) if nout else None
            for rep in range(REPS):
                d = against_nccl(ck, f"{case}/{rep}", name, rank, x, out, call, nccl, stats)
                peers_read, publishes = direct_reads(ck, f"{case}/{rep}", name, rank, world, d)
                if k * 4 < DIRECT_MIN:
                    ck.check(f"{case}/{rep}: staged", d["gpu_direct_ops"] == 0 and d["gpu_page_runs_made"] == 0,
                             str(d))
                    continue
                ck.check(f"{case}/{rep}: direct", d["gpu_direct_ops"] == 1, str(d))
                if rep == 0:
                    # A run of the same pages, published for an earlier buffer there, is reused.
                    ck.check(f"{case}/{rep}: the first op publishes a run or finds one, and maps the peers'",
                             d["gpu_page_runs_made"] <= int(publishes)
                             and d["gpu_peer_map_misses"] + d["gpu_peer_map_hits"] == peers_read, str(d))
                else:
                    ck.check(f"{case}/{rep}: later ops reuse them",
                             d["gpu_page_runs_made"] == 0 and d["gpu_peer_map_misses"] == 0
                             and d["gpu_peer_map_hits"] == peers_read, str(d))
            del x, out
    ck.info["stats_after_collectives"] = stats()


def registered(ck, rank, world, dev, nccl):
    """Tensors mem_map'ed on every rank, between GOSYM_GPU_REG_DIRECT_MIN and
    GOSYM_GPU_DIRECT_MIN: paged memory registers private, and goes direct all the same, as
    runs of pages."""
    k = (1 << 18) + 3
    for name, (fin, fout, call) in OPS.items():
        x = torch.empty({1: 1, "world": world}[fin] * k, device=dev)
        nout = {0: 0, 1: 1, "world": world}[fout]
        out = torch.empty(nout * k, device=dev) if nout else None
        h = gosym.mem_map(x)
        ck.check(f"registered/{name}: private", not h.info()["shareable"], str(h.info()))
        for rep in range(2):
            d = against_nccl(ck, f"registered/{name}/{rep}", name, rank, x, out, call, nccl, stats)
            ck.check(f"registered/{name}/{rep}: direct", d["gpu_direct_ops"] == 1, str(d))
        h.unmap()
        del x, out


def churn(ck, rank, world, dev):
    before = stats()
    for i, mib in enumerate((40, 24, 64, 40, 30)):
        n = (mib << 20) // 4 + i
        x = torch.empty(n, device=dev)
        ins = [_input(f"churn/{i}", r, n, torch.float32, "SUM", dev) for r in range(world)]
        x.copy_(ins[rank])
        dist.all_reduce(x)
        torch.cuda.synchronize()
        why = compare_reduced(x, _reference(ins, "SUM", world), ins, "SUM")
        ck.check(f"churn/{i}: {mib} MiB all_reduce right", why is None, why or "")
        del x, ins
        gc.collect()
        torch.cuda.empty_cache()  # the pages go back to the driver: new ones map there next
    d = delta(before, stats())
    ck.info["churn"] = d
    ck.check("churn: every op direct", d["gpu_direct_ops"] == 5, str(d))
    ck.check("churn: old runs retired", d["gpu_page_runs_retired"] >= 1, str(d))
    ck.check("churn: the peers dropped old mappings", d["gpu_peer_map_dropped"] >= 1, str(d))


def captured(ck, rank, world, dev):
    small, large = (4 << 20) // 4 + 1, (44 << 20) // 4  # elements: the large spans 3 pages

    def fresh(case, n):
        """(this rank's input, every rank's)"""
        ins = [_input(case, r, n, torch.float32, "SUM", dev) for r in range(world)]
        return ins[rank], ins

    x = torch.empty(small, device=dev)  # first: the large one lies after it, from the same page
    big = torch.empty(large, device=dev)
    big.copy_(fresh("captured/big", large)[0])
    dist.all_reduce(big)  # binds a run of the pages from x's
    before = stats()
    x.copy_(fresh("captured/warm", small)[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(x)  # warm-up, outside capture
    torch.cuda.current_stream().wait_stream(side)
    shared = delta(before, stats())["gpu_page_runs_made"] == 0  # x found the large one's run
    ck.info["captured_shares_run"] = shared
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(x)
    del big
    gc.collect()
    torch.cuda.empty_cache()  # the large tensor's pages go back, x's first page stays
    for i in range(3):  # new pages at the same addresses: their runs retire or keep the old one
        y = torch.empty(large + i, device=dev)
        y.copy_(fresh(f"captured/y{i}", large + i)[0])
        dist.all_reduce(y)
        del y
    for k in range(3):
        mine, ins = fresh(f"captured/replay{k}", small)
        x.copy_(mine)
        g.replay()
        torch.cuda.synchronize()
        why = compare_reduced(x, _reference(ins, "SUM", world), ins, "SUM")
        ck.check(f"captured: replay {k} right after the run's other pages went", why is None, why or "")
    d = delta(before, stats())
    ck.info["captured"] = d
    if shared:
        ck.check("captured: the run a graph reads was kept, not retired", d["gpu_page_runs_kept"] >= 1, str(d))


def main():
    args = wc.setup()
    rank, world, dev, nccl = wc.init_cuda(args)
    ck = wc.Checker(rank)
    part = wc.part_runner(ck, rank, world, dev)

    part("segments", segments)
    part("collectives", collectives, nccl)
    part("registered", registered, nccl)
    part("churn", churn)
    part("captured", captured)
    ck.info["stats"] = gosym.stats()
    wc.finish_cuda(ck, "cuda_paged")


if __name__ == "__main__":
    main()
