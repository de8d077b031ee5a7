"""Point-to-point: send/recv, isend/irecv in both orders, tags, rings, batch_isend_irecv;
without CUDA, a CUDA send/recv fails clearly and host messages go on.

Messages are generated from (case, sender, receiver), so the receiver knows
what it must get; receive buffers are poisoned first.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import wcommon as wc
from wcommon import LARGE, make_input, poison_like


def msg(case, src, dst, n, dtype):
    return make_input(f"{case}/{src}->{dst}", 0, n, dtype)


def pairwise_blocking(ck, rank, world, case, dtype, n):
    """Even ranks send first, odd ranks receive first: blocking calls, no deadlock."""
    peer = rank ^ 1
    if peer >= world:
        return
    out = poison_like(msg(case, peer, rank, n, dtype))
    mine = msg(case, rank, peer, n, dtype)
    if rank % 2 == 0:
        dist.send(mine, dst=peer)
        dist.recv(out, src=peer)
    else:
        dist.recv(out, src=peer)
        dist.send(mine, dst=peer)
    why = wc.compare(out, msg(case, peer, rank, n, dtype))
    ck.check(case, why is None, why or "")


def ring_async(ck, rank, world, case, dtype, n, recv_first):
    """Everyone sends to the next rank and receives from the previous one; both post orders."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = poison_like(msg(case, prv, rank, n, dtype))
    mine = msg(case, rank, nxt, n, dtype)
    if recv_first:
        works = [dist.irecv(out, src=prv), dist.isend(mine, dst=nxt)]
    else:
        works = [dist.isend(mine, dst=nxt), dist.irecv(out, src=prv)]
    for w in reversed(works):  # waiting order must not matter
        w.wait()
    why = wc.compare(out, msg(case, prv, rank, n, dtype))
    ck.check(case, why is None, why or "")


def mixed_orders(ck, rank, world, case):
    """Rank 0 posts isend then irecv, rank 1 irecv then isend (the classic deadlock shape)."""
    if rank > 1:
        return
    peer = 1 - rank
    out = poison_like(msg(case, peer, rank, 777, torch.float32))
    mine = msg(case, rank, peer, 777, torch.float32)
    if rank == 0:
        works = [dist.isend(mine, dst=peer), dist.irecv(out, src=peer)]
    else:
        works = [dist.irecv(out, src=peer), dist.isend(mine, dst=peer)]
    for w in works:
        w.wait()
    why = wc.compare(out, msg(case, peer, rank, 777, torch.float32))
    ck.check(case, why is None, why or "")


def tags_out_of_order(ck, rank, world, case):
    """Rank 0 sends tags 3, 1, 2; rank 1 receives tags 1, 2, 3: matching is by tag."""
    if rank > 1:
        return
    tags = [3, 1, 2]
    if rank == 0:
        works = [dist.isend(msg(case, 0, 1, 10 + t, torch.int32), dst=1, tag=t) for t in tags]
        for w in works:
            w.wait()
    else:
        outs = {t: poison_like(msg(case, 0, 1, 10 + t, torch.int32)) for t in sorted(tags)}
        works = [dist.irecv(outs[t], src=0, tag=t) for t in sorted(tags)]
        for w in works:
            w.wait()
        for t in tags:
            why = wc.compare(outs[t], msg(case, 0, 1, 10 + t, torch.int32))
            ck.check(f"{case} tag={t}", why is None, why or "")


def same_tag_fifo(ck, rank, world, case):
    """Several messages with one tag arrive in the order they were sent."""
    if rank > 1:
        return
    k = 5
    if rank == 0:
        for w in [dist.isend(msg(f"{case}/{i}", 0, 1, 33, torch.float64), dst=1, tag=7) for i in range(k)]:
            w.wait()
    else:
        outs = [torch.full((33,), float("nan"), dtype=torch.float64) for _ in range(k)]
        for w in [dist.irecv(o, src=0, tag=7) for o in outs]:
            w.wait()
        for i, o in enumerate(outs):
            why = wc.compare(o, msg(f"{case}/{i}", 0, 1, 33, torch.float64))
            ck.check(f"{case} #{i}", why is None, why or "")


def batch_ring(ck, rank, world, case):
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = poison_like(msg(case, prv, rank, 4099, torch.bfloat16))
    ops = [dist.P2POp(dist.isend, msg(case, rank, nxt, 4099, torch.bfloat16), nxt),
           dist.P2POp(dist.irecv, out, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    why = wc.compare(out, msg(case, prv, rank, 4099, torch.bfloat16))
    ck.check(case, why is None, why or "")


def subgroup_p2p(ck, rank, world, case):
    """Peers are global ranks in the API, group ranks inside the backend."""
    if world < 3:
        return
    members = [world - 1, 1]  # group rank 0 is global 1 (new_group sorts), rank 1 is global world-1
    g = dist.new_group(members)
    if rank not in members:
        return
    peer = members[0] if rank == members[1] else members[1]
    out = poison_like(msg(case, peer, rank, 65, torch.int64))
    works = [dist.irecv(out, src=peer, group=g), dist.isend(msg(case, rank, peer, 65, torch.int64), dst=peer, group=g)]
    for w in works:
        w.wait()
    why = wc.compare(out, msg(case, peer, rank, 65, torch.int64))
    ck.check(case, why is None, why or "")


def cuda_unavailable(ck, rank, world, case):
    """Without CUDA, a CUDA send/recv (posted through the C ABI with device 0, as the
    backend posts one for a CUDA tensor) fails on both ranks of the pair with
    NotImplementedError naming the peer; the pair's host messages go on (main's later
    cases). With CUDA this is the GPU suite's business."""
    if rank > 1 or torch.cuda.is_available():
        return
    import gosym
    import gosym._lib as lib
    from torch.distributed import distributed_c10d as c10d

    pg = gosym.group(c10d._get_default_group())
    buf = torch.zeros(4)
    peer = 1 - rank
    op = lib.OP_SEND if rank == 0 else lib.OP_RECV
    addrs = (buf.data_ptr(), 0) if rank == 0 else (0, buf.data_ptr())
    desc = lib.on_stream(lib.pack_desc(op, lib.DTYPE_FLOAT32, 0, 1.0, 0, peer, 0, 4, *addrs, 0, 0, 0, 0),
                         0, 0)
    for attempt in range(2):  # the second fails at once, without a handshake
        e = ck.expect_error(f"{case} #{attempt}", lib.post, pg._endpoint(), desc)
        if e is not None:
            ck.check(f"{case} #{attempt}: NotImplementedError", isinstance(e, NotImplementedError),
                     wc.error_text(e))
            what = f"{'send to' if rank == 0 else 'recv from'} rank {peer} on cuda:0"
            ck.check(f"{case} #{attempt}: names the op and the peer",
                     what in str(e) and "CUDA p2p channel" in str(e), wc.error_text(e))


def main():
    args = wc.setup()
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    for dtype in wc.ALL_DTYPES:
        for n in (0, 1, 1025):
            case = f"send_recv/{wc.dname(dtype)}/n={n}"
            ck.run(case, pairwise_blocking, ck, rank, world, case, dtype, n)
            for recv_first in (False, True):
                case = f"ring/{'irecv_first' if recv_first else 'isend_first'}/{wc.dname(dtype)}/n={n}"
                ck.run(case, ring_async, ck, rank, world, case, dtype, n, recv_first)
    for dtype in (torch.float32, torch.int8):
        case = f"send_recv/{wc.dname(dtype)}/n=LARGE"
        ck.run(case, pairwise_blocking, ck, rank, world, case, dtype, LARGE)
        case = f"ring/{wc.dname(dtype)}/n=LARGE"
        ck.run(case, ring_async, ck, rank, world, case, dtype, LARGE, True)
    ck.run("mixed_orders", mixed_orders, ck, rank, world, "mixed_orders")
    ck.run("tags_out_of_order", tags_out_of_order, ck, rank, world, "tags_out_of_order")
    ck.run("same_tag_fifo", same_tag_fifo, ck, rank, world, "same_tag_fifo")
    ck.run("batch_isend_irecv", batch_ring, ck, rank, world, "batch_isend_irecv")
    ck.run("subgroup", subgroup_p2p, ck, rank, world, "subgroup")
    ck.run("cuda_unavailable", cuda_unavailable, ck, rank, world, "cuda_unavailable")
    case = "send_recv after cuda_unavailable"
    ck.run(case, pairwise_blocking, ck, rank, world, case, torch.float32, 1025)
    # p2p and collectives interleave on one group.
    t = torch.ones(3)
    ck.run("all_reduce after p2p", dist.all_reduce, t)
    ck.check("all_reduce after p2p value", bool((t == world).all()), str(t))
    wc.print_summary(ck, "p2p")
    wc.write_result(ck.result())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
