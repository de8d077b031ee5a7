"""dist.split_group for gosym groups: what ncclCommSplit does for NCCL.

torch 2.11 splits only a group whose backend says ``supports_splitting`` and only
when the default group is bound to a device (``init_process_group(device_id=...)``);
DeviceMesh then builds every mesh dimension with one split_group call. torch calls
``parent.split_group(ranks, ...)`` on every rank of the parent; a member gets a new
gosym group of ``ranks`` (parent group ranks), bootstrapped through the parent's
store, and a non-member gets None. Only the members meet, so no rank waits on one
that is not in its split.

The store prefix is the parent's split count and the members, never the group
name torch passes: torch hashes that name from the ranks and the number of groups
this rank has registered, and a rank that was left out of an earlier split has
registered fewer, so members of one split can be handed different names (it hung
at world 4: {0,1} alone, then DeviceMesh's {0,2}). Every rank of the parent calls
split_group for every split, as ncclCommSplit needs, so the count, taken on every
call and before the membership test, is the same on every rank.

A ProcessGroupGosym's split is a ProcessGroupGosym (its ranks share the parent's host). A
HierGroup's split is made by the factory that made the HierGroup (gosym.factory.new_group):
host detection among the members gives a ProcessGroupGosym where they share a host, else a
HierGroup with inner groups of its own.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


def split(parent, ranks, timeout: timedelta | None, group_name: str | None, group_desc: str | None,
          make=None):
    """The gosym group of ``ranks`` split from ``parent``, or None when this rank is not in it.
    make(store, rank, size, timeout, name, global_ranks) makes it (default: parent's class)."""
    size = parent.size()
    try:
        ranks = sorted(int(r) for r in ranks)
    except (TypeError, ValueError) as e:
        raise TypeError(f"gosym: split_group ranks must be integers, got {ranks!r}") from e
    bad = [r for r in ranks if not 0 <= r < size]
    if not ranks or bad or len(set(ranks)) != len(ranks):
        raise ValueError(f"gosym: split_group ranks {ranks} must be distinct ranks of the parent "
                         f"group {parent.getGroupName()!r} (size {size})")
    parent._split_count += 1
    if parent.rank() not in ranks:
        return None
    name = group_name or f"{parent.getGroupName()}:split:{parent._split_count}"
    members = "_".join(map(str, ranks))
    store = dist.PrefixStore(f"gosym/split/{parent._split_count}/{members}/", parent._store)
    make = make or type(parent)
    child = make(store, ranks.index(parent.rank()), len(ranks), timeout or parent._timeout, name,
                 [parent._global_ranks[r] for r in ranks])
    child.setGroupDesc(group_desc or f"{parent.getGroupDesc()}:split:{parent._split_count}")
    return child
