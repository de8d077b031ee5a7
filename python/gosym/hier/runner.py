"""The thread that runs a HierGroup's host-side ops in post order."""

from __future__ import annotations

import ctypes
import queue
import threading

from ..work import EventWork


class Runner:
    """The thread that runs a HierGroup's host-side ops one after another, in post order:
    every rank posts the inner groups' ops in the same order, whatever its caller does
    meanwhile (torch's async Work, DDP's overlap). A synchronous op posted while none is
    pending runs on its caller's thread instead (inline()): the same order, without two
    thread hand-offs per op, which cost more than a small op on a busy host."""

    def __init__(self, name, cells=None, at=0):
        """cells[at] holds pending (HierBase's cells: the C++ backend's flat path reads it)."""
        self._name = name
        self._q = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()  # guards pending
        self._cells, self._at = (cells, at) if cells is not None else ((ctypes.c_int64 * 1)(), 0)
        self._slot = threading.Lock()  # held while an op runs: one at a time, in post order
        self.closed = False  # close() was called: the group is going away

    @property
    def pending(self):
        """Ops posted and not yet run (queued, running, or inline); read unlocked by
        _flat_now and by the C++ backend's flat path."""
        return self._cells[self._at]

    @pending.setter
    def pending(self, n):
        self._cells[self._at] = n

    def submit(self, fn, work):
        with self._lock:
            self.pending += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"gosym-hier-{self._name}",
                                            daemon=True)
            self._thread.start()
        self._q.put((fn, work))

    def inline(self, fn) -> bool:
        """Runs fn on the calling thread and returns True where no op is pending (so it is
        next in post order; an op posted meanwhile by another thread waits for it); False,
        running nothing, where one is: submit it instead."""
        with self._lock:
            if self.pending:
                return False
            self.pending += 1
        try:
            with self._slot:
                fn()
        finally:
            self._done()
        return True

    def _done(self):
        with self._lock:
            self.pending -= 1

    def on_thread(self):
        return threading.current_thread() is self._thread

    def idle(self) -> bool:
        """Whether every op posted so far ran (so an op started now is next in post order)."""
        with self._lock:
            return not self.pending

    def drain(self):
        """Blocks until every op posted so far ran: at once when none is pending (no hand-off
        to the thread for nothing, which a CUDA op would pay on every call)."""
        if self._thread is not None and not self.on_thread() and not self.idle():
            w = EventWork(None)
            self.submit(lambda: None, w)
            w.wait()

    def close(self):
        self.closed = True
        t, self._thread = self._thread, None
        if t is not None:
            self._q.put(None)
            if t is not threading.current_thread():
                t.join(30)

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, work = item
            try:
                with self._slot:
                    fn()
                work._finish(None)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                work._finish(e)
            finally:
                self._done()
