"""Launchers and skips for the gosym pytest suites (the layout: tests/README.md).

The suites never run collectives in the pytest process: each test of tests/jobs starts a
multi-process job (torchrun, or a plain per-rank spawner where torchrun's
"one rank died, kill the rest" policy would hide what the survivors do) with a
hard deadline. A worker lives beside its driver (tests/jobs/<topic>/<name>_worker.py) and
reports through files in a per-test directory ($GOSYM_TEST_OUT): ``rank<r>.json``
results and ``pid.<r>``. On a deadline the launcher dumps every worker's Python stacks
(SIGUSR1, see jobs/common/wcommon.py), kills the whole process tree and fails with the
output.

Drivers, workers and their helpers import each other by module name, as one flat
namespace: tests/jobs/common and every topic directory of tests/jobs are on the path of
the pytest process (below) and of every child (base_env).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PYDIR = REPO / "python"
JOBS = TESTS / "jobs"
# The directories of the suites' modules: shared helpers first, then each topic's.
MODULE_DIRS = [JOBS / "common", *sorted(d for d in JOBS.iterdir() if d.is_dir() and
                                        d.name not in ("common", "__pycache__"))]
sys.path[:0] = [str(d) for d in MODULE_DIRS if str(d) not in sys.path]

# GOSYM_TEST_BACKEND=gloo runs the same workers on gloo: a check of the tests
# themselves (gloo lacks some ops and dtypes, so expect those to fail).
BACKEND = os.environ.get("GOSYM_TEST_BACKEND", "gosym")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped cleanly without one")
    config.addinivalue_line(
        "markers", "without_library: runs even when libgosym.so cannot be loaded (tests the failure paths)"
    )


def worker_script(worker: str) -> Path:
    """The script of a worker: tests/jobs/<topic>/<worker>.py by name (".py" optional), or
    the path itself when absolute."""
    path = Path(worker)
    if path.is_absolute():
        return path
    name = path.name if path.suffix == ".py" else f"{path.name}.py"
    found = [d / name for d in MODULE_DIRS if (d / name).is_file()]
    if len(found) != 1:
        raise FileNotFoundError(f"worker {worker!r}: {len(found)} of tests/jobs/*/{name}")
    return found[0]


def base_env(extra: dict | None = None) -> dict:
    """Environment for every child: the source tree's python/ first, then the suites'
    module directories, one OpenMP thread."""
    env = dict(os.environ)
    paths = (str(PYDIR), *map(str, MODULE_DIRS), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``python -c code`` in a fresh interpreter (for import-time behaviour)."""
    return subprocess.run(
        [sys.executable, "-c", code], env=base_env(env), capture_output=True, text=True, timeout=timeout
    )


@functools.cache
def environment_probe() -> dict:
    """Whether gosym imports and CUDA exists, checked once in a child process."""
    code = (
        "import json, torch\n"
        "err = None\n"
        "try:\n"
        "    import gosym\n"
        "except Exception as e:\n"
        "    err = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps({'gosym_error': err, 'cuda': torch.cuda.is_available()}))\n"
    )
    try:
        p = run_python(code)
    except subprocess.TimeoutExpired:
        return {"gosym_error": "probe timed out", "cuda": False}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"gosym_error": f"probe failed: {p.stderr[-2000:]}", "cuda": False}


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices torch sees, checked once in a child process (0 on any failure)."""
    p = run_python("import torch; print(torch.cuda.device_count())")
    try:
        return int(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return 0


# GOSYM_TEST_RANKS_PER_GPU=k: the GPU jobs put k ranks on each GPU (their worlds are k times
# the GPUs; workers take GPU LOCAL_RANK % GPUs, tests/jobs/common/wcommon.cuda_device), so a
# machine of one GPU runs them at world 2 and more: every path's logic, not its speed (the
# ranks' kernels take turns on the GPU; a GPU's "peer" is itself).
RANKS_PER_GPU = int(os.environ.get("GOSYM_TEST_RANKS_PER_GPU", "1") or "1")


def cuda_ranks() -> int:
    """The ranks the GPU jobs may place: GOSYM_TEST_RANKS_PER_GPU per CUDA device."""
    return cuda_device_count() * max(1, RANKS_PER_GPU)


def gpu_world() -> int:
    """The world of the GPU jobs: one rank per CUDA device of the machine, or
    GOSYM_TEST_RANKS_PER_GPU (0 without CUDA; no child process then)."""
    return cuda_ranks() if environment_probe()["cuda"] else 0


def gpu_worlds_for(n: int) -> list[int]:
    """The worlds the main GPU jobs run at on n GPUs: 2, 3 and n, those that fit (one GPU:
    world 1)."""
    return sorted(w for w in {2, 3, n} if 1 <= w <= n)


def gpu_worlds() -> list[int]:
    """gpu_worlds_for this machine; [2] without GPUs (need_gpus then skips the job)."""
    return gpu_worlds_for(gpu_world()) or [2]


def need_gpus(world: int) -> None:
    """Skips the test unless the machine has world CUDA devices (GPU slots, with
    GOSYM_TEST_RANKS_PER_GPU)."""
    if gpu_world() < world:
        pytest.skip(f"needs {world} CUDA devices, the machine has {gpu_world()}")


def assert_same_bits(digests: list[dict]) -> None:
    """Every rank recorded the same replicated results (case -> digest), bit for bit."""
    first = digests[0]
    for r, d in enumerate(digests[1:], 1):
        other = sorted(set(d) ^ set(first))
        assert not other, f"ranks 0 and {r} recorded different cases: {other[:10]}"
        differ = sorted(k for k in first if d[k] != first[k])
        assert not differ, f"ranks 0 and {r} got different bits in {differ[:10]}"


def pytest_collection_modifyitems(config, items):
    probe = environment_probe()
    no_lib = pytest.mark.skip(reason=f"gosym cannot be imported: {probe['gosym_error']}")
    no_gpu = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if probe["gosym_error"] and BACKEND == "gosym" and "without_library" not in item.keywords:
            item.add_marker(no_lib)
        if "gpu" in item.keywords and not probe["cuda"]:
            item.add_marker(no_gpu)


# -- process-tree handling -----------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid: int) -> list[int]:
    kids, out, todo = _children_map(), [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def _signal(pids, sig) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- jobs ------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    returncode: int  # torchrun's exit status, or the first non-zero rank status
    rank_returncodes: list[int] | None  # per rank (spawn launcher only)
    output: str
    results: list[dict | None]  # rank<r>.json per rank, None where a rank wrote none
    elapsed: float
    outdir: Path

    def tail(self, n: int = 12000) -> str:
        return self.output[-n:]

    def failures(self) -> list[str]:
        out = []
        for r, res in enumerate(self.results):
            if res is None:
                out.append(f"[rank {r}] wrote no result")
            else:
                out.extend(res.get("failures", []))
        return out

    def assert_ok(self) -> None:
        """Every rank exited 0, wrote a result and recorded no failed check."""
        fails = self.failures()
        if self.returncode != 0 or fails:
            shown = "\n".join(f[:1500] for f in fails[:60])
            more = f"\n... and {len(fails) - 60} more" if len(fails) > 60 else ""
            pytest.fail(
                f"returncode {self.returncode}, {len(fails)} failed checks:\n{shown}{more}\n"
                f"--- output tail ---\n{self.tail(6000)}",
                pytrace=False,
            )


class Job:
    """A running multi-rank job. ``launcher``: "torchrun" or "spawn" (one Popen per rank).

    The spawn launcher sets the same variables torchrun does (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT, ...) and, unlike torchrun, leaves the survivors alone when
    a rank dies, so failure tests can watch what they report.
    """

    def __init__(self, worker: str, nproc: int, args=(), *, outdir: Path, timeout: float = 300,
                 env: dict | None = None, launcher: str = "torchrun"):
        self.nproc, self.timeout, self.outdir, self.launcher = nproc, timeout, Path(outdir), launcher
        self.outdir.mkdir(parents=True, exist_ok=True)
        script = worker_script(worker)
        args = ["--backend", BACKEND, *map(str, args)]
        env = base_env({"GOSYM_TEST_OUT": str(self.outdir), **(env or {})})
        self.start = time.monotonic()
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        if launcher == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   "--max-restarts=0", str(script), *args]
            self._popen(cmd, env, self.outdir / "torchrun.log")
        elif launcher == "spawn":
            port = free_port()
            for r in range(nproc):
                renv = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                            LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(port))
                self._popen([sys.executable, str(script), *args], renv, self.outdir / f"rank{r}.log")
        else:
            raise ValueError(f"unknown launcher {launcher!r}")

    def _popen(self, cmd, env, log: Path) -> None:
        self.logs.append(log)
        with open(log, "wb") as f:
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def remaining(self) -> float:
        return self.timeout - (time.monotonic() - self.start)

    def wait_for(self, name: str, timeout: float = 120) -> Path:
        """Waits until a worker creates $GOSYM_TEST_OUT/<name>; fails if all exit first."""
        path = self.outdir / name
        deadline = time.monotonic() + min(timeout, max(self.remaining(), 0))
        while not path.exists():
            if time.monotonic() > deadline or self.poll_all_exited():
                self.kill(dump_stacks=True)
                pytest.fail(f"{name} never appeared\n{self.output()[-6000:]}", pytrace=False)
            time.sleep(0.05)
        return path

    def pid_of(self, rank: int, timeout: float = 120) -> int:
        """The pid a worker announced at startup."""
        return int(self.wait_for(f"pid.{rank}", timeout).read_text())

    def marker(self, name: str) -> None:
        """Creates $GOSYM_TEST_OUT/<name>, which workers wait for (wcommon.wait_for_marker)."""
        (self.outdir / name).write_text("go")

    def poll_all_exited(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def output(self) -> str:
        parts = []
        for log in self.logs:
            try:
                text = log.read_text(errors="replace")
            except OSError:
                text = ""
            parts.append(f"===== {log.name} =====\n{text}" if len(self.logs) > 1 else text)
        return "\n".join(parts)

    def results(self) -> list[dict | None]:
        out = []
        for r in range(self.nproc):
            path = self.outdir / f"rank{r}.json"
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                out.append(None)
        return out

    def kill(self, dump_stacks: bool = False) -> None:
        pids = [p.pid for p in self.procs]
        tree = pids + [d for p in pids for d in descendants(p)]
        if dump_stacks:
            # Workers print their stacks on SIGUSR1; torchrun's agent would just die of it.
            workers = [p for p in tree if p not in pids] if self.launcher == "torchrun" else tree
            _signal(workers, signal.SIGUSR1)
            time.sleep(1.0)
            tree = list(dict.fromkeys(tree + [d for p in pids for d in descendants(p)]))
        _signal(tree, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def wait(self) -> RunResult:
        """Waits for every process; past the deadline, dumps stacks, kills and fails the test."""
        for p in self.procs:
            try:
                p.wait(timeout=max(self.remaining(), 0.01))
            except subprocess.TimeoutExpired:
                self.kill(dump_stacks=True)
                res = self.results()
                got = [r for r, x in enumerate(res) if x is not None]
                pytest.fail(
                    f"job ran past its {self.timeout:.0f}s deadline and was killed "
                    f"(ranks with results: {got}); failures so far: {self._fails(res)}\n"
                    f"--- output tail ---\n{self.output()[-12000:]}",
                    pytrace=False,
                )
        # torchrun's workers live in their own sessions: reap stragglers too.
        leftovers = [d for p in self.procs for d in descendants(p.pid)]
        _signal(leftovers, signal.SIGKILL)
        codes = [p.returncode for p in self.procs]
        return RunResult(
            returncode=next((c for c in codes if c != 0), 0),
            rank_returncodes=codes if len(self.procs) > 1 else None,
            output=self.output(),
            results=self.results(),
            elapsed=time.monotonic() - self.start,
            outdir=self.outdir,
        )

    @staticmethod
    def _fails(res) -> list[str]:
        return [f for x in res if x for f in x.get("failures", [])][:20]


def run_torchrun(worker: str, nproc: int, args=(), timeout: float = 300, *, outdir: Path,
                 env: dict | None = None, launcher: str = "torchrun") -> RunResult:
    """Runs worker_script(worker) on ``nproc`` ranks and waits (hard deadline ``timeout``)."""
    return Job(worker, nproc, args, outdir=outdir, timeout=timeout, env=env, launcher=launcher).wait()


@pytest.fixture
def outdir(tmp_path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d
