"""Flat NCCL between ranks of one machine told apart into hosts by NCCL_HOSTID (what IdHosts
does on the GPU machine), with no gosym in the job: an all_reduce, then unbatched send/recv
(torch makes a second, 2-rank communicator for them), then a batched p2p ring. Says whether a
failure of gosym's CUDA jobs across simulated hosts is NCCL's with this setup.

Usage: python3 scripts/nccl_hostid_probe.py [NAME=VALUE ...]  (extra env for every rank)
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, port, extra):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), NCCL_HOSTID=f"probehost{rank}", **extra)
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    step = "init"
    try:
        dist.init_process_group("nccl", timeout=__import__("datetime").timedelta(seconds=60))
        step = "all_reduce"
        x = torch.full((1024,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        assert x[0].item() == world * (world + 1) / 2, x[0].item()
        step = "send/recv"
        peer = (rank + 1) % world
        src = (rank - 1) % world
        y = torch.full((4096,), float(rank), device=dev)
        z = torch.full((4096,), -1.0, device=dev)
        pair = [(dist.send, y, peer), (dist.recv, z, src)]
        for f, t, p in pair if rank % 2 == 0 else pair[::-1]:  # one side receives first
            f(t, p)
        torch.cuda.synchronize()
        assert z[0].item() == src, z[0].item()
        step = "batch ring"
        z.fill_(-1)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, y, peer),
                                         dist.P2POp(dist.irecv, z, src)]):
            w.wait()
        torch.cuda.synchronize()
        assert z[0].item() == src, z[0].item()
        print(f"rank {rank}: ok", flush=True)
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the probe reports, the job goes on
        print(f"rank {rank}: FAILED at {step}: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:300]}", flush=True)
        traceback.print_exc(limit=2)
        os._exit(1)


def main():
    extra = dict(kv.split("=", 1) for kv in sys.argv[1:])
    world = 2
    port = 29700 + os.getpid() % 1000
    print(f"probe: world {world}, extra env {extra}", flush=True)
    mp.start_processes(rank_main, args=(world, port, extra), nprocs=world, start_method="spawn",
                       join=True)


if __name__ == "__main__":
    main()
