"""Launching one of gosym's benchmark modules as a torchrun job of fresh processes (startbench,
callcost): the command and the environment that make the package importable in the ranks."""

from __future__ import annotations

import os
import sys


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
