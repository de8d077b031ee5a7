package gobackend

// The endpoint's side of the CUDA data plane (internal/gpu): CUDA ops enter
// the collective queue here and run in their turn on the caller's thread,
// so each is enqueued on the caller's stream before PostCUDA returns; an
// eager op with host rounds is deferred instead (gpu/defer.go): its
// caller's stream waits for it on the GPU and the queue's worker runs it.

import (
	"time"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// PostCUDA posts an op on CUDA device memory of device (an ordinal; a
// negative device means host memory, as Post); capturing says the stream
// is being captured into a CUDA graph. The op is enqueued on stream before
// PostCUDA returns, after every collective posted before it (send and
// recv: after the pair's earlier CUDA messages, see internal/gpu/p2p.go);
// the returned Work is already complete on the host, except a deferred
// op's (gpu/defer.go), whose stream is held on the GPU until it ran.
func (e *Endpoint) PostCUDA(op *Op, device int, stream uintptr, capturing bool) (*Work, error) {
	if device < 0 {
		return e.Post(op)
	}
	if op.Kind == ops.Recv && op.Peer == ops.AnySource {
		return nil, status.Errorf(status.NotSupported, "gosym: recv from any source into CUDA memory: the engine matches CUDA messages per pair (the Python package learns the sender first)")
	}
	gpu.NoteProcessDevice(device) // for the p2p responders of other groups
	e.watchCUDA()
	if op.Kind.IsP2P() {
		return e.runP2PCUDA(op, device, stream, capturing)
	}
	if err := gpu.KernelSupport(op); err != nil {
		return nil, err
	}
	ops.Even(op, e.Size)
	if err := ops.Check(op, e.Rank, e.Size); err != nil {
		return nil, err
	}
	if err := checkUBR(op); err != nil {
		return nil, err
	}
	// Refused before it takes a sequence number, so it never reaches the
	// peers (an op that failed on one rank alone would put the ranks out of
	// step). runGPU checks again in case the first CUDA op is still running.
	if d := e.gpu.Ordinal(); d >= 0 && d != device {
		return nil, status.Errorf(status.InvalidArg, "gosym: %s on cuda:%d, but group %q runs on cuda:%d on this rank (one device per rank and group)",
			op.Kind, device, e.Name, d)
	}
	return e.runQueued(op, gpu.Args{Device: device, Stream: cuda.Stream(stream), Capturing: capturing})
}

// runQueued runs op with its CUDA arguments in collective order, on this
// thread, so a CUDA op is enqueued here, in stream order with whatever the
// caller enqueues next. When the collective queue is idle (the common case:
// the caller's previous op is done) op runs at once, as if queued and
// drained, with no Work to queue and no arguments to park; else it is
// queued behind the others and the queue runs here until it ran. A
// deferred op (gpu.State.Defer) goes to the queue's worker and the caller
// returns at once.
func (e *Endpoint) runQueued(op *Op, a gpu.Args) (*Work, error) {
	e.mu.Lock()
	if err := e.usable(op.Kind); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	e.seq++
	w := &Work{op: *op}
	w.op.Seq = e.seq
	e.stats.Posted.Add(1)
	da, deferred, err := e.gpu.Defer(&w.op, a)
	if err != nil {
		e.mu.Unlock()
		return nil, err
	}
	if deferred {
		// The caller's stream waits for the op on the GPU; the queue runs
		// its host rounds (gpu/defer.go). Ordered behind everything queued.
		w.q, w.done = e.coll, make(chan struct{})
		e.gpu.Park(w.op.Seq, da)
		e.coll.pushNow(w)
		e.mu.Unlock()
		return w, nil
	}
	if e.coll.claimIdle() { // nothing can be queued ahead of op: posts hold e.mu
		e.mu.Unlock()
		w.err = e.finished(e.runGPU(&w.op, a))
		e.coll.unclaim()
		w.done = closedDone
	} else {
		w.q, w.done = e.coll, make(chan struct{})
		e.gpu.Park(w.op.Seq, a)
		e.coll.push(w, false)
		e.mu.Unlock()
		w.Wait(-1)
	}
	if w.err != nil {
		return nil, w.err
	}
	return w, nil
}

// runGPU runs a CUDA op or group task with its arguments a in its turn on
// the collective queue.
func (e *Endpoint) runGPU(op *Op, a gpu.Args) (err error) {
	if a.Deferred() {
		defer func() { e.gpu.Finish(op, a, err) }()
	}
	e.stats.Barriers.Add(1)
	deadline := time.Now().Add(e.Timeout)
	if a.Task != nil {
		return a.Task(op.Who(), deadline)
	}
	e.mu.Lock()
	err = e.usable(op.Kind) // queued behind an op that broke the group, or its destruction
	e.mu.Unlock()
	if err != nil {
		return err
	}
	return e.gpu.Run(e.gpuGroup(), op, a, deadline)
}

// RunCUDA is Run for an op that PostCUDA takes: a host op (device < 0) runs
// to completion; a CUDA op is done on the host once it is enqueued.
func (e *Endpoint) RunCUDA(op *Op, device int, stream uintptr, capturing bool) error {
	if device < 0 {
		return e.Run(op)
	}
	_, err := e.PostCUDA(op, device, stream, capturing)
	return err
}

// runTask runs task on every rank in collective order, as the op named
// name: it may talk to the peers (links, team barriers) like a collective.
func (e *Endpoint) runTask(name string, task func(who symm.Who, deadline time.Time) error) error {
	_, err := e.runQueued(&Op{Kind: ops.Barrier}, gpu.Args{Device: -1, Task: func(who symm.Who, deadline time.Time) error {
		who.Op = name
		return task(who, deadline)
	}})
	return err
}

// runP2PCUDA enqueues a send or recv of CUDA device memory on stream
// (capturing: the stream is being captured into a CUDA graph) over the
// pair's channel (gpu.P2P). The returned Work is complete.
func (e *Endpoint) runP2PCUDA(op *Op, device int, stream uintptr, capturing bool) (*Work, error) {
	if err := ops.Check(op, e.Rank, e.Size); err != nil {
		return nil, err
	}
	if err := checkUserTag(op); err != nil {
		return nil, err
	}
	e.mu.Lock()
	err := e.usable(op.Kind)
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if d := e.gpu.Ordinal(); d >= 0 && d != device {
		return nil, status.Errorf(status.InvalidArg, "gosym: %s on cuda:%d, but group %q runs on cuda:%d on this rank (one device per rank and group)",
			op.Kind, device, e.Name, d)
	}
	if err := e.p2p.Run(op, device, cuda.Stream(stream), capturing); err != nil {
		return nil, err
	}
	e.stats.Posted.Add(1)
	e.stats.Completed.Add(1)
	return &Work{op: *op, done: closedDone}, nil
}

// gpuGroup is this endpoint as the CUDA plane sees it.
func (e *Endpoint) gpuGroup() gpu.Group {
	return gpu.Group{Name: e.Name, Rank: e.Rank, World: e.Size, Timeout: e.Timeout, Peers: gpuPeers{e}}
}

// gpuPeers is gpu.Peers over the endpoint's links and host barrier.
type gpuPeers struct{ e *Endpoint }

func (p gpuPeers) ExchangeFD(magic uint32, body []byte, fds []int, deadline time.Time) ([]comm.FDMsg, error) {
	return p.e.exchangeFD(magic, body, fds, deadline)
}

func (p gpuPeers) AgreeAll(ok bool, who symm.Who, deadline time.Time) ([]int, error) {
	return p.e.agreeAll(ok, who, deadline)
}

func (p gpuPeers) Barrier(meta []byte, who symm.Who, deadline time.Time) ([][]byte, error) {
	return p.e.team.Barrier(meta, who, deadline)
}

func (p gpuPeers) Sign(seq, sig uint64) (int, uint64, []int) { return p.e.team.Sign(seq, sig) }

func (p gpuPeers) SigOf(r int, seq uint64) (uint64, bool) { return p.e.team.SigOf(r, seq) }

func (p gpuPeers) Refuse(seq uint64) { p.e.team.Refuse(seq) }

// DeviceError is the error a CUDA kernel of this group recorded on this
// rank (a peer that did not arrive in time, a p2p message that did not
// match), nil if none. It reads host memory only: callers use it after
// waiting on the GPU (a barrier).
func (e *Endpoint) DeviceError() error {
	if err := e.gpu.DeviceError(e.gpuGroup()); err != nil {
		return err
	}
	return e.p2p.DeviceError()
}
