"""ProcessGroup.allocate_tensor (gosym.memory.comm_empty) on a machine without CUDA: host
devices are not served (FSDP2 then allocates with torch.empty, as for any group that says
so), and asking anyway is a clear error; the library exports the allocator torch's MemPool
calls. The GPU side (segments bound once, reused by the caching allocator, results equal
to NCCL's) is cuda_reg_worker.py's comm_alloc part."""

from __future__ import annotations

import ctypes

import pytest
import torch

from gosym import _lib, memory
from gosym.backend import ProcessGroupGosym


def test_host_devices_are_not_served():
    assert memory.comm_supported("cpu") is False
    assert memory.comm_supported(torch.device("cpu")) is False
    with pytest.raises(ValueError, match="allocate_tensor serves CUDA devices"):
        ProcessGroupGosym.allocate_tensor(None, 4, dtype=torch.float32, device=torch.device("cpu"))


def test_the_library_exports_torchs_allocator_pair():
    for name in ("gosym_pool_alloc", "gosym_pool_free"):
        assert ctypes.cast(getattr(_lib.lib, name), ctypes.c_void_p).value
    # a size torch never asks for, and no CUDA here: NULL, not a crash
    assert _lib.lib.gosym_pool_alloc(0, 0, None) is None
    assert _lib.lib.gosym_pool_alloc(1 << 20, -1, None) is None
