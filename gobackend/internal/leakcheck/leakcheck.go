// Package leakcheck is the TestMain of gosym's packages (cilium/ebpf's
// testmain idea): a package's tests must give back every fd, goroutine and
// resource they take, so the counts after the tests must return to the
// counts before them.
package leakcheck

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// OpenFDs counts this process's open file descriptors, leaving out the
// CUDA driver's device files (/dev/nvidia*), which it keeps open for the
// life of the process once initialised.
func OpenFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); !strings.HasPrefix(l, "/dev/nvidia") {
			n++
		}
	}
	return n
}

// Goroutines counts goroutines, leaving out the os/signal loop that the
// fuzzing coordinator starts for good.
func Goroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "os/signal.loop") {
			n++
		}
	}
	return n
}

// Main runs the tests, then fails the package if fds or goroutines grew or
// live (package resources still held, "" when none) reports something,
// after giving background goroutines up to two seconds to finish.
func Main(m *testing.M, live func() string) {
	// The runtime's network poller keeps its epoll and eventfd descriptors
	// for the life of the process: start it before taking the baseline.
	if ln, err := net.Listen("unix", fmt.Sprintf("@gosym-leakcheck-%d", os.Getpid())); err == nil {
		ln.Close()
	}
	fds, gs := OpenFDs(), Goroutines()
	code := m.Run()
	if code == 0 {
		var leak string
		for try := 0; try < 100; try++ {
			leak = ""
			if n := OpenFDs(); n > fds {
				leak += fmt.Sprintf(" fds %d->%d", fds, n)
			}
			if n := Goroutines(); n > gs {
				leak += fmt.Sprintf(" goroutines %d->%d", gs, n)
			}
			if live != nil {
				if s := live(); s != "" {
					leak += " " + s
				}
			}
			if leak == "" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if leak != "" {
			fmt.Fprintln(os.Stderr, "leak check failed:"+leak)
			ents, _ := os.ReadDir("/proc/self/fd")
			for _, e := range ents {
				l, _ := os.Readlink("/proc/self/fd/" + e.Name())
				fmt.Fprintln(os.Stderr, e.Name(), l)
			}
			buf := make([]byte, 1<<20)
			os.Stderr.Write(buf[:runtime.Stack(buf, true)])
			code = 1
		}
	}
	os.Exit(code)
}
