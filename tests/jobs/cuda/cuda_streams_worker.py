"""CUDA collectives issued on several streams (test_cuda.py::test_cuda_streams), one
rank per GPU, any world size.

Parts (each records itself in info["parts_done"] when it ran to its end):

- fsdp: FSDP2's pattern, reduced: all_gather_into_tensor (async) on stream s1 and
  reduce_scatter_tensor (async) on stream s2 of the same group, one rank's s1 held back
  with torch.cuda._sleep (a different rank each round), at sizes of the LL, staged and
  direct paths; the Works are waited on the default stream, whose reads must see the
  results. Inputs are small integers in float32, so every sum is exact in any order and
  the results are compared bit for bit with a reference every rank builds.
- completion: is_completed() is False while the GPU is still busy before the op and True
  once it ran; wait() on another stream joins exactly the op (a read right after it sees
  the result); get_future() carries the outputs.
- dropped: an async op on a side stream whose input, allocated on the current stream,
  is dropped and its memory handed out again before the op (held back by a peer) ran.
- graph: a CUDA graph whose capture forks a second stream (all_reduce on the capturing
  stream, all_gather on the forked one, joined back) replays right three times.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import wcommon as wc

import gosym

SLEEP_CYCLES = 40_000_000  # ~20 ms on an H100/H200: every peer is well into its next op
# Elements per rank (float32): the LL path, the staged path, the direct path.
SIZES = [1024, (1 << 18) + 3, 4 << 20]


def ints(shape, seed, device):
    g = torch.Generator().manual_seed(seed)
    shape = (shape,) if isinstance(shape, int) else shape
    return torch.randint(-64, 64, shape, generator=g, dtype=torch.int32).to(torch.float32).to(device)


def fsdp(ck, rank, world, dev):
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    for n in SIZES:
        for rnd in range(2 * world):
            case = f"fsdp/{n}/{rnd}"
            shards = [ints(n, wc.seed_of("ag", n, rnd, r), dev) for r in range(world)]
            grads = [ints(world * n, wc.seed_of("rs", n, rnd, r), dev) for r in range(world)]
            ag_out = torch.full((world * n,), float("nan"), device=dev)
            rs_out = torch.full((n,), float("nan"), device=dev)
            cur = torch.cuda.current_stream(dev)
            s1.wait_stream(cur)
            s2.wait_stream(cur)
            with torch.cuda.stream(s1):
                if rank == rnd % world:
                    torch.cuda._sleep(SLEEP_CYCLES)
                w1 = dist.all_gather_into_tensor(ag_out, shards[rank], async_op=True)
            with torch.cuda.stream(s2):
                w2 = dist.reduce_scatter_tensor(rs_out, grads[rank], async_op=True)
            w1.wait()
            w2.wait()
            got_ag, got_rs = ag_out.clone(), rs_out.clone()  # on the current stream, after the waits
            want_rs = torch.stack(grads).sum(0)[rank * n:(rank + 1) * n]
            ck.check(f"{case}/all_gather", torch.equal(got_ag.cpu(), torch.cat(shards).cpu()),
                     "all_gather on s1 wrong")
            ck.check(f"{case}/reduce_scatter", torch.equal(got_rs.cpu(), want_rs.cpu()),
                     "reduce_scatter on s2 wrong")
    st = gosym.stats()
    ck.info["stream_joins"] = st.get("gpu_stream_joins")
    ck.check("fsdp/joins", st.get("gpu_stream_joins", 0) >= len(SIZES) * 2 * world,
             f"the group's ops changed streams but gpu_stream_joins is {st.get('gpu_stream_joins')}")


def completion(ck, rank, world, dev):
    x = ints(1 << 16, wc.seed_of("done", rank), dev)
    want = sum(ints(1 << 16, wc.seed_of("done", r), dev) for r in range(world))
    torch.cuda.synchronize(dev)
    torch.cuda._sleep(SLEEP_CYCLES * 5)  # ~100 ms before the op on this stream
    w = dist.all_reduce(x, async_op=True)
    ck.check("completion/pending", not w.is_completed(),
             "is_completed() is True while the GPU still runs the work before the op")
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        w.wait()  # joins the op into `side`
        seen = x.clone()
    torch.cuda.synchronize(dev)
    ck.check("completion/done", w.is_completed(), "is_completed() is False after a device sync")
    ck.check("completion/wait_joins", torch.equal(seen.cpu(), want.cpu()),
             "a read on another stream right after wait() missed the result")
    fut = dist.all_reduce(x, async_op=True).get_future()
    res = fut.wait()
    ck.check("completion/future", torch.equal(res[0].cpu(), (want * world).cpu()),
             "the future's value is not the op's output")


def dropped(ck, rank, world, dev):
    """Inputs allocated on the current stream, an async op on a side stream that a peer's
    held-back stream delays, the inputs dropped right after the call and their memory
    asked for again (same sizes, the current stream) and overwritten: the op must still
    move what the inputs held, as NCCL's collectives do (their tensors are recorded on
    the stream that uses them, so the caching allocator does not hand them out early)."""
    side = torch.cuda.Stream(dev)
    for n in SIZES:
        for rnd in range(world):
            case = f"dropped/{n}/{rnd}"
            shard = ints(n, wc.seed_of("drop", n, rnd, rank), dev)
            out = torch.full((world * n,), float("nan"), device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                if rank == rnd % world:
                    torch.cuda._sleep(SLEEP_CYCLES)
                w = dist.all_gather_into_tensor(out, shard, async_op=True)
            del shard
            junk = torch.full((n,), -1e9, device=dev)  # the freed block, if it were handed out
            w.wait()
            want = torch.cat([ints(n, wc.seed_of("drop", n, rnd, r), "cpu") for r in range(world)])
            ck.check(case, torch.equal(out.cpu(), want), "an input dropped after the call changed what moved")
            del junk


def graph(ck, rank, world, dev):
    n = 4096
    a = ints(n, wc.seed_of("ga", rank), dev)
    shard = ints(n, wc.seed_of("gs", rank), dev)
    out = torch.empty(world * n, device=dev)
    a0 = a.clone()
    side = torch.cuda.Stream(dev)
    warm = torch.cuda.Stream(dev)
    warm.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(warm):  # the group's CUDA side is set up before the capture
        dist.all_reduce(a.clone())
    torch.cuda.current_stream(dev).wait_stream(warm)
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cap = torch.cuda.current_stream(dev)
        side.wait_stream(cap)
        dist.all_reduce(a)
        with torch.cuda.stream(side):
            dist.all_gather_into_tensor(out, shard)
        cap.wait_stream(side)
    want_shards = torch.cat([ints(n, wc.seed_of("gs", r), dev) for r in range(world)])
    base = sum(ints(n, wc.seed_of("ga", r), dev) for r in range(world))
    for rep in range(3):
        a.copy_(a0)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(dev)
        ck.check(f"graph/{rep}/all_reduce", torch.equal(a.cpu(), base.cpu()), "captured all_reduce wrong")
        ck.check(f"graph/{rep}/all_gather", torch.equal(out.cpu(), want_shards.cpu()),
                 "captured all_gather on the forked stream wrong")
    del g


def main():
    args = wc.setup()
    rank, world, dev, _ = wc.init_cuda(args)
    ck = wc.Checker(rank)
    part = wc.part_runner(ck, rank, world, dev)
    part("fsdp", fsdp)
    part("completion", completion)
    part("dropped", dropped)
    part("graph", graph)
    wc.finish_cuda(ck, "cuda_streams_worker")


if __name__ == "__main__":
    main()
