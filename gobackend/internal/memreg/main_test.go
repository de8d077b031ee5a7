package memreg

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/host"
)

// goroutines counts goroutines, leaving out the os/signal loop that the
// fuzzing coordinator starts for good.
func goroutines() int {
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

func openFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// TestMain fails the package when tests leak fds, mappings, memfds or
// goroutines (fd servers, connection handlers): every test closes the
// domains it makes, so the counts must return to where they started.
func TestMain(m *testing.M) {
	// The runtime's network poller keeps its epoll and eventfd descriptors
	// for the life of the process: start it before taking the baseline.
	if ln, err := net.Listen("unix", fmt.Sprintf("@gosym-memreg-testmain-%d", os.Getpid())); err == nil {
		ln.Close()
	}
	fds, gs := openFDs(), goroutines()
	code := m.Run()
	if code == 0 {
		var leak string
		for try := 0; try < 100; try++ {
			leak = ""
			if n := openFDs(); n > fds {
				leak += fmt.Sprintf(" fds %d->%d", fds, n)
			}
			if n := goroutines(); n > gs {
				leak += fmt.Sprintf(" goroutines %d->%d", gs, n)
			}
			if n := host.LiveRegions(); n != 0 {
				leak += fmt.Sprintf(" mappings %d", n)
			}
			if n := host.LiveFDs(); n != 0 {
				leak += fmt.Sprintf(" memfds %d", n)
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
