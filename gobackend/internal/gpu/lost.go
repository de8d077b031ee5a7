package gpu

// A peer lost mid-op (gobackend/watchdog.go): its process exited without
// destroying the group, and this rank's kernels that wait for it would
// spin until the group's timeout. The endpoint's watchdog records the
// group's error here and aborts this rank's own kernels: an abort word in
// its pad (the collectives) and in each channel's control (send/recv),
// which every kernel wait reads (gs_wait_or) and gives up on.
//
// The error is recorded and the team or channels listed under one lock,
// and every op checks the error under that lock once its team or channel
// exists (State.Run, P2P.Run): an op that checks after the abort fails;
// one that checked before had its team or channel in the list, so its
// kernels meet the abort word. No kernel is enqueued past the abort
// unaborted.

import (
	"errors"
	"fmt"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// Abort records err as the group's CUDA error (sticky: every later op and
// DeviceError return it) and leaves an abort (cuda.ErrPeerLost, detail:
// the lost rank) on this rank's own pad, for every kernel of the group,
// those running and those enqueued later. It runs off the collective
// queue; Close comes after it.
func (g *State) Abort(err error, detail uint32) error {
	g.mu.Lock()
	if g.lost == nil {
		g.lost = err
	}
	t := g.live
	g.mu.Unlock()
	if t == nil {
		return nil
	}
	return t.abort([]int{t.rank}, cuda.ErrPeerLost, detail)
}

// lostError is the error Abort recorded, nil if none.
func (g *State) lostError() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lost
}

// Latest names the latest CUDA collective this rank enqueued on the group,
// with its sequence number ("" before the first).
func (g *State) Latest() string {
	if g.ops.Load() == 0 {
		return ""
	}
	return fmt.Sprintf("%s (seq %d)", ops.Kind(g.kind.Load()), g.seq.Load())
}

// Abort records err as the error of every CUDA send and recv of the group
// (sticky) and leaves an abort (cuda.ErrPeerLost, detail) in the control
// of every channel set up so far, so that their kernels give up. It runs
// off the ops; Close comes after it.
func (p *P2P) Abort(err error, detail uint32) error {
	p.mu.Lock()
	if p.lost == nil {
		p.lost = err
	}
	var chans []*cuda.P2PChannel
	for _, c := range p.peers {
		if c != nil && !p.closed && isDone(c.done) && c.ch != nil {
			chans = append(chans, c.ch)
		}
	}
	p.mu.Unlock()
	var errs []error
	for _, ch := range chans {
		errs = append(errs, ch.Abort(cuda.ErrPeerLost, detail))
	}
	return errors.Join(errs...)
}

// lostError is the error Abort recorded, nil if none.
func (p *P2P) lostError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// Latest names the latest CUDA send or recv this rank enqueued with peer,
// numbered in its direction ("recv #5 from rank 2"); "" if none.
func (p *P2P) Latest(peer int) string {
	p.mu.Lock()
	var c *p2pPeer
	if peer >= 0 && peer < len(p.peers) {
		c = p.peers[peer]
	}
	p.mu.Unlock()
	if c == nil {
		return ""
	}
	switch sends, recvs := c.sends.Load(), c.recvs.Load(); {
	case sends+recvs == 0:
		return ""
	case c.lastRecv.Load():
		return fmt.Sprintf("recv #%d from rank %d", recvs, peer)
	default:
		return fmt.Sprintf("send #%d to rank %d", sends, peer)
	}
}
