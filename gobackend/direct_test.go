package gobackend

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/shm"
)

// shared returns n float32s of shareable memory (gosym.empty's memory).
func shared(t *testing.T, n int) []float32 {
	m, err := MemAlloc(max(4, 4*n))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, MemUnmap(m)) })
	b := m.Bytes()
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// TestCollectivesZeroCopy runs every collective with inputs in shareable
// memory, so peers read them in place, and checks results, that the first
// op binds each region once and that later ops reuse the bindings.
func TestCollectivesZeroCopy(t *testing.T) {
	for _, world := range []int{2, 3} {
		eps := group(t, world, 20*time.Second)
		for _, ep := range eps {
			ep.exec.DirectMin = 1 // read every shareable input in place
		}
		for _, c := range opCases {
			for _, n := range []int{1, 1025, 1<<21 + 5} {
				t.Run(fmt.Sprintf("%s/w%d/n%d", c.kind, world, n), func(t *testing.T) {
					in := make([][]float32, world)
					for r := range in {
						in[r] = shared(t, world*n+1)
						for i := range in[r] {
							in[r][i] = rand.Float32()
						}
					}
					for rep := 0; rep < 2; rep++ {
						before := eps[0].bind.Stats()
						runCase(t, eps, c, n, in)
						after := eps[0].bind.Stats()
						if c.kind != ops.Broadcast && c.kind != ops.Scatter && n > 1 { // rank 0 contributes data
							created := after["bindings_created"] - before["bindings_created"]
							if rep == 0 {
								require.Equal(t, int64(1), created, "first op binds rank 0's input")
							} else {
								require.Equal(t, int64(0), created, "second op reuses the binding")
								require.Equal(t, int64(0), after["peer_map_misses"]-before["peer_map_misses"], "no new peer mappings")
							}
						}
					}
				})
			}
		}
	}
}

// TestAllReduceZeroCopyInPlace checks the two-shot in-place path.
func TestAllReduceZeroCopyInPlace(t *testing.T) {
	eps := group(t, 3, 20*time.Second)
	for _, ep := range eps {
		ep.exec.DirectMin = 1
	}
	for _, n := range []int{1, 2, 3, 1025, 1<<21 + 5} {
		bufs := make([][]float32, 3)
		for r := range bufs {
			bufs[r] = shared(t, n)
			for i := range bufs[r] {
				bufs[r][i] = rand.Float32()
			}
		}
		want := sumAt(bufs, 0, n)
		errs := postAll(t, eps, func(r int) *Op {
			return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: n, In: addr(bufs[r]), Out: addr(bufs[r])}
		})
		for r := range eps {
			require.NoError(t, errs[r])
			require.Equal(t, want, bufs[r], "n %d rank %d", n, r)
		}
	}
}

// TestUnmapRetiresPeerMappings checks that unmapping a bound region drops
// the peers' mappings at the next op, and that destroy releases bindings.
func TestUnmapRetiresPeerMappings(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	for _, ep := range eps {
		ep.exec.DirectMin = 1
	}
	m, err := MemAlloc(4096)
	require.NoError(t, err)
	b := m.Bytes()
	buf := unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), 16)
	other := shared(t, 16)
	bufs := [][]float32{buf, other}
	run := func() {
		errs := postAll(t, eps, func(r int) *Op {
			return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 16, In: addr(bufs[r]), Out: addr(bufs[r])}
		})
		for _, err := range errs {
			require.NoError(t, err)
		}
	}
	run()
	require.Equal(t, int64(1), eps[1].bind.Stats()["peer_maps"])
	require.Equal(t, 1, m.Bindings())
	require.NoError(t, MemUnmap(m))
	bufs[0] = make([]float32, 16) // private now: staged
	run()
	require.Equal(t, int64(0), eps[1].bind.Stats()["peer_maps"], "rank 1 dropped rank 0's retired region")
	require.Equal(t, int64(1), eps[1].bind.Stats()["peer_map_dropped"])
}

// TestBindFaultsFallBackAndLeakNothing fails a binding step on one rank,
// op after op: every op still gives the right answer (the ranks agree to
// stage), nothing is bound, and fds and mappings stay flat.
func TestBindFaultsFallBackAndLeakNothing(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	for _, ep := range eps {
		ep.exec.DirectMin = 1
	}
	bufs := [][]float32{shared(t, 64), shared(t, 64)}
	steps := []string{"share", "map"}
	i := 0
	memreg.BindFault = func(step string, rank int) error {
		if step == steps[i%len(steps)] && rank == i%2 {
			return fmt.Errorf("injected %s failure on rank %d", step, rank)
		}
		return nil
	}
	defer func() { memreg.BindFault = nil }()
	fds, regions := openFDs(), shm.LiveRegions()
	for i = 0; i < 1000; i++ {
		for r := range bufs {
			for j := range bufs[r] {
				bufs[r][j] = float32(r + j)
			}
		}
		errs := postAll(t, eps, func(r int) *Op {
			return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 64, In: addr(bufs[r]), Out: addr(bufs[r])}
		})
		for r := range eps {
			require.NoError(t, errs[r])
			require.Equal(t, float32(1+2*5), bufs[r][5])
		}
		require.Equal(t, fds, openFDs(), "fds flat at op %d", i)
		require.Equal(t, regions, shm.LiveRegions()-eps[0].bind.Stats()["peer_maps"]-eps[1].bind.Stats()["peer_maps"], "mappings flat at op %d", i)
	}
	require.Equal(t, int64(0), eps[0].bind.Stats()["bindings_created"])
	memreg.BindFault = nil
	errs := postAll(t, eps, func(r int) *Op {
		return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 64, In: addr(bufs[r]), Out: addr(bufs[r])}
	})
	require.NoError(t, errs[0])
	require.Equal(t, int64(1), eps[0].bind.Stats()["bindings_created"], "binds once the faults stop")
}
