package cuda

/*
#include <string.h>
#include "dispatch.h"

// The POSIX-fd flavour passes the fd itself as the "pointer".
static inline CUresult gscu_import_fd(const gscu_driver *t, CUcontext ctx,
                                      CUmemGenericAllocationHandle *h, int fd) {
	return gscu_in_cuMemImportFromShareableHandle(t, ctx, h, (void *)(uintptr_t)fd, 1);
}

// The address is passed as void *; a device address, never dereferenced.
static inline CUresult gscu_retain(const gscu_driver *t, CUcontext ctx,
                                   CUmemGenericAllocationHandle *h, unsigned long long p) {
	return gscu_in_cuMemRetainAllocationHandle(t, ctx, h, (void *)(uintptr_t)p);
}

typedef struct {
	unsigned long long addr;
	unsigned int value;
	unsigned int flags;
	int wait;
} gscu_memop;

static inline CUresult gscu_batch_memops(const gscu_driver *t, CUcontext ctx, CUstream s,
                                         const gscu_memop *ops, unsigned int n) {
	CUstreamBatchMemOpParams p[64];
	if (n > 64)
		return 1; // CUDA_ERROR_INVALID_VALUE
	for (unsigned int i = 0; i < n; i++) {
		memset(&p[i], 0, sizeof p[i]);
		p[i].value.operation = ops[i].wait ? 1 : 2; // WAIT_VALUE_32 : WRITE_VALUE_32
		p[i].value.address = ops[i].addr;
		p[i].value.v.value = ops[i].value;
		p[i].value.flags = ops[i].flags;
	}
	return gscu_in_cuStreamBatchMemOp(t, ctx, s, n, p, 0);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// AllocHandle is a CUmemGenericAllocationHandle (VMM allocation or
// multicast object).
type AllocHandle uint64

// Shareable handle types (CUmemAllocationHandleType).
const (
	HandleTypeNone    = 0x0
	HandleTypePosixFD = 0x1
	HandleTypeFabric  = 0x8
)

func allocProp(dev Device, handleTypes int) C.CUmemAllocationProp {
	var p C.CUmemAllocationProp
	p._type = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	p.requestedHandleTypes = C.int(handleTypes)
	p.location = C.CUmemLocation{_type: 1, id: C.int(dev)} // CU_MEM_LOCATION_TYPE_DEVICE
	return p
}

// AllocationGranularity is the minimum (or recommended) granularity of a
// VMM allocation on dev.
func (d *Driver) AllocationGranularity(ctx Context, dev Device, handleTypes int, recommended bool) (uintptr, error) {
	p := allocProp(dev, handleTypes)
	var g C.size_t
	opt := C.int(0)
	if recommended {
		opt = 1
	}
	err := d.check("cuMemGetAllocationGranularity",
		C.gscu_in_cuMemGetAllocationGranularity(d.t, cCtx(ctx), &g, &p, opt))
	return uintptr(g), err
}

// MemCreate allocates size bytes of physical memory on dev (a multiple of
// the granularity), exportable as handleTypes.
func (d *Driver) MemCreate(ctx Context, dev Device, size uintptr, handleTypes int) (AllocHandle, error) {
	p := allocProp(dev, handleTypes)
	var h C.CUmemGenericAllocationHandle
	err := d.check("cuMemCreate", C.gscu_in_cuMemCreate(d.t, cCtx(ctx), &h, C.size_t(size), &p, 0))
	return AllocHandle(h), err
}

// MemRelease drops a handle; the memory goes when its last mapping does.
func (d *Driver) MemRelease(ctx Context, h AllocHandle) error {
	return d.check("cuMemRelease", C.gscu_in_cuMemRelease(d.t, cCtx(ctx), C.CUmemGenericAllocationHandle(h)))
}

// MemRetainAllocationHandle is the handle of the VMM allocation mapped at
// p (any address in its mapping), with one more reference: release it.
func (d *Driver) MemRetainAllocationHandle(ctx Context, p uintptr) (AllocHandle, error) {
	var h C.CUmemGenericAllocationHandle
	err := d.check("cuMemRetainAllocationHandle", C.gscu_retain(d.t, cCtx(ctx), &h, C.ulonglong(p)))
	return AllocHandle(h), err
}

// MemExportFD exports h as a POSIX file descriptor, owned by the caller.
func (d *Driver) MemExportFD(ctx Context, h AllocHandle) (int, error) {
	var fd C.int = -1
	err := d.check("cuMemExportToShareableHandle", C.gscu_in_cuMemExportToShareableHandle(d.t,
		cCtx(ctx), unsafe.Pointer(&fd), C.CUmemGenericAllocationHandle(h), HandleTypePosixFD, 0))
	return int(fd), err
}

// MemImportFD imports an allocation from a POSIX file descriptor (which
// stays the caller's to close).
func (d *Driver) MemImportFD(ctx Context, fd int) (AllocHandle, error) {
	var h C.CUmemGenericAllocationHandle
	err := d.check("cuMemImportFromShareableHandle", C.gscu_import_fd(d.t, cCtx(ctx), &h, C.int(fd)))
	return AllocHandle(h), err
}

// MemAddressReserve reserves a virtual address range.
func (d *Driver) MemAddressReserve(ctx Context, size, align uintptr) (uintptr, error) {
	var p C.CUdeviceptr
	err := d.check("cuMemAddressReserve", C.gscu_in_cuMemAddressReserve(d.t, cCtx(ctx), &p,
		C.size_t(size), C.size_t(align), 0, 0))
	return uintptr(p), err
}

// MemAddressFree releases a reservation.
func (d *Driver) MemAddressFree(ctx Context, p, size uintptr) error {
	return d.check("cuMemAddressFree", C.gscu_in_cuMemAddressFree(d.t, cCtx(ctx), cDevPtr(p), C.size_t(size)))
}

// MemMap maps all size bytes of h at p.
func (d *Driver) MemMap(ctx Context, p, size uintptr, h AllocHandle) error {
	return d.check("cuMemMap", C.gscu_in_cuMemMap(d.t, cCtx(ctx), cDevPtr(p), C.size_t(size), 0,
		C.CUmemGenericAllocationHandle(h), 0))
}

// MemUnmap unmaps [p, p+size).
func (d *Driver) MemUnmap(ctx Context, p, size uintptr) error {
	return d.check("cuMemUnmap", C.gscu_in_cuMemUnmap(d.t, cCtx(ctx), cDevPtr(p), C.size_t(size)))
}

// MemSetAccess grants read-write access to [p, p+size) to each device.
func (d *Driver) MemSetAccess(ctx Context, p, size uintptr, devs []Device) error {
	if len(devs) == 0 || len(devs) > 64 {
		return fmt.Errorf("cuda: cuMemSetAccess: %d devices", len(devs))
	}
	descs := make([]C.CUmemAccessDesc, len(devs))
	for i, dev := range devs {
		descs[i] = C.CUmemAccessDesc{location: C.CUmemLocation{_type: 1, id: C.int(dev)}, flags: 3}
	}
	return d.check("cuMemSetAccess", C.gscu_in_cuMemSetAccess(d.t, cCtx(ctx), cDevPtr(p), C.size_t(size),
		&descs[0], C.size_t(len(descs))))
}

// ---- stream memory operations -------------------------------------------------

// Flags of StreamWaitValue32 (CUstreamWaitValue_flags).
const (
	WaitGEQ = 0x0 // (int32)(*addr - value) >= 0
	WaitEQ  = 0x1
	WaitAND = 0x2
	WaitNOR = 0x3
)

// StreamWriteValue32 writes v to addr when s reaches this point.
func (d *Driver) StreamWriteValue32(ctx Context, s Stream, addr uintptr, v uint32) error {
	return d.check("cuStreamWriteValue32", C.gscu_in_cuStreamWriteValue32(d.t, cCtx(ctx), cStream(s),
		cDevPtr(addr), C.cuuint32_t(v), 0))
}

// StreamWaitValue32 makes s wait until the word at addr satisfies flags/v.
func (d *Driver) StreamWaitValue32(ctx Context, s Stream, addr uintptr, v uint32, flags uint) error {
	return d.check("cuStreamWaitValue32", C.gscu_in_cuStreamWaitValue32(d.t, cCtx(ctx), cStream(s),
		cDevPtr(addr), C.cuuint32_t(v), C.uint(flags)))
}

// MemOp is one operation of StreamBatchMemOp: a 32-bit wait or write.
type MemOp struct {
	Wait  bool // false: write Value to Addr
	Addr  uintptr
	Value uint32
	Flags uint32 // wait flags (WaitGEQ, ...); 0 for writes
}

// StreamBatchMemOp enqueues up to 64 waits and writes on s as one operation.
func (d *Driver) StreamBatchMemOp(ctx Context, s Stream, ops []MemOp) error {
	if len(ops) == 0 {
		return nil
	}
	if len(ops) > 64 {
		return fmt.Errorf("cuda: cuStreamBatchMemOp: %d operations, at most 64", len(ops))
	}
	cops := make([]C.gscu_memop, len(ops))
	for i, op := range ops {
		cops[i] = C.gscu_memop{addr: C.ulonglong(op.Addr), value: C.uint(op.Value), flags: C.uint(op.Flags)}
		if op.Wait {
			cops[i].wait = 1
		}
	}
	return d.check("cuStreamBatchMemOp", C.gscu_batch_memops(d.t, cCtx(ctx), cStream(s), &cops[0], C.uint(len(cops))))
}
