"""Registration of CUDA memory (cuda_reg_worker.py on every GPU; CPU-only parts here).

CPU (any machine; CUDA hidden from torch and from the engine): mem_map of device memory
and mem_import of a CUDA blob fail with clear errors, blob_info reads a CUDA blob, bad
blobs are ValueErrors.

GPU (marked gpu, skipped without 2 devices; one rank per GPU): mem_map'ed caching-allocator
tensors in all_reduce / all_gather / reduce_scatter / all_to_all / broadcast at 1 KiB, 1 MiB
+ 3 elements and 8 MiB, against the float64 reference (gpuref.py's tolerance for sums
of more than two ranks), bitwise equal to NCCL where NCCL gets the reference, the same bits
on every rank, with poisoned outputs, the binding created once
and reused (gosym.stats); unmap + reallocation at the same address (no stale mapping);
pack -> mem_import in the peer process, reading and writing the peer's tensor; unmap and
group destroy in either order; ProcessGroup.allocate_tensor's buffers (torch's caching
allocator over gosym's segments: bound once, then read in place with no new binding, results
equal to NCCL's); torch's expandable segments (cuda_paged_worker.py):
large ops direct on runs of pages, pages given back and remapped.
"""

from __future__ import annotations

import json
import struct

import pytest
from conftest import BACKEND, assert_same_bits, gpu_world, need_gpus, run_python, run_torchrun

pytestmark = pytest.mark.skipif(BACKEND != "gosym", reason="gosym's registration APIs")

# No CUDA for torch, and a libcuda path that does not exist for the engine.
NO_CUDA = {"CUDA_VISIBLE_DEVICES": "", "GOSYM_LIBCUDA": "/nonexistent/libcuda.so.1"}


def cuda_blob(pid: int, device: int = 0, length: int = 1000, offset: int = 4096) -> bytes:
    """A packed memh of CUDA memory as the engine writes it (memreg/blob.go, version 1):
    header, then one "cudaipc" entry (PCI 0000:1b:00, a 2 MiB allocation, a handle)."""
    header = struct.pack("<IHHIiQQ", 0x484D5347, 1, 0, pid, device, 0x7F2000001000, length)
    payload = struct.pack("<IIIIQQ", 0, 0x1B, 0, 0, 2 << 20, offset) + bytes(range(1, 65))
    return header + b"cudaipc\0" + struct.pack("<I", len(payload)) + payload


def run_checks(code: str) -> dict:
    p = run_python("import json, os, gosym, torch\n" + code, env=NO_CUDA)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_blob_info_reads_cuda_blob():
    blob = cuda_blob(4242)
    out = run_checks(f"print(json.dumps(gosym.blob_info({blob!r})))")
    assert out == {"pid": 4242, "device": 0, "address": 0x7F2000001000, "length": 1000,
                   "transport": "cudaipc", "gpu": "0000:1b:00.0"}, out


def test_without_cuda_clear_errors():
    good = cuda_blob(1)
    bad = [cuda_blob(1)[:-1],                       # truncated
           cuda_blob(1, offset=(2 << 20)),          # the range outside the allocation
           cuda_blob(1, device=-1)]                 # a CUDA entry on host memory
    code = f"""
from gosym import _lib
import ctypes
out = {{}}
def err(name, fn):
    try:
        fn()
        out[name] = None
    except Exception as e:
        out[name] = [type(e).__name__, isinstance(e, RuntimeError), str(e)]
err("map", lambda: gosym.mem_map(0x7f0000000000, 4096, device=0))
err("map_meta", lambda: gosym.mem_map(torch.empty(4, device="meta")))
err("import", lambda: gosym.mem_import({good!r}))
err("import_dev", lambda: gosym.mem_import({good!r}, device=0))
h = ctypes.c_uint64()
err("engine_import_on", lambda: _lib.check(_lib.lib.gosym_mem_import_on({good!r}, {len(good)}, 1000, 0,
                                                                       ctypes.byref(h))))
err("engine_import", lambda: _lib.check(_lib.lib.gosym_mem_import({good!r}, {len(good)}, 1000,
                                                                  ctypes.byref(h))))
for i, b in enumerate({bad!r}):
    err(f"bad{{i}}", lambda: gosym.mem_import(b))
out["stats"] = gosym.process_stats()
print(json.dumps(out))
"""
    out = run_checks(code)
    name, is_rt, msg = out["map"]
    assert is_rt and "CUDA is not available" in msg and "cuda:0" in msg, out["map"]
    assert out["map_meta"][0] == "NotImplementedError" and "meta" in out["map_meta"][2], out
    for k in ("import", "import_dev"):
        name, is_rt, msg = out[k]
        assert name == "RuntimeError" and "CUDA is not available" in msg and "0000:1b:00.0" in msg, out[k]
    name, is_rt, msg = out["engine_import_on"]
    assert is_rt and "CUDA is not available" in msg, out["engine_import_on"]
    name, is_rt, msg = out["engine_import"]
    assert is_rt and "name the device" in msg, out["engine_import"]
    for i in range(3):
        name, _, msg = out[f"bad{i}"]
        assert name == "ValueError" and "bad packed memh" in msg, out[f"bad{i}"]


def test_dlpack_view_of_raw_memory():
    """The DLPack path tensor_from uses for CUDA memory (it names the device, where
    __cuda_array_interface__ lets torch guess), on host memory: a view, not a copy, and
    the release runs once, when the last view goes."""
    out = run_checks("""
import ctypes, gc
from gosym import memory as M
buf = (ctypes.c_float * 10)(*range(10))
freed = []
t = M._from_device_memory(ctypes.addressof(buf), 40, 0, lambda: freed.append(1), device_type=M._DL_CPU)
f = t.view(torch.float32)
res = {"values": f.tolist(), "same": t.data_ptr() == ctypes.addressof(buf)}
v = f[2:5]
f.fill_(7)
res["writes_through"] = buf[9] == 7
del t, f
gc.collect()
res["freed_while_viewed"] = list(freed)
del v
gc.collect()
res["freed"] = list(freed)
res["live"] = len(M._dl_live)
print(json.dumps(res))
""")
    assert out == {"values": [float(i) for i in range(10)], "same": True, "writes_through": True,
                   "freed_while_viewed": [], "freed": [1], "live": 0}, out


@pytest.fixture(scope="module")
def cuda_reg_job(tmp_path_factory):
    world = max(gpu_world(), 2)
    need_gpus(world)
    out = tmp_path_factory.mktemp("cuda_reg") / "out"
    # GOSYM_GPU_A2A_PACED_MIN=0: all_to_all of equal splits on the buffers' direct path, which
    # the jobs check (the measured table sends it to gs_a2av on some GPUs: staged, no binding)
    job = run_torchrun("cuda_reg_worker", world, ["--timeout", 120], timeout=600, outdir=out, env={
        "GOSYM_GPU_REG_DIRECT_MIN": "", "GOSYM_GPU_DIRECT_MIN": "", "GOSYM_ENABLE_UBR": "",
        "GOSYM_GPU_A2A_PACED_MIN": "0"})
    job.assert_ok()
    return job


def _part(job, name):
    """Every rank's result, after checking that each finished part name."""
    for r in job.results:
        assert name in r["info"]["parts_done"], f"part {name} did not finish: {r['info']}"
    return job.results


@pytest.mark.gpu
def test_cuda_registered_collectives(cuda_reg_job):
    """Every op x size vs the reference and NCCL, poisoned outputs, the same bits on every
    rank; binding created once, then reused."""
    res = _part(cuda_reg_job, "collectives")
    assert res[0]["passed"] >= 200, "the worker ran suspiciously few checks"
    assert_same_bits([r["info"]["digests"] for r in res])
    for r in res:
        st = r["info"]["stats_after_collectives"]
        assert st["gpu_bindings_created"] >= 4 and st["gpu_bindings_reused"] > st["gpu_bindings_created"], st
        assert st["gpu_peer_map_hits"] > st["gpu_peer_map_misses"] > 0, st
        assert st["gpu_reg_direct_ops"] >= 20, st


@pytest.mark.gpu
def test_cuda_vmm_collectives(cuda_reg_job):
    """gosym.empty's VMM memory, mem_map'ed: every op x size vs NCCL, bound by fd once, reused;
    not mem_map'ed: direct from GOSYM_GPU_DIRECT_MIN, and freeing it retires the peers' mappings."""
    _part(cuda_reg_job, "vmm")
    _part(cuda_reg_job, "implicit")


@pytest.mark.gpu
def test_cuda_expandable_segments(tmp_path):
    """torch's expandable segments (paged VMM memory, no legacy IPC handle): every op x size vs
    NCCL, large ops (and mem_map'ed ones from 1 MiB) direct on runs of pages published once and
    reused; freed pages given back
    to the driver and remapped: right results, old runs retired, the peers' mappings dropped;
    a CUDA graph that read a run replays right after the run's other pages went (kept)."""
    world = max(gpu_world(), 2)
    need_gpus(world)
    job = run_torchrun("cuda_paged_worker", world, ["--timeout", 120], timeout=600, outdir=tmp_path / "out", env={
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "GOSYM_GPU_DIRECT_MIN": "",
        "GOSYM_GPU_REG_DIRECT_MIN": "", "GOSYM_ENABLE_UBR": "", "GOSYM_GPU_A2A_PACED_MIN": "0"})
    job.assert_ok()
    res = job.results
    for r in res:
        assert r["info"]["parts_done"] == ["segments", "collectives", "registered", "churn", "captured"], r["info"]
    assert res[0]["passed"] >= 100, "the worker ran suspiciously few checks"
    assert_same_bits([r["info"]["digests"] for r in res])
    print("churn:", *(r["info"]["churn"] for r in res))
    print("captured:", res[0]["info"]["captured_shares_run"], *(r["info"]["captured"] for r in res))


@pytest.mark.gpu
def test_cuda_unmap_reallocate(cuda_reg_job):
    """Unmap, free (also back to the driver) and reallocate at the same address: right
    results, the old mapping dropped by the peer, a new binding."""
    r0 = _part(cuda_reg_job, "realloc")[0]
    print("realloc:", r0["info"].get("realloc"))


@pytest.mark.gpu
def test_cuda_pack_import(cuda_reg_job):
    """A CUDA memh packed, imported by the peer process, read and written from there: by
    legacy IPC (caching-allocator memory) and by fd (gosym.empty's VMM memory)."""
    r0 = _part(cuda_reg_job, "import")[0]
    _part(cuda_reg_job, "import_vmm")
    print("import:", r0["info"].get("import_torch"), r0["info"].get("import_gosym"))


@pytest.mark.gpu
def test_cuda_reg_teardown_and_errors(cuda_reg_job):
    """Unmap/destroy in both orders; own-process and wrong-GPU imports."""
    _part(cuda_reg_job, "teardown")
    _part(cuda_reg_job, "errors")
