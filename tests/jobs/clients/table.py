"""Runs every real-client scenario on the reference backend and on gosym and prints a table.

    python -m tests.jobs.clients.table --device cuda --out DIR   # from the repository root

For each world size (CUDA: 2, 3 and every GPU, those that fit; CPU: 2, 3, 4), one job
per backend runs the applicable scenarios (harness.py). Prints one row
per (scenario, world): the reference's and gosym's last value on the last rank, the
largest relative difference over all ranks and steps, bitwise equality, PASS/FAIL
(1e-5 relative); writes DIR/clients-<device>.json with every row and its problems,
the jobs' logs under DIR/jobs. Exits 1 when a row fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import harness as h


def _fmt(v, spec=".7g") -> str:
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--out", required=True, type=Path, help="directory for the JSON and the job logs")
    p.add_argument("--worlds", default="", help="comma-separated world sizes (default: what the machine has)")
    p.add_argument("--scenarios", default="", help=f"comma-separated subset of {','.join(h.SPECS)}")
    p.add_argument("--job-timeout", type=float, default=h.JOB_TIMEOUT_S, help="deadline of one job, s")
    p.add_argument("--group-timeout", type=float, default=h.GROUP_TIMEOUT_S,
                   help="process-group timeout inside the jobs, s")
    a = p.parse_args(argv)
    h.JOB_TIMEOUT_S, h.GROUP_TIMEOUT_S = a.job_timeout, a.group_timeout
    names = [n for n in a.scenarios.split(",") if n] or list(h.SPECS)
    unknown = [n for n in names if n not in h.SPECS]
    if unknown:
        p.error(f"unknown scenarios {unknown}; known: {list(h.SPECS)}")
    worlds = h.cpu_worlds() if a.device == "cpu" else h.cuda_worlds(h.cuda_ranks())
    if a.worlds:
        worlds = [int(w) for w in a.worlds.split(",")]
    if not worlds:
        print("no world size to run (no CUDA devices?)", file=sys.stderr)
        return 1
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    ref = h.REFERENCE[a.device]
    path = a.out / f"clients-{a.device}.json"
    print(f"{'scenario':<18} {'world':>5} {ref + ' last':>14} {'gosym last':>14} {'max rel diff':>12} "
          f"{'rtol':>6} {'bitwise':>7}  result", flush=True)
    for w in worlds:
        run = h.applicable(a.device, w, names)
        if not run:
            continue
        for o in h.run_pair(a.device, w, run, a.out / "jobs"):
            rows.append(o.row())
            known = h.known_failure(a.device, w, o.scenario)
            res = "PASS" if o.ok else ("XFAIL" if known else "FAIL")
            print(f"{o.scenario:<18} {w:>5} {_fmt(o.ref_last):>14} {_fmt(o.got_last):>14} "
                  f"{_fmt(o.max_rel, '.3g'):>12} {o.rtol:>6g} {str(o.bitwise):>7}  {res}", flush=True)
            for prob in o.problems[:3]:
                print("    " + prob[:600].replace("\n", "\n    "), flush=True)
        # After every world, so a run cut short keeps what it finished.
        path.write_text(json.dumps({"device": a.device, "reference": ref, "rows": rows}, indent=1))
    fails = [r for r in rows if not r["ok"] and not h.known_failure(a.device, r["world"], r["scenario"])]
    print(f"{len(rows)} rows, {len(fails)} failed; JSON: {path}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
