"""A group's endpoint from birth to death: created and connected through the group's store
(bootstrap), destroyed by the group's finalizer (destroy)."""

from __future__ import annotations

import ctypes
import os
import sys

import torch.distributed as dist

from . import _lib, _settings
from .work import Completer

_DEBUG = _settings.debug()


def debug(msg: str) -> None:
    if _DEBUG:
        print(f"[gosym pid {os.getpid()}] {msg}", file=sys.stderr, flush=True)


def bootstrap(store, rank, size, timeout, name) -> int:
    """create -> allgather the blobs through the store -> connect; returns the endpoint."""
    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    out = ctypes.c_uint64()
    _lib.check(_lib.endpoint_create(rank, size, timeout_ms, name.encode(), ctypes.byref(out)),
               f"creating the endpoint of group {name!r}")
    handle = out.value
    try:
        blob = _lib.read_bytes(_lib.endpoint_blob, handle)
        # A store prefix outlives a group (destroy_process_group + init again on the
        # agent's store), so every creation uses fresh keys. Each rank counts its own
        # creations on this prefix; all ranks of a group create the same sequence.
        gen = store.add(f"gosym/gen/{rank}", 1)
        prefix = f"gosym/{gen}/blob/"
        keys = [f"{prefix}{r}" for r in range(size)]
        store.set(keys[rank], blob)
        try:
            store.wait(keys, timeout)
        except Exception as e:  # noqa: BLE001 - re-raised with the missing ranks
            missing = [r for r in range(size) if not store.check([keys[r]])]
            raise dist.DistBackendError(
                f"gosym: group {name!r} (rank {rank} of {size}): ranks {missing} did not "
                f"publish their bootstrap blob within {timeout} ({e})") from e
        blobs = store.multi_get(keys)
        lens = (ctypes.c_uint64 * size)(*[len(b) for b in blobs])
        debug(f"group {name!r} rank {rank}/{size}: connecting (blobs {list(lens)})")
        _lib.check(_lib.endpoint_connect(handle, b"".join(blobs), lens, size),
                   f"connecting group {name!r} (rank {rank} of {size})")
    except BaseException:
        _lib.endpoint_destroy(handle)
        raise
    # connect returned, so every peer has read every blob: drop ours to keep the store small.
    try:
        store.delete_key(keys[rank])
    except Exception:  # noqa: BLE001 - a store without delete_key just keeps it
        pass
    debug(f"group {name!r} rank {rank}/{size}: connected, endpoint {handle}")
    return handle


def destroy(handle: int, completer: Completer, name: str) -> None:
    """Endpoint finalizer: explicit shutdown, garbage collection or interpreter exit."""
    st = _lib.endpoint_destroy(handle)
    completer.close()
    debug(f"endpoint {name} destroyed (status {st})")
