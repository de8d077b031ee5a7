"""all_to_all_single on gosym.empty buffers, read in place through the
peer-mapping cache (gobackend/bind.go): equal, uneven and zero splits; a peer
that frees and reallocates its buffer; a deep queue of async calls; and the
bounds and agreement errors, which every rank must raise without hanging.

Split matrices s[i][j] are the elements (rows) rank i sends to rank j. Every
non-empty input is at least 64 KiB, the default GOSYM_DIRECT_MIN, so the
ranks read each other's inputs in place, which peer_map_hits proves.
"""

from __future__ import annotations

import gc
import time
from array import array

import torch
import torch.distributed as dist
import wcommon as wc
from wcommon import bind_counters, check_delta, expect_raise, poison_

import gosym
from gosym import _lib


def split_matrix(kind: str, world: int, salt: int = 0) -> list[list[int]]:
    if kind == "equal":
        return [[12000] * world for _ in range(world)]
    s = [[17000 + 1031 * ((3 * i + 5 * j + salt) % 7) for j in range(world)] for i in range(world)]
    if kind == "zeros":  # the last rank sends nothing, rank 1 receives nothing, 0 skips 2
        for j in range(world):
            s[world - 1][j] = 0
        for i in range(world):
            s[i][min(1, world - 1)] = 0
        if world > 2:
            s[0][2] = 0
    return s


def piece(case, k, src, dst, rows, cols, dtype):
    """What src sends dst in call k of case (any rank can rebuild it)."""
    t = wc.make_input(f"{case}/{k}/{dst}", src, rows * cols, dtype)
    return t.view(rows, cols) if cols > 1 else t


def in_buffer(s, rank, cols, dtype):
    rows = sum(s[rank])
    return gosym.empty((rows, cols) if cols > 1 else (rows,), dtype=dtype)


def out_buffer(s, rank, cols, dtype):
    rows = sum(s[i][rank] for i in range(len(s)))
    return gosym.empty((rows, cols) if cols > 1 else (rows,), dtype=dtype)


def buffers(s, rank, cols, dtype):
    return in_buffer(s, rank, cols, dtype), out_buffer(s, rank, cols, dtype)


def fill(case, k, s, rank, inp, cols):
    world = len(s)
    inp.copy_(torch.cat([piece(case, k, rank, j, s[rank][j], cols, inp.dtype) for j in range(world)]))


def expected(case, k, s, rank, cols, dtype):
    world = len(s)
    return torch.cat([piece(case, k, i, rank, s[i][rank], cols, dtype) for i in range(world)])


def run(ck, case, k, s, rank, inp, out, cols):
    """Fills inp for call k of case, runs it on (inp, out) and checks out."""
    world = len(s)
    fill(case, k, s, rank, inp, cols)
    poison_(out)
    dist.all_to_all_single(out, inp, [s[i][rank] for i in range(world)], s[rank])
    why = wc.compare(out, expected(case, k, s, rank, cols, out.dtype))
    ck.check(f"{case} call {k}: result", why is None, why or "")


def peers_sending(s, rank):
    return sum(1 for r in range(len(s)) if r != rank and sum(s[r]) > 0)


# -- 8: splits and the mapping cache ---------------------------------------------------------


def splits(ck, rank, world):
    for kind, dtype, cols in (("equal", torch.float32, 1), ("uneven", torch.float32, 1),
                              ("zeros", torch.float32, 1), ("uneven", torch.bfloat16, 3),
                              ("zeros", torch.int64, 3)):
        case = f"splits/{kind}/{wc.dname(dtype)}/cols={cols}"
        s = split_matrix(kind, world)
        inp, out = buffers(s, rank, cols, dtype)
        sends = int(sum(s[rank]) > 0)
        c0 = bind_counters()
        run(ck, case, 0, s, rank, inp, out, cols)
        c1 = bind_counters()
        # A rank reads in place from every peer that shares a region (sends anything).
        reads = ">0" if peers_sending(s, rank) else 0
        check_delta(ck, f"{case} first call", c0, c1, bindings_created=sends,
                    peer_map_misses=peers_sending(s, rank), peer_map_hits=reads)
        for k in (1, 2, 3):
            run(ck, case, k, s, rank, inp, out, cols)
        check_delta(ck, f"{case} repeated calls", c1, bind_counters(), bindings_created=0,
                    bindings_reused=3 * sends, peer_map_misses=0, peer_maps=0, peer_map_hits=reads)
        ck.info.setdefault("hits", {})[case] = bind_counters()["peer_map_hits"] - c0["peer_map_hits"]


# -- 9: a peer frees and reallocates ---------------------------------------------------------


def realloc(ck, rank, world, victim=1):
    case, cols, dtype = "realloc", 1, torch.float32
    s = split_matrix("uneven", world)
    inp, out = buffers(s, rank, cols, dtype)
    run(ck, case, 0, s, rank, inp, out, cols)
    run(ck, case, 1, s, rank, inp, out, cols)
    repeated = []
    for trial in range(3):
        k = 10 + 2 * trial
        c0 = bind_counters()
        if rank == victim:
            old = inp.data_ptr()
            del inp
            gc.collect()
            inp = gosym.empty(sum(s[rank]))  # same size, right away: the likeliest reuse
            repeated.append(inp.data_ptr() == old)
        run(ck, f"{case} trial {trial}", k, s, rank, inp, out, cols)
        c1 = bind_counters()
        if rank == victim:
            check_delta(ck, f"{case} trial {trial} (freed and reallocated)", c0, c1, bindings_created=1,
                        bindings_released=1, peer_map_misses=0, peer_map_dropped=0)
        else:
            check_delta(ck, f"{case} trial {trial} (peer reallocated)", c0, c1, bindings_created=0,
                        bindings_reused=1, peer_map_misses=1, peer_map_dropped=1, peer_maps=0)
        run(ck, f"{case} trial {trial}", k + 1, s, rank, inp, out, cols)
        check_delta(ck, f"{case} trial {trial} next call", c1, bind_counters(), bindings_created=0,
                    peer_map_misses=0, peer_map_dropped=0, peer_maps=0, peer_map_hits=">0")
    # The victim frees its buffer and sends from ordinary memory: the retired id
    # still reaches the peers (staged op), and nobody reads the freed region.
    c0 = bind_counters()
    if rank == victim:
        del inp
        gc.collect()
        inp = torch.empty(sum(s[rank]))
    run(ck, f"{case} ordinary", 20, s, rank, inp, out, cols)
    want = {"bindings_released": 1, "peer_map_dropped": 0} if rank == victim else {"peer_map_dropped": 1}
    check_delta(ck, f"{case} peer switched to ordinary memory", c0, bind_counters(), peer_map_misses=0,
                peer_map_hits=0, **want)
    # Six regions retired at once: the peers drop all six mappings within the next
    # few ops (each op carries a bounded list of retired ids).
    c0 = bind_counters()
    extra = []
    for b in range(6):
        buf = gosym.empty(sum(s[rank])) if rank == victim else inp
        run(ck, f"{case} backlog bind {b}", 30 + b, s, rank, buf, out, cols)
        extra.append(buf)
    del extra, buf
    gc.collect()
    for k in range(3):
        run(ck, f"{case} backlog drain", 40 + k, s, rank, inp, out, cols)
    want = {"bindings_released": 6} if rank == victim else {"peer_map_misses": 6, "peer_map_dropped": 6}
    check_delta(ck, f"{case} six retired regions", c0, bind_counters(), peer_maps=0, **want)
    if rank == victim:
        ck.info["address_repeated"] = repeated


# -- 10: a deep queue of async calls (64, many times the sync slots) --------------------------


def deep_queue(ck, rank, world, n_per=16, sleeper=1):
    cols, dtype = 1, torch.float32
    mats = [split_matrix("uneven", world, salt) for salt in range(4)]
    # Fill and bind the four inputs first: the flight then must not open a single mapping.
    ins = [in_buffer(s, rank, cols, dtype) for s in mats]
    for b, s in enumerate(mats):
        run(ck, f"async{b}", 0, s, rank, ins[b], out_buffer(s, rank, cols, dtype), cols)
    total = 4 * n_per
    outs = [poison_(out_buffer(mats[i % 4], rank, cols, dtype)) for i in range(total)]
    c0 = bind_counters()
    works = []
    for i in range(total):
        s = mats[i % 4]
        works.append(dist.all_to_all_single(outs[i], ins[i % 4], [s[r][rank] for r in range(world)], s[rank],
                                            async_op=True))
    if rank == sleeper:
        time.sleep(0.05)
    for w in works:
        w.wait()
    for i in range(total):
        why = wc.compare(outs[i], expected(f"async{i % 4}", 0, mats[i % 4], rank, cols, dtype))
        ck.check(f"async call {i}: result", why is None, why or "")
    check_delta(ck, f"{total} async calls", c0, bind_counters(), bindings_created=0, bindings_reused=total,
                peer_map_misses=0, peer_map_dropped=0, peer_maps=0, peer_map_hits=">0", peer_map_pins=0)
    ck.check("async calls: every peer-mapping pin released", bind_counters()["peer_map_pins"] == 0,
             str(bind_counters()))

    # Ping-pong: each call reads what the previous one wrote (A -> B with s, B -> A
    # with s transposed), so A returns to its original content after every pair.
    s = mats[0]
    back = [s[i][rank] for i in range(world)]
    A, B = in_buffer(s, rank, cols, dtype), out_buffer(s, rank, cols, dtype)
    run(ck, "pingpong", 0, s, rank, A, B, cols)  # binds A, and fills it
    orig = A.clone()
    dist.all_to_all_single(A, B, s[rank], back)  # binds B
    works = []
    for i in range(total):
        if i % 2 == 0:
            works.append(dist.all_to_all_single(B, A, back, s[rank], async_op=True))
        else:
            works.append(dist.all_to_all_single(A, B, s[rank], back, async_op=True))
    if rank == sleeper:
        time.sleep(0.05)
    for w in works:
        w.wait()
    why = wc.compare(A, orig)
    ck.check(f"pingpong: A after {total} chained async calls", why is None, why or "")
    why = wc.compare(B, expected("pingpong", 0, s, rank, cols, dtype))
    ck.check(f"pingpong: B after {total} chained async calls", why is None, why or "")


# -- 11: bounds and agreement -----------------------------------------------------------------


def raw_alltoall(inp_pieces, out_pieces, dtype_code):
    """Posts an all_to_all descriptor as given (past the Python checks) and waits."""
    pg = gosym.group()
    ia, oa = array("Q", inp_pieces), array("Q", out_pieces)
    world = len(inp_pieces) // 2
    desc = _lib.pack_desc(_lib.OP_ALLTOALL, dtype_code, 0, 1.0, 0, 0, 0, 0, 0, 0,
                          ia.buffer_info()[0], oa.buffer_info()[0], world, world)
    h = _lib.post(pg._h, desc)
    try:
        _lib.check(_lib.work_wait(h, -1))
    finally:
        _lib.work_release(h)


def expect_error(ck, case, fn, words, untouched):
    """A ValueError naming every word, before any data moved; its text goes to the report."""
    e = expect_raise(ck, case, (ValueError,), fn, *words, untouched=untouched)
    ck.info.setdefault("errors", {})[case] = str(e)


def bounds(ck, rank, world):
    rows = 100 * world
    inp, out = gosym.empty(rows), gosym.empty(rows)
    inp.copy_(torch.arange(rows, dtype=torch.float32) + 1000 * rank)
    poison_(out)
    even = [100] * world
    a2a = lambda o, i: (lambda: dist.all_to_all_single(out, inp, o, i))  # noqa: E731
    c0 = bind_counters()
    for name, o, i, words in (
        ("input splits sum to less than dim 0", even, [100] * (world - 1) + [99], ["input", str(rows)]),
        ("output splits sum to more than dim 0", [100] * (world - 1) + [101], even, ["output", str(rows)]),
        ("negative split", even, [-1, 201] + [100] * (world - 2), ["input", "-1"]),
        ("one split per rank", even, [rows], ["1 input splits", str(world)]),
        ("byte extent beyond int64", [2**62] * world, even, ["output"]),
    ):
        expect_error(ck, f"bounds: {name}", a2a(o, i), words, [inp, out])
    big = a2a(even, [2**63] + [0] * (world - 1))
    if type(dist.group.WORLD) is dist.ProcessGroup:
        # torch's C++ group (gosym._c10d's backend): torch's binding refuses a split beyond
        # int64 before any backend sees it, as it does for NCCL's
        expect_raise(ck, "bounds: splits beyond int64", (TypeError,), big, "incompatible",
                     untouched=[inp, out])
    else:
        expect_error(ck, "bounds: splits beyond int64", big, ["input"], [inp, out])
    ck.check("bounds: local errors bound nothing", bind_counters() == c0, f"{c0} -> {bind_counters()}")
    f32 = _lib.DTYPE_FLOAT32
    base = inp.data_ptr()
    ok_in = [v for r in range(world) for v in (base + 400 * r, 100)]
    ok_out = [v for r in range(world) for v in (out.data_ptr() + 400 * r, 100)]
    huge = [base, 2**61] + ok_in[2:]
    expect_error(ck, "bounds (engine): piece bytes overflow int64", lambda: raw_alltoall(huge, ok_out, f32),
                 ["piece 0", "overflows"], [inp, out])
    beyond = [base, 2**62 + 1] + ok_in[2:]
    expect_error(ck, "bounds (engine): piece count beyond the ABI limit", lambda: raw_alltoall(beyond, ok_out, f32),
                 ["piece 0", str(2**62 + 1)], [inp, out])

    # Rank 0 sends 20011 elements to rank 1, which expects 20017 from it: every rank
    # learns it after the first barrier (the agreement check), and nobody hangs.
    send = [[16384] * world for _ in range(world)]
    send[0][1] = 20011
    recv = [[send[i][j] for i in range(world)] for j in range(world)]  # recv[j][i]: j expects from i
    recv[1][0] = 20017
    for label, alloc in (("gosym.empty", gosym.empty), ("ordinary", torch.empty)):
        i_t, o_t = alloc(sum(send[rank])), poison_(alloc(sum(recv[rank])))
        i_t.fill_(rank)
        expect_error(ck, f"mismatch [{label}]",
                     lambda: dist.all_to_all_single(o_t, i_t, recv[rank], send[rank]),
                     ["rank 0", "20011", "rank 1", "20017"], [o_t])
    # The group is still usable, on the same buffers.
    run(ck, "after the errors", 0, [even] * world, rank, inp, out, 1)


def main():
    args = wc.setup(lambda p: p.add_argument("--parts", default="splits,realloc,deep_queue,bounds"))
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    parts = {"splits": splits, "realloc": realloc, "deep_queue": deep_queue, "bounds": bounds}
    timings = {}
    for name in args.parts.split(","):
        t0 = time.monotonic()
        ck.run(name, parts[name], ck, rank, world)
        timings[name] = round(time.monotonic() - t0, 2)
        dist.barrier()
    ck.info["timings"] = timings
    ck.info["direct_min"] = gosym.stats()["direct_min"]
    ck.info["sync_slots"] = gosym.stats()["sync_slots"]
    wc.print_summary(ck, "alltoall_direct")
    wc.write_result(ck.result())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
