package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// TestMain fails the package when its tests leak file descriptors or
// goroutines (compile-cache files, libraries opened for probing).
func TestMain(m *testing.M) {
	// os/exec starts the runtime's poller, whose descriptors live as long
	// as the process: start it before taking the baseline.
	_ = exec.Command("true").Run()
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
			code = 1
		}
	}
	os.Exit(code)
}

func openFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// skipIfNoCUDA skips a test that needs CUDA when err says CUDA is absent,
// and fails it for any other error (cilium's SkipIfNotSupported): an error
// that forgot to wrap ErrNoCUDA must not silently turn into a skip.
func skipIfNoCUDA(tb testing.TB, err error) {
	tb.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, ErrNoCUDA) {
		tb.Skipf("no CUDA here: %v", err)
	}
	tb.Fatalf("unexpected error (not ErrNoCUDA): %v", err)
}

// withFake runs f against the fake driver.
func withFake(t *testing.T, f func(d *Driver), missing ...string) {
	t.Helper()
	d, release, err := fakeDriver(missing...)
	if err != nil {
		t.Fatalf("fake driver: %v", err)
	}
	defer release()
	f(d)
}

func dtypeOf(v int32) dtype.DType { return dtype.DType(v) }
func redOpOf(v int32) dtype.RedOp { return dtype.RedOp(v) }
