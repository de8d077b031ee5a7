package cuda

/*
#include <stdlib.h>
#include <string.h>
#include "dispatch.h"
*/
import "C"

import (
	"strings"
	"sync"
	"unsafe"
)

// The fake driver: a real dispatch table whose slots point at C stubs that
// count their calls (dispatch.c). It goes through the same resolution and
// wrapper code as libcuda does, so tests of gating and missing symbols run
// on machines without CUDA. The stubs share global C state, hence one fake
// at a time.

var fakeMu sync.Mutex

// fakeDriver returns a Driver over the stubs, with the given driver
// functions left unresolved (as an old or stripped libcuda would), and a
// release function that must be called when the test is done with it.
func fakeDriver(missing ...string) (*Driver, func(), error) {
	fakeMu.Lock()
	C.gscu_fake_reset()
	m := C.CString(strings.Join(missing, ","))
	C.strncpy(&C.gscu_fake_missing[0], m, C.size_t(len(C.gscu_fake_missing)-1))
	C.free(unsafe.Pointer(m))
	d := newDriver(nil, true)
	release := func() {
		C.free(unsafe.Pointer(d.t))
		fakeMu.Unlock()
	}
	if err := d.finishLoad("fake"); err != nil {
		release()
		return nil, nil, err
	}
	return d, release, nil
}

func (d *Driver) fakeFlag() C.int {
	if d.fake {
		return 1
	}
	return 0
}

func fakeIndex(name string) int {
	for i := 0; i < int(C.GSCU_NUM_DRIVER_FUNCS); i++ {
		if C.GoString(C.gscu_driver_sym_name(C.int(i))) == name {
			return i
		}
	}
	panic("cuda: no driver function " + name)
}

// fakeCalls is how often the stub of a driver function ran.
func fakeCalls(name string) int64 { return int64(C.gscu_fake_calls[fakeIndex(name)]) }

// fakeSetResult makes the stub of name return code.
func fakeSetResult(name string, code int) { C.gscu_fake_result[fakeIndex(name)] = C.CUresult(code) }

// fakeSetAttr sets what cuDeviceGetAttribute reports for a.
func fakeSetAttr(a Attribute, v int) { C.gscu_fake_attr[a] = C.int(v) }

// fakeSetVersion sets what cuDriverGetVersion reports (before fakeDriver
// checks it, use fakeDriverVersion).
func fakeSetVersion(v int) { C.gscu_fake_version = C.int(v) }

// fakeMulticastLookups counts how often a multicast symbol was looked up.
func fakeMulticastLookups() int64 { return int64(C.gscu_fake_lookups_mc) }

// fakeMulticastEnabled reports the C-side gate flag of d.
func fakeMulticastEnabled(d *Driver) bool { return d.t.mc_enabled != 0 }

// fakeCallMulticastCreate calls the C wrapper of cuMulticastCreate directly,
// bypassing the Go API, to show the C-side gate on its own.
func fakeCallMulticastCreate(d *Driver) int {
	var h C.CUmemGenericAllocationHandle
	var p C.CUmulticastObjectProp
	return int(C.gscu_cuMulticastCreate(d.t, &h, &p))
}

// fakeFillMulticastSlots points the multicast slots at the stubs without
// opening the gate, as a bug elsewhere might.
func fakeFillMulticastSlots(d *Driver) {
	saved := d.t.mc_enabled
	C.gscu_enable_multicast(d.t, nil, 1)
	d.t.mc_enabled = saved
}

// fakeCurrentContext reads the stubs' notion of the current context.
func fakeCurrentContext(d *Driver) Context {
	var c C.CUcontext
	C.gscu_cuCtxGetCurrent(d.t, &c)
	return Context(unsafe.Pointer(c))
}

// fakeSetCurrentContext sets it.
func fakeSetCurrentContext(d *Driver, c Context) { C.gscu_cuCtxSetCurrent(d.t, cCtx(c)) }

// fakeFailAt makes the n-th call (counted from the fake's reset) of the
// stub of name fail with CUDA_ERROR_UNKNOWN.
func fakeFailAt(name string, n int64) { C.gscu_fake_fail_at[fakeIndex(name)] = C.longlong(n) }

// fakeCall is one logged call of the fake: the function and the handle or
// address it worked on (0 for stubs that do not say).
type fakeCall struct {
	Name string
	Arg  uint64
}

// fakeLog is every call of the fake since its reset, in order.
func fakeLog() []fakeCall {
	n := min(int(C.gscu_fake_log_n), int(C.GSCU_FAKE_LOG))
	out := make([]fakeCall, n)
	for i := range out {
		out[i] = fakeCall{Name: C.GoString(C.gscu_driver_sym_name(C.gscu_fake_log_fn[i])),
			Arg: uint64(C.gscu_fake_log_arg[i])}
	}
	return out
}
