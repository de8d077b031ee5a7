"""Memory registration: shareable CPU tensors, registered CUDA tensors and memory handles.

``gosym.empty`` gives tensors whose memory the ranks of a group can map, so
collectives on them read peers' data in place instead of staging it. Any
buffer can be registered with ``mem_map``; a group binds the enclosing
shareable region lazily, on the first collective that uses it, and reuses the
binding afterwards. CUDA tensors from torch's caching allocator register
shareable (their allocation's CUDA IPC handle), and so do gosym.empty's CUDA
tensors (their VMM allocation's fd); collectives on them then read the peers'
tensors in place from GOSYM_GPU_REG_DIRECT_MIN bytes (mem_map them on every
rank, or on none). gosym.empty's CUDA tensors are read in place from
GOSYM_GPU_DIRECT_MIN without mem_map. ``MemHandle.pack()`` / ``mem_import`` share a region
with another process of this host explicitly; ``tensor_from`` views it.
"""

from __future__ import annotations

import ctypes
import json
import math
import weakref

import torch

from . import _lib

__all__ = ["MemHandle", "blob_info", "contiguous_view", "empty", "empty_like", "mem_import",
           "mem_map", "mem_unmap", "tensor_from"]


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
        """mode, address/length (the exporter's), local_address/local_length, device,
        shareable (why_private says why not, for CUDA memory), bindings."""
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
    """Registers a tensor's storage range from its first element (or address + nbytes on
    device, -1 for host memory). Talks to no peer. CUDA memory is shareable when its
    allocation has a CUDA IPC handle (torch's caching allocator, cudaMalloc) or comes from
    gosym.empty (its fd); other device memory (expandable segments, managed memory)
    registers private (``info()["why_private"]`` says why)."""
    if isinstance(tensor_or_addr, torch.Tensor):
        t = tensor_or_addr
        if t.device.type == "cuda":
            device = t.device.index if t.device.index is not None else torch.cuda.current_device()
        elif t.device.type != "cpu":
            raise NotImplementedError(f"gosym: mem_map of {t.device.type} tensors is not supported")
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


def blob_info(blob: bytes) -> dict:
    """A packed blob's header (pid, device, address, length, transport; gpu for CUDA
    memory), checked as mem_import would, without importing it."""
    if not isinstance(blob, (bytes, bytearray)):
        raise TypeError("gosym: a packed memory handle is bytes")
    blob = bytes(blob)
    return json.loads(_lib.read_string(_lib.lib.gosym_mem_blob_info, blob, len(blob)))


def mem_import(blob: bytes, timeout: float = 10.0, device=None) -> MemHandle:
    """Maps a blob packed by another process of this host. Host memory: an authenticated
    fd transfer from the exporter. CUDA memory: its IPC handle (gosym.empty's: its fd, from
    the exporter), opened on ``device``
    (default: the current CUDA device) with peer access, so kernels there reach the
    exporter's GPU; ``tensor_from`` gives a CUDA tensor over it."""
    info = blob_info(blob)
    dev = -1
    if info["device"] >= 0:
        if not torch.cuda.is_available():
            raise RuntimeError(f"gosym: the blob is CUDA memory (cuda:{info['device']} of pid "
                               f"{info['pid']}, GPU {info.get('gpu')}), but CUDA is not available "
                               "in this process")
        dev = _cuda_index(device)
    out = ctypes.c_uint64()
    blob = bytes(blob)
    _lib.check(_lib.lib.gosym_mem_import_on(blob, len(blob), int(timeout * 1000), dev,
                                            ctypes.byref(out)))
    return MemHandle(out.value)


def _cuda_index(device) -> int:
    """The ordinal of a CUDA device given as None (the current one), an int, a string or a
    torch.device."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"gosym: CUDA memory is mapped on a CUDA device, not {d}")
    return torch.cuda.current_device() if d.index is None else d.index


def tensor_from(handle: MemHandle, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over an imported (or exported) handle's local memory (a CUDA tensor for
    CUDA memory); it keeps the handle alive and unmaps it when the last such tensor goes."""
    info = handle.info()
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    itemsize = torch.empty((), dtype=dtype).element_size()
    need = math.prod(shape) * itemsize
    if need > info["local_length"]:
        raise ValueError(f"gosym: {need} bytes do not fit the handle's {info['local_length']}")
    if info["device"] >= 0:
        return _cuda_wrap(info["local_address"], max(need, 1), shape, dtype, handle)
    return _wrap(info["local_address"], max(need, 1), shape, dtype, handle)


def _wrap(addr: int, nbytes: int, shape, dtype, handle: MemHandle) -> torch.Tensor:
    buf = (ctypes.c_char * nbytes).from_address(addr)
    # The tensor holds buf; when the last tensor viewing it dies, buf dies and
    # the finalizer releases the registration (the memory stays mapped until then).
    weakref.finalize(buf, handle.unmap)
    flat = torch.frombuffer(buf, dtype=torch.uint8)
    n = math.prod(shape)
    return flat[: n * torch.empty((), dtype=dtype).element_size()].view(dtype).view(shape)


class _CudaMemory:
    """Device memory owned by the library (a symmetric allocation, or a contiguous view),
    handed to torch through __cuda_array_interface__: torch.as_tensor keeps this object
    alive as long as any tensor uses the memory, and its finalizer gives the memory back
    (the library waits for the device to be idle first)."""

    def __init__(self, handle: int, addr: int, nbytes: int, release):
        self.handle, self.addr, self.nbytes = handle, addr, nbytes
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (addr, False), "version": 3}
        weakref.finalize(self, release, handle)

    def tensor(self, device: torch.device) -> torch.Tensor:
        return torch.as_tensor(self, device=device)


def _cuda_wrap(addr: int, nbytes: int, shape, dtype, handle: MemHandle) -> torch.Tensor:
    """A CUDA tensor on the handle's device over [addr, addr+nbytes), through DLPack, which
    names the device: __cuda_array_interface__ cannot, and torch would take the device the
    memory physically lives on (the exporter's GPU for an import), where this process has
    not mapped it. When the last tensor goes, the handle is unmapped."""
    flat = _from_device_memory(addr, nbytes, handle.info()["device"], handle.unmap)
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return flat[:n].view(dtype).view(shape)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DL_DELETER)]
_DL_CPU, _DL_CUDA = 1, 2

# What a DLPack tensor handed to torch keeps alive until torch calls its deleter, by the
# address of its DLManagedTensor.
_dl_live: dict = {}


@_DL_DELETER
def _dl_delete(managed) -> None:
    entry = _dl_live.pop(ctypes.addressof(managed.contents), None)
    if entry is not None and entry[-1] is not None:
        entry[-1]()


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _from_device_memory(addr: int, nbytes: int, device: int, release=None,
                        device_type: int = _DL_CUDA) -> torch.Tensor:
    """A uint8 tensor of nbytes at addr on CUDA device `device` (device_type _DL_CPU: host
    memory, for tests), viewing the memory; release() runs when torch lets go of it."""
    shape, strides = (ctypes.c_int64 * 1)(nbytes), (ctypes.c_int64 * 1)(1)
    m = _DLManagedTensor()
    m.dl_tensor = _DLTensor(addr, _DLDevice(device_type, device), 1, _DLDataType(1, 8, 1),
                            shape, strides, 0)
    m.deleter = _dl_delete
    _dl_live[ctypes.addressof(m)] = (m, shape, strides, release)
    try:
        flat = torch.from_dlpack(_capsule_new(ctypes.addressof(m), b"dltensor", None))
    except BaseException:
        _dl_live.pop(ctypes.addressof(m), None)
        raise
    if flat.data_ptr() != addr:
        raise RuntimeError("gosym: torch copied the memory instead of viewing it")
    return flat


def _cuda_free(handle: int) -> None:
    _lib.check(_lib.lib.gosym_cuda_free(handle))


def _view_release(handle: int) -> None:
    _lib.check(_lib.lib.gosym_view_release(handle))


# Symmetric CUDA allocations and gosym.empty host regions by address, to find the one a
# tensor lies in (its storage's data pointer).
_cuda_owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_host_owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _cuda_empty(size, dtype, device: torch.device) -> torch.Tensor:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    nbytes = math.prod(size) * torch.empty((), dtype=dtype).element_size()
    h, addr, cap = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    _lib.check(_lib.lib.gosym_cuda_alloc(idx, max(nbytes, 1), ctypes.byref(h), ctypes.byref(addr),
                                         ctypes.byref(cap)))
    owner = _CudaMemory(h.value, addr.value, cap.value, _cuda_free)
    _cuda_owners[owner.addr] = owner
    flat = owner.tensor(torch.device("cuda", idx))
    return flat[:nbytes].view(dtype).view(size)


def empty(*size, dtype: torch.dtype | None = None, device="cpu") -> torch.Tensor:
    """Like torch.empty, in memory the ranks of a group can share (zero-copy collectives on
    CPU; on CUDA, a VMM allocation that large collectives read in place and contiguous_view
    maps side by side)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dtype = dtype or torch.get_default_dtype()
    if any(int(s) < 0 for s in size):
        raise ValueError(f"gosym: negative size {size}")
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_empty(tuple(int(s) for s in size), dtype, device)
    if device.type != "cpu":
        raise NotImplementedError(f"gosym: gosym.empty on {device} is not supported")
    nbytes = math.prod(size) * torch.empty((), dtype=dtype).element_size()
    h, addr = ctypes.c_uint64(), ctypes.c_uint64()
    _lib.check(_lib.lib.gosym_mem_alloc(max(nbytes, 1), ctypes.byref(h), ctypes.byref(addr)))
    handle = MemHandle(h.value)
    _host_owners[addr.value] = handle
    return _wrap(addr.value, max(nbytes, 1), size, dtype, handle)


# torch MemPools over gosym's segment allocator, by CUDA device (comm_empty), and whether
# the device can have gosym's shareable memory at all (tried once).
_comm_pools: dict = {}
_comm_ok: dict = {}


def comm_supported(device) -> bool:
    """Whether comm_empty serves device: a CUDA device where gosym's shareable memory works."""
    if torch.device(device).type != "cuda":
        return False
    idx = _cuda_index(device)
    ok = _comm_ok.get(idx)
    if ok is None:
        try:
            _cuda_empty((1,), torch.uint8, torch.device("cuda", idx))
            ok = True
        except RuntimeError:
            ok = False
        _comm_ok[idx] = ok
    return ok


def comm_empty(numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A 1-D tensor of numel elements for a collective's buffer (ProcessGroup.allocate_tensor,
    which FSDP2 calls under set_allocate_memory_from_process_group_for_comm): from torch's
    caching allocator, in a pool whose segments are gosym's shareable memory (a torch MemPool
    over gosym_pool_alloc/free, as ProcessGroupNCCL's over ncclMemAlloc). The caching
    allocator keeps segments and reuses them in stream order, so the direct path binds a
    segment once and every later buffer placed in it reads in place with no new binding."""
    idx = _cuda_index(device)
    pool = _comm_pools.get(idx)
    if pool is None:
        fn = ctypes.c_void_p
        alloc = torch._C._cuda_customAllocator(ctypes.cast(_lib.lib.gosym_pool_alloc, fn).value,
                                               ctypes.cast(_lib.lib.gosym_pool_free, fn).value)
        pool = _comm_pools[idx] = torch.cuda.MemPool(alloc)
    with torch.cuda.use_mem_pool(pool, device=idx):
        return torch.empty(int(numel), dtype=dtype, device=torch.device("cuda", idx))


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """gosym.empty with t's shape, device (and dtype unless given)."""
    return empty(tuple(t.shape), dtype=dtype or t.dtype, device=t.device)


def _gosym_group(group):
    from torch import distributed as dist

    from ._unwrap import unwrap

    pg = unwrap(dist.distributed_c10d._get_default_group() if group is None else group)
    if not getattr(type(pg), "_gosym_endpoint_group", False):  # a ProcessGroupGosym
        raise ValueError(f"gosym: contiguous_view needs a gosym process group, got {pg!r}")
    return pg


def contiguous_view(t: torch.Tensor, group=None) -> torch.Tensor:
    """A [world, *t.shape] tensor on t's device whose row r aliases rank r's t.

    Collective over group (default: the default group): every rank calls it with a tensor
    at the same offset of a gosym.empty buffer (CUDA or CPU) of the same size. Rows are one
    reserved address range with each rank's allocation mapped into its slot (the row stride
    is the allocation size, padded to the granularity or the page size). The same buffer gives
    back the same view while it is alive; the view keeps the peers' memory mapped as long
    as it is referenced, even after the buffers are freed."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gosym: contiguous_view needs a tensor, got {type(t).__name__}")
    pg = _gosym_group(group)
    base = t.untyped_storage().data_ptr()
    owner = (_cuda_owners if t.is_cuda else _host_owners).get(base)
    if owner is None:
        raise ValueError("gosym: contiguous_view needs a tensor in memory from gosym.empty "
                         f"(on {t.device.type}); other memory cannot be mapped side by side")
    off = t.data_ptr() - base
    h, addr, stride = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    _lib.check(_lib.lib.gosym_contiguous_view(pg._endpoint(), owner.handle, off, ctypes.byref(h),
                                              ctypes.byref(addr), ctypes.byref(stride)))
    es = t.element_size()
    key = (owner.handle, off, tuple(t.shape), tuple(t.stride()), t.dtype)
    cached = pg._views.get(key)
    if cached is not None and cached.data_ptr() == addr.value + off:
        _view_release(h.value)  # the cached tensor holds its own reference
        return cached
    world = pg.size()
    span = (stride.value * world) // es * es  # from the buffer's start in row 0
    if t.is_cuda:
        big = _CudaMemory(h.value, addr.value, span, _view_release).tensor(t.device)
    else:
        buf = (ctypes.c_char * span).from_address(addr.value)
        weakref.finalize(buf, _view_release, h.value)
        big = torch.frombuffer(buf, dtype=torch.uint8)
    view = torch.as_strided(big.view(t.dtype), (world, *t.shape),
                            (stride.value // es, *t.stride()), off // es)
    pg._views[key] = view
    return view
