package gobackend

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// Callers cannot use the handshake's tag.
func TestP2PSetupTagIsReserved(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 4)
	for _, op := range []*Op{
		{Kind: ops.Send, Peer: 1, Count: 4, In: addr(buf), Tag: p2pSetupTag},
		{Kind: ops.Recv, Peer: 1, Count: 4, Out: addr(buf), Tag: p2pSetupTag},
	} {
		_, err := eps[0].Post(op)
		require.Equal(t, status.InvalidArg, status.CodeOf(err), "%v", err)
		require.ErrorContains(t, err, "reserved")
		require.Equal(t, status.InvalidArg, status.CodeOf(eps[0].Run(op)))
		_, err = eps[0].PostCUDA(op, 0, 0, false)
		require.Equal(t, status.InvalidArg, status.CodeOf(err), "%v", err)
	}
}

// Without CUDA both sides of a pair fail their CUDA send/recv with
// NotSupported (each takes the other through the handshake as a refusal),
// at once the next time, and the pair's host messages go on.
func TestCUDAP2PWithoutCUDA(t *testing.T) {
	if cudaDevices() > 0 {
		t.Skip("CUDA is available here; this test covers machines without it")
	}
	eps := group(t, 2, 10*time.Second)
	a, b := []float32{1, 2, 3}, poisoned(3)
	mk := func(r int) *Op {
		if r == 0 {
			return &Op{Kind: ops.Send, DType: dtype.Float32, Peer: 1, Count: 3, In: addr(a)}
		}
		return &Op{Kind: ops.Recv, DType: dtype.Float32, Peer: 0, Count: 3, Out: addr(b)}
	}
	dev := func(int) int { return 0 }
	str := func(int) uintptr { return 0 }
	for try := 0; try < 2; try++ {
		start := time.Now()
		for r, err := range postCUDAAll(eps, dev, str, mk) {
			require.Equal(t, status.NotSupported, status.CodeOf(err), "rank %d: %v", r, err)
			require.ErrorContains(t, err, []string{"send to rank 1", "recv from rank 0"}[r]+" on cuda:0: setting up the CUDA p2p channel")
		}
		require.Less(t, time.Since(start), 5*time.Second)
	}
	require.Equal(t, []float32{1, 2, 3}, a)
	require.Equal(t, poisoned(3), b)
	require.Equal(t, []error{nil, nil}, postAll(t, eps, mk))
	require.Equal(t, a, b)
	st := eps[0].StatsMap()
	require.EqualValues(t, 0, st["gpu_p2p_channels"])
	require.EqualValues(t, -1, st["gpu_device"])
}

// A peer whose engine never takes part (its listener is gone, as in a
// hung process; a live peer's answers even while its caller is busy): the
// handshake gives up at the group's timeout, naming the peer, and the
// group is unusable afterwards (the pair is out of step), as after any p2p
// message that timed out.
func TestCUDAP2PHandshakeTimeoutNamesThePeer(t *testing.T) {
	eps := group(t, 2, 300*time.Millisecond)
	eps[1].team.Abort() // its listener stops
	buf := make([]float32, 4)
	_, err := eps[0].PostCUDA(&Op{Kind: ops.Send, DType: dtype.Float32, Peer: 1, Count: 4, In: addr(buf)}, 0, 0, false)
	require.Equal(t, status.Timeout, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "setting up the CUDA p2p channel")
	require.ErrorContains(t, err, "rank 1")
	_, err = eps[0].Post(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 4, In: addr(buf), Out: addr(buf)})
	require.ErrorContains(t, err, "broken")
}

// The first CUDA send/recv of a pair cannot be captured into a CUDA graph
// (it sets the channel up): refused locally, before any handshake.
func TestCUDAP2PFirstOpRefusedUnderCapture(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 4)
	start := time.Now()
	_, err := eps[0].PostCUDA(&Op{Kind: ops.Recv, DType: dtype.Float32, Peer: 1, Count: 4, Out: addr(buf)}, 0, 0, true)
	require.Equal(t, status.InvalidArg, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "run one before capturing")
	require.Less(t, time.Since(start), time.Second)
	requireHostAllReduce(t, eps)
}

// requireHostAllReduce: the pair still runs a host all_reduce.
func requireHostAllReduce(t *testing.T, eps []*Endpoint) {
	bufs := [][]float32{{1}, {2}}
	require.Equal(t, []error{nil, nil}, postAll(t, eps, func(r int) *Op {
		return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 1, In: addr(bufs[r]), Out: addr(bufs[r])}
	}))
	require.Equal(t, [][]float32{{3}, {3}}, bufs)
}

// A rank that has run no CUDA op on the group answers a peer's request
// from its engine: it waits half the group's timeout for its device, then
// refuses, so the asker fails with NotSupported in time (not a timeout),
// the group goes on, and the refusing rank's own later op with that peer
// fails the same way, naming itself.
func TestCUDAP2PPeerWithoutDeviceRefuses(t *testing.T) {
	withProcessDevice(t, -1) // the ranks share this process: no fallback
	eps := group(t, 2, 600*time.Millisecond)
	buf := make([]float32, 4)
	start := time.Now()
	_, err := eps[0].PostCUDA(&Op{Kind: ops.Send, DType: dtype.Float32, Peer: 1, Count: 4, In: addr(buf)}, 0, 0, false)
	require.Equal(t, status.NotSupported, status.CodeOf(err), "%v", err)
	require.Greater(t, time.Since(start), 300*time.Millisecond, "rank 1 waited for a device")
	require.Less(t, time.Since(start), 600*time.Millisecond)
	require.EqualValues(t, 1, eps[1].StatsMap()["gpu_p2p_answered"])
	// Rank 1's own op meets its responder's channel (made before it refused
	// rank 0) and waits for the responder to finish.
	_, err = eps[1].PostCUDA(&Op{Kind: ops.Recv, DType: dtype.Float32, Peer: 0, Count: 4, Out: addr(buf)}, 0, 0, false)
	require.Equal(t, status.NotSupported, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "recv from rank 0 on cuda:0")
	require.ErrorContains(t, err, "rank 0 asked for")
	requireHostAllReduce(t, eps)
}

// Destroying a rank whose responder is still waiting for its device ends
// the responder at once: Destroy does not wait out the timeout, and the
// asker fails rather than hangs.
func TestCUDAP2PDestroyStopsTheResponder(t *testing.T) {
	withProcessDevice(t, -1)
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 4)
	asked := make(chan error, 1)
	go func() {
		_, err := eps[0].PostCUDA(&Op{Kind: ops.Send, DType: dtype.Float32, Peer: 1, Count: 4, In: addr(buf)}, 0, 0, false)
		asked <- err
	}()
	require.Eventually(t, func() bool { return eps[1].StatsMap()["gpu_p2p_answered"] == int64(1) }, 5*time.Second, time.Millisecond)
	start := time.Now()
	require.NoError(t, eps[1].Destroy())
	require.Less(t, time.Since(start), 2*time.Second)
	select {
	case err := <-asked:
		require.Error(t, err)
	case <-time.After(8 * time.Second):
		t.Fatal("the asker still waits after its peer was destroyed")
	}
}

// withProcessDevice sets what this process's CUDA ops ran on (ordinal +
// 1, 0 none, -1 several) for the test, as PostCUDA records it. Simulated
// ranks share one process, so tests in which a responder must not take a
// peer's device set -1.
func withProcessDevice(t testing.TB, v int32) {
	saved := gpu.SetProcessDevice(v)
	t.Cleanup(func() { gpu.SetProcessDevice(saved) })
}

// A new group whose rank ran CUDA ops on one device elsewhere in its
// process answers on that device at once: the asker does not wait half
// the timeout for it (gpu's TestNoteProcessDevice: several devices in the
// process are no answer).
func TestCUDAP2PResponderTakesTheProcessDevice(t *testing.T) {
	withProcessDevice(t, 1) // cuda:0, as PostCUDA records it
	eps := group(t, 2, 4*time.Second)
	buf := make([]float32, 4)
	start := time.Now()
	_, err := eps[0].PostCUDA(&Op{Kind: ops.Send, DType: dtype.Float32, Peer: 1, Count: 4, In: addr(buf)}, 0, 0, false)
	if cudaDevices() == 0 {
		require.Equal(t, status.NotSupported, status.CodeOf(err), "%v", err)
	}
	require.Less(t, time.Since(start), time.Second, "%v", err)
	require.EqualValues(t, 1, eps[1].StatsMap()["gpu_p2p_answered"])
}
