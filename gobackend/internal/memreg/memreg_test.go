package memreg

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/shm"
	"github.com/gosym/gosym/gobackend/internal/status"
)

func newDomain(t *testing.T) *Domain {
	t.Helper()
	d := NewDomain()
	t.Cleanup(func() { d.Close() })
	return d
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func TestAllocMapFind(t *testing.T) {
	d := newDomain(t)
	d.SetCUDA(newFakeCUDA(&fakeGPUs{}, gpu0)) // knows no allocation: device ranges are private
	a, err := d.Alloc(3*4096 + 5)
	require.NoError(t, err)
	assert.NotZero(t, a.ID())
	assert.Equal(t, Export, a.Mode())
	assert.True(t, a.Shareable())
	assert.Equal(t, a.Address(), a.LocalAddress())
	assert.Equal(t, 3*4096+5, a.Len())
	assert.Equal(t, a.Len(), a.LocalLen())
	assert.Equal(t, HostDevice, a.Device())
	require.Len(t, a.Bytes(), a.Len())
	assert.Equal(t, a.Address(), addrOf(a.Bytes()))

	sub, err := d.Map(a.Address()+4096+8, 100, HostDevice)
	require.NoError(t, err)
	assert.True(t, sub.Shareable(), "a range inside an Alloc'ed region is shareable")
	a.Bytes()[4096+8] = 0x5a
	assert.Equal(t, byte(0x5a), sub.Bytes()[0])

	heap := make([]byte, 64)
	priv, err := d.Map(addrOf(heap), len(heap), HostDevice)
	require.NoError(t, err)
	assert.False(t, priv.Shareable())
	assert.Nil(t, priv.Bytes(), "a private memh's memory is not ours to hand out")

	gpu, err := d.Map(0x7f0000000000, 1<<20, 0)
	require.NoError(t, err)
	assert.False(t, gpu.Shareable())
	assert.Equal(t, 0, gpu.Device())

	tests := []struct {
		name string
		addr uintptr
		n    int
		want *Memh
	}{
		{"whole region", a.Address(), a.Len(), a},
		{"sub-range uses the enclosing region", a.Address() + 4096 + 10, 8, a},
		{"last byte", a.Address() + uintptr(a.Len()) - 1, 1, a},
		{"one past the end", a.Address() + 1, a.Len(), nil},
		{"private range", addrOf(heap) + 3, 10, priv},
		{"device range", 0x7f0000000000 + 4096, 4096, gpu},
		{"unregistered", 0x1000, 8, nil},
		{"zero length", a.Address(), 0, nil},
		{"negative length", a.Address(), -1, nil},
		{"wraps", ^uintptr(0) - 4095, 8192, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := d.Find(tt.addr, tt.n)
			assert.Equal(t, tt.want != nil, ok)
			assert.Same(t, tt.want, m)
		})
	}
	got, err := d.Get(sub.ID())
	require.NoError(t, err)
	assert.Same(t, sub, got)

	st := d.Stats()
	assert.Equal(t, int64(1), st["allocs"])
	assert.Equal(t, int64(3), st["maps"])
	assert.Equal(t, int64(4), st["live"])
	assert.Equal(t, int64(1), st["regions"])
}

func TestMapRejects(t *testing.T) {
	d := newDomain(t)
	d.SetCUDA(newFakeCUDA(&fakeGPUs{}, gpu0, gpu1))
	a, err := d.Alloc(8192)
	require.NoError(t, err)
	tests := []struct {
		name   string
		addr   uintptr
		n, dev int
		want   string
	}{
		{"zero length", 0x10000, 0, HostDevice, "must be positive"},
		{"negative length", 0x10000, -5, HostDevice, "must be positive"},
		{"null address", 0, 64, HostDevice, "null address"},
		{"wraps", ^uintptr(0) - 4095, 8192, HostDevice, "wraps"},
		{"ends at 2^64", ^uintptr(0) - 4095, 4096, HostDevice, "wraps"},
		{"bad device", 0x10000, 64, -2, "device -2"},
		{"straddles the region end", a.Address() + 4096, 8192, HostDevice, "straddles"},
		{"straddles the region start", a.Address() - 16, 64, HostDevice, "straddles"},
		{"device range in a host region", a.Address(), 64, 1, "lies in host region"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := d.Map(tt.addr, tt.n, tt.dev)
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, status.InvalidArg, status.CodeOf(err))
		})
	}
	for _, n := range []int{0, -1} {
		_, err := d.Alloc(n)
		assert.Equal(t, status.InvalidArg, status.CodeOf(err))
	}
	assert.Equal(t, int64(1), d.Stats()["live"], "rejected maps leave nothing behind")
}

func TestUnmap(t *testing.T) {
	d := newDomain(t)
	other := newDomain(t)
	a, err := d.Alloc(4096)
	require.NoError(t, err)
	b, err := other.Alloc(4096)
	require.NoError(t, err)

	assert.Equal(t, status.InvalidHandle, status.CodeOf(d.Unmap(nil)))
	assert.Equal(t, status.InvalidHandle, status.CodeOf(d.Unmap(b)), "a memh of another domain")
	assert.Equal(t, status.InvalidHandle, status.CodeOf(d.Unmap(&Memh{})))

	regions := shm.LiveRegions()
	require.NoError(t, d.Unmap(a))
	assert.Equal(t, regions-1, shm.LiveRegions())
	require.NoError(t, d.Unmap(a), "a second unmap is a no-op")
	assert.Equal(t, int64(1), d.Stats()["unmaps"])
	assert.Nil(t, a.Bytes())

	_, err = d.Get(a.ID())
	assert.Equal(t, status.InvalidHandle, status.CodeOf(err))
	_, err = a.Pack()
	assert.ErrorIs(t, err, ErrUnmapped)
	assert.ErrorIs(t, a.Retain(), ErrUnmapped)
	_, _, err = a.Bind("ep", nil, nil)
	assert.ErrorIs(t, err, ErrUnmapped)
	_, ok := d.Find(a.Address(), 1)
	assert.False(t, ok)
	st := d.Stats()
	assert.Equal(t, int64(0), st["live"])
	assert.Equal(t, int64(0), st["regions"])
}

func TestRegionRefcount(t *testing.T) {
	d := newDomain(t)
	regions := shm.LiveRegions()
	a, err := d.Alloc(8192)
	require.NoError(t, err)
	sub, err := d.Map(a.Address()+4096, 16, HostDevice)
	require.NoError(t, err)

	// The region outlives its Alloc memh while a memh inside it is mapped.
	require.NoError(t, d.Unmap(a))
	assert.Equal(t, regions+1, shm.LiveRegions())
	sub.Bytes()[0] = 7
	assert.Equal(t, int64(1), d.Stats()["regions"])
	// ... but its range is no longer a shareable allocation.
	late, err := d.Map(a.Address(), 16, HostDevice)
	require.NoError(t, err)
	assert.False(t, late.Shareable())
	require.NoError(t, d.Unmap(late))
	require.NoError(t, d.Unmap(sub))
	assert.Equal(t, regions, shm.LiveRegions())
	assert.Equal(t, int64(0), d.Stats()["regions"])

	// A retained memh keeps its memory past Unmap until released.
	b, err := d.Alloc(4096)
	require.NoError(t, err)
	require.NoError(t, b.Retain())
	require.NoError(t, b.Retain())
	require.NoError(t, d.Unmap(b))
	b.Bytes()[4095] = 1
	require.NoError(t, b.Release())
	assert.Equal(t, regions+1, shm.LiveRegions())
	require.NoError(t, b.Release())
	assert.Equal(t, regions, shm.LiveRegions())
	assert.Equal(t, status.InvalidArg, status.CodeOf(b.Release()), "more releases than retains")
	assert.Nil(t, b.Bytes())
}

type endpoint struct{ name string }

func TestBindings(t *testing.T) {
	d := newDomain(t)
	m1, err := d.Alloc(4096)
	require.NoError(t, err)
	m2, err := d.Alloc(4096)
	require.NoError(t, err)
	ep1, ep2 := &endpoint{"1"}, &endpoint{"2"}
	var released sync.Map // "memh/endpoint" -> count
	rel := func(m *Memh, ep *endpoint) func() {
		return func() {
			// The memory is still mapped while a binding is released.
			m.Bytes()[0]++
			n, _ := released.LoadOrStore(fmt.Sprint(m.ID(), "/", ep.name), new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
	}
	count := func(m *Memh, ep *endpoint) int32 {
		n, ok := released.Load(fmt.Sprint(m.ID(), "/", ep.name))
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}

	cur, added, err := m1.Bind(ep1, "state-1", rel(m1, ep1))
	require.NoError(t, err)
	assert.True(t, added)
	assert.Equal(t, "state-1", cur)
	cur, added, err = m1.Bind(ep1, "racer", rel(m1, ep1))
	require.NoError(t, err)
	assert.False(t, added, "a racer that lost gets the winner's state")
	assert.Equal(t, "state-1", cur)
	_, _, err = m1.Bind(ep2, 2, rel(m1, ep2))
	require.NoError(t, err)
	_, _, err = m2.Bind(ep1, 3, rel(m2, ep1))
	require.NoError(t, err)
	_, _, err = m2.Bind([]int{1}, nil, nil)
	assert.Equal(t, status.InvalidArg, status.CodeOf(err), "owner must be a comparable key")
	st, ok := m1.Binding(ep2)
	assert.True(t, ok)
	assert.Equal(t, 2, st)
	assert.Equal(t, 2, m1.Bindings())
	assert.Equal(t, int64(3), d.Stats()["bindings"])

	// Endpoint 1 goes first: its bindings go from every memh, not nulled.
	assert.Equal(t, 2, d.UnbindAll(ep1))
	assert.Equal(t, 0, d.UnbindAll(ep1))
	assert.Equal(t, 1, m1.Bindings())
	assert.Equal(t, int32(1), count(m1, ep1))
	assert.Equal(t, int32(1), count(m2, ep1))
	assert.False(t, m1.Unbind(ep1))

	// Then the memh goes first for endpoint 2: Unmap releases its binding.
	require.NoError(t, d.Unmap(m1))
	assert.Equal(t, int32(1), count(m1, ep2))
	assert.False(t, m1.Unbind(ep2), "already removed by Unmap")
	assert.Equal(t, 0, d.UnbindAll(ep2))
	assert.Equal(t, int32(1), count(m1, ep2))

	_, _, err = m2.Bind(ep2, nil, rel(m2, ep2))
	require.NoError(t, err)
	assert.True(t, m2.Unbind(ep2))
	assert.Equal(t, int32(1), count(m2, ep2))
	assert.Equal(t, int64(0), d.Stats()["bindings"])
}

// TestRebindCycles: many endpoints bind and go; the per-memh list stays
// the size of the live endpoints (no null slots, UCC's accumulation bug).
func TestRebindCycles(t *testing.T) {
	d := newDomain(t)
	m, err := d.Alloc(4096)
	require.NoError(t, err)
	var releases atomic.Int32
	for i := 0; i < 1000; i++ {
		ep := &endpoint{fmt.Sprint(i)}
		_, added, err := m.Bind(ep, i, func() { releases.Add(1) })
		require.NoError(t, err)
		require.True(t, added)
		require.Equal(t, 1, d.UnbindAll(ep))
		require.Equal(t, 0, m.Bindings())
	}
	require.NoError(t, d.Unmap(m))
	assert.Equal(t, int32(1000), releases.Load(), "unmap releases nothing for dead endpoints")
}

func TestCloseDomain(t *testing.T) {
	d := NewDomain()
	a, err := d.Alloc(4096)
	require.NoError(t, err)
	_, err = a.Pack() // starts the fd server
	require.NoError(t, err)
	var released bool
	_, _, err = a.Bind("ep", nil, func() { released = true })
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close())
	assert.True(t, released)
	assert.Equal(t, int64(0), d.Stats()["live"])
	assert.Equal(t, int64(0), d.Stats()["regions"])

	_, err = d.Alloc(4096)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = d.Map(0x10000, 1, HostDevice)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = d.Import(seedBlobs()["shareable"])
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, status.Closed, status.CodeOf(err))
}

// TestSlowUnmapDoesNotBlock: while one goroutine's Unmap is in a slow
// deregistration (hook and binding release), another goroutine maps,
// finds, packs, serves an import, binds, unbinds and unmaps without
// waiting for it (checklist item 6).
func TestSlowUnmapDoesNotBlock(t *testing.T) {
	const slowFor = 500 * time.Millisecond
	d := newDomain(t)
	importer := newDomain(t)
	other, err := d.Alloc(8192)
	require.NoError(t, err)
	for _, where := range []string{"hook", "release"} {
		t.Run(where, func(t *testing.T) {
			slow, err := d.Alloc(4096)
			require.NoError(t, err)
			entered := make(chan struct{})
			sleep := func() { close(entered); time.Sleep(slowFor) }
			if where == "hook" {
				d.SetHooks(&Hooks{Unmap: func(m *Memh) {
					if m == slow {
						sleep()
					}
				}})
				defer d.SetHooks(nil)
			} else {
				_, _, err := slow.Bind(&endpoint{"slow"}, nil, sleep)
				require.NoError(t, err)
			}
			done := make(chan error, 1)
			go func() { done <- d.Unmap(slow) }()
			<-entered

			start := time.Now()
			m, err := d.Map(other.Address()+4096, 64, HostDevice)
			require.NoError(t, err)
			f, ok := d.Find(other.Address()+4100, 8)
			require.True(t, ok)
			assert.Same(t, other, f)
			blob, err := m.Pack()
			require.NoError(t, err)
			imp, err := importer.Import(blob)
			require.NoError(t, err)
			ep := &endpoint{"b"}
			_, _, err = m.Bind(ep, nil, nil)
			require.NoError(t, err)
			assert.Equal(t, 1, d.UnbindAll(ep))
			require.NoError(t, importer.Unmap(imp))
			require.NoError(t, d.Unmap(m))
			_ = d.Stats()
			elapsed := time.Since(start)

			select {
			case <-done:
				t.Fatal("the slow unmap ended before the other goroutine: the test proves nothing")
			default:
			}
			assert.Less(t, elapsed, slowFor/4, "another goroutine waited for a slow deregistration")
			require.NoError(t, <-done)
		})
	}
}

// TestConcurrentUse runs every operation from several goroutines at once
// (for the race detector) and checks that everything is released.
func TestConcurrentUse(t *testing.T) {
	d := newDomain(t)
	importer := newDomain(t)
	regions := shm.LiveRegions()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				a, err := d.Alloc(4096 * (1 + i%3))
				if !assert.NoError(t, err) {
					return
				}
				sub, err := d.Map(a.Address()+64, 128, HostDevice)
				assert.NoError(t, err)
				blob, err := sub.Pack()
				assert.NoError(t, err)
				m, err := importer.Import(blob)
				if assert.NoError(t, err) {
					m.Bytes()[0] = byte(i)
					assert.Equal(t, byte(i), a.Bytes()[64])
				}
				f, ok := d.Find(a.Address()+64, 8)
				assert.True(t, ok)
				assert.Same(t, a, f)
				if i%2 == 0 {
					assert.NoError(t, d.Unmap(a))
					assert.NoError(t, d.Unmap(sub))
				} else {
					assert.NoError(t, d.Unmap(sub))
					assert.NoError(t, d.Unmap(a))
				}
				if m != nil {
					assert.NoError(t, importer.Unmap(m))
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, regions, shm.LiveRegions())
	assert.Equal(t, int64(0), d.Stats()["live"])
	assert.Equal(t, int64(100), d.Stats()["served"])
}
