"""gosym._c10d, the group's C++ backend (gosym.c10d): torch gets it where it is built, its
short path runs without gosym's Python, everything else reaches the Python group, and where
it is off or built for another torch, torch gets the Python group itself. Each case runs in a
fresh interpreter at world 1 (HashStore); the jobs in tests/jobs run it at every world."""

from __future__ import annotations

import json

import pytest
from conftest import PYDIR, run_python

BUILT = any(PYDIR.joinpath("gosym").glob("_c10d.cpython-*.so"))
pytestmark = pytest.mark.skipif(not BUILT, reason="gosym._c10d is not built (make lib builds it)")

INIT = """
import datetime, json, warnings, torch, torch.distributed as dist, gosym
from gosym import backend, c10d
dist.init_process_group("gosym", store=dist.HashStore(), rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
pg = dist.group.WORLD
out = {"torch": type(pg).__name__, "backend": type(pg._get_backend(torch.device("cpu"))).__name__,
       "python": type(gosym.group()).__name__, "why": c10d.why()}
"""


def run(body: str, env: dict | None = None) -> dict:
    p = run_python(INIT + body + "\nprint(json.dumps(out))\n", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_torch_gets_the_cpp_backend():
    out = run("")
    assert out == {"torch": "ProcessGroup", "backend": "Group", "python": "ProcessGroupGosym",
                   "why": ""}, out


def test_off_gives_the_python_group():
    out = run("", env={"GOSYM_C10D": "0"})
    assert out["torch"] == "ProcessGroupGosym" and out["python"] == "ProcessGroupGosym", out


def test_other_torch_falls_back_saying_why():
    # the module is loaded only under the torch it was built for (_c10d.torch)
    p = run_python("import torch\ntorch.__version__ = '0.0.1'\n" + INIT
                   + "\nprint(json.dumps(out))\n")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["torch"] == "ProcessGroupGosym", out
    assert "built for torch" in out["why"] and "0.0.1" in out["why"], out
    assert "gosym._c10d" in p.stderr and "RuntimeWarning" in p.stderr, p.stderr[-2000:]


SHORT = """
calls = []
real = backend._run
def spy(h, desc):
    calls.append(len(desc))
    return real(h, desc)
backend._run = spy
g = torch.Generator().manual_seed(7)
x = torch.randn(1000, generator=g, dtype=torch.float64)
want = x.clone()
dist.all_reduce(x)                   # synchronous, dense, on the host: the C++ short path
dist.broadcast(x, 0)
o = torch.full((1000,), float("nan"), dtype=torch.float64)
dist.all_gather_into_tensor(o, x)
v = torch.full((1000,), float("nan"), dtype=torch.float64)
dist.all_to_all_single(v, x, [1000], [1000])  # splits: pieces built in C++
out["short_calls"] = len(calls)
out["short_equal"] = bool(torch.equal(x, want) and torch.equal(o, want) and torch.equal(v, want))
w = dist.all_reduce(x, async_op=True)  # asynchronous: the Python group's Work
out["async_work"] = [w.wait(), w.is_completed(), w.is_success()]
nc = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous: Python path
dist.all_reduce(nc)
out["noncontiguous"] = bool(torch.equal(nc, torch.arange(12.).reshape(3, 4).t()))
out["python_calls"] = len(calls)
"""


def test_short_path_skips_the_python_group():
    out = run(SHORT)
    assert out["short_calls"] == 0 and out["short_equal"], out
    assert out["async_work"] == [True, True, True], out
    assert out["noncontiguous"] and out["python_calls"] >= 1, out


ERRORS = """
def err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return [type(e).__name__, str(e)]
    return None
t = torch.ones(8, dtype=torch.float8_e4m3fn)
out["fp8"] = err(lambda: dist.all_reduce(t))  # the engine refuses fp8 reductions on the host
out["bad_root"] = err(lambda: dist.broadcast(torch.ones(4), 3))
# splits that do not sum to dim 0: the C++ side hands them to the Python group, which says so
out["bad_splits"] = err(lambda: dist.all_to_all_single(torch.ones(8), torch.ones(8), [7], [8]))
dist.destroy_process_group(pg)
out["after"] = err(lambda: gosym.group(pg).allreduce([torch.ones(4)]))
"""


def test_errors_match_the_python_group():
    cpp, py = run(ERRORS), run(ERRORS, env={"GOSYM_C10D": "0"})
    assert cpp["fp8"] is not None and cpp["fp8"] == py["fp8"], (cpp["fp8"], py["fp8"])
    assert cpp["fp8"][0] == "NotImplementedError" and cpp["fp8"][1].startswith("gosym: ")
    assert cpp["bad_root"] is not None and cpp["bad_root"][0] == py["bad_root"][0], (cpp, py)
    assert cpp["bad_splits"] is not None and cpp["bad_splits"] == py["bad_splits"], (cpp, py)
    assert cpp["bad_splits"][0] == "ValueError" and "output splits" in cpp["bad_splits"][1], cpp
    assert cpp["after"] is not None and "shut down" in cpp["after"][1], cpp


def test_debug_detail_wrapper_is_seen_through():
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: torch wraps a C++ backend in its checking wrapper, as
    # NCCL's; gosym.group() and gosym.stats() still reach the Python group behind it
    out = run('out["stats"] = gosym.stats()["rank"]\n', env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert out["backend"] == "_ProcessGroupWrapper" and out["python"] == "ProcessGroupGosym", out
    assert out["stats"] == 0, out


def test_hier_choice_matches_the_schedule():
    """gosym._c10d.Hier makes a group across hosts' choice between its flat group and the
    hierarchical schedule in C++, from schedule.steps of each place (CUDA, then the host):
    at every size, the answer of schedule.choose for that device, for a table with points,
    a shape the table lacks and each GOSYM_HIER_CHOICE mode."""
    import ctypes
    import random

    import torch
    from gosym import c10d
    from gosym.hier import schedule

    m = c10d.module()
    assert m is not None, c10d.why()
    table = {("cuda", "2x2", "loopback"): {"ops": {
        "all_reduce": ((1024, 5.0, 3.0), (65536, 2.0, 9.0), (1 << 20, 9.0, 4.0)),
        "broadcast": ((4096, 1.0, 2.0),),
        "all_to_all_single": ((1024, 1.0, 2.0),)}},
        ("cpu", "2x2", "network"): {"ops": {
            "all_reduce": ((1024, 2.0, 3.0), (65536, 9.0, 2.0)),
            "reduce_scatter_tensor": ((4096, 3.0, 2.0), (1 << 22, 1.0, 5.0)),
            "all_to_all_single": ((1024, 1.0, 2.0),)}}}
    cells, shared = (ctypes.c_int64 * 9)(), (ctypes.c_int64 * 2)(0, -1)
    rng = random.Random(7)
    sizes = [0, 1, 1023, 1024, 1025, 4095, 4096, 65535, 65536, 1 << 20, (1 << 20) + 1, 1 << 34]
    sizes += [rng.randrange(1, 1 << 28) for _ in range(300)]
    seen = set()
    devs = ("cuda", "cpu")  # Hier's places, in order
    for shape in ("2x2", "3x1"):
        for mode in schedule.MODES:
            steps = [schedule.steps(dev, op, shape, mode, table, link_key="network")
                     for dev in devs for op in schedule.FLAT_OPS]
            h = m.Hier(object(), 0, 4, ctypes.addressof(shared), 0, 0, [], [], 30.0,
                       ctypes.addressof(cells), [torch.float32], steps, 1 << 30)
            for place, dev in enumerate(devs):
                for i, op in enumerate(schedule.FLAT_OPS):
                    for n in sizes:
                        want = schedule.choose(dev, op, n, shape, mode, table,
                                               link_key="network") == schedule.FLAT
                        got = h.flat_choice(place, i, n)
                        seen.add((dev, got))
                        assert got == want, (shape, mode, dev, op, n)
    assert seen == {(d, f) for d in devs for f in (True, False)}
    with pytest.raises(RuntimeError, match="steps of 5 ops"):
        m.Hier(object(), 0, 4, ctypes.addressof(shared), 0, 0, [], [], 30.0,
               ctypes.addressof(cells), [torch.float32], steps[:len(schedule.FLAT_OPS)], 1 << 30)


def test_abort_cuda_breaks_the_group_with_its_reason():
    """ProcessGroupGosym.abort_cuda (what a group across hosts calls beside its NCCL groups'
    aborts): every later op, on the C++ short path too, fails with the reason; shutdown
    after it is clean."""
    out = run("""
t = torch.ones(4)
dist.all_reduce(t)
gosym.group().abort_cuda("a failure elsewhere")
try:
    dist.all_reduce(t)
    out["after"] = None
except Exception as e:
    out["after"] = f"{type(e).__name__}: {e}"
dist.destroy_process_group()
out["destroyed"] = True
""")
    assert "aborted its CUDA work on the group: a failure elsewhere" in (out["after"] or ""), out
    assert out["destroyed"], out
