package host

// The CPU reduction loops are C (reduce.c, reduce_kernels.h) so that gcc's
// auto-vectoriser can turn them into SSE2/AVX2 code; Go does not vectorise.
// -O3 rather than cgo's default -O2: gcc 12+ vectorises at -O2 only loops
// that need no run-time alias check, and ours need one (dst may be a source).

/*
#cgo CFLAGS: -O3 -std=gnu11
#include "reduce.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// Reduce computes, for i < n,
//
//	dst[i] = (((srcs[0][i] op srcs[1][i]) op srcs[2][i]) ... op srcs[k-1][i])
//
// where k = len(srcs) >= 1 and every address holds n elements of type dt.
// The sources are combined strictly in slice order, so ranks that pass the
// same sources in the same order get identical bits. k == 1 copies (or
// scales) srcs[0].
//
// dst may be any of the sources exactly (in place); a partial overlap of dst
// with a source is an error. Addresses need no alignment. Elements at index n
// and beyond are never touched.
//
// Arithmetic:
//   - float32 and float64 accumulate in their own precision.
//   - float16 and bfloat16 widen every element to float32, accumulate in
//     float32 and round once to the storage type (nearest even; NaN stays NaN).
//   - Avg divides the final sum by k; PremulSum multiplies every source by
//     scale before adding (scale rounded to float32 unless dt is float64).
//   - Min and Max propagate NaN, as torch.minimum/maximum do.
//   - Integer Sum and Product wrap (two's complement).
//   - Bool reads any nonzero byte as true and writes 0 or 1: Sum, Max and
//     BOr are OR; Product, Min and BAnd are AND; BXor is XOR.
//
// Combinations that dtype.Supports rejects return its error. n == 0 returns
// nil without touching memory.
//
// Results depend on nothing but the inputs: the loops run under the default
// floating-point environment (round to nearest, no flush-to-zero) whatever
// the calling thread set, never fuse a multiply-add, and the AVX2 and
// baseline kernels (picked by CPU at load time) agree bit for bit, up to
// which payload a NaN result carries when NaNs meet.
//
// One call is one cgo call on the calling goroutine; callers that want more
// cores split the element range. The memory behind dst and srcs must stay
// mapped for the call; Reduce keeps no reference to it or to srcs afterwards.
func Reduce(dst uintptr, srcs []uintptr, n int, dt dtype.DType, op dtype.RedOp, scale float64) error {
	if err := dtype.Supports(dt, op); err != nil {
		return err
	}
	if len(srcs) == 0 {
		return errors.New("reduce: no sources")
	}
	if len(srcs) > math.MaxInt32 {
		return fmt.Errorf("reduce: %d sources", len(srcs))
	}
	if n < 0 {
		return fmt.Errorf("reduce: negative element count %d", n)
	}
	if n == 0 {
		return nil
	}
	size := uintptr(dt.Size())
	if uintptr(n) > ^uintptr(0)/size {
		return fmt.Errorf("reduce: %d elements of %s overflow the address space", n, dt)
	}
	nbytes := uintptr(n) * size
	if dst == 0 || dst+nbytes < dst {
		return fmt.Errorf("reduce: bad destination range %#x+%d", dst, nbytes)
	}
	for i, s := range srcs {
		if s == 0 || s+nbytes < s {
			return fmt.Errorf("reduce: bad source %d range %#x+%d", i, s, nbytes)
		}
		if s != dst && s < dst+nbytes && dst < s+nbytes {
			return fmt.Errorf("reduce: source %d (%#x) partially overlaps the destination (%#x), %d bytes each", i, s, dst, nbytes)
		}
	}
	// srcs holds integers, not Go pointers, so C may read it during the call.
	rc := C.gshost_reduce(C.uintptr_t(dst), (*C.uintptr_t)(unsafe.Pointer(&srcs[0])), C.int(len(srcs)),
		C.size_t(n), C.int(dt), C.int(op), C.double(scale))
	if rc != C.GSHOST_OK {
		return fmt.Errorf("reduce: no kernel for %s %s (status %d)", dt, op, int(rc))
	}
	return nil
}
