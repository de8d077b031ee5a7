#!/usr/bin/env python
"""Runs PyTorch's own backend test suite (DistributedTest._DistTestBase, shipped in the torch
wheel) on one backend at one world size, with the reference backend's test selection (gloo's
on CPU, NCCL's on CUDA; dist_suite.py says how), and compares the outcomes with the
reference's.

    # gosym against the committed outcomes of gloo (expected/gloo-cpu-w2.json), as CI runs it:
    python tests/jobs/conformance/run_dist_suite.py --backend gosym --world 2
    # regenerate them (after a torch upgrade; the runner refuses lists of another torch):
    python tests/jobs/conformance/run_dist_suite.py --backend gloo --world 2 --write-expected

    # the reference's outcomes, then gosym's compared with them (CPU, world 2):
    python tests/jobs/conformance/run_dist_suite.py --backend gloo --world 2 --json gloo2.json
    python tests/jobs/conformance/run_dist_suite.py --backend gosym --world 2 --against gloo2.json

    # CUDA, NCCL's selection (one GPU per rank):
    python tests/jobs/conformance/run_dist_suite.py --device cuda --backend nccl --world 2 --json nccl2.json
    python tests/jobs/conformance/run_dist_suite.py --device cuda --backend gosym --world 2 --against nccl2.json

    # a long run in shards at once, then merged (and compared, or written as expected):
    python tests/jobs/conformance/run_dist_suite.py --backend gosym --shard 0/2 --json g0.json &
    python tests/jobs/conformance/run_dist_suite.py --backend gosym --shard 1/2 --json g1.json; wait
    python tests/jobs/conformance/run_dist_suite.py --backend gosym --outcomes g0.json g1.json

A comparison fails when a test's outcome on the backend differs from the reference's, except
for the tests listed in restricted.json (torch itself restricts them to gloo or NCCL), whose
expected outcome is given there with the reason (where the reference runs them; where it skips
them, the backend must skip them too). Outcomes are "passed", "failed" and
"skipped"; a test that the reference fails may pass on the backend (reported, not failed).
-k selects tests by regular expression (re.search on the name).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
import traceback
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RESTRICTED = HERE / "restricted.json"
REFERENCE = {"cpu": "gloo", "cuda": "nccl"}


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gosym", help="the backend the ranks run (gosym, gloo, nccl)")
    p.add_argument("--device", choices=sorted(REFERENCE), default="cpu",
                   help="cpu: gloo's test selection; cuda: NCCL's (one GPU per rank)")
    p.add_argument("--world", type=int, default=2, help="ranks (WORLD_SIZE)")
    p.add_argument("-k", dest="pattern", default=None, help="run the tests whose name matches")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run every N-th test from the I-th (0-based): to split a long run")
    p.add_argument("--json", type=Path, help="write the outcomes here (after every test, so a run "
                   "that is killed leaves those it finished)")
    p.add_argument("--outcomes", type=Path, nargs="+", metavar="JSON",
                   help="run nothing: take the outcomes from these runs' --json (the shards of one "
                        "run, merged), then write and compare them as a run's")
    p.add_argument("--against", type=Path,
                   help="a reference run's --json or an expected file: fail on outcomes that "
                        "differ from it (default: expected/<reference>-<device>-w<world>.json "
                        "when it exists and --backend is not the reference)")
    p.add_argument("--write-expected", action="store_true",
                   help="with --backend the reference: write the outcomes to the expected file")
    p.add_argument("--test-timeout", type=int, default=240,
                   help="seconds one test's ranks may run before they are killed")
    p.add_argument("--list", action="store_true", help="print the selected tests and exit")
    return p.parse_args(argv)


def _free_port():
    """A port free now, with the one above it (see dist_suite's GOSYM_CONFORMANCE_PORT)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    sys.exit("run_dist_suite: found no two free ports in a row")


def _environment(args):
    """The variables the suite and the ranks read; set before dist_suite is imported (the
    forkserver that it starts inherits them)."""
    os.environ["BACKEND"] = REFERENCE[args.device]
    os.environ["GOSYM_CONFORMANCE_RUNTIME"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world)
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.test_timeout)
    os.environ.setdefault("GOSYM_CONFORMANCE_PORT", str(_free_port()))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_SHOW_CPP_STACKTRACES", "0")
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # gloo's CPU selection, on any machine
    paths = [str(HERE), str(REPO / "python")]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])
    sys.path[:0] = paths


class _Result(unittest.TestResult):
    """Each test's outcome, reason or error tail, and seconds."""

    def __init__(self, log, save):
        super().__init__()
        self.outcomes = {}
        self._log = log
        self._save = save
        self._t0 = 0.0

    def startTest(self, test):
        super().startTest(test)
        self._t0 = time.monotonic()

    def _put(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        secs = round(time.monotonic() - self._t0, 2)
        self.outcomes[name] = {"outcome": outcome, "detail": detail, "secs": secs}
        self._log(f"{name}: {outcome} ({secs:.1f} s){' - ' + detail.splitlines()[0] if detail and outcome == 'skipped' else ''}")
        if outcome == "failed":
            self._log("    " + detail[-3000:].replace("\n", "\n    "))
        self._save(self.outcomes, done=False)

    def addSuccess(self, test):
        self._put(test, "passed")

    def addFailure(self, test, err):
        self._put(test, "failed", "".join(traceback.format_exception(*err)))

    def addError(self, test, err):
        self._put(test, "failed", "".join(traceback.format_exception(*err)))

    def addSkip(self, test, reason):
        self._put(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        self._put(test, "passed")

    def addUnexpectedSuccess(self, test):
        self._put(test, "failed", "unexpected success")


def run(args, save):
    """Runs the selected tests; returns {test: outcome record}. save(outcomes, done) is
    called after each test."""
    try:
        import expecttest  # noqa: F401 - torch's test utilities import it
    except ImportError:
        sys.exit("run_dist_suite: torch's test suite needs the expecttest package "
                 "(requirements-dev.txt lists it: make venv)")
    import dist_suite

    dist_suite.preload()
    names = dist_suite.suite_tests()
    if args.pattern:
        names = [n for n in names if re.search(args.pattern, n)]
    if args.shard:
        i, n = map(int, args.shard.split("/"))
        names = names[i::n]
    if args.list:
        for n in names:
            print(n, "" if not dist_suite.statically_skipped(n) else "(skipped at import)")
        return {}
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"torch {dist_suite.torch.__version__}: {len(names)} tests on {args.backend} "
        f"({args.device}, world {args.world}, {REFERENCE[args.device]}'s selection)")
    suite = unittest.TestSuite(dist_suite.TestDistBackendConformance(n) for n in names)
    result = _Result(log, save)
    suite.run(result)
    return result.outcomes


def compare(outcomes, reference, backend, restricted):
    """The differences between outcomes and the reference's that fail the run (lines), and
    notes (lines) on those that do not."""
    bad, notes = [], []
    for name in sorted(set(outcomes) | set(reference)):
        got = outcomes.get(name, {}).get("outcome", "not run")
        want = reference.get(name, {}).get("outcome", "not run")
        if name in restricted:
            r = restricted[name]
            ok = r["outcome"] if isinstance(r["outcome"], list) else [r["outcome"]]
            expect = [want] if want in ("skipped", "not run") else ok
            if got not in expect and got != "not run":
                bad.append(f"{name}: {got}, restricted.json expects {' or '.join(expect)} "
                           f"({r['reason']})")
            else:
                notes.append(f"{name}: {got} on {backend}, {want} on the reference: restricted "
                             f"({r['reason']})")
        elif got == want:
            continue
        elif want == "failed" and got == "passed":
            notes.append(f"{name}: passed on {backend}, failed on the reference")
        elif got == "not run" or want == "not run":
            continue  # a -k selection on one side only
        else:
            gist = _gist(outcomes.get(name, {}).get("detail", ""))
            bad.append(f"{name}: {got} on {backend}, {want} on the reference"
                       + (f"\n    {gist}" if gist else ""))
    return bad, notes


def _gist(detail):
    """The last exception line of a failure's traceback (the rank's own error, when the
    suite relayed it), else its last line."""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    errs = [ln for ln in lines if re.match(r"[\w.]*(Error|Exception)\b", ln)]
    return (errs or lines or [""])[-1][:500]


def expected_path(args):
    """The committed outcomes of the reference at this device and world size."""
    return HERE / "expected" / f"{REFERENCE[args.device]}-{args.device}-w{args.world}.json"


def write_expected(args, outcomes, torch_version):
    path = expected_path(args)
    path.parent.mkdir(exist_ok=True)
    data = {"torch": torch_version, "reference": REFERENCE[args.device], "device": args.device,
            "world": args.world,
            "regenerate": f"python tests/jobs/conformance/run_dist_suite.py --device {args.device} "
                          f"--backend {REFERENCE[args.device]} --world {args.world} --write-expected",
            "tests": {k: {"outcome": v["outcome"]} for k, v in sorted(outcomes.items())}}
    text = json.dumps(data, indent=1)
    # one line per test, for readable diffs
    text = re.sub(r'\{\n\s+"outcome": ("\w+")\n\s+\}', r'{"outcome": \1}', text)
    path.write_text(text + "\n")
    print(f"wrote {path}")


def restricted_for(device):
    """restricted.json's entries for a device: {test: {"outcome", "reason"}}."""
    data = json.loads(RESTRICTED.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_") and v.get("device", "cpu") == device}


def _counts(outcomes):
    return {k: sum(1 for o in outcomes.values() if o["outcome"] == k)
            for k in ("passed", "failed", "skipped")}


def merged(paths, args):
    """The outcomes of several runs' --json (one run's shards), and whether together they are
    one whole run (every shard, no -k, all finished); refuses runs of another backend, device
    or world size."""
    outcomes, whole, shards = {}, True, set()
    for path in paths:
        run_ = json.loads(path.read_text())
        got = (run_["backend"], run_["device"], run_["world"])
        if got != (args.backend, args.device, args.world):
            sys.exit(f"{path}: a run of {got}, not {(args.backend, args.device, args.world)}")
        outcomes.update(run_["tests"])
        whole = whole and run_.get("done", True) and not run_.get("pattern")
        shards.add(run_.get("shard") or "0/1")
    n = len(shards)
    whole = whole and shards == {f"{i}/{n}" for i in range(n)}
    return outcomes, whole


def main(argv=None):
    args = _parse(argv)
    _environment(args)
    t0 = time.monotonic()
    import torch

    def save(outcomes, done):
        if args.json:
            args.json.write_text(json.dumps({
                "backend": args.backend, "device": args.device, "world": args.world,
                "torch": torch.__version__, "shard": args.shard, "pattern": args.pattern,
                "done": done, "counts": _counts(outcomes),
                "wall_s": round(time.monotonic() - t0, 1), "tests": outcomes}, indent=1))

    if args.outcomes:
        outcomes, done = merged(args.outcomes, args)  # done: whole
    else:
        outcomes, done = run(args, save), True
    if args.list:
        return 0
    counts = _counts(outcomes)
    print(f"{args.backend} ({args.device}, world {args.world}): {counts['passed']} passed, "
          f"{counts['failed']} failed, {counts['skipped']} skipped "
          + (f"in {time.monotonic() - t0:.0f} s" if not args.outcomes else
             f"(merged from {len(args.outcomes)} runs{'' if done else ', not all finished'})"),
          flush=True)
    save(outcomes, done)
    partial = args.pattern or args.shard or not done
    reference = REFERENCE[args.device]
    if args.write_expected:
        if args.backend != reference or partial:
            print(f"--write-expected takes a full run of the reference ({reference})")
            return 2
        write_expected(args, outcomes, torch.__version__)
        return 0
    against = args.against
    if against is None and args.backend != reference and expected_path(args).exists():
        against = expected_path(args)
    if against is None:
        return 0
    ref = json.loads(against.read_text())
    ref.setdefault("backend", ref.get("reference"))
    if ref.get("torch", torch.__version__) != torch.__version__:
        print(f"{against} holds {ref['backend']}'s outcomes under torch {ref['torch']}, this is "
              f"torch {torch.__version__}: regenerate it ({ref.get('regenerate', '--write-expected')})")
        return 1
    restricted = restricted_for(args.device) if args.backend != reference else {}
    bad, notes = compare(outcomes, ref["tests"], args.backend, restricted)
    if not partial:  # a test the reference has and this run lacks
        bad += [f"{n}: not run on {args.backend}" for n in ref["tests"] if n not in outcomes]
    ref_counts = _counts(ref["tests"])
    print(f"reference {ref['backend']} ({against.name}): {ref_counts}")
    for line in notes:
        print("note:", line)
    for line in bad:
        print("DIFFERS:", line)
    print(f"{len(bad)} outcomes differ from {ref['backend']}'s" if bad else
          f"every outcome matches {ref['backend']}'s (restricted.json aside)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
