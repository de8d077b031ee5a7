"""A short run of every CUDA collective for compute-sanitizer (memcheck): a few sizes,
each result checked, staged and direct paths. Launch (2 GPUs, safety variables set):

  torchrun --nproc-per-node 2 --no-python compute-sanitizer --tool memcheck \\
      --target-processes all --error-exitcode 9 python3 scripts/sanitize_cuda.py [PART ...]

Parts (default: all): ops (every collective at 1, 1025, 60001 and 600003 elements, a
skewed all_to_all among them), vmm (all_reduce and all_gather on gosym.empty buffers),
view (a contiguous view), paged (all_reduce and all_gather on torch tensors, which under
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True are runs of pages; their pages given
back to the driver and remapped between rounds). Under memcheck the ops part alone may
run for minutes.
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gosym  # noqa: E402,F401


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("gosym")
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = sys.argv[1:] or ["ops", "vmm", "view", "paged"]
    bad = 0
    for n in (1, 1025, 60_001, 600_003) if "ops" in parts else ():  # LL: 1 to 30 blocks; then staged
        x = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        bad += int((x != world * (world + 1) / 2).sum())
        out = torch.empty(n * world, device=dev)
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=dev))
        bad += int((out.view(world, n) != torch.arange(world, device=dev)[:, None]).sum())
        rs = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(rs, torch.ones(n * world, device=dev))
        bad += int((rs != world).sum())
        b = torch.full((n,), float(rank), device=dev)
        dist.broadcast(b, src=world - 1)
        bad += int((b != world - 1).sum())
        a = torch.full((n * world,), float(rank), device=dev)
        ao = torch.empty_like(a)
        dist.all_to_all_single(ao, a)
        bad += int((ao.view(world, n) != torch.arange(world, device=dev)[:, None]).sum())
        # skewed: rank r sends rank j (r + 2j + 1) * n // 4 + 1 elements (the paced kernel)
        cnt = [[(r + 2 * j + 1) * n // 4 + 1 for j in range(world)] for r in range(world)]
        s = torch.full((sum(cnt[rank]),), float(rank), device=dev)
        so = torch.empty(sum(cnt[j][rank] for j in range(world)), device=dev)
        dist.all_to_all_single(so, s, [cnt[j][rank] for j in range(world)], cnt[rank])
        want = torch.cat([torch.full((cnt[j][rank],), float(j), device=dev) for j in range(world)])
        bad += int((so != want).sum())
    # gosym.empty's VMM buffers: staged at the default thresholds; under
    # GOSYM_GPU_DIRECT_MIN=1 bound to the group by an fd exchange and read in place.
    for n in (1025, 600_003) if "vmm" in parts else ():
        g = gosym.empty(n, device=dev)
        g.fill_(float(rank + 1))
        dist.all_reduce(g)
        bad += int((g != world * (world + 1) / 2).sum())
        gi = gosym.empty(n, device=dev)
        gi.fill_(float(rank))
        go = torch.empty(n * world, device=dev)
        dist.all_gather_into_tensor(go, gi)
        bad += int((go.view(world, n) != torch.arange(world, device=dev)[:, None]).sum())
        del g, gi
    # torch's expandable segments: under GOSYM_GPU_DIRECT_MIN=1 shared as runs of pages
    # (24 MiB + 3 elements spans two 20 MiB pages); empty_cache remaps them between rounds.
    for rnd in range(2) if "paged" in parts else ():
        for n in (1025, 600_003, 6 * 2**20 + 3):
            p = torch.full((n,), float(rank + 1), device=dev)
            dist.all_reduce(p)
            bad += int((p != world * (world + 1) / 2).sum())
            pi = torch.full((n,), float(rank + rnd), device=dev)
            po = torch.empty(n * world, device=dev)
            dist.all_gather_into_tensor(po, pi)
            bad += int((po.view(world, n) != torch.arange(world, device=dev)[:, None] + rnd).sum())
            del p, pi, po
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if "view" in parts:
        y = gosym.empty(4096, device=dev)
        y.fill_(float(rank))
        v = gosym.contiguous_view(y)
        dist.barrier()
        torch.cuda.synchronize()
        bad += int((v[:, 0] != torch.arange(world, device=dev)).sum())
    torch.cuda.synchronize()
    st = gosym.stats()
    print(f"rank {rank}: parts {parts}: {bad} wrong elements; direct ops {st.get('gpu_direct_ops')}, "
          f"bindings created {st.get('gpu_bindings_created')}, page runs made {st.get('gpu_page_runs_made')}, "
          f"retired {st.get('gpu_page_runs_retired')}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
