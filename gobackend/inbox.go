package gobackend

import (
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// inbox matches the messages of one source peer to posted receives, as
// gloo and MPI do: a message goes to the earliest posted receive with its
// tag; a message no receive wants yet is stashed (copied out of the
// mailbox, so the sender is never blocked by it) until one is posted.
type inbox struct {
	e       *Endpoint
	src     int
	mu      sync.Mutex
	cond    *sync.Cond
	pending []*Work // posted receives, in post order
	stash   []stashed
	closed  bool
	gone    error // the peer left: no more polling for receives from any source
}

type stashed struct {
	tag  int64
	data []byte
}

func (e *Endpoint) startInbox(src int) *inbox {
	b := &inbox{e: e, src: src}
	b.cond = sync.NewCond(&b.mu)
	e.workers.Add(1)
	go b.loop()
	return b
}

func (b *inbox) post(w *Work) {
	b.mu.Lock()
	b.pending = append(b.pending, w)
	b.mu.Unlock()
	b.cond.Signal()
}

// wake has the loop look again (a receive from any source was posted).
func (b *inbox) wake() {
	b.mu.Lock()
	b.mu.Unlock()
	b.cond.Signal()
}

// unlocked runs f without b.mu (held by the caller): f takes Endpoint.mu,
// which comes before b.mu in the lock order.
func (b *inbox) unlocked(f func()) {
	b.mu.Unlock()
	defer b.mu.Lock()
	f()
}

// deliver copies a stashed message into receive w, or says why it does not fit.
func (b *inbox) deliver(w *Work, data []byte) error {
	if len(data) != w.op.Count*w.op.DType.Size() {
		return sizeError(w, uint64(len(data)))
	}
	if len(data) > 0 {
		b.e.exec.P.Copy(w.op.Out, uintptr(unsafe.Pointer(&data[0])), len(data))
	}
	return nil
}

func (b *inbox) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
}

// finish completes w and removes it from pending. Called with b.mu held.
func (b *inbox) finish(w *Work, err error) {
	for i, p := range b.pending {
		if p == w {
			b.pending = append(b.pending[:i], b.pending[i+1:]...)
			break
		}
	}
	w.err = err
	if err != nil {
		b.e.stats.Failed.Add(1)
	} else {
		b.e.stats.Completed.Add(1)
	}
	close(w.done)
}

func sizeError(w *Work, got uint64) error {
	want := w.op.Count * w.op.DType.Size()
	return status.Errorf(status.Mismatch, "gosym: recv (seq %d) from rank %d: expected %d bytes with tag %d, the message with that tag has %d bytes",
		w.op.Seq, w.op.Peer, want, w.op.Tag, got)
}

// wanted reports whether the loop should read the peer's next message: a
// receive from the peer waits, or one from any source does (and the peer
// has not left). Called with b.mu held.
func (b *inbox) wanted() bool {
	return len(b.pending) > 0 || (b.gone == nil && b.e.anys.waiting())
}

// fromStash completes receives (from this peer, then from any source) that
// a stashed message satisfies. Called with b.mu held.
func (b *inbox) fromStash() {
	for i := 0; i < len(b.pending); i++ {
		w := b.pending[i]
		for j, m := range b.stash {
			if m.tag != w.op.Tag {
				continue
			}
			b.stash = append(b.stash[:j], b.stash[j+1:]...)
			b.finish(w, b.deliver(w, m.data))
			i--
			break
		}
	}
	b.anyFromStash()
}

func (b *inbox) loop() {
	defer b.e.workers.Done()
	x := b.e.exec
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		b.fromStash()
		for !b.wanted() && !b.closed {
			b.cond.Wait()
		}
		if b.closed {
			for len(b.pending) > 0 {
				b.finish(b.pending[0], status.Errorf(status.Closed, "gosym: recv from rank %d: the group was destroyed", b.src))
			}
			b.expireAny(status.Errorf(status.Closed, "gosym: recv from any source: the group was destroyed"))
			return
		}
		if len(b.stash) > 0 && b.matchesStash() {
			continue
		}
		// With no receive from this peer, only receives from any source
		// want its message: wait a slice (see anysource.go).
		var head *Work
		who := symm.Who{Op: "recv from any source"}
		deadline := b.e.anys.until(time.Now())
		if len(b.pending) > 0 {
			head = b.pending[0]
			who = head.op.Who()
			deadline = time.Now().Add(b.e.Timeout)
		}
		b.mu.Unlock()
		h, err := x.NextMessage(b.src, who, deadline)
		b.mu.Lock()
		switch {
		case err == nil:
		case head != nil:
			b.unlocked(func() { b.e.fail(err) })
			b.finish(head, err)
			continue
		case status.CodeOf(err) == status.Timeout:
			b.expireAny(nil)
			continue
		default: // the peer left; receives from any source wait for the others
			b.gone = err
			continue
		}
		if head == nil {
			// The slice bounded the wait for a first chunk; the rest of a
			// message that has begun comes from a live sender, which may
			// be descheduled between chunks: it has the group's timeout.
			deadline = time.Now().Add(b.e.Timeout)
		}
		target, anySrc := (*Work)(nil), false
		for _, w := range b.pending {
			if w.op.Tag == h.Tag {
				target = w
				break
			}
		}
		if target == nil {
			target = b.claimAny(h.Tag)
			if anySrc = target != nil; anySrc {
				who = symm.Who{Op: "recv from any source", Seq: target.op.Seq}
			}
		}
		var dst uintptr
		var keep []byte
		switch {
		case target != nil && h.Total == uint64(target.op.Count*target.op.DType.Size()):
			dst = target.op.Out
		case target == nil && h.Total > 0:
			keep = make([]byte, h.Total)
			dst = uintptr(unsafe.Pointer(&keep[0]))
		}
		b.mu.Unlock()
		err = x.TakeMessage(b.src, h, dst, who, deadline)
		runtime.KeepAlive(keep)
		b.mu.Lock()
		done := b.finish
		if anySrc {
			done = b.finishAny
		}
		switch {
		case err != nil:
			b.unlocked(func() { b.e.fail(err) })
			if target == nil {
				target = head
			}
			if target != nil {
				done(target, err)
			} else {
				b.expireAny(err)
			}
		case target == nil:
			b.stash = append(b.stash, stashed{tag: h.Tag, data: keep})
		case h.Total != uint64(target.op.Count*target.op.DType.Size()):
			done(target, sizeError(target, h.Total))
		default:
			done(target, nil)
		}
	}
}

// matchesStash reports whether some pending receive (from this peer or from
// any source) wants a stashed tag.
func (b *inbox) matchesStash() bool {
	for _, m := range b.stash {
		if b.e.anys.wants(m.tag) {
			return true
		}
		for _, w := range b.pending {
			if m.tag == w.op.Tag {
				return true
			}
		}
	}
	return false
}
