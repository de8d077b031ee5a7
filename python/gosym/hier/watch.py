"""A HierGroup's watch on its ranks across hosts: who exited without leaving the group, and
a failure told around the ring of its ranks.

A CUDA op across hosts waits inside NCCL's kernels, and NCCL's network transports do not
notice a peer that died (2 x H200, session 33: a survivor waited for torch's watchdog, 70 s
at a 12 s group timeout); this host's engine watches only the ranks of its host (pidfds).
So each rank keeps one receive posted on the group's flat Gloo group from the rank before
it on the ring of group ranks (its predecessor), and one thread waiting on it. Gloo's TCP
pair fails a posted receive at once when the peer's connection closes, which the kernel
does when a process exits however it dies; a stalled rank (a long GIL hold, a debugger)
closes nothing, so it is never taken for a lost one, unlike a heartbeat's deadline. The
receive completes with one of:

- LEAVE: the predecessor left the group (shutdown, destroy_process_group);
- a rank r (r >= 0): the group failed there, and the predecessor passed it on;
- -2 - r: rank r exited without leaving, and the predecessor passed it on;
- an error: the predecessor's connection closed without a LEAVE: it exited or was killed
  (or its Gloo group failed).

On the last two the rank passes the news to its successor (each rank sends one message on
the ring in its life, LEAVE or the news), so every rank of the group hears of a failure
within one trip around the ring, and the group reacts (HierBase._watched). Sending once
matters: a Gloo send waits until its peer posts the receive, and each rank posts one.

The watch's thread lingers after its own group's shutdown until its predecessor leaves or
exits (Gloo's Work cannot be cancelled from Python); every rank's shutdown sends LEAVE, so
it ends when the group is destroyed everywhere. At interpreter exit every watch leaves and
its thread is joined, for at most the group's timeout (_at_exit): a thread still in Gloo's
wait once the interpreter finalizes is ended by CPython from inside C++ frames when the
wait returns, and the process aborts."""

from __future__ import annotations

import atexit
import datetime
import sys
import threading
import time

import torch

# The watch's tag on the flat Gloo group: Gloo takes tags in [0, 2^31); the top 2^24 are
# monitored_barrier's (HierGroup._monitored_tag_base), users' sends take theirs from 0 up.
TAG = (1 << 31) - (1 << 24) - 1
LEAVE = -1

# A receive waits as long as the group lives; Gloo's own default is the group's timeout,
# after which it fails the whole context.
_FOREVER = datetime.timedelta(days=365)


def _gone(rank):
    return -2 - rank


# The watches not closed or whose thread still waits: _at_exit closes the first (each owes
# its successor a LEAVE, whether or not its own predecessor left already: taken out when its
# thread ended, such a watch sent nothing at exit, and its successor heard this rank's exit
# as a death) and joins the second. A watch leaves the set once closed and its thread ended.
_live = set()
_live_lock = threading.Lock()


def _at_exit():
    """Every watch leaves (a group never destroyed leaves now: with none leaving, each rank
    would wait for its predecessor's exit around the ring) and its thread is joined until
    the predecessor has left or exited, for at most the longest group timeout. A thread
    that wakes from Gloo's wait once the interpreter finalizes is ended by CPython inside
    pybind11's GIL guard, a C++ frame that may not unwind: "terminate called without an
    active exception", the process aborted after the user's program had finished (session
    35: hosts of 2 and 1 ranks, a rank's predecessor destroying the group a moment later,
    4 runs of 4), and torchrun counted the job failed."""
    with _live_lock:
        watches = list(_live)
    for w in watches:
        w.close()
    deadline = time.monotonic() + max((w._send_timeout.total_seconds() for w in watches),
                                      default=0.0)
    for w in watches:
        w._thread.join(max(0.0, deadline - time.monotonic()))
        if w._thread.is_alive():
            print(f"gosym: at exit, rank {w._rank} of group {w._name!r} still waits for rank "
                  f"{w._pred} to leave the group or exit; this process may abort if it does "
                  f"while the interpreter shuts down", file=sys.stderr, flush=True)


atexit.register(_at_exit)


class Watch:
    """The watch of rank `rank` of `size` on flat Gloo group `pg`. on_news(pred, origin,
    dead, error) runs on the watch's thread at most once, unless the watch was closed first:
    origin is the rank where the group failed (another than this one), or dead the rank
    that exited without leaving (the predecessor itself where its connection closed: error
    says how)."""

    def __init__(self, pg, rank, size, on_news, name, send_timeout):
        self._pg, self._on_news, self._rank, self._name = pg, on_news, rank, name
        self._pred, self._succ = (rank - 1) % size, (rank + 1) % size
        self._send_timeout = send_timeout
        self._lock = threading.Lock()  # guards _sent
        self._sent = False
        self.closed = False
        self._waiting = True  # the thread has not ended (guarded by _live_lock)
        self._buf = torch.empty(1, dtype=torch.int64)
        work = pg.recv([self._buf], self._pred, TAG)
        self._thread = threading.Thread(target=self._wait, args=(work,), daemon=True,
                                        name=f"gosym-watch-{name}")
        with _live_lock:
            _live.add(self)
        self._thread.start()

    def _wait(self, work):
        try:
            self._receive(work)
        finally:
            with _live_lock:
                self._waiting = False
                if self.closed:
                    _live.discard(self)

    def _receive(self, work):
        try:
            work.wait(_FOREVER)
        except Exception as e:  # noqa: BLE001 - the predecessor's connection closed
            if not self.closed:
                self._on_news(self._pred, None, self._pred, e)
            return
        value = int(self._buf[0])
        if value in (LEAVE, self._rank) or self.closed:
            return  # left, or this rank's own failure come around the ring
        if value >= 0:
            self._on_news(self._pred, value, None, None)
        else:
            self._on_news(self._pred, None, _gone(value), None)

    def tell_failed(self, origin):
        """Passes a failure that began at rank origin to the successor (the watch sends once
        in its life: a second news, or a LEAVE after one, is not sent)."""
        self._send(origin)

    def tell_dead(self, rank):
        """Passes rank's exit without leaving to the successor (once, as tell_failed)."""
        self._send(_gone(rank))

    def close(self):
        """This rank leaves the group: LEAVE to the successor, no news reported any more."""
        with _live_lock:
            self.closed = True
            if not self._waiting:
                _live.discard(self)
        self._send(LEAVE)

    def alive(self):
        """Whether the thread still waits (its predecessor has not left or exited)."""
        return self._thread.is_alive()

    def _send(self, value):
        with self._lock:
            if self._sent:
                return
            self._sent = True
        try:
            msg = torch.tensor([value], dtype=torch.int64)
            self._pg.send([msg], self._succ, TAG).wait(self._send_timeout)
        except Exception:  # noqa: BLE001 - a successor that exited needs no news
            pass
