"""The choice between a HierGroup's hierarchical schedule and its flat group, per op
(docs/ARCHITECTURE.md, "Hierarchical or flat").

An op with a hierarchical schedule runs it, or the inter-host engine's own op (Gloo, NCCL) on
the group's flat inner group over every rank, as choose() says for its device type, its size
(the bytes of one rank's input, as gosym.bench counts them), the group's shape, the link
between its hosts (link()) and GOSYM_HIER_CHOICE. With "table" (the default) the answer comes
from the measurements in gosym.hier.measured, the entry of the group's link or else the
other link's; a (device type, shape) or an op they do not cover runs flat. Every input is
the same on every rank, and so is the answer.

entry() turns a gosym.bench report into a table entry (scripts/hier_table.py writes
gosym.hier.measured with it).
"""

from __future__ import annotations

import hashlib
import json
import statistics

from .measured import TABLE

HIER, FLAT = "hier", "flat"
MODES = ("table", HIER, FLAT)  # GOSYM_HIER_CHOICE's words
# The links an entry is measured on (GOSYM_HIER_LINK's words but auto): hosts of one machine,
# whose traffic between them is memory copies, and hosts joined by a link slower than memory.
LOOPBACK, NETWORK = "loopback", "network"
LINKS = (LOOPBACK, NETWORK)
# The ops that have a hierarchical schedule, by their gosym.bench names; the list forms and
# all_reduce_coalesced take their tensor form's points (all_to_all_single: of equal splits
# on host tensors in the host-blocks layout only; every other all_to_all runs flat).
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce",
       "all_to_all_single")
# The ops a report measured as themselves where it does not say (gosym.bench records its
# build's OPS as "hier_ops" since session 30, when all_to_all_single got its schedule: before,
# a hierarchical backend's all_to_all_single ran flat, and its points say nothing).
_OPS_BEFORE_RECORDED = OPS[:5]
# The ops a HierGroup may run flat from C++ (gosym._c10d.Hier), in its order: its cells count
# each one's flat ops, and its steps come in this order.
FLAT_OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
            "all_to_all_single")
# ops whose schedule runs on some device types only (elsewhere they always run flat)
_ONLY_ON = {"all_to_all_single": ("cpu",)}


def ops_for(device: str) -> list[str]:
    """The ops of OPS that have a schedule across hosts for tensors on device."""
    return [op for op in OPS if device in _ONLY_ON.get(op, (device,))]


def shape(counts) -> str:
    """A group's shape from its hosts' rank counts (host order): "HxN" for H hosts of N ranks
    each, else the counts joined by "+" ("1+2")."""
    counts = [int(c) for c in counts]
    if not counts or min(counts) < 1:
        raise ValueError(f"gosym: a group's shape needs hosts of at least one rank, got {counts}")
    if len(set(counts)) == 1:
        return f"{len(counts)}x{counts[0]}"
    return "+".join(map(str, counts))


def link(boots, setting: str = "auto") -> str:
    """The link between a group's hosts under GOSYM_HIER_LINK setting, from every rank's
    boot id (gosym.hier.hosts.boot_id; "" or None where unknown): with "auto", LOOPBACK where
    all are one known id (one kernel: hosts simulated by namespaces or host ids, whose
    traffic between them is memory copies), else NETWORK."""
    if setting in LINKS:
        return setting
    if setting != "auto":
        raise ValueError(f"gosym: GOSYM_HIER_LINK={setting!r}: accepts one of auto, "
                         f"{', '.join(LINKS)}")
    boots = set(boots)
    return LOOPBACK if len(boots) == 1 and all(boots) else NETWORK


def choose(device: str, op: str, nbytes: int, shape_key: str, mode: str = "table",
           table=None, *, link_key: str) -> str:
    """HIER or FLAT for op (one of OPS) of nbytes on a group of shape_key whose tensors are
    on device ("cpu" or "cuda") and whose hosts are joined by link_key (LINKS), under
    GOSYM_HIER_CHOICE mode. With "table": the point of the op's entry (of link_key, else of
    the other link) at the largest measured size <= nbytes (the smallest one below it), HIER
    where the hierarchical schedule's time was below the flat op's there; FLAT where the
    table has no entry for (device, shape_key) or no points for op."""
    if op not in OPS:
        raise ValueError(f"gosym: no hierarchical schedule to choose for op {op!r}")
    if _mode(mode) != "table":
        return mode
    points = _points(device, op, shape_key, table, link_key)
    if not points:
        return FLAT
    pick = points[0]
    for p in points:
        if p[0] <= nbytes:
            pick = p
    _, hier_us, flat_us = pick
    return HIER if hier_us < flat_us else FLAT


def steps(device: str, op: str, shape_key: str, mode: str = "table",
          table=None, *, link_key: str) -> list[tuple[int, bool]]:
    """choose() for op on device as a step function, for gosym._c10d.Hier, which makes the
    choice in C++: [(bytes, flat), ...] by size, where an op of nbytes takes the step at the
    largest bytes <= nbytes (the first step below them all); [] for flat at every size.
    (all_to_all_single asks the choice only where its host-blocks layout applies; Hier
    knows where, as HierAlgorithms._a2a_applies.)"""
    if _mode(mode) != "table":
        return [(0, mode == FLAT)]
    points = _points(device, op, shape_key, table, link_key)
    if not points:
        return []
    return [(p[0], not p[1] < p[2]) for p in points]


def _mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"gosym: GOSYM_HIER_CHOICE={mode!r}: accepts one of {', '.join(MODES)}")
    return mode


def _points(device, op, shape_key, table, link_key):
    """The table's points for op on (device, shape_key) over link_key, else over the other
    link (a measured shape says more than none), None where neither has them."""
    t = TABLE if table is None else table
    other = NETWORK if link_key == LOOPBACK else LOOPBACK  # per op: no sort, no generator
    for lk in (link_key, other):
        got = t.get((device, shape_key, lk))
        if got and op in got["ops"]:
            return got["ops"][op]
    return None


def digest(table=None) -> str:
    """A short digest of the table, which every rank of a group must share (gosym.factory
    compares it with the GOSYM_HIER_* settings at creation)."""
    t = TABLE if table is None else table
    text = json.dumps(sorted((list(k), v) for k, v in t.items()), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def entry(reports, hier: str, flat: str, hosts=None,
          link_key: str = LOOPBACK) -> tuple[tuple[str, str, str], dict]:
    """((device, shape, link_key), entry) of the table from gosym.bench reports (JSON) of one
    device type and shape, measured over link_key (LINKS), reports being (file, report) pairs,
    in which backend `hier` ran the
    hierarchical schedule and `flat` the op flat over the same ranks (gosym-flat: gosym's
    flat path, what choosing flat costs; or, where that was not measured, the inter-host
    engine's own group). The entry:
    {"sources": the files, "hier": hier, "flat": flat, "ops": op -> points}: for each op of
    OPS that both measured without error (and that the report's build had a schedule for:
    its "hier_ops"), the points (bytes of one rank's input, hier us, flat us) by size, each
    the median over the reports that measured the op of their medians (several runs, where
    one disturbed run must not decide; a later job that measured some ops again adds its
    runs to theirs and leaves the others' points as they were); a size one of those reports
    lacks is left out. The shape comes from the
    reports' "hosts" (ranks per host: gosym.bench records them for a group across hosts),
    else from hosts (for reports from before it did); a report that records its group's
    "link" must have been over link_key."""
    if link_key not in LINKS:
        raise ValueError(f"an entry's link is one of {LINKS}, got {link_key!r}")
    keys, runs = set(), []
    for source, report in reports:
        named = report.get("hosts")
        if named and hosts and list(named) != list(hosts):
            raise ValueError(f"{source}: the report's hosts {named} are not {list(hosts)}")
        if not (named or hosts):
            raise ValueError(f"{source}: the report names no hosts (gosym.bench records them "
                             "for a group across hosts): give them with the source")
        recorded = report.get("link")  # gosym.bench records the group's from session 50
        if recorded and recorded != link_key:
            raise ValueError(f"{source}: the report's group was over a {recorded} link, not "
                             f"{link_key}")
        keys.add((report["config"]["device"], shape(named or hosts), link_key))
        scheduled = report.get("hier_ops") or _OPS_BEFORE_RECORDED
        runs.append({(r["backend"], r["op"], r["size"]): r["median_us"]
                     for r in report["results"]
                     if r.get("backend") in (hier, flat) and "error" not in r
                     and r["op"] in scheduled})
    if len(keys) != 1:
        raise ValueError(f"one entry's reports must share a device type and shape, got "
                         f"{sorted(keys)}")
    ops = {}
    for op in OPS:
        have = [m for m in runs if any(o == op for _, o, _ in m)]
        sizes = sorted({s for b, o, s in have[0] if o == op}) if have else []
        pts = tuple((s, _median(have, (hier, op, s)), _median(have, (flat, op, s)))
                    for s in sizes if all((b, op, s) in m for m in have for b in (hier, flat)))
        if pts:
            ops[op] = pts
    sources = [source for source, _ in reports]
    if not ops:
        raise ValueError(f"{sources}: no op measured on both {hier!r} and {flat!r}")
    return keys.pop(), {"sources": sources, "hier": hier, "flat": flat, "ops": ops}


def worst(entries) -> dict:
    """One entry from entries (entry()'s dicts) of one device type, shape and link measured
    at several link rates, one entry a rate: per op that all measured, at each size all
    measured, the point of the rate where the hierarchical schedule fared worst against the
    flat op (the largest hier / flat), so that the choice takes it only where it won at
    every rate measured."""
    first = entries[0]
    if any((e["hier"], e["flat"]) != (first["hier"], first["flat"]) for e in entries):
        raise ValueError("the rates' entries must compare the same backends")
    ops = {}
    for op in first["ops"]:
        by_size = [{p[0]: p for p in e["ops"].get(op, ())} for e in entries]
        sizes = sorted(set(by_size[0]).intersection(*by_size[1:]))
        pts = tuple(max((m[s] for m in by_size), key=lambda p: p[1] / p[2]) for s in sizes)
        if pts:
            ops[op] = pts
    return {"sources": [f for e in entries for f in e["sources"]], "hier": first["hier"],
            "flat": first["flat"], "ops": ops}


def _median(runs, key):
    return round(statistics.median(m[key] for m in runs), 1)
