package symm

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/shm"
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

	ctrl, data []*shm.Region // indexed by rank
	aborted    atomic.Bool   // set by Abort: every wait fails at once
	step       uint32        // barriers this rank has entered
	pub        uint32        // publications this rank has made (slot sequence number)
	stalls     atomic.Int64  // publications that waited for a peer to copy out a slot
	posted     []int         // Sign's answer, reused: no allocation per collective
}

// Who names the operation a wait belongs to, for error messages.
type Who struct {
	Op  string
	Seq uint64
}

func (w Who) String() string { return fmt.Sprintf("%s (seq %d)", w.Op, w.Seq) }

// NewTeam allocates this rank's regions, exchanges them with every peer
// over the mesh and maps the peers' regions.
func NewTeam(m *comm.Mesh, l Layout, name string, deadline time.Time) (_ *Team, err error) {
	world := len(m.Peers)
	t := &Team{L: l, Rank: m.Rank, Mesh: m, Spin: 20 * time.Microsecond,
		ctrl: make([]*shm.Region, world), data: make([]*shm.Region, world)}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if t.ctrl[t.Rank], err = shm.NewRegion(name+":ctrl", l.CtrlBytes); err != nil {
		return nil, err
	}
	if t.data[t.Rank], err = shm.NewRegion(name+":data", l.DataBytes); err != nil {
		return nil, err
	}
	hdr := t.ctrl[t.Rank].Bytes()
	binary.LittleEndian.PutUint32(hdr[0:], ctrlMagic)
	binary.LittleEndian.PutUint32(hdr[4:], ctrlVersion)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(world))
	binary.LittleEndian.PutUint32(hdr[12:], uint32(l.Slots))

	// Every rank sends, then reads every peer's message even after a failure:
	// a rank that gives up with unread messages queued resets its links
	// (ECONNRESET for their senders), and a send that fails (a peer that
	// gave up) must not hide what that peer sent first. So every rank names
	// a setting that differs, not a broken link, whichever rank found it.
	msg := l.encode()
	fds := []int{t.ctrl[t.Rank].FD(), t.data[t.Rank].FD()}
	var sendErr error
	for r, link := range m.Links {
		if link != nil {
			if err := link.Send(msg, fds, deadline); err != nil && sendErr == nil {
				sendErr = status.Wrap(status.Peer, err, "share regions with rank %d", r)
			}
		}
	}
	var mapErr error
	for r, link := range m.Links {
		if link == nil {
			continue
		}
		if err := t.mapPeer(r, link, deadline); err != nil && (mapErr == nil || status.CodeOf(err) == status.Mismatch && status.CodeOf(mapErr) != status.Mismatch) {
			mapErr = err
		}
	}
	switch {
	case mapErr != nil && status.CodeOf(mapErr) == status.Mismatch:
		return nil, mapErr
	case sendErr != nil:
		return nil, sendErr
	case mapErr != nil:
		return nil, mapErr
	}
	return t, nil
}

func (t *Team) mapPeer(r int, link *comm.Link, deadline time.Time) error {
	got, fds, err := link.Recv(deadline)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return status.Wrap(status.Peer, err, "regions of rank %d", r)
	}
	if err := t.L.agree(r, got); err != nil {
		return err
	}
	if len(fds) != 2 {
		return status.Errorf(status.Peer, "rank %d sent %d fds for its regions, not 2", r, len(fds))
	}
	if t.ctrl[r], err = shm.MapFD(fds[0], t.L.CtrlBytes); err != nil {
		return status.Wrap(status.System, err, "map control region of rank %d", r)
	}
	if t.data[r], err = shm.MapFD(fds[1], t.L.DataBytes); err != nil {
		return status.Wrap(status.System, err, "map data region of rank %d", r)
	}
	hdr := t.ctrl[r].Bytes()
	le := binary.LittleEndian
	if le.Uint32(hdr) != ctrlMagic || le.Uint32(hdr[4:]) != ctrlVersion || le.Uint32(hdr[8:]) != uint32(len(t.ctrl)) ||
		le.Uint32(hdr[12:]) != uint32(t.L.Slots) {
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
		for _, reg := range []*shm.Region{t.ctrl[r], t.data[r]} {
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
func (t *Team) Abort() {
	t.aborted.Store(true)
	if own := t.ctrl[t.Rank]; own != nil {
		b := own.Word32(offBell)
		atomic.AddUint32(b, 1)
		shm.FutexWake(b) // WaitBell returns
	}
}

// Closed reports whether rank r destroyed its endpoint (marked its control
// region closed): a peer that exited after that left the group cleanly.
func (t *Team) Closed(r int) bool { return atomic.LoadUint32(t.ctrl[r].Word32(offClosed)) != 0 }

// Aborted reports whether Abort was called.
func (t *Team) Aborted() bool { return t.aborted.Load() }

// The bell: a peer that needs this rank's engine to act on its own (the
// CUDA p2p channel's responder, say) rings it; the owner's listener sleeps
// on it without counting as a waiter, so that the hot path's stores never
// pay for a futex wake on its account. Each peer's rings are counted in a
// word of its own, so the listener knows who rang.

// Ring rings peer d's bell on behalf of this rank.
func (t *Team) Ring(d int) {
	atomic.AddUint32(t.ctrl[d].Word32(t.L.bellsOff(t.Rank)), 1)
	b := t.ctrl[d].Word32(offBell)
	atomic.AddUint32(b, 1)
	shm.FutexWake(b)
}

// Bell is this rank's bell word: read it before Rings, then WaitBell on
// the value, and no ring is missed.
func (t *Team) Bell() uint32 { return atomic.LoadUint32(t.ctrl[t.Rank].Word32(offBell)) }

// Rings stores into n, per peer, how often it rang this rank.
func (t *Team) Rings(n []uint32) {
	own := t.ctrl[t.Rank]
	for r := range n {
		n[r] = atomic.LoadUint32(own.Word32(t.L.bellsOff(r)))
	}
}

// WaitBell sleeps until the bell is no longer seen, for at most d.
func (t *Team) WaitBell(seen uint32, d time.Duration) {
	shm.FutexWait(t.ctrl[t.Rank].Word32(offBell), seen, d)
}

// World is the group size.
func (t *Team) World() int { return len(t.ctrl) }

// Stage is the address of rank r's staging half h.
func (t *Team) Stage(r, h int) uintptr { return t.data[r].Addr() + uintptr(t.L.stageOff(h)) }

// NextHalf is the staging half of the next barrier.
func (t *Team) NextHalf() int { return int((t.step + 1) & 1) }

// Barrier waits for every rank to arrive. With meta (nil: a plain barrier)
// it is also an allgather through the sync slots: this rank writes meta as
// its next publication s into slot s mod N, and Barrier returns copies of
// every rank's publication s. Those copies are all anyone ever reads: right
// after taking them a rank tells the peers it is done with publication s
// (its snapped word), and nothing reads a slot after its barrier (the UCC
// alltoallv race: a slot read later may hold another op's metadata).
//
// Reuse is guarded, not assumed: a rank writes publication s only once every
// peer has snapped s-N, so at most N publications are in flight and no rank
// loses a slot it has not copied, whatever the ops do between barriers. With
// N >= 2 that wait never blocks in this engine: a rank publishes s+2 only
// after passing the barrier of s+1, and every peer arrived there after
// copying s. (With N = 1, a rank would wait at each op for the slowest
// peer's copy.) Publications are one per op (its metadata barrier) plus one
// per bind or setup vote, the same sequence on every rank.
func (t *Team) Barrier(meta []byte, who Who, deadline time.Time) ([][]byte, error) {
	if len(meta) > t.L.SlotBytes {
		return nil, status.Errorf(status.Internal, "%s: metadata of %d bytes exceeds the sync slot", who, len(meta))
	}
	var s uint32
	if meta != nil {
		var err error
		if s, err = t.publish(meta, who, deadline); err != nil {
			return nil, err
		}
	}
	t.step++
	t.store(t.ctrl[t.Rank].Word32(offStep), t.step)
	if err := t.waitAll(offStep, t.step, who, deadline, nil); err != nil {
		return nil, err
	}
	if meta == nil {
		return nil, nil
	}
	return t.collect(s, len(meta), who)
}

// publish writes meta as this rank's next publication, once every peer is
// done with the one that used its slot before.
func (t *Team) publish(meta []byte, who Who, deadline time.Time) (uint32, error) {
	s := t.pub + 1
	prev := s - uint32(t.L.Slots) // the slot's previous publication
	for r := range t.ctrl {
		if r != t.Rank && !ge(atomic.LoadUint32(t.ctrl[r].Word32(offSnapped)), prev) {
			t.stalls.Add(1)
			break
		}
	}
	what := func() string { // only a timeout formats it: the common path allocates nothing here
		return fmt.Sprintf(" to copy out sync slot %d (publication %d)", prev%uint32(t.L.Slots), prev)
	}
	if err := t.waitAll(offSnapped, prev, who, deadline, what); err != nil {
		return 0, err
	}
	own := t.ctrl[t.Rank]
	copy(own.Bytes()[t.L.bodyOff(s):], meta)
	atomic.StoreUint32(own.Word32(t.L.stampOff(s)), s) // after the body: readers check it
	t.pub = s
	return s, nil
}

// collect copies n bytes of every rank's publication s out of the slots,
// then releases this rank's claim on them.
func (t *Team) collect(s uint32, n int, who Who) ([][]byte, error) {
	metas := make([][]byte, len(t.ctrl))
	buf := make([]byte, n*len(t.ctrl)) // one allocation for every copy
	for r, reg := range t.ctrl {
		if got := atomic.LoadUint32(reg.Word32(t.L.stampOff(s))); got != s {
			return nil, status.Errorf(status.Internal, "gosym: %s: rank %d's sync slot %d holds publication %d, not %d",
				who, r, s%uint32(t.L.Slots), got, s)
		}
		off := t.L.bodyOff(s)
		metas[r] = buf[r*n : (r+1)*n : (r+1)*n]
		copy(metas[r], reg.Bytes()[off:off+n])
	}
	t.store(t.ctrl[t.Rank].Word32(offSnapped), s)
	return metas, nil
}

// Slots is N, the number of sync slots of every rank.
func (t *Team) Slots() int { return t.L.Slots }

// Published is this rank's slot sequence number: the publications it made.
// Only the goroutine running the team's collectives may call it.
func (t *Team) Published() uint32 { return t.pub }

// SlotStalls counts publications that had to wait for a peer to copy out
// the slot's previous publication (0 in this engine when N >= 2).
func (t *Team) SlotStalls() int64 { return t.stalls.Load() }

// PeekSlot returns the live stamp and metadata of rank r's slot for
// publication s (which may by now hold a later one). Only tests use it:
// collectives read slots solely through Barrier's copies.
func (t *Team) PeekSlot(r int, s uint32) (stamp uint32, meta []byte) {
	off := t.L.bodyOff(s)
	return atomic.LoadUint32(t.ctrl[r].Word32(t.L.stampOff(s))), t.ctrl[r].Bytes()[off : off+t.L.SlotBytes]
}

// waitAll waits until word off of every peer's control region reaches
// target; a timeout names every rank that had not got there, and what (if
// not nil) says what they were waited for.
func (t *Team) waitAll(off int, target uint32, who Who, deadline time.Time, what func() string) error {
	for r := range t.ctrl {
		if r == t.Rank {
			continue
		}
		err := t.waitGE(r, t.ctrl[r].Word32(off), target, who, deadline, false)
		if err == nil {
			continue
		}
		if status.CodeOf(err) != status.Timeout {
			return err
		}
		var missing []int
		for q := range t.ctrl {
			if q != t.Rank && !ge(atomic.LoadUint32(t.ctrl[q].Word32(off)), target) {
				missing = append(missing, q)
			}
		}
		detail := ""
		if what != nil {
			detail = what()
		}
		return status.Errorf(status.Timeout, "gosym: %s: Timed out waiting for ranks %v%s (rank %d, group of %d)",
			who, missing, detail, t.Rank, len(t.ctrl))
	}
	return nil
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
		shm.FutexWake(w)
	}
}

// exited is the ranks whose exit fails a wait for rank r (see waitGE).
func (t *Team) exited(r int, pairwise bool) []int {
	if !pairwise {
		return t.Mesh.Dead()
	}
	if t.Mesh.Exited(r) {
		return []int{r}
	}
	return nil
}

// sleepSlice bounds one futex sleep so that deadlines, dead peers and
// closed endpoints are noticed promptly.
const sleepSlice = 10 * time.Millisecond

// waitGE waits until *w (a word in rank r's control region) reaches
// target: it polls for t.Spin, then sleeps on the futex. It fails when the
// deadline passes, r closes its endpoint, or a rank that the wait depends
// on exits: r alone for a point-to-point wait (pairwise: no other rank
// takes part), any peer for a collective's (a dead rank stops it wherever
// it waits).
func (t *Team) waitGE(r int, w *uint32, target uint32, who Who, deadline time.Time, pairwise bool) error {
	if ge(atomic.LoadUint32(w), target) {
		return nil
	}
	// The spin yields the core (sched_yield), not the goroutine: an op
	// usually runs on a cgo caller's thread, whose goroutine is locked to
	// it, and runtime.Gosched there hands the P to another thread and back
	// (two thread wake-ups, on cores the peer ranks need). sched_yield
	// costs a syscall when nothing else wants the core, and lets a peer
	// rank that shares this core run when one does.
	spinEnd := time.Now().Add(t.Spin)
	for i := 1; ; i++ {
		if ge(atomic.LoadUint32(w), target) {
			return nil
		}
		if i&1023 == 0 {
			if time.Now().After(spinEnd) || t.aborted.Load() || atomic.LoadUint32(t.ctrl[r].Word32(offRefused)) != 0 {
				break
			}
			shm.Yield()
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
		if err := t.refused(r, who); err != nil {
			return err
		}
		now := time.Now()
		if now.After(deadline) {
			return status.Errorf(status.Timeout, "gosym: %s: Timed out waiting for rank %d", who, r)
		}
		if dead := t.exited(r, pairwise); len(dead) > 0 {
			return status.Errorf(status.Peer, "gosym: %s failed: %s exited (rank %d waited for rank %d)", who, t.Mesh.Describe(dead), t.Rank, r)
		}
		shm.FutexWait(w, v, min(sleepSlice, deadline.Sub(now)))
	}
}
