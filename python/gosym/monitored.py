"""ProcessGroupGosym.monitored_barrier: gloo's algorithm and wording over gosym's send/recv.

Every rank but 0 sends a token to rank 0 and waits for rank 0's answer; rank 0 posts a
receive from every rank at once, waits for them until the deadline (a timeout of 0 only
looks), and then answers every rank or raises an error naming the ranks that did not
arrive. gloo's messages are kept ("Rank 0 timed out in monitoredBarrier", "[Rank 0]: Rank 2
failed to pass monitoredBarrier in 2000 ms", "Rank 1 successfully reached monitoredBarrier,
but ..."), so that code matching them works on gosym too. Each call uses its own tag (calls
are counted per group, as collectives are): a receive left waiting by a failed call can only
be completed by the late rank's token of that same call. Like any gosym receive, one still
waiting at the group's timeout breaks the group.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

# Tags below every tag a user passes (torch's are >= 0) and above gosym's reserved one.
_TAG_BASE = -(1 << 62)


def _ms(td: timedelta) -> int:
    return int(td.total_seconds() * 1000)


def _fail(msg: str):
    return dist.DistBackendError(f"gosym: {msg}")


def _arrived(work, left_s: float) -> bool:
    """Whether work (a receive: gosym's, or Gloo's across hosts) completed within left_s
    seconds (0: only look). A completed one is waited for its outcome: Gloo's Work cannot
    hand its exception() to Python."""
    if left_s <= 0 and not work.is_completed():
        return False
    try:
        work.wait(timedelta(seconds=max(left_s, 0)))
    except RuntimeError:  # timed out, or the peer left: it did not arrive
        return False
    return True


def monitored_barrier(pg, timeout, wait_all_ranks: bool) -> None:
    """pg's monitored barrier (see the module doc); timeout None is the group's timeout."""
    timeout = pg._timeout if timeout is None else timeout
    calls = getattr(pg, "_monitored_calls", 0) + 1
    pg._monitored_calls = calls
    tag = getattr(pg, "_monitored_tag_base", _TAG_BASE) + calls
    rank, world = pg.rank(), pg.size()
    token = torch.zeros(1, dtype=torch.int64)
    if rank != 0:
        pg.send([token], 0, tag).wait()
        if not _arrived(pg.recv([torch.empty_like(token)], 0, tag), timeout.total_seconds()):
            raise _fail(f"Rank {rank} successfully reached monitoredBarrier, but received "
                        f"errors while waiting for send/recv from rank 0. Please check rank 0 "
                        f"logs for faulty rank.")
        return
    deadline = time.monotonic() + timeout.total_seconds()
    recvs = {r: pg.recv([torch.empty_like(token)], r, tag) for r in range(1, world)}
    missing = [r for r, w in recvs.items() if not _arrived(w, deadline - time.monotonic())]
    if missing:
        # Ranks found missing while an earlier one was waited for may have arrived since.
        missing = [r for r in missing if not _arrived(recvs[r], 0)]
    if missing:
        done = [r for r in recvs if r not in missing]
        who = (f"Ranks {', '.join(map(str, missing))}" if wait_all_ranks
               else f"Rank {missing[0]}")
        raise _fail(f"[Rank 0]: {who} failed to pass monitoredBarrier in {_ms(timeout)} ms. "
                    f"Rank 0 timed out in monitoredBarrier after {_ms(timeout)} ms: ranks "
                    f"{missing} did not arrive (successfully processed ranks: {done}).")
    for w in [pg.send([token], r, tag) for r in recvs]:
        w.wait()
