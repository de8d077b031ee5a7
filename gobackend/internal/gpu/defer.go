package gpu

// Deferred ops: an eager CUDA op that takes a host round with its peers
// (the direct path's agreement, an all_to_all's splits) does not make its
// caller wait for the slowest host. At the call (Defer, on the caller's
// thread, under the endpoint's post lock so that ops take their flag
// values in collective order) an event is recorded on the caller's stream
// and the stream is made to wait, on the GPU, until the group's flag word
// reaches the op's value (cuStreamWaitValue32). The collective queue's
// runner then runs the op's rounds and enqueues it on the group's
// internal stream after that event (Run), followed by the flag write
// (Finish): work the caller enqueues next runs after the op, as with
// NCCL's enqueue, and the host never waited. An op that fails or is
// refused writes its flag too, so no stream waits for good; its error is
// reported by the group's next CUDA op and by every CUDA Work's wait()
// (DeviceError). Captured ops and ops with no host round run on the
// caller's thread as before.

import (
	"sync"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// deferral is a team's internal stream, flag word and event pool for
// deferred ops, under mu: the callers' threads take flag values and
// events, the queue's runner writes flags and returns events.
type deferral struct {
	mu     sync.Mutex
	stream cuda.Stream  // where deferred ops run, in queue order (0: not made yet)
	flag   uintptr      // device word: the value of the last deferred op launched
	issued uint32       // the value the latest deferred op's caller waits for
	free   []cuda.Event // events recorded for earlier ops, whose waits are enqueued
	closed bool
}

// Defer prepares op (its arguments a) to run on the collective queue
// without its caller waiting, when it would take a host round; the
// returned arguments then go to Park instead of a. The error is an
// earlier deferred op's: every CUDA op of the group fails with it. Called
// under the endpoint's post lock, for every CUDA collective: with deferral
// off it costs one atomic load.
func (g *State) Defer(op *ops.Op, a Args) (Args, bool, error) {
	if !g.deferring.Load() {
		return a, false, nil
	}
	g.mu.Lock()
	t, err := g.live, g.deferErr
	g.mu.Unlock()
	if err != nil {
		return a, false, err
	}
	if a.Capturing || a.Task != nil || t == nil || a.Device != t.g.ordinal || !t.agrees(op) {
		return a, false, nil
	}
	if capturing, _, err := t.g.d.StreamCaptureInfo(t.g.ctx, a.Stream); err != nil || capturing {
		return a, false, nil // Run asks again and reports the error
	}
	df := &t.df
	df.mu.Lock()
	defer df.mu.Unlock()
	if df.closed {
		return a, false, nil
	}
	var ev cuda.Event
	if n := len(df.free); n > 0 {
		ev, df.free = df.free[n-1], df.free[:n-1]
	} else {
		var err error
		if ev, err = t.g.d.EventCreate(t.g.ctx, cuda.EventDisableTiming); err != nil {
			return a, false, nil
		}
	}
	k := df.issued + 1
	if err := t.g.d.EventRecord(t.g.ctx, ev, a.Stream); err != nil {
		df.free = append(df.free, ev)
		return a, false, nil
	}
	if err := t.g.d.StreamWaitValue32(t.g.ctx, a.Stream, df.flag, k, cuda.WaitGEQ); err != nil {
		df.free = append(df.free, ev)
		return a, false, nil
	}
	df.issued = k
	g.deferred.Add(1)
	dlog.Printf("rank %d: %s deferred: its caller's stream waits for flag %d", t.rank, op.Who(), k)
	return Args{Device: a.Device, Stream: df.stream, deferred: true, ready: ev, release: k}, true, nil
}

// deferWarning says once per process that GOSYM_GPU_DEFER=1 is on: a
// stream waiting for the worker's future launch deadlocks against any
// module load or free in the process (scripts/syncprobe.py, session 26).
var deferWarning sync.Once

// open makes the internal stream and the flag word at the team's setup,
// before the team is published; false when the device could not (ops then
// run on their callers' threads, as with deferral off).
func (df *deferral) open(dev *Device) bool {
	deferWarning.Do(func() {
		dlog.Warnf("GOSYM_GPU_DEFER=1 is unsafe: while an op is deferred, a module load or cudaFree on any thread of this process deadlocks it (an FSDP2 step hangs; docs/ARCHITECTURE.md, \"Deferred ops\")")
	})
	s, err := dev.d.StreamCreate(dev.ctx, cuda.StreamNonBlocking)
	if err != nil {
		dlog.Printf("cuda:%d: no internal stream for deferred ops: %v", dev.ordinal, err)
		return false
	}
	p, err := dev.d.MemAlloc(dev.ctx, 4)
	if err == nil {
		err = dev.d.MemsetD32Async(dev.ctx, p, 0, 1, s)
		if err == nil {
			err = dev.d.StreamSynchronize(dev.ctx, s)
		}
		if err != nil {
			dev.d.MemFree(dev.ctx, p)
		}
	}
	if err != nil {
		dev.d.StreamDestroy(dev.ctx, s)
		dlog.Printf("cuda:%d: no flag word for deferred ops: %v", dev.ordinal, err)
		return false
	}
	df.stream, df.flag = s, p
	return true
}

// Finish ends deferred op a in its turn on the queue, whether it ran or
// failed (err): the flag write that releases its caller's stream goes on
// the internal stream after the op, and an error is kept for the group's
// next CUDA op and every CUDA Work's wait (the caller is gone).
func (g *State) Finish(op *ops.Op, a Args, err error) {
	if !a.deferred {
		return
	}
	g.mu.Lock()
	t := g.live
	if err != nil && g.deferErr == nil {
		g.deferErr = status.Wrap(status.CodeOf(err), err, "gosym: %s on cuda:%d failed after its call returned (deferred; GOSYM_GPU_DEFER=0 runs it on the caller's thread); the group cannot run CUDA ops any more",
			op.Who(), a.Device)
	}
	g.mu.Unlock()
	if t == nil {
		return // the team is gone: Close destroyed the stream after the device went idle
	}
	df := &t.df
	df.mu.Lock()
	defer df.mu.Unlock()
	if df.closed {
		return
	}
	dlog.Printf("rank %d: %s ran (deferred; error %v): releasing flag %d", t.rank, op.Who(), err, a.release)
	if err := t.g.d.StreamWriteValue32(t.g.ctx, df.stream, df.flag, a.release); err != nil {
		// The stream is unusable (the context failed): the caller's stream
		// waits on a context that is failing too.
		dlog.Warnf("cuda:%d: releasing the caller's stream of %s: %v", t.g.ordinal, op.Who(), err)
	}
	df.free = append(df.free, a.ready)
}

// start makes the internal stream wait for what the caller enqueued
// before a deferred op.
func (df *deferral) start(dev *Device, a Args) error {
	if !a.deferred {
		return nil
	}
	if err := dev.d.StreamWaitEvent(dev.ctx, a.Stream, a.ready); err != nil {
		return status.Wrap(status.System, err, "gosym: cuda:%d: a deferred op waiting for its caller's stream", dev.ordinal)
	}
	return nil
}

// close destroys the stream, the flag word and the events; the device is
// idle (Team.close).
func (df *deferral) close(dev *Device) {
	df.mu.Lock()
	defer df.mu.Unlock()
	df.closed = true
	for _, ev := range df.free {
		dev.d.EventDestroy(dev.ctx, ev)
	}
	df.free = nil
	if df.stream != 0 {
		dev.d.StreamDestroy(dev.ctx, df.stream)
		dev.d.MemFree(dev.ctx, df.flag)
		df.stream, df.flag = 0, 0
	}
}

// agrees says whether op, eager, takes a host round with the peers: what
// deferring it saves. It reads the settings alone (the registry belongs
// to the queue's runner), so an op that takes the direct path because its
// buffers are registered (below directMin) runs on the caller's thread.
func (t *Team) agrees(op *ops.Op) bool {
	if t.world == 1 {
		return false
	}
	es := uintptr(op.DType.Size())
	n := op.Count * op.DType.Size()
	switch op.Kind {
	case ops.AllReduce:
		return t.nvls == nil && !t.lowLatency(n) && n >= t.eagerDirectMin(op)
	case ops.AllGather, ops.Broadcast, ops.ReduceScatter:
		return n >= t.eagerDirectMin(op)
	case ops.AllToAll:
		m, even := equalSplit(op)
		if t.pacedAllToAll(m*es, even) {
			return false
		}
		return !even || int(m*es) >= t.eagerDirectMin(op)
	}
	return false
}
