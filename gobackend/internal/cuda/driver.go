package cuda

/*
#cgo LDFLAGS: -ldl
// The calls of every op neither keep the Go pointers they get nor call back
// into Go, so their out-parameters stay on the caller's stack (no heap
// allocation per op).
#cgo noescape gscu_in_cuStreamGetCaptureInfo
#cgo nocallback gscu_in_cuStreamGetCaptureInfo
#include <stdlib.h>
#include <string.h>
#include "dispatch.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/config"
)

// Handles. Device pointers are plain uintptr values throughout; the opaque
// driver handles keep their raw value too, so that torch's integers
// (tensor.data_ptr(), stream.cuda_stream) pass straight through.
type (
	Device    int32   // CUdevice
	Context   uintptr // CUcontext
	Stream    uintptr // CUstream; 0 is the legacy default stream
	Event     uintptr // CUevent
	Attribute int32   // CUdevice_attribute
)

// Device attributes gosym reads (values from cuda.h).
const (
	AttrMaxThreadsPerBlock        Attribute = 1
	AttrMultiprocessorCount       Attribute = 16
	AttrPCIBusID                  Attribute = 33
	AttrPCIDeviceID               Attribute = 34
	AttrMaxThreadsPerSM           Attribute = 39
	AttrUnifiedAddressing         Attribute = 41
	AttrPCIDomainID               Attribute = 50
	AttrComputeCapabilityMajor    Attribute = 75
	AttrComputeCapabilityMinor    Attribute = 76
	AttrMaxRegistersPerSM         Attribute = 82
	AttrMaxSharedMemPerBlockOptin Attribute = 97
	AttrVirtualMemoryManagement   Attribute = 102
	AttrHandleTypePosixFD         Attribute = 103
	AttrCanUse64BitStreamMemOps   Attribute = 122
	AttrHandleTypeFabric          Attribute = 128
	AttrMulticastSupported        Attribute = 132
)

// Flags.
const (
	StreamNonBlocking       = 0x1 // CU_STREAM_NON_BLOCKING
	EventDisableTiming      = 0x2 // CU_EVENT_DISABLE_TIMING
	IpcLazyEnablePeerAccess = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
)

// MinDriverVersion is the oldest driver API gosym uses (CUDA 12.0): every
// table slot is typed after the 12.0 ABI.
const MinDriverVersion = 12000

// Driver is an opened libcuda: a C table of function pointers plus what the
// loader learned. Its methods are safe for concurrent use. Methods that take
// a Context make it current for the duration of the driver call and restore
// the calling thread's previous context afterwards.
type Driver struct {
	t       *C.gscu_driver // C memory: the table never moves
	lib     unsafe.Pointer
	fake    bool
	path    string
	version int

	mu sync.Mutex // guards mc
	mc *Multicast
}

var defaultDriver struct {
	once sync.Once
	d    *Driver
	err  error
}

// Load opens the CUDA driver once per process: $GOSYM_LIBCUDA if set, else
// libcuda.so.1. The error wraps ErrNoCUDA when there is no usable driver or
// device; a libcuda that lacks a required function gives a *SymbolError.
func Load() (*Driver, error) {
	defaultDriver.once.Do(func() {
		path := config.LibCUDA.Get()
		if path == "" {
			path = "libcuda.so.1"
		}
		defaultDriver.d, defaultDriver.err = openDriver(path)
	})
	return defaultDriver.d, defaultDriver.err
}

func openDriver(path string) (*Driver, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	lib := C.gscu_dlopen(cpath, 0, &msg[0], C.size_t(len(msg)))
	if lib == nil {
		return nil, fmt.Errorf("%w: open %s: %s", ErrNoCUDA, path, C.GoString(&msg[0]))
	}
	ok := false
	defer func() {
		if !ok {
			C.gscu_dlclose(lib)
		}
	}()
	switch r := int(C.gscu_driver_init(lib)); r {
	case resultSuccess:
	case codeNoSymbol:
		return nil, &SymbolError{Library: path, Missing: []string{"cuInit"}}
	default:
		return nil, fmt.Errorf("cuda: %s: %w", path, &DriverError{Op: "cuInit", Code: r})
	}
	d := newDriver(lib, false)
	if err := d.finishLoad(path); err != nil {
		C.free(unsafe.Pointer(d.t))
		return nil, err
	}
	var buf [4096]C.char
	if C.gscu_dlpath(lib, &buf[0], C.size_t(len(buf))) == 0 {
		d.path = C.GoString(&buf[0])
	}
	ok = true
	return d, nil
}

func newDriver(lib unsafe.Pointer, fake bool) *Driver {
	t := (*C.gscu_driver)(C.calloc(1, C.size_t(unsafe.Sizeof(C.gscu_driver{}))))
	f := C.int(0)
	if fake {
		f = 1
	}
	C.gscu_driver_resolve(t, lib, f, C.GSCU_TIER_ALL_BUT_MC)
	return &Driver{t: t, lib: lib, fake: fake, path: "fake"}
}

// finishLoad checks the required tier and the driver version.
func (d *Driver) finishLoad(path string) error {
	if missing := d.missing(C.GSCU_TIER_REQ); len(missing) > 0 {
		return &SymbolError{Library: path, Missing: missing}
	}
	var v C.int
	if err := d.check("cuDriverGetVersion", C.gscu_cuDriverGetVersion(d.t, &v)); err != nil {
		return err
	}
	d.version = int(v)
	if d.version < MinDriverVersion {
		return fmt.Errorf("%w: the driver supports CUDA %d.%d, gosym needs %d.%d or newer",
			ErrNoCUDA, d.version/1000, d.version%1000/10, MinDriverVersion/1000,
			MinDriverVersion%1000/10)
	}
	return nil
}

// missing lists the functions of the given tiers that did not resolve.
func (d *Driver) missing(tiers C.int) []string {
	var out []string
	for i := 0; i < int(C.GSCU_NUM_DRIVER_FUNCS); i++ {
		if C.gscu_driver_sym_tier(C.int(i))&tiers != 0 && C.gscu_driver_sym_present(d.t, C.int(i)) == 0 {
			out = append(out, C.GoString(C.gscu_driver_sym_name(C.int(i))))
		}
	}
	return out
}

// Version is the CUDA version the driver supports, as 1000*major + 10*minor.
func (d *Driver) Version() int { return d.version }

// Path is the file the driver was loaded from.
func (d *Driver) Path() string { return d.path }

// HasVMM reports whether every virtual memory management function resolved.
// The device must support VMM too (AttrVirtualMemoryManagement).
func (d *Driver) HasVMM() bool { return len(d.missing(C.GSCU_TIER_VMM)) == 0 }

// HasStreamMemOps reports whether the stream memory operations resolved.
func (d *Driver) HasStreamMemOps() bool { return len(d.missing(C.GSCU_TIER_MEMOPS)) == 0 }

func (d *Driver) check(op string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &DriverError{Op: op, Code: int(r)}
}

// ErrorString is the driver's description of a CUresult.
func (d *Driver) ErrorString(code int) string {
	var s *C.char
	if C.gscu_cuGetErrorString(d.t, C.CUresult(code), &s) != 0 || s == nil {
		return ResultName(code)
	}
	return C.GoString(s)
}

// Handle conversions: raw values in Go, typed pointers in C. Reading the
// bits through a pointer keeps go vet's unsafeptr check quiet and never
// makes a Go pointer out of a driver handle's arithmetic.
func cCtx(c Context) C.CUcontext      { return *(*C.CUcontext)(unsafe.Pointer(&c)) }
func cStream(s Stream) C.CUstream     { return *(*C.CUstream)(unsafe.Pointer(&s)) }
func cEvent(e Event) C.CUevent        { return *(*C.CUevent)(unsafe.Pointer(&e)) }
func cDevPtr(p uintptr) C.CUdeviceptr { return C.CUdeviceptr(p) }

// ---- devices and contexts ---------------------------------------------------

// DeviceCount is the number of CUDA devices visible to the process.
func (d *Driver) DeviceCount() (int, error) {
	var n C.int
	return int(n), d.check("cuDeviceGetCount", C.gscu_cuDeviceGetCount(d.t, &n))
}

// Device returns the device with the given ordinal.
func (d *Driver) Device(ordinal int) (Device, error) {
	var dev C.CUdevice
	return Device(dev), d.check("cuDeviceGet", C.gscu_cuDeviceGet(d.t, &dev, C.int(ordinal)))
}

// DeviceAttribute reads one device attribute.
func (d *Driver) DeviceAttribute(dev Device, a Attribute) (int, error) {
	var v C.int
	r := C.gscu_cuDeviceGetAttribute(d.t, &v, C.CUdevice_attribute(a), C.CUdevice(dev))
	return int(v), d.check("cuDeviceGetAttribute", r)
}

// DeviceName is the marketing name of a device.
func (d *Driver) DeviceName(dev Device) (string, error) {
	var buf [256]C.char
	if err := d.check("cuDeviceGetName",
		C.gscu_cuDeviceGetName(d.t, &buf[0], C.int(len(buf)), C.CUdevice(dev))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// DeviceArch is the compute capability as 10*major + minor (90 for H100).
func (d *Driver) DeviceArch(dev Device) (int, error) {
	major, err := d.DeviceAttribute(dev, AttrComputeCapabilityMajor)
	if err != nil {
		return 0, err
	}
	minor, err := d.DeviceAttribute(dev, AttrComputeCapabilityMinor)
	return 10*major + minor, err
}

// RetainPrimaryContext returns the device's primary context (the one torch
// uses), creating it if needed; pair with ReleasePrimaryContext.
func (d *Driver) RetainPrimaryContext(dev Device) (Context, error) {
	var c C.CUcontext
	err := d.check("cuDevicePrimaryCtxRetain", C.gscu_cuDevicePrimaryCtxRetain(d.t, &c, C.CUdevice(dev)))
	return Context(unsafe.Pointer(c)), err
}

// ReleasePrimaryContext drops one reference taken by RetainPrimaryContext.
func (d *Driver) ReleasePrimaryContext(dev Device) error {
	return d.check("cuDevicePrimaryCtxRelease", C.gscu_cuDevicePrimaryCtxRelease(d.t, C.CUdevice(dev)))
}

// CurrentContext is the context current on the calling OS thread. It means
// something only while the goroutine is locked to its thread.
func (d *Driver) CurrentContext() (Context, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var c C.CUcontext
	err := d.check("cuCtxGetCurrent", C.gscu_cuCtxGetCurrent(d.t, &c))
	return Context(unsafe.Pointer(c)), err
}

// ---- memory -----------------------------------------------------------------

// MemAlloc allocates device memory in ctx.
func (d *Driver) MemAlloc(ctx Context, size uintptr) (uintptr, error) {
	var p C.CUdeviceptr
	err := d.check("cuMemAlloc", C.gscu_in_cuMemAlloc(d.t, cCtx(ctx), &p, C.size_t(size)))
	return uintptr(p), err
}

// MemFree frees memory from MemAlloc.
func (d *Driver) MemFree(ctx Context, p uintptr) error {
	return d.check("cuMemFree", C.gscu_in_cuMemFree(d.t, cCtx(ctx), cDevPtr(p)))
}

// Flags of cuMemHostAlloc.
const (
	HostAllocPortable  = 0x1 // CU_MEMHOSTALLOC_PORTABLE: pinned for every context
	HostAllocDeviceMap = 0x2 // CU_MEMHOSTALLOC_DEVICEMAP: kernels may address it
)

// MemHostAlloc allocates n bytes of pinned host memory in ctx. The result is
// C memory: never a Go pointer, valid until MemFreeHost.
func (d *Driver) MemHostAlloc(ctx Context, n uintptr, flags uint) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := d.check("cuMemHostAlloc", C.gscu_in_cuMemHostAlloc(d.t, cCtx(ctx), &p, C.size_t(n), C.uint(flags)))
	return p, err
}

// MemHostDevicePointer is the device address of memory from MemHostAlloc
// with HostAllocDeviceMap.
func (d *Driver) MemHostDevicePointer(ctx Context, p unsafe.Pointer) (uintptr, error) {
	var dp C.CUdeviceptr
	err := d.check("cuMemHostGetDevicePointer", C.gscu_in_cuMemHostGetDevicePointer(d.t, cCtx(ctx), &dp, p, 0))
	return uintptr(dp), err
}

// MemFreeHost frees memory from MemHostAlloc.
func (d *Driver) MemFreeHost(ctx Context, p unsafe.Pointer) error {
	return d.check("cuMemFreeHost", C.gscu_in_cuMemFreeHost(d.t, cCtx(ctx), p))
}

// MemcpyHtoD copies src to device memory, synchronously.
func (d *Driver) MemcpyHtoD(ctx Context, dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.check("cuMemcpyHtoD", C.gscu_in_cuMemcpyHtoD(d.t, cCtx(ctx), cDevPtr(dst),
		unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// MemcpyDtoH copies device memory into dst, synchronously.
func (d *Driver) MemcpyDtoH(ctx Context, dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.check("cuMemcpyDtoH", C.gscu_in_cuMemcpyDtoH(d.t, cCtx(ctx),
		unsafe.Pointer(&dst[0]), cDevPtr(src), C.size_t(len(dst))))
}

// MemcpyAsync copies n bytes between any two unified addresses on s.
func (d *Driver) MemcpyAsync(ctx Context, dst, src, n uintptr, s Stream) error {
	return d.check("cuMemcpyAsync", C.gscu_in_cuMemcpyAsync(d.t, cCtx(ctx), cDevPtr(dst),
		cDevPtr(src), C.size_t(n), cStream(s)))
}

// MemcpyDtoDAsync copies n bytes of device memory on s.
func (d *Driver) MemcpyDtoDAsync(ctx Context, dst, src, n uintptr, s Stream) error {
	return d.check("cuMemcpyDtoDAsync", C.gscu_in_cuMemcpyDtoDAsync(d.t, cCtx(ctx), cDevPtr(dst),
		cDevPtr(src), C.size_t(n), cStream(s)))
}

// MemsetD32Async sets n 32-bit words at dst to v on s.
func (d *Driver) MemsetD32Async(ctx Context, dst uintptr, v uint32, n uintptr, s Stream) error {
	return d.check("cuMemsetD32Async", C.gscu_in_cuMemsetD32Async(d.t, cCtx(ctx), cDevPtr(dst),
		C.uint(v), C.size_t(n), cStream(s)))
}

// PutAbort enqueues on s an abort for the kernels that wait on the words
// at base (a pad, a p2p channel's control): detail into word detailWord,
// then code into word codeWord, so that a kernel that reads the code finds
// its detail in place.
func (d *Driver) PutAbort(ctx Context, s Stream, base uintptr, codeWord, detailWord int, code, detail uint32) error {
	if err := d.MemsetD32Async(ctx, base+4*uintptr(detailWord), detail, 1, s); err != nil {
		return err
	}
	return d.MemsetD32Async(ctx, base+4*uintptr(codeWord), code, 1, s)
}

// Pointer attributes (CU_POINTER_ATTRIBUTE_*).
const (
	PointerContext          = 1
	PointerMemoryType       = 2
	PointerDeviceOrdinal    = 9
	PointerLegacyIPCCapable = 10
	PointerRangeStart       = 11
	PointerRangeSize        = 12
	PointerMapped           = 13
	PointerAllowedHandles   = 14
)

// PointerAttribute reads one attribute of a unified address. Every
// attribute gosym reads fits in 8 bytes and is returned zero-extended.
func (d *Driver) PointerAttribute(p uintptr, attr int) (uint64, error) {
	var v C.ulonglong
	r := C.gscu_cuPointerGetAttribute(d.t, unsafe.Pointer(&v), C.CUpointer_attribute(attr), cDevPtr(p))
	return uint64(v), d.check("cuPointerGetAttribute", r)
}

// AddressRange is the allocation that contains p: its base and size.
func (d *Driver) AddressRange(ctx Context, p uintptr) (base, size uintptr, err error) {
	var b C.CUdeviceptr
	var n C.size_t
	err = d.check("cuMemGetAddressRange", C.gscu_in_cuMemGetAddressRange(d.t, cCtx(ctx), &b, &n, cDevPtr(p)))
	return uintptr(b), uintptr(n), err
}

// ---- legacy IPC ---------------------------------------------------------------

// IpcHandle is a cuIpcGetMemHandle handle, safe to send to a peer process.
type IpcHandle [C.GSCU_IPC_HANDLE_SIZE]byte

// IpcGetMemHandle exports the cudaMalloc allocation that starts at p.
func (d *Driver) IpcGetMemHandle(ctx Context, p uintptr) (IpcHandle, error) {
	var h C.CUipcMemHandle
	var out IpcHandle
	err := d.check("cuIpcGetMemHandle", C.gscu_in_cuIpcGetMemHandle(d.t, cCtx(ctx), &h, cDevPtr(p)))
	copy(out[:], C.GoBytes(unsafe.Pointer(&h), C.int(len(out))))
	return out, err
}

// IpcOpenMemHandle maps a peer's allocation into ctx.
func (d *Driver) IpcOpenMemHandle(ctx Context, h IpcHandle, flags uint) (uintptr, error) {
	var ch C.CUipcMemHandle
	C.memcpy(unsafe.Pointer(&ch), unsafe.Pointer(&h[0]), C.size_t(len(h)))
	var p C.CUdeviceptr
	err := d.check("cuIpcOpenMemHandle", C.gscu_in_cuIpcOpenMemHandle(d.t, cCtx(ctx), &p, ch, C.uint(flags)))
	return uintptr(p), err
}

// IpcCloseMemHandle unmaps what IpcOpenMemHandle mapped.
func (d *Driver) IpcCloseMemHandle(ctx Context, p uintptr) error {
	return d.check("cuIpcCloseMemHandle", C.gscu_in_cuIpcCloseMemHandle(d.t, cCtx(ctx), cDevPtr(p)))
}

// ---- streams and events -----------------------------------------------------

// StreamCreate makes a stream in ctx (flags: StreamNonBlocking or 0).
func (d *Driver) StreamCreate(ctx Context, flags uint) (Stream, error) {
	var s C.CUstream
	err := d.check("cuStreamCreate", C.gscu_in_cuStreamCreate(d.t, cCtx(ctx), &s, C.uint(flags)))
	return Stream(unsafe.Pointer(s)), err
}

// StreamDestroy destroys a stream from StreamCreate.
func (d *Driver) StreamDestroy(ctx Context, s Stream) error {
	return d.check("cuStreamDestroy", C.gscu_in_cuStreamDestroy(d.t, cCtx(ctx), cStream(s)))
}

// StreamSynchronize blocks until all work on s is done.
func (d *Driver) StreamSynchronize(ctx Context, s Stream) error {
	return d.check("cuStreamSynchronize", C.gscu_in_cuStreamSynchronize(d.t, cCtx(ctx), cStream(s)))
}

// Privately runs enqueue on a stream of its own in ctx and waits for it:
// the caller's streams, which may hold kernels waiting for peers, stay out
// of it (setup writes, the p2p channels' control).
func (d *Driver) Privately(ctx Context, enqueue func(Stream) error) error {
	s, err := d.StreamCreate(ctx, StreamNonBlocking)
	if err != nil {
		return err
	}
	err = enqueue(s)
	if err == nil {
		err = d.StreamSynchronize(ctx, s)
	}
	return errors.Join(err, d.StreamDestroy(ctx, s))
}

// StreamCaptureInfo reports whether s is being captured into a CUDA graph
// (an invalidated capture counts: whatever is enqueued on s fails anyway) and the capture
// sequence's id, unique per process for an active capture (0 otherwise).
func (d *Driver) StreamCaptureInfo(ctx Context, s Stream) (capturing bool, id uint64, err error) {
	var st C.CUstreamCaptureStatus
	var cid C.cuuint64_t
	err = d.check("cuStreamGetCaptureInfo", C.gscu_in_cuStreamGetCaptureInfo(d.t, cCtx(ctx), cStream(s), &st, &cid, nil, nil, nil))
	return st != 0, uint64(cid), err
}

// StreamWaitEvent makes later work on s wait for e.
func (d *Driver) StreamWaitEvent(ctx Context, s Stream, e Event) error {
	return d.check("cuStreamWaitEvent", C.gscu_in_cuStreamWaitEvent(d.t, cCtx(ctx), cStream(s), cEvent(e), 0))
}

// EventCreate makes an event (flags: EventDisableTiming or 0).
func (d *Driver) EventCreate(ctx Context, flags uint) (Event, error) {
	var e C.CUevent
	err := d.check("cuEventCreate", C.gscu_in_cuEventCreate(d.t, cCtx(ctx), &e, C.uint(flags)))
	return Event(unsafe.Pointer(e)), err
}

// EventRecord records e on s.
func (d *Driver) EventRecord(ctx Context, e Event, s Stream) error {
	return d.check("cuEventRecord", C.gscu_in_cuEventRecord(d.t, cCtx(ctx), cEvent(e), cStream(s)))
}

// EventSynchronize blocks until e has completed.
func (d *Driver) EventSynchronize(ctx Context, e Event) error {
	return d.check("cuEventSynchronize", C.gscu_in_cuEventSynchronize(d.t, cCtx(ctx), cEvent(e)))
}

// EventQuery reports whether e has completed, without blocking.
func (d *Driver) EventQuery(ctx Context, e Event) (bool, error) {
	r := C.gscu_in_cuEventQuery(d.t, cCtx(ctx), cEvent(e))
	if r == resultNotReady {
		return false, nil
	}
	return r == 0, d.check("cuEventQuery", r)
}

// EventElapsed is the time in milliseconds between two recorded events.
func (d *Driver) EventElapsed(ctx Context, start, end Event) (float32, error) {
	var ms C.float
	err := d.check("cuEventElapsedTime", C.gscu_in_cuEventElapsedTime(d.t, cCtx(ctx), &ms, cEvent(start), cEvent(end)))
	return float32(ms), err
}

// EventDestroy destroys an event.
func (d *Driver) EventDestroy(ctx Context, e Event) error {
	return d.check("cuEventDestroy", C.gscu_in_cuEventDestroy(d.t, cCtx(ctx), cEvent(e)))
}
