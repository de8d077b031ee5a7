#!/usr/bin/env python3
"""Writes python/gosym/hier/measured.py: the table of measurements from which a group across
hosts chooses between its hierarchical schedule and its flat group (gosym.hier.schedule;
docs/ARCHITECTURE.md, "Hierarchical or flat"), one entry per results file in SOURCES.

A new entry: measure the shape with the hierarchical schedule and the inter-host engine in
one job, e.g. on simulated hosts

    python tests/jobs/hier/simhosts.py --hosts 2,2 -- python -m gosym.bench \
        --backends gosym-hier,gloo --ops all_reduce,all_gather_into_tensor,... --json FILE

commit FILE under docs/results/, add it to SOURCES, and run (with the development venv's
python: it imports gosym):

    PYTHONPATH=python python scripts/hier_table.py           # rewrite measured.py
    PYTHONPATH=python python scripts/hier_table.py --check   # exit 1 when it is stale

The unit tests run --check, so the table always says what its files say.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from generated import write_or_check

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "python" / "gosym" / "hier" / "measured.py"

# One entry each: (results files of one device type and shape, the backend in them that ran
# the hierarchical schedule, the one that ran the op flat over the same ranks (gosym-flat:
# gosym's flat path, what choosing flat costs; else the inter-host engine's own group), the
# ranks per host where the files do not say, the link the hosts were joined by: loopback for
# hosts simulated on one machine, network for a link slower than memory). Several files of
# one entry: runs of the same command, each point the median of theirs. A list of such lists:
# the runs at each of several link rates, each point the one of the rate where the
# hierarchical schedule fared worst against flat (schedule.worst: hierarchical only where it
# won at every rate).
SOURCES = [
    # Session 26, 4xH200: two "hosts" of 2 GPUs each in network namespaces (simhosts.py
    # --gpus; NCCL over sockets between), `scripts/device_cuda.sh hostbench`: gosym-hier
    # against gosym-flat (NCCL over the four ranks through gosym's Python layer) at nine
    # sizes, one run. It replaced session 17's 4xH100 entry (four sizes, "gosym" then always
    # hierarchical, against NCCL's own group: 2026-11-27-s17-hier-cuda-2x2-hostid-4xH100.json).
    (["docs/results/2026-11-28-s26-hier-cuda-2x2-simhosts-4xH200.json"], "gosym-hier", "gosym-flat",
     None, "loopback"),
    # Host tensors on the 16-core host of the GPU machine, quiet: two or three hosts told apart
    # by id (simhosts.py's IdHosts; Gloo over loopback between them), `GOSYM_HIER_STEPS=0
    # GOSYM_CPUHOST_SIZES=1K,4K,16K,64K,256K,1M,4M,16M,64M,256M scripts/device_cuda.sh
    # cpuhostbench` with the shapes 2,2 (two runs) and 2,2,2 (one) in one call, 4,4 (two) in
    # the next and 2,2,2 and 2,2 (one each) in a third of one lease: gosym-hier against
    # gosym-flat (Gloo over every rank through gosym's C++ group), every op at ten sizes, the
    # backends of a case in turns of 5 samples (--interleave 5) in gosym.bench.turn_order,
    # where every backend follows every backend equally often, all of one build (session 49).
    # They replaced session 48's runs (docs/results/2026-12-03-s48-hier-cpu-*), whose turns
    # rotated, so gosym-flat still followed gosym-hier in two turns of three, and session
    # 47's, where it always did; whatever follows gosym-hier pays for its idle threads
    # (docs/BENCHMARKS.md, session 48).
    ([f"docs/results/2026-12-03-s49-hier-cpu-2x2-idhosts-16core-run{i}.json" for i in (1, 2, 3)],
     "gosym-hier", "gosym-flat", None, "loopback"),
    ([f"docs/results/2026-12-03-s49-hier-cpu-2x4-idhosts-16core-run{i}.json" for i in (1, 2)],
     "gosym-hier", "gosym-flat", None, "loopback"),
    ([f"docs/results/2026-12-03-s49-hier-cpu-3x2-idhosts-16core-run{i}.json" for i in (1, 2)],
     "gosym-hier", "gosym-flat", None, "loopback"),
    # Host tensors on this 2-core VM, hosts in network namespaces on one switch
    # (tests/jobs/hier/simhosts.py: a bridge in a namespace of its own), every host's link
    # shaped each way (--link-mbit: a host's ranks share a link slower than their memory, as
    # between real hosts, and two hosts sending to a third share its rate), at 2 and at 10
    # Gbit/s, `simhosts.py --hosts 2,2 --link-mbit 2000 -- python -m gosym.bench --device cpu
    # --backends gosym-hier,gosym-flat,gloo --ops all_reduce,all_gather_into_tensor,
    # reduce_scatter_tensor,broadcast,all_to_all_single --sizes 16K,256K,1M,4M,16M
    # --target-time 0.3 --min-iters 5 --interleave 5`: every shape three runs at each rate
    # (session 50, main at 3f4140a and 27ca546, the same ops). Each point is the rate's where
    # the hierarchical schedule fared worst (schedule.worst): where what crosses between
    # hosts bounds the op it wins points the loopback entries above run flat (all_reduce at
    # 1 MiB), and at 10 Gbit/s, near this VM's loopback TCP, it loses or ties some it wins
    # at 2 (docs/BENCHMARKS.md, sessions 49 and 50). They replaced session 49's runs of two
    # hosts joined by one veth pair (docs/results/2026-12-03-s49-hier-cpu-*-netns-*).
    *(([[f"docs/results/2026-12-03-s50-hier-cpu-{sh}-netns-{r}mbit-vm-run{i}.json" for i in (1, 2, 3)]
        for r in (2000, 10000)], "gosym-hier", "gosym-flat", None, "network")
      for sh in ("2x2", "2x4", "3x2")),
]

HEAD = '''"""Generated by scripts/hier_table.py from the results files it lists; DO NOT EDIT. Refresh:
PYTHONPATH=python python scripts/hier_table.py

The measurements gosym.hier.schedule chooses from (schedule.entry says what an entry holds)."""

'''


def render(entries) -> str:
    out = [HEAD, "TABLE = {\n"]
    for key, e in entries:
        out.append(f"    {key!r}: {{\n")
        out.append("        'sources': [\n")
        out.extend(f"            {f!r},\n" for f in e["sources"])
        out.append("        ],\n")
        for k in ("hier", "flat"):
            out.append(f"        {k!r}: {e[k]!r},\n")
        out.append("        'ops': {\n")
        for op, points in e["ops"].items():
            out.append(f"            {op!r}: (\n")
            out.extend(f"                {p!r},\n" for p in points)
            out.append("            ),\n")
        out.append("        },\n    },\n")
    out.append("}\n")
    return "".join(out)


def build() -> str:
    from gosym.hier import schedule

    entries, seen = [], {}
    for files, hier, flat, hosts, link in SOURCES:
        rates = files if isinstance(files[0], list) else [files]  # one list of runs a rate
        missing = [f for runs in rates for f in runs if not (REPO / f).is_file()]
        if missing:
            sys.exit(f"hier_table: {missing} do not exist")
        made = [schedule.entry([(f, json.loads((REPO / f).read_text())) for f in runs], hier, flat,
                               hosts, link) for runs in rates]
        if len({key for key, _ in made}) != 1:
            sys.exit(f"hier_table: {files}: the rates' runs measure {sorted({k for k, _ in made})}")
        key, e = made[0][0], schedule.worst([e for _, e in made])
        if key in seen:
            sys.exit(f"hier_table: {files} and {seen[key]} both measure {key}: make them one "
                     "entry, or keep one")
        seen[key] = files
        entries.append((key, e))
    return render(entries)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when measured.py is stale")
    a = p.parse_args(argv)
    want = build()
    return write_or_check(OUT, want, a.check, "PYTHONPATH=python python scripts/hier_table.py", REPO)


if __name__ == "__main__":
    sys.exit(main())
