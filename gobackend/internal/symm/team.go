package symm

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/host"
	"github.com/gosym/gosym/gobackend/internal/status"
	"golang.org/x/sys/unix"
)

// Team is one rank's view of a group's symmetric host memory: its own
// control and data regions and the peers' ones, mapped.
type Team struct {
	L    Layout
	Rank int
	Mesh *comm.Mesh
	Spin time.Duration // how long a wait polls before it sleeps on a futex

	ctrl, data []*host.Region // indexed by rank
	aborted    atomic.Bool    // set by Abort: every wait fails at once
	step       uint32         // barriers this rank has entered
}

// Who names the operation a wait belongs to, for error messages.
type Who struct {
	Op  string
	Seq uint64
}

func (w Who) String() string { return fmt.Sprintf("%s (seq %d)", w.Op, w.Seq) }

// NewTeam allocates this rank's regions, exchanges them with every peer
// over the mesh and maps the peers' regions.
func NewTeam(m *comm.Mesh, l Layout, name string, deadline time.Time) (t *Team, err error) {
	world := len(m.Peers)
	t = &Team{L: l, Rank: m.Rank, Mesh: m, Spin: 20 * time.Microsecond,
		ctrl: make([]*host.Region, world), data: make([]*host.Region, world)}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if t.ctrl[t.Rank], err = host.NewRegion(name+":ctrl", l.CtrlBytes); err != nil {
		return nil, err
	}
	if t.data[t.Rank], err = host.NewRegion(name+":data", l.DataBytes); err != nil {
		return nil, err
	}
	hdr := t.ctrl[t.Rank].Bytes()
	binary.LittleEndian.PutUint32(hdr[0:], ctrlMagic)
	binary.LittleEndian.PutUint32(hdr[4:], ctrlVersion)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(world))

	msg := make([]byte, 16)
	binary.LittleEndian.PutUint64(msg[0:], uint64(l.CtrlBytes))
	binary.LittleEndian.PutUint64(msg[8:], uint64(l.DataBytes))
	fds := []int{t.ctrl[t.Rank].FD(), t.data[t.Rank].FD()}
	for _, link := range m.Links {
		if link != nil {
			if err := link.Send(msg, fds, deadline); err != nil {
				return nil, status.Wrap(status.Peer, err, "share regions")
			}
		}
	}
	for r, link := range m.Links {
		if link == nil {
			continue
		}
		if err := t.mapPeer(r, link, msg, deadline); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *Team) mapPeer(r int, link *comm.Link, want []byte, deadline time.Time) error {
	got, fds, err := link.Recv(deadline)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return status.Wrap(status.Peer, err, "regions of rank %d", r)
	}
	if len(fds) != 2 || string(got) != string(want) {
		return status.Errorf(status.Peer, "rank %d sent %d fds and a region layout unlike this rank's", r, len(fds))
	}
	if t.ctrl[r], err = host.MapFD(fds[0], t.L.CtrlBytes); err != nil {
		return status.Wrap(status.System, err, "map control region of rank %d", r)
	}
	if t.data[r], err = host.MapFD(fds[1], t.L.DataBytes); err != nil {
		return status.Wrap(status.System, err, "map data region of rank %d", r)
	}
	hdr := t.ctrl[r].Bytes()
	if binary.LittleEndian.Uint32(hdr) != ctrlMagic || binary.LittleEndian.Uint32(hdr[8:]) != uint32(len(t.ctrl)) {
		return status.Errorf(status.Peer, "control region of rank %d has a bad header", r)
	}
	return nil
}

// Close marks this rank closed for the peers, wakes them, and unmaps
// everything. Safe to call more than once.
func (t *Team) Close() {
	if own := t.ctrl[t.Rank]; own != nil {
		atomic.StoreUint32(own.Word32(offClosed), 1)
		t.wake(own.Word32(offStep))
	}
	for r := range t.ctrl {
		for _, reg := range []*host.Region{t.ctrl[r], t.data[r]} {
			if reg != nil {
				reg.Close()
			}
		}
		t.ctrl[r], t.data[r] = nil, nil
	}
}

// StageBytes is the size of one staging half.
func (t *Team) StageBytes() int { return t.L.StageBytes }

// Abort makes every current and future wait of this team fail with
// status.Closed, so workers drain before the memory is unmapped.
func (t *Team) Abort() { t.aborted.Store(true) }

// World is the group size.
func (t *Team) World() int { return len(t.ctrl) }

// Stage is the address of rank r's staging half h.
func (t *Team) Stage(r, h int) uintptr { return t.data[r].Addr() + uintptr(t.L.stageOff(h)) }

// NextHalf is the staging half (and sync slot) of the next barrier.
func (t *Team) NextHalf() int { return int((t.step + 1) & 1) }

// Barrier publishes meta in this rank's sync slot for the next barrier,
// waits for every rank to arrive, and returns every rank's slot contents
// copied out (snapshots: a slot is never read again after the next
// barrier). meta may be nil; then nothing is published or returned.
func (t *Team) Barrier(meta []byte, who Who, deadline time.Time) ([][]byte, error) {
	h := t.NextHalf()
	if len(meta) > t.L.SlotBytes {
		return nil, status.Errorf(status.Internal, "%s: metadata of %d bytes exceeds the sync slot", who, len(meta))
	}
	if meta != nil {
		copy(t.ctrl[t.Rank].Bytes()[t.L.slotOff(h):], meta)
	}
	t.step++
	target := t.step
	t.store(t.ctrl[t.Rank].Word32(offStep), target)
	for r := range t.ctrl {
		if r == t.Rank {
			continue
		}
		if err := t.waitGE(r, t.ctrl[r].Word32(offStep), target, who, deadline); err != nil {
			return nil, t.barrierError(err, target, who)
		}
	}
	if meta == nil {
		return nil, nil
	}
	metas := make([][]byte, len(t.ctrl))
	for r := range t.ctrl {
		off := t.L.slotOff(h)
		metas[r] = append([]byte(nil), t.ctrl[r].Bytes()[off:off+len(meta)]...)
	}
	return metas, nil
}

// PeekSlot returns rank r's live sync slot of parity h. Only tests use it:
// collectives read slots solely through Barrier's snapshots.
func (t *Team) PeekSlot(r, h int) []byte {
	off := t.L.slotOff(h)
	return t.ctrl[r].Bytes()[off : off+t.L.SlotBytes]
}

// barrierError names every rank that had not arrived.
func (t *Team) barrierError(err error, target uint32, who Who) error {
	if status.CodeOf(err) != status.Timeout {
		return err
	}
	var missing []int
	for r := range t.ctrl {
		if r != t.Rank && !ge(atomic.LoadUint32(t.ctrl[r].Word32(offStep)), target) {
			missing = append(missing, r)
		}
	}
	return status.Errorf(status.Timeout, "gosym: %s timed out waiting for ranks %v (rank %d, group of %d)",
		who, missing, t.Rank, len(t.ctrl))
}

// ge is serial-number comparison: a is at or after b, wrapping at 2^32.
func ge(a, b uint32) bool { return int32(a-b) >= 0 }

func (t *Team) store(w *uint32, v uint32) {
	atomic.StoreUint32(w, v)
	t.wake(w)
}

// wake wakes sleepers on a word of this rank's own control region, if any.
func (t *Team) wake(w *uint32) {
	if atomic.LoadUint32(t.ctrl[t.Rank].Word32(offWaiters)) != 0 {
		host.FutexWake(w)
	}
}

// sleepSlice bounds one futex sleep so that deadlines, dead peers and
// closed endpoints are noticed promptly.
const sleepSlice = 10 * time.Millisecond

// waitGE waits until *w (a word in rank r's control region) reaches
// target: it polls for t.Spin, then sleeps on the futex. It fails when the
// deadline passes, r exits, or r closes its endpoint.
func (t *Team) waitGE(r int, w *uint32, target uint32, who Who, deadline time.Time) error {
	if ge(atomic.LoadUint32(w), target) {
		return nil
	}
	spinEnd := time.Now().Add(t.Spin)
	for i := 1; ; i++ {
		if ge(atomic.LoadUint32(w), target) {
			return nil
		}
		if i&255 == 0 {
			if time.Now().After(spinEnd) || t.aborted.Load() {
				break
			}
			runtime.Gosched()
		}
	}
	waiters := t.ctrl[r].Word32(offWaiters)
	atomic.AddUint32(waiters, 1)
	defer atomic.AddUint32(waiters, ^uint32(0))
	closed := t.ctrl[r].Word32(offClosed)
	for {
		v := atomic.LoadUint32(w)
		if ge(v, target) {
			return nil
		}
		if t.aborted.Load() {
			return status.Errorf(status.Closed, "gosym: %s: the group was destroyed on rank %d", who, t.Rank)
		}
		if atomic.LoadUint32(closed) != 0 {
			return status.Errorf(status.Peer, "gosym: %s: rank %d destroyed the group while rank %d waited for it", who, r, t.Rank)
		}
		now := time.Now()
		if now.After(deadline) {
			return status.Errorf(status.Timeout, "gosym: %s timed out waiting for rank %d", who, r)
		}
		if dead := t.Mesh.Dead(); len(dead) > 0 {
			return status.Errorf(status.Peer, "gosym: %s failed: ranks %v exited (rank %d waited for rank %d)", who, dead, t.Rank, r)
		}
		host.FutexWait(w, v, min(sleepSlice, deadline.Sub(now)))
	}
}
