"""The gosym group behind torch's: the Python group a gosym._c10d backend runs.

Apart from gosym.c10d (which loads the C++ module and wraps groups, so it knows the group
classes) because the group classes' own modules need it (memory.contiguous_view), and they
are below c10d."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def unwrap(pg):
    """The Python group behind pg: the ProcessGroupGosym a gosym._c10d.Group of torch's pg runs,
    else pg itself (a Python group, or a group that is not gosym's)."""
    m = sys.modules.get("gosym._c10d")  # loaded by gosym.c10d.module() only, for this torch
    if m is None or type(pg) is not dist.ProcessGroup:
        return pg
    try:
        b = pg._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001 - no backend for the CPU: not gosym's
        return pg
    # under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the backend in a checking wrapper
    while not isinstance(b, m.Group) and hasattr(b, "wrapped_pg"):
        b = b.wrapped_pg
    return b.group if isinstance(b, m.Group) else pg
