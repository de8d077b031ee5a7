"""What the three Work families share: dropped Works kept alive while C++ may still use them,
and settling a torch Future."""

from __future__ import annotations

import collections
from datetime import timedelta

_ZERO = timedelta(0)
# Works that Python dropped before anyone waited on them or took their future (EventWorks:
# any dropped one, see _keep), kept a while longer: C++ may still hold one (DDP keeps the
# Work of its join all_reduce, made in the forward pass, to wait on and read in the backward
# pass). torch reaches a Work written in
# Python only while its Python object lives (pybind11 looks the methods up on it); once it
# is gone, torch's base Work::wait() waits forever. __del__ puts such a Work here, which
# revives it until this many later ones pushed it out.
_UNWAITED = collections.deque(maxlen=64)


def _keep_unwaited(w) -> None:
    """Keeps w (being finalized) alive while C++ may use it (see _UNWAITED)."""
    if not getattr(w, "_waited", False):
        _keep(w)


def _keep(w) -> None:
    """Keeps w (being finalized) alive a while, waited or not: C++ also waits through the
    Python object and may use it after (DDP's reducer waits on its join Work in the backward
    pass, then takes its future)."""
    try:
        _UNWAITED.append(w)
    except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to use it
        pass


def _settle(fut, out, exc):
    """Sets fut to out, or to the exception exc."""
    if exc is None:
        fut.set_result(out)
    else:
        fut.set_exception(exc)
