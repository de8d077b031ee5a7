package cuda

/*
#include "dispatch.h"
*/
import "C"

import (
	"fmt"
	"strconv"
	"strings"
)

// MulticastAllowed is the single gate in front of NVLink multicast
// (cuMulticastCreate and friends). It says yes only when the operator opted
// in with GOSYM_NVLS=1, no other stack's switch says no (NCCL_NVLS_ENABLE=0,
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1; read
// conservatively: any value that is not clearly "enable" counts as no), and
// the device reports support. reason explains the answer.
func MulticastAllowed(env func(string) string, deviceSupports bool) (ok bool, reason string) {
	get := func(name string) string { return strings.TrimSpace(env(name)) }
	if v := get("NCCL_NVLS_ENABLE"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n <= 0 {
			return false, fmt.Sprintf("NCCL_NVLS_ENABLE=%s disables NVLink SHARP", v)
		}
	}
	for _, name := range []string{"TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"} {
		if v := get(name); v != "" && !isFalse(v) {
			return false, fmt.Sprintf("%s=%s disables multicast", name, v)
		}
	}
	switch v := get("GOSYM_NVLS"); v {
	case "1":
	case "":
		return false, "multicast is opt-in and GOSYM_NVLS is not set to 1"
	default:
		return false, fmt.Sprintf("GOSYM_NVLS=%s (only GOSYM_NVLS=1 enables multicast)", v)
	}
	if !deviceSupports {
		return false, "the device does not report CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED"
	}
	return true, "GOSYM_NVLS=1, the device supports multicast and no variable forbids it"
}

func isFalse(v string) bool {
	switch strings.ToLower(v) {
	case "0", "false", "no", "off", "n", "f":
		return true
	}
	return false
}

// Multicast gives access to the multicast functions. The only way to get
// one is EnableMulticast, which passes MulticastAllowed first; until then the
// multicast symbols are not even looked up, and the C wrappers refuse to call
// them (GSCU_ERROR_REFUSED) whatever their slots hold.
type Multicast struct {
	d *Driver
}

// EnableMulticast reads the device's multicast support (an attribute read,
// nothing is created), asks MulticastAllowed with env (os.Getenv in
// production) and, on yes only, resolves the multicast functions. A refusal
// wraps ErrNotSupported and carries the gate's reason.
func (d *Driver) EnableMulticast(env func(string) string, dev Device) (*Multicast, error) {
	v, err := d.DeviceAttribute(dev, AttrMulticastSupported)
	ok, reason := MulticastAllowed(env, err == nil && v == 1)
	if !ok {
		return nil, fmt.Errorf("%w: multicast: %s", ErrNotSupported, reason)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mc == nil {
		C.gscu_enable_multicast(d.t, d.lib, d.fakeFlag())
		if missing := d.missing(C.GSCU_TIER_MC); len(missing) > 0 {
			return nil, fmt.Errorf("%w: multicast: %w", ErrNotSupported,
				&SymbolError{Library: d.path, Missing: missing})
		}
		d.mc = &Multicast{d: d}
	}
	return d.mc, nil
}

// MulticastProp describes a multicast object (CUmulticastObjectProp).
type MulticastProp struct {
	NumDevices  uint32
	Size        uintptr
	HandleTypes uint64 // HandleTypePosixFD, HandleTypeFabric
}

func (p MulticastProp) c() C.CUmulticastObjectProp {
	return C.CUmulticastObjectProp{numDevices: C.uint(p.NumDevices), size: C.size_t(p.Size),
		handleTypes: C.ulonglong(p.HandleTypes)}
}

// Granularity is the minimum (or recommended) size granularity of p.
func (m *Multicast) Granularity(ctx Context, p MulticastProp, recommended bool) (uintptr, error) {
	cp := p.c()
	var g C.size_t
	opt := C.int(0)
	if recommended {
		opt = 1
	}
	err := m.d.check("cuMulticastGetGranularity", C.gscu_in_cuMulticastGetGranularity(m.d.t, cCtx(ctx), &g, &cp, opt))
	return uintptr(g), err
}

// Create makes a multicast object; release it with MemRelease.
func (m *Multicast) Create(ctx Context, p MulticastProp) (AllocHandle, error) {
	cp := p.c()
	var h C.CUmemGenericAllocationHandle
	err := m.d.check("cuMulticastCreate", C.gscu_in_cuMulticastCreate(m.d.t, cCtx(ctx), &h, &cp))
	return AllocHandle(h), err
}

// AddDevice adds dev to the multicast team of h.
func (m *Multicast) AddDevice(ctx Context, h AllocHandle, dev Device) error {
	return m.d.check("cuMulticastAddDevice", C.gscu_in_cuMulticastAddDevice(m.d.t, cCtx(ctx),
		C.CUmemGenericAllocationHandle(h), C.CUdevice(dev)))
}

// BindMem binds size bytes of mem at memOffset to h at mcOffset.
func (m *Multicast) BindMem(ctx Context, h AllocHandle, mcOffset uintptr, mem AllocHandle, memOffset, size uintptr) error {
	return m.d.check("cuMulticastBindMem", C.gscu_in_cuMulticastBindMem(m.d.t, cCtx(ctx),
		C.CUmemGenericAllocationHandle(h), C.size_t(mcOffset), C.CUmemGenericAllocationHandle(mem),
		C.size_t(memOffset), C.size_t(size), 0))
}

// Unbind undoes BindMem for dev.
func (m *Multicast) Unbind(ctx Context, h AllocHandle, dev Device, mcOffset, size uintptr) error {
	return m.d.check("cuMulticastUnbind", C.gscu_in_cuMulticastUnbind(m.d.t, cCtx(ctx),
		C.CUmemGenericAllocationHandle(h), C.CUdevice(dev), C.size_t(mcOffset), C.size_t(size)))
}
