package gpu

// Symmetric GPU memory for users: gosym.empty(..., device="cuda"). A Buf
// is one VMM allocation (cuMemCreate with a POSIX-fd handle, its size
// rounded up to the granularity), mapped in this process for its device.
// It is shareable: a contiguous view (view.go) exports its fd to the peers
// and maps theirs side by side with it, and a group's direct path binds it
// like a mem_map'ed buffer (reg.go), sending the fd over the links.
//
// Every live Buf is registered implicitly, in a domain of its own
// (bufDomain) rather than the user's: the direct path consults it only
// where every rank takes the agreement round anyway (GOSYM_GPU_DIRECT_MIN),
// so a rank whose peer used a torch tensor never waits for a round the peer
// skips. A user's mem_map of the same memory goes to memreg.Default and
// counts as registration from GOSYM_GPU_REG_DIRECT_MIN, as any other.

import (
	"fmt"
	"slices"
	"sync"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// Buf is a shareable VMM allocation of this process (gosym.empty on CUDA).
type Buf struct {
	g    *Device
	h    cuda.AllocHandle
	va   uintptr
	size uintptr      // the allocation: the requested bytes rounded up to the granularity
	m    *memreg.Memh // its implicit registration in bufDomain

	mu    sync.Mutex
	freed bool
}

// bufDomain holds the implicit registrations of the live bufs.
var bufDomain = func() *memreg.Domain {
	d := memreg.NewDomain()
	d.SetCUDA(registrar{})
	return d
}()

// liveBufs are the live bufs, so that a registration of their memory
// knows the allocation without asking the driver.
var liveBufs struct {
	sync.Mutex
	bufs []*Buf
}

// liveBuf is the live Buf of device that holds [addr, addr+n), or nil.
func liveBuf(device int, addr uintptr, n int) *Buf {
	liveBufs.Lock()
	defer liveBufs.Unlock()
	for _, b := range liveBufs.bufs {
		if b.g.ordinal == device && addr >= b.va && uint64(addr-b.va)+uint64(n) <= uint64(b.size) {
			return b
		}
	}
	return nil
}

func setLive(b *Buf, live bool) {
	liveBufs.Lock()
	defer liveBufs.Unlock()
	if live {
		liveBufs.bufs = append(liveBufs.bufs, b)
	} else {
		liveBufs.bufs = slices.DeleteFunc(liveBufs.bufs, func(o *Buf) bool { return o == b })
	}
}

// Alloc allocates n bytes (at least 1) of shareable memory on device.
func Alloc(device, n int) (*Buf, error) {
	if n <= 0 {
		return nil, status.Errorf(status.InvalidArg, "gosym: cannot allocate %d bytes", n)
	}
	g, err := Open(device)
	if err != nil {
		return nil, status.Wrap(status.NotSupported, err, "gosym: symmetric memory on cuda:%d", device)
	}
	b := &Buf{g: g, size: (uintptr(n) + g.gran - 1) / g.gran * g.gran}
	if b.h, err = g.d.MemCreate(g.ctx, g.dev, b.size, cuda.HandleTypePosixFD); err != nil {
		return nil, status.Wrap(status.System, err, "gosym: allocating %d bytes on cuda:%d", b.size, device)
	}
	if b.va, err = g.mapParts([]cuda.AllocHandle{b.h}, []uintptr{b.size}); err != nil {
		g.d.MemRelease(g.ctx, b.h)
		return nil, status.Wrap(status.System, err, "gosym: mapping %d bytes on cuda:%d", b.size, device)
	}
	setLive(b, true)
	if b.m, err = bufDomain.Map(b.va, int(b.size), device); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// Addr, Size and Device describe the allocation.
func (b *Buf) Addr() uintptr { return b.va }
func (b *Buf) Size() uintptr { return b.size }
func (b *Buf) Device() int   { return b.g.ordinal }

// Free unmaps and releases the allocation (views keep their own mappings),
// once the device is idle: a kernel may still use it. It is idempotent.
func (b *Buf) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return nil
	}
	b.freed = true
	if b.m != nil {
		bufDomain.Unmap(b.m) // retires its bindings: the peers drop their mappings at their next round
	}
	setLive(b, false)
	b.g.d.CtxSynchronize(b.g.ctx)
	b.g.unmapParts(b.va, []uintptr{b.size}, 1)
	return b.g.d.MemRelease(b.g.ctx, b.h)
}

// mapParts reserves one range for allocations hs side by side (sizes[i]
// bytes of hs[i], each a multiple of the granularity), maps them and
// grants this device access; on error nothing stays mapped.
func (g *Device) mapParts(hs []cuda.AllocHandle, sizes []uintptr) (uintptr, error) {
	total := uintptr(0)
	for _, s := range sizes {
		total += s
	}
	va, err := g.d.MemAddressReserve(g.ctx, total, g.gran)
	if err != nil {
		return 0, err
	}
	at := va
	for i, h := range hs {
		if err = g.d.MemMap(g.ctx, at, sizes[i], h); err != nil {
			g.unmapParts(va, sizes, i)
			return 0, err
		}
		at += sizes[i]
	}
	if err = g.d.MemSetAccess(g.ctx, va, total, []cuda.Device{g.dev}); err != nil {
		g.unmapParts(va, sizes, len(hs))
		return 0, err
	}
	return va, nil
}

// unmapParts undoes mapParts: unmaps the first mapped parts and frees the
// range.
func (g *Device) unmapParts(va uintptr, sizes []uintptr, mapped int) {
	at, total := va, uintptr(0)
	for i, s := range sizes {
		if i < mapped {
			g.d.MemUnmap(g.ctx, at, s)
		}
		at += s
		total += s
	}
	g.d.MemAddressFree(g.ctx, va, total)
}

// The Buf as a view source (gobackend.ContiguousView): its row is the
// whole allocation, Idle waits for the device.

func (b *Buf) RowBytes() uintptr { return b.size }
func (b *Buf) Origin() uintptr   { return 0 }
func (b *Buf) Idle()             { b.g.d.CtxSynchronize(b.g.ctx) }

func (b *Buf) ExportFD() (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return -1, fmt.Errorf("the buffer was freed")
	}
	return b.g.d.MemExportFD(b.g.ctx, b.h)
}

func (b *Buf) MapRows(rank int, fds []int) (uintptr, func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return 0, nil, fmt.Errorf("the buffer was freed")
	}
	g := b.g
	hs := make([]cuda.AllocHandle, len(fds))
	var imported []cuda.AllocHandle
	release := func() {
		for _, h := range imported {
			g.d.MemRelease(g.ctx, h)
		}
	}
	for r, fd := range fds {
		if r == rank {
			hs[r] = b.h
			continue
		}
		h, err := g.d.MemImportFD(g.ctx, fd)
		if err != nil {
			release()
			return 0, nil, fmt.Errorf("import rank %d's buffer: %w", r, err)
		}
		hs[r] = h
		imported = append(imported, h)
	}
	rows := slices.Repeat([]uintptr{b.size}, len(hs))
	va, err := g.mapParts(hs, rows)
	if err != nil {
		release()
		return 0, nil, err
	}
	return va, func() { g.unmapParts(va, rows, len(hs)); release() }, nil
}

// Segments of torch's caching allocator for communication buffers
// (ProcessGroup.allocate_tensor, which FSDP2 asks for with
// set_allocate_memory_from_process_group_for_comm: a torch MemPool whose
// allocator is gosym_pool_alloc/free, as ProcessGroupNCCL's is ncclMemAlloc).
// Each segment is a Buf, registered implicitly like gosym.empty's, and found
// again by its address when torch gives it back; torch caches and reuses
// segments in stream order, so a buffer the direct path binds once serves
// every later op that the caching allocator places in it.
var segments struct {
	sync.Mutex
	bufs map[uintptr]*Buf
}

// AllocSegment allocates a segment of at least n bytes on device for
// torch's caching allocator and returns its address.
func AllocSegment(device, n int) (uintptr, error) {
	b, err := Alloc(device, n)
	if err != nil {
		return 0, err
	}
	segments.Lock()
	defer segments.Unlock()
	if segments.bufs == nil {
		segments.bufs = map[uintptr]*Buf{}
	}
	segments.bufs[b.va] = b
	return b.va, nil
}

// FreeSegment frees the segment at addr (AllocSegment's); the device is idle
// when it returns (Buf.Free).
func FreeSegment(addr uintptr) error {
	segments.Lock()
	b := segments.bufs[addr]
	delete(segments.bufs, addr)
	segments.Unlock()
	if b == nil {
		return status.Errorf(status.InvalidArg, "gosym: %#x is not a segment of gosym's allocator", addr)
	}
	return b.Free()
}

// Segments is how many segments are live (tests).
func Segments() int {
	segments.Lock()
	defer segments.Unlock()
	return len(segments.bufs)
}
