package gobackend

import (
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// viewAll calls ContiguousView on every rank together.
func viewAll(eps []*Endpoint, srcs []viewSource, off uintptr) ([]*View, []error) {
	vs, errs := make([]*View, len(eps)), make([]error, len(eps))
	var wg sync.WaitGroup
	for r, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vs[r], errs[r] = ep.ContiguousView(srcs[r], off)
		}()
	}
	wg.Wait()
	return vs, errs
}

// word is the uint32 at p (memory mapped outside the Go heap).
func word(p uintptr) *uint32 { return (*uint32)(unsafe.Add(nil, p)) }

// Host regions from MemAlloc viewed side by side: row r is rank r's memory
// (reads and writes), the row stride is page-padded, the same buffer gives
// the same view and another buffer another, an offset works, sizes that
// differ fail on every rank, and everything is unmapped in the end.
func TestContiguousViewOfHostRegions(t *testing.T) {
	const world = 3
	eps := group(t, world, 10*time.Second)
	const n = 5000 // bytes: not a multiple of the page size
	mems := make([]*Memh, world)
	srcs := make([]viewSource, world)
	for r := range mems {
		m, err := MemAlloc(n)
		require.NoError(t, err)
		t.Cleanup(func() { MemUnmap(m) })
		mems[r] = m
		for i := 0; i < n/4; i++ {
			*word(m.LocalAddress() + uintptr(4*i)) = uint32(r<<20 | i)
		}
		srcs[r], err = HostViewSource(m)
		require.NoError(t, err)
	}
	vs, errs := viewAll(eps, srcs, 0)
	require.Equal(t, []error{nil, nil, nil}, errs)
	for me, v := range vs {
		require.GreaterOrEqual(t, v.Stride(), uintptr(n))
		require.Zero(t, v.Stride()%4096)
		for r := range world {
			for _, i := range []int{0, 1, n/4 - 1} {
				require.Equal(t, uint32(r<<20|i), *word(v.Addr() + uintptr(r)*v.Stride() + uintptr(4*i)), "rank %d's view, row %d, word %d", me, r, i)
			}
		}
	}
	// rank 0 writes into rank 2's row: rank 2 sees it in its own buffer
	*word(vs[0].Addr() + 2*vs[0].Stride() + 8) = 0xdeadbeef
	require.Equal(t, uint32(0xdeadbeef), *word(mems[2].LocalAddress() + 8))

	again, errs := viewAll(eps, srcs, 0)
	require.Equal(t, []error{nil, nil, nil}, errs)
	for r := range eps {
		require.Same(t, vs[r], again[r], "same buffer, same view")
		again[r].Release()
	}
	at, errs := viewAll(eps, srcs, 64)
	require.Equal(t, []error{nil, nil, nil}, errs)
	require.Equal(t, uint32(1<<20|16), *word(at[0].Addr() + at[0].Stride() + 64))
	require.NotEqual(t, vs[0].Addr(), at[0].Addr(), "another offset, another view")

	// sizes that differ: every rank fails alike and the group goes on
	other := make([]viewSource, world)
	for r := range other {
		m, err := MemAlloc(n + r*8192)
		require.NoError(t, err)
		t.Cleanup(func() { MemUnmap(m) })
		other[r], err = HostViewSource(m)
		require.NoError(t, err)
	}
	_, errs = viewAll(eps, other, 0)
	for r, err := range errs {
		require.Equal(t, status.Mismatch, status.CodeOf(err), "rank %d: %v", r, err)
		require.ErrorContains(t, err, "bytes at offset")
	}
	for r := range eps {
		vs[r].Release()
		at[r].Release()
	}
	for _, ep := range eps {
		ep.views.mu.Lock()
		require.Empty(t, ep.views.m)
		ep.views.mu.Unlock()
	}
	// the group still runs collectives
	bufs := make([][]float32, world)
	require.Equal(t, []error{nil, nil, nil}, postAll(t, eps, func(r int) *Op {
		bufs[r] = []float32{float32(r)}
		return &Op{Kind: coll.AllReduce, DType: dtype.Float32, Count: 1, In: addr(bufs[r]), Out: addr(bufs[r])}
	}))
	require.Equal(t, float32(3), bufs[0][0])
}
