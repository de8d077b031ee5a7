package gpu

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// A mismatch a recv kernel recorded (written here as gs_p2p_error writes
// it: the words, then the code) fails every later CUDA send/recv of the
// pair with an error that gives the message's size and tag; DeviceError
// and stats show it. A timeout is a Timeout. Nothing reaches a driver.
func TestP2PDeviceErrorFailsLaterOps(t *testing.T) {
	p := &P2P{grp: Group{Name: "g", Rank: 0, World: 2, Timeout: 5 * time.Second}, plane: &State{}}
	var words [cuda.HostErrorWords]uint32
	done := make(chan struct{})
	close(done)
	p.peers = []*p2pPeer{nil, {done: done, ch: cuda.P2PChannelAt(cuda.ErrorWordsAt(&words))}}
	buf := make([]float32, 999)
	recv := &ops.Op{Kind: ops.Recv, DType: dtype.Float32, Peer: 1, Count: 999, Out: uintptr(unsafe.Pointer(&buf[0]))}
	stats := func() map[string]any {
		m := map[string]any{}
		p.Stats(m)
		return m
	}
	require.NoError(t, p.DeviceError())
	require.NotContains(t, stats(), "gpu_p2p_error")

	atomic.StoreUint32(&words[2], 4000)
	atomic.StoreUint32(&words[4], 7)
	atomic.StoreUint32(&words[1], 5<<8)
	atomic.StoreUint32(&words[0], cuda.ErrMismatch)
	want := "a mismatch: rank 1 sent 4000 bytes with tag 7"
	for try := 0; try < 2; try++ {
		err := p.Run(recv, 0, 0, false)
		require.Equal(t, status.InvalidArg, status.CodeOf(err), "%v", err)
		require.ErrorContains(t, err, want)
		require.ErrorContains(t, err, "between ranks 0 and 1")
	}
	require.ErrorContains(t, p.DeviceError(), want)
	require.Contains(t, stats()["gpu_p2p_error"], want)

	atomic.StoreUint32(&words[1], 3<<8|1)
	atomic.StoreUint32(&words[0], cuda.ErrTimeout)
	err := p.Run(recv, 0, 0, false)
	require.Equal(t, status.Timeout, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "block 3 waited for data (its sender did not send) from rank 1")
}

// The process's device is the one its CUDA ops ran on while they all ran
// on one; several devices in the process are no answer, for good.
func TestNoteProcessDevice(t *testing.T) {
	saved := SetProcessDevice(0)
	t.Cleanup(func() { SetProcessDevice(saved) })
	NoteProcessDevice(0)
	NoteProcessDevice(0)
	require.EqualValues(t, 1, processDevice.Load())
	NoteProcessDevice(1)
	require.EqualValues(t, -1, processDevice.Load())
	NoteProcessDevice(0)
	require.EqualValues(t, -1, processDevice.Load())
}
