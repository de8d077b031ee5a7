package gobackend

// The watchdog of a group with CUDA work. A CUDA op's kernels wait for the
// peers on the device, where no host wait sees a peer's pidfd: a peer
// killed mid-op (kill -9, a crash) would leave them spinning until the
// group's timeout, and nothing would name it. So, as ProcessGroupNCCL's
// watchdog with TORCH_NCCL_ASYNC_ERROR_HANDLING, a goroutine of the
// endpoint, started by its first CUDA op, asks the mesh every
// GOSYM_WATCHDOG_MS which peers exited. The first that exited without
// destroying the group (a peer that left after destroy_process_group is
// no failure) breaks the group with an error naming it, its pid and this
// rank's latest CUDA ops, and aborts this rank's kernels (gpu/lost.go):
// they give up, their outputs undefined, and the streams drain. Every
// survivor's watchdog does the same, so kernels waiting on a live peer
// that waits on the lost one end too.

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// drainAfterAbort bounds teardown's wait for the device once this rank's
// kernels were aborted: they give up at their next wait, so a device still
// busy after it runs something no abort reaches.
const drainAfterAbort = 10 * time.Second

// watchdog is an endpoint's: whether it runs, how to stop it, and whether
// it fired.
type watchdog struct {
	started atomic.Bool
	fired   atomic.Bool
	halt    chan struct{} // closed by stop
	once    sync.Once
}

// stop ends the watchdog's goroutine (Destroy waits for it with the
// workers).
func (d *watchdog) stop() {
	d.once.Do(func() {
		if d.halt != nil {
			close(d.halt)
		}
	})
}

// watchCUDA starts the watchdog with the endpoint's first CUDA op (one
// atomic load on every later one), unless GOSYM_WATCHDOG_MS is 0.
func (e *Endpoint) watchCUDA() {
	if e.dog.started.Load() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.team == nil || !e.dog.started.CompareAndSwap(false, true) || e.cfg.Watchdog <= 0 {
		return
	}
	e.dog.halt = make(chan struct{})
	e.workers.Add(1) // before Destroy waits: it sets closed under e.mu first
	go func() {
		defer e.workers.Done()
		tick := time.NewTicker(e.cfg.Watchdog)
		defer tick.Stop()
		for {
			select {
			case <-e.dog.halt:
				return
			case <-tick.C:
			}
			if e.checkPeers() {
				return
			}
		}
	}()
}

// lastCheck runs one more check at teardown, after the watchdog stopped:
// a peer lost since its last tick still gets this rank's kernels aborted
// before teardown waits for the device. It returns that wait's bound:
// drainAfterAbort once the kernels were aborted, else the group's timeout
// (every kernel wait has that deadline).
func (e *Endpoint) lastCheck() time.Duration {
	if e.dog.fired.Load() || (e.dog.halt != nil && e.checkPeers()) {
		return drainAfterAbort
	}
	return e.Timeout
}

// checkPeers acts on the peers lost so far, once (see the file's comment);
// it reports whether it did, now or before.
func (e *Endpoint) checkPeers() bool {
	if e.dog.fired.Load() {
		return true
	}
	var lost []int
	for _, r := range e.mesh.Dead() {
		if !e.team.Closed(r) {
			lost = append(lost, r)
		}
	}
	if len(lost) == 0 || !e.dog.fired.CompareAndSwap(false, true) {
		return len(lost) > 0
	}
	err := e.lostError(lost)
	if aerr := e.abortKernels(err, uint32(lost[0])); aerr != nil {
		dlog.Warnf("rank %d of group %q could not abort its CUDA kernels (they may wait until the group's timeout): %v", e.Rank, e.Name, aerr)
	}
	dlog.Printf("%v", err)
	return true
}

// abortKernels breaks the group with err and leaves an abort (detail) for
// this rank's kernels, collectives and sends/receives, running and enqueued
// later: they give up at their next wait, their outputs undefined.
func (e *Endpoint) abortKernels(err error, detail uint32) error {
	e.breakWith(err)
	return errors.Join(e.gpu.Abort(err, detail), e.p2p.Abort(err, detail))
}

// AbortCUDA ends this rank's CUDA work on the group at once, as NCCL's
// abort ends a communicator's: the group breaks with an error that gives
// why, every later op fails with it, this rank's kernels give up (their
// outputs undefined) and teardown waits for them no longer than an
// aborted kernel takes. A group across hosts calls it with the news of a
// failure elsewhere: a kernel of its host's group left waiting for a host
// peer that has left the op would keep the device busy, and the abort of
// its NCCL groups waits for the device (docs/BENCHMARKS.md, session 50).
func (e *Endpoint) AbortCUDA(why string) error {
	e.dog.fired.Store(true) // the group's failure is this one: no lost peer named after it
	return e.abortKernels(status.Errorf(status.Peer, "gosym: group %q: rank %d aborted its CUDA work on the group: %s",
		e.Name, e.Rank, why), uint32(e.Rank))
}

// lostError is the group's error for the lost ranks: who they were, and
// what this rank had enqueued on the GPU that may have waited for them.
func (e *Endpoint) lostError(lost []int) error {
	var latest []string
	if op := e.gpu.Latest(); op != "" {
		latest = append(latest, "its latest CUDA collective: "+op)
	}
	for _, r := range lost {
		if op := e.p2p.Latest(r); op != "" {
			latest = append(latest, fmt.Sprintf("its latest CUDA send/recv with rank %d: %s", r, op))
		}
	}
	what := ""
	if len(latest) > 0 {
		what = " (" + strings.Join(latest, "; ") + ")"
	}
	return status.Errorf(status.Peer, "gosym: group %q: %s exited without destroying the group; rank %d aborted its CUDA work on the group%s: "+
		"the outputs of ops still running are undefined, and the group cannot run ops any more", e.Name, e.mesh.Describe(lost), e.Rank, what)
}
