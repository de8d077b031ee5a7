"""Whether ranks can share one GPU: torchrun --nproc-per-node 2 scripts/same_gpu_probe.py
{nccl,gosym} puts every rank on cuda:0 and checks all_reduce and all_gather_into_tensor
(NCCL needs NCCL_HOSTID per rank for it). Session 29 on 1xH200: both exact, which
tests/conftest.py's GOSYM_TEST_RANKS_PER_GPU builds on."""
import os, sys, time, torch, torch.distributed as dist
backend = sys.argv[1]
if backend == "gosym":
    import gosym  # noqa
torch.cuda.set_device(0)
t0 = time.time()
dist.init_process_group(backend, device_id=torch.device("cuda", 0) if backend == "nccl" else None)
r, w = dist.get_rank(), dist.get_world_size()
ok = True
for n in (1024, 1 << 18, 1 << 22):
    x = torch.full((n,), float(r + 1), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    ok &= bool((x == w * (w + 1) / 2).all())
    y = torch.empty(n * w, device="cuda")
    dist.all_gather_into_tensor(y, torch.full((n,), float(r), device="cuda"))
    torch.cuda.synchronize()
    ok &= bool(torch.equal(y.view(w, n)[:, 0].cpu(), torch.arange(w, dtype=torch.float32)))
t = time.time()
for _ in range(20):
    dist.all_reduce(x)
torch.cuda.synchronize()
print(f"{backend} rank {r}/{w} on cuda:0 ok={ok} init+checks {t - t0:.1f}s, all_reduce 16 MiB x20 {(time.time() - t) * 1e3 / 20:.1f} ms/op", flush=True)
dist.destroy_process_group()
