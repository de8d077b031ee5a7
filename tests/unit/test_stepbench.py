"""gosym.stepbench, the FSDP2 training-step bench: on the CPU it trains the same model on gosym and
on gloo in one job, times every step of both, and their losses agree."""

import json
import os
import subprocess
import sys

from gosym import stepbench


def _run(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [os.path.dirname(os.path.dirname(stepbench.__file__)), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "gosym.stepbench", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_stepbench_times_both_backends_on_the_same_losses(tmp_path):
    out = tmp_path / "step.json"
    res = _run("--nproc", "2", "--dim", "32", "--layers", "3", "--tokens", "48", "--seq", "8",
               "--steps", "3", "--rounds", "2", "--warmup", "1", "--reduce-dtype", "fp32",
               "--profile", "5", "--json", str(out))
    assert res.returncode == 0, res.stderr[-4000:]
    rep = json.loads(out.read_text())
    assert rep["params"] == 3 * (8 * 32 * 32 + 2 * 32)
    assert set(rep["summary"]) == {"gosym", "gloo"}
    for b, s in rep["summary"].items():
        assert s["steps"] == 6, (b, s)
        assert 0 < s["p10_ms"] <= s["median_ms"] <= s["p90_ms"], (b, s)
        # the host's part of a step (until step() returns) is at most the step
        assert 0 < s["host_median_ms"] <= s["p90_ms"], (b, s)
        # the same model, batches and reduction type: the losses agree to rounding
        assert s["loss_max_rel"] < 1e-3, (b, s)
    for r in rep["ranks"]:
        assert len(r["losses"]["gosym"]) == 1 + 6
        # training moves: the last loss is not the first (the steps did something)
        assert r["losses"]["gosym"][-1] != r["losses"]["gosym"][0]
    assert "gosym" in res.stdout and "gloo" in res.stdout
    # --profile: one more step per backend under torch's profiler, rank 0's top ops printed
    assert set(rep["ranks"][0]["profiles"]) == {"gosym", "gloo"}
    assert "one step under the profiler" in res.stdout and "Self CPU" in res.stdout
    assert rep["ranks"][0]["gosym_stats"]["gpu_device"] == -1  # the counters came back (CPU)


def test_stepbench_refuses_tokens_that_do_not_split():
    res = _run("--tokens", "50", "--seq", "16")
    assert res.returncode == 2
    assert "not a multiple" in res.stderr
