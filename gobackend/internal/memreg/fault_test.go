package memreg

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/shm"
)

var errInjected = errors.New("injected fault")

// faultScenario exercises every acquisition step once: alloc, map inside
// the region, pack (starting the fd server), import in another domain. It
// returns how many memhs it got.
func faultScenario(exp, imp *Domain) (int, error) {
	a, err := exp.Alloc(8192)
	if err != nil {
		return 0, err
	}
	sub, err := exp.Map(a.Address()+4096, 100, HostDevice)
	if err != nil {
		return 1, err
	}
	blob, err := sub.Pack()
	if err != nil {
		return 2, err
	}
	m, err := imp.Import(blob)
	if err != nil {
		return 2, err
	}
	m.Bytes()[0] = 1
	if a.Bytes()[4096] != 1 {
		return 3, errors.New("import does not share the exporter's memory")
	}
	return 3, nil
}

// faultRecorder fails the n-th acquisition step (counting from 0) of both
// domains together, or none when n < 0, and records the steps it saw.
type faultRecorder struct {
	mu    sync.Mutex
	n     int
	steps []string
}

func (f *faultRecorder) hook(step string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = append(f.steps, step)
	if len(f.steps)-1 == f.n {
		return errInjected
	}
	return nil
}

func runFaultScenario(n int) ([]string, error) {
	f := &faultRecorder{n: n}
	exp, imp := NewDomain(), NewDomain()
	exp.SetHooks(&Hooks{Fault: f.hook})
	imp.SetHooks(&Hooks{Fault: f.hook})
	made, err := faultScenario(exp, imp)
	if live := exp.Stats()["live"] + imp.Stats()["live"]; live != int64(made) {
		err = fmt.Errorf("%d memhs returned, %d live (%v)", made, live, err)
	}
	exp.Close()
	imp.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.steps, err
}

// TestFaultInjection fails each acquisition step in turn, 1000 times in
// all: every call fails cleanly with the injected error, and fds,
// mappings, memfds, handles and goroutines stay flat (checklist item 5).
func TestFaultInjection(t *testing.T) {
	steps, err := runFaultScenario(-1)
	require.NoError(t, err)
	for _, want := range []string{"alloc.memfd", "alloc.mmap", "secret", "register", "server.listen",
		"server.start", "import.connect", "import.peercred", "import.request", "serve.lend",
		"import.recv", "import.mmap"} {
		assert.Contains(t, steps, want)
	}
	t.Logf("%d steps: %v", len(steps), steps)

	fds, regions, memfds, gs := openFDs(), shm.LiveRegions(), shm.LiveFDs(), runtime.NumGoroutine()
	const calls = 1000
	for i := 0; i < calls; i++ {
		n := i % len(steps)
		seen, err := runFaultScenario(n)
		require.Error(t, err, "step %d (%s)", n, steps[n])
		require.Equal(t, steps[:n+1], seen, "the scenario stops at the failed step")
		if steps[n] == "serve.lend" {
			// The exporter's failure reaches the importer as its error text.
			require.Contains(t, err.Error(), errInjected.Error())
		} else {
			require.ErrorIs(t, err, errInjected)
			require.Contains(t, err.Error(), steps[n])
		}
		require.Equal(t, regions, shm.LiveRegions(), "step %s", steps[n])
		require.Equal(t, memfds, shm.LiveFDs(), "step %s", steps[n])
	}
	assert.Equal(t, fds, openFDs())
	// Polled by hand: assert.Eventually runs its condition on a goroutine.
	for end := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > gs && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > gs {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines %d -> %d:\n%s", gs, n, buf[:runtime.Stack(buf, true)])
	}
}
