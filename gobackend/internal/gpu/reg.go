package gpu

// CUDA registrations: the driver side of memreg's CUDA memhs (registrar)
// and a group's bindings of them (registry), used by the direct path
// (direct.go).
//
// A memh of CUDA memory resolves its allocation and legacy IPC handle once,
// at mem_map. The first direct op of a group that meets it publishes the
// handle in its agreement round; every rank maps it (cuIpcOpenMemHandle,
// into a cache keyed by (peer, memh id)) and votes; when all did, the
// exporter binds the memh to the group. From then on an op on it publishes
// only (id, addresses) and skips the vote: every peer is known to hold the
// mapping, so the op makes no driver call and one host round. Unmapping the
// memh removes the binding and queues its id; the next agreement round
// carries it to the peers, which drop their mappings once the device is
// idle. Memh ids are never reused, so memory freed and registered again at
// the same address is a new id: a miss, never a stale hit.
//
// VMM memory (gosym.empty's) has no legacy handle: its record says so, and
// the op that binds it sends its fd to every peer over the links instead
// (directSide.swapFresh); the rest is the same.

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/status"
)

func init() { memreg.Default.SetCUDA(registrar{}) }

// registrar implements memreg.CUDA over the driver, on the devices'
// primary contexts (torch's).
type registrar struct{}

// idList are the PCI addresses of this process's CUDA devices, by ordinal.
var idList = sync.OnceValues(func() ([]memreg.GPUID, error) {
	d, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	ids := make([]memreg.GPUID, n)
	for i := range ids {
		dev, err := d.Device(i)
		if err != nil {
			return nil, err
		}
		var v [3]int
		for j, a := range []cuda.Attribute{cuda.AttrPCIDomainID, cuda.AttrPCIBusID, cuda.AttrPCIDeviceID} {
			if v[j], err = d.DeviceAttribute(dev, a); err != nil {
				return nil, err
			}
		}
		ids[i] = memreg.GPUID{Domain: uint32(v[0]), Bus: uint32(v[1]), Device: uint32(v[2])}
	}
	return ids, nil
})

func (registrar) open(device int) (*Device, []memreg.GPUID, error) {
	g, err := Open(device)
	var ids []memreg.GPUID
	if err == nil {
		ids, err = idList()
	}
	if err != nil {
		return nil, nil, status.Wrap(status.NotSupported, err, "gosym: CUDA memory on cuda:%d", device)
	}
	return g, ids, nil
}

// Share implements memreg.CUDA.
func (r registrar) Share(device int, addr uintptr, n int) (*memreg.CUDAShare, string, error) {
	g, ids, err := r.open(device)
	if err != nil {
		return nil, "", err
	}
	if on, err := g.d.PointerAttribute(addr, cuda.PointerDeviceOrdinal); err == nil && int(on) != device {
		return nil, "", status.Errorf(status.InvalidArg, "gosym: mem_map on cuda:%d of memory that lives on cuda:%d", device, on)
	}
	private := func(format string, args ...any) (*memreg.CUDAShare, string, error) {
		why := fmt.Sprintf(format, args...)
		dlog.Printf("mem_map %#x+%d on cuda:%d is private: %s", addr, n, device, why)
		return nil, why, nil
	}
	if b := liveBuf(device, addr, n); b != nil { // gosym.empty's: one exportable VMM allocation
		return &memreg.CUDAShare{GPU: ids[device], Base: uint64(b.va), Size: uint64(b.size), VMM: true}, "", nil
	}
	base, size, err := g.d.AddressRange(g.ctx, addr)
	if err != nil {
		return private("not memory the CUDA driver knows (%v)", err)
	}
	if uint64(addr-base)+uint64(n) > uint64(size) {
		return private("the range runs past its allocation %#x+%d", base, size)
	}
	h, err := g.d.IpcGetMemHandle(g.ctx, base)
	if err != nil {
		// Other VMM memory (expandable segments) registers private: a range
		// may map several allocations, which torch remaps at will. The direct
		// path shares it per op all the same, as runs of pages (pages.go).
		return private("its allocation has no legacy IPC handle (%v): VMM memory not from gosym.empty (expandable segments, which collectives share as runs of pages) or managed memory", err)
	}
	return &memreg.CUDAShare{GPU: ids[device], Handle: h, Base: uint64(base), Size: uint64(size)}, "", nil
}

// vmmExport is a POSIX fd (the caller's to close) of the VMM allocation
// mapped at addr; it fails for memory not created exportable that way.
func (g *Device) vmmExport(addr uintptr) (int, error) {
	h, err := g.d.MemRetainAllocationHandle(g.ctx, addr)
	if err != nil {
		return -1, err
	}
	defer g.d.MemRelease(g.ctx, h)
	return g.d.MemExportFD(g.ctx, h)
}

// vmmOpen maps the VMM allocations that fds export (sizes[i] bytes of
// fds[i]; the fds stay the caller's) side by side in one range; the
// mapping holds the memory, even after its exporter frees it.
func (g *Device) vmmOpen(fds []int, sizes []uintptr) (uintptr, error) {
	hs := make([]cuda.AllocHandle, 0, len(fds))
	defer func() {
		for _, h := range hs {
			g.d.MemRelease(g.ctx, h)
		}
	}()
	for _, fd := range fds {
		h, err := g.d.MemImportFD(g.ctx, fd)
		if err != nil {
			return 0, err
		}
		hs = append(hs, h)
	}
	return g.mapParts(hs, sizes)
}

// Open implements memreg.CUDA.
func (r registrar) Open(device int, s *memreg.CUDAShare) (uintptr, error) {
	g, err := r.visible(device, s)
	if err != nil {
		return 0, err
	}
	va, err := g.d.IpcOpenMemHandle(g.ctx, cuda.IpcHandle(s.Handle), cuda.IpcLazyEnablePeerAccess)
	if err != nil {
		return 0, status.Wrap(status.System, err, "gosym: opening the IPC handle of an allocation of GPU %s on cuda:%d", s.GPU, device)
	}
	return va, nil
}

// ExportFD implements memreg.CUDA.
func (r registrar) ExportFD(device int, s *memreg.CUDAShare) (int, error) {
	g, _, err := r.open(device)
	if err != nil {
		return -1, err
	}
	fd, err := g.vmmExport(uintptr(s.Base))
	if err != nil {
		return -1, status.Wrap(status.System, err, "gosym: exporting the allocation %#x+%d on cuda:%d (freed?)", s.Base, s.Size, device)
	}
	return fd, nil
}

// OpenFD implements memreg.CUDA.
func (r registrar) OpenFD(device int, s *memreg.CUDAShare, fd int) (uintptr, error) {
	g, err := r.visible(device, s)
	if err != nil {
		return 0, err
	}
	va, err := g.vmmOpen([]int{fd}, []uintptr{uintptr(s.Size)})
	if err != nil {
		return 0, status.Wrap(status.System, err, "gosym: mapping a VMM allocation of GPU %s on cuda:%d", s.GPU, device)
	}
	return va, nil
}

// visible opens device, on which s, an allocation of another process, is
// to be mapped: its GPU must be one this process sees.
func (r registrar) visible(device int, s *memreg.CUDAShare) (*Device, error) {
	g, ids, err := r.open(device)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(ids, s.GPU) {
		return nil, status.Errorf(status.NotSupported,
			"gosym: the memory lives on GPU %s, which this process does not see (it sees %v): exporter and importer need the same GPUs visible",
			s.GPU, ids)
	}
	return g, nil
}

// Close implements memreg.CUDA: kernels may still use the mapping, so it
// waits for the device first.
func (r registrar) Close(device int, s *memreg.CUDAShare, base uintptr) error {
	g, _, err := r.open(device)
	if err != nil {
		return err
	}
	g.d.CtxSynchronize(g.ctx)
	if s.VMM {
		g.unmapParts(base, []uintptr{uintptr(s.Size)}, 1)
		return nil
	}
	return g.d.IpcCloseMemHandle(g.ctx, base)
}

// ---- a group's bindings ----------------------------------------------------------

// ipcMaps is what the direct path needs from the driver; Team provides
// it, tests fake it.
type ipcMaps interface {
	// ipcExport is the allocation holding addr and its IPC handle.
	ipcExport(addr uintptr) (base, size uintptr, h cuda.IpcHandle, err error)
	ipcOpen(h cuda.IpcHandle) (uintptr, error)
	ipcClose(va uintptr) error
	// vmmExport is a POSIX fd (the caller closes it) of the VMM allocation
	// mapped at addr; vmmOpen maps the allocations fds export (sizes[i]
	// bytes of fds[i]) side by side in one range; vmmClose undoes it.
	vmmExport(addr uintptr) (int, error)
	vmmOpen(fds []int, sizes []uintptr) (uintptr, error)
	vmmClose(va uintptr, sizes []uintptr) error
	// pageAt is the VMM allocation mapped at addr (paged memory): its
	// mapping's range and a retain of it (pageRelease releases it);
	// pageExport is a POSIX fd of a retained allocation.
	pageAt(addr uintptr) (base, size uintptr, h cuda.AllocHandle, err error)
	pageRetain(addr uintptr) (cuda.AllocHandle, error)
	pageRelease(h cuda.AllocHandle)
	pageExport(h cuda.AllocHandle) (int, error)
	// ipcIdle waits until the device no longer uses any mapping.
	ipcIdle() error
}

// peerMapping is a peer's memory mapped here: an allocation by its legacy
// IPC handle, or VMM allocations (parts: their sizes) imported from their
// fds and mapped side by side.
type peerMapping struct {
	va    uintptr
	parts []uintptr
}

func (m peerMapping) close(ipc ipcMaps) error {
	if m.parts != nil {
		return ipc.vmmClose(m.va, m.parts)
	}
	return ipc.ipcClose(m.va)
}

// peerKey names a peer's registered region: its rank and memh id.
type peerKey struct {
	peer int
	id   uint64
}

// registry is a group's CUDA bindings and peer mappings (one per endpoint,
// usable as its zero value). The queue runner uses it one op at a time;
// memreg's unmap callbacks (any thread) only append to retired.
type registry struct {
	dom  *memreg.Domain // the user's registrations; nil: memreg.Default
	bufs *memreg.Domain // the implicit ones of gosym.empty's buffers; nil: bufDomain

	mu      sync.Mutex
	retired []uint64                // this rank's ids unbound since the last agreement round
	refused map[uint64]bool         // this rank's memhs a vote failed for: published unshareable from then on
	peers   map[peerKey]peerMapping // a peer's registered allocation (by memh id), mapped here
	legacy  map[ipcKey]peerMapping  // a peer's allocation published per op (by handle), mapped here
	// held: the allocations published per op (by rank and handle) that a
	// vote found mapped by every rank; kept as long as legacy's mappings
	// (the group's life), so an op on them skips the vote. Built only from
	// agreed votes, it is the same set on every rank.
	held    map[ipcKey]bool
	pending []peerMapping // dropped mappings to close once the device is idle
	closed  bool
	runs    []*pageRun // this rank's runs of paged memory published to the group (pages.go)
	kept    []*pageRun // changed runs a captured op read: unpublished, held until the group goes
	nextRun uint64
	sweepAt int

	created, reused, released atomic.Int64 // bindings of this rank's memhs
	hits, misses, dropped     atomic.Int64 // the registered peer mappings
	regOps                    atomic.Int64 // direct ops on registered memory only
	runsMade, runsRetired     atomic.Int64 // this rank's runs of paged memory
	runsKept                  atomic.Int64
}

type ipcKey struct {
	peer int
	h    cuda.IpcHandle
}

func (g *registry) domains() (user, bufs *memreg.Domain) {
	user, bufs = g.dom, g.bufs
	if user == nil {
		user = memreg.Default
	}
	if bufs == nil {
		bufs = bufDomain
	}
	return user, bufs
}

// find is the registered CUDA memh of device that holds [lo, lo+n),
// shareable or not, or nil (GOSYM_ENABLE_UBR=no: always nil). implicit
// also looks among gosym.empty's buffers when the user registered none.
func (g *registry) find(lo, n uintptr, device int, implicit bool) *memreg.Memh {
	if n == 0 || memreg.UBRMode() == "no" {
		return nil
	}
	user, bufs := g.domains()
	if m := exportOn(user, lo, n, device); m != nil || !implicit {
		return m
	}
	return exportOn(bufs, lo, n, device)
}

// exportOn is d's EXPORT memh of device that holds [lo, lo+n), or nil.
func exportOn(d *memreg.Domain, lo, n uintptr, device int) *memreg.Memh {
	if m, ok := d.Find(lo, int(n)); ok && m.Mode() == memreg.Export && m.Device() == device {
		return m
	}
	return nil
}

func (g *registry) takeRetired(most int) []uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := min(most, len(g.retired))
	out := slices.Clone(g.retired[:n])
	g.retired = g.retired[n:]
	return out
}

func (g *registry) isRefused(id uint64) bool { return marked(g, &g.refused, id) }

// marked says whether k is in the registry's set *set.
func marked[K comparable](g *registry, set *map[K]bool, k K) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return (*set)[k]
}

// mark adds k to the registry's set *set.
func mark[K comparable](g *registry, set *map[K]bool, k K) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *set == nil {
		*set = map[K]bool{}
	}
	(*set)[k] = true
}

func (g *registry) retire(id uint64) {
	g.mu.Lock()
	if !g.closed {
		g.retired = append(g.retired, id)
	}
	g.mu.Unlock()
}

// bind records that every rank mapped this rank's memh m; unmapping it (or
// closing the group) retires it.
func (g *registry) bind(m *memreg.Memh) {
	id := m.ID()
	_, added, err := m.Bind(g, id, func() { g.retire(id); g.released.Add(1) })
	switch {
	case err != nil: // unmapped meanwhile: the peers' new mappings must go too
		g.retire(id)
	case added:
		g.created.Add(1)
	}
}

func (g *registry) refuse(id uint64) { mark(g, &g.refused, id) }

// openPeer maps rank r's registered allocation (memh id), from the cache
// or by open.
func (g *registry) openPeer(r int, id uint64, open func() (peerMapping, error)) (uintptr, error) {
	va, hit, err := cachedOpen(g, &g.peers, peerKey{r, id}, 0, open)
	tally(hit, err, &g.hits, &g.misses)
	return va, err
}

// openLegacy maps rank r's allocation published per op, from the cache
// (keyed by handle: an allocation freed and replaced at the same address
// has another) or by opening it; at most maxIPC of them.
func (g *registry) openLegacy(ipc ipcMaps, c *Counters, r int, h cuda.IpcHandle) (uintptr, error) {
	va, hit, err := cachedOpen(g, &g.legacy, ipcKey{r, h}, maxIPC, func() (peerMapping, error) {
		va, err := ipc.ipcOpen(h)
		return peerMapping{va: va}, err
	})
	tally(hit, err, &c.ipcHits, &c.ipcOpens)
	return va, err
}

// isHeld says whether every rank holds allocation k mapped (held).
func (g *registry) isHeld(k ipcKey) bool { return marked(g, &g.held, k) }

// hold records that every rank mapped allocation k (an agreed vote).
func (g *registry) hold(k ipcKey) { mark(g, &g.held, k) }

// cachedOpen is the mapping cached under k in *cache, or else open's,
// stored there (at most limit entries; 0: no limit).
func cachedOpen[K comparable](g *registry, cache *map[K]peerMapping, k K, limit int, open func() (peerMapping, error)) (va uintptr, hit bool, err error) {
	g.mu.Lock()
	m, hit := (*cache)[k]
	n := len(*cache)
	g.mu.Unlock()
	switch {
	case hit:
		return m.va, true, nil
	case limit > 0 && n >= limit:
		return 0, false, fmt.Errorf("%d peer allocations are mapped already", n)
	}
	if m, err = open(); err != nil {
		return 0, false, err
	}
	g.mu.Lock()
	if *cache == nil {
		*cache = map[K]peerMapping{}
	}
	(*cache)[k] = m
	g.mu.Unlock()
	return m.va, false, nil
}

func tally(hit bool, err error, hits, misses *atomic.Int64) {
	switch {
	case err != nil:
	case hit:
		hits.Add(1)
	default:
		misses.Add(1)
	}
}

// forget drops this rank's mappings of rank r's memhs ids. Kernels enqueued
// earlier may still read them, so they are closed once the device is idle:
// now, or, while a CUDA graph is being captured (no synchronising then), at
// the next op that is not, or when the group goes.
func (g *registry) forget(ipc ipcMaps, capturing bool, r int, ids []uint64) {
	g.mu.Lock()
	for _, id := range ids {
		if m, ok := g.peers[peerKey{r, id}]; ok {
			delete(g.peers, peerKey{r, id})
			g.pending = append(g.pending, m)
			g.dropped.Add(1)
		}
	}
	g.mu.Unlock()
	if !capturing {
		g.flush(ipc)
	}
}

// flush closes the dropped mappings after waiting for the device.
func (g *registry) flush(ipc ipcMaps) {
	g.mu.Lock()
	ms := g.pending
	g.pending = nil
	g.mu.Unlock()
	if len(ms) == 0 {
		return
	}
	if err := ipc.ipcIdle(); err != nil {
		dlog.Printf("waiting for the device before closing %d peer mappings: %v", len(ms), err)
	}
	closeAll(ipc, ms)
}

func closeAll(ipc ipcMaps, ms []peerMapping) {
	for _, m := range ms {
		if err := m.close(ipc); err != nil {
			dlog.Printf("closing the peer mapping at %#x: %v", m.va, err)
		}
	}
}

// close removes this group's bindings from every memh and closes every
// mapping; the device is idle (Team.close waited).
func (g *registry) close(ipc ipcMaps) {
	g.mu.Lock()
	g.closed = true
	g.retired = nil
	g.mu.Unlock()
	user, bufs := g.domains()
	user.UnbindAll(g)
	bufs.UnbindAll(g)
	g.closeRuns(ipc)
	g.mu.Lock()
	ms := g.pending
	for _, m := range g.peers {
		ms = append(ms, m)
	}
	for _, m := range g.legacy {
		ms = append(ms, m)
	}
	g.pending, g.peers, g.legacy, g.held = nil, nil, nil, nil
	g.mu.Unlock()
	closeAll(ipc, ms)
}

func (g *registry) stats(m map[string]any) {
	g.mu.Lock()
	n := len(g.peers)
	g.mu.Unlock()
	m["gpu_bindings_created"] = g.created.Load()
	m["gpu_bindings_reused"] = g.reused.Load()
	m["gpu_bindings_released"] = g.released.Load()
	m["gpu_peer_maps"] = int64(n)
	m["gpu_peer_map_hits"] = g.hits.Load()
	m["gpu_peer_map_misses"] = g.misses.Load()
	m["gpu_peer_map_dropped"] = g.dropped.Load()
	m["gpu_reg_direct_ops"] = g.regOps.Load()
	m["gpu_page_runs_made"] = g.runsMade.Load()
	m["gpu_page_runs_retired"] = g.runsRetired.Load()
	m["gpu_page_runs_kept"] = g.runsKept.Load()
}
