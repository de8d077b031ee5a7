"""The GOSYM_* variables that python/gosym reads itself, parsed here and nowhere else.

The table of every GOSYM_* variable is gobackend/internal/config (docs/TUNABLES.md); it lists
these as read by python. GOSYM_DEBUG is read by both sides with the same meaning: "1" turns the
logs on, "0" or unset leaves them off. The engine refuses any other value when a group is
created, so Python reads anything but "1" as off and leaves the error to the engine.

The GOSYM_HIER_* settings (whole numbers, and GOSYM_HIER_CHOICE's words) take their defaults
and limits from the table, through _table (generated from it by scripts/gen_settings.py).
They choose a group's algorithms across hosts, so every rank of a group must use the same: gosym.factory compares
them at group creation (agree), as the engine compares the settings it shares at connect.
"""

from __future__ import annotations

import os

from . import _table


def debug() -> bool:
    """GOSYM_DEBUG=1: debug logs to stderr."""
    return os.environ.get("GOSYM_DEBUG", "0") == "1"


def profiler_ranges() -> bool:
    """GOSYM_PROFILER_RANGES=0: ops record no gosym:<op> profiler ranges (gosym.profiling)."""
    return os.environ.get("GOSYM_PROFILER_RANGES", "1") != "0"


def c10d() -> bool:
    """GOSYM_C10D=0: torch gets the Python group itself, not gosym._c10d's C++ backend."""
    return os.environ.get("GOSYM_C10D", "1") != "0"


def library() -> str:
    """GOSYM_LIBRARY: path of the libgosym.so to load ("" for the package's own)."""
    return os.environ.get("GOSYM_LIBRARY", "")


def host_id() -> str:
    """GOSYM_HOST_ID: the host this rank is on ("" for the detected one)."""
    return os.environ.get("GOSYM_HOST_ID", "")


def whole(name: str) -> int:
    """A whole-number setting of python/gosym (GOSYM_HIER_*): the table's default when unset,
    ValueError naming it when its value is not a whole number from the table's least."""
    default, least = _table.WHOLE[name]
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


def word(name: str) -> str:
    """A setting of python/gosym that takes one of a few words (GOSYM_HIER_CHOICE): the
    table's default when unset, ValueError naming it and the words when it is another."""
    default, words = _table.WORDS[name]
    v = os.environ.get(name, "")
    if v == "":
        return default
    if v not in words:
        raise ValueError(f"gosym: {name}={v!r}: accepts one of {', '.join(words)}")
    return v


HIER = tuple(name for name in (*_table.WHOLE, *_table.WORDS) if name.startswith("GOSYM_HIER_"))


def hier() -> dict[str, int | str]:
    """Every GOSYM_HIER_* setting, name -> value (ValueError naming a bad one)."""
    return {name: whole(name) if name in _table.WHOLE else word(name) for name in HIER}


def agree(rank: int, theirs: dict, mine: dict) -> None:
    """ValueError naming the first of this rank's settings (mine, name -> value) that rank
    `rank` has another value of (theirs), with both values: every rank of a group must use
    the same (the engine's words for the settings it agrees at connect)."""
    for name, v in mine.items():
        t = theirs.get(name, "(unset: another gosym version?)")
        if t != v:
            raise ValueError(f"gosym: rank {rank} has {name}={t}, this rank {name}={v}: every "
                             "rank of a group must use the same")
