"""The CUDA data plane on 2 GPUs, one rank each (workers/cuda_worker.py): all_reduce of
every dtype x op x size class, and every other collective, bitwise equal to NCCL and to
an exact reference, identical on every rank, stream-ordered without host syncs,
CUDA-graph capturable; barrier; clear errors for what the data plane does not run;
send/recv on CUDA tensors (workers/cuda_p2p_worker.py); DDP on 2 GPUs trains exactly
like DDP on NCCL.

Marked gpu: skipped without CUDA, and without a second device. The job runs with a small
GOSYM_GPU_STAGE_BYTES so that the large cases run in several staging chunks.
"""

from __future__ import annotations


import pytest
import math

from conftest import cuda_device_count, run_torchrun

pytestmark = pytest.mark.gpu


def _worker_job(tmp_path_factory, name, **env):
    """One launch of workers/cuda_worker.py on 2 GPUs with a 1 MiB staging (the large
    cases run in several chunks) and env on top."""
    if cuda_device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    out = tmp_path_factory.mktemp(name) / "out"
    return run_torchrun("cuda_worker", 2, ["--timeout", 120], timeout=600, outdir=out,
                        env={"GOSYM_GPU_STAGE_BYTES": str(1 << 20), **env})


@pytest.fixture(scope="module")
def cuda_job(tmp_path_factory):
    return _worker_job(tmp_path_factory, "cuda")


@pytest.fixture(scope="module")
def cuda_direct_job(tmp_path_factory):
    """Every op large enough for the direct path (peers' own buffers through CUDA IPC),
    small all_reduce included (no LL kernel, which comes first), skewed all_to_all
    included (the host agreement leads there)."""
    return _worker_job(tmp_path_factory, "cuda_direct", GOSYM_GPU_DIRECT_MIN="1",
                       GOSYM_GPU_LL_MAX="0")


@pytest.fixture(scope="module")
def cuda_oneshot_job(tmp_path_factory):
    """Small all_reduce on the one-shot kernel over the staging (GOSYM_GPU_LL_MAX=0: no
    LL kernel), eager (staging fused into the launch) and captured (copy + kernel); and
    skewed all_to_all on the paced kernel (GOSYM_GPU_A2AV_BLOCKS=64: 64 blocks per pair,
    2 KiB slots in the 1 MiB staging)."""
    return _worker_job(tmp_path_factory, "cuda_oneshot", GOSYM_GPU_LL_MAX="0",
                       GOSYM_GPU_A2AV_BLOCKS="64")


@pytest.fixture(scope="module")
def cuda_sema_job(tmp_path_factory):
    """Every all_reduce and reduce on the semaphore protocol (issue #6's unicast path:
    stream-memop signals, per-peer semaphores, the pull kernel)."""
    # Sema in graphs too, and for eager all_reduce below 32 MiB (the direct path starts
    # where all_reduce would run two-shot).
    return _worker_job(tmp_path_factory, "cuda_sema", GOSYM_GPU_SEMA_MIN="1",
                       GOSYM_GPU_CAPTURE_DIRECT_MIN=str(1 << 62), GOSYM_GPU_TWOSHOT_MIN=str(1 << 62),
                       GOSYM_GPU_DIRECT_MIN=str(32 << 20), GOSYM_GPU_LL_MAX="0")


def _checked(job, min_passed):
    """Rank 0's results of a worker job that passed, after checking that it ran enough
    checks and that every rank got the same bits for every replicated result."""
    job.assert_ok()
    r0 = job.results[0]
    assert r0["passed"] >= min_passed, "the worker ran suspiciously few checks"
    for r, x in enumerate(job.results[1:], 1):
        differ = sorted(k for k in r0["digests"] if r0["digests"][k] != x["digests"].get(k))
        assert not differ, f"ranks 0 and {r} got different bits in {differ[:10]}"
    return r0


def test_sema_path(cuda_sema_job):
    r0 = _checked(cuda_sema_job, 700)
    assert r0.get("graph") == "captured", r0.get("graph")
    st = r0["stats"]
    # all but the empty all_reduce (one-shot, nothing to do) and the 32 MiB int64 ones
    # (the direct two-shot on the peers' buffers comes first)
    assert st["gpu_algo_sema_unicast"] > 1000, st
    assert st["gpu_algo_oneshot"] + st["gpu_algo_twoshot"] <= 8, st
    assert st["gpu_nvls"] is False and st["gpu_algo_nvls"] == 0, st


def test_direct_path(cuda_direct_job):
    r0 = _checked(cuda_direct_job, 700)
    st = r0["stats"]
    assert st["gpu_direct_ops"] > 1000, st
    # buffers reused op after op are mapped once: the cache serves the rest
    assert 0 < st["gpu_ipc_opens"] < st["gpu_ipc_hits"], st
    assert st["gpu_paced_all_to_all"] == 0, st


def test_oneshot_path(cuda_oneshot_job):
    r0 = _checked(cuda_oneshot_job, 700)
    assert r0.get("graph") == "captured", r0.get("graph")
    st = r0["stats"]
    assert st["gpu_algo_ll"] == 0 and st["gpu_algo_oneshot"] > 10_000, st
    # skewed all_to_all on the paced kernel: the sweep, 400 back to back, the graph's
    # warm-up and capture (replays are not counted)
    assert st["gpu_paced_all_to_all"] >= 400, st


def test_all_reduce_and_barrier(cuda_job):
    r0 = _checked(cuda_job, 400)
    assert len(r0["digests"]) >= 80
    # the LL kernel by default: back_to_back's 10k all_reduce (1, 3 and 8 blocks), the
    # captured ones and every small case of the sweep
    assert r0["stats"]["gpu_algo_ll"] > 10_000, r0["stats"]


def test_cuda_graph(cuda_job):
    cuda_job.assert_ok()
    status = [r.get("graph") for r in cuda_job.results]
    if any(s != "captured" for s in status):
        pytest.xfail(f"CUDA graph capture of gosym all_reduce: {status}")
    assert all("graph" in r["digests"] for r in cuda_job.results)


def test_other_collectives(cuda_job):
    cuda_job.assert_ok()
    r0 = cuda_job.results[0]
    assert r0["passed"] >= 700, "the worker ran suspiciously few checks"
    for kind in ("broadcast/", "all_gather/"):
        assert sum(k.startswith(kind) for k in r0["digests"]) >= 8, f"too few {kind} cases ran"
    # the small ones on the LL move kernel by default: back_to_back_moves' 1800 moves
    # (its all_reduce and reduce_scatter count as gpu_algo_ll) and the sweep's 64
    assert r0["stats"]["gpu_ll_moves"] > 1800, r0["stats"]
    assert r0["stats"]["gpu_paced_all_to_all"] == 0, r0["stats"]  # off by default


def test_cuda_p2p(tmp_path):
    """send/recv, isend/irecv and batch_isend_irecv on CUDA tensors: every dtype and size
    up to 40 MiB bit for bit, the 64 MiB ring in both orders, tags in order, strided
    tensors, a captured CUDA graph replayed, CPU and CUDA messages of one pair
    interleaved, a drained mismatch that the pair's next op raises."""
    if cuda_device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    res = run_torchrun("cuda_p2p_worker", 2, ["--timeout", 30], timeout=600,
                       outdir=tmp_path / "p2p")
    res.assert_ok()
    for r, x in enumerate(res.results):
        assert x["passed"] >= 200, f"rank {r}: the worker ran suspiciously few checks"
        assert x.get("graph") == "captured", x.get("graph")
        assert x["stats"]["gpu_p2p_channels"] == 1, x["stats"]


def test_ddp_on_gpus_matches_nccl(tmp_path):
    if cuda_device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    res = run_torchrun("ddp_worker", 2, ["--timeout", 120, "--device", "cuda"], timeout=420,
                       outdir=tmp_path / "ddp")
    res.assert_ok()
    for r, x in enumerate(res.results):
        main, nccl = x["losses"]["main"], x["losses"]["gloo"]
        assert len(main) == 50 and all(math.isfinite(v) for v in main), main
        diff = [i for i, (a, b) in enumerate(zip(main, nccl)) if a != b]
        assert not diff, (f"rank {r}: losses differ from NCCL's at {len(diff)} steps, first "
                          f"{diff[0]}: {main[diff[0]]!r} vs {nccl[diff[0]]!r}")
        assert x["digest"]["main"] == x["digest"]["gloo"], f"rank {r}: final parameters differ"


def test_device_timeout_names_the_peer(tmp_path):
    """Rank 1 reaches a barrier kernel of a group with a 3 s timeout 9 s late (its GPU
    sleeps): rank 0's kernel gives up and records rank 1; the barrier's wait and the next
    CUDA op on rank 0 raise an error naming rank 1, stats show it, and both ranks then
    meet on the default group and destroy cleanly; the same for a small all_reduce (the LL
    kernel's wait for the peer's lines) on another group, and for a small all_gather (the
    LL move kernel) on a fourth (workers/cuda_timeout_worker.py)."""
    if cuda_device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    res = run_torchrun("cuda_timeout_worker", 2, ["--timeout", 120], timeout=300,
                       outdir=tmp_path / "out")
    res.assert_ok()
    r0, r1 = res.results
    assert r0["passed"] >= 13 and r1["passed"] >= 8, (r0, r1)
