"""Memory registration: export/import between processes, lazy binding of
gosym.empty buffers by groups, zero-copy results, GOSYM_ENABLE_UBR, and the
lifetime of bindings across group and buffer teardown.

``--parts`` picks what one launch runs (several per launch keep the suite
fast); the environment (GOSYM_DIRECT_MIN, GOSYM_ENABLE_UBR) is the launch's,
because the engine reads it when the library loads. Every part records its
checks in one Checker; parts that need the engine's view of a peer exchange
it through collectives on ordinary tensors, which never bind.
"""

from __future__ import annotations

import gc
import os
import random
import time

import torch
import torch.distributed as dist
import wcommon as wc
from wcommon import LARGE, bind_counters, check_delta, expect_raise, poison_

import gosym
from gosym import _lib
from gosym._dtypes import reduce_dtype
from gosym.memory import tensor_from

# Bytes a buffer must have to be read in place at the default GOSYM_DIRECT_MIN.
DIRECT_DEFAULT = 64 * 1024
MEM_KEYS = ("handles", "endpoints", "mem_live", "mem_regions", "mem_bindings", "memfds", "regions")
# Errors a bad blob may legitimately end in once it parses (refused, unreachable, not shareable).
IMPORT_ERRORS = (ValueError, NotImplementedError, RuntimeError)


def pstats() -> dict:
    return gosym.process_stats()


def same_resources(ck, case, base, now):
    for k in MEM_KEYS:
        ck.check(f"{case}: {k} back to baseline", now[k] == base[k], f"{k}: {base[k]} -> {now[k]}")


# -- 1, 2: export, pack, import in another process; bad blobs ------------------------


def share(ck, rank, world):
    """Rank 0 exports gosym.empty memory, rank 1 imports it and both see each other's writes."""
    if world < 2:
        return
    base = pstats()
    n = 1 << 14
    pat1 = torch.arange(n, dtype=torch.float32)
    pat2 = -torch.arange(n, dtype=torch.float32) - 0.5
    E = h = sub = None
    msg = [None]
    if rank == 0:
        E = gosym.empty(n)
        E.zero_()
        h = gosym.mem_map(E)
        info = h.info()
        ck.check("export info", info["mode"] == "export" and info["shareable"] is True
                 and info["address"] == E.data_ptr() and info["length"] == E.nbytes
                 and info["local_address"] == E.data_ptr(), repr(info))
        sub = gosym.mem_map(E[100:])  # a registration at an offset into the region
        P = torch.zeros(4096)
        hp = gosym.mem_map(P)
        ck.check("private mem_map is not shareable", hp.info()["shareable"] is False, repr(hp.info()))
        priv = {}
        try:
            priv["blob"] = hp.pack()
        except IMPORT_ERRORS as e:
            priv["pack_error"] = wc.error_text(e)
            ck.check("private pack error names shareability", "shareable" in str(e).lower(), wc.error_text(e))
        hp.unmap()
        gone = gosym.mem_map(E[:1000])
        gone_blob = gone.pack()
        gone.unmap()  # its blob must now be refused
        msg = [{"blob": h.pack(), "addr": info["address"], "len": info["length"],
                "sub": sub.pack(), "sub_addr": sub.info()["address"], "priv": priv, "gone": gone_blob}]
    dist.broadcast_object_list(msg, src=0)
    p = msg[0]
    refusals = pstats()["mem_refusals"]  # before rank 1 tries the refused blobs
    ck.check("pack() gives bytes", isinstance(p["blob"], bytes) and len(p["blob"]) > 32, repr(type(p["blob"])))

    m = T = None
    if rank == 1:
        m = gosym.mem_import(p["blob"])
        info = m.info()
        ck.check("import info keeps the exporter's address and length",
                 info["mode"] == "import" and info["address"] == p["addr"] and info["length"] == p["len"]
                 and info["local_address"] != 0 and info["local_length"] == p["len"], repr(info))
        ck.info["import_info"] = info
        T = tensor_from(m, (n,), torch.float32)
        ck.check("tensor_from uses local_address", T.data_ptr() == info["local_address"],
                 f"{T.data_ptr():#x} vs {info['local_address']:#x}")
        T.copy_(pat1)
    dist.barrier()
    if rank == 0:
        why = wc.compare(E, pat1)
        ck.check("exporter sees the importer's writes", why is None, why or "")
        E.copy_(pat2)
    dist.barrier()
    if rank == 1:
        why = wc.compare(T, pat2)
        ck.check("importer sees the exporter's writes", why is None, why or "")
        ms = gosym.mem_import(bytearray(p["sub"]))
        si = ms.info()
        ck.check("sub-range import info", si["address"] == p["sub_addr"] and si["length"] == (n - 100) * 4,
                 repr(si))
        why = wc.compare(tensor_from(ms, (n - 100,), torch.float32), pat2[100:])
        ck.check("sub-range import sees the data at its offset", why is None, why or "")
        ms.unmap()
        if "blob" in p["priv"]:
            expect_raise(ck, "import of a private registration", IMPORT_ERRORS,
                         lambda: gosym.mem_import(p["priv"]["blob"]), "shareable")
        ck.info["private"] = p["priv"]
        expect_raise(ck, "import of an unmapped export is refused", IMPORT_ERRORS,
                     lambda: gosym.mem_import(p["gone"], timeout=5), "refused")
        bad = bytearray(p["blob"])
        bad[32 + 12] ^= 0xFF  # first byte of the memfd entry's secret
        expect_raise(ck, "import with a wrong secret is refused", IMPORT_ERRORS,
                     lambda: gosym.mem_import(bytes(bad), timeout=5), "refused")
    dist.barrier()
    if rank == 0:
        got = pstats()["mem_refusals"] - refusals
        ck.check("exporter counted both refusals", got == 2, f"mem_refusals grew by {got}")
        # The importer's mapping outlives the exporter's registration and buffer.
        h.unmap()
        h.unmap()  # idempotent
        gosym.mem_unmap(h)
        sub.unmap()
        del E
        gc.collect()
    dist.barrier()
    if rank == 1:
        why = wc.compare(T, pat2)
        ck.check("import survives the exporter's unmap and free", why is None, why or "")
        del T
        gc.collect()
        ck.check("the last tensor_from tensor dying unmaps the import", m.unmapped, repr(m))
        m.unmap()
        gosym.mem_unmap(m)
    if rank in (0, 1):
        dead = h if rank == 0 else m
        for what, fn in (("info", dead.info), ("pack", dead.pack), ("handle", lambda: dead.handle)):
            expect_raise(ck, f"unmapped handle .{what}()", (ValueError,), fn, "unmapped")
        expect_raise(ck, "tensor_from of an unmapped handle", (ValueError,),
                     lambda: tensor_from(dead, (4,), torch.float32))
    expect_raise(ck, "mem_map of 0 bytes", (ValueError,), lambda: gosym.mem_map(torch.empty(0)), "0 bytes")
    expect_raise(ck, "mem_map(address) without nbytes", (TypeError,), lambda: gosym.mem_map(4096), "nbytes")
    if rank == 0:
        big = gosym.empty(16)
        hb = gosym.mem_map(big)
        expect_raise(ck, "tensor_from larger than the handle", (ValueError,),
                     lambda: tensor_from(hb, (17,), torch.float32), "do not fit")
        hb.unmap()
        del big
    for bad_arg in ("x", None, 17):
        expect_raise(ck, f"mem_unmap({bad_arg!r})", (TypeError,), lambda a=bad_arg: gosym.mem_unmap(a))
    gc.collect()
    dist.barrier()
    same_resources(ck, "share", base, pstats())


def bad_blobs(ck, rank):
    """Malformed blobs are ValueError (INVALID_ARG) with a reason, never a crash or a hang."""
    base = pstats()
    E = gosym.empty(1024)
    h = gosym.mem_map(E)
    blob = h.pack()
    cases = {
        "empty": (b"", "empty"),
        "1 byte": (blob[:1], "truncated"),
        "header minus one": (blob[:31], "truncated"),
        "half an entry header": (blob[:38], "truncated"),
        "entry cut short": (blob[:-1], "remain"),
        "wrong magic": (b"XXXX" + blob[4:], "magic"),
        "future version": (blob[:4] + b"\x02\x00" + blob[6:], "version"),
        "unknown flags": (blob[:6] + b"\x01\x00" + blob[8:], "flags"),
        "zero length": (blob[:24] + bytes(8) + blob[32:], "zero length"),
        "oversized": (blob + bytes(70000), "exceeds"),
        "over the ABI limit": (bytes(1 << 20 | 1), "bad blob"),
    }
    for name, (b, word) in cases.items():
        expect_raise(ck, f"bad blob: {name}", (ValueError,), lambda b=b: gosym.mem_import(b, timeout=2), word)
    rng = random.Random(wc.seed_of("blobs", rank))
    for i in range(200):
        b = rng.randbytes(rng.randrange(1, 300))
        expect_raise(ck, f"random blob #{i} ({len(b)} bytes)", (ValueError,),
                     lambda b=b: gosym.mem_import(b, timeout=2), "bad packed memh")
    # A valid header with a random tail: may get past the header, still never crashes.
    for i in range(100):
        b = blob[:8] + rng.randbytes(rng.randrange(0, 120))
        expect_raise(ck, f"random tail #{i}", IMPORT_ERRORS, lambda b=b: gosym.mem_import(b, timeout=2))
    # Every byte of a valid blob flipped in turn: an error (refused, unreachable,
    # malformed) or, where only the recorded address changed, a working import.
    outcomes = {}
    for i in range(len(blob)):
        b = bytearray(blob)
        b[i] ^= 0xFF
        try:
            got = gosym.mem_import(bytes(b), timeout=2)
        except IMPORT_ERRORS as e:
            outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
            ck.check(f"flipped byte {i}: reason given", len(str(e)) >= 8, wc.error_text(e))
        except Exception as e:  # noqa: BLE001
            ck.fail(f"flipped byte {i}", f"unexpected {wc.error_text(e)}")
        else:
            outcomes["imported"] = outcomes.get("imported", 0) + 1
            got.unmap()
    ck.info["flipped_byte_outcomes"] = outcomes
    expect_raise(ck, "mem_import(str)", (TypeError,), lambda: gosym.mem_import("GSMH"))
    h.unmap()
    del E
    gc.collect()
    same_resources(ck, "bad_blobs", base, pstats())


# -- 3: lazy registration ---------------------------------------------------------------


def float_ref(xs):
    """float64 sum of float32 inputs in rank order, and a tolerance for a float32 fold."""
    acc = torch.zeros(xs[0].shape, dtype=torch.float64)
    mag = torch.zeros_like(acc)
    for x in xs:
        acc += x.double()
        mag += x.double().abs()
    return acc, mag * (len(xs) * 2.0**-23) + 1e-30


def check_sum(ck, case, got, xs, ordinary=None):
    """got == the ordinary-tensor result bitwise, and == the float64 sum within rounding."""
    if ordinary is not None:
        why = wc.compare(got, ordinary)
        ck.check(f"{case}: same bits as on ordinary tensors", why is None, why or "")
    ref, tol = float_ref(xs)
    why = wc.compare(got.double(), ref, tol)
    ck.check(f"{case}: float64 reference", why is None, why or "")
    if len(xs) == 2:  # one rounding of an exact sum: bitwise
        why = wc.compare(got, ref.float())
        ck.check(f"{case}: bitwise float64 reference (2 ranks)", why is None, why or "")


def lazy(ck, rank, world):
    dmin = gosym.stats()["direct_min"]
    ck.info["direct_min"] = dmin
    n = 1 << 16  # 256 KiB of float32
    xs = [wc.make_input("lazy1", r, n, torch.float32) for r in range(world)]
    X = gosym.empty(n)
    X.copy_(xs[rank])
    Y = xs[rank].clone()
    base_bind = pstats()["mem_bindings"]

    c0 = bind_counters()
    dist.all_reduce(X)
    c1 = bind_counters()
    check_delta(ck, "first all_reduce binds", c0, c1, bindings_created=1, bindings_reused=0,
                peer_map_misses=world - 1, peer_map_hits=">0")
    dist.all_reduce(Y)
    check_delta(ck, "ordinary tensor never binds", c1, bind_counters(), bindings_created=0,
                bindings_reused=0, peer_map_misses=0, peer_map_hits=0)
    check_sum(ck, "first all_reduce", X, xs, Y)

    xs = [wc.make_input("lazy2", r, n, torch.float32) for r in range(world)]
    X.copy_(xs[rank])
    Y.copy_(xs[rank])
    c2 = bind_counters()
    dist.all_reduce(X)
    check_delta(ck, "second all_reduce reuses", c2, bind_counters(), bindings_created=0,
                bindings_reused=1, peer_map_misses=0, peer_maps=0, peer_map_hits=">0")
    dist.all_reduce(Y)
    check_sum(ck, "second all_reduce", X, xs, Y)

    # A second group binds the same buffer on its own.
    g2 = dist.new_group(list(range(world)))
    xs = [wc.make_input("lazy3", r, n, torch.float32) for r in range(world)]
    X.copy_(xs[rank])
    Y.copy_(xs[rank])
    c3, g0 = bind_counters(), bind_counters(g2)
    dist.all_reduce(X, group=g2)
    check_delta(ck, "second group binds its own", g0, bind_counters(g2), bindings_created=1,
                peer_map_misses=world - 1)
    check_delta(ck, "second group leaves the default group alone", c3, bind_counters(),
                bindings_created=0, bindings_reused=0, peer_map_misses=0)
    ck.check("one binding per group", pstats()["mem_bindings"] == base_bind + 2,
             f"mem_bindings {pstats()['mem_bindings']}, want {base_bind + 2}")
    dist.all_reduce(Y, group=g2)
    check_sum(ck, "all_reduce on the second group", X, xs, Y)

    # A view at an offset uses the enclosing region: no new binding, no new mapping.
    off, m = 1000, 20000
    xs = [wc.make_input("lazy4", r, m, torch.float32) for r in range(world)]
    X.fill_(7.0)
    V = X[off:off + m]
    V.copy_(xs[rank])
    c4 = bind_counters()
    dist.all_reduce(V)
    check_delta(ck, "sub-range reuses the region", c4, bind_counters(), bindings_created=0,
                bindings_reused=1, peer_map_misses=0, peer_map_hits=">0")
    check_sum(ck, "sub-range all_reduce", V, xs)
    rest = torch.cat([X[:off], X[off + m:]])
    ck.check("sub-range all_reduce leaves the rest alone", bool((rest == 7.0).all()), "bytes outside the view changed")

    # Views at unaligned byte offsets, read in place, give the ordinary tensors' bits.
    B = gosym.empty(1 << 18, dtype=torch.uint8)
    for dtype, off in ((torch.float32, 4), (torch.bfloat16, 2), (torch.uint8, 3), (torch.float64, 8)):
        es = torch.empty((), dtype=dtype).element_size()
        k = (DIRECT_DEFAULT + 4096) // es
        vals = [wc.make_input(f"lazy-unaligned-{wc.dname(dtype)}", r, k, dtype) for r in range(world)]
        view = B[off:off + k * es].view(dtype)
        view.copy_(vals[rank])
        plain = vals[rank].clone()
        c6 = bind_counters()
        dist.all_reduce(view)
        dist.all_reduce(plain)
        check_delta(ck, f"unaligned {wc.dname(dtype)} view at +{off} bytes", c6, bind_counters(),
                    peer_map_hits=">0")
        why = wc.compare(view, plain)
        ck.check(f"unaligned {wc.dname(dtype)} view at +{off} bytes: same bits as ordinary", why is None, why or "")
    del B, view
    # A non-contiguous view goes through a contiguous copy: private, so staged.
    xs = [wc.make_input("lazy-transposed", r, n, torch.float32) for r in range(world)]
    X.copy_(xs[rank])
    c7 = bind_counters()
    dist.all_reduce(X.view(256, 256).t())
    check_delta(ck, "non-contiguous view is staged", c7, bind_counters(), bindings_created=0, bindings_reused=0,
                peer_map_hits=0)
    check_sum(ck, "non-contiguous view", X, xs)

    # Small buffers: bound only when GOSYM_DIRECT_MIN allows.
    smalls = ((1, torch.float32), (100, torch.float32), (1, torch.int64), (DIRECT_DEFAULT // 4 - 1, torch.float32))
    for k, dtype in smalls:
        S = gosym.empty(k, dtype=dtype)
        vals = [wc.make_input(f"lazy-small{k}", r, k, dtype) for r in range(world)]
        S.copy_(vals[rank])
        c5 = bind_counters()
        dist.all_reduce(S)
        binds = int(k * S.element_size() >= dmin)
        check_delta(ck, f"{k} x {wc.dname(dtype)} (direct_min {dmin})", c5, bind_counters(),
                    bindings_created=binds)
        if dtype == torch.int64:
            exp = vals[0].clone()
            for v in vals[1:]:
                exp += v
            why = wc.compare(S, exp)
            ck.check(f"small int64 all_reduce k={k}", why is None, why or "")
        else:
            check_sum(ck, f"small all_reduce k={k}", S, vals)
    del S
    gc.collect()
    dist.destroy_process_group(g2)
    ck.check("destroying a group drops its binding", pstats()["mem_bindings"] == base_bind + 1,
             f"mem_bindings {pstats()['mem_bindings']}, want {base_bind + 1}")


# -- 5: GOSYM_ENABLE_UBR ---------------------------------------------------------------------


def ubr(ck, rank, world):
    mode = os.environ.get("GOSYM_ENABLE_UBR", "")
    mode = mode if mode in ("yes", "no") else "try"  # as the engine reads it
    ck.info["ubr_mode"] = mode
    n = 1 << 15
    base_bind = pstats()["mem_bindings"]
    xs = [wc.make_input("ubr-private", r, n, torch.float32) for r in range(world)]
    P = xs[rank].clone()
    hp = gosym.mem_map(P)
    c0 = bind_counters()
    if mode == "yes":
        expect_raise(ck, "UBR=yes: private registered buffer", (ValueError,), lambda: dist.all_reduce(P),
                     "GOSYM_ENABLE_UBR", untouched=[P])
        U = xs[rank].clone()  # unregistered memory is not refused
        dist.all_reduce(U)
        check_sum(ck, "UBR=yes: unregistered tensor", U, xs)
    else:
        dist.all_reduce(P)
        check_sum(ck, f"UBR={mode}: private registered buffer via staging", P, xs)
    check_delta(ck, f"UBR={mode}: private buffer never binds", c0, bind_counters(), bindings_created=0)
    hp.unmap()

    xs = [wc.make_input("ubr-shared", r, n, torch.float32) for r in range(world)]
    X = gosym.empty(n)
    X.copy_(xs[rank])
    c1 = bind_counters()
    dist.all_reduce(X)
    check_sum(ck, f"UBR={mode}: gosym.empty", X, xs)
    want = 0 if mode == "no" else 1
    check_delta(ck, f"UBR={mode}: gosym.empty binding", c1, bind_counters(), bindings_created=want)
    ck.check(f"UBR={mode}: process bindings", pstats()["mem_bindings"] == base_bind + want,
             f"mem_bindings {pstats()['mem_bindings']}, want {base_bind + want}")


# -- 6: group create/use/destroy cycles ------------------------------------------------------


def cycles(ck, rank, world, count):
    n = 1 << 15
    X = gosym.empty(n)
    X.fill_(1.0)
    dist.all_reduce(X)  # bound on the default group, for the whole loop
    gc.collect()
    base, fds, rss = pstats(), wc.fd_count(), wc.rss_bytes()
    want_sum = world * (world - 1) / 2
    bad_bind, bad_val = [], []
    t0 = time.monotonic()
    for c in range(count):
        g = dist.new_group(list(range(world)))
        X.fill_(float(rank + c % 5))
        dist.all_reduce(X, group=g)
        if not (X[0] == want_sum + world * (c % 5) and X[-1] == X[0]):
            bad_val.append((c, X[0].item()))
        dist.destroy_process_group(g)
        b = pstats()["mem_bindings"]
        if b != base["mem_bindings"]:
            bad_bind.append((c, b))
    took = time.monotonic() - t0
    gc.collect()
    now, nfds, nrss = pstats(), wc.fd_count(), wc.rss_bytes()
    ck.info["cycles"] = {"count": count, "per_cycle_ms": round(1000 * took / count, 2),
                         "fds": [fds, nfds], "rss_mb": [rss >> 20, nrss >> 20], "stats": [base, now]}
    ck.check("cycles: results", not bad_val, f"wrong sums in cycles {bad_val[:5]}")
    ck.check("cycles: mem_bindings back to the pre-loop value after every destroy", not bad_bind,
             f"pre-loop {base['mem_bindings']}, then {bad_bind[:5]}")
    same_resources(ck, "cycles", base, now)
    ck.check("cycles: fds flat", nfds <= fds + 2, f"{fds} -> {nfds}")
    ck.check("cycles: RSS flat", nrss <= rss + (50 << 20), f"{rss >> 20} MiB -> {nrss >> 20} MiB")


# -- 7: teardown in both orders --------------------------------------------------------------


def teardown(ck, rank, world):
    n = 1 << 15
    gc.collect()
    base, fds = pstats(), wc.fd_count()
    for c in range(20):
        unmap_first = c % 2 == 0
        case = f"teardown#{c} ({'unmap, destroy' if unmap_first else 'destroy, unmap'})"
        g = dist.new_group(list(range(world)))
        X = gosym.empty(n)
        X.fill_(rank + 1.0)
        P = torch.full((n,), rank + 1.0)
        hp = gosym.mem_map(P)
        dist.all_reduce(X, group=g)
        dist.all_reduce(P, group=g)
        ok = bool((X == world * (world + 1) / 2).all() and (P == X).all())
        ck.check(f"{case}: results", ok, f"X[0]={X[0].item()} P[0]={P[0].item()}")
        ck.check(f"{case}: bound", pstats()["mem_bindings"] == base["mem_bindings"] + 1, repr(pstats()))
        if unmap_first:
            rel = bind_counters(g)["bindings_released"]
            del X
            gc.collect()
            hp.unmap()
            ck.check(f"{case}: freeing the buffer releases its binding",
                     bind_counters(g)["bindings_released"] == rel + 1
                     and pstats()["mem_bindings"] == base["mem_bindings"], repr(bind_counters(g)))
            dist.destroy_process_group(g)
        else:
            dist.destroy_process_group(g)
            ck.check(f"{case}: destroying the group releases the binding",
                     pstats()["mem_bindings"] == base["mem_bindings"], repr(pstats()))
            del X
            gc.collect()
            gosym.mem_unmap(hp)
        del P
    gc.collect()
    now = pstats()
    ck.info["teardown"] = {"fds": [fds, wc.fd_count()], "stats": [base, now]}
    same_resources(ck, "teardown", base, now)
    ck.check("teardown: fds back to baseline", wc.fd_count() <= fds, f"{fds} -> {wc.fd_count()}")


# -- 4: zero-copy results across ops -----------------------------------------------------------

MX_OPS = ("all_reduce", "all_reduce_oop", "reduce", "broadcast", "all_gather_into_tensor",
          "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter")
PIECE_OPS = {"reduce_scatter_tensor", "all_to_all_single", "scatter"}  # input: one piece per rank
MX_DTYPES = (torch.float32, torch.bfloat16, torch.int64)
MX_SIZES = (1, 1025, LARGE)


def all_reduce_out_of_place(inp, out, group=None):
    """all_reduce SUM with in != out. torch's API is in-place only; the engine's
    descriptor takes both addresses (cabi/gosym.h), so post it directly."""
    pg = gosym.group(group)
    desc = _lib.pack_desc(_lib.OP_ALLREDUCE, reduce_dtype(inp), _lib.RED["SUM"], 1.0, 0, 0, 0,
                          inp.numel(), inp.data_ptr(), out.data_ptr(), 0, 0, 0, 0)
    h = _lib.post(pg._h, desc)
    try:
        _lib.check(_lib.work_wait(h, -1))
    finally:
        _lib.work_release(h)


class Pieces:
    """Rank r's input piece p of n elements, made on demand (any rank can rebuild any)."""

    def __init__(self, dtype, n, world):
        self.dtype, self.n, self.world, self.cache = dtype, n, world, {}

    def get(self, r, p):
        if (r, p) not in self.cache:
            self.cache[(r, p)] = wc.make_input(f"mx/{wc.dname(self.dtype)}/{self.n}/{p}", r, self.n, self.dtype)
        return self.cache[(r, p)]

    def input(self, op, r):
        if op in PIECE_OPS:
            return torch.cat([self.get(r, p) for p in range(self.world)])
        return self.get(r, 0)

    def sum(self, xs):
        """Reference sum and tolerance: exact for int64 (wrapping) and bfloat16 (make_input
        keeps sums exact in fp32, rounded once), float64 within rounding for float32."""
        if self.dtype == torch.float32:
            ref, tol = float_ref(xs)
            return ref.float(), tol + ref.abs() * 2.0**-24
        if self.dtype == torch.int64:
            acc = xs[0].clone()
            for x in xs[1:]:
                acc += x
            return acc, None
        return sum(x.double() for x in xs).to(self.dtype), None


def mx_expected(op, P, rank, world, root):
    """(expected result on this rank or None, tol)."""
    cat = lambda ts: (torch.cat(ts), None)  # noqa: E731
    if op in ("all_reduce", "all_reduce_oop") or (op == "reduce" and rank == root):
        return P.sum([P.get(r, 0) for r in range(world)])
    if op == "reduce_scatter_tensor":
        return P.sum([P.get(r, rank) for r in range(world)])
    if op == "broadcast":
        return P.get(root, 0), None
    if op == "all_gather_into_tensor" or (op == "gather" and rank == root):
        return cat([P.get(r, 0) for r in range(world)])
    if op == "all_to_all_single":
        return cat([P.get(r, rank) for r in range(world)])
    if op == "scatter":
        return P.get(root, rank), None
    return None, None


def mx_run(op, mine, n, alloc, rank, world, root):
    """Runs op with buffers from alloc; returns this rank's result (None where it has none)."""
    inp = alloc(mine.numel(), dtype=mine.dtype)
    inp.copy_(mine)

    def out(k):
        return poison_(alloc(k, dtype=mine.dtype))

    if op == "all_reduce":
        dist.all_reduce(inp)
        return inp
    if op == "all_reduce_oop":
        o = out(n)
        all_reduce_out_of_place(inp, o)
        if not torch.equal(inp, mine):
            raise AssertionError("out-of-place all_reduce changed its input")
        return o
    if op == "reduce":
        dist.reduce(inp, dst=root)
        return inp if rank == root else None
    if op == "broadcast":
        if rank != root:
            poison_(inp)
        dist.broadcast(inp, src=root)
        return inp
    if op == "all_gather_into_tensor":
        o = out(world * n)
        dist.all_gather_into_tensor(o, inp)
        return o
    if op == "reduce_scatter_tensor":
        o = out(n)
        dist.reduce_scatter_tensor(o, inp)
        return o
    if op == "all_to_all_single":
        o = out(world * n)
        dist.all_to_all_single(o, inp)
        return o
    if op == "gather":
        o = out(world * n) if rank == root else None
        dist.gather(inp, list(o.split(n)) if o is not None else None, dst=root)
        return o
    if op == "scatter":
        o = out(n)
        dist.scatter(o, list(inp.split(n)) if rank == root else None, src=root)
        return o
    raise ValueError(op)


def matrix(ck, rank, world):
    """Every op on gosym.empty buffers (read in place) and on ordinary tensors (staged):
    the same bits, and the reference."""
    dmin = gosym.stats()["direct_min"]
    ck.info["direct_min"] = dmin
    hits, names = [], []
    for n in MX_SIZES:
        for dtype in MX_DTYPES:
            P = Pieces(dtype, n, world)
            for op in MX_OPS:
                case = f"{op}/{wc.dname(dtype)}/n={n}"
                root = wc.seed_of(op, n) % world
                mine = P.input(op, rank)
                exp, tol = mx_expected(op, P, rank, world, root)
                c0 = bind_counters()
                zc = ck.run(case + " [gosym.empty]", mx_run, op, mine, n, gosym.empty, rank, world, root)
                hits.append(bind_counters()["peer_map_hits"] - c0["peer_map_hits"])
                names.append(case)
                plain = ck.run(case + " [ordinary]", mx_run, op, mine, n, torch.empty, rank, world, root)
                # Even ranks shareable, odd ones not: staged after all, or read in part in place.
                mixed = ck.run(case + " [mixed]", mx_run, op, mine, n, gosym.empty if rank % 2 == 0 else torch.empty,
                               rank, world, root)
                if exp is None:
                    continue
                for label, got in (("gosym.empty", zc), ("ordinary", plain), ("mixed", mixed)):
                    if got is not None:
                        why = wc.compare(got, exp, tol)
                        ck.check(f"{case} [{label}] vs reference", why is None, why or "")
                        if plain is not None and label != "ordinary":
                            why = wc.compare(got, plain)
                            ck.check(f"{case}: {label} and ordinary give the same bits", why is None, why or "")
                del zc, plain, mixed
            del P
            gc.collect()
    # Some rank must have read a peer's buffer in place in every zero-copy case
    # (needs GOSYM_DIRECT_MIN at most the smallest buffer).
    total = torch.tensor(hits, dtype=torch.int64)
    dist.all_reduce(total)
    if dmin <= 2:
        staged = [c for c, h in zip(names, total.tolist()) if h <= 0]
        ck.check("every gosym.empty case was read in place", not staged, f"staged: {staged}")
    ck.info["matrix_cases"] = len(names)


def chain(ck, rank, world, depth=16, sleeper=1):
    """Back-to-back async in-place ops on one gosym.empty buffer (several staging
    rounds long), one rank waiting late: each op must see the previous one's result."""
    n = 1 << 20
    X = gosym.empty(n, dtype=torch.int64)
    X.copy_(torch.arange(n) * (rank + 1) + rank)
    vals = [torch.arange(n) * (r + 1) + r for r in range(world)]
    c0 = bind_counters()
    works = []
    for k in range(depth):
        if k % 4 == 3:
            src = k % world
            works.append(dist.broadcast(X, src=src, async_op=True))
            vals = [vals[src]] * world
        else:
            works.append(dist.all_reduce(X, async_op=True))
            total = vals[0].clone()
            for v in vals[1:]:
                total += v
            vals = [total] * world
    if rank == sleeper:
        time.sleep(0.05)
    for w in works:
        w.wait()
    why = wc.compare(X, vals[rank])
    ck.check(f"chain of {depth} async in-place ops", why is None, why or "")
    check_delta(ck, "chain: bound once", c0, bind_counters(), bindings_created=1, peer_map_misses=world - 1,
                peer_map_hits=">0")


def main():
    args = wc.setup(lambda p: (p.add_argument("--parts", required=True),
                               p.add_argument("--cycles", type=int, default=1000)))
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    timings = {}
    for part in args.parts.split(","):
        t0 = time.monotonic()
        if part == "share":
            ck.run("share", share, ck, rank, world)
        elif part == "bad_blobs":
            ck.run("bad_blobs", bad_blobs, ck, rank)
        elif part == "lazy":
            ck.run("lazy", lazy, ck, rank, world)
        elif part == "ubr":
            ck.run("ubr", ubr, ck, rank, world)
        elif part == "cycles":
            ck.run("cycles", cycles, ck, rank, world, args.cycles)
        elif part == "teardown":
            ck.run("teardown", teardown, ck, rank, world)
        elif part == "chain":
            ck.run("chain", chain, ck, rank, world)
        elif part == "matrix":
            ck.run("matrix", matrix, ck, rank, world)
        else:
            raise SystemExit(f"unknown part {part}")
        timings[part] = round(time.monotonic() - t0, 2)
        dist.barrier()
    ck.info["timings"] = timings
    wc.print_summary(ck, f"registration {args.parts}")
    wc.write_result(ck.result())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
