package memreg

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/shm"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// Binder is an endpoint's side of lazy registration (coll.Direct): which of
// this rank's shareable regions are bound to the group, and the peer-mapping
// cache of the peers' bound regions, keyed by (peer, region id). Region ids
// are never reused in a process, so a peer that frees and reallocates at
// the same address shows up as a new id (a miss), never as a stale hit; the
// old id reaches us in the peer's retired list and its mapping is dropped.
type Binder struct {
	rank int
	mesh *comm.Mesh
	dom  *Domain

	mu      sync.Mutex
	own     map[uint64]*Memh // this rank's regions seen by ops, by id
	peers   map[peerKey]*peerMap
	retired []uint64 // this rank's ids unbound since the last op
	closed  bool

	created, reused, released atomic.Int64 // bindings of this rank's regions
	hits, misses, dropped     atomic.Int64 // the peer-mapping cache
	pinned                    atomic.Int64 // pins held by ops now (0 between ops)
}

type peerKey struct {
	peer int
	id   uint64
}

// peerMap is this rank's mapping of a peer's bound region. Ops pin it
// from their map step to their release step; a mapping retired (or
// replaced) while pinned leaves the cache at once and is unmapped by its
// last release.
type peerMap struct {
	region *shm.Region
	base   uintptr // where the peer's memh starts in region
	pins   int     // ops using it now; under Binder.mu
	gone   bool    // no longer in the cache; under Binder.mu
}

// NewBinder binds this process's regions (Default) to the group of rank
// over mesh, its links.
func NewBinder(rank int, mesh *comm.Mesh) *Binder {
	return &Binder{rank: rank, mesh: mesh, dom: Default, own: map[uint64]*Memh{}, peers: map[peerKey]*peerMap{}}
}

// Locate implements coll.Direct.
func (b *Binder) Locate(addr uintptr, n int) (id, off uint64, fresh bool) {
	m, ok := b.dom.Find(addr, n)
	if !ok || !m.Shareable() || m.Mode() != Export {
		if ok {
			dlog.Printf("rank %d: registered buffer %#x+%d is not shareable; staging it", b.rank, addr, n)
		}
		return 0, 0, false
	}
	_, bound := m.Binding(b)
	b.mu.Lock()
	b.own[m.ID()] = m
	b.mu.Unlock()
	if bound {
		b.reused.Add(1)
	}
	return m.ID(), uint64(addr - m.LocalAddress()), !bound
}

// Retired implements coll.Direct.
func (b *Binder) Retired(most int) []uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(most, len(b.retired))
	if n == 0 {
		return nil
	}
	out := append([]uint64(nil), b.retired[:n]...)
	b.retired = b.retired[n:]
	return out
}

// Forget implements coll.Direct.
func (b *Binder) Forget(r int, ids []uint64) {
	var drop []*peerMap
	b.mu.Lock()
	for _, id := range ids {
		if pm, ok := b.peers[peerKey{r, id}]; ok {
			delete(b.peers, peerKey{r, id})
			b.dropped.Add(1)
			if b.detach(pm) {
				drop = append(drop, pm)
			}
		}
	}
	b.mu.Unlock()
	for _, pm := range drop {
		pm.region.Close()
	}
}

// detach takes pm out of the cache (the caller removed its key) and says
// whether it may be unmapped now; a pinned mapping waits for its last
// release. Called with b.mu held.
func (b *Binder) detach(pm *peerMap) bool {
	pm.gone = true
	return pm.pins == 0
}

// Exchange implements coll.Direct: this rank sends its fresh region's memfd
// (a duplicate) to every peer over the authenticated links, then maps each
// peer's fresh region.
func (b *Binder) Exchange(fresh []uint64, deadline time.Time) error {
	me := b.rank
	var firstErr error
	if id := fresh[me]; id != 0 {
		b.mu.Lock()
		m := b.own[id]
		b.mu.Unlock()
		if err := b.send(m, id, deadline); err != nil {
			firstErr = err
		}
	}
	for r, id := range fresh {
		if r == me || id == 0 {
			continue
		}
		if err := b.receive(r, id, deadline); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// BindFault, when set (tests only), can fail a binding step: "share"
// (the exporter cannot share its region) or "map" (an importer cannot map
// a peer's). Both keep the link protocol in step, as real failures do.
var BindFault func(step string, rank int) error

func (b *Binder) fault(step string) error {
	if f := BindFault; f != nil {
		return f(step, b.rank)
	}
	return nil
}

func (b *Binder) send(m *Memh, id uint64, deadline time.Time) error {
	msg := make([]byte, 32)
	binary.LittleEndian.PutUint64(msg, id)
	var fds []int
	if m != nil && b.fault("share") == nil {
		if fd, size, _, off, ok := m.Share(); ok {
			defer unix.Close(fd)
			binary.LittleEndian.PutUint64(msg[8:], uint64(size))
			binary.LittleEndian.PutUint64(msg[16:], uint64(off))
			binary.LittleEndian.PutUint64(msg[24:], uint64(m.Len()))
			fds = []int{fd}
		}
	}
	var firstErr error
	for _, l := range b.mesh.Links {
		if l != nil {
			if err := l.Send(msg, fds, deadline); err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	if fds == nil && firstErr == nil {
		firstErr = fmt.Errorf("region %d is no longer shareable", id)
	}
	return firstErr
}

func (b *Binder) receive(r int, id uint64, deadline time.Time) error {
	msg, fds, err := b.mesh.Links[r].Recv(deadline)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	if len(msg) != 32 || le.Uint64(msg) != id || len(fds) != 1 {
		return status.Errorf(status.Peer, "gosym: rank %d did not send region %d", r, id)
	}
	size, off, n := int(le.Uint64(msg[8:])), int(le.Uint64(msg[16:])), int(le.Uint64(msg[24:]))
	if size <= 0 || off < 0 || n <= 0 || off+n > size {
		return status.Errorf(status.Peer, "gosym: rank %d sent region %d with a bad layout", r, id)
	}
	if err := b.fault("map"); err != nil {
		return err
	}
	region, err := shm.MapFD(fds[0], size)
	if err != nil {
		return err
	}
	b.mu.Lock()
	old := b.peers[peerKey{r, id}]
	b.peers[peerKey{r, id}] = &peerMap{region: region, base: region.Addr() + uintptr(off)}
	unmapOld := old != nil && b.detach(old)
	b.mu.Unlock()
	b.misses.Add(1)
	if unmapOld {
		old.region.Close()
	}
	return nil
}

// Bound implements coll.Direct: every rank mapped region id, so bind it to
// this endpoint; unmapping it (or destroying the endpoint) retires it.
func (b *Binder) Bound(id uint64) {
	b.mu.Lock()
	m := b.own[id]
	b.mu.Unlock()
	if m == nil {
		return
	}
	_, added, err := m.Bind(b, id, func() {
		b.mu.Lock()
		if !b.closed {
			b.retired = append(b.retired, id)
		}
		delete(b.own, id)
		b.mu.Unlock()
		b.released.Add(1)
	})
	switch {
	case err != nil: // unmapped meanwhile: the peers' new mappings must go too
		b.mu.Lock()
		b.retired = append(b.retired, id)
		delete(b.own, id)
		b.mu.Unlock()
	case added:
		b.created.Add(1)
	}
}

// Acquire implements coll.Direct.
func (b *Binder) Acquire(r int, id uint64) (uintptr, func(), bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r == b.rank {
		if m := b.own[id]; m != nil {
			return m.LocalAddress(), func() {}, true
		}
		return 0, nil, false
	}
	pm := b.peers[peerKey{r, id}]
	if pm == nil {
		return 0, nil, false
	}
	pm.pins++
	b.pinned.Add(1)
	b.hits.Add(1)
	return pm.base, func() { b.unpin(pm) }, true
}

// unpin is the release of one Acquire; the last release of a mapping that
// left the cache unmaps it.
func (b *Binder) unpin(pm *peerMap) {
	b.mu.Lock()
	pm.pins--
	unmap := pm.gone && pm.pins == 0
	b.mu.Unlock()
	b.pinned.Add(-1)
	if unmap {
		pm.region.Close()
	}
}

// Close releases every binding of this endpoint and every peer mapping;
// it runs after the workers stopped and before the links close.
func (b *Binder) Close() {
	b.dom.UnbindAll(b)
	b.mu.Lock()
	b.closed = true
	peers := b.peers
	b.peers = map[peerKey]*peerMap{}
	b.own = map[uint64]*Memh{}
	b.mu.Unlock()
	for _, pm := range peers {
		pm.region.Close()
	}
}

// Stats counts bindings and the peer-mapping cache.
func (b *Binder) Stats() map[string]int64 {
	b.mu.Lock()
	n := len(b.peers)
	b.mu.Unlock()
	return map[string]int64{
		"bindings_created": b.created.Load(), "bindings_reused": b.reused.Load(),
		"bindings_released": b.released.Load(), "peer_maps": int64(n),
		"peer_map_hits": b.hits.Load(), "peer_map_misses": b.misses.Load(), "peer_map_dropped": b.dropped.Load(),
		"peer_map_pins": b.pinned.Load(),
	}
}
