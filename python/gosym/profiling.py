"""gosym:<op> ranges in torch's profilers (torch.profiler and torch.autograd.profiler), as gloo
and NCCL record theirs ("gloo:all_reduce"): one range per op, named like gloo's, with the op's
input tensors (their shapes show when the profiler records shapes), marked async.

instrument(cls) wraps the process group's op methods; those with call forms of their own get
their range from gosym.forms' wrapper (hook), in its frame. While no profiler runs, a call costs
one check of torch's profiler flag (torch._C._autograd._profiler_enabled), plus a frame for
the methods instrument wraps itself.
While one runs, the range starts at the call and ends when the op is done: for an op that is
done when the method returns (a synchronous host op, a CUDA op enqueued on its stream) at
once, else when its Work completes (Work.wait() waits for the range to be closed).

torch marks a backend's range async (FunctionEvent.is_async, which the profilers and torch's
own tests rely on) in C++ only; from Python a range is async when it ends on another thread
than it started on. So every range is ended through a torch Future completed on another
thread (this module's closer thread; for a pending Work, once the Work completed), whose end
callback runs with the caller's profiler state (torch propagates it to Future callbacks). Ops that a profiled op makes internally (a sparse all_reduce's all_gathers) do not
get ranges of their own.
"""

from __future__ import annotations

import functools
import queue
import threading

import torch

from . import _settings

_enabled = torch._C._autograd._profiler_enabled
_enter = torch._C._autograd._record_function_with_args_enter

# method -> (title after "gosym:", index of the argument holding the input tensors, or a
# function of the arguments that returns them). Titles are gloo's.
_FIRST = 0
_SECOND = 1
OPS = {
    "allreduce": ("all_reduce", _FIRST),
    "allreduce_coalesced": ("all_reduce", _FIRST),
    "broadcast": ("broadcast", _FIRST),
    "reduce": ("reduce", _FIRST),
    "allgather": ("all_gather", _SECOND),
    "allgather_coalesced": ("all_gather", _SECOND),
    "_allgather_base": ("all_gather_into_tensor", lambda a: [a[1]]),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", _SECOND),
    "reduce_scatter": ("reduce_scatter", lambda a: list(a[1][0]) if a[1] else []),
    "_reduce_scatter_base": ("reduce_scatter_tensor", lambda a: [a[1]]),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", _SECOND),
    "alltoall_base": ("all_to_all", lambda a: [a[1]]),
    "alltoall": ("all_to_all", _SECOND),
    "gather": ("gather", _SECOND),
    "scatter": ("scatter", lambda a: list(a[1][0]) if a[1] else []),
    "send": ("send", _FIRST),
    "recv": ("recv", _FIRST),
    "recv_anysource": ("recvAnySource", _FIRST),
    "barrier": ("barrier", lambda a: []),
    "monitored_barrier": ("monitored_barrier", lambda a: []),
}

_local = threading.local()  # .busy: inside a profiled op on this thread
_closer_q: queue.SimpleQueue | None = None
_closer_lock = threading.Lock()


def _close_loop(q):
    while True:
        q.get().set_result(None)


def _closer():
    """The queue of the thread that completes the futures ending synchronous ops' ranges."""
    global _closer_q
    with _closer_lock:
        if _closer_q is None:
            q = queue.SimpleQueue()
            threading.Thread(target=_close_loop, args=(q,), name="gosym-profiling",
                             daemon=True).start()
            _closer_q = q
    return _closer_q


def _end_on(rec, fut):
    """A Future done once fut is and rec's range is closed (on the thread completing fut)."""
    return torch.ops.profiler._call_end_callbacks_on_jit_fut(rec, fut)


def _end_later(rec):
    """(fut, closed): completing fut has the closer thread close rec's range; closed is done
    once it is."""
    fut = torch.futures.Future()
    return fut, _end_on(rec, fut)


def _end_now(rec) -> None:
    """Closes rec's range on the closer thread, and waits until it is closed."""
    fut, closed = _end_later(rec)
    _closer().put(fut)
    closed.wait()


def _tensors(args, pick):
    got = args[pick] if isinstance(pick, int) else pick(args)
    if isinstance(got, torch.Tensor):
        return [got]
    return [t for t in got if isinstance(t, torch.Tensor)]


def _profiled(fn, pg, args, kwargs, title, pick):
    """fn(pg, *args, **kwargs) inside a gosym:<title> range (see the module doc)."""
    if getattr(_local, "busy", False):
        return fn(pg, *args, **kwargs)
    rec = _enter(title, *_tensors(args, pick))
    _local.busy = True
    try:
        work = fn(pg, *args, **kwargs)
    except BaseException:
        _local.busy = False
        _end_now(rec)
        raise
    _local.busy = False
    op = getattr(work, "_op", None)  # a host Work (work.Work), else done on the host
    if op is None or op.done:
        _end_now(rec)
    else:  # whichever thread finishes the op hands the range to the closer thread
        fut, op.closed = _end_later(rec)  # Work.wait() waits for it
        q = _closer()
        work.get_future().add_done_callback(lambda _: q.put(fut))
    return work


def _wrap(fn, method):
    enabled, ranged = hook(method)

    def op(self, *args, **kwargs):  # torch passes monitored_barrier's arguments by name
        if not enabled():
            return fn(self, *args, **kwargs)
        return ranged(fn, self, args, kwargs)

    return functools.update_wrapper(op, fn)


def hook(method):
    """The range of op method for a wrapper (instrument's, or gosym.forms', which puts its
    call forms and the range in one frame): None where method records none (not one of OPS,
    or GOSYM_PROFILER_RANGES=0), else (enabled, ranged): enabled() says whether a profiler
    runs (the wrapper's one check while none does), ranged(fn, pg, args, kwargs) runs
    fn(pg, *args, **kwargs) inside the range."""
    if method not in OPS or not _settings.profiler_ranges():
        return None
    title, pick = OPS[method]
    title = f"gosym:{title}"

    def ranged(fn, pg, args, kwargs=None):
        # a group whose ops are steps of another group's op (a HierGroup's local group,
        # called on its runner thread) records no range of its own
        if getattr(pg, "_gosym_inner", False):
            return fn(pg, *args, **(kwargs or {}))
        return _profiled(fn, pg, args, kwargs or {}, title, pick)

    return _enabled, ranged


def instrument(cls, skip=()):
    """Wraps cls's op methods (OPS) but those in skip (wrapped with hook by another module)
    so that each records its gosym:<op> range; with GOSYM_PROFILER_RANGES=0 leaves them
    alone (no ranges, and not the wrapper's cost)."""
    if not _settings.profiler_ranges():
        return cls
    for name in OPS:
        if name not in skip:
            setattr(cls, name, _wrap(getattr(cls, name), name))
    return cls
