"""The settings table (gobackend/internal/config, docs/TUNABLES.md) seen from Python.

A bad value of an engine setting is an error at group creation that names the variable and what it
accepts; a setting every rank must share, set differently on two ranks, fails the connect on both,
naming the variable and both values, instead of hanging.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import BACKEND, base_env, free_port, run_python

pytestmark = pytest.mark.skipif(BACKEND != "gosym", reason="gosym's own settings")

INIT = (
    "import os, torch.distributed as dist, gosym\n"
    "try:\n"
    "    dist.init_process_group('gosym', store=dist.TCPStore('127.0.0.1', int(os.environ['PORT']),"
    " int(os.environ['WORLD']), int(os.environ['RANK']) == 0), rank=int(os.environ['RANK']),"
    " world_size=int(os.environ['WORLD']))\n"
    "    dist.barrier()\n"
    "    print('CONNECTED')\n"
    "except Exception as e:\n"
    "    print(type(e).__name__ + ':', e)\n"
)


@pytest.mark.parametrize("name,value,accepts", [
    ("GOSYM_GPU_LL_MAX", "-1", "a whole number from 0"),
    ("GOSYM_SPIN_US", "20us", "a whole number from 1"),
    ("GOSYM_ENABLE_UBR", "maybe", "one of try, yes, no"),
    ("GOSYM_DEBUG", "yes", "one of 0, 1"),
])
def test_bad_value_names_variable(name, value, accepts):
    p = run_python(INIT, env={"PORT": str(free_port()), "WORLD": "1", "RANK": "0", name: value})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.startswith("ValueError:"), p.stdout
    assert f'{name}="{value}": want {accepts}' in p.stdout, p.stdout


@pytest.mark.parametrize("world", [2, 3])
def test_agreed_setting_mismatch_names_both_values(world):
    """The last rank sets GOSYM_GPU_FUSE_MAX differently: no rank connects; every rank names the
    variable and both values, well before the timeout, even one whose own send reached the last
    rank after it gave up (it still reads what that rank sent first)."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = base_env({"PORT": port, "WORLD": str(world), "RANK": str(r), "GOSYM_GPU_FUSE_MAX": ""})
        if r == world - 1:
            env["GOSYM_GPU_FUSE_MAX"] = "4096"
        procs.append(subprocess.Popen([sys.executable, "-c", INIT], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert not any("CONNECTED" in out for out in outs), outs
    assert "GOSYM_GPU_FUSE_MAX=4194304, this rank GOSYM_GPU_FUSE_MAX=4096" in outs[-1], outs[-1]
    for r, out in enumerate(outs[:-1]):
        assert f"rank {world - 1} has GOSYM_GPU_FUSE_MAX=4096, this rank GOSYM_GPU_FUSE_MAX=4194304" in out, (r, out)
