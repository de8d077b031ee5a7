"""The Work of a host op (one posted to the engine): _Op, its native handles and their
claim, Work, and the thread that completes them unattended (Completer).

The engine reads and writes raw addresses, so every tensor an operation touches
stays referenced (by _Op.keep) until the engine reports the operation finished.
A native work handle is waited on, tested and released by one thread at a time:
the thread holding the op's claim. Others wait on an Event for it to finish or
to give the claim up. The lock below is never held across a native call.
"""

from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _lib
from .._errors import DistBackendError
from .common import _ZERO, _keep_unwaited, _settle

# Reentrant: a Work can be garbage-collected (its __del__ submits its op)
# while this thread is inside a locked section.
_lock = threading.RLock()
_CLOSE_JOIN_S = 30.0  # a completer's last settle, at endpoint destroy


class _Op:
    """One or more posted native operations that complete together."""

    __slots__ = ("handles", "out", "keep", "copyback", "completer", "done", "exc", "err",
                 "claimed", "event", "fut", "closed")

    def __init__(self, handles, out, keep, copyback, completer):
        self.handles = handles  # tuple of native work handles not yet released
        self.out = out  # the tensors the caller sees as the result
        self.keep = keep  # everything the engine reads or writes, alive until done
        self.copyback = copyback  # (dst, src) pairs copied after success, or None
        self.completer = completer
        self.done = not handles
        self.exc = None
        self.err = None  # owner only: the first error of a handle already released
        self.claimed = False
        self.event = None
        self.fut = None
        self.closed = None  # the Future that closes its profiler range (gosym.profiling)

    def _claim(self, block):
        """True: the caller now owns the handles. None: done. Else an Event to wait on
        (block) or False (not block), while another thread owns them."""
        with _lock:
            if self.done:
                return None
            if not self.claimed:
                self.claimed = True
                return True
            if not block:
                return False
            if self.event is None:
                self.event = threading.Event()
            return self.event

    def _unclaim(self):
        """Gives the handles up unfinished; wakes waiters so that one of them takes over."""
        with _lock:
            self.claimed = False
            ev, self.event = self.event, None
        if ev is not None:
            ev.set()

    def _finish(self, exc):
        """Owner only, every handle released: copies results back, settles waiters and future."""
        self.handles = ()
        if exc is None and self.copyback:
            try:
                for dst, src in self.copyback:
                    dst.copy_(src)
            except Exception as e:  # noqa: BLE001 - reported through wait()/the future
                exc = e
        with _lock:
            self.done = True
            self.exc = exc
            self.keep = self.copyback = None
            ev, self.event = self.event, None
            fut = self.fut
        if ev is not None:
            ev.set()
        if fut is not None:
            _settle(fut, self.out, exc)

    def _run(self, timeout_ms):
        """Owner only: waits on every handle, releasing each once done (one native call
        each). Returns None once finished, or the error to raise when the caller's own
        timeout expired and the operation is still running (its handles stay live)."""
        hs = self.handles
        for i, h in enumerate(hs):
            st = _lib.work_finish(h, timeout_ms)
            if st == _lib.ERR_NOT_READY:
                self.handles = hs[i:]
                self._unclaim()
                return DistBackendError(
                    f"gosym: wait: Timed out after {timeout_ms} ms; the operation is "
                    "still running (wait again, or destroy the process group)")
            if st and self.err is None:
                self.err = _lib.error(st)
        self._finish(self.err)
        return None

    def wait(self, timeout_ms):
        """Blocks until done (timeout_ms < 0: the group's timeout), raising its error."""
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while True:
            c = self._claim(True)
            if c is None:
                break
            left = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if c is True:
                err = self._run(left)
                if err is not None:
                    raise err
                break
            if not c.wait(None if deadline is None else left / 1000):
                raise DistBackendError(f"gosym: wait: Timed out after {timeout_ms} ms; the "
                                        "operation is still running")
        if self.exc is not None:
            raise self.exc

    def poll(self):
        """True when done (finishing it if this call finds it so), without blocking."""
        c = self._claim(False)
        if c is None:
            return True
        if c is False:
            return False
        for h in self.handles:
            st = _lib.work_test(h)
            if st == _lib.ERR_NOT_READY:
                self._unclaim()
                return False
            if st and self.err is None:
                self.err = _lib.error(st)
        for h in self.handles:
            _lib.work_release(h)
        self._finish(self.err)
        return True

    def future(self):
        """A torch Future set to self.out (or the error) when the op finishes."""
        with _lock:
            if self.fut is not None:
                return self.fut
            fut = self.fut = torch.futures.Future()
            pending = not self.done
        if pending:
            self.completer.submit(self)
        else:
            _settle(fut, self.out, self.exc)
        return fut


class Completer:
    """A daemon thread per endpoint that finishes ops nobody waits on (get_future(),
    dropped Work objects). Ops of one group complete in order, so waiting on the
    oldest first is enough; a thread per group keeps a slow group from delaying
    another group's futures. Closed when the endpoint goes: by then the engine has
    failed all outstanding work, so anything submitted later finishes inline."""

    def __init__(self, name: str):
        self._name = name
        self._q = queue.SimpleQueue()
        self._thread = None
        self._closed = False

    def submit(self, op: _Op) -> None:
        start = None
        with _lock:
            if not self._closed:
                if self._thread is None:
                    start = self._thread = threading.Thread(
                        target=self._loop, name=f"gosym-completer-{self._name}", daemon=True)
                self._q.put(op)
                op = None
        if start is not None:
            start.start()
        if op is not None:
            _quiet_wait(op)

    def close(self) -> None:
        with _lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._q.put(None)
        # Joined, so that no completer is still inside torch's Future.set_result (which
        # drops and retakes the GIL) when the interpreter exits: a daemon thread that
        # retakes the GIL during finalization is ended mid-frame, and torch's C++ aborts
        # the process ("terminate called without an active exception"). The engine has
        # failed every outstanding op by now, so the thread ends at once.
        if thread is not threading.current_thread():
            thread.join(_CLOSE_JOIN_S)

    def _loop(self):
        while True:
            op = self._q.get()
            if op is None:
                return
            _quiet_wait(op)


def _quiet_wait(op: _Op) -> None:
    try:
        op.wait(-1)
    except Exception:  # noqa: BLE001 - the error lives on in op.exc / the future
        pass


def _to_ms(timeout) -> int:
    if isinstance(timeout, timedelta):
        return round(timeout.total_seconds() * 1000)
    return round(float(timeout) * 1000)


class Work(dist._Work):
    """A gosym operation as torch sees it: wait(), is_completed(), get_future().
    Made by work_of: a Python __init__ (which must call the pybind base's) costs more
    than the rest of a small op's Python side."""

    __slots__ = ("_op", "_waited")

    def wait(self, timeout=_ZERO):
        self._waited = True
        op = self._op
        if not op.done:
            op.wait(-1 if not timeout else _to_ms(timeout))
        elif op.exc is not None:
            raise op.exc
        if op.closed is not None:
            _join_closed(op)
        return True

    def synchronize(self):
        self.wait()

    def is_completed(self):
        op = self._op
        return op.done or op.poll()

    def is_success(self):
        return self.is_completed() and self._op.exc is None

    def exception(self):
        op = self._op
        return op.exc if op.done else None

    def result(self):
        return self._op.out

    def get_future(self):
        self._waited = True
        return self._op.future()

    def __del__(self):
        _keep_unwaited(self)
        # Dropped before completion (e.g. an isend nobody waits on): the engine may still
        # write to the tensors, so let the completer hold them until the op finishes.
        op = getattr(self, "_op", None)
        if op is not None and not op.done:
            try:
                op.completer.submit(op)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to save
                pass

    def __repr__(self):
        op = self._op
        state = "pending" if not op.done else ("failed" if op.exc is not None else "done")
        return f"<gosym.Work {state}>"


def _join_closed(op: _Op) -> None:
    """Waits until the profiler range of op (done) is closed, so that it is recorded before
    the caller goes on (and perhaps stops the profiler)."""
    closed, op.closed = op.closed, None
    closed.wait()


def work_of(op: _Op) -> Work:
    """The Work of op."""
    w = Work()
    w._op = op
    return w
