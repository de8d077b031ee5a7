"""torch.compile never traces gosym's own frames.

A Python ProcessGroup's methods run whenever a compiled program reaches a collective, DDP's
reducer in a compiled backward included, and Dynamo compiles every Python frame it meets
under torch.compile as if it were user code: record_stream then fails functionalization
(a compiled DDP model failed so on CUDA), and each bucket size would recompile. NCCL's and
Gloo's methods are C++, which Dynamo never enters; gosym's package directory goes on
Dynamo's skip list (trace_rules.add, as a third-party library's) to the same effect: its
frames run as written, and a compiled function that calls into gosym breaks its graph there.
Importing Dynamo costs ~0.7 s, so the entry is made when Dynamo's trace rules are first
imported (a one-shot import hook), or at once when they already are.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_RULES = "torch._dynamo.trace_rules"


def _skip(rules) -> None:
    try:
        rules.add(__package__)
    except Exception as e:  # noqa: BLE001 - a torch without the hook keeps working, traced
        print(f"gosym: could not keep torch.compile out of gosym ({e!r})", file=sys.stderr)


class _OnRulesImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when Dynamo's trace rules are imported, it wraps their loader
    so that gosym is added once they are loaded, and leaves sys.meta_path."""

    def find_spec(self, name, path, target=None):
        if name != _RULES:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _skip(module)

        spec.loader.exec_module = exec_module
        return spec


def keep_dynamo_out() -> None:
    """Puts gosym on Dynamo's skip list now or when Dynamo loads (idempotent)."""
    rules = sys.modules.get(_RULES)
    if rules is not None:
        _skip(rules)
    elif not any(isinstance(f, _OnRulesImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnRulesImport())
