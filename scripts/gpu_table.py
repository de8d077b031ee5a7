#!/usr/bin/env python3
"""Writes gobackend/internal/gpu/measured.go: the CUDA engine's choices measured per world size
and GPU (gobackend/internal/gpu/choice.go; docs/DECISIONS.md, "Choices that depend on world and
GPU come from one table"), each from the bench reports that chose it. The engine takes a knob's measured value where its world and GPU have one and the
knob's environment variable is unset; elsewhere the knob's default, measured at 2 GPUs.

A new choice: run the variants side by side in one device call (the knob set per run, e.g.
`GOSYM_GPU_RELAY_BLOCKS=16 python -m gosym.bench --device cuda --batch 40 --ops broadcast
--json FILE`), commit the reports under docs/results/, add the knob's entry to SOURCES, and
run

    python3 scripts/gpu_table.py           # rewrite measured.go
    python3 scripts/gpu_table.py --check   # exit 1 when it is stale

The unit tests run --check, so the Go table always says what its files say. Standard library
only (no torch, no gosym).

Three rules:
- "from": the knob is a size threshold between two paths, "off" and "on". Its value is the
  smallest measured size from which "on" is no slower than "off" at that size and every larger
  one (in the knob's unit: the op's bytes per rank, or one rank's output for reduce_scatter).
- "best": the knob takes one of several values. At each measured size the fastest value wins
  unless the default is within TOLERANCE of it; the winners become steps: from each measured
  size up to the next, its winner (below the smallest, the smallest's).
- "against": the knob takes one value at every size (a choice no rank may make by size
  without asking, as GOSYM_GPU_A2AV_BLOCKS: the skewed all_to_all's longest piece is not
  known everywhere). Each variant's worst size against the `against` backend (its time over
  gosym's, both from the variant's own reports: measured side by side) is its score; the
  best score wins unless the default's is within TOLERANCE of it.
Points of one variant measured in several reports are averaged (the median of the runs).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from generated import write_or_check

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "gobackend" / "internal" / "gpu" / "measured.go"
TOLERANCE = 0.01  # a value other than the default must be this much faster to be chosen

# The compute capability (10 * major + minor) of the GPUs the reports name.
ARCH = {"NVIDIA H100": 90, "NVIDIA H200": 90, "NVIDIA H800": 90, "NVIDIA GH200": 90,
        "NVIDIA B200": 100, "NVIDIA GB200": 100}

S23 = "docs/results/2026-11-28-s23-"
S24 = "docs/results/2026-11-28-s24-"
S36 = "docs/results/2026-11-30-s36-"
S38 = "docs/results/2026-11-30-s38-"
S39 = "docs/results/2026-11-30-s39-"

# One entry per (knob, world, GPU): a variant is a list of (report file, key path inside it or
# None for the whole file); only the "gosym" backend's rows of the op are read (and, for the
# rule "against", its `against` backend's).
SOURCES = [
    # reduce_scatter on the peers' inputs in place (direct) or through the staging, 4×H200,
    # session 23: GOSYM_GPU_DIRECT_MIN=1048576 for "on" (direct at every size measured).
    dict(knob="GOSYM_GPU_RS_DIRECT_MIN", op="reduce_scatter_tensor", rule="from", unit="output",
         off=[(S23 + "rs-direct-4xH200.json", "staged")],
         on=[(S23 + "rs-direct-4xH200.json", "direct_from_1MiB")]),
    # broadcast's blocks per chunk (push relay), 4×H200, sessions 23 and 24.
    dict(knob="GOSYM_GPU_RELAY_BLOCKS", op="broadcast", rule="best", default=32,
         variants={
             16: [(S23 + "broadcast-push-4xH200.json", "runs.bc-push-16"),
                  (S24 + "bcast-blocks-16-4xH200.json", None)],
             24: [(S24 + "bcast-blocks-24-4xH200.json", None)],
             32: [(S23 + "broadcast-push-4xH200.json", "runs.bc-push"),
                  (S24 + "bcast-blocks-32-4xH200.json", None)],
             42: [(S23 + "broadcast-push-4xH200.json", "runs.bc-push-42")],
         }),
    # the local piece of a copy-engine move on a second stream, 2×H200, session 36 (on, off,
    # on in one call: device_cuda.sh overlap): all_gather, whose piece is its input, so the
    # bench's size is the knob's unit (the longest piece); all_to_all moved alike. The reports
    # ran under the setting's first form, an on/off switch (on at every size, and off).
    dict(knob="GOSYM_GPU_CE_OVERLAP_MIN", op="all_gather_into_tensor", rule="from",
         off=[(S36 + "ce-overlap-off-2xH200.json", None)],
         on=[(S36 + "ce-overlap-on-a-2xH200.json", None), (S36 + "ce-overlap-on-b-2xH200.json", None)]),
    # the skewed all_to_all's blocks per pair of gs_a2av (0: the ranks agree on the splits on
    # the host), 2×H200, session 38: two calls of device_cuda.sh a2av, two runs each (a, b),
    # 40 per sample to 64 MiB and 10 at 256 MiB and 1 GiB, pushing (GOSYM_GPU_A2AV_PUSH=1) in
    # the default 32 MiB staging; 32 blocks in the second call only.
    dict(knob="GOSYM_GPU_A2AV_BLOCKS", op="all_to_all_single_skew", rule="against", against="nccl",
         default=0, variants={
             v: [(f"{S38}a2av-{mode}-{run}-b{b}-2xH200.json", None)
                 for run in runs for b in (40, 10)]
             for v, mode, runs in ((0, "host", ("a1", "b1", "a2", "b2")),
                                   (64, "push", ("a1", "b1", "a2", "b2")),
                                   (32, "push-nb32", ("a2", "b2")))}),
    # equal-split all_to_all on gs_a2av (pushing, 64 blocks, as the row above) or on its own
    # paths (staged, then the direct path's copy engines), 2×H200, session 39: one call, the
    # setting 0 (off) and 1 (on at every size) in turn, twice (a, b), 10 per sample; the bench's
    # size is the input per rank, the knob's unit.
    dict(knob="GOSYM_GPU_A2A_PACED_MIN", op="all_to_all_single", rule="from",
         off=[(f"{S39}a2a-paced-off-{r}-2xH200.json", None) for r in "ab"],
         on=[(f"{S39}a2a-paced-on-{r}-2xH200.json", None) for r in "ab"]),
]


def _report(path: str, key):
    f = REPO / path
    if not f.is_file():
        sys.exit(f"gpu_table: {path} does not exist")
    r = json.loads(f.read_text())
    for k in (key.split(".") if key else ()):
        r = r[k]
    return r


def _arch(gpu: str) -> int:
    for name, arch in ARCH.items():
        if gpu.startswith(name):
            return arch
    sys.exit(f"gpu_table: no compute capability known for {gpu!r}: add it to ARCH")


def points(variant, op: str, backend: str = "gosym"):
    """{size: median µs} of the backend's rows of op over the variant's reports, and the
    reports' (world, arch)."""
    runs, shape = {}, set()
    for path, key in variant:
        r = _report(path, key)
        m = r["machine"]
        shape.add((m["world_size"], _arch(m["gpu"])))
        for row in r["results"]:
            if row["backend"] == backend and row["op"] == op:
                runs.setdefault(row["size"], []).append(row["median_us"])
    if len(shape) != 1:
        sys.exit(f"gpu_table: {variant} mix worlds or GPUs: {sorted(shape)}")
    return {s: statistics.median(v) for s, v in sorted(runs.items())}, shape.pop()


def rule_from(e):
    off, shape = points(e["off"], e["op"])
    on, shape2 = points(e["on"], e["op"])
    if shape != shape2:
        sys.exit(f"gpu_table: {e['knob']}: off and on measured on {shape} and {shape2}")
    sizes = sorted(set(off) & set(on))
    chosen = None
    for s in reversed(sizes):
        if on[s] > off[s]:
            break
        chosen = s
    if chosen is None:
        sys.exit(f"gpu_table: {e['knob']}: 'on' is slower at the largest size measured")
    if e.get("unit") == "output":
        chosen //= shape[0]
    return shape, [(0, chosen)]


def rule_best(e):
    runs, shape = {}, set()
    for value, variant in e["variants"].items():
        runs[value], sh = points(variant, e["op"])
        shape.add(sh)
    if len(shape) != 1:
        sys.exit(f"gpu_table: {e['knob']}: variants measured on {sorted(shape)}")
    default = e["default"]
    steps = []
    for s in sorted(runs[default]):
        have = {v: p[s] for v, p in runs.items() if s in p}
        best = min(have, key=lambda v: (have[v], v != default))
        if have[default] <= have[best] * (1 + TOLERANCE):
            best = default
        if not steps or steps[-1][1] != best:
            steps.append((s, best))
    steps[0] = (0, steps[0][1])
    return shape.pop(), steps


def rule_against(e):
    score, shape = {}, set()
    for value, variant in e["variants"].items():
        mine, sh = points(variant, e["op"])
        base, _ = points(variant, e["op"], e["against"])
        shape.add(sh)
        sizes = sorted(set(mine) & set(base))
        if not sizes:
            sys.exit(f"gpu_table: {e['knob']}={value}: no size measured on gosym and {e['against']}")
        score[value] = min(base[s] / mine[s] for s in sizes)
    if len(shape) != 1:
        sys.exit(f"gpu_table: {e['knob']}: variants measured on {sorted(shape)}")
    default = e["default"]
    best = max(score, key=lambda v: (score[v], v == default))
    if score[default] * (1 + TOLERANCE) >= score[best]:
        best = default
    return shape.pop(), [(0, best)]


RULES = {"from": rule_from, "best": rule_best, "against": rule_against}


def _size(n: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift} << {shift}"
    return str(n)


HEAD = """// Code generated by scripts/gpu_table.py from the reports it names; DO NOT EDIT.
// Refresh: python3 scripts/gpu_table.py

package gpu

// measuredRows: the engine's choices measured per world and GPU (choice.go).
var measuredRows = []measuredRow{
"""


def build() -> str:
    out, seen = [HEAD], set()
    for e in SOURCES:
        (world, arch), steps = RULES[e["rule"]](e)
        if (e["knob"], world, arch) in seen:
            sys.exit(f"gpu_table: {e['knob']} measured twice at world {world}, sm_{arch}")
        seen.add((e["knob"], world, arch))
        files = sorted({p for k in ("off", "on") for p, _ in e.get(k, ())} |
                       {p for v in e.get("variants", {}).values() for p, _ in v})
        out.append(f"\t// {e['knob']}, rule {e['rule']}: {', '.join(files)}\n")
        for frm, value in steps:
            v = _size(value) if e["rule"] == "from" else str(value)
            out.append(f'\t{{knob: "{e["knob"]}", world: {world}, arch: {arch}, '
                       f"from: {_size(frm)}, value: {v}}},\n")
    out.append("}\n")
    return "".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when measured.go is stale")
    a = p.parse_args(argv)
    return write_or_check(OUT, build(), a.check, "python3 scripts/gpu_table.py", REPO)


if __name__ == "__main__":
    sys.exit(main())
