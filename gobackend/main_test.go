package gobackend

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/host"
)

func openFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// TestMain fails the package when tests leak fds, mappings, endpoints or
// goroutines: every test destroys what it creates, so the counts must
// return to where they started.
func TestMain(m *testing.M) {
	// Start the runtime's network poller first: its epoll and eventfd
	// descriptors live for the whole process and are not leaks.
	if ln, err := net.Listen("unix", fmt.Sprintf("@gosym-testmain-%d", os.Getpid())); err == nil {
		ln.Close()
	}
	fds, gs := openFDs(), runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		var leak string
		for try := 0; try < 50; try++ {
			leak = ""
			if n := openFDs(); n > fds {
				leak += fmt.Sprintf(" fds %d->%d", fds, n)
			}
			if n := runtime.NumGoroutine(); n > gs {
				leak += fmt.Sprintf(" goroutines %d->%d", gs, n)
			}
			if n := host.LiveRegions() + host.LiveFDs() + liveEndpoints.Load(); n != 0 {
				leak += fmt.Sprintf(" regions+memfds+endpoints %d", n)
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
