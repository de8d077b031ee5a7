package cuda

/*
// gscu_launch copies what its pointers point at before it returns, and
// never calls back into Go: its offsets and parameters stay on the Go stack.
#cgo noescape gscu_launch
#cgo nocallback gscu_launch
#include <stdlib.h>
#include <string.h>
#include "dispatch.h"

#define GSCU_MAX_PARAMS 8
#define GSCU_MAX_PARAM_BYTES 4096

// Launches f with its parameters copied out of blob into C storage: the
// driver gets an array of pointers into this frame, never a Go pointer, and
// copies the values before cuLaunchKernel returns. With dependent set, and
// where the driver has cuLaunchKernelEx, the launch may overlap the previous
// kernel of the stream (programmatic stream serialization; the kernel waits
// for it in gs_kernel_begin).
static inline CUresult gscu_launch(const gscu_driver *t, CUcontext ctx, CUfunction f,
                                   unsigned int gx, unsigned int gy, unsigned int gz,
                                   unsigned int bx, unsigned int by, unsigned int bz,
                                   unsigned int shmem, CUstream s, const void *blob,
                                   size_t len, const size_t *offsets, int n, int dependent) {
	_Alignas(16) char buf[GSCU_MAX_PARAM_BYTES];
	void *ptrs[GSCU_MAX_PARAMS];
	if (n < 0 || n > GSCU_MAX_PARAMS || len > sizeof buf)
		return 1; // CUDA_ERROR_INVALID_VALUE
	if (len)
		memcpy(buf, blob, len);
	for (int i = 0; i < n; i++) {
		if (offsets[i] >= len)
			return 1;
		ptrs[i] = buf + offsets[i];
	}
	if (dependent && t->cuLaunchKernelEx) {
		CUlaunchAttribute attr;
		memset(&attr, 0, sizeof attr);
		attr.id = GSCU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
		attr.value.programmaticStreamSerializationAllowed = 1;
		CUlaunchConfig cfg = {gx, gy, gz, bx, by, bz, shmem, s, &attr, 1};
		return gscu_in_cuLaunchKernelEx(t, ctx, &cfg, f, ptrs, NULL);
	}
	return gscu_in_cuLaunchKernel(t, ctx, f, gx, gy, gz, bx, by, bz, shmem, s, ptrs, NULL);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

const (
	maxParams     = C.GSCU_MAX_PARAMS
	maxParamBytes = C.GSCU_MAX_PARAM_BYTES
)

// Kernel describes one __global__ function: where its source is and its
// parameter list. The list is the only description of the arguments: Launch
// takes its count and every layout from here, so caller and kernel cannot
// disagree (params.cuh is generated from the same structs).
type Kernel struct {
	Name   string    // extern "C" name
	Source string    // file in package kernels
	Params []*Struct // one entry per parameter, in order
}

// Param is a value that can be passed as a kernel parameter: one of the
// parameter structs of this package (ARParams, CopyParams, BarrierParams,
// SemaParams, NVLSParams, P2PParams, LLMoveParams, A2AVParams, RelayParams).
type Param interface {
	kernelParam() (*Struct, unsafe.Pointer)
}

func (p *ARParams) kernelParam() (*Struct, unsafe.Pointer)   { return arLayout, unsafe.Pointer(p) }
func (p *CopyParams) kernelParam() (*Struct, unsafe.Pointer) { return copyLayout, unsafe.Pointer(p) }
func (p *BarrierParams) kernelParam() (*Struct, unsafe.Pointer) {
	return barrierLayout, unsafe.Pointer(p)
}
func (p *SemaParams) kernelParam() (*Struct, unsafe.Pointer) { return semaLayout, unsafe.Pointer(p) }
func (p *NVLSParams) kernelParam() (*Struct, unsafe.Pointer) { return nvlsLayout, unsafe.Pointer(p) }
func (p *P2PParams) kernelParam() (*Struct, unsafe.Pointer)  { return p2pLayout, unsafe.Pointer(p) }
func (p *LLMoveParams) kernelParam() (*Struct, unsafe.Pointer) {
	return llMoveLayout, unsafe.Pointer(p)
}
func (p *A2AVParams) kernelParam() (*Struct, unsafe.Pointer) { return a2avLayout, unsafe.Pointer(p) }
func (p *RelayParams) kernelParam() (*Struct, unsafe.Pointer) {
	return relayLayout, unsafe.Pointer(p)
}
func (p *StepsParams) kernelParam() (*Struct, unsafe.Pointer) { return stepsLayout, unsafe.Pointer(p) }

// Module is a loaded CUBIN/PTX image, bound to the context it was loaded in.
type Module struct {
	d   *Driver
	ctx Context
	h   C.CUmodule
	// dependent: its kernels launch with programmatic stream serialization
	// (SetDependentLaunch)
	dependent bool
}

// SetDependentLaunch makes every later launch of the module's kernels a
// programmatic dependent of the kernel before it on the stream: it may
// start while that one runs, and waits for it on the device (every kernel
// of package kernels begins with that wait, gs_kernel_begin). Only where
// DependentLaunch says the driver and device support it; elsewhere the
// launches stay plain.
func (m *Module) SetDependentLaunch(on bool) { m.dependent = on }

// DependentLaunch reports whether launches on dev may be programmatic
// dependents: compute capability 9.0 or newer (griddepcontrol), a driver
// with cuLaunchKernelEx, and CUDA 12.3 or newer, which captures such
// launches into graphs as programmatic edges.
func (d *Driver) DependentLaunch(dev Device) bool {
	if d.version < 12030 || len(d.missing(C.GSCU_TIER_LAUNCHEX)) > 0 {
		return false
	}
	arch, err := d.DeviceArch(dev)
	return err == nil && arch >= 90
}

// Function is a kernel of a Module.
type Function struct {
	m *Module
	h C.CUfunction
	k *Kernel
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// D1 is the one-dimensional shape n x 1 x 1.
func D1(n uint32) Dim3 { return Dim3{n, 1, 1} }

// LoadModule loads an image (CUBIN, or NUL-terminated PTX) into ctx.
func (d *Driver) LoadModule(ctx Context, image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: load module: empty image")
	}
	// cuModuleLoadData reads the image during the call only.
	var h C.CUmodule
	if err := d.check("cuModuleLoadData",
		C.gscu_in_cuModuleLoadData(d.t, cCtx(ctx), &h, unsafe.Pointer(&image[0]))); err != nil {
		return nil, err
	}
	return &Module{d: d, ctx: ctx, h: h}, nil
}

// Unload unloads the module; its Functions must not be used afterwards.
func (m *Module) Unload() error {
	if m.h == nil {
		return nil
	}
	err := m.d.check("cuModuleUnload", C.gscu_in_cuModuleUnload(m.d.t, cCtx(m.ctx), m.h))
	m.h = nil
	return err
}

// Function looks up kernel k in the module.
func (m *Module) Function(k *Kernel) (*Function, error) {
	if len(k.Params) > maxParams {
		return nil, fmt.Errorf("cuda: kernel %s has %d parameters, at most %d", k.Name, len(k.Params), maxParams)
	}
	name := C.CString(k.Name)
	defer C.free(unsafe.Pointer(name))
	var f C.CUfunction
	if err := m.d.check("cuModuleGetFunction",
		C.gscu_in_cuModuleGetFunction(m.d.t, cCtx(m.ctx), &f, m.h, name)); err != nil {
		return nil, fmt.Errorf("%w (kernel %s)", err, k.Name)
	}
	return &Function{m: m, h: f, k: k}, nil
}

// Kernel is the description the function was looked up with.
func (f *Function) Kernel() *Kernel { return f.k }

// Function attributes (CU_FUNC_ATTRIBUTE_*).
const (
	FuncMaxThreadsPerBlock = 0
	FuncSharedSizeBytes    = 1
	FuncLocalSizeBytes     = 3
	FuncNumRegs            = 4
)

// Attribute reads a function attribute, such as FuncNumRegs.
func (f *Function) Attribute(attr int) (int, error) {
	var v C.int
	r := C.gscu_in_cuFuncGetAttribute(f.m.d.t, cCtx(f.m.ctx), &v, C.CUfunction_attribute(attr), f.h)
	return int(v), f.m.d.check("cuFuncGetAttribute", r)
}

// Launch runs f on stream with the given parameters, in the function's
// context. The arguments must match f's Kernel.Params one for one.
func (d *Driver) Launch(f *Function, grid, block Dim3, shmem uint32, stream Stream, args ...Param) error {
	if len(args) != len(f.k.Params) {
		return fmt.Errorf("cuda: launch %s: %d arguments, the kernel takes %d", f.k.Name, len(args), len(f.k.Params))
	}
	var offsets [maxParams]C.size_t
	var blob unsafe.Pointer
	var size uintptr
	if len(args) == 1 { // every kernel of ours: hand the struct over as it is
		layout, p := args[0].kernelParam()
		if layout != f.k.Params[0] {
			return fmt.Errorf("cuda: launch %s: argument 0 is %s, the kernel takes %s", f.k.Name, layout.Name, f.k.Params[0].Name)
		}
		blob, size = p, layout.Size
	} else {
		packed, n, err := packParams(f.k, args, &offsets)
		if err != nil {
			return err
		}
		blob, size = unsafe.Pointer(&packed[0]), n
	}
	dependent := C.int(0)
	if f.m.dependent {
		dependent = 1
	}
	r := C.gscu_launch(d.t, cCtx(f.m.ctx), f.h, C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(shmem), cStream(stream),
		blob, C.size_t(size), &offsets[0], C.int(len(args)), dependent)
	if r != 0 {
		call := "cuLaunchKernel"
		if dependent != 0 && d.t.cuLaunchKernelEx != nil {
			call = "cuLaunchKernelEx"
		}
		err := d.check(call, r)
		return fmt.Errorf("%w (kernel %s)", err, f.k.Name)
	}
	return nil
}

// packParams lays several parameters out as the kernel's C signature does,
// filling their offsets. Kept out of Launch so that the common single-struct
// launch does not zero a parameter buffer it never uses.
func packParams(k *Kernel, args []Param, offsets *[maxParams]C.size_t) (*[maxParamBytes]byte, uintptr, error) {
	packed := new([maxParamBytes]byte)
	var size uintptr
	for i, a := range args {
		layout, p := a.kernelParam()
		if layout != k.Params[i] {
			return nil, 0, fmt.Errorf("cuda: launch %s: argument %d is %s, the kernel takes %s", k.Name, i,
				layout.Name, k.Params[i].Name)
		}
		off := alignUp(size, layout.Align)
		if off+layout.Size > maxParamBytes {
			return nil, 0, fmt.Errorf("cuda: launch %s: parameters exceed %d bytes", k.Name, maxParamBytes)
		}
		copy(packed[off:], unsafe.Slice((*byte)(p), layout.Size))
		offsets[i], size = C.size_t(off), off+layout.Size
	}
	return packed, size, nil
}

// ResidentBlocks is how many blocks of f (threads each, no dynamic shared
// memory) dev runs at once: its SMs times what one SM holds by threads and
// by registers. Kernels whose blocks wait on one another (gs_a2av) need
// them all resident; an attribute the driver does not give counts as the
// usual (one SM, 2048 threads, 64Ki registers).
func (d *Driver) ResidentBlocks(dev Device, f *Function, threads int) int {
	attr := func(a Attribute, def int) int {
		if v, err := d.DeviceAttribute(dev, a); err == nil && v > 0 {
			return v
		}
		return def
	}
	regs, err := f.Attribute(FuncNumRegs)
	if err != nil {
		regs = 0
	}
	return residentBlocks(attr(AttrMultiprocessorCount, 1), attr(AttrMaxThreadsPerSM, 2048),
		attr(AttrMaxRegistersPerSM, 65536), regs, threads)
}

// residentBlocks is ResidentBlocks' count for sms SMs of threadsSM threads
// and regsSM registers each, for blocks of threads threads of regs
// registers (0: unknown, threads alone bound it).
func residentBlocks(sms, threadsSM, regsSM, regs, threads int) int {
	if threads <= 0 {
		return 0
	}
	perSM := threadsSM / threads
	if regs > 0 {
		warp := (regs*32 + 255) / 256 * 256 // registers are allocated per warp, 256 at a time
		perSM = min(perSM, regsSM/(warp*((threads+31)/32)))
	}
	return sms * perSM
}
