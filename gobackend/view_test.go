package gobackend

import (
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
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
		return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 1, In: addr(bufs[r]), Out: addr(bufs[r])}
	}))
	require.Equal(t, float32(3), bufs[0][0])
}

// namedSource is a view source whose fd is a memfd holding its name; its
// MapRows records, per made-up address, the names of the rows it mapped
// (the views' bookkeeping, not their memory, is under test).
type namedSource struct {
	name    string
	failMap bool
	maps    *namedMaps
}

type namedMaps struct {
	mu       sync.Mutex
	next     uintptr
	rows     map[uintptr][]string
	unmapped map[uintptr]int
}

func newNamedMaps() *namedMaps {
	return &namedMaps{next: 0x100000, rows: map[uintptr][]string{}, unmapped: map[uintptr]int{}}
}

func (s *namedSource) RowBytes() uintptr { return 4096 }
func (s *namedSource) Origin() uintptr   { return 0 }
func (s *namedSource) Idle()             {}
func (s *namedSource) Device() int       { return -1 }

func (s *namedSource) ExportFD() (int, error) {
	fd, err := unix.MemfdCreate("gosym-test-view", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	_, err = unix.Pwrite(fd, []byte(s.name), 0)
	return fd, err
}

func (s *namedSource) MapRows(rank int, fds []int) (uintptr, func(), error) {
	if s.failMap {
		return 0, nil, errors.New("import failed") // as the real sources fail: no undo
	}
	rows := make([]string, len(fds))
	for r, fd := range fds {
		rows[r] = s.name
		if r != rank {
			b := make([]byte, 16)
			n, err := unix.Pread(fd, b, 0)
			if err != nil {
				return 0, nil, err
			}
			rows[r] = string(b[:n])
		}
	}
	m := s.maps
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next += 0x10000
	va := m.next
	m.rows[va] = rows
	return va, func() { m.mu.Lock(); m.unmapped[va]++; m.mu.Unlock() }, nil
}

func (m *namedMaps) of(v *View) (rows []string, unmapped int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rows[v.va], m.unmapped[v.va]
}

// A rank that cannot map its view fails it on every rank alike, as an
// error (not a crash on the undo its failed mapping never made).
func TestContiguousViewMapFailureIsAgreed(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	m := newNamedMaps()
	_, errs := viewAll(eps, []viewSource{&namedSource{name: "a0", maps: m}, &namedSource{name: "a1", failMap: true, maps: m}}, 0)
	for r, err := range errs {
		require.Equal(t, status.NotSupported, status.CodeOf(err), "rank %d: %v", r, err)
	}
}

// Rank 1 released its view and views another buffer while rank 0 still
// holds its view of the same buffer as before: both ranks' new views show
// rank 1's new buffer in row 1, and rank 0's old view stays mapped for its
// holder.
func TestContiguousViewRemapsWhenAPeerLacksIt(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	m := newNamedMaps()
	a0, a1, b1 := &namedSource{name: "a0", maps: m}, &namedSource{name: "a1", maps: m}, &namedSource{name: "b1", maps: m}
	vs, errs := viewAll(eps, []viewSource{a0, a1}, 0)
	require.Equal(t, []error{nil, nil}, errs)
	vs[1].Release()
	again, errs := viewAll(eps, []viewSource{a0, b1}, 0)
	require.Equal(t, []error{nil, nil}, errs)
	for r, v := range again {
		rows, _ := m.of(v)
		require.Equal(t, []string{"a0", "b1"}, rows, "rank %d's view", r)
	}
	rows, unmapped := m.of(vs[0])
	require.Equal(t, []string{"a0", "a1"}, rows)
	require.Zero(t, unmapped, "rank 0's old view is still held")
	vs[0].Release()
	_, unmapped = m.of(vs[0])
	require.Equal(t, 1, unmapped)
	for _, v := range again {
		v.Release()
		_, unmapped = m.of(v)
		require.Equal(t, 1, unmapped)
	}
}

// A Release of the last reference while rank 0's ContiguousView of the
// same buffer waits for its peer: the view rank 0 gets is mapped. (Should
// rank 0 reach the agreement only after the Release, it maps afresh; the
// assertions hold either way.)
func TestContiguousViewReleaseWhileWaiting(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	m := newNamedMaps()
	a0, a1 := &namedSource{name: "a0", maps: m}, &namedSource{name: "a1", maps: m}
	vs, errs := viewAll(eps, []viewSource{a0, a1}, 0)
	require.Equal(t, []error{nil, nil}, errs)
	var got *View
	var err0 error
	done := make(chan struct{})
	go func() { got, err0 = eps[0].ContiguousView(a0, 0); close(done) }()
	time.Sleep(200 * time.Millisecond) // rank 0 waits for rank 1 in the agreement
	vs[0].Release()
	v1, err1 := eps[1].ContiguousView(a1, 0)
	<-done
	require.NoError(t, err0)
	require.NoError(t, err1)
	_, unmapped := m.of(got)
	require.Zero(t, unmapped, "rank 0 got a view that is unmapped")
	got.Release()
	v1.Release()
	vs[1].Release()
	for _, ep := range eps {
		ep.views.mu.Lock()
		require.Empty(t, ep.views.m)
		ep.views.mu.Unlock()
	}
}
