"""Nothing on disk: the host data plane shares memory through memfd, so no rank
ever maps /dev/shm files and nothing is left there when the ranks exit, even
when one is SIGKILLed."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import Job

SHM = "/dev/shm"


def shm_listing() -> set[str]:
    return set(os.listdir(SHM)) if os.path.isdir(SHM) else set()


def shared_files(pid: int) -> tuple[list[str], int]:
    """(paths under /dev/shm the process maps or holds open, number of memfd mappings)."""
    shm, memfd = set(), 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "/memfd:" in line:
                memfd += 1
            elif f" {SHM}/" in line:
                shm.add(line.split(None, 5)[-1].strip())
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(SHM + "/"):
            shm.add(target)
    return sorted(shm), memfd


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("kill", [False, True], ids=["clean-exit", "kill-9"])
def test_no_dev_shm_residue(kill, outdir):
    world, victim = 3, 1
    before = shm_listing()
    job = Job("shm_worker", world, ["--op-timeout", 5], outdir=outdir, timeout=180, launcher="spawn")
    pids = [job.pid_of(r) for r in range(world)]
    for r in range(world):
        job.wait_for(f"ready.{r}")
    problems = []
    for r, pid in enumerate(pids):
        shm, memfd = shared_files(pid)
        if shm:
            problems.append(f"rank {r} uses /dev/shm files: {shm}")
        if memfd == 0:
            problems.append(f"rank {r} maps no memfd region after CPU collectives")
    if kill:
        os.kill(pids[victim], signal.SIGKILL)
    job.marker("go")
    res = job.wait()

    time.sleep(0.5)
    leaked = sorted(shm_listing() - before)
    if leaked:
        problems.append(f"new entries in {SHM} after the job: {leaked}")
    still = [p for p in pids if alive(p)]
    if still:
        problems.append(f"processes still alive: {still}")
    for r, x in enumerate(res.results):
        if kill and r == victim:
            continue
        after = (x or {}).get("after_go")
        if after is None:
            problems.append(f"rank {r}: no result after go (rc {res.rank_returncodes[r]})")
        elif kill and not after.get("clear"):
            problems.append(f"rank {r}: after the kill: {after}")
        elif not kill and not after.get("ok"):
            problems.append(f"rank {r}: final all_reduce: {after}")
    want = [(-9 if kill and r == victim else 0) for r in range(world)]
    if res.rank_returncodes != want:
        problems.append(f"exit statuses {res.rank_returncodes}, wanted {want}")
    assert not problems, "\n".join(problems) + f"\n--- output ---\n{res.tail(4000)}"
