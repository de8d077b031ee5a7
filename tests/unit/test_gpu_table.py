"""The CUDA engine's choices by measurement (gobackend/internal/gpu/measured.go, written by
scripts/gpu_table.py): the Go table says what its reports say, and the rules choose what
their docstrings promise on reports made up here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO, base_env


def _script():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("gpu_table", REPO / "scripts" / "gpu_table.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.pop(0)


def test_table_is_what_its_reports_say():
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_table.py"), "--check"],
                       capture_output=True, text=True, timeout=60, env=base_env())
    assert p.returncode == 0, p.stdout + p.stderr


def _report(tmp_path, name, op, times, world=4, gpu="NVIDIA H200", nccl=None):
    rows = [{"backend": "gosym", "op": op, "size": s, "median_us": t} for s, t in times.items()]
    # read by the "against" rule alone
    for s, t in (nccl or {1 << 20: 0.001}).items():
        rows.append({"backend": "nccl", "op": op, "size": s, "median_us": t})
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps({"machine": {"world_size": world, "gpu": gpu}, "results": rows}))
    return [(str(f), None)]


def test_rules(tmp_path, monkeypatch):
    g = _script()
    monkeypatch.setattr(g, "REPO", tmp_path)
    M = 1 << 20
    # "from": on loses at 1 MiB, wins at 4, loses at 8 (by noise or not), wins from 16 on: the
    # threshold is 16 MiB, in a rank's output for reduce_scatter (world 4: 4 MiB)
    off = _report(tmp_path, "off", "reduce_scatter_tensor", {M: 10, 4 * M: 50, 8 * M: 60, 16 * M: 90, 64 * M: 300})
    on = _report(tmp_path, "on", "reduce_scatter_tensor", {M: 20, 4 * M: 40, 8 * M: 61, 16 * M: 80, 64 * M: 299})
    shape, steps = g.rule_from(dict(knob="K", op="reduce_scatter_tensor", off=off, on=on, unit="output"))
    assert shape == (4, 90) and steps == [(0, 4 * M)]
    _, steps = g.rule_from(dict(knob="K", op="reduce_scatter_tensor", off=off, on=on))
    assert steps == [(0, 16 * M)]
    # "best": 16 wins clearly at 8 and 64 MiB, within the tolerance of the default at 256 MiB
    variants = {
        16: _report(tmp_path, "b16", "broadcast", {4 * M: 39, 8 * M: 40, 64 * M: 210, 256 * M: 784}),
        32: _report(tmp_path, "b32", "broadcast", {4 * M: 25, 8 * M: 42, 64 * M: 220, 256 * M: 785}),
    }
    _, steps = g.rule_best(dict(knob="K", op="broadcast", default=32, variants=variants))
    assert steps == [(0, 32), (8 * M, 16), (256 * M, 32)]
    # reports of another world do not mix with these
    variants[16] = variants[16] + _report(tmp_path, "w2", "broadcast", {4 * M: 1}, world=2)
    with pytest.raises(SystemExit, match="mix worlds"):
        g.rule_best(dict(knob="K", op="broadcast", default=32, variants=variants))
    # "against": one value at every size, the best worst ratio to NCCL in each variant's own
    # job: 64 leads by 1.3x up to 4 MiB but loses 0.87x at 1 GiB; 0 loses 0.92x at 4 MiB and
    # leads elsewhere, so 0 (its worst is the better); with 64's 1 GiB at NCCL's time, 64
    op = "all_to_all_single_skew"
    nccl = {M: 40, 4 * M: 40, 1024 * M: 2800}
    host = _report(tmp_path, "host", op, {M: 41, 4 * M: 43.5, 1024 * M: 2740}, nccl=nccl)
    paced = _report(tmp_path, "paced", op, {M: 30, 4 * M: 31, 1024 * M: 3220}, nccl=nccl)
    e = dict(knob="K", op=op, against="nccl", default=0, variants={0: host, 64: paced})
    assert g.rule_against(e) == ((4, 90), [(0, 0)])
    e["variants"][64] = _report(tmp_path, "paced2", op, {M: 30, 4 * M: 31, 1024 * M: 2790}, nccl=nccl)
    assert g.rule_against(e) == ((4, 90), [(0, 64)])
    # 64's worst (0.925) within the tolerance of the default's (40 / 43.5 = 0.9195): 0 stays
    e["variants"][64] = _report(tmp_path, "paced3", op, {M: 30, 4 * M: 31, 1024 * M: 3000},
                                nccl={M: 40, 4 * M: 40, 1024 * M: 2775})
    assert g.rule_against(e)[1] == [(0, 0)]
