"""Process groups: overlapping subgroups created back to back and used
interleaved, gosym.stats per group, 20 create-use-destroy cycles without leaking
fds or memfd mappings, and destroying the whole world then initialising again.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
import wcommon as wc

CYCLES = 20


def member_sets(world: int) -> list[list[int]]:
    """Overlapping groups; every rank is in several, some groups share all but one rank."""
    sets = [list(range(world)), [0, 1], [world - 1, 0], list(range(1, world)), list(range(world - 1, -1, -1))]
    if world >= 4:
        sets += [[1, 2], [0, 2, 3], [1, 3]]
    return sets


def use_group(ck, case, g, members, rank, rounds=3, group_stats=None):
    """all_reduce, broadcast (global src) and all_gather on g; checks them all."""
    members = sorted(members)  # group rank order is the sorted global ranks
    for k in range(rounds):
        t = torch.full((37,), float(rank * 10 + k))
        dist.all_reduce(t, group=g)
        want = sum(m * 10 + k for m in members)
        ck.check(f"{case} all_reduce#{k}", bool((t == want).all()), f"got {t[0].item()} want {want}")
        src = members[(k + 1) % len(members)]
        b = torch.full((5,), float(rank if rank == src else -1), dtype=torch.int64)
        dist.broadcast(b, src=src, group=g)
        ck.check(f"{case} broadcast#{k}", bool((b == src).all()), f"got {b.tolist()} want {src}")
        outs = [torch.full((3,), -1.0) for _ in members]
        dist.all_gather(outs, torch.full((3,), float(rank + k)), group=g)
        got = [o[0].item() for o in outs]
        ck.check(f"{case} all_gather#{k}", got == [float(m + k) for m in members], f"got {got}")
    if group_stats is not None:
        group_stats[case] = gosym_stats(g)


def gosym_stats(group):
    """gosym.stats for a gosym group (None on other backends)."""
    try:
        import gosym
    except ImportError:
        return None
    return gosym.stats(group)


def overlapping(ck, rank, world, backend):
    sets = member_sets(world)
    groups = [dist.new_group(s) for s in sets]  # back to back, before any use
    stats = {}
    for round_ in range(2):  # interleave: use every group, twice
        for i, (g, s) in enumerate(zip(groups, sets)):
            if rank in s:
                use_group(ck, f"group{i}{s} round{round_}", g, s, rank, rounds=1,
                          group_stats=stats if backend == "gosym" else None)
    # async ops in flight on several overlapping groups at once.
    pending = []
    for i, (g, s) in enumerate(zip(groups, sets)):
        if rank in s:
            t = torch.full((1000,), float(rank + 1))
            pending.append((i, s, t, dist.all_reduce(t, group=g, async_op=True)))
    for i, s, t, w in pending:
        w.wait()
        ck.check(f"group{i}{s} async", bool((t == sum(m + 1 for m in s)).all()), f"got {t[0].item()}")
    if backend == "gosym":
        ck.check("gosym.stats(group) is a dict", all(isinstance(v, dict) for v in stats.values()) and bool(stats),
                 repr(stats)[:300])
        ck.info["group_stats_sample"] = next(iter(stats.values()), None)
    for g, s in zip(groups, sets):
        if rank in s:
            dist.destroy_process_group(g)


def cycles(ck, rank, world, backend):
    """Create, use, destroy: a full group and a pair, CYCLES times. fds and memfd
    mappings must not grow after the first cycles (which may warm caches up)."""
    snaps = {}
    for c in range(CYCLES):
        full = dist.new_group()
        pair = dist.new_group([0, world - 1])
        use_group(ck, f"cycle{c} full", full, list(range(world)), rank, rounds=1)
        if rank in (0, world - 1):
            use_group(ck, f"cycle{c} pair", pair, [0, world - 1], rank, rounds=1)
        dist.destroy_process_group(pair)
        dist.destroy_process_group(full)
        dist.barrier()
        if c in (1, CYCLES - 1):
            snaps[c] = wc.memfd_counts()
            if backend == "gosym":
                import gosym

                snaps[c]["process_stats"] = gosym.process_stats()
    first, last = snaps[1], snaps[CYCLES - 1]
    ck.info["cycle_snapshots"] = snaps
    for key in ("fds", "memfd_fds", "memfd_maps"):
        ck.check(f"cycles/{key} flat", last[key] <= first[key] + 2,
                 f"{key}: {first[key]} after cycle 2, {last[key]} after cycle {CYCLES}")
    if backend == "gosym":
        ck.check("gosym.process_stats() is a dict", isinstance(last["process_stats"], dict))


def reinit(ck, rank, world, backend, timeout):
    """Destroy the default group and initialise again in the same processes."""
    before = wc.memfd_counts()
    dist.destroy_process_group()
    ck.check("reinit/not initialized after destroy", not dist.is_initialized())
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout))
    t = torch.full((11,), float(rank + 1))
    dist.all_reduce(t)
    ck.check("reinit/all_reduce", bool((t == world * (world + 1) / 2).all()), str(t.tolist()))
    g = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        use_group(ck, "reinit/subgroup", g, [0, world - 1], rank, rounds=1)
    dist.destroy_process_group(g)
    after = wc.memfd_counts()
    ck.check("reinit/memfd mappings not doubled", after["memfd_maps"] <= before["memfd_maps"] + 2,
             f"{before} -> {after}")


def main():
    args = wc.setup()
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    ck.run("overlapping", overlapping, ck, rank, world, args.backend)
    ck.run("cycles", cycles, ck, rank, world, args.backend)
    ck.run("reinit", reinit, ck, rank, world, args.backend, args.timeout)
    wc.print_summary(ck, "groups")
    wc.write_result(ck.result())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
