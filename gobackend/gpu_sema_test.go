package gobackend

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

func TestGPUAlgoStats(t *testing.T) {
	var s gpuAlgoStats
	op := &Op{Kind: coll.AllReduce, DType: dtype.Float32, Count: 3}
	for _, a := range []gpuAlgo{gpuAlgoOneShot, gpuAlgoSema, gpuAlgoSema, gpuAlgoNVLS, gpuAlgoSema, gpuAlgoLL} {
		s.Add(a, 0, op)
	}
	m := map[string]any{}
	s.stats(m)
	require.Equal(t, map[string]any{"gpu_algo_oneshot": int64(1), "gpu_algo_twoshot": int64(0),
		"gpu_algo_sema_unicast": int64(3), "gpu_algo_nvls": int64(1), "gpu_algo_ll": int64(1)}, m)
}

func TestReduceScale(t *testing.T) {
	require.Equal(t, float64(4), reduceScale(&Op{RedOp: dtype.Avg}, 4))
	require.Equal(t, float64(0.5), reduceScale(&Op{RedOp: dtype.PremulSum, Scale: 0.5}, 4))
	require.Equal(t, float64(1), reduceScale(&Op{RedOp: dtype.Max, Scale: 0.5}, 4))
}

// nvlsPeersAll runs f on every rank's nvlsPeers at once.
func nvlsPeersAll(eps []*Endpoint, f func(r int, p *nvlsPeers)) {
	var wg sync.WaitGroup
	for r, e := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(r, &nvlsPeers{e: e, who: symm.Who{Op: "test", Seq: 1}, deadline: time.Now().Add(5 * time.Second)})
		}()
	}
	wg.Wait()
}

// The multicast setup's collectives over real links and the host barrier:
// the root's fd reaches every other rank (the same open file), a root
// without one shares nothing, and every rank learns who failed a step.
func TestNVLSPeers(t *testing.T) {
	eps := group(t, 3, 10*time.Second)
	var pipe [2]int
	require.NoError(t, unix.Pipe2(pipe[:], unix.O_CLOEXEC))
	defer unix.Close(pipe[0])
	got := make([]int, 3)
	errs := make([]error, 3)
	nvlsPeersAll(eps, func(r int, p *nvlsPeers) {
		fd := -1
		if r == 1 {
			fd = pipe[1]
		}
		got[r], errs[r] = p.ShareFD(1, fd)
	})
	unix.Close(pipe[1])
	require.Equal(t, []error{nil, nil, nil}, errs)
	require.Equal(t, -1, got[1])
	for _, r := range []int{0, 2} {
		require.GreaterOrEqual(t, got[r], 0)
		_, err := unix.Write(got[r], []byte{byte('a' + r)})
		require.NoError(t, err)
		unix.Close(got[r])
	}
	buf := make([]byte, 4)
	n, err := unix.Read(pipe[0], buf)
	require.NoError(t, err)
	require.ElementsMatch(t, []byte("ac"), buf[:n])

	nvlsPeersAll(eps, func(r int, p *nvlsPeers) { got[r], errs[r] = p.ShareFD(0, -1) })
	require.Equal(t, []int{-1, -1, -1}, got)
	require.Equal(t, []error{nil, nil, nil}, errs)

	failed := make([][]int, 3)
	for _, bad := range [][]int{nil, {2}, {0, 2}} {
		nvlsPeersAll(eps, func(r int, p *nvlsPeers) {
			ok := true
			for _, b := range bad {
				ok = ok && b != r
			}
			failed[r], errs[r] = p.Agree(fmt.Sprintf("step %v", bad), ok)
		})
		require.Equal(t, []error{nil, nil, nil}, errs)
		require.Equal(t, [][]int{bad, bad, bad}, failed)
	}
}
