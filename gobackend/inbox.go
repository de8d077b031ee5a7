package gobackend

import (
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/status"
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

// fromStash completes receives that a stashed message satisfies. Called
// with b.mu held.
func (b *inbox) fromStash() {
	for i := 0; i < len(b.pending); i++ {
		w := b.pending[i]
		for j, m := range b.stash {
			if m.tag != w.op.Tag {
				continue
			}
			b.stash = append(b.stash[:j], b.stash[j+1:]...)
			var err error
			if len(m.data) != w.op.Count*w.op.DType.Size() {
				err = sizeError(w, uint64(len(m.data)))
			} else if len(m.data) > 0 {
				b.e.exec.P.Copy(w.op.Out, uintptr(unsafe.Pointer(&m.data[0])), len(m.data))
			}
			b.finish(w, err)
			i--
			break
		}
	}
}

func (b *inbox) loop() {
	defer b.e.workers.Done()
	x := b.e.exec
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		b.fromStash()
		for len(b.pending) == 0 && !b.closed {
			b.cond.Wait()
		}
		if b.closed {
			for len(b.pending) > 0 {
				b.finish(b.pending[0], status.Errorf(status.Closed, "gosym: recv from rank %d: the group was destroyed", b.src))
			}
			return
		}
		if len(b.stash) > 0 && b.matchesStash() {
			continue
		}
		head := b.pending[0]
		who := head.op.Who()
		deadline := time.Now().Add(b.e.Timeout)
		b.mu.Unlock()
		h, err := x.NextMessage(b.src, who, deadline)
		b.mu.Lock()
		if err != nil {
			b.e.fail(err)
			b.finish(head, err)
			continue
		}
		var target *Work
		for _, w := range b.pending {
			if w.op.Tag == h.Tag {
				target = w
				break
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
		switch {
		case err != nil:
			b.e.fail(err)
			b.finish(head, err)
		case target == nil:
			b.stash = append(b.stash, stashed{tag: h.Tag, data: keep})
		case h.Total != uint64(target.op.Count*target.op.DType.Size()):
			b.finish(target, sizeError(target, h.Total))
		default:
			b.finish(target, nil)
		}
	}
}

// matchesStash reports whether some pending receive wants a stashed tag.
func (b *inbox) matchesStash() bool {
	for _, w := range b.pending {
		for _, m := range b.stash {
			if m.tag == w.op.Tag {
				return true
			}
		}
	}
	return false
}
