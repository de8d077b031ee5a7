"""Real clients of torch.distributed train the same on gosym as on the reference backend.

Each case is one scenario of scenarios.py (FSDP2, tensor parallel,
a 2-D DeviceMesh, DDP, pipelining, distributed checkpoint, functional
collectives, torch.compile, split_group) at one world size: its per-step losses
(or output values) on gosym must match gloo's (CPU) or NCCL's (CUDA) within
1e-5 relative, rank by rank. All scenarios of a (device, world) pair run in one
job per backend (harness.py), started once for every selected case
of that pair. CUDA cases run at the GPU suite's worlds (conftest.gpu_worlds: 2, 3
and every GPU; world 1 on one GPU) and skip without GPUs.
"""

from __future__ import annotations

import harness as h
import pytest
from conftest import gpu_worlds, need_gpus

CUDA_WORLDS = (1, 2, 3, 4, 8)


def _marks(dev, world, name):
    marks = [pytest.mark.gpu] if dev == "cuda" else []
    known = h.known_failure(dev, world, name)
    if known:
        marks.append(pytest.mark.xfail(strict=True, reason=known))
    return marks


CASES = [pytest.param(dev, w, name, id=f"{dev}-w{w}-{name}", marks=_marks(dev, w, name))
         for dev, worlds in (("cpu", h.cpu_worlds()), ("cuda", CUDA_WORLDS))
         for w in worlds for name in h.SPECS]


class _Pairs:
    """Runs each (device, world) pair's jobs once, for every case of it that was collected."""

    def __init__(self, session, root):
        self.session, self.root, self.done = session, root, {}

    def selected(self, device, world) -> list[str]:
        names = {it.callspec.params["name"] for it in self.session.items
                 if getattr(it, "callspec", None) and it.callspec.params.get("device") == device
                 and it.callspec.params.get("world") == world and "name" in it.callspec.params}
        return h.applicable(device, world, [n for n in h.SPECS if n in names])

    def outcome(self, device, world, name) -> h.Outcome:
        key = (device, world)
        if key not in self.done:
            names = self.selected(device, world)
            self.done[key] = {o.scenario: o for o in h.run_pair(device, world, names, self.root)}
        return self.done[key][name]


@pytest.fixture(scope="session")
def client_pairs(request, tmp_path_factory):
    return _Pairs(request.session, tmp_path_factory.mktemp("clients"))


@pytest.mark.parametrize("device,world,name", CASES)
def test_client_matches_reference(device, world, name, client_pairs):
    reason = h.SPECS[name].skip_reason(name, device, world)
    if reason:
        pytest.skip(reason)
    if device == "cuda":
        need_gpus(world)
        if world not in gpu_worlds():
            pytest.skip(f"the GPU suite runs at worlds {gpu_worlds()} on this machine")
    o = client_pairs.outcome(device, world, name)
    assert o.ok, (f"{name} at world {world} on {device}: gosym vs {h.REFERENCE[device]}: max rel diff "
                  f"{o.max_rel}\n" + "\n".join(o.problems))


def test_hung_scenario_named_and_job_resumed(tmp_path, monkeypatch):
    """A scenario that never finishes is reported by name on every rank, and the
    scenarios after it still run (a new launch), instead of the job's deadline taking
    every scenario of the pair with it."""
    monkeypatch.setattr(h, "SCENARIO_TIMEOUT_S", 8.0)
    run = h.run_job("cpu", 2, "gosym", ["split", "stall", "funcol_eager"], tmp_path, timeout=120)
    for r in range(2):
        assert run.entry(r, "split")["values"], run.entry(r, "split")
        stalled = run.entry(r, "stall")
        assert stalled["values"] is None and stalled.get("hung"), stalled
        assert "stall" in stalled["error"], stalled
        assert run.entry(r, "funcol_eager")["values"], run.entry(r, "funcol_eager")


def test_job_hung_after_its_scenarios_fails(tmp_path):
    """Every value matches, but gosym's job does not end (its last rank hangs at exit, until
    the job's deadline): the outcome fails and says where each rank got to."""
    ref = h.run_job("cpu", 2, "gloo", ["stall_at_exit"], tmp_path / "ref", timeout=120)
    got = h.run_job("cpu", 2, "gosym", ["stall_at_exit"], tmp_path / "got", timeout=25)
    o = h.compare("stall_at_exit", "cpu", 2, ref, got)
    assert not o.ok, o
    assert "did not end cleanly" in o.problems[0], o.problems
    assert "rank 1: destroyed in" in o.problems[0], o.problems


def test_reference_network_error_runs_again(monkeypatch, tmp_path):
    """A reference scenario that failed with DistNetworkError runs once more, alone, and its
    second outcome counts; the others keep their first (no job is launched: run_job is
    replaced by a recorder)."""
    calls = []

    def fake(device, world, backend, names, outdir, timeout=None):
        calls.append(list(names))
        first = len(calls) == 1

        def entry(n):
            if first and n == "split":
                return {"values": None, "error": "DistNetworkError: Connection reset by peer"}
            return {"values": [len(calls)], "error": None}

        ranks = [{"rank": r, "backend": backend, "scenarios": {n: entry(n) for n in names}}
                 for r in range(world)]
        return h.JobRun(backend, ranks, None, 1.0)

    monkeypatch.setattr(h, "run_job", fake)
    run = h.reference_job("cpu", 2, ["ddp", "split", "tp"], tmp_path)
    assert calls == [["ddp", "split", "tp"], ["split"]]
    assert run.entry(1, "split") == {"values": [2], "error": None}
    assert run.entry(0, "ddp")["values"] == [1] and run.seconds == 2.0
    calls.clear()
    h.reference_job("cpu", 2, ["ddp"], tmp_path)
    assert calls == [["ddp"]]  # nothing failed: one job
