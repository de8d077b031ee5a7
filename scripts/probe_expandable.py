"""What the CUDA driver reports for memory of torch's expandable segments
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), to decide how gosym could share it:
per tensor, cuMemGetAddressRange's base and size, whether cuIpcGetMemHandle works,
whether cuMemRetainAllocationHandle gives a handle and that handle a POSIX fd, and what
gosym.mem_map says. One process, one GPU; prints JSON."""

import ctypes
import json
import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch  # noqa: E402

import gosym  # noqa: E402

cu = ctypes.CDLL("libcuda.so.1")
torch.cuda.init()
out = {"alloc_conf": os.environ["PYTORCH_CUDA_ALLOC_CONF"], "tensors": []}
keep = []
for mib in (1, 3, 30, 100):
    t = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    keep.append(t)
    p = t.data_ptr()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    r_range = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(p))
    h = ctypes.create_string_buffer(64)
    r_ipc = cu.cuIpcGetMemHandle(h, ctypes.c_uint64(base.value or p))
    ah = ctypes.c_uint64()
    r_retain = cu.cuMemRetainAllocationHandle(ctypes.byref(ah), ctypes.c_void_p(p))
    fd = ctypes.c_int(-1)
    r_export = cu.cuMemExportToShareableHandle(ctypes.byref(fd), ah, 1, ctypes.c_ulonglong(0)) if r_retain == 0 else -1
    if fd.value >= 0:
        os.close(fd.value)
    if r_retain == 0:
        cu.cuMemRelease(ah)
    m = gosym.mem_map(t)
    info = m.info()
    m.unmap()
    out["tensors"].append({"mib": mib, "ptr": hex(p), "range_rc": r_range, "base": hex(base.value),
                           "size": size.value, "ptr_offset": p - base.value, "ipc_rc": r_ipc,
                           "retain_rc": r_retain, "export_fd_rc": r_export,
                           "gosym_shareable": info.get("shareable"), "why_private": info.get("why_private")})
print(json.dumps(out, indent=1))
