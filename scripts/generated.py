"""The write-or-check step of the scripts that generate a committed file (gen_settings.py,
hier_table.py). Standard library only."""

from __future__ import annotations

import pathlib
import sys


def write_or_check(out: pathlib.Path, want: str, check: bool, refresh: str,
                   repo: pathlib.Path) -> int:
    """check: 1 (saying how to refresh it) when out is not want, else 0; otherwise writes want
    to out where it differs, and returns 0."""
    have = out.read_text() if out.exists() else ""
    if check:
        if have != want:
            print(f"{out.relative_to(repo)} is stale: run {refresh}", file=sys.stderr)
            return 1
        return 0
    if have != want:
        out.write_text(want)
    return 0
