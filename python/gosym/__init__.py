"""gosym: a torch.distributed backend for the processes of one host, engine in Go.

``import gosym`` loads libgosym.so (GOSYM_LIBRARY overrides the path), checks its
ABI version and registers the backend, after which
``torch.distributed.init_process_group(backend="gosym")`` works.
"""

from __future__ import annotations

import json

import torch.distributed as dist

if not dist.is_available():
    raise ImportError("gosym: this torch build has no torch.distributed")

from . import _lib  # noqa: E402 - raises ImportError when the library is missing or mismatched
from . import c10d  # noqa: E402
from ._compile import keep_dynamo_out  # noqa: E402
from .backend import ProcessGroupGosym  # noqa: E402
from .factory import register  # noqa: E402
from .memory import (MemHandle, blob_info, contiguous_view, empty, empty_like,  # noqa: E402
                     mem_import, mem_map, mem_unmap, tensor_from)
from .work import Work  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "MemHandle",
    "ProcessGroupGosym",
    "Work",
    "blob_info",
    "contiguous_view",
    "empty",
    "empty_like",
    "engine_version",
    "group",
    "mem_import",
    "mem_map",
    "mem_unmap",
    "process_stats",
    "stats",
    "tensor_from",
]

register()
keep_dynamo_out()  # torch.compile runs gosym's frames as written (_compile says why)


def engine_version() -> str:
    """The version string of the loaded engine library."""
    return _lib.version()


def stats(group=None) -> dict:
    """Counters and settings of a gosym group's endpoint (None: the default group)."""
    pg = c10d.unwrap(dist.distributed_c10d._get_default_group() if group is None else group)
    if not isinstance(pg, ProcessGroupGosym):
        raise ValueError(f"gosym: {pg!r} is not a gosym process group")
    return json.loads(pg._stats_json())


def group(pg=None):
    """The Python group (ProcessGroupGosym or HierGroup) behind a gosym process group that
    torch returned (None: the default group); torch's own group runs gosym._c10d's backend
    where that is built (gosym.c10d)."""
    return c10d.unwrap(dist.distributed_c10d._get_default_group() if pg is None else pg)


def process_stats() -> dict:
    """Process-wide counters of the engine (live handles, fds, mappings)."""
    return json.loads(_lib.process_stats_json())
