"""Memory registration: shareable CPU tensors and memory handles.

``gosym.empty`` gives tensors whose memory the ranks of a group can map, so
collectives on them read peers' data in place instead of staging it. Any
buffer can be registered with ``mem_map``; a group binds the enclosing
shareable region lazily, on the first collective that uses it, and reuses the
binding afterwards. ``MemHandle.pack()`` / ``mem_import`` share a region with
another process of this host explicitly.
"""

from __future__ import annotations

import ctypes
import json
import math
import weakref

import torch

from . import _lib

__all__ = ["MemHandle", "empty", "empty_like", "mem_import", "mem_map", "mem_unmap"]


class MemHandle:
    """A registered memory range (an EXPORT from mem_map/empty, or an IMPORT)."""

    __slots__ = ("_h", "__weakref__")

    def __init__(self, handle: int):
        self._h = handle

    @property
    def handle(self) -> int:
        if not self._h:
            raise ValueError("gosym: this memory handle was unmapped")
        return self._h

    def info(self) -> dict:
        """mode, address/length (the exporter's), local_address/local_length, shareable, bindings."""
        return json.loads(_lib.read_string(_lib.lib.gosym_mem_info, self.handle))

    def pack(self) -> bytes:
        """A versioned blob that ``mem_import`` in another process of this host maps."""
        return _lib.read_bytes(_lib.lib.gosym_mem_pack, self.handle)

    def unmap(self) -> None:
        """Unregisters the range; calling it again does nothing."""
        h, self._h = self._h, 0
        if h:
            _lib.check(_lib.lib.gosym_mem_unmap(h))

    @property
    def unmapped(self) -> bool:
        return not self._h

    def __repr__(self) -> str:
        return f"MemHandle({self._h})" if self._h else "MemHandle(unmapped)"


def mem_map(tensor_or_addr, nbytes: int | None = None, device: int = -1) -> MemHandle:
    """Registers a CPU tensor's storage range (or address + nbytes). Talks to no peer."""
    if isinstance(tensor_or_addr, torch.Tensor):
        t = tensor_or_addr
        if t.device.type != "cpu":
            raise NotImplementedError("gosym: mem_map of CUDA tensors needs the CUDA data plane")
        addr, nbytes = t.data_ptr(), t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    else:
        addr = int(tensor_or_addr)
        if nbytes is None:
            raise TypeError("gosym: mem_map(address) needs nbytes")
    if nbytes <= 0:
        raise ValueError(f"gosym: cannot register {nbytes} bytes")
    out = ctypes.c_uint64()
    _lib.check(_lib.lib.gosym_mem_map(addr, nbytes, device, ctypes.byref(out)))
    return MemHandle(out.value)


def mem_unmap(handle: MemHandle) -> None:
    """Unregisters ``handle``; idempotent."""
    if not isinstance(handle, MemHandle):
        raise TypeError(f"gosym: mem_unmap needs a MemHandle, got {type(handle).__name__}")
    handle.unmap()


def mem_import(blob: bytes, timeout: float = 10.0) -> MemHandle:
    """Maps a blob packed by another process of this host (authenticated fd transfer)."""
    if not isinstance(blob, (bytes, bytearray)):
        raise TypeError("gosym: mem_import needs bytes")
    out = ctypes.c_uint64()
    _lib.check(_lib.lib.gosym_mem_import(bytes(blob), len(blob), int(timeout * 1000), ctypes.byref(out)))
    return MemHandle(out.value)


def tensor_from(handle: MemHandle, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over an imported (or exported) handle's local memory; it keeps the handle alive."""
    info = handle.info()
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    itemsize = torch.empty((), dtype=dtype).element_size()
    need = math.prod(shape) * itemsize
    if need > info["local_length"]:
        raise ValueError(f"gosym: {need} bytes do not fit the handle's {info['local_length']}")
    return _wrap(info["local_address"], max(need, 1), shape, dtype, handle)


def _wrap(addr: int, nbytes: int, shape, dtype, handle: MemHandle) -> torch.Tensor:
    buf = (ctypes.c_char * nbytes).from_address(addr)
    # The tensor holds buf; when the last tensor viewing it dies, buf dies and
    # the finalizer releases the registration (the memory stays mapped until then).
    weakref.finalize(buf, handle.unmap)
    flat = torch.frombuffer(buf, dtype=torch.uint8)
    n = math.prod(shape)
    return flat[: n * torch.empty((), dtype=dtype).element_size()].view(dtype).view(shape)


def empty(*size, dtype: torch.dtype | None = None, device="cpu") -> torch.Tensor:
    """Like torch.empty, in memory the ranks of a group can share (zero-copy collectives)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dtype = dtype or torch.get_default_dtype()
    if torch.device(device).type != "cpu":
        raise NotImplementedError("gosym: gosym.empty on CUDA needs the CUDA data plane")
    if any(int(s) < 0 for s in size):
        raise ValueError(f"gosym: negative size {size}")
    nbytes = math.prod(size) * torch.empty((), dtype=dtype).element_size()
    h, addr = ctypes.c_uint64(), ctypes.c_uint64()
    _lib.check(_lib.lib.gosym_mem_alloc(max(nbytes, 1), ctypes.byref(h), ctypes.byref(addr)))
    return _wrap(addr.value, max(nbytes, 1), size, dtype, MemHandle(h.value))


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """gosym.empty with t's shape (and dtype unless given)."""
    return empty(tuple(t.shape), dtype=dtype or t.dtype)
