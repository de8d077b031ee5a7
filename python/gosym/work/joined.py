"""The Work of several ops posted as one (JoinedWork): a coalesced call that a group runs as
one op per tensor, whose ops may take different paths (across hosts: one flat on the inner
group's threads, the next on gosym's worker), so the last one's Work says nothing of the
others. Also the Work of one inner group's op whose failure the group tells in its own words
(a send or receive across hosts: the lost rank named, as for a collective)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .common import _ZERO, _keep


class JoinedWork(dist._Work):
    """Done when every one of works (the ops' Works) is: wait() waits for each in post
    order (on CUDA each makes the current stream wait for its op), its future completes
    with out once every op's has, with the first failure if any failed; named(e), where
    given, is the error raised for an op's failure e (called once: later failures raise
    what it returned)."""

    def __init__(self, works, out, named=None):
        super().__init__()
        self._works, self._out, self._fut = list(works), out, None
        self._named, self._error = named, None

    def _name(self, e):
        if self._named is None:
            return e
        if self._error is None:
            self._error = self._named(e)
        return self._error

    def _raise(self, e):
        named = self._name(e)
        if named is e:
            raise e
        raise named from e

    def wait(self, timeout=_ZERO):
        for w in self._works:
            try:
                w.wait(timeout) if timeout else w.wait()
            except Exception as e:
                self._raise(e)
        return True

    def synchronize(self):
        self.wait()

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def exception(self):
        for w in self._works:
            e = w.exception() if w.is_completed() else None
            if e is not None:
                return self._name(e)
        return None

    def result(self):
        return self._out

    def get_future(self):
        if self._fut is None:
            out = self._out

            def value(all_done):
                try:
                    for f in all_done.value():  # collect_all's own fails with the first
                        f.value()  # the first failure raises
                except Exception as e:
                    self._raise(e)
                return out
            self._fut = torch.futures.collect_all([w.get_future() for w in self._works]).then(value)
        return self._fut

    def _source_rank(self):
        """A receive from any source's sender (its one op's)."""
        return self._works[0]._source_rank()

    def __del__(self):
        # as EventWork's: C++ may still wait through this object (common._UNWAITED)
        _keep(self)
