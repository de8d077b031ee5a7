package gobackend

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// withDeviceWords gives rank 0 of a group a CUDA team whose host error
// block is words (ordinary memory: the test writes what a kernel would).
// Nothing reaches a driver: every op below stops at the check.
func withDeviceWords(t *testing.T, words *[cuda.HostErrorWords]uint32) *Endpoint {
	eps := group(t, 2, 7*time.Second)
	ep := eps[0]
	team := &gpuTeam{g: &gpuDevice{ordinal: 0}, rank: 0, world: 2, errw: cuda.ErrorWordsAt(words)}
	ep.gpu.team = team
	ep.gpu.mu.Lock()
	ep.gpu.errw = team.errw
	ep.gpu.mu.Unlock()
	ep.gpu.device.Store(1)
	return ep
}

// A kernel's timeout, written into the host block, fails the next CUDA op
// with an error naming the ranks that did not arrive, and every CUDA op
// after it; stats and DeviceError show it.
func TestCUDADeviceErrorFailsLaterOps(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	ep := withDeviceWords(t, &words)
	require.NoError(t, ep.DeviceError())
	require.EqualValues(t, 0, ep.StatsMap()["gpu_device_error"])

	// What gs_record_error does: mask and detail first, the code last.
	atomic.StoreUint32(&words[cuda.HostErrorMissing], 0b10)
	atomic.StoreUint32(&words[cuda.HostErrorDetail], 3<<8|1)
	atomic.StoreUint32(&words[cuda.HostErrorCode], cuda.ErrTimeout)

	want := `gosym: a CUDA collective of group "test2" on cuda:0: Timed out after 7s waiting for ranks [1] (kernel barrier, block 3)`
	for try := 0; try < 2; try++ {
		_, err := ep.PostCUDA(&Op{Kind: coll.Barrier}, 0, 0, false)
		require.Error(t, err, "try %d", try)
		require.Equal(t, status.Timeout, status.CodeOf(err), "%v", err)
		require.ErrorContains(t, err, want)
	}
	err := ep.DeviceError()
	require.Equal(t, status.Timeout, status.CodeOf(err))
	require.ErrorContains(t, err, want)
	require.EqualValues(t, cuda.ErrTimeout, ep.StatsMap()["gpu_device_error"])
	require.EqualValues(t, 0, ep.StatsMap()["gpu_ops"], "no op was enqueued")
}

// A configuration error (a bug, not a peer) is an internal error.
func TestCUDADeviceConfigErrorIsInternal(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	ep := withDeviceWords(t, &words)
	atomic.StoreUint32(&words[cuda.HostErrorDetail], 129<<16|32)
	atomic.StoreUint32(&words[cuda.HostErrorCode], cuda.ErrConfig)
	_, err := ep.PostCUDA(&Op{Kind: coll.Barrier}, 0, 0, false)
	require.Equal(t, status.Internal, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "launch configuration or parameters out of range, detail 0x810020")
}

// A piece gs_a2av found of another size than expected fails the next op
// as a mismatch naming the sender.
func TestCUDADeviceMismatchNamesTheSender(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	ep := withDeviceWords(t, &words)
	atomic.StoreUint32(&words[cuda.HostErrorMissing], 0b10)
	atomic.StoreUint32(&words[cuda.HostErrorDetail], cuda.A2AVDetail|cuda.A2AVMismatch<<16|1)
	atomic.StoreUint32(&words[cuda.HostErrorCode], cuda.ErrMismatch)
	_, err := ep.PostCUDA(&Op{Kind: coll.Barrier}, 0, 0, false)
	require.Equal(t, status.Mismatch, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, `group "test2" on cuda:0 found the ranks' arguments disagree (all_to_all: rank 1 sent this rank a piece`)
}

// After Destroy the block is gone: DeviceError and stats read nothing.
func TestCUDADeviceErrorAfterDestroy(t *testing.T) {
	var words [cuda.HostErrorWords]uint32
	ep := withDeviceWords(t, &words)
	words[cuda.HostErrorCode] = cuda.ErrTimeout
	require.NoError(t, ep.Destroy())
	require.NoError(t, ep.DeviceError())
	require.EqualValues(t, 0, ep.StatsMap()["gpu_device_error"])
}
