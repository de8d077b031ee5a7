package gpu

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// testGroup is rank 0 of a group of 2 that no peer ever answers: the ops
// below stop before they would talk to one.
var testGroup = Group{Name: "test2", Rank: 0, World: 2, Timeout: 7 * time.Second}

// withDeviceWords gives rank 0 a CUDA team whose host error block is words
// (ordinary memory: the test writes what a kernel would). Nothing reaches
// a driver: every op below stops at the check.
func withDeviceWords(t *testing.T, words *[cuda.HostErrorWords]uint32) *State {
	g := &State{}
	team := &Team{g: &Device{ordinal: 0}, rank: 0, world: 2, errw: cuda.ErrorWordsAt(words)}
	g.team = team
	g.mu.Lock()
	g.live = team
	g.mu.Unlock()
	g.device.Store(1)
	t.Cleanup(func() { g.Close(time.Second) })
	return g
}

// barrier runs a CUDA barrier on g as the queue would.
func barrier(g *State) error {
	return g.Run(testGroup, &ops.Op{Kind: ops.Barrier}, Args{Device: 0}, time.Now().Add(time.Second))
}

// stats is g's counters.
func stats(g *State) map[string]any {
	m := map[string]any{}
	g.Stats(m)
	return m
}

// A kernel's timeout, written into the host block, fails the next CUDA op
// with an error naming the ranks that did not arrive, and every CUDA op
// after it; stats and DeviceError show it.
func TestCUDADeviceErrorFailsLaterOps(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	g := withDeviceWords(t, &words)
	require.NoError(t, g.DeviceError(testGroup))
	require.EqualValues(t, 0, stats(g)["gpu_device_error"])

	// What gs_record_error does: mask and detail first, the code last.
	atomic.StoreUint32(&words[cuda.HostErrorMissing], 0b10)
	atomic.StoreUint32(&words[cuda.HostErrorDetail], 3<<8|1)
	atomic.StoreUint32(&words[cuda.HostErrorCode], cuda.ErrTimeout)

	want := `gosym: a CUDA collective of group "test2" on cuda:0: Timed out after 7s waiting for ranks [1] (kernel barrier, block 3)`
	for try := 0; try < 2; try++ {
		err := barrier(g)
		require.Error(t, err, "try %d", try)
		require.Equal(t, status.Timeout, status.CodeOf(err), "%v", err)
		require.ErrorContains(t, err, want)
	}
	err := g.DeviceError(testGroup)
	require.Equal(t, status.Timeout, status.CodeOf(err))
	require.ErrorContains(t, err, want)
	require.EqualValues(t, cuda.ErrTimeout, stats(g)["gpu_device_error"])
	require.EqualValues(t, 0, stats(g)["gpu_ops"], "no op was enqueued")
}

// A configuration error (a bug, not a peer) is an internal error.
func TestCUDADeviceConfigErrorIsInternal(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	g := withDeviceWords(t, &words)
	atomic.StoreUint32(&words[cuda.HostErrorDetail], 129<<16|32)
	atomic.StoreUint32(&words[cuda.HostErrorCode], cuda.ErrConfig)
	err := barrier(g)
	require.Equal(t, status.Internal, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "launch configuration or parameters out of range, detail 0x810020")
}

// A piece gs_a2av found of another size than expected fails the next op
// as a mismatch naming the sender.
func TestCUDADeviceMismatchNamesTheSender(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	g := withDeviceWords(t, &words)
	atomic.StoreUint32(&words[cuda.HostErrorMissing], 0b10)
	atomic.StoreUint32(&words[cuda.HostErrorDetail], cuda.A2AVDetail|cuda.A2AVMismatch<<16|1)
	atomic.StoreUint32(&words[cuda.HostErrorCode], cuda.ErrMismatch)
	err := barrier(g)
	require.Equal(t, status.Mismatch, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, `group "test2" on cuda:0 found the ranks' arguments disagree (all_to_all: rank 1 sent this rank a piece`)
}

// After Close the block is gone: DeviceError and stats read nothing.
func TestCUDADeviceErrorAfterDestroy(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	g := withDeviceWords(t, &words)
	words[cuda.HostErrorCode] = cuda.ErrTimeout
	g.Close(time.Second)
	require.NoError(t, g.DeviceError(testGroup))
	require.EqualValues(t, 0, stats(g)["gpu_device_error"])
}
