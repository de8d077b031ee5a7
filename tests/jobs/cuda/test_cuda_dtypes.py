"""Issue 22's dtypes on CUDA tensors at more than 2 ranks (cuda_worker.py's
matrix, movement, dtypes and errors parts; test_cuda.py runs the whole worker at 2):
all_reduce, reduce_scatter and reduce of float32, float16, bfloat16, float64, int8,
uint8, int32, int64, bool and fp8 (e4m3fn, e5m2) with every reduce op, complex as
(real, imag) pairs, data movement of any dtype. Float results at world > 2 are checked
against a float64 reference within a stated tolerance (cuda_worker._tolerance) and
against NCCL; integers exactly; every rank's replicated results bitwise identical.

Each world from 3 to the machine's GPU count runs the default algorithms (LL kernels for
small ops, the direct two-shot for large all_reduce) and the staged one-shot/two-shot
kernels; the largest world also runs the direct path for everything and the semaphore
protocol. Marked gpu: skipped where the machine has fewer GPUs than the world.
"""

from __future__ import annotations

import pytest

from conftest import cuda_ranks, run_torchrun

pytestmark = pytest.mark.gpu

PARTS = "matrix,movement,dtypes,errors"
PATHS = {
    "default": {},
    "staged": {"GOSYM_GPU_LL_MAX": "0", "GOSYM_GPU_DIRECT_MIN": str(1 << 62)},
    "direct": {"GOSYM_GPU_LL_MAX": "0", "GOSYM_GPU_DIRECT_MIN": "1"},
    "sema": {"GOSYM_GPU_LL_MAX": "0", "GOSYM_GPU_SEMA_MIN": "1", "GOSYM_GPU_TWOSHOT_MIN": str(1 << 62),
             "GOSYM_GPU_CAPTURE_DIRECT_MIN": str(1 << 62), "GOSYM_GPU_DIRECT_MIN": str(32 << 20)},
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("world", [3, 4, 8])
def test_dtypes_at_world(tmp_path, world, path):
    ndev = cuda_ranks()
    if ndev < world:
        pytest.skip(f"needs {world} CUDA devices, this machine has {ndev}")
    if path in ("direct", "sema") and world != ndev:
        pytest.skip("the direct and semaphore paths run at the machine's largest world only")
    res = run_torchrun("cuda_worker", world, ["--timeout", 120], timeout=900, outdir=tmp_path / "out",
                       env={"GOSYM_GPU_STAGE_BYTES": str(1 << 20), "CUDA_WORKER_PARTS": PARTS,
                            **PATHS[path]})
    res.assert_ok()
    r0 = res.results[0]
    for r, x in enumerate(res.results):
        assert x["info"]["parts_done"] == PARTS.split(","), (r, x["info"]["parts_done"])
    for kind in ("all_reduce/float8_e5m2/", "all_reduce/bool/", "complex/all_reduce/", "move/all_gather/"):
        assert any(k.startswith(kind) for k in r0["digests"]), f"no {kind} case ran"
    for r, x in enumerate(res.results[1:], 1):
        differ = sorted(k for k in r0["digests"] if r0["digests"][k] != x["digests"].get(k))
        assert not differ, f"ranks 0 and {r} got different bits in {differ[:10]}"
