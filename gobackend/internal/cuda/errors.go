package cuda

import (
	"errors"
	"fmt"
)

// Sentinel errors. Test helpers turn ErrNoCUDA into a skip; anything else
// that comes out of Load on a machine with a GPU is a real failure.
var (
	// ErrNoCUDA: no usable CUDA driver or device (libcuda missing, no GPU,
	// driver too old), or no NVRTC library for the compiler.
	ErrNoCUDA = errors.New("cuda: CUDA is not available")
	// ErrNotSupported: the driver or device lacks an optional feature
	// (VMM, stream memory operations, multicast), or a policy forbids it.
	ErrNotSupported = errors.New("cuda: not supported")
)

// Result codes of the C glue; the driver's own codes are all >= 0.
const (
	codeNoSymbol = -1 // GSCU_ERROR_NO_SYMBOL
	codeRefused  = -2 // GSCU_ERROR_REFUSED
)

// DriverError is a failed driver call: Op names the function, Code is the
// CUresult (or a negative code of the glue, see Is).
type DriverError struct {
	Op   string
	Code int
}

func (e *DriverError) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, ResultName(e.Code), e.Code)
}

// Is matches ErrNotSupported for a missing symbol or a refused multicast
// call, ErrNoCUDA for "no device" and "driver too old" results, and another
// *DriverError with the same Code (and the same Op, if the target sets one).
func (e *DriverError) Is(target error) bool {
	switch t := target.(type) {
	case *DriverError:
		return t.Code == e.Code && (t.Op == "" || t.Op == e.Op)
	}
	switch target {
	case ErrNotSupported:
		return e.Code == codeNoSymbol || e.Code == codeRefused || e.Code == resultNotSupported
	case ErrNoCUDA:
		return e.Code == resultNoDevice || e.Code == resultStubLibrary
	}
	return false
}

// SymbolError reports required functions that a library does not export.
type SymbolError struct {
	Library string
	Missing []string
}

func (e *SymbolError) Error() string {
	return fmt.Sprintf("cuda: %s lacks required functions %v", e.Library, e.Missing)
}

// CompileError is an NVRTC failure, with the compiler's log.
type CompileError struct {
	Name string
	Arch int
	Code int
	Log  string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("cuda: nvrtc: compiling %s for sm_%d failed (%d):\n%s", e.Name, e.Arch,
		e.Code, e.Log)
}

// A few CUresult values the package acts on.
const (
	resultSuccess      = 0
	resultNotReady     = 600
	resultNoDevice     = 100
	resultStubLibrary  = 34 // a toolkit stub, not a driver
	resultNotSupported = 801
)

// resultNames spells the CUresult values the way cuda.h does, so errors read
// the same with or without a driver to ask (cuGetErrorName).
var resultNames = map[int]string{
	codeNoSymbol: "GOSYM_SYMBOL_MISSING",
	codeRefused:  "GOSYM_MULTICAST_REFUSED",
	0:            "CUDA_SUCCESS",
	1:            "CUDA_ERROR_INVALID_VALUE",
	2:            "CUDA_ERROR_OUT_OF_MEMORY",
	3:            "CUDA_ERROR_NOT_INITIALIZED",
	4:            "CUDA_ERROR_DEINITIALIZED",
	34:           "CUDA_ERROR_STUB_LIBRARY",
	36:           "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
	46:           "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100:          "CUDA_ERROR_NO_DEVICE",
	101:          "CUDA_ERROR_INVALID_DEVICE",
	200:          "CUDA_ERROR_INVALID_IMAGE",
	201:          "CUDA_ERROR_INVALID_CONTEXT",
	209:          "CUDA_ERROR_NO_BINARY_FOR_GPU",
	218:          "CUDA_ERROR_INVALID_PTX",
	222:          "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	300:          "CUDA_ERROR_INVALID_SOURCE",
	400:          "CUDA_ERROR_INVALID_HANDLE",
	500:          "CUDA_ERROR_NOT_FOUND",
	600:          "CUDA_ERROR_NOT_READY",
	700:          "CUDA_ERROR_ILLEGAL_ADDRESS",
	701:          "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702:          "CUDA_ERROR_LAUNCH_TIMEOUT",
	704:          "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	712:          "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	714:          "CUDA_ERROR_HARDWARE_STACK_ERROR",
	715:          "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716:          "CUDA_ERROR_MISALIGNED_ADDRESS",
	719:          "CUDA_ERROR_LAUNCH_FAILED",
	800:          "CUDA_ERROR_NOT_PERMITTED",
	801:          "CUDA_ERROR_NOT_SUPPORTED",
	900:          "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	999:          "CUDA_ERROR_UNKNOWN",
}

// ResultName is the cuda.h name of a CUresult (or of a glue code).
func ResultName(code int) string {
	if n, ok := resultNames[code]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", code)
}
