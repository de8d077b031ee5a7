"""The ranks' watch on each other across hosts (gosym.hier.watch.Watch), on real Gloo groups
of separate processes on this host: a rank killed is news to every other rank within
seconds, a failure told at one rank reaches every other, ranks that leave in any order are
no news and leave no thread waiting. What a HierGroup does with the news runs in
tests/jobs/hier (test_rank_lost) and, on CUDA, scripts/hier_lost_probe.py."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

ROOT = pathlib.Path(__file__).resolve().parents[2]

# One rank: makes its watch on a Gloo group, acts out its part of the scenario, and prints
# one JSON line: the news it heard (or none) and whether its watch's thread still waits.
_RANK = textwrap.dedent("""
    import atexit, datetime, json, os, signal, sys, threading, time
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    at_exit = {}

    def report_at_exit():  # registered first: runs after gosym's own exit handler
        print(json.dumps({"rank": rank, "heard": heard, "waiting": w.alive(),
                          "exit_s": time.monotonic() - at_exit["t"]}), flush=True)

    atexit.register(report_at_exit)
    from gosym.hier.watch import Watch

    rank, size, port, scenario = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = dist.PrefixStore("w/", dist.TCPStore("127.0.0.1", port, is_master=False,
                                                  timeout=datetime.timedelta(seconds=30)))
    pg = c10d.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=30))
    heard, got = [], threading.Event()
    t0 = time.monotonic()

    def on_news(pred, origin, dead, error):
        heard.append({"pred": pred, "origin": origin, "dead": dead, "error": error is not None,
                      "after": time.monotonic() - t0})
        got.set()

    w = Watch(pg, rank, size, on_news, "t", datetime.timedelta(seconds=10))
    store.add("ready", 1)
    while int(store.add("ready", 0)) < size:
        time.sleep(0.01)
    t0 = time.monotonic()
    victim = 1
    if scenario == "kill":
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        got.wait(10)
        w.tell_dead(heard[0]["dead"]) if heard else None
    elif scenario == "failed":
        if rank == victim:
            w.tell_failed(rank)
        got.wait(10)
        if heard:
            w.tell_failed(heard[0]["origin"])
        time.sleep(1)  # the news has gone around: nothing comes back to the victim
    elif scenario == "leave":
        time.sleep(0.2 * ((rank * 7) % size))  # leave in an order other than the ring's
        w.close()
    elif scenario == "exit":  # no rank leaves; the last exits 1.5 s after the others
        if rank == size - 1:
            time.sleep(1.5)
        at_exit["t"] = time.monotonic()
        sys.exit(0)
    store.add("done", 1)
    while int(store.add("done", 0)) < size - (scenario == "kill"):
        time.sleep(0.01)
    deadline = time.monotonic() + 5
    while w.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if scenario != "leave":
        w.close()
    print(json.dumps({"rank": rank, "heard": heard, "waiting": w.alive()}), flush=True)
    os._exit(0)
""")


def _run(scenario, size):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"),
                                                      os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(size), str(store.port),
                               scenario], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for r in range(size)]
    out = {}
    for r, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=90)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        out[r] = json.loads(lines[-1]) if lines else {"stderr": stderr[-2000:]}
        out[r]["rc"] = p.returncode
    return out


SIZES = sorted({2, 3, max(2, min(os.cpu_count() or 2, 5))})


@pytest.mark.parametrize("size", SIZES)
def test_a_killed_rank_is_news_to_every_other_within_seconds(size):
    out = _run("kill", size)
    victim, succ = 1, 2 % size
    for r, res in out.items():
        if r == victim:
            assert "heard" not in res, res  # it was killed before printing
            continue
        assert res.get("heard"), (r, res)
        news = res["heard"][0]
        assert news["dead"] == victim and news["origin"] is None, (r, news)
        assert news["after"] < 5, (r, news)
        # the successor saw the connection close; the others were told around the ring
        assert news["error"] == (r == succ) and news["pred"] == (r - 1) % size, (r, news)
        assert len(res["heard"]) == 1, (r, res)


@pytest.mark.parametrize("size", SIZES)
def test_a_failure_told_at_one_rank_reaches_every_other_once(size):
    out = _run("failed", size)
    for r, res in out.items():
        if r == 1:
            assert res["heard"] == [], res  # its own news, come around, is not news
        else:
            heard = [(n["origin"], n["dead"], n["error"]) for n in res["heard"]]
            assert heard == [(1, None, False)], (r, res)
        assert not res["waiting"], (r, res)


@pytest.mark.parametrize("size", SIZES)
def test_ranks_that_leave_in_any_order_are_no_news_and_leave_no_thread(size):
    out = _run("leave", size)
    for r, res in out.items():
        assert res.get("heard") == [], (r, res)
        assert not res["waiting"], (r, res)


@pytest.mark.parametrize("size", SIZES)
def test_at_exit_every_rank_leaves_and_waits_for_its_predecessor(size):
    """Ranks that exit without leaving (no destroy_process_group), rank 0's predecessor 1.5 s
    after the others: every process exits cleanly with no watch thread left in Gloo's wait,
    rank 0 once its predecessor left. A thread still waiting when the interpreter finalized
    aborted the process when its wait returned (session 35: hosts of 2 and 1 ranks)."""
    out = _run("exit", size)
    for r, res in out.items():
        assert res["rc"] == 0 and res.get("heard") == [], (r, res)
        assert not res["waiting"], (r, res)
    assert out[0]["exit_s"] > 1.0, out[0]  # it waited for rank size - 1 to leave
