package main

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/cuda/cudatest"
)

// TestAgainstFakeDriver runs the whole check, in -quick mode, against
// cudatest's fake libcuda (its testdata/fakecuda.cpp): a stand-in with
// four host-memory "GPUs" whose launches run the real kernel sources
// compiled for the host. It proves the check program and the Go/C launch
// path (parameter blobs, contexts, streams, VMM, memops, cuGetProcAddress)
// before the one run on real hardware. Needs g++ and NVRTC (the kernels
// are still compiled, to check the cache and the CUBIN the fake inspects).
func TestAgainstFakeDriver(t *testing.T) {
	if _, err := cuda.LoadNVRTC(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	t.Setenv("GOSYM_LIBCUDA", cudatest.FakeLibrary(t))
	t.Setenv("GOSYM_KERNEL_CACHE", t.TempDir())
	for _, kv := range safeEnv {
		t.Setenv(kv[0], kv[1])
	}
	t.Setenv("GOSYM_NVLS", "1") // the safety variables must win over an opt-in
	// every case's launches are programmatic dependents: the fake refuses plain ones
	t.Setenv("GOSYM_GPU_PDL", "1")
	t.Setenv("FAKECUDA_LAUNCHES", "dependent")
	code := run(true)
	for _, c := range rep.Cases {
		if !c.Pass {
			t.Errorf("%s: %s", c.Name, c.Detail)
		}
	}
	require.Equal(t, 0, code, rep.Error)
	require.Contains(t, rep.MulticastGate, "allowed=false")
	require.True(t, rep.DependentLaunch)
	require.Greater(t, len(rep.Cases), 60)
}

func TestRefusesUnsafeEnvironment(t *testing.T) {
	for _, kv := range safeEnv {
		t.Run(kv[0], func(t *testing.T) {
			for _, o := range safeEnv {
				t.Setenv(o[0], o[1])
			}
			os.Unsetenv(kv[0])
			require.Equal(t, 2, run(true))
			t.Setenv(kv[0], "")
			require.Equal(t, 2, run(true))
		})
	}
}

// TestStuckCaseIsNamed: with -case-timeout, a case that never returns ends
// the run with status 3 and a report naming it; a case done in time does
// not.
func TestStuckCaseIsNamed(t *testing.T) {
	mu.Lock()
	savedCases, savedErr := rep.Cases, rep.Error
	mu.Unlock()
	savedGiveUp, savedTimeout := giveUp, caseTimeout
	t.Cleanup(func() {
		mu.Lock()
		rep.Cases, rep.Error = savedCases, savedErr
		mu.Unlock()
		giveUp, caseTimeout = savedGiveUp, savedTimeout
	})
	release, gave := make(chan struct{}), make(chan int, 2)
	giveUp = func(code int) {
		gave <- code
		close(release)
	}
	caseTimeout = 50 * time.Millisecond

	record("a case done in time", func() error { return nil })
	time.Sleep(2 * caseTimeout)
	require.Empty(t, gave, "a case done in time must not end the run")

	done := make(chan struct{})
	go func() {
		defer close(done)
		record("a case that waits forever", func() error { <-release; return nil })
	}()
	select {
	case code := <-gave:
		require.Equal(t, 3, code)
	case <-time.After(10 * time.Second):
		t.Fatal("a stuck case did not end the run") // (its goroutine stays blocked)
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, rep.Error, "a case that waits forever: not done after 50ms")
	stuck := rep.Cases[len(savedCases)+1]
	require.Equal(t, "a case that waits forever", stuck.Name)
	require.False(t, stuck.Pass)
	require.Contains(t, stuck.Detail, "never returned")
}
