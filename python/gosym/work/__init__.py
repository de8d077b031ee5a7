"""Work objects of gosym's ops, one module per family:

- host: a host op posted to the engine (_Op, Work, work_of) and the thread that completes
  ops nobody waits on (Completer);
- cuda: a CUDA op, on its stream before its Work exists (CudaWork, cuda_work), and a CUDA
  send or recv on one of its group's internal streams (CudaSideWork);
- event: an op that a thread of gosym's finishes (EventWork);
- joined: several ops posted as one, done when all are (JoinedWork);

and what they share (common: dropped Works kept alive while C++ may use them).
"""

from __future__ import annotations

from .cuda import CudaSideWork, CudaWork, cuda_work
from .event import EventWork
from .joined import JoinedWork
from .host import Completer, Work, _Op, work_of  # noqa: F401 - _Op: gosym's own callers

__all__ = ["Completer", "CudaSideWork", "CudaWork", "EventWork", "JoinedWork", "Work", "cuda_work",
           "work_of"]
