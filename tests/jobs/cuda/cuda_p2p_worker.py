"""send/recv on CUDA tensors (test_cuda.py::test_cuda_p2p), one rank per GPU, any
world, in pairs (pairings; ring: every rank's): every dtype and size (up to 40 MiB,
past what the channel's slots hold) at odd
element offsets into poisoned, guarded destinations, compared bit for bit with what the
peer sent; the ring of batch_isend_irecv with 64 MiB messages in both post orders (no
deadlock); back-to-back isend/irecv with different tags; non-contiguous sources and
destinations; sends and receives whose Works are dropped unwaited, the device synchronized; a CUDA graph that captures a send/recv pair, replayed 20 times on new data; CPU and
CUDA messages of one pair interleaved; last, a receive that expected another size
(drained, destination untouched, the pair's next op raises what was sent). After each
section, no kernel of the channel has recorded an error; at the end, a channel per peer.

Every message is rebuilt from (case, sender) by both ranks, so the receiver knows what
it must get. Random bytes, viewed as each dtype: NaN patterns and all.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import wcommon as wc

SIZES = [1, 3, 1025, 600_003]
BIG = 40 << 20  # bytes: past the slots of a channel (16 blocks x 4 slots x 128 KiB = 8 MiB)
RING = 64 << 20


def _msg(case, src, n, dtype, dev):
    """The n elements rank src sends in case: random bytes on dev, at an odd element offset
    of a larger buffer (so that neither end is 16-byte aligned)."""
    es = torch.empty((), dtype=dtype).element_size()
    g = torch.Generator(device=dev).manual_seed(wc.seed_of(case, src))
    raw = torch.randint(0, 256, ((n + 2) * es,), generator=g, dtype=torch.uint8, device=dev)
    return raw.view(dtype)[1:1 + n]


def _poisoned(n, dtype, dev):
    """(raw, view): n elements of 0xA5 bytes at an odd offset of raw (uint8), with one
    poisoned guard element each side."""
    es = torch.empty((), dtype=dtype).element_size()
    raw = torch.full(((n + 2) * es,), 0xA5, dtype=torch.uint8, device=dev)
    return raw, raw.view(dtype)[1:1 + n]


def _bits(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _differ(got, exp):
    """None when got and exp hold the same bytes, else where they differ."""
    a, b = _bits(got), _bits(exp)
    if a.numel() != b.numel():
        return f"{a.numel()} bytes, expected {b.numel()}"
    bad = (a != b).nonzero().reshape(-1)
    if bad.numel() == 0:
        return None
    return f"{bad.numel()}/{a.numel()} bytes differ, first at byte {int(bad[0])}"


def _guards(ck, case, raw, view):
    """The guard elements around view (in raw) still hold the poison."""
    es = view.element_size()
    g = torch.cat([raw[:es], raw[-es:]])
    ck.check(f"{case}: guards untouched", bool((g == 0xA5).all()), str(g.tolist()))


def pairings(world):
    """Rounds of disjoint pairs (dicts rank -> partner) that give every rank a partner:
    r with r^1, and where world is odd, its last rank with rank 0 in a second round."""
    rounds = [{r: r ^ 1 for r in range(world - world % 2)}]
    if world % 2:
        rounds.append({world - 1: 0, 0: world - 1})
    return rounds


def exchange(ck, rank, peer, dev, case, n, dtype, recv_first):
    """Both ranks send n elements to each other (isend and irecv in the given order)."""
    mine = _msg(case, rank, n, dtype, dev)
    base, out = _poisoned(n, dtype, dev)
    if recv_first:
        works = [dist.irecv(out, src=peer), dist.isend(mine, dst=peer)]
    else:
        works = [dist.isend(mine, dst=peer), dist.irecv(out, src=peer)]
    for w in works:
        w.wait()
    why = _differ(out, _msg(case, peer, n, dtype, dev))
    ck.check(case, why is None, why or "")
    _guards(ck, case, base, out)


def matrix(ck, rank, peer, dev):
    """Every dtype x size, both directions at once, both post orders."""
    for dtype in wc.ALL_DTYPES:
        es = torch.empty((), dtype=dtype).element_size()
        for n in SIZES + [BIG // es + 3]:
            for recv_first in (False, True):
                case = f"matrix/{wc.dname(dtype)}/{n}/{'recv' if recv_first else 'send'}_first"
                exchange(ck, rank, peer, dev, case, n, dtype, recv_first)


def blocking(ck, rank, peer, dev):
    """dist.send/dist.recv, the pair's lower rank sending first, the other receiving first,
    40 MiB."""
    case, n = "blocking", BIG // 4 + 1
    base, out = _poisoned(n, torch.float32, dev)
    mine = _msg(case, rank, n, torch.float32, dev)
    if rank < peer:
        dist.send(mine, dst=peer)
        dist.recv(out, src=peer)
    else:
        dist.recv(out, src=peer)
        dist.send(mine, dst=peer)
    why = _differ(out, _msg(case, peer, n, torch.float32, dev))
    ck.check(case, why is None, why or "")
    _guards(ck, case, base, out)


def ring(ck, rank, world, dev):
    """batch_isend_irecv of the ring send(next), recv(prev) with 64 MiB messages, in both
    list orders: every rank's send waits for the peer's receive, so the two must run
    side by side."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    n = RING // 2 + 1  # bfloat16
    for order in ("send_first", "recv_first"):
        case = f"ring/{order}"
        base, out = _poisoned(n, torch.bfloat16, dev)
        ops = [dist.P2POp(dist.isend, _msg(case, rank, n, torch.bfloat16, dev), nxt),
               dist.P2POp(dist.irecv, out, prv)]
        if order == "recv_first":
            ops.reverse()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        why = _differ(out, _msg(case, prv, n, torch.bfloat16, dev))
        ck.check(case, why is None, why or "")
        _guards(ck, case, base, out)


def tagged(ck, rank, peer, dev):
    """Eight isends with tags 0..7 and sizes from 1 element to 12 MiB, then the eight
    matching irecvs, posted before any wait; the messages arrive in order."""
    sizes = [1, 4099, (12 << 20) // 8 + 5, 7, 600_003, 2, (9 << 20) // 8, 1025]
    sends, outs = [], []
    for tag, n in enumerate(sizes):
        case = f"tagged/{tag}"
        sends.append(dist.isend(_msg(case, rank, n, torch.int64, dev), dst=peer, tag=tag))
    for tag, n in enumerate(sizes):
        base, out = _poisoned(n, torch.int64, dev)
        outs.append((base, out, dist.irecv(out, src=peer, tag=tag)))
    for w in sends:
        w.wait()
    for tag, (base, out, w) in enumerate(outs):
        w.wait()
        case = f"tagged/{tag}"
        why = _differ(out, _msg(case, peer, sizes[tag], torch.int64, dev))
        ck.check(case, why is None, why or "")
        _guards(ck, case, base, out)


def strided(ck, rank, peer, dev):
    """A non-contiguous source (every other column) into a non-contiguous destination
    (a column block of a wider matrix): the elements in between stay poisoned. Both
    ranks post the irecv first and only then make the source, whose first strided fp16
    copy (gosym's contiguous copy of the source, its copy-back into the destination) is
    torch's strided copy kernel: loaded lazily at its first launch, which waits for the
    device, with the irecv's kernel already spinning there, that deadlocked the pair until
    the kernels timed out; gosym loads those kernels before its first (load_copies)."""
    rows, cols = 257, 33
    case = "strided"

    def source(r):
        return _msg(case, r, rows * 2 * cols, torch.float16, dev).reshape(rows, 2 * cols)[:, ::2]

    wide = torch.full((rows, cols + 7), float("nan"), dtype=torch.float16, device=dev)
    out = wide[:, 3:3 + cols]
    works = [dist.irecv(out, src=peer), dist.isend(source(rank), dst=peer)]
    for w in works:
        w.wait()
    why = _differ(out, source(peer))
    ck.check(case, why is None, why or "")
    rest = torch.cat([wide[:, :3].reshape(-1), wide[:, 3 + cols:].reshape(-1)])
    ck.check(f"{case}: other columns untouched", bool(rest.isnan().all()))


def mismatch(ck, rank, peer, dev):
    """The pair's lower rank sends 1000 elements, the other expects 999: its kernel drains
    the message, writes nothing and records the mismatch, so its next CUDA send/recv with
    the sender raises an error that gives the size and tag the sender sent (the pair's
    programs disagree; the error is sticky), by its wait() at the latest. The recv that
    drained may raise it already: its kernel, enqueued at the call, may have recorded the
    pair's error by the time its wait() reads it. Runs last."""
    case = "mismatch"
    if rank < peer:
        dist.send(_msg(case, rank, 1000, torch.float32, dev), dst=peer)
        torch.cuda.synchronize()
        return
    base, out = _poisoned(999, torch.float32, dev)
    try:
        dist.recv(out, src=peer)
    except wc.CLEAR_ERRORS as e:  # the drained mismatch, seen at once
        ck.check(f"{case}: the draining recv's error gives what was sent",
                 f"mismatch: rank {peer} sent 4000 bytes with tag 0" in str(e), str(e))
    torch.cuda.synchronize()
    ck.check(f"{case}: destination untouched", bool((base == 0xA5).all()),
             f"{int((base != 0xA5).sum())} bytes written")
    for what, post in (("recv", lambda: dist.irecv(out, src=peer).wait()),
                       ("send", lambda: dist.isend(out, dst=peer).wait())):
        e = ck.expect_error(f"{case}: the next {what} raises", post)
        if e is not None:
            ck.check(f"{case}: the {what}'s error gives what was sent",
                     f"mismatch: rank {peer} sent 4000 bytes with tag 0" in str(e), str(e))


def graph(ck, rank, peer, dev):
    """An isend/irecv pair and their waits captured in a CUDA graph, replayed 20 times,
    each time on new data: the channel's counters live on the devices, so every replay
    is a new message."""
    n = 300_007
    base = torch.arange(n, device=dev, dtype=torch.float32)
    src = torch.empty(n, device=dev)
    dst = torch.empty(n, device=dev)

    def body():
        works = [dist.isend(src, dst=peer), dist.irecv(dst, src=peer)]
        for w in works:
            w.wait()

    src.copy_(base)
    body()  # a message outside the capture first
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            body()
    except Exception as e:  # noqa: BLE001 - reported as the status
        ck.fail("graph: capture", wc.error_text(e))
        return f"capture failed: {wc.error_text(e)}"
    bad = torch.zeros((), dtype=torch.int64, device=dev)
    for k in range(20):
        src.copy_(base * (k + 2) + rank)
        dst.fill_(float("nan"))
        g.replay()
        bad += (dst != base * (k + 2) + peer).sum()
    torch.cuda.synchronize()
    ck.check("graph: 20 replays with new data", int(bad) == 0, f"{int(bad)} wrong elements")
    # The channel goes on outside the graph.
    exchange(ck, rank, peer, dev, "graph/after", 1025, torch.float32, False)
    return "captured"


def unwaited(ck, rank, peer, dev):
    """isend/irecv and batch_isend_irecv whose Works are dropped unwaited, as is the send's
    source, followed only by torch.cuda.synchronize(): the transfers still complete (NCCL
    enqueues at the call and keeps the tensors until its kernel ran), and the source's
    memory, handed out again and overwritten at once, does not change what arrives."""
    n = 300_001
    for case, batch in (("unwaited/isend", False), ("unwaited/batch", True)):
        base, out = _poisoned(n, torch.float32, dev)
        mine = _msg(case, rank, n, torch.float32, dev)
        if batch:
            dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer),
                                    dist.P2POp(dist.irecv, out, peer)])
        else:
            dist.isend(mine, dst=peer)
            dist.irecv(out, src=peer)
        del mine
        junk = torch.empty(n + 1, dtype=torch.float32, device=dev)
        junk.fill_(float("nan"))  # on the memory the source may have left
        torch.cuda.synchronize()
        why = _differ(out, _msg(case, peer, n, torch.float32, dev))
        ck.check(case, why is None, why or "")
        _guards(ck, case, base, out)
        del junk


def mixed(ck, rank, peer, dev):
    """CPU and CUDA messages of one pair, interleaved: host messages match by tag on the
    host path, CUDA ones in order on the channel."""
    cpu_out = torch.full((513,), -1, dtype=torch.int32)
    base, cuda_out = _poisoned(70_001, torch.float32, dev)
    cpu_msg = lambda r: torch.arange(513, dtype=torch.int32) * (r + 3)  # noqa: E731
    works = [dist.isend(cpu_msg(rank), dst=peer, tag=11),
             dist.isend(_msg("mixed", rank, 70_001, torch.float32, dev), dst=peer),
             dist.irecv(cuda_out, src=peer),
             dist.irecv(cpu_out, src=peer, tag=11)]
    for w in works:
        w.wait()
    ck.check("mixed: cpu", bool(torch.equal(cpu_out, cpu_msg(peer))), str(cpu_out[:4].tolist()))
    why = _differ(cuda_out, _msg("mixed", peer, 70_001, torch.float32, dev))
    ck.check("mixed: cuda", why is None, why or "")
    _guards(ck, "mixed: cuda", base, cuda_out)


def main():
    args = wc.setup()
    rank, world, dev, _ = wc.init_cuda(args)
    ck = wc.Checker(rank)
    # every rank meets each of its partners in the pair sections, in the same order
    partners = [rnd[rank] for rnd in pairings(world) if rank in rnd]
    ck.info["p2p_peers"] = sorted(set(partners) | {(rank + 1) % world, (rank - 1) % world})
    gosym_stats = lambda: {}  # noqa: E731
    if args.backend == "gosym":
        import gosym

        gosym_stats = gosym.stats
    sections = [("matrix", matrix, None), ("blocking", blocking, None),
                ("ring", ring, (ck, rank, world, dev)), ("tagged", tagged, None),
                ("strided", strided, None), ("unwaited", unwaited, None), ("graph", graph, None),
                ("mixed", mixed, None)]
    graphs = []
    for name, fn, fargs in sections:
        t0 = time.perf_counter()
        for peer in partners if fargs is None else [None]:  # a pair section once per partner
            got = ck.run(name, fn, *(fargs or (ck, rank, peer, dev)))
            if name == "graph":
                graphs.append(got)
        torch.cuda.synchronize()
        ck.info[f"{name}_s"] = round(time.perf_counter() - t0, 2)
        err = gosym_stats().get("gpu_p2p_error")
        ck.check(f"{name}: no channel error", err is None, str(err))
    graph_status = next((g for g in graphs if g != "captured"), "captured")
    for peer in partners:
        ck.run("mismatch", mismatch, ck, rank, peer, dev)
    torch.cuda.synchronize()
    stats = gosym_stats()
    if stats:
        ck.check("stats: a channel per peer", stats.get("gpu_p2p_channels") == len(ck.info["p2p_peers"]),
                 f"peers {ck.info['p2p_peers']}: {stats}")
        ck.check("stats: sends counted", stats.get("gpu_p2p_sends", 0) > 100, str(stats))
        err = stats.get("gpu_p2p_error") or ""
        ck.check("stats: the mismatch recorded on the receivers (a pair's higher rank) only",
                 ("4000 bytes" in err) == any(rank > p for p in partners), err)
    wc.write_result(ck.result(graph=graph_status, stats=stats))
    wc.print_summary(ck, "cuda_p2p")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
