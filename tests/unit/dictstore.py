"""A store of a dict, for unit tests of code that only sets, checks and gets keys (what a group
across hosts reports after a failure)."""

from __future__ import annotations


class DictStore:
    def __init__(self, keys=None):
        self.keys = {k: v.encode() if isinstance(v, str) else v for k, v in (keys or {}).items()}

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def get(self, key):
        return self.keys[key]
