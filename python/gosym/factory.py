"""The "gosym" backend as torch creates it: register() and the creator torch calls, which
makes the group of the ranks it is given: a ProcessGroupGosym where they share one host, a
HierGroup (gosym.hier) where they span hosts.

This module sits above both: backend (ProcessGroupGosym) and hier never import it or each
other's factory, so neither needs the other to be importable first.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from . import _settings, c10d, hier


def new_group(store, rank, size, timeout, name, global_ranks):
    """The gosym group of these ranks: a ProcessGroupGosym where host detection puts them on
    one host, else a HierGroup. The ranks' GOSYM_HIER_* settings are compared first, as the
    engine compares the settings it shares: they choose the algorithms across hosts, and so
    does the table of measurements (gosym.hier.schedule), whose digest is compared with them."""
    settings = _settings.hier()  # a bad value fails here, before any rank waits for this one
    settings[hier.TABLE_KEY] = hier.schedule.digest()
    seen, key = hier.exchange(store, rank, size, timeout, name, settings,
                              global_ranks[rank] if global_ranks else rank)
    hosts = {}
    try:
        for r, (h, theirs, _) in enumerate(seen):
            _settings.agree(r, theirs, settings)
            hosts.setdefault(h, []).append(r)
    except ValueError:
        _all_read(store, key, rank, size, timeout)
        raise
    hosts = list(hosts.values())  # ordered by each host's first rank
    hid = seen[rank][0]
    if len(hosts) == 1:
        pg = hier.linked(store, rank, size, timeout, name, global_ranks, hosts[0], hid)
    else:
        link = hier.schedule.link([boot for _, _, boot in seen], settings["GOSYM_HIER_LINK"])
        pg = hier.HierGroup(store, rank, size, timeout, name, global_ranks, hosts, hid, settings,
                            new_group, link)
    try:
        store.delete_key(key)  # every rank read it: the connects above needed them all
    except Exception:  # noqa: BLE001 - a store without delete_key just keeps it
        pass
    return pg


def _all_read(store, key, rank, size, timeout) -> None:
    """Before this rank raises on a difference (every rank finds it): waits, up to timeout,
    until every rank has read the settings, then, on rank 0, until every rank is done with
    the store. Rank 0 may host it (init_process_group's env:// TCPStore); had it raised and
    exited first, a peer still reading would get a lost connection instead of the error."""
    base = key.rsplit("/", 1)[0]  # the creation's prefix: counters every rank shares
    deadline = time.monotonic() + timeout.total_seconds()
    for counter, step in (("read", 1), ("done", 1)):
        n = store.add(f"{base}/{counter}", step)
        if counter == "done" and rank != 0:
            return  # this rank needs the store no more
        while n < size and time.monotonic() < deadline:
            time.sleep(0.005)
            n = store.add(f"{base}/{counter}", 0)


def create(dist_backend_opts, backend_options=None):
    """torch's creator for backend "gosym" (register_backend with extended_api=True): the
    group, as gosym.c10d hands it to torch (its C++ backend where that is built)."""
    o = dist_backend_opts
    return c10d.wrap(new_group(o.store, o.group_rank, o.group_size, o.timeout,
                               str(o.group_id), list(o.global_ranks_in_group)))


def register() -> None:
    """Registers backend "gosym" with torch.distributed (once per process)."""
    if "GOSYM" in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend("gosym", create, extended_api=True, devices=["cpu", "cuda"])
