"""all_reduce of sparse COO tensors (DDP's sparse gradients), SUM only, as gloo does it.

Built from the group's dense all_gather_into_tensor, which the engine already runs: every
rank's indices and values are gathered (padded to the largest count), summed into one
coalesced tensor and copied into t. Nothing of it needs the engine's memory or ordering.
"""

from __future__ import annotations

import torch
from torch._C import _distributed_c10d as _c10d

from . import _lib
from ._dtypes import reduce_op
from ._tensors import _padded
from .work import _Op, work_of

_SYNC_AG = _c10d.AllgatherOptions()  # its all_gathers wait before returning
_SYNC_AG.asyncOp = False


def sparse_allreduce(pg, t, tensors, opts):
    """pg's all_reduce of the sparse tensor t (tensors: the caller's list, [t]).
    Synchronous; the Work is done."""
    red, _ = reduce_op(opts.reduceOp)
    if red != _lib.RED["SUM"]:
        raise ValueError(f"gosym: all_reduce of sparse tensors supports SUM only, got "
                         f"{opts.reduceOp.op}")
    x = t.coalesce()
    idx, val = x.indices(), x.values()
    world = pg._size
    counts = idx.new_empty(world)
    pg._allgather_base(counts, idx.new_tensor([idx.shape[1]]), _SYNC_AG)
    most = int(counts.max())
    pad_idx = idx.new_zeros((world, idx.shape[0], most))
    pad_val = val.new_zeros((world, most, *val.shape[1:]))
    pg._allgather_base(pad_idx, _padded(idx, 1, most), _SYNC_AG)
    pg._allgather_base(pad_val, _padded(val, 0, most), _SYNC_AG)
    n = counts.tolist()
    total = torch.sparse_coo_tensor(torch.cat([pad_idx[r][:, :n[r]] for r in range(world)], 1),
                                    torch.cat([pad_val[r][:n[r]] for r in range(world)]),
                                    x.shape).coalesce()
    t.copy_(total)
    return work_of(_Op((), tensors, None, None, pg._completer)) if opts.asyncOp else None
