"""Launching one of gosym's benchmark modules as a torchrun job of fresh processes (bench,
startbench, stepbench, callcost): the command and the environment that make the package
importable in the ranks, and running the job so that it ends as a whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading


def module_job(nproc: int, module: str, *args: str, env=None) -> tuple[list[str], dict]:
    """(command, environment) that run `python -m module args...` on nproc ranks of one
    standalone torchrun job, with this package's parent directory on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg, env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would pick, minus its banner
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", module, *args]
    return cmd, env


def run_job(cmd: list[str], env: dict, timeout: float, capture: bool = True) -> subprocess.CompletedProcess:
    """Runs a torchrun job (cmd) in a session of its own and returns it completed; past timeout
    seconds, or when this process gets SIGTERM (`timeout` on a device step), it stops the job
    first: SIGTERM to torchrun, which stops its ranks (each in a session of its own, out of
    reach of a signal to torchrun's group), then SIGKILL. Killing torchrun alone would leave the
    ranks running, holding the pipes this waits on (a hung device step, session 25). Past
    timeout the returncode is 124 and the output what was read."""
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True} if capture else {}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, **kw)

    def stop():
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                return

    def on_term(signum, frame):
        stop()
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, on_term) if main else None
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            stop()
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a rank that outlived torchrun holds the pipes
                out = err = ""
            return subprocess.CompletedProcess(cmd, 124, out or "", err or "")
        except KeyboardInterrupt:
            stop()
            raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)
