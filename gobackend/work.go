package gobackend

import (
	"sync"
	"time"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// Work is one posted operation.
type Work struct {
	op   Op
	done chan struct{}
	err  error
}

// Wait blocks until the work completes or timeout passes (timeout < 0:
// no limit; the op has its own deadline anyway).
func (w *Work) Wait(timeout time.Duration) error {
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
		return status.Errorf(status.Timeout, "gosym: wait for %s (seq %d) timed out after %v", w.op.Kind, w.op.Seq, timeout)
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

// queue runs works in order on one goroutine.
type queue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	items  []*Work
	closed bool
}

func (e *Endpoint) startQueue(run func(*Work) error) *queue {
	q := &queue{}
	q.cond = sync.NewCond(&q.mu)
	e.workers.Add(1)
	go func() {
		defer e.workers.Done()
		for {
			w, ok := q.pop()
			if !ok {
				return
			}
			w.err = run(w)
			if w.err != nil {
				e.fail(w.err)
			} else {
				e.stats.Completed.Add(1)
			}
			close(w.done)
		}
	}()
	return q
}

func (q *queue) push(w *Work) {
	q.mu.Lock()
	q.items = append(q.items, w)
	q.mu.Unlock()
	q.cond.Signal()
}

func (q *queue) pop() (*Work, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.items) == 0 {
		return nil, false
	}
	w := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	return w, true
}

// close makes the worker finish what is queued (each item fails fast once
// the team is aborted) and exit.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}
