"""DDP on gosym trains exactly like DDP on gloo (ddp_worker.py):
bitwise-equal losses on 2 ranks (a+b is exactly rounded whatever the
algorithm), within 1e-6 relative on 4 (summation order may differ); so does
a model with sparse gradients (sparse all_reduce)."""

from __future__ import annotations

import math

import pytest
from conftest import run_torchrun


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_matches_gloo(world, outdir):
    res = run_torchrun("ddp_worker", world, ["--timeout", 120], timeout=420, outdir=outdir)
    res.assert_ok()
    problems = []
    for r, x in enumerate(res.results):
        main, gloo = x["losses"]["main"], x["losses"]["gloo"]
        if len(main) != 50 or len(gloo) != 50:
            problems.append(f"rank {r}: {len(main)}/{len(gloo)} steps")
            continue
        if not all(math.isfinite(v) for v in main):
            problems.append(f"rank {r}: non-finite loss on gosym: {main}")
        if world == 2:
            diff = [i for i, (a, b) in enumerate(zip(main, gloo)) if a != b]
            if diff:
                i = diff[0]
                problems.append(f"rank {r}: losses differ bitwise from gloo at {len(diff)} steps, "
                                f"first step {i}: {main[i]!r} vs {gloo[i]!r}")
            if x["digest"]["main"] != x["digest"]["gloo"]:
                bad = [i for i, (a, b) in enumerate(zip(x["params"]["main"], x["params"]["gloo"])) if a != b]
                problems.append(f"rank {r}: final parameters differ from gloo's (state_dict entries {bad})")
        else:
            diff = [i for i, (a, b) in enumerate(zip(main, gloo)) if abs(a - b) > 1e-6 * abs(b)]
            if diff:
                i = diff[0]
                problems.append(f"rank {r}: losses differ from gloo by >1e-6 relative at {len(diff)} steps, "
                                f"first step {i}: {main[i]!r} vs {gloo[i]!r}")
        sp = x["sparse_losses"]
        tol = 0.0 if world == 2 else 1e-6
        if len(sp["main"]) != 20 or any(abs(a - b) > tol * abs(b) for a, b in zip(sp["main"], sp["gloo"])):
            problems.append(f"rank {r}: sparse-gradient losses differ from gloo's: {sp['main'][:4]} vs "
                            f"{sp['gloo'][:4]}")
    # Training moved; every rank ends with the same parameters.
    losses0 = res.results[0]["losses"]["main"]
    if not sum(losses0[-5:]) < 0.5 * sum(losses0[:5]):
        problems.append(f"the loss did not go down: {losses0[:5]} -> {losses0[-5:]}")
    for run in ("main", "gloo"):
        if len({x["digest"][run] for x in res.results}) != 1:
            problems.append(f"{run}: ranks ended with different parameters")
    assert not problems, "\n".join(problems)
