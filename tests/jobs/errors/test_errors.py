"""Failures must surface as clear Python errors on every rank, never as hangs.

A rank that never arrives, or dies, gives the others a RuntimeError within the
group's timeout that names the operation, its sequence number and the missing
rank. Arguments that disagree across ranks, and invalid calls, raise promptly.
These jobs use the spawn launcher: torchrun would kill the survivors as soon as
one rank dies, before they could report.
"""

from __future__ import annotations

import re

import pytest
from conftest import run_torchrun

OP_TIMEOUT = 5.0  # seconds; the timeout of the group under test
SLACK = 10.0  # scheduling slack on a loaded 2-core CI machine


def squash(s: str) -> str:
    """'all_reduce', 'ALLREDUCE', 'all-reduce' all become 'allreduce'."""
    return re.sub(r"[^a-z0-9]", "", s.lower())


def ranks_named(msg: str) -> set[int]:
    """Integers that follow the word 'rank(s)' closely: 'missing ranks [2, 3]', 'rank 2 did not...'."""
    out: set[int] = set()
    for m in re.finditer(r"rank", msg, re.I):
        out.update(int(x) for x in re.findall(r"\d+", msg[m.end() : m.end() + 40]))
    return out


def timeout_problems(err: dict | None, op: str, missing: int, timed_out: bool = False) -> list[str]:
    """What is wrong with the error of op that rank missing failed; timed_out: the rank
    stayed silent, so the error is a timeout in torch's convention (a DistBackendError whose
    text says "Timed out", as gloo's and NCCL's)."""
    if err is None:
        return ["did not raise"]
    msg = err["message"]
    probs = []
    if not err["is_runtime_error"]:
        probs.append(f"{err['type']} is not a RuntimeError")
    if timed_out and not err["is_backend_error"]:
        probs.append(f"{err['type']} is not a DistBackendError")
    if timed_out and "Timed out" not in msg:
        probs.append("message does not say 'Timed out'")
    if squash(op) not in squash(msg):
        probs.append(f"message does not name the op {op!r}")
    if missing not in ranks_named(msg):
        probs.append(f"message does not name missing rank {missing}")
    if not re.search(r"seq", msg, re.I):
        probs.append("message does not give the sequence number")
    return [f"{p}: {msg[:400]!r}" for p in probs]


@pytest.mark.parametrize("scenario", ["skip", "skip-recv", "die-sigkill", "die-exit", "die-during"])
def test_missing_rank_raises_on_survivors(scenario, outdir):
    world, victim = 3, 2
    res = run_torchrun("errors_worker", world, ["--scenario", scenario, "--op-timeout", OP_TIMEOUT],
                       timeout=120, outdir=outdir, launcher="spawn")
    problems = []
    victim_pid = (res.outdir / f"pid.{victim}").read_text()
    for r in range(world - 1):
        x = res.results[r]
        if x is None:
            problems.append(f"rank {r}: no result (rc {res.rank_returncodes[r]})")
            continue
        if not x.get("warmup_ok"):
            problems.append(f"rank {r}: the all_reduce before the failure was wrong")
        err = x.get("error")
        op = "recv" if scenario == "skip-recv" else "all_reduce"
        problems += [f"rank {r}: {p}" for p in timeout_problems(err, op, victim, scenario.startswith("skip"))]
        if err is not None and scenario.startswith("die") and f"pid {victim_pid}" not in err["message"]:
            problems.append(f"rank {r}: the error does not name the lost rank's pid {victim_pid}: {err['message'][:300]!r}")
        if err is not None:
            lo = OP_TIMEOUT * 0.5 if scenario.startswith("skip") else 0.0
            if not lo <= err["elapsed"] <= OP_TIMEOUT + SLACK:
                problems.append(f"rank {r}: raised after {err['elapsed']}s, expected {lo}..{OP_TIMEOUT + SLACK}s")
        for step in ("destroy_group", "destroy_default"):
            done = x.get(step)
            if done is None:
                problems.append(f"rank {r}: {step} never finished")
            elif done["error"] is not None:
                problems.append(f"rank {r}: {step} raised {done['error']['type']}: {done['error']['message'][:300]}")
        if res.rank_returncodes[r] != 0:
            problems.append(f"rank {r}: exit status {res.rank_returncodes[r]}")
    want_rc = {"skip": 0, "skip-recv": 0, "die-sigkill": -9, "die-exit": 7, "die-during": -9}[scenario]
    if res.rank_returncodes[victim] != want_rc:
        problems.append(f"victim exit status {res.rank_returncodes[victim]}, wanted {want_rc}")
    assert not problems, "\n".join(problems) + f"\n--- output ---\n{res.tail(6000)}"


def test_bystander_exit_spares_point_to_point(outdir):
    """A rank that leaves does not fail receives between two others that are waiting for
    each other (only the peer's exit fails a send or recv); a collective afterwards fails
    promptly, naming the rank that left."""
    res = run_torchrun("errors_worker", 3, ["--scenario", "bystander-exit", "--op-timeout", OP_TIMEOUT],
                       timeout=120, outdir=outdir, launcher="spawn")
    problems = []
    for r in (0, 2):
        x = res.results[r]
        if x is None:
            problems.append(f"rank {r}: no result (rc {res.rank_returncodes[r]})")
            continue
        if x["p2p"]["error"] is not None:
            problems.append(f"rank {r}: send/recv failed: {x['p2p']['error']['message'][:300]}")
        err = x["collective_after"]["error"]
        if err is None:
            problems.append(f"rank {r}: the all_reduce without rank 1 did not raise")
        else:
            if 1 not in ranks_named(err["message"]):
                problems.append(f"rank {r}: the error does not name rank 1: {err['message'][:300]!r}")
            if err["elapsed"] > OP_TIMEOUT + SLACK:
                problems.append(f"rank {r}: raised after {err['elapsed']}s")
        if res.rank_returncodes[r] != 0:
            problems.append(f"rank {r}: exit status {res.rank_returncodes[r]}")
    if res.results[0] is not None and res.results[0].get("got") != [[42.0] * 3, [43.0] * 3]:
        problems.append(f"rank 0 received {res.results[0].get('got')}")
    assert not problems, "\n".join(problems) + f"\n--- output ---\n{res.tail(6000)}"


@pytest.mark.parametrize("world", [2, 3])
def test_mismatched_arguments_raise_promptly(outdir, world):
    """Disagreeing ranks: every rank raises a clear error, well before the group timeout."""
    op_timeout = 10.0
    res = run_torchrun("errors_worker", world, ["--scenario", "mismatch", "--op-timeout", op_timeout],
                       timeout=300, outdir=outdir, launcher="spawn")
    problems = []
    for r, x in enumerate(res.results):
        if x is None:
            problems.append(f"rank {r}: no result")
            continue
        for name, case in x["cases"].items():
            err = case["error"]
            if err is None:
                problems.append(f"rank {r} {name}: did not raise")
            elif not err["is_clear"]:
                problems.append(f"rank {r} {name}: {err['type']} is not ValueError/TypeError/RuntimeError")
            elif err["elapsed"] > op_timeout * 0.8:
                problems.append(f"rank {r} {name}: only noticed after {err['elapsed']}s (a timeout, not a check): "
                                f"{err['message'][:200]!r}")
            if case["destroy"]["error"] is not None:
                problems.append(f"rank {r} {name}: destroying the group raised {case['destroy']['error']['message']}")
        sane = x.get("sane_after")
        if sane is None or sane["error"] is not None:
            problems.append(f"rank {r}: a fresh group failed after the mismatches: {sane}")
    assert not problems, "\n".join(problems) + f"\n--- output ---\n{res.tail(4000)}"


def local_error_problems(res) -> list[str]:
    problems = []
    for r, x in enumerate(res.results):
        if x is None:
            problems.append(f"rank {r}: no result")
            continue
        for name, case in x["cases"].items():
            err = case["error"]
            if err is None:
                problems.append(f"rank {r} {name}: did not raise")
            elif not err["is_clear"] or len(err["message"].strip()) < 8:
                problems.append(f"rank {r} {name}: unclear error {err['type']}: {err['message'][:200]!r}")
            sane = case["sane_after"]["error"]
            if sane is not None:
                problems.append(f"rank {r} {name}: group unusable afterwards: {sane['type']}: {sane['message'][:200]}")
    return problems


def test_invalid_calls_raise_and_group_survives(outdir):
    """Unsupported dtypes/ops and inconsistent local arguments raise at once;
    the group stays usable afterwards."""
    res = run_torchrun("errors_worker", 2, ["--scenario", "local", "--timeout", 20], timeout=180,
                       outdir=outdir, launcher="spawn")
    problems = local_error_problems(res)
    assert not problems, "\n".join(problems) + f"\n--- output ---\n{res.tail(4000)}"


@pytest.mark.gpu
def test_mixed_devices_raise(outdir):
    res = run_torchrun("errors_worker", 2, ["--scenario", "devices", "--timeout", 20], timeout=180,
                       outdir=outdir, launcher="spawn")
    problems = local_error_problems(res)
    assert not problems, "\n".join(problems) + f"\n--- output ---\n{res.tail(4000)}"
