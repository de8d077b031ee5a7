"""Memory registration (registration_worker.py).

- export/import: a gosym.empty range exported with mem_map, packed, imported by
  another rank (another process), written from both sides; private memory, bad
  and tampered blobs, unmapped handles fail with clear errors;
- lazy binding: the first collective on a gosym.empty buffer binds it to the
  group, later ones reuse it; other groups bind their own; views use the
  enclosing region; GOSYM_DIRECT_MIN decides which sizes bind;
- zero-copy results: nine ops x float32/bfloat16/int64 x 1/1025/3M+7 elements on
  gosym.empty buffers (read in place) give the same bits as on ordinary tensors;
- GOSYM_ENABLE_UBR=no/yes/try;
- 1000 group create/use/destroy cycles (about 3 ms each here, so all 1000 fit
  easily) and teardown in both orders leak no binding, handle, fd or memory.
"""

from __future__ import annotations

import pytest
from conftest import BACKEND, run_torchrun

pytestmark = pytest.mark.skipif(BACKEND != "gosym", reason="gosym's registration counters and APIs")

# The engine's defaults, whatever the caller's environment says ("" reads as unset).
DEFAULTS = {"GOSYM_DIRECT_MIN": "", "GOSYM_ENABLE_UBR": ""}


def run(outdir, world, parts, env=None, args=(), timeout=240):
    res = run_torchrun("registration_worker", world, ["--parts", parts, *map(str, args)], timeout=timeout,
                       outdir=outdir, env={**DEFAULTS, **(env or {})})
    res.assert_ok()
    return res


def test_export_import(outdir):
    res = run(outdir, 2, "share,bad_blobs")
    assert all(r["passed"] >= 400 for r in res.results), "the worker ran suspiciously few checks"
    flips = res.results[0]["info"]["flipped_byte_outcomes"]
    assert flips.get("ValueError", 0) > 0, f"no flipped byte was caught by the parser: {flips}"


def test_lazy_registration(outdir):
    """Default GOSYM_DIRECT_MIN (64 KiB) and GOSYM_ENABLE_UBR (try)."""
    res = run(outdir, 2, "lazy,ubr")
    info = res.results[0]["info"]
    assert info["direct_min"] == 64 * 1024 and info["ubr_mode"] == "try", info


@pytest.mark.parametrize("world", [2, 4])
def test_zero_copy_matches_ordinary(world, outdir):
    """GOSYM_DIRECT_MIN=1: every size, down to one element, is read in place."""
    res = run(outdir, world, "lazy,matrix,chain", env={"GOSYM_DIRECT_MIN": "1"}, timeout=300)
    info = res.results[0]["info"]
    assert info["direct_min"] == 1 and info["matrix_cases"] == 81, info


@pytest.mark.parametrize("mode", ["no", "yes"])
def test_enable_ubr(mode, outdir):
    res = run(outdir, 2, "ubr", env={"GOSYM_ENABLE_UBR": mode})
    assert res.results[0]["info"]["ubr_mode"] == mode


def test_group_cycles(outdir):
    """1000 x (new_group + all_reduce on a long-lived gosym.empty buffer + destroy):
    bindings back to the pre-loop value after every destroy; handles, endpoints,
    regions, fds and RSS (50 MiB slack) flat."""
    res = run(outdir, 2, "cycles", args=["--cycles", 1000])
    print("cycles:", {k: v for k, v in res.results[0]["info"]["cycles"].items() if k != "stats"})


def test_teardown_orders(outdir):
    """20 cycles alternating (free buffer, unmap handle, destroy group) and
    (destroy group, free buffer, unmap handle)."""
    run(outdir, 2, "teardown")
