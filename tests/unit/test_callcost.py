"""gosym.callcost, the call-cost bench: it runs on the CPU and gives every layer a time, and the
driver timing it relies on counts only while it is on."""

import json
import os
import subprocess
import sys

from gosym import _lib, callcost


def test_callcost_gives_every_layer(tmp_path):
    out = tmp_path / "callcost.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [os.path.dirname(os.path.dirname(callcost.__file__)),
                      os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-m", "gosym.callcost", "--nproc", "2", "--calls", "20",
                          "--bursts", "3", "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-4000:]
    us = json.loads(out.read_text())["us"]
    for op in callcost.OPS:
        for layer in ("torch fake group", "torch null Python group", f"gosym dist.{op}",
                      f"gosym dist.{op}, Python group", "gosym method", "gosym method, bare",
                      "native call"):
            assert us[f"{op}: {layer}"] > 0, (op, layer, us)
        # on the CPU no driver call is made; the split adds up to the Python group's total
        assert us[f"{op}: driver calls per op"] == 0
        parts = sum(v for k, v in us.items() if k.startswith(f"{op}: = "))
        assert abs(parts - us[f"{op}: gosym dist.{op}, Python group"]) < 1e-6, us
    assert us["ctypes floor"] > 0


def test_driver_timing_switch_reports_counters():
    # the counters exist and do not move while timing is off (no CUDA here: nothing calls the
    # driver either way; the fake-driver Go test covers the counting itself)
    before = json.loads(_lib.process_stats_json())
    assert {"driver_calls", "driver_ns"} <= before.keys()
    assert _lib.lib.gosym_driver_timing(1) == 0
    assert _lib.lib.gosym_driver_timing(0) == 0
    after = json.loads(_lib.process_stats_json())
    assert after["driver_calls"] == before["driver_calls"]
