"""The settings table (gobackend/internal/config, docs/TUNABLES.md) seen from Python.

A bad value of an engine setting is an error at group creation that names the variable and what it
accepts; a setting every rank must share, set differently on two ranks, fails the connect on both,
naming the variable and both values, instead of hanging. Python's own GOSYM_HIER_* settings take
their defaults and limits from the table (python/gosym/_table.py, generated from it) and are
compared across ranks at group creation the same way.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import BACKEND, REPO, base_env, free_port, run_python

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


def run_ranks(world: int, env_of) -> list[str]:
    """INIT on world ranks (env_of(rank): the rank's own variables); every rank's output."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = base_env({"PORT": port, "WORLD": str(world), "RANK": str(r), **env_of(r)})
        procs.append(subprocess.Popen([sys.executable, "-c", INIT], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return outs


@pytest.mark.parametrize("world", [2, 3])
def test_agreed_setting_mismatch_names_both_values(world):
    """The last rank sets GOSYM_GPU_FUSE_MAX differently: no rank connects; every rank names the
    variable and both values, well before the timeout, even one whose own send reached the last
    rank after it gave up (it still reads what that rank sent first)."""
    outs = run_ranks(world, lambda r: {"GOSYM_GPU_FUSE_MAX": "4096" if r == world - 1 else ""})
    assert not any("CONNECTED" in out for out in outs), outs
    assert "GOSYM_GPU_FUSE_MAX=4194304, this rank GOSYM_GPU_FUSE_MAX=4096" in outs[-1], outs[-1]
    for r, out in enumerate(outs[:-1]):
        assert f"rank {world - 1} has GOSYM_GPU_FUSE_MAX=4096, this rank GOSYM_GPU_FUSE_MAX=4194304" in out, (r, out)


def test_python_table_is_current():
    """python/gosym/_table.py is what scripts/gen_settings.py makes of docs/TUNABLES.md now."""
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_settings.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_hier_defaults_and_limits_come_from_the_table():
    """Unset, a GOSYM_HIER_* setting is the table's default; below the table's least, an error
    naming what it accepts."""
    code = ("import os\nfrom gosym import _settings, _table\n"
            "for name, (default, least) in _table.WHOLE.items():\n"
            "    os.environ.pop(name, None)\n"
            "    assert _settings.whole(name) == default, name\n"
            "    os.environ[name] = str(least)\n"
            "    assert _settings.whole(name) == least, name\n"
            "    os.environ[name] = str(least - 1)\n"
            "    try:\n        _settings.whole(name)\n    except ValueError as e:\n        print(e)\n"
            "    del os.environ[name]\n"
            "print(sorted(_settings.hier()))\n")
    p = run_python(code)
    assert p.returncode == 0, p.stderr
    for name, least in [("GOSYM_HIER_RAIL_MIN", 1), ("GOSYM_HIER_CHUNK", 4096),
                        ("GOSYM_HIER_REPORT_S", 0), ("GOSYM_HIER_SWAP_MAX", 0)]:
        assert f"{name}='{least - 1}': accepts a whole number from {least}" in p.stdout, p.stdout
    assert ("['GOSYM_HIER_CHOICE', 'GOSYM_HIER_CHUNK', 'GOSYM_HIER_CPU_P2P', 'GOSYM_HIER_LINK', "
            "'GOSYM_HIER_RAIL_MIN', 'GOSYM_HIER_REPORT_S', 'GOSYM_HIER_SWAP_MAX']") in p.stdout


def test_hier_choice_takes_its_words():
    """GOSYM_HIER_CHOICE: the table's default (table) when unset, each of its words, and a
    ValueError naming the variable and the words for anything else."""
    code = ("import os\nfrom gosym import _settings\n"
            "os.environ.pop('GOSYM_HIER_CHOICE', None)\n"
            "print(_settings.hier()['GOSYM_HIER_CHOICE'])\n"
            "for v in ('table', 'hier', 'flat'):\n"
            "    os.environ['GOSYM_HIER_CHOICE'] = v\n"
            "    assert _settings.hier()['GOSYM_HIER_CHOICE'] == v, v\n"
            "os.environ['GOSYM_HIER_CHOICE'] = 'fast'\n"
            "try:\n    _settings.hier()\nexcept ValueError as e:\n    print(e)\n")
    p = run_python(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "table", p.stdout
    assert "GOSYM_HIER_CHOICE='fast': accepts one of table, hier, flat" in p.stdout, p.stdout


@pytest.mark.parametrize("world", [2, 3])
def test_hier_setting_mismatch_names_both_values(world):
    """The last rank sets GOSYM_HIER_CHUNK differently (it chooses the algorithm across hosts):
    no rank creates the group; every rank raises a ValueError naming the variable and both
    values. A rank that writes the default out agrees with one that leaves it unset."""
    outs = run_ranks(world, lambda r: {"GOSYM_HIER_CHUNK": "8192" if r == world - 1 else ""})
    assert not any("CONNECTED" in out for out in outs), outs
    assert outs[-1].startswith("ValueError:"), outs[-1]
    assert "rank 0 has GOSYM_HIER_CHUNK=4194304, this rank GOSYM_HIER_CHUNK=8192" in outs[-1], outs[-1]
    for r, out in enumerate(outs[:-1]):
        assert out.startswith("ValueError:"), (r, out)
        assert f"rank {world - 1} has GOSYM_HIER_CHUNK=8192, this rank GOSYM_HIER_CHUNK=4194304" in out, (r, out)
    outs = run_ranks(world, lambda r: {"GOSYM_HIER_CHUNK": "4194304" if r == world - 1 else ""})
    assert all("CONNECTED" in out for out in outs), outs
