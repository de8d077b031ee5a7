package gobackend

import (
	"sync"
	"time"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// Work is one posted operation.
type Work struct {
	op   Op
	q    *queue
	done chan struct{}
	err  error
}

// Wait blocks until the work completes or timeout passes (timeout < 0:
// no limit; the op has its own deadline anyway).
func (w *Work) Wait(timeout time.Duration) error {
	if w.q != nil {
		w.q.help(w)
	}
	if timeout < 0 {
		<-w.done
		return w.err
	}
	select {
	case <-w.done:
		return w.err
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
		return w.err
	case <-t.C:
		return status.Errorf(status.Timeout, "gosym: wait for %s (seq %d): Timed out after %v", w.op.Kind, w.op.Seq, timeout)
	}
}

// Done reports whether the work completed, and its error.
func (w *Work) Done() (bool, error) {
	select {
	case <-w.done:
		return true, w.err
	default:
		return false, nil
	}
}

// queue runs works in post order, one at a time. Whoever gets there first
// runs them: a thread waiting for its work runs the queue itself (no
// thread hand-off on the latency path), and a worker goroutine, woken only if
// the head of the queue sat unclaimed for kickDelay, guarantees progress for
// work nobody waits on (async ops, futures).
type queue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	items   []*Work
	running bool // someone is executing items
	closed  bool
	armed   bool
	kick    *time.Timer
	exec    func(*Work)
}

// kickDelay is how long posted work may wait for a waiter to run it before
// the worker goroutine takes it.
const kickDelay = 50 * time.Microsecond

func (e *Endpoint) startQueue(run func(*Work) error) *queue {
	q := &queue{}
	q.cond = sync.NewCond(&q.mu)
	q.exec = func(w *Work) {
		w.err = e.finished(run(w))
		close(w.done)
	}
	q.kick = time.AfterFunc(time.Hour, func() {
		q.mu.Lock()
		q.armed = false
		q.mu.Unlock()
		q.cond.Signal()
	})
	q.kick.Stop()
	e.workers.Add(1)
	go func() {
		defer e.workers.Done()
		q.mu.Lock()
		defer q.mu.Unlock()
		for {
			for (len(q.items) == 0 || q.running) && !q.closed {
				q.cond.Wait()
			}
			if len(q.items) == 0 && !q.running {
				return // closed and drained
			}
			if q.running {
				q.cond.Wait() // closed while someone else drains
				continue
			}
			q.drain(nil)
		}
	}()
	return q
}

// drain runs queued work in order until until is done (or, with until nil,
// until the queue is empty). Called and returns with q.mu held. Someone
// runs the queue now, so the kick is disarmed: firing into a slow op would
// only wake the worker to find the queue taken.
func (q *queue) drain(until *Work) {
	q.running = true
	if q.armed && q.kick.Stop() {
		q.armed = false
	}
	for len(q.items) > 0 {
		w := q.items[0]
		q.items[0] = nil
		q.items = q.items[1:]
		q.mu.Unlock()
		q.exec(w)
		q.mu.Lock()
		if w == until {
			break
		}
	}
	q.running = false
	if len(q.items) > 0 || q.closed {
		q.cond.Broadcast()
	}
}

// push queues w. With kick, the worker takes w if nobody claims it within
// kickDelay; without, the caller promises to wait for w at once.
func (q *queue) push(w *Work, kick bool) {
	q.mu.Lock()
	q.items = append(q.items, w)
	if kick && !q.running && !q.armed {
		q.armed = true
		q.kick.Reset(kickDelay)
	}
	q.mu.Unlock()
}

// pushNow queues w for the worker at once: nobody waits for it (a
// deferred CUDA op, gpu/defer.go), and its caller's stream waits on the
// GPU until it ran.
func (q *queue) pushNow(w *Work) {
	q.mu.Lock()
	q.items = append(q.items, w)
	if !q.running {
		q.cond.Signal()
	}
	q.mu.Unlock()
}

// claimIdle makes the caller the queue's runner if nobody runs it and
// nothing waits in it: the caller then runs its op directly, in queue
// order, and gives the queue back with unclaim.
func (q *queue) claimIdle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running || q.closed || len(q.items) > 0 {
		return false
	}
	q.running = true
	return true
}

// unclaim ends claimIdle's run; work queued meanwhile goes to the worker
// or a waiter, as after drain.
func (q *queue) unclaim() {
	q.mu.Lock()
	q.running = false
	if len(q.items) > 0 || q.closed {
		q.cond.Broadcast()
	}
	q.mu.Unlock()
}

// closedDone is the done channel of work that completed as it was posted.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// help runs the queue on the calling thread up to w, unless someone else is
// running it already.
func (q *queue) help(w *Work) {
	q.mu.Lock()
	if !q.running && !q.closed {
		select {
		case <-w.done:
		default:
			q.drain(w)
		}
	}
	q.mu.Unlock()
}

// close makes the worker finish what is queued (each item fails fast once
// the team is aborted) and exit.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.kick.Stop()
	q.mu.Unlock()
	q.cond.Broadcast()
}
