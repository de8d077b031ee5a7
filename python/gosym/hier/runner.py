"""The thread that runs a HierGroup's host-side ops in post order."""

from __future__ import annotations

import queue
import threading

from ..work import EventWork


class Runner:
    """The thread that runs a HierGroup's host-side ops one after another, in post order:
    every rank posts the inner groups' ops in the same order, whatever its caller does
    meanwhile (torch's async Work, DDP's overlap)."""

    def __init__(self, name):
        self._name = name
        self._q = queue.SimpleQueue()
        self._thread = None

    def submit(self, fn, work):
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"gosym-hier-{self._name}",
                                            daemon=True)
            self._thread.start()
        self._q.put((fn, work))

    def on_thread(self):
        return threading.current_thread() is self._thread

    def drain(self):
        """Blocks until every op posted so far ran."""
        if self._thread is not None and not self.on_thread():
            w = EventWork(None)
            self._q.put((lambda: None, w))
            w.wait()

    def close(self):
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
                fn()
                work._finish(None)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                work._finish(e)

