package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// fakeSema is rank rank of a group of world over the fake driver, with
// kernels "loaded" from a dummy module.
func fakeSema(t *testing.T, d *Driver, rank, world int, memop bool) *Sema {
	m, err := d.LoadModule(0, []byte{1})
	require.NoError(t, err)
	s := &Sema{D: d, Rank: rank, World: world, StageBytes: 4096, TimeoutNs: 1, MemopWait: memop,
		Function: m.Function}
	for r := 0; r < world; r++ {
		s.Pads[r], s.Stages[r] = uintptr(0x1000*(r+1)), uintptr(0x100000*(r+1))
	}
	return s
}

// The driver calls of one op, by role and kind of wait: one staging copy
// per round, the semaphore writes (and memop waits) batched, gs_sema_wait
// only where something is awaited, the reduce only where a result is due.
func TestSemaEnqueuesTheProtocol(t *testing.T) {
	for _, c := range []struct {
		root, rank        int
		memop             bool
		batches, launches int64 // per round
	}{
		{-1, 0, false, 2, 3}, // write ready, wait, pull, write done, wait
		{-1, 1, true, 2, 1},  // [write ready, wait, consume], pull, [write done, wait, consume]
		{1, 1, false, 1, 2},  // root: wait readies, pull, [write done]
		{1, 1, true, 2, 1},   // root: [wait, consume], pull, [write done]
		{1, 0, false, 1, 1},  // non-root: [write ready], wait done
		{1, 0, true, 1, 0},   // non-root: [write ready, wait done, consume]
	} {
		t.Run(fmt.Sprintf("root=%d rank=%d memop=%v", c.root, c.rank, c.memop), func(t *testing.T) {
			withFake(t, func(d *Driver) {
				m := fakeSema(t, d, c.rank, 2, c.memop)
				const rounds = 3
				o := SemaOp{In: 0x9000000, Out: 0xa000000, Count: rounds*1024 - 5, DType: dtype.Float32, Op: dtype.Sum,
					Scale: 1, Root: c.root}
				require.NoError(t, m.Reduce(0, o))
				require.EqualValues(t, rounds, fakeCalls("cuMemcpyDtoDAsync"))
				require.EqualValues(t, rounds*c.batches, fakeCalls("cuStreamBatchMemOp"))
				require.EqualValues(t, rounds*c.launches, fakeCalls("cuLaunchKernel"))
			})
		})
	}
	// NVLS all_reduce works in place: a copy back from the staging too.
	withFake(t, func(d *Driver) {
		m := fakeSema(t, d, 0, 2, false)
		m.Mc = 0x7000000
		require.NoError(t, m.Reduce(0, SemaOp{In: 1, Out: 2, Count: 5, DType: dtype.BFloat16, Op: dtype.Max, Root: -1,
			NVLS: true}))
		require.EqualValues(t, 2, fakeCalls("cuMemcpyDtoDAsync"))
	})
}

func TestSemaRejectsBadOps(t *testing.T) {
	withFake(t, func(d *Driver) {
		ok := SemaOp{In: 1, Out: 2, Count: 4, DType: dtype.Float32, Op: dtype.Sum, Root: -1}
		for _, c := range []struct {
			name string
			edit func(m *Sema, o *SemaOp)
			not  bool // wraps ErrNotSupported
		}{
			{"rank", func(m *Sema, o *SemaOp) { m.Rank = 2 }, false},
			{"world", func(m *Sema, o *SemaOp) { m.World = MaxRanks + 1 }, false},
			{"root", func(m *Sema, o *SemaOp) { o.Root = 2 }, false},
			{"count", func(m *Sema, o *SemaOp) { o.Count = -1 }, false},
			{"stage", func(m *Sema, o *SemaOp) { m.StageBytes = 100 }, false},
			{"no out", func(m *Sema, o *SemaOp) { o.Out = 0 }, false},
			{"no in", func(m *Sema, o *SemaOp) { o.In = 0 }, false},
			{"nvls without multicast", func(m *Sema, o *SemaOp) { o.NVLS = true }, true},
			{"nvls f32 max", func(m *Sema, o *SemaOp) { o.NVLS, o.Op, m.Mc = true, dtype.Max, 1 }, true},
			{"no such kernel", func(m *Sema, o *SemaOp) { o.DType = dtype.Int16 }, true},
		} {
			m, o := fakeSema(t, d, 0, 2, false), ok
			c.edit(m, &o)
			err := m.Reduce(0, o)
			require.Error(t, err, c.name)
			require.Equal(t, c.not, errors.Is(err, ErrNotSupported), "%s: %v", c.name, err)
		}
		// A non-root of a reduce needs no output; zero elements need nothing.
		m := fakeSema(t, d, 0, 2, false)
		require.NoError(t, m.Reduce(0, SemaOp{In: 1, Count: 4, DType: dtype.Float32, Op: dtype.Sum, Root: 1}))
		require.NoError(t, m.Reduce(0, SemaOp{DType: dtype.Float32, Op: dtype.Sum, Root: -1}))
	})
}
