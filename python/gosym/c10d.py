"""The group torch calls: gosym._c10d's C++ backend around a ProcessGroupGosym.

torch hands a Python ProcessGroup's ops to its Python methods, so an eager op on a Python
group pays torch's trampoline into Python and gosym's Python before the one native call.
Where the module is built for the running torch (gosym.build_c10d, run by `make lib`, or by
`python -m gosym.build_c10d` after pip install: gosym/_c10d<EXT_SUFFIX> and _c10d.torch, the
torch version it was built for) and
GOSYM_C10D is not 0, the creator hands torch a gosym._c10d.Group instead: torch builds its
own C++ ProcessGroup around it, and the Group runs the short path (one dense tensor or pair
on the group's CUDA device, or a synchronous dense host op: the Python short path's checks,
desc and native call, in C++) and hands everything else to the ProcessGroupGosym's method
of the same name. Where the module is absent, or built for another torch, torch gets the
ProcessGroupGosym itself, as before (said once where it was built but does not load).

The two share the Python group's two int64 cells (`_shared`): its endpoint (0 once shut
down) and its CUDA device (-1 before its first CUDA op, which takes the Python path). A
group across hosts (a HierGroup) gets gosym._c10d.Hier, whose short path is the flat group's
own op (NCCL's for CUDA tensors, Gloo's for host tensors of a synchronous op) where the
HierGroup's choice runs the op flat; it shares the HierGroup's cells (HierBase._cells:
open, pending, sequence number, CUDA device, counts).
"""

from __future__ import annotations

import ctypes
import pathlib
import warnings

import torch

from . import _lib, _settings
from ._dtypes import _PREMUL, _REDS, DTYPES
from ._unwrap import unwrap  # noqa: F401 - gosym.c10d.unwrap, as before

_state: dict = {}  # "module": gosym._c10d once loaded; "why": why it is not


def _fn(f) -> int:
    return ctypes.cast(f, ctypes.c_void_p).value


def module():
    """gosym._c10d, loaded once, or None (why() says why)."""
    if "module" in _state or "why" in _state:
        return _state.get("module")
    stamp = pathlib.Path(__file__).with_name("_c10d.torch")
    try:
        built = stamp.read_text().strip()
    except OSError:
        _state["why"] = "not built (python -m gosym.build_c10d, or make lib, builds it)"
        return None
    if built != torch.__version__:
        _state["why"] = f"built for torch {built}, running {torch.__version__}"
    else:
        try:
            from . import _c10d as m
        except ImportError as e:
            _state["why"] = f"does not load: {e}"
        else:
            m.set_wrapper(wrap)
            _state["module"] = m
            return m
    warnings.warn(f"gosym: the C++ backend (gosym._c10d) is {_state['why']}; groups run on "
                  f"the Python backend (build it with `python -m gosym.build_c10d`, or `make "
                  f"lib` in a checkout)", RuntimeWarning, stacklevel=2)
    return None


def why() -> str:
    """Why gosym._c10d is not in use ("" when it is)."""
    module()
    return _state.get("why", "")


def wrap(pg):
    """What torch gets for pg where the module loads and GOSYM_C10D is not 0: a
    gosym._c10d.Group around a ProcessGroupGosym; a gosym._c10d.Hier around a HierGroup
    (its flat ops on CUDA tensors and synchronous ones on host tensors in C++), except
    under TORCH_DISTRIBUTED_DEBUG=DETAIL, where the HierGroup compares every op's arguments
    itself and torch gets it as it is; else pg itself."""
    from .backend import ProcessGroupGosym  # backend never imports this module
    from .hier.lifetime import HierBase

    hier = isinstance(pg, HierBase)
    if not (hier or type(pg) is ProcessGroupGosym) or not _settings.c10d():
        return pg
    if hier and pg._check_args:
        return pg
    m = module()
    if m is None:
        return pg
    reds = [(key, code) for key, code in _REDS.items() if code != _PREMUL]
    args = (pg, pg.rank(), pg.size(), ctypes.addressof(pg._shared), _fn(_lib.op_run),
            _fn(_lib.endpoint_device_error), list(DTYPES.items()), reds,
            pg._timeout.total_seconds())
    if not hier:
        return m.Group(*args)
    from .hier import schedule
    from .hier.tensors import _WIRE

    steps = [schedule.steps(dev, op, pg._shape, pg._choice, link_key=pg._link)
             for dev in ("cuda", "cpu") for op in schedule.FLAT_OPS]  # Hier's places' order
    return m.Hier(*args, ctypes.addressof(pg._cells), sorted(_WIRE, key=str), steps,
                  pg._a2a_blocks_max())
