"""The Work of several ops posted as one (JoinedWork): a coalesced call that a group runs as
one op per tensor, whose ops may take different paths (across hosts: one flat on the inner
group's threads, the next on gosym's worker), so the last one's Work says nothing of the
others."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .common import _ZERO, _keep


class JoinedWork(dist._Work):
    """Done when every one of works (the ops' Works) is: wait() waits for each in post
    order (on CUDA each makes the current stream wait for its op), its future completes
    with out once every op's has, with the first failure if any failed."""

    def __init__(self, works, out):
        super().__init__()
        self._works, self._out, self._fut = list(works), out, None

    def wait(self, timeout=_ZERO):
        for w in self._works:
            w.wait(timeout) if timeout else w.wait()
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
                return e
        return None

    def result(self):
        return self._out

    def get_future(self):
        if self._fut is None:
            out = self._out

            def value(all_done):
                for f in all_done.value():
                    f.value()  # the first failure raises
                return out
            self._fut = torch.futures.collect_all([w.get_future() for w in self._works]).then(value)
        return self._fut

    def __del__(self):
        # as EventWork's: C++ may still wait through this object (common._UNWAITED)
        _keep(self)
