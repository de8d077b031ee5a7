"""The Work of an op that a thread of gosym's finishes (a HierGroup's host-side op, a host send
to this rank itself)."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from .._errors import DistBackendError
from .common import _ZERO, _keep, _settle


class EventWork(dist._Work):
    """An op that a thread of gosym's finishes (a HierGroup's host-side op, a send to this
    rank itself): wait(), is_completed(), get_future() as gloo's. wait() without a timeout
    waits up to `limit` (None: for ever), then raises a DistBackendError saying `late`."""

    def __init__(self, out, limit=None, late="the operation is still running"):
        super().__init__()
        self._out, self._exc, self._fut = out, None, None
        self._limit, self._late = limit, late
        self._done = threading.Event()
        self._lock = threading.Lock()

    def _finish(self, exc=None):
        with self._lock:
            self._exc = exc
            self._done.set()
            fut = self._fut
        if fut is not None:
            _settle(fut, self._out, exc)

    def wait(self, timeout=_ZERO):
        t = timeout or self._limit
        secs = t.total_seconds() if isinstance(t, timedelta) else float(t or 0)
        if not self._done.wait(secs or None):
            raise DistBackendError(f"gosym: Timed out after {secs:g} s waiting: {self._late}")
        if self._exc is not None:
            raise self._exc
        return True

    def synchronize(self):
        self.wait()

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._out

    def get_future(self):
        with self._lock:
            if self._fut is not None:
                return self._fut
            fut = self._fut = torch.futures.Future()
            done = self._done.is_set()
        if done:
            _settle(fut, self._out, self._exc)
        return fut

    def __del__(self):
        # waited or not (torch's C++ waits through this object too): these hold host tensors
        # only, and a HierGroup's DDP join failed without it ("Work::getFuture not implemented")
        _keep(self)
