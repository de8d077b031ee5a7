"""Registered CUDA memory on the CUDA data plane (test_cuda_reg.py), one rank per GPU.

Parts (each records itself in info["parts_done"] when it ran to its end):

- collectives: caching-allocator tensors mem_map'ed on every rank, in all_reduce,
  all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single and broadcast at
  1 KiB, 1 MiB + 3 elements and 8 MiB per rank, three times each on the same buffers with
  fresh inputs, against the float64 reference (gpuref's tolerance for sums of more than
  two ranks) and NCCL bitwise where NCCL gets the reference, outputs poisoned, replicated
  results' digests in info["digests"] (the test compares every rank's); from
  gosym.stats: sizes below GOSYM_GPU_REG_DIRECT_MIN never bind, larger ones bind each
  buffer on the first op (a miss per peer) and reuse it afterwards (hits, no new binding);
- realloc: unmap, free and reallocate at the same address (from the caching allocator's
  cache, and after giving the segment back to the driver), register again: right results,
  the peer dropped the old mapping, a new binding;
- import: each rank packs a registered tensor, the blobs go through all_gather_object, the
  peer imports them (mem_import on its current device), reads the exporter's data through
  tensor_from and writes a pattern the exporter then sees; unmaps in both orders;
- teardown: a subgroup binds a buffer, then (unmap, destroy) or (destroy, unmap);
- vmm: the same collectives on gosym.empty's VMM memory, mem_map'ed (bound to the group by
  sending its fd over the links); then gosym.empty tensors not mem_map'ed, which go direct
  from GOSYM_GPU_DIRECT_MIN through their implicit registration, and whose freeing makes the
  peers drop their mappings;
- comm_alloc: ProcessGroup.allocate_tensor's buffers (FSDP2's under
  set_allocate_memory_from_process_group_for_comm) in direct-size all_gathers, five rounds:
  bitwise equal to NCCL, the first binds its segment, from the third on a bound segment is
  read with no new binding;
- import_vmm: the import part on a mem_map'ed gosym.empty tensor (transport cudavmm: the
  allocation's fd comes from the exporter's fd server);
- errors: importing one's own blob, a blob naming a GPU nobody has, a truncated blob.
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist
import wcommon as wc
from cuda_worker import _input, _poison, _reference
from gpuref import compare_reduced

import gosym

REG_KEYS = ("gpu_bindings_created", "gpu_bindings_reused", "gpu_bindings_released", "gpu_peer_maps",
            "gpu_peer_map_hits", "gpu_peer_map_misses", "gpu_peer_map_dropped", "gpu_reg_direct_ops",
            "gpu_relay_ops")
# Elements per rank (float32): 1 KiB (below the registered threshold), 1 MiB + 3 elements
# (odd, above it), 8 MiB.
SIZES = [256, (1 << 18) + 3, 1 << 21]
REPS = 3


def reg_stats(group=None) -> dict:
    s = gosym.stats(group)
    return {k: int(s.get(k, 0)) for k in REG_KEYS}


def delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a}


def direct_reads(ck, case, name, rank, world, d) -> tuple[int, bool]:
    """(how many peers' buffers this rank's direct op read, whether it published its own) for
    the op whose stats delta is d. A broadcast reads the root's buffer only, and only the root
    publishes; relayed (gs_bcast_relay: world >= 3 and large, test_direct_path checks when),
    every rank publishes its buffer and maps every peer's, since each non-root also reads the
    others' outputs."""
    relayed = d["gpu_relay_ops"] == 1
    ck.check(f"{case}: only a broadcast of 3 or more ranks relays",
             not relayed or (name == "broadcast" and world >= 3), str(d))
    if name != "broadcast" or relayed:
        return world - 1, True
    return int(rank != 0), rank == 0


# op -> (input elements, output elements (0: in place), call(x, out, group)) for k per rank
OPS = {
    "all_reduce": (1, 0, lambda x, out, g: dist.all_reduce(x, group=g)),
    "all_gather": (1, "world", lambda x, out, g: dist.all_gather_into_tensor(out, x, group=g)),
    "reduce_scatter": ("world", 1, lambda x, out, g: dist.reduce_scatter_tensor(out, x, group=g)),
    "all_to_all": ("world", "world", lambda x, out, g: dist.all_to_all_single(out, x, group=g)),
    "broadcast": (1, 0, lambda x, out, g: dist.broadcast(x, src=0, group=g)),
}


def expected(name, ins, rank):
    """What op name (of OPS) leaves on rank, from every rank's input ins: (result, the
    comparison's extra arguments for gpuref.compare_reduced, None for data movement)."""
    world = len(ins)
    k = ins[0].numel() // world  # the all_to_all and reduce_scatter pieces
    mine = slice(rank * k, (rank + 1) * k)
    if name == "all_reduce":
        return _reference(ins, "SUM", world), {}
    if name == "reduce_scatter":
        return _reference(ins, "SUM", world)[mine], {"part": mine}
    if name == "all_gather":
        return torch.cat(ins), None
    if name == "all_to_all":
        return torch.cat([x[mine] for x in ins]), None
    return ins[0], None  # broadcast from rank 0


def against_nccl(ck, case, name, rank, x, out, call, nccl, counters):
    """One op on x (filled with fresh input; poisoned on broadcast's non-roots) and out
    (poisoned), then NCCL's on clones: the result against the reference built from every
    rank's input (gpuref's tolerance for sums), bitwise equal to NCCL's where NCCL gets the
    reference, the input untouched, replicated results' digests in info["digests"].
    Returns the delta of counters() around gosym's call."""
    dev = x.device
    world = dist.get_world_size()
    if name == "broadcast" and rank != 0:
        wc.poison_(x)
    else:
        x.copy_(_input(case, rank, x.numel(), torch.float32, "SUM", dev))
    if out is not None:
        out.copy_(_poison(out.numel(), torch.float32, dev))
    xr = x.clone()
    outr = _poison(out.numel(), torch.float32, dev) if out is not None else None
    before = counters()
    call(x, out, None)
    d = delta(before, counters())
    call(xr, outr, nccl)
    torch.cuda.synchronize()
    got, theirs = (x, xr) if out is None else (out, outr)
    ins = [_input(case, r, x.numel(), torch.float32, "SUM", dev) for r in range(world)]
    exp, reduced = expected(name, ins, rank)
    why = wc.compare(got, exp) if reduced is None else compare_reduced(got, exp, ins, "SUM", **reduced)
    ck.check(f"{case}: vs reference", why is None, why or "")
    if wc.compare(theirs, exp) is None:
        why = wc.compare(got, theirs)
        ck.check(f"{case}: bitwise vs NCCL", why is None, why or "")
    else:
        ck.info.setdefault("nccl_off_reference", []).append(case)
    if name != "all_to_all" and name != "reduce_scatter":  # the same result on every rank
        ck.info.setdefault("digests", {})[case] = wc.digest(got)
    if out is not None:
        why = wc.compare(x, xr)
        ck.check(f"{case}: input untouched", why is None, why or "")
    return d


def collectives(ck, rank, world, dev, nccl, alloc="torch"):
    """Every op on mem_map'ed buffers: the caching allocator's (alloc "torch") or
    gosym.empty's VMM memory ("gosym")."""
    reg_min = 1 << 20
    new = {"torch": torch.empty, "gosym": gosym.empty}[alloc]
    for name, (fin, fout, call) in OPS.items():
        nin = {1: 1, "world": world}[fin]
        nout = {0: 0, 1: 1, "world": world}[fout]
        for k in SIZES:
            case = f"{alloc}/{name}/{k}"
            x = new(nin * k, device=dev)
            h = gosym.mem_map(x)
            info = h.info()
            ck.check(f"{case}: registers shareable", info["shareable"], str(info))
            for rep in range(REPS):
                out = torch.empty(nout * k, device=dev) if nout else None
                d = against_nccl(ck, f"{case}/{rep}", name, rank, x, out, call, nccl, reg_stats)
                peers_read, binds_here = direct_reads(ck, f"{case}/{rep}", name, rank, world, d)
                if k * 4 < reg_min:
                    ck.check(f"{case}/{rep}: below the threshold nothing binds",
                             d["gpu_bindings_created"] == 0 and d["gpu_reg_direct_ops"] == 0, str(d))
                    continue
                ck.check(f"{case}/{rep}: ran on the registered buffers", d["gpu_reg_direct_ops"] == 1, str(d))
                if rep == 0:
                    ck.check(f"{case}/{rep}: first op binds", d["gpu_bindings_created"] == int(binds_here), str(d))
                    ck.check(f"{case}/{rep}: first op maps the peers",
                             d["gpu_peer_map_misses"] == peers_read, str(d))
                else:
                    ck.check(f"{case}/{rep}: no new binding", d["gpu_bindings_created"] == 0, str(d))
                    ck.check(f"{case}/{rep}: binding reused", d["gpu_bindings_reused"] == int(binds_here), str(d))
                    ck.check(f"{case}/{rep}: no new mapping", d["gpu_peer_map_misses"] == 0, str(d))
                    ck.check(f"{case}/{rep}: cache hits",
                             d["gpu_peer_map_hits"] == peers_read, str(d))
            h.unmap()
    ck.info["stats_after_collectives"] = reg_stats()


def realloc(ck, rank, world, dev):
    k = (1 << 18) + 3
    info = {}
    # A 16 MiB buffer has its own segment: its registered op carries the unmapped
    # buffer's retired id to the peers, and it stays allocated while empty_cache runs.
    z = torch.ones(1 << 22, device=dev)
    hz = gosym.mem_map(z)
    for how in ("cached", "driver"):
        x = torch.empty(k, device=dev)
        h = gosym.mem_map(x)
        for rep in range(2):
            x.copy_(_input(f"realloc/{how}/{rep}", rank, k, torch.float32, "SUM", dev))
            dist.all_reduce(x)
        torch.cuda.synchronize()
        addr = x.data_ptr()
        h.unmap()
        before = reg_stats()
        dist.all_reduce(z)
        d = delta(before, reg_stats())
        ck.check(f"realloc/{how}: the peers dropped the unmapped buffer's mapping",
                 d["gpu_peer_map_dropped"] == world - 1, str(d))
        torch.cuda.synchronize()
        del x
        if how == "driver":  # the segment goes back to the driver: a new allocation, a new handle
            torch.cuda.empty_cache()
        y = torch.empty(k, device=dev)
        info[how] = {"same_address": y.data_ptr() == addr}
        hy = gosym.mem_map(y)
        for rep in range(2):
            vals = [_input(f"realloc2/{how}/{rep}", r, k, torch.float32, "SUM", dev) for r in range(world)]
            y.copy_(vals[rank])
            before = reg_stats()
            dist.all_reduce(y)
            d = delta(before, reg_stats())
            why = compare_reduced(y, _reference(vals, "SUM", world), vals, "SUM")
            ck.check(f"realloc/{how}/{rep}: right result on the reallocated buffer", why is None, why or "")
            ck.check(f"realloc/{how}/{rep}: direct", d["gpu_reg_direct_ops"] == 1, str(d))
            if rep == 0:
                ck.check(f"realloc/{how}: a new binding, a new peer mapping",
                         d["gpu_bindings_created"] == 1 and d["gpu_peer_map_misses"] == world - 1, str(d))
        hy.unmap()
        del y
    hz.unmap()
    torch.cuda.synchronize()
    ck.info["realloc"] = info


def import_part(ck, rank, world, dev, alloc="torch"):
    """A packed CUDA memh imported by the peer: the caching allocator's memory (alloc
    "torch", legacy IPC) or gosym.empty's ("gosym", its fd from the exporter's server)."""
    n = 4099
    mine = {"torch": torch.empty, "gosym": gosym.empty}[alloc](n, device=dev)
    mine.copy_(_input("import/mine", rank, n, torch.float32, "SUM", dev))
    h = gosym.mem_map(mine)
    blob = h.pack()
    blobs = [None] * world
    dist.all_gather_object(blobs, blob)
    peer = (rank + 1) % world
    info = gosym.blob_info(blobs[peer])
    transport = {"torch": "cudaipc", "gosym": "cudavmm"}[alloc]
    ck.check(f"import/{alloc}: blob_info names the peer's device and the transport",
             info["device"] == peer and info["transport"] == transport, str(info))
    imp = gosym.mem_import(blobs[peer])
    ii = imp.info()
    ck.check(f"import/{alloc}: an IMPORT on this rank's device", ii["mode"] == "import" and ii["device"] == dev.index,
             str(ii))
    t = gosym.tensor_from(imp, (n,), torch.float32)
    ck.info[f"import_{alloc}"] = {"tensor_device": str(t.device), "info": ii}
    ck.check(f"import/{alloc}: tensor_from is a tensor on this device over the mapping",
             t.device == dev and t.data_ptr() == ii["local_address"], f"{t.device} {t.data_ptr():#x}")
    why = wc.compare(t, _input("import/mine", peer, n, torch.float32, "SUM", dev))
    ck.check(f"import/{alloc}: reads the peer's tensor", why is None, why or "")
    t.copy_(torch.full((n,), float(1000 + rank), device=dev))  # a kernel here, over NVLink
    torch.cuda.synchronize()
    dist.barrier()
    writer = (rank - 1) % world
    why = wc.compare(mine, torch.full((n,), float(1000 + writer), device=dev))
    ck.check(f"import/{alloc}: sees the peer's writes", why is None, why or "")
    dist.barrier()
    # Both orders: odd ranks unmap their export while its importer (the rank before)
    # still has it imported; even ranks' exports outlive their importer's import.
    if rank % 2 == 1:
        h.unmap()
    dist.barrier()
    del t  # the last tensor_from tensor unmaps the import
    gc.collect()
    ck.check(f"import/{alloc}: the tensor's death unmaps the import", imp.unmapped, repr(imp))
    torch.cuda.synchronize()
    dist.barrier()
    h.unmap()  # the even ranks' exports; idempotent on the odd ones
    ck.check(f"import/{alloc}: exporter's memory intact", bool((mine == float(1000 + writer)).all()))
    dist.barrier()


def teardown(ck, rank, world, dev):
    k = (1 << 18) + 3
    for order in ("unmap_first", "destroy_first"):
        g = dist.new_group(backend="gosym")
        x = torch.ones(k, device=dev)
        h = gosym.mem_map(x)
        for _ in range(2):
            x.fill_(1.0)
            dist.all_reduce(x, group=g)
        st = reg_stats(g)
        ck.check(f"teardown/{order}: bound", st["gpu_bindings_created"] == 1, str(st))
        ck.check(f"teardown/{order}: bound once", h.info()["bindings"] == 1, str(h.info()))
        torch.cuda.synchronize()
        if order == "unmap_first":
            h.unmap()
            dist.destroy_process_group(g)
        else:
            dist.destroy_process_group(g)
            ck.check(f"teardown/{order}: destroy removed the binding", h.info()["bindings"] == 0,
                     str(h.info()))
            h.unmap()
        why = wc.compare(x, torch.full_like(x, float(world)))
        ck.check(f"teardown/{order}: result", why is None, why or "")
    x = torch.ones(k, device=dev)
    dist.all_reduce(x)  # the default group goes on
    torch.cuda.synchronize()
    ck.check("teardown: default group afterwards", bool((x == world).all()))


def implicit(ck, rank, world, dev, nccl):
    """gosym.empty tensors that nobody mem_map'ed: below GOSYM_GPU_DIRECT_MIN they stage;
    from it they bind on the first op (their fds cross the links once) and are reused;
    freeing one makes the peers drop its mapping at the group's next direct op."""
    direct_min = 8 << 20
    for k in (1 << 18, direct_min // 4 + 5):  # 1 MiB (staged), 8 MiB + 5 elements (direct)
        x = gosym.empty(world * k, device=dev)
        for rep in range(2):
            case = f"implicit/all_gather/{k}/{rep}"
            x[:k].copy_(_input(case, rank, k, torch.float32, "SUM", dev))
            out = _poison(world * k, torch.float32, dev)
            outr = _poison(world * k, torch.float32, dev)
            before = reg_stats()
            ops0 = int(gosym.stats().get("gpu_direct_ops", 0))
            dist.all_gather_into_tensor(out, x[:k])
            d = delta(before, reg_stats())
            direct = int(gosym.stats().get("gpu_direct_ops", 0)) - ops0
            dist.all_gather_into_tensor(outr, x[:k].clone(), group=nccl)
            torch.cuda.synchronize()
            why = wc.compare(out, outr)
            ck.check(f"{case}: bitwise vs NCCL", why is None, why or "")
            if k * 4 < direct_min:
                ck.check(f"{case}: staged, nothing bound", direct == 0 and d["gpu_bindings_created"] == 0, str(d))
            elif rep == 0:
                ck.check(f"{case}: direct, bound on the first op",
                         direct == 1 and d["gpu_bindings_created"] == 1 and d["gpu_peer_map_misses"] == world - 1,
                         f"direct {direct} {d}")
            else:
                ck.check(f"{case}: direct, binding reused",
                         direct == 1 and d["gpu_bindings_reused"] == 1 and d["gpu_peer_map_hits"] == world - 1
                         and d["gpu_peer_map_misses"] == 0, f"direct {direct} {d}")
        del x
    gc.collect()  # frees the buffers: their implicit registrations retire
    y = torch.ones(direct_min // 4, device=dev)
    before = reg_stats()
    dist.all_reduce(y)  # direct (8 MiB): its round carries the retired ids
    d = delta(before, reg_stats())
    torch.cuda.synchronize()
    ck.check("implicit: the peers dropped the freed buffer's mapping", d["gpu_peer_map_dropped"] == world - 1,
             str(d))
    ck.check("implicit: the op after it", bool((y == world).all()))


def comm_alloc(ck, rank, world, dev, nccl):
    """ProcessGroup.allocate_tensor (FSDP2's buffers with set_allocate_memory_from_process_group_for_comm):
    torch's caching allocator over gosym's segments, so a direct-size all_gather binds a
    segment on its first op, and once the pool's segments are bound, later buffers the
    allocator places in them read in place with no new binding; results bitwise equal to
    NCCL's. (A block a gosym op used is not handed out again at once, so the second round
    may take another segment: the steady state is checked from the third.)"""
    backend = dist.group.WORLD._get_backend(torch.device(dev))
    ck.check("comm_alloc: supported on CUDA", bool(backend.supports_tensor_alloc(torch.device(dev))))
    k = (8 << 20) // 4 + 5  # direct (GOSYM_GPU_DIRECT_MIN's default 8 MiB) + 5 elements
    for rep in range(5):
        case = f"comm_alloc/all_gather/{rep}"
        x = backend.allocate_tensor(k, dtype=torch.float32, device=torch.device(dev))
        x.copy_(_input(case, rank, k, torch.float32, "SUM", dev))
        out = backend.allocate_tensor(world * k, dtype=torch.float32, device=torch.device(dev))
        out.fill_(float("nan"))
        outr = _poison(world * k, torch.float32, dev)
        before = reg_stats()
        ops0 = int(gosym.stats().get("gpu_direct_ops", 0))
        dist.all_gather_into_tensor(out, x)
        d = delta(before, reg_stats())
        direct = int(gosym.stats().get("gpu_direct_ops", 0)) - ops0
        dist.all_gather_into_tensor(outr, x.clone(), group=nccl)
        torch.cuda.synchronize()
        why = wc.compare(out, outr)
        ck.check(f"{case}: bitwise vs NCCL", why is None, why or "")
        ck.check(f"{case}: direct", direct == 1, f"direct {direct} {d}")
        if rep == 0:
            ck.check(f"{case}: the segment bound on the first op", d["gpu_bindings_created"] == 1, str(d))
        elif rep >= 2:
            ck.check(f"{case}: a bound segment again, no new binding",
                     d["gpu_bindings_created"] == 0 and d["gpu_bindings_reused"] == 1, str(d))
        del x, out
    # recorded on its own stream (the current one), a used block is free again at once
    x = backend.allocate_tensor(k, dtype=torch.float32, device=torch.device(dev))
    at = x.data_ptr()
    x.fill_(1)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    ck.check("comm_alloc: all_reduce in the pool", bool((x == world).all()))
    del x
    y = backend.allocate_tensor(k, dtype=torch.float32, device=torch.device(dev))
    ck.check("comm_alloc: a used block is handed out again at once", y.data_ptr() == at,
             f"{y.data_ptr():#x} after {at:#x}")
    del y
    ck.check("comm_alloc: host tensors are not served", not backend.supports_tensor_alloc(torch.device("cpu")))


def errors(ck, rank, world, dev):
    x = torch.zeros(1024, device=dev)
    h = gosym.mem_map(x)
    blob = h.pack()
    e = ck.expect_error("errors: import of one's own blob", gosym.mem_import, blob)
    if e is not None:
        ck.check("errors: own blob says why", "exported it" in str(e), wc.error_text(e))
    tampered = bytearray(blob)
    tampered[48:52] = (0xFE).to_bytes(4, "little")  # the PCI bus of the cudaipc entry
    tampered[8:12] = (os.getpid() + 100000).to_bytes(4, "little")  # not this process
    e = ck.expect_error("errors: a GPU this process does not see", gosym.mem_import, bytes(tampered))
    if e is not None:
        ck.check("errors: wrong GPU says why", "does not see" in str(e), wc.error_text(e))
    e = ck.expect_error("errors: truncated blob", gosym.mem_import, blob[:-3])
    if e is not None:
        ck.check("errors: truncated blob is a ValueError", isinstance(e, ValueError), wc.error_text(e))
    h.unmap()


def main():
    args = wc.setup()
    rank, world, dev, nccl = wc.init_cuda(args)
    ck = wc.Checker(rank)
    part = wc.part_runner(ck, rank, world, dev)

    part("collectives", collectives, nccl)
    part("vmm", collectives, nccl, "gosym")
    part("implicit", implicit, nccl)
    part("comm_alloc", comm_alloc, nccl)
    part("realloc", realloc)
    part("import", import_part)
    part("import_vmm", import_part, "gosym")
    part("teardown", teardown)
    part("errors", errors)
    ck.info["stats"] = gosym.stats()
    ck.info["process"] = gosym.process_stats()
    wc.finish_cuda(ck, "cuda_reg")


if __name__ == "__main__":
    main()
