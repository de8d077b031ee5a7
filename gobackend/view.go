package gobackend

// Contiguous views: ContiguousView is collective over a group: every rank
// names a shareable buffer (and an offset into it); the ranks exchange the
// buffers' fds over the authenticated links and each maps rank r's buffer
// into row r of one reserved address range. The row stride is the buffers'
// allocation size (a multiple of the GPU granularity or of the page size),
// so a size that is not one leaves padding between rows. The result is a
// [world, ...] tensor whose row r aliases rank r's buffer.
//
// Two kinds of buffer can be viewed, behind viewSource: GPU allocations
// (gosym.empty on CUDA: VMM handles imported and mapped side by side) and
// host regions (gosym.empty on CPU: memfds mapped MAP_FIXED side by side).
//
// Views are cached per group by (buffer, offset) and reference-counted: the
// same buffer gives the same mapping while every rank keeps its view; when
// one rank lacks it, every rank maps afresh (that rank's buffer may be
// another now), and a replaced view stays valid for its holders. The last
// release unmaps a view. A view's mappings keep the memory alive on their own,
// so a buffer freed while viewed stays readable through the view. Every
// call is collective (one host round when every rank has the view cached),
// so ranks whose caches differ stay in step.

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// viewSource is a buffer that can be viewed.
type viewSource interface {
	RowBytes() uintptr      // the allocation's size: the row stride
	Origin() uintptr        // where the caller's buffer starts in its row
	ExportFD() (int, error) // an fd a peer can map (the caller closes it)
	// MapRows maps this buffer into row rank and fds[r] into row r of one
	// new range; on error nothing stays mapped.
	MapRows(rank int, fds []int) (va uintptr, unmap func(), err error)
	Idle()       // waits until nothing may still use the memory (the GPU)
	Device() int // CUDA ordinal, -1 for host memory
}

// View is a contiguous view of a group's buffers in this process.
type View struct {
	e      *Endpoint
	key    viewKey
	src    viewSource
	va     uintptr
	stride uintptr
	undo   func()
	once   sync.Once // undo runs once: Release and endpoint destroy may race
	refs   int       // holders (under e.views.mu)
}

type viewKey struct {
	src viewSource
	off uintptr
}

// Addr is where the caller's buffer starts in row 0; row r starts Stride
// bytes further per row.
func (v *View) Addr() uintptr   { return v.va + v.src.Origin() }
func (v *View) Stride() uintptr { return v.stride }

// viewCache holds a group's live views.
type viewCache struct {
	mu sync.Mutex
	m  map[viewKey]*View
}

// viewMagic marks a contiguous-view announcement: buffer size and offset.
const viewMagic = 0x57565347 // "GSVW"

// ContiguousView returns (another reference to) the view of every rank's
// buffer src, at offset off into it; every rank of the group calls it
// together, like a collective. Release each reference once.
func (e *Endpoint) ContiguousView(src viewSource, off uintptr) (*View, error) {
	if off >= src.RowBytes() {
		return nil, status.Errorf(status.InvalidArg, "gosym: contiguous_view: offset %d is past the buffer's %d bytes", off, src.RowBytes())
	}
	if d, want := e.gpu.Ordinal(), src.Device(); d >= 0 && want >= 0 && d != want {
		return nil, status.Errorf(status.InvalidArg, "gosym: contiguous_view of a cuda:%d buffer, but group %q runs on cuda:%d on this rank",
			want, e.Name, d)
	}
	key := viewKey{src, off}
	var out *View
	err := e.runTask("contiguous_view", func(who symm.Who, deadline time.Time) error {
		// The cached view is pinned: a Release while this task waits for the
		// peers must not unmap it.
		e.views.mu.Lock()
		have := e.views.m[key]
		if have != nil {
			have.refs++
		}
		e.views.mu.Unlock()
		unpin := func() {
			if have != nil {
				have.Release()
			}
		}
		// Every rank must take the same path: agree whether all have it.
		lacking, err := e.agreeAll(have != nil, who, deadline)
		if err != nil {
			unpin()
			return err
		}
		if len(lacking) > 0 {
			v, err := e.makeView(key, who, deadline)
			unpin()
			if err != nil {
				return err
			}
			have = v // a peer's row may differ from the cached view's
			have.refs++
		}
		e.views.mu.Lock()
		if e.views.m == nil {
			e.views.m = map[viewKey]*View{}
		}
		e.views.m[key] = have
		e.views.mu.Unlock()
		out = have
		return nil
	})
	return out, err
}

// makeView exchanges the buffers' fds and maps them side by side. Every
// rank decides a size or offset mismatch from the same announcements, so
// all fail alike; a local mapping failure is agreed on too.
func (e *Endpoint) makeView(key viewKey, who symm.Who, deadline time.Time) (*View, error) {
	src := key.src
	fd, local := src.ExportFD()
	body := make([]byte, 16)
	binary.LittleEndian.PutUint64(body, uint64(src.RowBytes()))
	binary.LittleEndian.PutUint64(body[8:], uint64(src.Origin()+key.off))
	msgs, err := e.exchangeFD(viewMagic, body, comm.OneFD(fd), deadline)
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		return nil, status.Wrap(status.Peer, err, "gosym: %s", who)
	}
	defer comm.CloseFDs(msgs)
	le := binary.LittleEndian
	for r, m := range msgs {
		if len(m.Body) != len(body) {
			return nil, status.Errorf(status.Mismatch, "gosym: %s: rank %d announced its buffer in %d bytes, this rank in %d (another gosym version?)",
				who, r, len(m.Body), len(body))
		}
		if sz, o := le.Uint64(m.Body), le.Uint64(m.Body[8:]); sz != uint64(src.RowBytes()) || o != uint64(src.Origin()+key.off) {
			return nil, status.Errorf(status.Mismatch, "gosym: %s: rank %d's buffer has %d bytes at offset %d, this rank's %d at %d (the same size and offset on every rank)",
				who, r, sz, o, src.RowBytes(), src.Origin()+key.off)
		}
	}
	v := &View{e: e, key: key, src: src, stride: src.RowBytes(), undo: func() {}}
	fds := make([]int, e.Size)
	for r, m := range msgs {
		fds[r] = m.FD()
		if r != e.Rank && !m.OK && local == nil {
			local = fmt.Errorf("rank %d could not export its buffer", r)
		}
	}
	if local == nil {
		va, undo, err := src.MapRows(e.Rank, fds)
		if local = err; err == nil {
			v.va, v.undo = va, undo
		}
	}
	failed, err := e.agreeAll(local == nil, who, deadline)
	if err != nil || len(failed) > 0 {
		v.unmapOnce()
		if err != nil {
			return nil, err
		}
		return nil, status.Errorf(status.NotSupported, "gosym: %s: ranks %v could not map the view (this rank: %v)", who, failed, local)
	}
	return v, nil
}

// Release drops one reference; the last one unmaps the view, once nothing
// may still use it.
func (v *View) Release() {
	c := &v.e.views
	c.mu.Lock()
	v.refs--
	last := v.refs == 0
	if last && c.m[v.key] == v {
		delete(c.m, v.key)
	}
	c.mu.Unlock()
	if last {
		v.src.Idle()
		v.unmapOnce()
	}
}

func (v *View) unmapOnce() { v.once.Do(v.undo) }

// closeViews unmaps every view left at endpoint destroy (views still held
// are released, not unmapped, later: unmapOnce makes that a no-op).
func (c *viewCache) closeViews() {
	c.mu.Lock()
	m := c.m
	c.m = nil
	c.mu.Unlock()
	for _, v := range m {
		v.src.Idle()
		v.unmapOnce()
	}
}

// HostViewSource is m (an export of a gosym.empty region) as a view source.
func HostViewSource(m *Memh) (viewSource, error) {
	v, err := memreg.NewHostView(m)
	if err != nil {
		return nil, err
	}
	return v, nil
}
