package host

// Test hooks into the C side of Reduce. They live in a non-test file because
// _test.go files cannot use cgo.

// #include "reduce.h"
import "C"

import "unsafe"

// reduceSelectISA switches Reduce to the baseline kernels (forceGeneric) or
// back to the best the CPU supports, and returns the name of the set in use.
// Not safe to call while a Reduce runs.
func reduceSelectISA(forceGeneric bool) string {
	f := 0
	if forceGeneric {
		f = 1
	}
	return C.GoString(C.gshost_reduce_select(C.int(f)))
}

// The element conversions exactly as the kernels do them; dst and src must
// have the same length.
func cF32ToF16(dst []uint16, src []float32) {
	if len(src) > 0 {
		C.gshost_f32_to_f16((*C.uint16_t)(unsafe.Pointer(&dst[:len(src)][0])), (*C.float)(unsafe.Pointer(&src[0])), C.size_t(len(src)))
	}
}

func cF32ToBF16(dst []uint16, src []float32) {
	if len(src) > 0 {
		C.gshost_f32_to_bf16((*C.uint16_t)(unsafe.Pointer(&dst[:len(src)][0])), (*C.float)(unsafe.Pointer(&src[0])), C.size_t(len(src)))
	}
}

func cF16ToF32(dst []float32, src []uint16) {
	if len(src) > 0 {
		C.gshost_f16_to_f32((*C.float)(unsafe.Pointer(&dst[:len(src)][0])), (*C.uint16_t)(unsafe.Pointer(&src[0])), C.size_t(len(src)))
	}
}

func cBF16ToF32(dst []float32, src []uint16) {
	if len(src) > 0 {
		C.gshost_bf16_to_f32((*C.float)(unsafe.Pointer(&dst[:len(src)][0])), (*C.uint16_t)(unsafe.Pointer(&src[0])), C.size_t(len(src)))
	}
}
