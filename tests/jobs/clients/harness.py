"""Runs the real-client scenarios on a reference backend and on gosym and compares them.

A *job* is one launch of clients_worker.py on ``world`` ranks of one backend
(conftest's spawn launcher, a hard deadline); it runs every requested scenario
in turn, so a (device, world) pair costs two launches (reference, gosym) per shard
(shards_for) whatever the number of scenarios. The reference is gloo on CPU and NCCL on CUDA.
``compare`` turns the two jobs' per-rank values into one ``Outcome`` per
scenario: the largest relative difference and whether every value is bitwise
equal. Torch-free (the pytest process and the table CLI import it).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import pytest  # noqa: E402  (conftest's Job fails through pytest.fail)
from conftest import Job, cuda_ranks, gpu_worlds_for  # noqa: E402,F401 (the table's)

WORKER = HERE / "clients_worker.py"
REFERENCE = {"cpu": "gloo", "cuda": "nccl"}
# Losses within this relative difference of the reference's pass (the bar).
RTOL = 1e-5
# Group timeout inside the jobs (a hung collective raises after it and the job goes on to
# the next scenario), and the launcher's deadline for one job; the environment overrides.
GROUP_TIMEOUT_S = float(os.environ.get("GOSYM_CLIENTS_GROUP_TIMEOUT", 60))
JOB_TIMEOUT_S = float(os.environ.get("GOSYM_CLIENTS_JOB_TIMEOUT", 400))
# A scenario that runs longer is reported hung by name, and the job resumes after it.
SCENARIO_TIMEOUT_S = float(os.environ.get("GOSYM_CLIENTS_SCENARIO_TIMEOUT", 150))


@dataclasses.dataclass(frozen=True)
class Spec:
    doc: str
    worlds: tuple[int, ...] | None = None  # only these world sizes (None: any)
    devices: tuple[str, ...] = ("cpu", "cuda")
    cpu_worlds: tuple[int, ...] | None = None  # on CPU only these (CI time)
    why_not: str = ""  # why a device or world is left out
    # The tolerance at world > 2 where it cannot be RTOL (say why in the doc).
    rtol_over_2: float | None = None

    def skip_reason(self, name: str, device: str, world: int) -> str | None:
        why = f" ({self.why_not})" if self.why_not else ""
        if device not in self.devices:
            return f"{name} does not run on {device}{why}"
        worlds = self.cpu_worlds if device == "cpu" and self.cpu_worlds else self.worlds
        if worlds is not None and world not in worlds:
            return f"{name} runs at world sizes {list(worlds)} only on {device} (this run: {world}){why}"
        return None

    def rtol(self, world: int) -> float:
        return self.rtol_over_2 if world > 2 and self.rtol_over_2 else RTOL


# The scenarios of scenarios.py (a function of that name each), in run order.
SPECS: dict[str, Spec] = {
    "ddp": Spec("DDP: tests/jobs/ddp/ddp_worker.py's model and loop (BatchNorm buffers, small buckets)",
                devices=("cuda",), why_not="on CPU tests/jobs/ddp/test_ddp.py runs it against gloo"),
    "fsdp2_fp32": Spec("FSDP2 fully_shard per block and at the root, fp32"),
    "fsdp2_bf16": Spec("FSDP2, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)"),
    "fsdp2_bf16_reduce": Spec(
        "FSDP2, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), SGD: bf16 "
        "reduce_scatter. At world > 2 gosym's bf16 sum is rounded once from the exact sum while "
        "gloo (and NCCL's ring) round after every hop, so losses are compared within 1e-3 there",
        rtol_over_2=1e-3),
    "tp": Spec("1-D tensor parallel: DTensor ColwiseParallel/RowwiseParallel over every rank",
               worlds=(2, 4, 8)),
    "fsdp_tp": Spec("2-D DeviceMesh (dp=world/2 x tp=2): FSDP2 over dp of a tensor-parallel MLP",
                    worlds=(4, 6, 8)),
    "pipe_gpipe": Spec("torch.distributed.pipelining ScheduleGPipe, a stage per rank, 4 microbatches (8 past 4 ranks)"),
    "pipe_1f1b": Spec("torch.distributed.pipelining Schedule1F1B, a stage per rank, 4 microbatches (8 past 4 ranks)"),
    "dcp": Spec("distributed checkpoint of an FSDP2 model+optimizer mid-run, loaded into a fresh "
                "model; the resumed run must equal the uninterrupted one bitwise"),
    "funcol_eager": Spec("functional collectives: all_reduce sum/max, all_gather_tensor, "
                         "reduce_scatter_tensor, all_to_all_single (every output element)"),
    "funcol_compile": Spec("the same functional collectives in one torch.compile(fullgraph=True) "
                           "function (inductor on CUDA, aot_eager on CPU)",
                           cpu_worlds=(2,), why_not="compiling costs CI time"),
    "compiled_ddp": Spec("torch.compile of a DDP module (DDPOptimizer), trained",
                         cpu_worlds=(2,), why_not="compiling costs CI time"),
    "split": Spec("dist.split_group (halves; the whole world; ranks {0,1}, the others get None) then "
                  "all_reduce and all_gather on each split, and a 2-D DeviceMesh's groups at even "
                  "worlds. CUDA: from the device_id-bound default group (the mesh splits too); CPU: "
                  "gosym's bound device is faked (torch takes no CPU device_id) and gloo's reference "
                  "is new_group of the same ranks"),
}

# gosym's known failures, for xfail(strict=True): (device, world or None for any, scenario) -> reason.
KNOWN_FAILURES: dict[tuple[str, int | None, str], str] = {}


def known_failure(device: str, world: int, name: str) -> str | None:
    return KNOWN_FAILURES.get((device, world, name)) or KNOWN_FAILURES.get((device, None, name))


def cpu_worlds() -> list[int]:
    return [1, 2, 3, 4]


def cuda_worlds(n: int) -> list[int]:
    """The worlds of the GPU suite on n GPUs (conftest: 2, 3 and n, those that fit; 1 on one)."""
    return gpu_worlds_for(n)


def applicable(device: str, world: int, names=None) -> list[str]:
    return [n for n in (names or SPECS) if SPECS[n].skip_reason(n, device, world) is None]


@dataclasses.dataclass
class JobRun:
    """One backend's launches: per rank, {scenario: {"values", "error", "seconds"}}; an
    entry marked "started" is a scenario that rank began and never finished."""

    backend: str
    ranks: list[dict | None]
    problem: str | None  # a launch-level failure (deadline, a rank that crashed), with output
    seconds: float

    def entry(self, rank: int, name: str) -> dict | None:
        r = self.ranks[rank]
        return None if r is None else r.get("scenarios", {}).get(name)


def run_job(device: str, world: int, backend: str, names: list[str], outdir: Path,
            timeout: float | None = None) -> JobRun:
    """Launches the scenarios ``names`` on ``world`` ranks of ``backend``. A scenario that
    hangs (the worker's per-scenario deadline, or the job's) is reported by name, and a
    new launch runs the scenarios after it, so one hang costs no other scenario."""
    timeout = timeout or JOB_TIMEOUT_S
    ranks: list[dict | None] = [None] * world
    problems, seconds, left = [], 0.0, list(names)
    while left:
        run = _launch(device, world, backend, left, Path(outdir) / f"{device}-w{world}-{backend}-{len(names) - len(left)}",
                      timeout)
        seconds += run.seconds
        for r, res in enumerate(run.ranks):
            if res is not None:
                merged = ranks[r] or {"rank": r, "backend": backend, "scenarios": {}}
                merged["scenarios"].update(res.get("scenarios", {}))
                if "phases" in res:
                    merged.setdefault("phases", {}).update(res["phases"])
                ranks[r] = merged
        done = [n for n in left if all(e is not None and not e.get("started") for e in
                                       (run.entry(r, n) for r in range(world)))]
        if run.problem:
            problems.append(run.problem)
        if len(done) == len(left):
            break
        # the first scenario some rank did not finish is the one that hung or crashed the job
        stuck = next(n for n in left if n not in done)
        for r in range(world):
            e = run.entry(r, stuck)
            if e is None or e.get("started"):
                ranks[r] = ranks[r] or {"rank": r, "backend": backend, "scenarios": {}}
                why = (e or {}).get("error") or (f"{stuck} did not finish on rank {r}: the job ended "
                                                  f"({(run.problem or '').splitlines()[0] if run.problem else 'no result'})")
                ranks[r]["scenarios"][stuck] = {"values": None, "error": why, "hung": True}
        left = left[left.index(stuck) + 1:]
    return JobRun(backend, ranks, "\n".join(problems) or None, seconds)


def reference_job(device: str, world: int, names: list[str], outdir: Path) -> JobRun:
    """The reference backend's run_job, where a scenario that failed with DistNetworkError on
    some rank (Gloo's TCP transport reset while a new group connected: seen once in CI, in
    session 39's cpu-w3-split, with gosym's run of it bitwise equal) runs once more in a job
    of its own, whose outcome replaces the first. gosym's jobs are never run again."""
    run = run_job(device, world, REFERENCE[device], names, outdir)
    again = [n for n in names if any("DistNetworkError" in str((run.entry(r, n) or {}).get("error"))
                                     for r in range(world))]
    if not again:
        return run
    second = run_job(device, world, REFERENCE[device], again, Path(outdir) / "again")
    for r in range(world):
        if second.ranks[r] is not None and run.ranks[r] is not None:
            run.ranks[r]["scenarios"].update(
                {n: e for n, e in second.ranks[r]["scenarios"].items() if n in again})
    run.seconds += second.seconds
    return run


def _launch(device: str, world: int, backend: str, names: list[str], outdir: Path, timeout: float) -> JobRun:
    """One launch of the worker for ``names``."""
    scratch = outdir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    for old in outdir.glob("rank*.json"):  # a rerun into the same directory
        old.unlink()
    args = ["--backend", backend, "--device", device, "--scenarios", ",".join(names),
            "--scratch", scratch, "--timeout", GROUP_TIMEOUT_S, "--scenario-timeout", SCENARIO_TIMEOUT_S]
    job = Job(str(WORKER), world, args, outdir=outdir, timeout=timeout, launcher="spawn")
    try:
        res = job.wait()
    except pytest.fail.Exception as e:  # the deadline: keep what the ranks wrote
        return JobRun(backend, job.results(), f"{e}", timeout)
    problem = None
    if res.returncode != 0:
        problem = f"exit statuses {res.rank_returncodes}\n{res.tail(8000)}"
    return JobRun(backend, res.results, problem, res.elapsed)


@dataclasses.dataclass
class Outcome:
    scenario: str
    device: str
    world: int
    ok: bool
    max_rel: float | None  # over every rank and value; None when nothing compared
    bitwise: bool
    ref_last: float | None  # rank world-1's last value on the reference and on gosym
    got_last: float | None
    problems: list[str]
    seconds: tuple[float, float] = (0.0, 0.0)  # reference, gosym (rank 0)
    rtol: float = RTOL
    # the whole launches of the scenario's shard (reference, gosym), and gosym's rank 0's
    # phases outside the scenarios (imports, init, destroy): where a slow pair's time went
    job_seconds: tuple[float, float] = (0.0, 0.0)
    phases: dict | None = None

    def row(self) -> dict:
        return dataclasses.asdict(self)


def rel_diffs(ref: list[float], got: list[float]) -> list[float]:
    """|got - ref| relative to |ref|; values under 1% of the list's RMS are compared
    relative to that 1% (collective outputs near zero)."""
    rms = math.sqrt(sum(v * v for v in ref) / len(ref)) if ref else 0.0
    floor = max(1e-2 * rms, 1e-30)
    return [abs(g - r) / max(abs(r), floor) for r, g in zip(ref, got)]


def compare(name: str, device: str, world: int, ref: JobRun, got: JobRun) -> Outcome:
    rtol = SPECS[name].rtol(world) if name in SPECS else RTOL  # the harness's own scenarios
    problems, rels, bitwise, lasts = [], [], True, (None, None)
    for rank in range(world):
        er, eg = ref.entry(rank, name), got.entry(rank, name)
        if er is None or er.get("error"):
            problems.append(f"rank {rank}: the reference ({ref.backend}) failed: "
                            f"{(er or {}).get('error') or 'no result'}"[:3000])
            continue
        if eg is None or eg.get("error"):
            problems.append(f"rank {rank}: gosym failed: {(eg or {}).get('error') or 'no result'}"[:3000])
            continue
        vr, vg = er["values"], eg["values"]
        if len(vr) != len(vg):
            problems.append(f"rank {rank}: {len(vg)} values on gosym, {len(vr)} on {ref.backend}")
            continue
        if not all(math.isfinite(v) for v in vg):
            problems.append(f"rank {rank}: non-finite values on gosym: {vg}")
        d = rel_diffs(vr, vg)
        rels.extend(d)
        bitwise &= vr == vg
        if d and max(d) > rtol:
            i = max(range(len(d)), key=d.__getitem__)
            problems.append(f"rank {rank}: value {i} differs by {d[i]:.3g} relative (> {rtol:g}): "
                            f"gosym {vg[i]!r}, {ref.backend} {vr[i]!r}")
        if vr:
            lasts = (vr[-1], vg[-1])
    if not rels and not problems:
        problems.append("no rank returned any value")
    if got.problem and not problems:
        # every value matched, but gosym's job did not end well: a teardown that hung until
        # the job's deadline, or a rank that failed after its scenarios, is gosym's failure
        problems.append(f"gosym's job did not end cleanly after its scenarios "
                        f"({teardown(got)})")
    for run in (ref, got):
        if run.problem and problems:
            problems.append(f"{run.backend} job: {run.problem}"[-6000:])
    secs = tuple(((j.entry(0, name) or {}).get("seconds") or 0.0) for j in (ref, got))
    return Outcome(name, device, world, not problems, max(rels) if rels else None,
                   bitwise and bool(rels), lasts[0], lasts[1], problems, secs, rtol,
                   (round(ref.seconds, 2), round(got.seconds, 2)),
                   (got.ranks[0] or {}).get("phases") if got.ranks else None)


def teardown(run: JobRun) -> str:
    """Where each rank of run got to after its scenarios (the worker's phases)."""
    where = []
    for r, res in enumerate(run.ranks):
        ph = (res or {}).get("phases") or {}
        if "destroy_s" in ph:
            where.append(f"rank {r}: destroyed in {ph['destroy_s']} s, then hung or failed "
                         f"at exit")
        elif ph.get("destroy_started"):
            where.append(f"rank {r}: in destroy_process_group")
        else:
            where.append(f"rank {r}: before its teardown")
    return "; ".join(where)


def shards_for(device: str) -> int:
    """How many job pairs run a (device, world) pair's scenarios at once: GOSYM_CLIENTS_SHARDS,
    else 3 on CUDA (the GPUs are shared and torch.compile is CPU time, so three pairs take
    little longer than one) and 1 on CPU (a CI host has two cores)."""
    return max(1, int(os.environ.get("GOSYM_CLIENTS_SHARDS") or (3 if device == "cuda" else 1)))


def run_pair(device: str, world: int, names: list[str], outdir: Path) -> list[Outcome]:
    """The reference jobs and the gosym jobs of ``names`` at ``world``; an Outcome per name.
    The names are dealt to shards_for(device) shards, and every shard's two jobs run at
    once (compared values do not depend on timing). With GOSYM_TEST_OUT set, the outcomes
    are written there as soon as they are known, shard by shard
    (clients-<device>-w<world>.json), so a run cut off later keeps those of the shards that
    finished."""
    k = shards_for(device)
    shards = [names[i::k] for i in range(k) if names[i::k]]
    backends = (REFERENCE[device], "gosym")
    dest = None
    if os.environ.get("GOSYM_TEST_OUT"):
        dest = Path(os.environ["GOSYM_TEST_OUT"]) / f"clients-{device}-w{world}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
    out, runs = [], {}
    with concurrent.futures.ThreadPoolExecutor(len(shards) * 2) as pool:
        pending = {}
        for i, sh in enumerate(shards):
            d = Path(outdir) / f"shard{i}"
            pending[pool.submit(reference_job, device, world, sh, d)] = (i, backends[0])
            pending[pool.submit(run_job, device, world, "gosym", sh, d)] = (i, "gosym")
        for f in concurrent.futures.as_completed(pending):
            i, b = pending[f]
            runs[(i, b)] = f.result()
            if any((i, x) not in runs for x in backends):
                continue  # the shard's other job still runs
            out += [compare(n, device, world, runs[(i, backends[0])], runs[(i, "gosym")])
                    for n in shards[i]]
            out.sort(key=lambda o: names.index(o.scenario))
            if dest is not None:
                dest.write_text(json.dumps([o.row() for o in out], indent=1))
    return out
