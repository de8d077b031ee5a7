package gobackend

import (
	"time"

	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// Memh is a registered memory range (see memreg).
type Memh = memreg.Memh

// MemAlloc allocates size bytes of shareable host memory (gosym.empty).
func MemAlloc(size int) (*Memh, error) { return memreg.Default.Alloc(size) }

// MemMap registers [addr, addr+n) on device (-1: host). It talks to no
// peer: groups bind it lazily, on the first collective that uses it.
func MemMap(addr uintptr, n, device int) (*Memh, error) { return memreg.Default.Map(addr, n, device) }

// MemUnmap unregisters m; bindings are removed and their groups told.
func MemUnmap(m *Memh) error { return memreg.Default.Unmap(m) }

// MemImport maps a blob packed by another process of this host; device is
// the CUDA device to map CUDA memory on (ignored for host memory, where -1
// is fine).
func MemImport(blob []byte, device int, timeout time.Duration) (*Memh, error) {
	if timeout <= 0 {
		timeout = memreg.DefaultTimeout
	}
	return memreg.Default.ImportOn(blob, device, time.Now().Add(timeout))
}

// MemBlobInfo describes a packed blob without importing it.
func MemBlobInfo(blob []byte) (map[string]any, error) { return memreg.BlobInfo(blob) }

// MemStats reports the domain's registration counters.
func MemStats() map[string]int64 { return memreg.Default.Stats() }

// checkUBR enforces GOSYM_ENABLE_UBR=yes: a registered input that cannot be
// shared is an error rather than a silent fallback to staging.
func checkUBR(op *Op) error {
	if memreg.UBRMode() != "yes" {
		return nil
	}
	start, n, _ := ops.InputSpan(op)
	if n == 0 {
		return nil
	}
	if m, ok := memreg.Default.Find(start, n); ok && !m.Shareable() {
		return status.Errorf(status.InvalidArg,
			"gosym: %s: GOSYM_ENABLE_UBR=yes but the registered buffer %#x+%d is private memory that peers cannot map (allocate it with gosym.empty)",
			op.Kind, start, n)
	}
	return nil
}

// GPUBuf is symmetric GPU memory for users (gosym.empty on CUDA).
type GPUBuf = gpu.Buf

// GPUAlloc allocates n bytes of shareable VMM memory on device.
func GPUAlloc(device, n int) (*GPUBuf, error) { return gpu.Alloc(device, n) }

// PoolAlloc and PoolFree serve torch's caching allocator with segments of
// shareable memory (gosym_pool_alloc/free, ProcessGroup.allocate_tensor).
// torch's allocator interface carries no error, so a failure is said here,
// on stderr, and PoolAlloc returns 0 (torch raises out of memory).
func PoolAlloc(device, n int) (addr uintptr) {
	defer poolRecover(&addr)
	addr, err := gpu.AllocSegment(device, n)
	if err != nil {
		dlog.Warnf("allocating a %d-byte segment on cuda:%d for torch's caching allocator: %v", n, device, err)
		return 0
	}
	return addr
}

func PoolFree(addr uintptr) {
	defer poolRecover(nil)
	if err := gpu.FreeSegment(addr); err != nil {
		dlog.Warnf("freeing torch's caching allocator's segment %#x: %v", addr, err)
	}
}

// poolRecover turns a panic under torch's allocator (which cannot take one
// through C) into a message and, for an allocation, a 0 address.
func poolRecover(addr *uintptr) {
	if r := recover(); r != nil {
		dlog.Warnf("internal error in the segment allocator: %v", r)
		if addr != nil {
			*addr = 0
		}
	}
}
