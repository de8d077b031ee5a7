"""torch's other call forms of the ProcessGroup methods, on gosym's process groups.

torch binds each ProcessGroup method with several overloads: beside the full form (tensor
lists and an options object) there are short ones, such as ``pg.allreduce(tensor)``,
``pg.allreduce(tensors, op)``, ``pg.broadcast(tensor, root)``, ``pg.reduce(tensor, root,
op)``, ``pg.allgather(outputs, tensor)`` and ``pg.barrier(timeout=...)``, which build the
options and call the full form. A process group written in Python overrides the method
itself, so a caller using a short form (DDP's join hook calls ``allreduce(tensor)``) reaches
the override with those arguments. accept(cls) wraps cls's op methods so that every form
torch binds arrives as the full one: a call already in the full form costs a few type checks
and a frame; any other is bound like pybind11 does it, trying the overloads in torch's order
(the first whose names and types fit), and a call that fits none raises TypeError listing the
forms.
"""

from __future__ import annotations

import datetime
import functools

import torch
from torch._C import _distributed_c10d as _c10d

_Tensor = torch.Tensor
_SEQ = (list, tuple)
_REDUCE = (_c10d.ReduceOp, _c10d.ReduceOp.RedOpType)


def _tensor_list(x):
    return isinstance(x, _SEQ) and all(isinstance(t, _Tensor) for t in x)


# What an argument of each kind may be.
KINDS = {
    "T": lambda x: isinstance(x, _Tensor),
    "L": _tensor_list,
    "LL": lambda x: isinstance(x, _SEQ) and all(_tensor_list(e) for e in x),
    "int": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "ints": lambda x: isinstance(x, _SEQ) and all(isinstance(e, int) for e in x),
    "op": lambda x: isinstance(x, _REDUCE),
    "timeout": lambda x: x is None or isinstance(x, datetime.timedelta),
}


# method -> (the full form's positional parameters as (torch's name, kind), before its options
# `opts` of the class given next), then the short forms: [(parameters as (name, kind, default
# or _REQUIRED)), builder of the full form's arguments].
_REQUIRED = object()
_SUM = _c10d.ReduceOp.SUM
_T = ("timeout", "timeout", None)


def _opts(cls, v, **fields):
    """An options object of cls with fields set, and the call's timeout where it gave one."""
    o = cls()
    for k, x in fields.items():
        setattr(o, k, x)
    if v.get("timeout") is not None:
        o.timeout = v["timeout"]
    return o


FORMS = {
    "allreduce": ((("tensors", "L"),), _c10d.AllreduceOptions, [
        ((("tensors", "L", _REQUIRED), ("op", "op", _SUM), _T),
         lambda v: (v["tensors"], _opts(_c10d.AllreduceOptions, v, reduceOp=v["op"]))),
        ((("tensor", "T", _REQUIRED), ("op", "op", _SUM), _T),
         lambda v: ([v["tensor"]], _opts(_c10d.AllreduceOptions, v, reduceOp=v["op"]))),
    ]),
    "broadcast": ((("tensors", "L"),), _c10d.BroadcastOptions, [
        ((("tensor", "T", _REQUIRED), ("root", "int", _REQUIRED), _T),
         lambda v: ([v["tensor"]], _opts(_c10d.BroadcastOptions, v, rootRank=v["root"],
                                            rootTensor=0))),
    ]),
    "reduce": ((("tensors", "L"),), _c10d.ReduceOptions, [
        ((("tensor", "T", _REQUIRED), ("root", "int", _REQUIRED), ("op", "op", _SUM), _T),
         lambda v: ([v["tensor"]], _opts(_c10d.ReduceOptions, v, rootRank=v["root"],
                                            rootTensor=0, reduceOp=v["op"]))),
    ]),
    "allgather": ((("output_tensors", "LL"), ("input_tensors", "L")), _c10d.AllgatherOptions, [
        ((("output_tensors", "L", _REQUIRED), ("input_tensor", "T", _REQUIRED), _T),
         lambda v: ([v["output_tensors"]], [v["input_tensor"]],
                    _opts(_c10d.AllgatherOptions, v))),
    ]),
    "gather": ((("output_tensors", "LL"), ("input_tensors", "L")), _c10d.GatherOptions, [
        ((("output_tensors", "L", _REQUIRED), ("input_tensor", "T", _REQUIRED),
          ("root", "int", _REQUIRED), _T),
         lambda v: ([v["output_tensors"]], [v["input_tensor"]],
                    _opts(_c10d.GatherOptions, v, rootRank=v["root"]))),
    ]),
    "scatter": ((("output_tensors", "L"), ("input_tensors", "LL")), _c10d.ScatterOptions, [
        ((("output_tensor", "T", _REQUIRED), ("input_tensors", "L", _REQUIRED),
          ("root", "int", _REQUIRED), _T),
         lambda v: ([v["output_tensor"]], [v["input_tensors"]],
                    _opts(_c10d.ScatterOptions, v, rootRank=v["root"]))),
    ]),
    "reduce_scatter": ((("output_tensors", "L"), ("input_tensors", "LL")), _c10d.ReduceScatterOptions, [
        ((("output", "T", _REQUIRED), ("input", "L", _REQUIRED), ("op", "op", _SUM), _T),
         lambda v: ([v["output"]], [v["input"]],
                    _opts(_c10d.ReduceScatterOptions, v, reduceOp=v["op"]))),
    ]),
    "alltoall_base": ((("output", "T"), ("input", "T"), ("output_split_sizes", "ints"),
                       ("input_split_sizes", "ints")), _c10d.AllToAllOptions, [
        ((("output", "T", _REQUIRED), ("input", "T", _REQUIRED),
          ("output_split_sizes", "ints", _REQUIRED), ("input_split_sizes", "ints", _REQUIRED), _T),
         lambda v: (v["output"], v["input"], v["output_split_sizes"], v["input_split_sizes"],
                    _opts(_c10d.AllToAllOptions, v))),
    ]),
    "barrier": ((), _c10d.BarrierOptions, [
        ((_T,), lambda v: (_opts(_c10d.BarrierOptions, v),)),
    ]),
}


def _bind(params, args, kwargs):
    """{name: value} of a call to the form params, or None where it does not fit."""
    if len(args) > len(params) or any(k not in {p[0] for p in params} for k in kwargs):
        return None
    got = {}
    for i, (name, kind, default) in enumerate(params):
        if i < len(args):
            if name in kwargs:
                return None
            v = args[i]
        elif name in kwargs:
            v = kwargs[name]
        elif default is _REQUIRED:
            return None
        else:
            got[name] = default
            continue
        if not (kind(v) if callable(kind) else KINDS[kind](v)):
            return None
        got[name] = v
    return got


def full_form(method, args, kwargs):
    """The full form's positional arguments of a call of method in any form torch binds."""
    params, opts_cls, shorts = FORMS[method]
    full = [(n, k, _REQUIRED) for n, k in params] + [("opts", lambda x: isinstance(x, opts_cls), opts_cls())]
    names = [n for n, _, _ in full]
    v = _bind(full, args, kwargs)
    if v is not None:
        return tuple(v[n] for n in names)
    for params, build in shorts:
        v = _bind(params, args, kwargs)
        if v is not None:
            return build(v)
    forms = [", ".join(names)] + [", ".join(p[0] for p in params) for params, _ in shorts]
    raise TypeError(f"gosym: {method}() takes one of the forms ({'), ('.join(forms)}); got "
                    f"({', '.join(type(a).__name__ for a in args)}"
                    + (f"; {', '.join(kwargs)}=" if kwargs else "") + ")")


def _full_check(kinds, opts_cls):
    """A cheap test that a positional call is the full form (the usual case)."""
    n = len(kinds)
    seqs = tuple(i for i, k in enumerate(kinds) if k in ("L", "LL", "ints"))
    tens = tuple(i for i, k in enumerate(kinds) if k == "T")

    def check(args):
        if not (len(args) == n or (len(args) == n + 1 and args[n].__class__ is opts_cls)):
            return False
        for i in seqs:
            if args[i].__class__ is not list and args[i].__class__ is not tuple:
                return False
        for i in tens:
            if not isinstance(args[i], _Tensor):
                return False
        return True

    return check


def _wrap(fn, method, hook):
    params, opts_cls, _ = FORMS[method]
    is_full = _full_check([k for _, k in params], opts_cls)
    if hook is None:
        def op(self, *args, **kwargs):
            if not kwargs and is_full(args):
                return fn(self, *args)
            return fn(self, *full_form(method, args, kwargs))

        return functools.update_wrapper(op, fn)
    enabled, ranged = hook

    def op(self, *args, **kwargs):  # the call forms and the profiler's range in one frame
        if kwargs or not is_full(args):
            args = full_form(method, args, kwargs)
        if enabled():
            return ranged(fn, self, args)
        return fn(self, *args)

    return functools.update_wrapper(op, fn)


def accept(cls, hook=lambda method: None):
    """Wraps the op methods cls defines so that each accepts every call form torch binds
    (module doc); those it inherits are wrapped where they are defined. hook(method) is
    gosym.profiling.hook: the method's range, recorded from the same wrapper (None: none)."""
    for method in FORMS:
        if method in cls.__dict__:
            setattr(cls, method, _wrap(cls.__dict__[method], method, hook(method)))
    return cls
