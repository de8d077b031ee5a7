package cuda

/*
#include "dispatch.h"
*/
import "C"

import "sync/atomic"

// SetTiming turns the count of driver calls and of the host time spent in
// them on or off, for every Driver of the process: the call-cost bench
// (gosym.callcost) tells the engine's own time from the driver's with it.
// Off, a driver call pays one predictable branch.
func SetTiming(on bool) {
	v := C.int(0)
	if on {
		v = 1
	}
	atomic.StoreInt32((*int32)(&C.gscu_timing), int32(v))
}

// Timed returns the driver calls counted and the nanoseconds spent in them
// while timing was on, since the process started.
func Timed() (calls, ns uint64) {
	return atomic.LoadUint64((*uint64)(&C.gscu_timed_calls)), atomic.LoadUint64((*uint64)(&C.gscu_timed_ns))
}
