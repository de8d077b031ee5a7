// Package host is the host data plane's arithmetic: the CPU copy and the
// reduction loops (C, reduce.c, with an AVX2 copy chosen at load) that the
// CPU collectives (internal/coll) run through Plane. The shared memory they
// run on is internal/shm's.
package host

import (
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// Plane is the host data plane: the CPU copies and reduces.
type Plane struct{}

// bytesAt views n bytes at a raw address. The addresses come from mappings
// and tensors that outlive the call, never from the Go heap.
func bytesAt(a uintptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&a))), n)
}

// Copy copies n bytes (Go's memmove is vectorised).
func (Plane) Copy(dst, src uintptr, n int) {
	if n > 0 {
		copy(bytesAt(dst, n), bytesAt(src, n))
	}
}

// Reduce is the package-level Reduce.
func (Plane) Reduce(dst uintptr, srcs []uintptr, n int, dt dtype.DType, op dtype.RedOp, scale float64) error {
	return Reduce(dst, srcs, n, dt, op, scale)
}
