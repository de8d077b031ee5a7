"""The Work of a CUDA op: enqueued on a stream before its Work exists (NCCL's semantics), and
of a CUDA send or recv, launched on one of its group's internal streams."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._errors import DistBackendError
from .common import _ZERO, _keep_unwaited


class CudaWork(dist._Work):
    """A CUDA op, enqueued on stream `raw` of device `idx` before this object exists: the
    host has nothing left to wait for, and the stream orders everything after it (NCCL's
    semantics). `_end`, an event recorded right after the op (None when the stream was
    being captured), makes wait() join exactly the op into the caller's current stream
    when the two streams differ and lets is_completed() say whether the GPU finished it,
    as ProcessGroupNCCL's end event does. A barrier's Work (one with `_event`) blocks the
    host in wait() until every rank reached it on the GPU, like ProcessGroupNCCL's
    barrier. wait() then raises the group's error, if `_check` finds one (a lost peer, a
    kernel's timeout: one load of host memory), as ProcessGroupNCCL's wait() raises what
    its watchdog found."""

    __slots__ = ("_out", "_idx", "_raw", "_event", "_check", "_end", "_waited")

    def _stream(self):
        if self._raw == 0:  # the legacy default stream, torch's default
            return torch.cuda.default_stream(self._idx)
        return torch.cuda.ExternalStream(self._raw, device=torch.device("cuda", self._idx))

    def wait(self, timeout=_ZERO):
        self._waited = True
        if self._event is not None:
            self._event.synchronize()
        elif torch._C._cuda_getCurrentRawStream(self._idx) != self._raw:
            cur = torch.cuda.current_stream(self._idx)
            if self._end is not None:
                cur.wait_event(self._end)
            else:
                cur.wait_stream(self._stream())
        if self._check is not None:
            self._check()
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
        end = getattr(self, "_end", None)
        if end is not None and getattr(self, "_waited", False):
            # not revived (waited): nothing reaches the event again; a later op records it
            try:
                pool = _EVENTS.setdefault(self._idx, [])
                if len(pool) < _EVENTS_MAX:
                    pool.append(end)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing to keep it for
                pass

    def __repr__(self):
        return f"<gosym.CudaWork cuda:{self._idx}>"


# Events of waited CudaWorks that are gone, per device, for the next ops' ends (as
# ProcessGroupNCCL's event cache): no event created and destroyed per asynchronous op.
_EVENTS: dict[int, list] = {}
_EVENTS_MAX = 256


def _event(idx):
    pool = _EVENTS.get(idx)
    if pool:
        return pool.pop()
    return torch.cuda.Event()


def cuda_work(out, idx, raw, event=None, check=None) -> CudaWork:
    """The CudaWork of an op just enqueued on stream raw of device idx, the caller's
    current stream there (built without a Python __init__, as work_of: on the path of
    every asynchronous CUDA op); check raises the group's error in wait() (with an event,
    once the event completed). Outside a capture the op's end is recorded at once (a
    synchronous caller gets no Work and pays nothing)."""
    w = CudaWork()
    w._out, w._idx, w._raw, w._event, w._check, w._end = out, idx, raw, event, check, None
    if event is None and not torch._C._cuda_isCurrentStreamCapturing():
        end = w._end = _event(idx)
        end.record(torch.cuda.current_stream(idx))
    return w


class CudaSideWork(CudaWork):
    """A CUDA send or recv of group `pg`, to run on one of its internal streams (`side`)
    after the caller's stream. Its kernel is enqueued at the call, as NCCL's (a send to or
    recv from this rank itself once its partner is posted; _streams.CudaStreams.p2p), and
    `_done` is recorded after it. wait() makes the caller's current stream wait for `_done`
    (ProcessGroupNCCL's semantics; capture-legal, so a CUDA graph may capture the op and its
    wait, which joins `side` back into the capture), or raises the error that kept the op
    from being launched, or the group's."""

    __slots__ = ("_side", "_done", "_pg", "_err")

    def __init__(self, out, idx, side, pg):
        super().__init__()
        self._out, self._idx, self._raw, self._event = out, idx, side.cuda_stream, None
        self._check = pg._streams.device_error
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
        self._check()
        return True

    def is_completed(self):
        self._launched()
        return self._done.query()

    def __repr__(self):
        return f"<gosym.CudaSideWork cuda:{self._idx}>"
