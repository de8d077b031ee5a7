package shm

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared (not FUTEX_PRIVATE) futex operations: the words live in memfd
// mappings that other processes also map.
const (
	futexWait = 0
	futexWake = 1
)

// FutexWait sleeps while *addr == val, at most d. Spurious and early
// returns are normal: callers re-check their condition.
func FutexWait(addr *uint32, val uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// FutexWake wakes every waiter sleeping on addr.
func FutexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(1<<31-1), 0, 0, 0)
}

// Yield gives the core to another runnable thread, if any (sched_yield).
func Yield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
