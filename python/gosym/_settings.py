"""The GOSYM_* variables that python/gosym reads itself, parsed here and nowhere else.

The table of every GOSYM_* variable is gobackend/internal/config (docs/TUNABLES.md); it lists
these as read by python. GOSYM_DEBUG is read by both sides with the same meaning: "1" turns the
logs on, "0" or unset leaves them off. The engine refuses any other value when a group is
created, so Python reads anything but "1" as off and leaves the error to the engine.
"""

from __future__ import annotations

import os


def debug() -> bool:
    """GOSYM_DEBUG=1: debug logs to stderr."""
    return os.environ.get("GOSYM_DEBUG", "0") == "1"


def profiler_ranges() -> bool:
    """GOSYM_PROFILER_RANGES=0: ops record no gosym:<op> profiler ranges (gosym.profiling)."""
    return os.environ.get("GOSYM_PROFILER_RANGES", "1") != "0"


def library() -> str:
    """GOSYM_LIBRARY: path of the libgosym.so to load ("" for the package's own)."""
    return os.environ.get("GOSYM_LIBRARY", "")


def host_id() -> str:
    """GOSYM_HOST_ID: the host this rank is on ("" for the detected one)."""
    return os.environ.get("GOSYM_HOST_ID", "")


def whole(name: str, default: int, least: int) -> int:
    """A whole-number setting of python/gosym (GOSYM_HIER_*): default when unset, ValueError
    naming it when its value is not a whole number from least."""
    v = os.environ.get(name, "")
    if v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        n = least - 1
    if n < least:
        raise ValueError(f"gosym: {name}={v!r}: accepts a whole number from {least}")
    return n
