// Package cuda is the foundation of gosym's CUDA data plane: the CUDA
// driver API and NVRTC reached through C tables of function pointers that
// are filled at run time, the compiler for the kernels of package kernels,
// and the launch path for them.
//
// Nothing links against libcuda or libnvrtc (TestNoLinkTimeCUDADependency),
// so the library loads and its CPU path runs on machines without CUDA. Load
// opens libcuda.so.1, calls cuInit and resolves every function through
// cuGetProcAddress_v2 at the CUDA version whose ABI the table declares,
// falling back to the versioned export names (cuMemAlloc_v2, ...) with dlsym.
// Functions come in tiers: a missing required one fails Load with a
// *SymbolError; a missing optional one (VMM, stream memory operations) makes
// its wrappers return a *DriverError that matches ErrNotSupported. No
// CUDA header is needed to build: dispatch.h declares the few types used,
// and TestHeaderMatchesCudaH checks them against a real cuda.h.
//
// Multicast (NVLink SHARP) sits behind MulticastAllowed: its functions are
// not even looked up until Driver.EnableMulticast has passed that gate, and
// their C wrappers refuse to call through until then. SetupMulticast is the
// collective sequence that binds one multicast object over a group's
// buffers; it asks the gate on every rank first.
//
// Sema runs the semaphore protocol of reduce and all_reduce (per-peer
// semaphores in the signal pads, set by stream memory operations) with the
// pull kernel or, over a multicast mapping, the NVLS kernels.
//
// Methods that take a Context make it current for the one driver call and
// restore the calling thread's previous context afterwards, because Go code
// here runs on threads the CUDA runtime of torch uses too.
//
// Kernels take one parameter struct each (ARParams, CopyParams,
// BarrierParams, SemaParams, NVLSParams). The Go structs, through their cuda tags, are the only
// description of those parameters: kernels/params.cuh is generated from them,
// Launch derives the argument list from the Kernel table and copies the
// values into C storage for the driver, and a test compiles the kernels to
// PTX and checks each entry point's parameter sizes against the table.
//
// Errors: ErrNoCUDA (no driver, no device, no NVRTC: tests skip on it),
// ErrNotSupported (an optional feature is absent or forbidden),
// *DriverError (a failed call, with its CUresult), *SymbolError and
// *CompileError.
package cuda
