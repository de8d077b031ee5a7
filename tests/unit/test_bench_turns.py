"""gosym.bench's turns: with --interleave K a case's backends take alternating turns of their
timed samples, in an order where each backend follows each one alike, each backend's samples
spread over the same number of turns; without it each backend runs all of its samples in one
turn, one backend after another. Every backend is timed exactly the count its warmup chose, in
either order."""

import json
import subprocess
import sys
import types

from conftest import base_env

from gosym.bench import Bench, Plan, turn_order


def _stub(interleave, iters):
    """A Bench whose warmups choose iters[b] samples and whose turns are only recorded."""
    b = Bench.__new__(Bench)
    b.args = types.SimpleNamespace(interleave=interleave)
    log = []

    def plan(backend, case):
        p = Plan(backend, case, 1)
        if iters[backend] is None:
            p.error = "failed"
        else:
            p.iters = iters[backend]
            log.append(("warm", backend))
        return p

    def turn(p, n):
        log.append((p.backend, n))
        p.times += [n] * n

    b._plan, b._turn = plan, turn
    b._record = lambda p: {"error": p.error} if p.error else {"samples": len(p.times)}
    return b, log


def test_interleaved_turns_alternate_and_time_every_sample():
    b, log = _stub(3, {"gosym": 7, "gloo": 2, "gosym-flat": 5})
    recs = b.measure({"gosym": None, "gloo": None, "gosym-flat": None})
    assert recs == {"gosym": {"samples": 7}, "gloo": {"samples": 2}, "gosym-flat": {"samples": 5}}
    # every warmup first, then ceil(7 / 3) = 3 turns each, each backend's count split evenly,
    # in turn_order(3) (gloo has no sample in its first turn)
    assert turn_order(3) == [0, 0, 1, 0, 2, 1, 1, 2, 2]
    assert log == [("warm", "gosym"), ("warm", "gloo"), ("warm", "gosym-flat"),
                   ("gosym", 2), ("gosym", 2), ("gosym", 3), ("gosym-flat", 1),
                   ("gloo", 1), ("gloo", 1), ("gosym-flat", 2), ("gosym-flat", 2)]


def test_turn_order_puts_every_backend_after_every_backend_once():
    assert turn_order(0) == [] and turn_order(1) == [0]
    for n in range(2, 7):
        order = turn_order(n)
        assert sorted(order) == sorted(list(range(n)) * n)
        pairs = list(zip(order, order[1:] + order[:1]))  # the order repeats
        assert sorted(pairs) == [(a, b) for a in range(n) for b in range(n)]


def test_turns_round_up_to_whole_passes_of_the_order():
    b, log = _stub(5, {"gosym": 11, "gloo": 4})  # ceil(11 / 5) = 3 turns: two passes of 2
    b.measure({"gosym": None, "gloo": None})
    assert [n for who, n in log if who == "gosym"] == [2, 3, 3, 3]
    assert [n for who, n in log if who == "gloo"] == [1, 1, 1, 1]
    assert [who for who, _ in log[2:]] == ["gosym", "gosym", "gloo", "gloo"] * 2


def test_sequential_turns_run_each_backend_in_one_block():
    b, log = _stub(0, {"gosym": 7, "gloo": 2})
    assert b.measure({"gosym": None, "gloo": None}) == {"gosym": {"samples": 7},
                                                       "gloo": {"samples": 2}}
    assert log == [("warm", "gosym"), ("gosym", 7), ("warm", "gloo"), ("gloo", 2)]


def test_a_failed_warmup_takes_no_turn_and_leaves_the_others_theirs():
    b, log = _stub(4, {"gosym": None, "gloo": 8})
    assert b.measure({"gosym": None, "gloo": None}) == {"gosym": {"error": "failed"},
                                                       "gloo": {"samples": 8}}
    assert log == [("warm", "gloo"), ("gloo", 4), ("gloo", 4)]


def test_path_counters_add_up_over_turns():
    p = Plan("gosym", None, 1)
    p.count({"gpu_ops": 10, "gpu_direct_ops": 4}, {"gpu_ops": 13, "gpu_direct_ops": 6,
                                                    "gpu_dependent_launch": True})
    p.count({"gpu_ops": 20, "gpu_direct_ops": 9}, {"gpu_ops": 22, "gpu_direct_ops": 9,
                                                    "gpu_dependent_launch": True})
    assert p.counters == {"gpu_ops": 5, "gpu_direct_ops": 2, "gpu_dependent_launch": True}


def test_interleaved_job_measures_and_checks_every_backend(tmp_path):
    """A real job of 2 ranks on the CPU: every (op, size, backend) timed with the count its
    warmup chose, gosym checked against gloo, the order recorded in the JSON."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "gosym.bench", "--device", "cpu", "--nproc", "2",
           "--backends", "gosym,gosym-bound,gloo", "--ops", "all_reduce,broadcast",
           "--sizes", "1K,64K", "--interleave", "3", "--target-time", "0.01",
           "--min-iters", "7", "--timeout", "240", "--json", str(out)]
    res = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    rep = json.loads(out.read_text())
    assert rep["config"]["interleave"] == 3
    assert "turns" in rep["method"]["order"]
    got = {(r["op"], r["size"], r["backend"]): r for r in rep["results"]}
    assert set(got) == {(op, size, b) for op in ("all_reduce", "broadcast")
                        for size in (1024, 65536) for b in ("gosym", "gosym-bound", "gloo")}
    for key, r in got.items():
        assert "error" not in r, (key, r)
        assert r["iters"] >= 7 and 0 < r["min_us"] <= r["median_us"] <= r["p90_us"], (key, r)
    checked = {(c["op"], c["size"], c["backend"]) for c in rep["checks"] if c["ok"]}
    assert checked == {k for k in got if k[2] != "gloo"}
    assert rep["errors"] == []


def test_a_record_takes_the_slowest_rank_per_sample_and_reads_the_path():
    """_record: per sample the max over ranks, divided by the ops in a sample (a batch or a
    graph replay); the path from the counters the turns added up; a short series padded."""
    import torch

    b = Bench.__new__(Bench)
    b.args = types.SimpleNamespace(warmup=3)
    b.torch, b.world, b.ctrl = torch, 2, None
    other = torch.tensor([0, 4000, 8000, 2000], dtype=torch.int64)  # the other rank's samples

    def all_gather(out, t, group=None):
        out[0].copy_(t)
        out[1].copy_(other)
    b.dist = types.SimpleNamespace(all_gather=all_gather)
    case = types.SimpleNamespace(bytes=1 << 20, bus_bytes=1 << 20)
    p = Plan("gosym", case, 2)
    p.iters, p.times = 3, [6000, 2000, 6000]
    p.count({"gpu_ops": 0, "gpu_direct_ops": 0}, {"gpu_ops": 6, "gpu_direct_ops": 6})
    rec = b._record(p)
    # max over ranks: 6000, 8000, 6000 ns a sample of 2 ops -> 3, 4, 3 us an op
    assert rec["median_us"] == 3.0 and rec["min_us"] == 3.0 and rec["p90_us"] == 4.0
    assert rec["rank0_median_us"] == 3.0 and rec["iters"] == 3 and rec["warmup"] == 3
    assert rec["path"] == "direct"
    other[0] = 1  # the other rank failed a turn
    assert "error" in b._record(p)
