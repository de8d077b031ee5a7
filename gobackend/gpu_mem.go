package gobackend

// Symmetric GPU memory for users: gosym.empty(..., device="cuda") and the
// contiguous view of a group's buffers.
//
// A GPUBuf is one VMM allocation (cuMemCreate with a POSIX-fd handle, its
// size rounded up to the granularity), mapped in this process for its
// device. It is shareable: a contiguous view exports its fd to the peers.
//
// ContiguousView is collective over a group: every rank names its GPUBuf
// (and an offset into it); the ranks exchange fds over the authenticated
// links and each reserves one VA range of world rows of the buffers' size
// (the row stride: a multiple of the granularity, so a size that is not one
// leaves padding between rows) and maps rank r's allocation into row r. The
// result is a [world, ...] tensor on the local device whose row r aliases
// rank r's buffer. Views are cached per group by (buffer, offset) and
// reference-counted: the same buffer gives the same mapping while any
// holder keeps it; the last release unmaps it. A view's mappings keep the
// physical memory alive on their own, so a buffer freed while viewed stays
// readable through the view.

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// GPUBuf is a shareable VMM allocation of this process (gosym.empty on CUDA).
type GPUBuf struct {
	g    *gpuDevice
	h    cuda.AllocHandle
	va   uintptr
	size uintptr // the allocation: the requested bytes rounded up to the granularity

	mu    sync.Mutex
	freed bool
}

// GPUAlloc allocates n bytes (at least 1) of shareable memory on device.
func GPUAlloc(device, n int) (*GPUBuf, error) {
	if n <= 0 {
		return nil, status.Errorf(status.InvalidArg, "gosym: cannot allocate %d bytes", n)
	}
	g, err := openGPU(device)
	if err != nil {
		return nil, status.Wrap(status.NotSupported, err, "gosym: symmetric memory on cuda:%d", device)
	}
	b := &GPUBuf{g: g, size: (uintptr(n) + g.gran - 1) / g.gran * g.gran}
	if b.h, err = g.d.MemCreate(g.ctx, g.dev, b.size, cuda.HandleTypePosixFD); err != nil {
		return nil, status.Wrap(status.System, err, "gosym: allocating %d bytes on cuda:%d", b.size, device)
	}
	if b.va, err = g.mapHandles([]cuda.AllocHandle{b.h}, b.size); err != nil {
		g.d.MemRelease(g.ctx, b.h)
		return nil, status.Wrap(status.System, err, "gosym: mapping %d bytes on cuda:%d", b.size, device)
	}
	return b, nil
}

// Addr, Size and Device describe the allocation.
func (b *GPUBuf) Addr() uintptr { return b.va }
func (b *GPUBuf) Size() uintptr { return b.size }
func (b *GPUBuf) Device() int   { return b.g.ordinal }

// Free unmaps and releases the allocation (views keep their own mappings),
// once the device is idle: a kernel may still use it. It is idempotent.
func (b *GPUBuf) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return nil
	}
	b.freed = true
	b.g.d.CtxSynchronize(b.g.ctx)
	b.g.unmapHandles(b.va, b.size, 1, 1)
	return b.g.d.MemRelease(b.g.ctx, b.h)
}

// mapHandles reserves one range of len(hs) rows of stride bytes, maps hs[i]
// into row i and grants this device access; on error nothing stays mapped.
func (g *gpuDevice) mapHandles(hs []cuda.AllocHandle, stride uintptr) (uintptr, error) {
	va, err := g.d.MemAddressReserve(g.ctx, stride*uintptr(len(hs)), g.gran)
	if err != nil {
		return 0, err
	}
	for i, h := range hs {
		if err = g.d.MemMap(g.ctx, va+uintptr(i)*stride, stride, h); err != nil {
			g.unmapHandles(va, stride, i, len(hs))
			return 0, err
		}
	}
	if err = g.d.MemSetAccess(g.ctx, va, stride*uintptr(len(hs)), []cuda.Device{g.dev}); err != nil {
		g.unmapHandles(va, stride, len(hs), len(hs))
		return 0, err
	}
	return va, nil
}

// unmapHandles undoes mapHandles: unmaps the first mapped of rows rows and
// frees the range.
func (g *gpuDevice) unmapHandles(va, stride uintptr, mapped, rows int) {
	for i := range mapped {
		g.d.MemUnmap(g.ctx, va+uintptr(i)*stride, stride)
	}
	g.d.MemAddressFree(g.ctx, va, stride*uintptr(rows))
}

// View is a contiguous view of a group's buffers in this process.
type View struct {
	e      *Endpoint
	key    viewKey
	g      *gpuDevice
	va     uintptr
	stride uintptr
	world  int
	peers  []cuda.AllocHandle // imported, released with the view
	refs   int                // holders (under e.views.mu)
}

type viewKey struct {
	buf *GPUBuf
	off uintptr
}

// Addr is where row 0 starts; row r starts Stride bytes further per row.
func (v *View) Addr() uintptr   { return v.va }
func (v *View) Stride() uintptr { return v.stride }

// viewCache holds a group's live views.
type viewCache struct {
	mu sync.Mutex
	m  map[viewKey]*View
}

// viewMagic marks a contiguous-view announcement: buffer size and offset.
const viewMagic = 0x57565347 // "GSVW"

// ContiguousView returns (another reference to) the view of every rank's
// buffer b, at offset off into it; every rank of the group calls it
// together, like a collective. Release each reference once.
func (e *Endpoint) ContiguousView(b *GPUBuf, off uintptr) (*View, error) {
	if off >= b.size {
		return nil, status.Errorf(status.InvalidArg, "gosym: contiguous_view: offset %d is past the buffer's %d bytes", off, b.size)
	}
	if d := int(e.gpu.device.Load()) - 1; d >= 0 && d != b.g.ordinal {
		return nil, status.Errorf(status.InvalidArg, "gosym: contiguous_view of a cuda:%d buffer, but group %q runs on cuda:%d on this rank",
			b.g.ordinal, e.Name, d)
	}
	key := viewKey{b, off}
	var out *View
	err := e.runTask("contiguous_view", func(who symm.Who, deadline time.Time) error {
		e.views.mu.Lock()
		have := e.views.m[key]
		e.views.mu.Unlock()
		// Every rank must take the same path: agree whether all have it.
		flag := []byte{0}
		if have != nil {
			flag[0] = 1
		}
		all, err := e.team.Barrier(flag, who, deadline)
		if err != nil {
			return err
		}
		everyone := true
		for _, f := range all {
			everyone = everyone && len(f) == 1 && f[0] == 1
		}
		if !everyone {
			v, err := e.makeView(key, who, deadline)
			if err != nil {
				return err
			}
			if have == nil {
				have = v
			} else { // this rank's own is still alive: keep it, the peers needed the exchange
				v.unmap()
			}
		}
		e.views.mu.Lock()
		if e.views.m == nil {
			e.views.m = map[viewKey]*View{}
		}
		e.views.m[key] = have
		have.refs++
		e.views.mu.Unlock()
		out = have
		return nil
	})
	return out, err
}

// makeView exchanges the buffers' fds and maps them side by side. Every
// rank decides the outcome from the same announcements, so all fail alike
// on a size or offset mismatch; a local mapping failure is agreed on too.
func (e *Endpoint) makeView(key viewKey, who symm.Who, deadline time.Time) (*View, error) {
	b := key.buf
	g := b.g
	b.mu.Lock()
	fd, local := -1, error(nil)
	if b.freed {
		local = fmt.Errorf("the buffer was freed")
	} else {
		fd, local = g.d.MemExportFD(g.ctx, b.h)
	}
	b.mu.Unlock()
	body := make([]byte, 16)
	binary.LittleEndian.PutUint64(body, uint64(b.size))
	binary.LittleEndian.PutUint64(body[8:], uint64(key.off))
	msgs, err := e.exchangeFD(viewMagic, body, fd, deadline)
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		return nil, status.Wrap(status.Peer, err, "gosym: %s", who)
	}
	defer closeFDX(msgs)
	for r, m := range msgs {
		if sz, o := binary.LittleEndian.Uint64(m.body), binary.LittleEndian.Uint64(m.body[8:]); sz != uint64(b.size) || o != uint64(key.off) {
			return nil, status.Errorf(status.Mismatch, "gosym: %s: rank %d's buffer has %d bytes at offset %d, this rank's %d at %d (the same size and offset on every rank)",
				who, r, sz, o, b.size, key.off)
		}
	}
	v := &View{e: e, key: key, g: g, stride: b.size, world: e.Size, peers: make([]cuda.AllocHandle, e.Size)}
	hs := make([]cuda.AllocHandle, e.Size)
	for r, m := range msgs {
		switch {
		case local != nil:
		case r == e.Rank:
			hs[r] = b.h
		case !m.ok:
			local = fmt.Errorf("rank %d could not export its buffer", r)
		default:
			h, err := g.d.MemImportFD(g.ctx, m.fd)
			if err != nil {
				local = fmt.Errorf("import rank %d's buffer: %w", r, err)
				break
			}
			hs[r], v.peers[r] = h, h
		}
	}
	if local == nil {
		v.va, local = g.mapHandles(hs, v.stride)
	}
	flag := []byte{1}
	if local != nil {
		flag[0] = 0
	}
	all, err := e.team.Barrier(flag, who, deadline)
	failed := []int{}
	for r, f := range all {
		if len(f) != 1 || f[0] != 1 {
			failed = append(failed, r)
		}
	}
	if err != nil || len(failed) > 0 || local != nil {
		v.unmap()
		if err != nil {
			return nil, err
		}
		return nil, status.Errorf(status.NotSupported, "gosym: %s: ranks %v could not map the view (this rank: %v)", who, failed, local)
	}
	return v, nil
}

// unmap releases the view's mappings and imported handles.
func (v *View) unmap() {
	if v.va != 0 {
		v.g.unmapHandles(v.va, v.stride, v.world, v.world)
		v.va = 0
	}
	for r, h := range v.peers {
		if h != 0 {
			v.g.d.MemRelease(v.g.ctx, h)
			v.peers[r] = 0
		}
	}
}

// Release drops one reference; the last one unmaps the view, once the
// device is idle.
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
		v.g.d.CtxSynchronize(v.g.ctx)
		v.unmap()
	}
}

// closeViews unmaps every view left at endpoint destroy, once the device
// is idle (kernels on the callers' streams may still use them).
func (c *viewCache) closeViews() {
	c.mu.Lock()
	m := c.m
	c.m = nil
	c.mu.Unlock()
	for _, v := range m {
		v.g.d.CtxSynchronize(v.g.ctx)
		v.unmap()
	}
}
