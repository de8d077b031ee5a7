"""Work objects for gosym operations, and the thread that completes them unattended.

The engine reads and writes raw addresses, so every tensor an operation touches
stays referenced (by _Op.keep) until the engine reports the operation finished.
A native work handle is waited on, tested and released by one thread at a time:
the thread holding the op's claim. Others wait on an Event for it to finish or
to give the claim up. The lock below is never held across a native call.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _lib
from ._errors import DistBackendError

_ZERO = timedelta(0)
# Reentrant: a Work can be garbage-collected (its __del__ submits its op)
# while this thread is inside a locked section.
_lock = threading.RLock()
_CLOSE_JOIN_S = 30.0  # a completer's last settle, at endpoint destroy
# Works that Python dropped before anyone waited on them or took their future, kept a while
# longer: C++ may still hold one (DDP keeps the Work of its join all_reduce, made in the
# forward pass, to wait on and read in the backward pass). torch reaches a Work written in
# Python only while its Python object lives (pybind11 looks the methods up on it); once it
# is gone, torch's base Work::wait() waits forever. __del__ puts such a Work here, which
# revives it until this many later ones pushed it out.
_UNWAITED = collections.deque(maxlen=64)


def _keep_unwaited(w) -> None:
    """Keeps w (being finalized) alive while C++ may use it (see _UNWAITED)."""
    if not getattr(w, "_waited", False):
        try:
            _UNWAITED.append(w)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to use it
            pass


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


def _settle(fut, out, exc):
    if exc is None:
        fut.set_result(out)
    else:
        fut.set_exception(exc)


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


class CudaWork(dist._Work):
    """A CUDA op, enqueued on stream `raw` of device `idx` before this object exists: the
    host has nothing left to wait for, and the stream orders everything after it (NCCL's
    semantics). `_end`, an event recorded right after the op (None when the stream was
    being captured), makes wait() join exactly the op into the caller's current stream
    when the two streams differ and lets is_completed() say whether the GPU finished it,
    as ProcessGroupNCCL's end event does. A barrier's Work (one with `_event`) blocks the
    host in wait() until every rank reached it on the GPU, like ProcessGroupNCCL's
    barrier, then raises the error its kernel recorded (a rank that did not arrive within
    the group's timeout)."""

    __slots__ = ("_out", "_idx", "_raw", "_event", "_check", "_end", "_waited")

    def _stream(self):
        if self._raw == 0:  # the legacy default stream, torch's default
            return torch.cuda.default_stream(self._idx)
        return torch.cuda.ExternalStream(self._raw, device=torch.device("cuda", self._idx))

    def wait(self, timeout=_ZERO):
        self._waited = True
        if self._event is not None:
            self._event.synchronize()
            if self._check is not None:
                self._check()
        elif torch._C._cuda_getCurrentRawStream(self._idx) != self._raw:
            cur = torch.cuda.current_stream(self._idx)
            if self._end is not None:
                cur.wait_event(self._end)
            else:
                cur.wait_stream(self._stream())
        return True

    def synchronize(self):
        self.wait()

    def is_completed(self):
        ev = self._event if self._event is not None else self._end
        return ev is None or ev.query()

    def is_success(self):
        return self.is_completed()

    def exception(self):
        return None

    def result(self):
        return self._out

    def get_future(self):
        """A Future holding the outputs, ready for whoever follows the op's stream."""
        self._waited = True
        fut = torch.futures.Future(devices=[self._idx])
        with torch.cuda.stream(self._stream()):
            fut.set_result(self._out)
        return fut

    def __del__(self):
        _keep_unwaited(self)

    def __repr__(self):
        return f"<gosym.CudaWork cuda:{self._idx}>"


def cuda_work(out, idx, raw, event=None, check=None) -> CudaWork:
    """The CudaWork of an op just enqueued on stream raw of device idx, the caller's
    current stream there (built without a Python __init__, as work_of: on the path of
    every asynchronous CUDA op); check, with an event, raises what the GPU recorded once
    the event completed. Outside a capture the op's end is recorded at once (a
    synchronous caller gets no Work and pays nothing)."""
    w = CudaWork()
    w._out, w._idx, w._raw, w._event, w._check, w._end = out, idx, raw, event, check, None
    if event is None and not torch._C._cuda_isCurrentStreamCapturing():
        end = w._end = torch.cuda.Event()
        end.record(torch.cuda.current_stream(idx))
    return w


class CudaSideWork(CudaWork):
    """A CUDA send or recv of group `pg`, to run on one of its internal streams (`side`)
    after the caller's stream. Its kernel is launched when the group flushes its pending
    sends and receives (the first wait(), is_completed() or CUDA collective after the
    post; _streams.CudaStreams.p2p says why), which records `_done` after it. wait() makes the
    caller's current stream wait for `_done` (ProcessGroupNCCL's semantics; capture-legal,
    so a CUDA graph may capture the op and its wait, which joins `side` back into the
    capture), or raises the error that kept the op from being launched."""

    __slots__ = ("_side", "_done", "_pg", "_err")

    def __init__(self, out, idx, side, pg):
        super().__init__()
        self._out, self._idx, self._raw, self._event, self._check = out, idx, side.cuda_stream, None, None
        self._end = None
        self._side, self._done, self._pg, self._err = side, None, pg, None

    def _launched(self):
        if self._done is None and self._err is None:
            self._pg._streams.flush()
        if self._err is not None:
            raise self._err
        if self._done is None:  # a send to or recv from this rank itself, partner not posted
            raise DistBackendError(
                "gosym: a send to or recv from this rank itself waited on before its partner "
                "was posted: it could never complete (post both, then wait)")

    def _stream(self):
        self._launched()
        return self._side

    def wait(self, timeout=_ZERO):
        self._waited = True
        self._launched()
        torch.cuda.current_stream(self._idx).wait_event(self._done)
        return True

    def is_completed(self):
        self._launched()
        return self._done.query()

    def __repr__(self):
        return f"<gosym.CudaSideWork cuda:{self._idx}>"


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
        self._waited = True
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
        self._waited = True
        with self._lock:
            if self._fut is not None:
                return self._fut
            fut = self._fut = torch.futures.Future()
            done = self._done.is_set()
        if done:
            _settle(fut, self._out, self._exc)
        return fut

    def __del__(self):
        _keep_unwaited(self)


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
