"""Does a pair's first CUDA send wait for a kernel of this process that spins on another peer?

Session 51: torch's conformance batch (every rank receives from every rank, then sends) on a
group across 2 hosts x 2 ranks (4 ranks on one H200) hung: rank 0's first NCCL send across
hosts (HierGroup._p2p_connect with rank 2, a new 2-rank communicator) never returned while its
receive from rank 1 through the host's gosym group spun on the GPU, and rank 1 would send only
after its own first contacts. If making a communicator waits for the device (NCCL's init calls
into the CUDA runtime), any kernel that spins on a peer turns a first contact into a cycle.

This probe asks it without a cycle, on 4 ranks (2 "hosts" of 2 under simhosts for gosym; one
torchrun job for NCCL alone): ranks 0 and 1 exchange once (so their pair is set up), then rank 0
posts a receive from rank 1, which spins, and rank 1 sends only after --delay seconds. Meanwhile
rank 0 makes its first contact with rank 2 (a send; rank 2 receives). If rank 0's first contact
returns only after about --delay seconds, it waited for the spinning kernel.

  --backend nccl  (torchrun --nproc-per-node 4): torch's ProcessGroupNCCL, lazy 2-rank
                  communicators; the spinning kernel is NCCL's own receive.
  --backend gosym (simhosts.py --hosts 2,2 --gpus): a group across hosts; the spinning kernel is
                  gosym's receive within host 0, the first contact HierGroup's NCCL connect.

Variants that tell a gosym kernel from any long kernel, and a communicator's making from a
connection's (session 52 found rank 0's first contact waiting 8.9 s on gosym and 0.06 s on
NCCL alone, in NCCL's channel setup):

  --spin sleep     rank 0 spins with torch.cuda._sleep on a side stream of its own, no peer
  --spin gosym     (--backend nccl) rank 0's receive from rank 1 goes through a gosym group of
                   ranks 0 and 1 (one host), its first contact through NCCL's world group
  --contact batch  rank 0's and rank 2's first contact is a batch_isend_irecv of one op: with
                   --eager (the world group's communicator made at init, device_id bound)
                   torch's NCCL runs it on that communicator, so only the pair's connection
                   is new

Each rank prints one JSON line: the seconds its first-contact call took and when its receives
completed. Ranks sharing a GPU show NCCL a host each (wcommon.cuda_device, as the tests).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "jobs", "common"))
import wcommon as wc  # noqa: E402 - the tests' device choice (cuda_device)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["nccl", "gosym"], default="gosym")
    p.add_argument("--delay", type=float, default=8.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--spin", choices=["peer", "sleep", "gosym"], default="peer")
    p.add_argument("--contact", choices=["op", "batch"], default="op")
    p.add_argument("--eager", action="store_true")
    a = p.parse_args()
    dev = wc.cuda_device()
    if a.backend == "gosym" or a.spin == "gosym":
        import gosym  # noqa: F401 - registers the backend
    dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=a.timeout),
                            device_id=dev if a.eager else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 4:
        raise SystemExit(f"first_contact_probe: needs 4 ranks, got {world}")
    t = torch.full((1024,), float(rank), device=dev)
    got = torch.empty_like(t)
    out = {"backend": a.backend, "rank": rank, "delay_s": a.delay, "spin": a.spin,
           "contact": a.contact, "eager": a.eager}
    # the group rank 0's spinning receive from rank 1 takes (--spin gosym: one of gosym's)
    pair = dist.new_group([0, 1], backend="gosym") if a.spin == "gosym" else None

    def contact(op, peer):
        if a.contact == "batch":
            return dist.batch_isend_irecv([dist.P2POp(op, t if op is dist.isend else got, peer)])[0]
        return op(t if op is dist.isend else got, peer)

    # the pair 0-1 set up (NCCL: its communicator; gosym: its kernels loaded)
    if rank in (0, 1):
        peer = 1 - rank
        ws = [dist.isend(t, peer, group=pair), dist.irecv(got, peer, group=pair)] if rank == 0 \
            else [dist.irecv(got, peer, group=pair), dist.isend(t, peer, group=pair)]
        for w in ws:
            w.wait()
    torch.cuda.synchronize(dev)
    dist.barrier(device_ids=[dev.index]) if a.backend == "nccl" else dist.barrier()
    t0 = time.monotonic()
    if rank == 0:
        if a.spin == "sleep":  # any long kernel: about --delay s of clock cycles
            side = torch.cuda.Stream(dev)
            with torch.cuda.stream(side):
                torch.cuda._sleep(int(a.delay * 1.9e9))  # clock64 cycles: an H100/H200's ~1.9 GHz
            spin = None
        else:  # spins until rank 1 sends, --delay s from now
            spin = dist.irecv(got, 1, group=pair)
        c0 = time.monotonic()
        first = contact(dist.isend, 2)  # the first contact with rank 2
        out["contact_s"] = round(time.monotonic() - c0, 3)
        first.wait()
        if spin is not None:
            spin.wait()
        torch.cuda.synchronize(dev)
        out["recv_done_s"] = round(time.monotonic() - t0, 3)
        out["recv_ok"] = bool((got == 1).all()) if spin is not None else None
    elif rank == 1:
        time.sleep(a.delay)
        if a.spin != "sleep":
            dist.isend(t, 0, group=pair).wait()
        torch.cuda.synchronize(dev)
    elif rank == 2:
        c0 = time.monotonic()
        w = contact(dist.irecv, 0)
        out["contact_s"] = round(time.monotonic() - c0, 3)
        w.wait()
        torch.cuda.synchronize(dev)
        out["recv_done_s"] = round(time.monotonic() - t0, 3)
        out["recv_ok"] = bool((got == 0).all())
    print(json.dumps(out), flush=True)
    dist.barrier(device_ids=[dev.index]) if a.backend == "nccl" else dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
