"""Sends and receives that a rank posts to itself.

NCCL runs them (a batch_isend_irecv over every rank includes one), as a copy once both the
send and the receive are posted; the engine's links join two ranks, so gosym matches them
here instead: per tag, in post order, the n-th send to itself with the n-th receive from
itself, whichever came first. Host tensors are copied when the second of the pair is posted (HostSelf); CUDA ones
are matched when the group launches its pending sends and receives, and copied on the
group's internal stream after both posters' streams (_streams.CudaStreams.flush). A Work
whose partner never comes fails its wait() after the group's timeout, naming the tag,
where NCCL would hang.
"""

from __future__ import annotations

import collections
import threading

from .work import EventWork


def pair_up(queues, recv, item, tag):
    """The posted partner of item (a send when recv, else a receive) with this tag, taken
    from queues ({(recv, tag): deque}), or None after queueing item for a later partner."""
    waiting = queues.get((not recv, tag))
    if waiting:
        return waiting.popleft()
    queues.setdefault((recv, tag), collections.deque()).append(item)
    return None


class HostSelf:
    """The host sends and receives a group's rank posted to itself and not matched yet."""

    def __init__(self, timeout):
        self._timeout = timeout
        self._queues = {}
        self._lock = threading.Lock()

    def post(self, recv, t, tag, out):
        mine, partner = ("recv from", "send to") if recv else ("send to", "recv from")
        w = EventWork(out, self._timeout, f"{mine} this rank itself (tag {tag}): no matching "
                                          f"{partner} itself was posted")
        with self._lock:
            other = pair_up(self._queues, recv, (w, t), tag)
        if other is not None:
            (sw, src), (rw, dst) = (other, (w, t)) if recv else ((w, t), other)
            exc = mismatch(src, dst, tag)
            if exc is None:
                dst.copy_(src.reshape(dst.shape))
            sw._finish(exc)
            rw._finish(exc)
        return w


def mismatch(src, dst, tag):
    """The error of a matched send and recv whose tensors differ in dtype or size, or None."""
    if src.dtype == dst.dtype and src.numel() == dst.numel():
        return None
    return ValueError(f"gosym: a send to itself of {src.numel()} {src.dtype} elements matched "
                      f"a recv of {dst.numel()} {dst.dtype} (tag {tag})")
