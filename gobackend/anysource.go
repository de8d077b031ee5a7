package gobackend

import (
	"sync"
	"time"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// Receives from any source (peer AnySource, gloo's recvAnysource):
// every peer's inbox offers such receives the messages that no receive
// from that peer wants (a receive naming the source comes first, as in
// gloo), in arrival order per peer; the first inbox with a message of the
// tag takes the receive. The sender's rank is stored in the work (and, as
// an int32, at the op's In address when it is not 0: the C ABI's way of
// reporting it). While only receives from any source wait, an inbox polls
// its peer in slices (anySlice), so that one whose peer never sends does
// not hold a deadline of its own: a receive from any source fails when
// its own deadline (the group's timeout after its post) passes.

// anySlice bounds one wait of an inbox for a message that only receives
// from any source want.
const anySlice = 50 * time.Millisecond

type anyRecv struct {
	w        *Work
	deadline time.Time
}

// anyRecvs are the receives from any source waiting for a message, in post
// order. Lock order: Endpoint.mu, then inbox.mu, then anyRecvs.mu.
type anyRecvs struct {
	mu   sync.Mutex
	list []anyRecv
	seq  uint64 // under Endpoint.mu: the sequence numbers of receives from any source
}

func (a *anyRecvs) add(w *Work, deadline time.Time) {
	a.mu.Lock()
	a.list = append(a.list, anyRecv{w, deadline})
	a.mu.Unlock()
}

// waiting reports whether a receive from any source waits.
func (a *anyRecvs) waiting() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.list) > 0
}

// wants reports whether a waiting receive takes messages with tag.
func (a *anyRecvs) wants(tag int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.list {
		if r.w.op.Tag == tag {
			return true
		}
	}
	return false
}

// claim removes and returns the earliest receive with tag, or nil.
func (a *anyRecvs) claim(tag int64) *Work {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, r := range a.list {
		if r.w.op.Tag == tag {
			a.list = append(a.list[:i], a.list[i+1:]...)
			return r.w
		}
	}
	return nil
}

// until is the end of an inbox's next wait for any source: a slice from
// now, or the earliest deadline if sooner.
func (a *anyRecvs) until(now time.Time) time.Time {
	end := now.Add(anySlice)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.list {
		if r.deadline.Before(end) {
			end = r.deadline
		}
	}
	return end
}

// expired removes and returns the receives whose deadline passed (all of
// them when all is set).
func (a *anyRecvs) expired(now time.Time, all bool) []*Work {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*Work
	keep := a.list[:0]
	for _, r := range a.list {
		if all || now.After(r.deadline) {
			out = append(out, r.w)
		} else {
			keep = append(keep, r)
		}
	}
	a.list = keep
	return out
}

// postAnyRecv posts w, a receive from any source; called with e.mu held.
// Every peer's inbox is started and woken, since any of them may hold or
// bring the message.
func (e *Endpoint) postAnyRecv(w *Work) {
	e.anys.seq++
	w.op.Seq = e.anys.seq
	e.stats.Posted.Add(1)
	e.anys.add(w, time.Now().Add(e.Timeout))
	for p := range e.recvs {
		if p == e.Rank {
			continue
		}
		if e.recvs[p] == nil {
			e.recvs[p] = e.startInbox(p)
		}
		e.recvs[p].wake()
	}
}

// anyTimeout is the error of receive from any source w that timed out.
func (e *Endpoint) anyTimeout(w *Work) error {
	var peers []int
	for p := range e.Size {
		if p != e.Rank {
			peers = append(peers, p)
		}
	}
	return status.Errorf(status.Timeout, "gosym: recv from any source (seq %d, tag %d): Timed out after %v waiting for ranks %v (rank %d, group of %d)",
		w.op.Seq, w.op.Tag, e.Timeout, peers, e.Rank, e.Size)
}

// finishAny completes w, a receive from any source that took a message from
// this inbox's peer (or failed), recording the sender. Called with b.mu held.
func (b *inbox) finishAny(w *Work, err error) {
	w.op.Peer = b.src
	if err == nil && w.op.In != 0 {
		src := int32(b.src)
		b.e.exec.P.Copy(w.op.In, uintptr(unsafe.Pointer(&src)), int(unsafe.Sizeof(src)))
	}
	b.finish(w, err)
}

// claimAny takes, for a message with tag that no receive of this inbox
// wants, the earliest receive from any source with that tag (nil if none).
func (b *inbox) claimAny(tag int64) *Work { return b.e.anys.claim(tag) }

// anyFromStash hands stashed messages to receives from any source that want
// them. Called with b.mu held.
func (b *inbox) anyFromStash() {
	for j := 0; j < len(b.stash); j++ {
		m := b.stash[j]
		w := b.claimAny(m.tag)
		if w == nil {
			continue
		}
		b.stash = append(b.stash[:j], b.stash[j+1:]...)
		j--
		b.finishAny(w, b.deliver(w, m.data))
	}
}

// expireAny fails the receives from any source whose deadline passed, or
// all of them with closed when it is not nil. Called with b.mu held.
func (b *inbox) expireAny(closed error) {
	for _, w := range b.e.anys.expired(time.Now(), closed != nil) {
		err := closed
		if err == nil {
			err = b.e.anyTimeout(w)
			b.unlocked(func() { b.e.fail(err) })
		}
		b.finish(w, err)
	}
}
