"""A peer that does not arrive on the GPU (test_cuda.py::test_device_timeout_names_the_peer),
one rank per GPU, any number of ranks; the last one is late.

Every rank warms up on the default group (long timeout: the kernels compile once per
process) and sets up the CUDA data plane of a second group of every rank with a short
timeout (T). Then the last rank keeps its GPU busy for 3T (torch.cuda._sleep) before its
barrier kernel of that group, while every other rank's barrier kernel gives up after T
and records the last rank, and it alone, as missing. Their barrier waits must raise an
error naming the last rank, their next CUDA op on the group too, and stats must show the
device error; the late rank's barrier passes (everyone else had arrived). The same with a
small all_reduce on a third group (the LL kernel: no barrier, each kernel waits for the
late rank's lines): the early ranks' next op names the late rank and the LL wait, the
late rank gets the right sum (the others' lines had arrived). The same once more with a
small all_gather on a fourth group (gs_llmove: the same lines and waits). All ranks then
meet on the default group and destroy everything. Last, on a fifth group with a long
timeout, the last rank passes another count to an all_reduce: every rank raises a
ValueError naming both counts within seconds.
"""

from __future__ import annotations

import datetime
import re
import time

import torch
import torch.distributed as dist
import wcommon as wc

SHORT_S = 3.0  # the short group's timeout (its kernels' deadline)


def _cycles_per_second(dev) -> float:
    """The rate of torch.cuda._sleep's clock on dev, measured with events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 200_000_000
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    return n / (start.elapsed_time(end) / 1000)


def scenario(ck, rank, dev, short):
    import gosym

    world = dist.get_world_size()
    late = world - 1
    y = torch.ones(1024, device=dev)
    dist.all_reduce(y, group=short)  # sets up the short group's CUDA data plane
    torch.cuda.synchronize()
    ck.check("warm all_reduce", bool((y == world).all()), str(y[:4]))
    dist.barrier()  # every rank is idle on the GPU from here
    torch.cuda.synchronize()

    if rank == late:
        torch.cuda._sleep(int(3 * SHORT_S * _cycles_per_second(dev)))
        ck.run("late barrier", dist.barrier, group=short)  # the others had arrived: passes
        ck.check("no device error on the late rank", gosym.stats(short)["gpu_device_error"] == 0,
                 str(gosym.stats(short)))
        return
    who = f"waiting for ranks [{late}]"
    e = ck.expect_error("barrier wait", dist.barrier, group=short)
    ck.check("barrier error names the late rank", e is not None and who in str(e), repr(e))
    ck.check("barrier error is a timeout", e is not None and "Timed out" in str(e), repr(e))
    e = ck.expect_error("next op", dist.all_reduce, y, group=short)
    ck.check("next op names the late rank", e is not None and who in str(e), repr(e))
    st = gosym.stats(short)
    ck.check("stats show the device error", st["gpu_device_error"] == 1, str(st))


def ll_scenario(ck, rank, dev, short, gather=False):
    """The LL scenario on group short: a small all_reduce (gs_ll), or with gather a small
    all_gather_into_tensor (gs_llmove, the same lines and waits)."""
    import gosym

    tag = "LL gather" if gather else "LL"
    world = dist.get_world_size()
    late = world - 1
    z = torch.ones(1024, device=dev)  # 4 KiB: an LL kernel
    out = torch.empty(1024 * world, device=dev)

    def op():
        if gather:
            dist.all_gather_into_tensor(out, z, group=short)
            return out
        dist.all_reduce(z, group=short)
        return z

    def expect(vals):  # the result's halves (all_gather) or whole (all_reduce)
        return torch.cat([torch.full((1024,), float(v), device=dev) for v in vals]) if gather \
            else torch.full((1024,), float(sum(vals)), device=dev)

    got = op()  # sets up this group's CUDA data plane
    torch.cuda.synchronize()
    ck.check(f"{tag}: warm op", bool((got == expect([1] * world)).all()), str(got[:4]))
    st = gosym.stats(short)
    ran = st["gpu_ll_moves"] if gather else st["gpu_algo_ll"]
    ck.check(f"{tag}: the small op ran an LL kernel", ran == 1, str(st))
    dist.barrier()
    torch.cuda.synchronize()
    z.fill_(rank + 1)
    if rank == late:
        torch.cuda._sleep(int(3 * SHORT_S * _cycles_per_second(dev)))
        got = op()
        torch.cuda.synchronize()
        ck.check(f"{tag}: the late rank got the result", bool((got == expect(range(1, world + 1))).all()),
                 str(got[:4]))
        ck.check(f"{tag}: no device error on the late rank", gosym.stats(short)["gpu_device_error"] == 0,
                 str(gosym.stats(short)))
        return
    op()
    torch.cuda.synchronize()  # the kernel gives up after SHORT_S
    e = ck.expect_error(f"{tag}: next op", op)
    # whichever of the launch's blocks gave up first names itself (4 KiB is 4 blocks of 128 lines)
    ck.check(f"{tag}: next op names the late rank and the LL wait",
             e is not None and f"waiting for ranks [{late}]" in str(e)
             and re.search(rf"LL kernel, block \d+ waiting for the lines of rank {late}\b", str(e)),
             repr(e))


def mismatch_scenario(ck, rank, dev, group):
    """One rank passes another count to a small CUDA all_reduce of group (long timeout): every
    rank raises a ValueError naming both ranks' counts within seconds, the odd rank (it posts
    last and refuses the op) at the call, the others, whose kernels it aborted, at their next
    op; the group stays failed (gobackend/internal/gpu/sig.go)."""
    world = dist.get_world_size()
    odd, n = world - 1, 1024
    z = torch.ones(n, device=dev)
    dist.all_reduce(z, group=group)  # sets up this group's CUDA data plane
    torch.cuda.synchronize()
    dist.barrier()
    x = torch.ones(n // 2 if rank == odd else n, device=dev)
    if rank == odd:
        time.sleep(1.0)  # the others enqueue theirs first
    t0 = time.monotonic()
    try:
        dist.all_reduce(x, group=group)
        e = None
    except ValueError as err:
        e = err
    ck.check("mismatch: the odd rank refuses at the call", (e is not None) == (rank == odd), repr(e))
    torch.cuda.synchronize()  # an aborted kernel ends at once
    if e is None:
        e = ck.expect_error("mismatch: next op", dist.all_reduce, z, group=group)
    took = time.monotonic() - t0
    msg = str(e)
    ck.check("mismatch: a ValueError", isinstance(e, ValueError), repr(e))
    ck.check("mismatch: names both ranks' counts", "arguments differ" in msg and f"{n} elements of float32" in msg
             and f"{n // 2} elements of float32" in msg, msg)
    ck.check("mismatch: within seconds, not the group's timeout", took < 20, f"{took:.1f} s")
    ck.expect_error("mismatch: the group stays failed", dist.all_reduce, z, group=group)


def main():
    args = wc.setup()
    dev = wc.cuda_device()
    rank, _ = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x)  # compiles the kernels before the short group's deadlines apply
    torch.cuda.synchronize()
    short = dist.new_group(timeout=datetime.timedelta(seconds=SHORT_S))
    short_ll = dist.new_group(timeout=datetime.timedelta(seconds=SHORT_S))
    short_llmove = dist.new_group(timeout=datetime.timedelta(seconds=SHORT_S))
    odd_args = dist.new_group(timeout=datetime.timedelta(seconds=60))
    ck.run("scenario", scenario, ck, rank, dev, short)
    ck.run("meet", dist.barrier)
    torch.cuda.synchronize()
    ck.run("LL scenario", ll_scenario, ck, rank, dev, short_ll)
    ck.run("meet again", dist.barrier)  # the default group is unaffected
    torch.cuda.synchronize()
    ck.run("LL gather scenario", ll_scenario, ck, rank, dev, short_llmove, gather=True)
    ck.run("meet at last", dist.barrier)
    torch.cuda.synchronize()
    ck.run("mismatch scenario", mismatch_scenario, ck, rank, dev, odd_args)
    ck.run("meet after the mismatch", dist.barrier)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    ck.run("destroy", dist.destroy_process_group)
    ck.info["destroy_s"] = round(time.monotonic() - t0, 2)
    wc.write_result(ck.result())
    wc.print_summary(ck, "cuda_timeout")


if __name__ == "__main__":
    main()
