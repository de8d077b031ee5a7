"""Host detection: which ranks of a group share a host (and so can link), published through
the group's store at creation with the settings every rank must share, and the one-host group
that linking them makes."""

from __future__ import annotations

import json
import os
import socket

from .. import _settings
from .._errors import DistBackendError
from ..backend import ProcessGroupGosym

HOST_ENV = "GOSYM_HOST_ID"
# GOSYM_HOST_ID=ranks-per-host:K: global rank g is on simulated host g // K (one environment
# for every process, as torch's own test suite spawns its ranks: tests/jobs/conformance)
_PER_HOST = "ranks-per-host:"


def host_id(global_rank=None) -> str:
    """This process's host as gosym's links see it: processes with the same id can link.
    Abstract Unix sockets do not cross network namespaces, and peers are authenticated by
    pid, which a pid namespace renumbers; GOSYM_HOST_ID, when set, is the id instead, or
    (ranks-per-host:K) names host global_rank // K."""
    env = _settings.host_id()
    if env.startswith(_PER_HOST):
        k = env[len(_PER_HOST):]
        if not k.isdigit() or int(k) < 1 or global_rank is None:
            raise ValueError(f"gosym: {HOST_ENV}={env}: ranks-per-host takes a whole number "
                             f"of ranks from 1 (and a group that knows its global ranks)")
        return f"{HOST_ENV}=host{global_rank // int(k)}"
    if env:
        return f"{HOST_ENV}={env}"
    parts = [socket.gethostname(), boot_id() or "no-boot-id"]
    for ns in ("net", "pid"):
        try:
            parts.append(f"{ns}:{os.stat(f'/proc/self/ns/{ns}').st_ino}")
        except OSError:
            parts.append(f"{ns}:?")
    return "/".join(parts)


def boot_id() -> str:
    """The running kernel's boot id ("" where it cannot be read): ranks that share it share a
    machine, whatever their hostnames and namespaces (gosym.hier.schedule.link)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def exchange(store, rank, size, timeout, name, settings, global_rank=None):
    """Every rank's (host_id(), settings, boot_id()), through the store, and this rank's key
    (deleted once every rank has read it). settings (name -> value, JSON) are what every
    rank must share: the caller compares them."""
    gen = store.add(f"gosym/hostgen/{rank}", 1)  # fresh keys per creation, as _endpoint's
    keys = [f"gosym/host/{gen}/{r}" for r in range(size)]
    store.set(keys[rank], json.dumps({"host": host_id(global_rank), "settings": settings,
                                      "boot": boot_id()}))
    try:
        store.wait(keys, timeout)
    except Exception as e:  # noqa: BLE001 - re-raised naming the ranks that are missing
        late = [r for r in range(size) if not store.check([keys[r]])]
        raise DistBackendError(f"gosym: group {name!r} (rank {rank} of {size}): ranks {late} did "
                               f"not publish their host id within {timeout} ({e})") from e
    seen = [json.loads(v) for v in store.multi_get(keys)]
    return [(s["host"], s["settings"], s.get("boot")) for s in seen], keys[rank]


def linked(store, rank, size, timeout, name, global_ranks, members, hid):
    """ProcessGroupGosym(...) over the ranks host detection put on one host (members, as
    ranks of the outer group); the connect proves it, and its failure says so."""
    try:
        return ProcessGroupGosym(store, rank, size, timeout, name, global_ranks)
    except Exception as e:
        if "connect" not in str(e):
            raise
        how = ("set by the operator" if hid.startswith(HOST_ENV) else
               "hostname/boot id/network and pid namespaces")
        raise DistBackendError(
            f"gosym: group {name!r}: host detection put ranks {members} on one host "
            f"({hid!r}, {how}), but gosym could not link them: they do not share a host "
            f"(or a network namespace) after all. Set {HOST_ENV} to one value per host. "
            f"({e})") from e

