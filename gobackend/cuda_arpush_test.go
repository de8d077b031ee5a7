package gobackend

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// all_reduce on the direct path with GOSYM_GPU_AR_PUSH=1 runs gs_arpush on
// the fake driver's three devices: each rank's slices land in its peers'
// stagings (the smallest staging, so a few rounds), the results in every
// rank's buffer, one bit pattern on every rank, odd counts and an op at an
// odd element offset included; the counters say which kernel ran.
func TestCUDAAllReducePush(t *testing.T) {
	t.Setenv("GOSYM_GPU_AR_PUSH", "1")
	st := directAllReduces(t)
	if st == nil {
		return
	}
	require.EqualValues(t, 4, st["gpu_algo_arpush"], "%v", st)
	require.EqualValues(t, 0, st["gpu_algo_twoshot"], "%v", st)
}

// The direct path's host rounds on buffers of the caching-allocator kind
// (published per op by IPC handle): the first op on an allocation votes
// (two rounds), and every later op on it, at another offset too, skips the
// vote (one round), since every rank holds the mappings; the results stay
// exact (two-shot on the fake driver's three devices).
func TestCUDADirectVotesOncePerAllocation(t *testing.T) {
	st := directAllReduces(t)
	if st == nil {
		return
	}
	require.EqualValues(t, 4, st["gpu_algo_twoshot"], "%v", st)
	require.EqualValues(t, 4, st["gpu_direct_ops"], "%v", st)
	require.EqualValues(t, 3, st["gpu_vote_skips"], "%v", st)
	require.EqualValues(t, 0, st["gpu_deferred_ops"], "%v", st) // GOSYM_GPU_DEFER is off by default
	require.EqualValues(t, 2+3, st["gpu_agree_rounds"], "%v", st)
	require.Positive(t, st["gpu_setup_us"], "%v", st)
	require.LessOrEqual(t, st["gpu_agree_us"], st["gpu_host_us"], "%v", st)
}

// directAllReduces runs four all_reduces of float32 on the direct path over
// one buffer per rank (odd counts, one at an odd element offset) on the fake
// driver's three devices, checks every rank's result, and returns rank 0's
// counters (nil in the parent process: the test ran in a child).
func directAllReduces(t *testing.T) map[string]any {
	t.Setenv("GOSYM_GPU_DIRECT_MIN", "1")
	t.Setenv("GOSYM_GPU_LL_MAX", "0")
	t.Setenv("GOSYM_GPU_STAGE_BYTES", "65536")
	if inP2PFakeCUDA(t) {
		return nil
	}
	const world = 3
	devices := []int{0, 1, 2}
	ranks := p2pGroup(t, devices, 10*time.Second)
	eps := make([]*Endpoint, world)
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	val := func(r, i int) float32 { return float32((i*7+r*13)%61) - 30 }
	const most = 40000 + 1 // 3 rounds of the 64 KiB staging at float32, plus the offset
	bufs := make([]uintptr, world)
	for r, rk := range ranks {
		p, err := rk.g.Driver().MemAlloc(rk.g.Context(), 4*most)
		require.NoError(t, err)
		t.Cleanup(func() { rk.g.Driver().MemFree(rk.g.Context(), p) })
		bufs[r] = p
	}
	for _, c := range []struct{ count, off int }{{1, 0}, {4097, 0}, {40000, 0}, {33333, 1}} {
		for r, rk := range ranks {
			b := make([]byte, 4*c.count)
			for i := range c.count {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(val(r, i)))
			}
			require.NoError(t, rk.g.Driver().MemcpyHtoD(rk.g.Context(), bufs[r]+uintptr(4*c.off), b))
		}
		errs := postCUDAAll(eps, func(r int) int { return devices[r] },
			func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) },
			func(r int) *Op {
				a := bufs[r] + uintptr(4*c.off)
				return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: c.count, In: a, Out: a}
			})
		require.Equal(t, make([]error, world), errs, "count %d", c.count)
		// every rank's stream first: the fake driver runs gs_twoshot's threads one after
		// another, so a peer may still store into this rank's buffer after this rank's
		// kernel ended (on a GPU its closing barrier waits for every thread's stores)
		for _, rk := range ranks {
			rk.sync(t)
		}
		for r, rk := range ranks {
			b := make([]byte, 4*c.count)
			require.NoError(t, rk.g.Driver().MemcpyDtoH(rk.g.Context(), b, bufs[r]+uintptr(4*c.off)))
			for i := range c.count {
				want := val(0, i) + val(1, i) + val(2, i) // small integers: exact in any order
				got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
				if got != want {
					require.Equal(t, want, got, "count %d rank %d element %d", c.count, r, i)
				}
			}
		}
	}
	return eps[0].StatsMap()
}
