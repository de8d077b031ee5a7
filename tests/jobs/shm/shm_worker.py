"""Exercises the shared-memory paths, then parks so the test can inspect the
live processes (and, in the kill variant, SIGKILL one of them).

Stages: run collectives small and large on the default group and a subgroup,
announce "ready.<rank>", wait for the test's "go" marker, then one more
all_reduce on a short-timeout group (which fails on the survivors when a peer
was killed) and exit.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
import wcommon as wc
from wcommon import LARGE


def exercise(group, rank: int, world: int) -> None:
    for n in (1, 4099, LARGE):
        t = torch.ones(n)
        dist.all_reduce(t, group=group)
        assert bool((t == world).all()), "all_reduce gave a wrong result"
    out = torch.empty(world * 1000)
    dist.all_to_all_single(out, torch.full((world * 1000,), float(rank)), group=group)
    per_rank = LARGE // world
    out = torch.empty(world * per_rank)
    dist.all_gather_into_tensor(out, torch.ones(per_rank), group=group)


def main():
    args = wc.setup(lambda p: p.add_argument("--op-timeout", type=float, default=5.0))
    rank, world = wc.init(args.backend, args.timeout)
    g = dist.new_group(timeout=datetime.timedelta(seconds=args.op_timeout))
    exercise(None, rank, world)
    exercise(g, rank, world)
    res = {"rank": rank, "failures": [], "ready": wc.memfd_counts()}
    wc.write_result(res)
    wc.announce("ready")
    wc.wait_for_marker("go")
    t = torch.ones(1025)
    try:
        dist.all_reduce(t, group=g)
        res["after_go"] = {"ok": bool((t == world).all())}
    except Exception as e:  # noqa: BLE001 - expected when a peer was killed
        res["after_go"] = {"error": wc.error_text(e), "clear": isinstance(e, wc.CLEAR_ERRORS)}
    wc.write_result(res)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
