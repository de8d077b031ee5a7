package gpu

// Setting a channel up: this side's half of the handshake, run by the
// asker's op or, at the peer's request, by a responder that the listener
// starts (p2p.go says why setup never waits for the peer's caller).

import (
	"errors"
	"fmt"
	"time"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// open runs this side's half of the handshake with peer (what names
// it in errors). Local failures (no CUDA, no device, a compile error) still
// take part, as refusals, so that the peer never waits for this rank;
// failures of either side are NotSupported on both.
func (p *P2P) open(c *p2pPeer, peerRank int, what string) error {
	peer := p.link.Handshake(peerRank, time.Now().Add(p.grp.Timeout))
	var err error
	if c.device < 0 {
		err = fmt.Errorf("this rank had run no CUDA op on group %q within %v of rank %d asking (its device is unknown)",
			p.grp.Name, p.grp.Timeout/2, peerRank)
	} else if c.g, err = Open(c.device); err == nil {
		if c.send, err = c.g.Function(cuda.P2PSendKernel); err == nil {
			c.recv, err = c.g.Function(cuda.P2PRecvKernel)
		}
	}
	if err != nil {
		dlog.Printf("rank %d: CUDA p2p with rank %d: %v", p.grp.Rank, peerRank, err)
		if lerr := cuda.RefuseP2P(peer); lerr != nil {
			return p.linkError(lerr, what)
		}
		return status.Errorf(status.NotSupported, "%s: %v", what, err)
	}
	c.ch, err = cuda.OpenP2P(c.g.Driver(), cuda.P2PSpec{Ctx: c.g.Context(), Peer: peerRank, SlotBytes: p2pSlotBytes()}, peer)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, cuda.ErrNotSupported):
		return status.Errorf(status.NotSupported, "%s: %v", what, err)
	}
	return p.linkError(err, what)
}

// Listen sleeps on the bell and answers every peer that rang it, until
// the endpoint is aborted. The endpoint runs it on a goroutine of its own
// once Init ran, and waits for it with its workers.
func (p *P2P) Listen() {
	seen, rang := make([]uint32, p.grp.World), make([]uint32, p.grp.World)
	for {
		bell := p.link.Bell()
		if p.link.Aborted() {
			return
		}
		p.link.Rings(rang)
		for r, n := range rang {
			if n != seen[r] {
				seen[r] = n
				p.answer(r)
			}
		}
		p.link.WaitBell(bell, time.Minute)
	}
}

// answer starts this side's half of the channel with peer, which asked
// for it, unless a half is running or done (this rank asked too, or
// already answered).
func (p *P2P) answer(peer int) {
	p.mu.Lock()
	if p.closed || peer < 0 || peer >= p.grp.World || peer == p.grp.Rank {
		p.mu.Unlock()
		return
	}
	if p.peers == nil {
		p.peers = make([]*p2pPeer, p.grp.World)
	}
	if p.peers[peer] != nil {
		p.mu.Unlock()
		return
	}
	c := &p2pPeer{done: make(chan struct{}), asked: true, device: -1}
	p.peers[peer] = c
	p.mu.Unlock()
	p.answered.Add(1)
	go func() {
		c.device = p.device(time.Now().Add(p.grp.Timeout / 2))
		p.finish(c, p.open(c, peer, fmt.Sprintf("setting up the CUDA p2p channel that rank %d asked for (on cuda:%d)", peer, c.device)))
	}()
}

// device is the device of this rank's CUDA ops on the group, else of its
// process's where they all ran on one (a new group whose first CUDA op is
// a peer's request: one GPU per process is the rule), waiting for one
// until deadline (or the group's destruction): -1 if none ran.
func (p *P2P) device(deadline time.Time) int {
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		for _, d := range []int32{int32(p.plane.Ordinal()) + 1, p.hint.Load(), processDevice.Load()} {
			if d > 0 {
				return int(d) - 1
			}
		}
		if time.Now().After(deadline) || p.link.Aborted() {
			return -1
		}
		time.Sleep(pause)
	}
}

// linkError is a handshake that broke on the host path: the pair is out
// of step, so the group is unusable, as after any failed p2p message.
func (p *P2P) linkError(err error, what string) error {
	var coded *status.Error
	if !errors.As(err, &coded) {
		err = status.Wrap(status.Peer, err, "%s", what)
	} else {
		err = status.Wrap(status.CodeOf(err), err, "%s", what)
	}
	p.link.Fail(err)
	return err
}
