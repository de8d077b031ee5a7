package gobackend

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/cuda/cudatest"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// simRank is one simulated rank's device and streams on the fake driver.
type simRank struct {
	g       *gpu.Device
	streams []cuda.Stream
}

func newSimRanks(t *testing.T, world, streams int) []*simRank {
	ranks := make([]*simRank, world)
	for r := range ranks {
		g, err := gpu.Open(r)
		require.NoError(t, err)
		// Compiled and loaded before the group's setup, whose exchanges
		// run by the group's deadline (NVRTC may take long on a busy host).
		for _, src := range []string{"allreduce.cu", cuda.BarrierKernel.Source} {
			_, err := g.Module(src)
			require.NoError(t, err, src)
		}
		fr := &simRank{g: g}
		for range streams {
			s, err := g.Driver().StreamCreate(g.Context(), cuda.StreamNonBlocking)
			require.NoError(t, err)
			fr.streams = append(fr.streams, s)
		}
		ranks[r] = fr
		t.Cleanup(func() {
			for _, s := range fr.streams {
				g.Driver().StreamDestroy(g.Context(), s)
			}
		})
	}
	return ranks
}

// simWorld is the fake driver's device count (at least 2): one simulated
// rank per device.
func simWorld(t *testing.T) int {
	d, err := cuda.Load()
	require.NoError(t, err)
	world, err := d.DeviceCount()
	require.NoError(t, err)
	require.GreaterOrEqual(t, world, 2)
	return world
}

// drain waits for every stream of every rank, failing the test (and ending
// its process) with the ranks still busy after d.
func drain(t *testing.T, ranks []*simRank, d time.Duration) {
	var busy sync.Map
	var wg sync.WaitGroup
	for r, fr := range ranks {
		for i, s := range fr.streams {
			busy.Store(fmt.Sprintf("rank %d stream %d", r, i), true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				require.NoError(t, fr.g.Driver().StreamSynchronize(fr.g.Context(), s))
				busy.Delete(fmt.Sprintf("rank %d stream %d", r, i))
			}()
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		var left []string
		busy.Range(func(k, _ any) bool { left = append(left, k.(string)); return true })
		// The streams cannot be destroyed while their kernels spin: end the
		// child process (cudatest.InFakeChild's parent reports its output).
		t.Errorf("streams still busy after %v: %v", d, left)
		os.Exit(1)
	}
}

// TestGPUOrderAcrossStreams is FSDP2's pattern: every rank issues an
// all_gather on its stream 0 and then a reduce_scatter on its stream 1, and
// one rank's stream 0 is held back, so that rank's GPU would reach the
// reduce_scatter first. The group's ops must still run in issue order on
// every device (internal/gpu/order.go): without the join, the ranks' kernels wait for
// each other's lines of different ops until the group's timeout. Each round
// holds back another rank.
//
// Sizes stay on the LL path, and small: the fake driver runs a block's
// threads one after another, so an LL launch costs a round of the host's
// scheduler per thread that waits for the peers (a 40K-element round took
// minutes on a loaded host: CI runs packages side by side), and the staged
// kernels' barriers do not order the threads that run after thread 0 there.
func TestGPUOrderAcrossStreams(t *testing.T) {
	if cudatest.InFakeChild(t) {
		return
	}
	world := simWorld(t)
	eps := group(t, world, 20*time.Second)
	ranks := newSimRanks(t, world, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	for round, n := range []int{64, 16, 256, 8} {
		held := round % world
		gate := make([]uint32, 1)                             // the held rank's stream 0 waits for it to be 1
		t.Cleanup(func() { atomic.StoreUint32(&gate[0], 1) }) // before the streams go, on failure too
		in := make([][]float32, world)
		for r := range in {
			in[r] = make([]float32, world*n)
			for i := range in[r] {
				in[r][i] = float32(rng.IntN(100))
			}
		}
		agOut, rsOut := make([][]float32, world), make([][]float32, world)
		var posted atomic.Int32
		errs := make([]error, world)
		var wg sync.WaitGroup
		for r, ep := range eps {
			agOut[r], rsOut[r] = poisoned(world*n), poisoned(n)
			fr := ranks[r]
			if r == held {
				require.NoError(t, fr.g.Driver().StreamWaitValue32(fr.g.Context(), fr.streams[0], uintptr(unsafe.Pointer(&gate[0])), 1, cuda.WaitGEQ))
			}
			ag := &Op{Kind: ops.AllGather, Count: n, In: addr(in[r][r*n:]), Out: addr(agOut[r])}
			rs := &Op{Kind: ops.ReduceScatter, Count: n, In: addr(in[r]), Out: addr(rsOut[r])}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, errs[r] = ep.PostCUDA(ag, r, uintptr(fr.streams[0]), false); errs[r] == nil {
					_, errs[r] = ep.PostCUDA(rs, r, uintptr(fr.streams[1]), false)
				}
				posted.Add(1)
			}()
		}
		wg.Wait()
		require.Equal(t, make([]error, world), errs, "round %d", round)
		time.Sleep(50 * time.Millisecond) // let the other ranks' kernels start
		atomic.StoreUint32(&gate[0], 1)
		drain(t, ranks, 15*time.Second)
		for r := range eps {
			for s := range world {
				require.Equal(t, in[s][s*n:(s+1)*n], agOut[r][s*n:(s+1)*n], "round %d: rank %d's all_gather, rank %d's piece", round, r, s)
			}
			require.Equal(t, sumAt(in, r*n, n), rsOut[r], "round %d: rank %d's reduce_scatter", round, r)
		}
		for r, ep := range eps {
			require.NoError(t, ep.gpu.Err(), "rank %d", r)
			// Every op but the first changed streams.
			require.EqualValues(t, 2*round+1, ep.StatsMap()["gpu_stream_joins"], "rank %d", r)
		}
	}
}
