"""A rank killed mid-op on the GPU (test_cuda.py::test_killed_rank_fails_the_survivors), one rank
per GPU, launched by conftest's spawn launcher (torchrun would kill the survivors).

--scenario collectives: every rank loops on CUDA all_reduce and all_gather of a group whose
timeout is long (GROUP_S), synchronizing every few steps; the last rank SIGKILLs itself in the
middle. --scenario p2p: the same in a ring of isend to the next rank and irecv from the previous
one, messages larger than a channel's outbox. The victim writes its pid and the time of its
death first. Every survivor records what its loop raised and when (it must be a
DistBackendError naming the lost rank, its pid and the op, well before GROUP_S: the engine's
watchdog aborts the kernels that wait for the dead rank), whether its streams then drain, what a
host op on the group raises afterwards, and how long destroy_process_group takes; it then exits
0. --scenario fresh: a new job on the same GPUs runs an all_reduce, as soon as the killed one
is gone.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time

import torch
import torch.distributed as dist
import wcommon as wc

GROUP_S = 300.0  # the group's timeout: every kernel wait's deadline, far past the 10 s promised
KILL_AT = 20  # the victim's loop step at which it dies
STEPS = 100_000  # more than the survivors can run without the victim


def describe(e: BaseException, since: float | None) -> dict:
    return {"type": f"{type(e).__module__}.{type(e).__name__}", "message": str(e),
            "is_backend_error": isinstance(e, dist.DistBackendError),
            "after_kill_s": None if since is None else round(time.time() - since, 3)}


def killed_at() -> float | None:
    """When the victim died (its note; the ranks share the host's clock), None without one."""
    try:
        with open(os.path.join(wc.out_dir(), "killed.json")) as f:
            return json.load(f)["at"]
    except (OSError, ValueError, KeyError):
        return None


def die(res: dict) -> None:
    """The victim: its note first, then SIGKILL (no teardown, no finalizer)."""
    note = {"pid": os.getpid(), "at": time.time()}
    with open(os.path.join(wc.out_dir(), "killed.json.tmp"), "w") as f:
        json.dump(note, f)
    os.replace(os.path.join(wc.out_dir(), "killed.json.tmp"), os.path.join(wc.out_dir(), "killed.json"))
    res["died_at"] = note["at"]
    wc.write_result(res)
    os.kill(os.getpid(), signal.SIGKILL)


def collectives(g, rank, world, dev, victim, res):
    x = torch.ones(1 << 20, device=dev)  # 4 MiB: staged kernels with barriers
    small = torch.ones(1024, device=dev)  # 4 KiB: the LL kernels
    out = torch.empty(world * x.numel(), device=dev)
    for i in range(STEPS):
        if rank == victim and i == KILL_AT:
            die(res)
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g)
        dist.all_gather_into_tensor(out, x, group=g)
        dist.all_reduce(small, op=dist.ReduceOp.MAX, group=g)
        if i % 8 == 7:
            torch.cuda.synchronize()


def ring(g, rank, world, dev, victim, res):
    n = 4 << 20  # 16 MiB: more than a channel's outbox (16 blocks x 4 slots x 128 KiB)
    src, dst = torch.ones(n, device=dev), torch.empty(n, device=dev)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for i in range(STEPS):
        if rank == victim and i == KILL_AT:
            die(res)
        works = [dist.isend(src, nxt, group=g), dist.irecv(dst, prev, group=g)]
        for w in works:
            w.wait()
        if i % 4 == 3:
            torch.cuda.synchronize()


def lost(args, rank, world, dev):
    victim = world - 1
    g = dist.new_group(timeout=datetime.timedelta(seconds=GROUP_S))
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x, group=g)  # sets up the group's CUDA data plane
    torch.cuda.synchronize()
    res = {"rank": rank, "pid": os.getpid(), "victim": victim, "warm_ok": bool((x == world).all())}
    wc.write_result(res)
    loop = collectives if args.scenario == "collectives" else ring
    try:
        loop(g, rank, world, dev, victim, res)
        res["error"] = None
    except Exception as e:  # noqa: BLE001 - the test judges what came out
        res["error"] = describe(e, killed_at())
    wc.write_result(res)
    t0 = time.monotonic()
    torch.cuda.synchronize()  # nothing of ours may still spin
    res["drain_s"] = round(time.monotonic() - t0, 3)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=g)  # a host op of the broken group
        res["host_error"] = None
    except Exception as e:  # noqa: BLE001
        res["host_error"] = describe(e, None)
        res["host_error"]["took_s"] = round(time.monotonic() - t0, 3)
    wc.write_result(res)
    t0 = time.monotonic()
    dist.destroy_process_group(g)
    dist.destroy_process_group()
    res["destroy_s"] = round(time.monotonic() - t0, 3)
    wc.write_result(res)


def fresh(rank, world, dev):
    x = torch.full((1 << 20,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    ck = wc.Checker(rank)
    ck.check("fresh all_reduce", bool((x == world * (world + 1) / 2).all()), str(x[:4]))
    dist.destroy_process_group()
    wc.write_result(ck.result())


def main():
    args = wc.setup(lambda p: p.add_argument("--scenario", choices=["collectives", "p2p", "fresh"], required=True))
    dev = wc.cuda_device()
    rank, world = wc.init(args.backend, args.timeout)
    if args.scenario == "fresh":
        fresh(rank, world, dev)
    else:
        lost(args, rank, world, dev)


if __name__ == "__main__":
    main()
