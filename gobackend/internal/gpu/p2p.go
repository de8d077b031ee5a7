package gpu

// send and recv on CUDA memory. Each (endpoint, peer) pair gets a channel
// (cuda.P2PChannel: per side a control allocation and an outbox, opened by
// the peer through legacy CUDA IPC), made by the first CUDA send or recv
// between the two ranks and by them alone: no other rank of the group takes
// part, and p2p ops take no collective sequence number. The two sides
// exchange their handles through the host point-to-point path (the
// mailboxes and inboxes that carry CPU send/recv) under a reserved tag, not
// over the mesh links, which collective-queue tasks use at the same time.
//
// Setup never waits for the peer's caller. The side whose caller needs the
// channel first (the asker) rings the peer's bell (symm.Team.Ring) and runs
// its half of the handshake; the peer's listener (a goroutine of its
// endpoint, asleep on the bell) starts the peer's half on a goroutine of
// its own (the responder), on the device of the group's CUDA ops there,
// unless a half is running or done already. So the asker waits only on the
// peer's engine: a ring of first sends (0 asks 1, 1 asks 2, 2 asks 0)
// completes, where waiting for each peer's caller formed a cycle. When both
// sides ask at once (glare) each runs its half once, the listener finding a
// half already there, and both converge on the one channel. A responder
// whose rank has run no CUDA op on the group yet takes the device of its
// process's CUDA ops if they all ran on one, else waits for one (its
// caller names the device) for up to half the group's timeout, then
// refuses: both sides fail with NotSupported, as for any side that cannot
// open a channel, and the group goes on (p2p_setup.go).
//
// An op only enqueues gs_p2p_send or gs_p2p_recv on the stream the caller
// names (Python passes its internal stream for the peer and direction) and
// is complete on the host at once; the kernels pace each other through
// counters on the devices. A send waits on the device only for its own
// receiver (once the message outgrows the slots), so with a stream per
// peer and direction no pattern of posts makes kernels of different pairs
// wait on each other; on one stream for all peers, all-pairs exchanges
// posted in rotated orders would (0's send to 1 behind nothing, 1's
// receive from 0 behind its receive from 2, ... back to 0). The channel
// lives until the endpoint is destroyed (p2p_close.go).

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// P2PLink is all the CUDA point-to-point side asks of its endpoint: the
// team's bell, the host point-to-point path that carries a handshake, and
// the group's failure. None of it is collective: only the pair takes part.
type P2PLink interface {
	// Ring rings peer's bell on behalf of this rank: its listener answers.
	Ring(peer int)
	// Bell, Rings and WaitBell are this rank's bell (symm.Team's): read
	// Bell, then Rings (how often each peer rang), then sleep until the
	// bell is no longer the one read, for at most d.
	Bell() uint32
	Rings(n []uint32)
	WaitBell(seen uint32, d time.Duration)
	// Aborted reports whether the endpoint is being destroyed.
	Aborted() bool
	// Handshake is the host path to peer for one channel handshake, every
	// exchange of it by deadline.
	Handshake(peer int, deadline time.Time) cuda.P2PPeer
	// Fail breaks the group: a handshake broke on the host path, so the
	// pair is out of step.
	Fail(err error)
	// Dead lists the peers whose process exited.
	Dead() []int
}

// P2P is an endpoint's CUDA point-to-point side: a channel per peer.
type P2P struct {
	grp   Group   // who this rank is (its Peers are the collectives')
	link  P2PLink // set by Init, before any op or the listener
	plane *State  // the group's CUDA side: its device

	mu     sync.Mutex
	peers  []*p2pPeer // by rank, made on first use
	closed bool
	lost   error        // the group's error once a peer was lost (lost.go)
	hint   atomic.Int32 // ordinal + 1 of this rank's first CUDA send/recv on the group

	channels, answered, sends, recvs atomic.Int64 // for the stats
}

// p2pPeer is the channel with one peer, or why there is none (sticky: the
// two sides failed together).
type p2pPeer struct {
	done   chan struct{} // closed once the handshake finished, either way
	asked  bool          // set up by the responder, at the peer's request
	device int           // -1 while a responder waits for this rank's device
	g      *Device
	ch     *cuda.P2PChannel
	err    error
	send   *cuda.Function
	recv   *cuda.Function
	used   atomic.Bool // kernels were enqueued: close waits for the device

	sends, recvs atomic.Int64 // messages enqueued each way, for Latest
	lastRecv     atomic.Bool  // the latest was a recv
}

// Init readies p for grp over link, next to the group's plane (Connect
// calls it once the team exists, before the listener starts).
func (p *P2P) Init(grp Group, link P2PLink, plane *State) {
	p.grp, p.link, p.plane = grp, link, plane
}

// p2pWho names a send or recv with its peer, for errors.
func p2pWho(op *ops.Op) string {
	if op.Kind == ops.Send {
		return fmt.Sprintf("send to rank %d", op.Peer)
	}
	return fmt.Sprintf("recv from rank %d", op.Peer)
}

// Run enqueues a send or recv of CUDA device memory on stream
// (capturing: the stream is being captured into a CUDA graph). The op is
// matched with the peer's in the order of the pair's CUDA messages, one
// direction at a time; its size and tag must be the peer's (a receiver
// that expected another drains the message and writes nothing). The
// caller checked op; it is complete on the host when Run returns.
func (p *P2P) Run(op *ops.Op, device int, stream cuda.Stream, capturing bool) error {
	p.hint.CompareAndSwap(0, int32(device)+1) // a responder waiting for it goes on
	c, err := p.channel(op, device, capturing)
	if err != nil {
		return err
	}
	if err := p.lostError(); err != nil { // after the channel exists: lost.go
		return err
	}
	if err := c.deviceError(p.grp, op.Peer); err != nil {
		return err
	}
	n := uint64(op.Count * op.DType.Size())
	timeout := uint64(p.grp.Timeout.Nanoseconds())
	c.used.Store(true)
	count, mine := &p.sends, &c.sends
	if op.Kind == ops.Send {
		err = c.ch.Send(c.send, stream, op.In, n, op.Tag, timeout)
	} else {
		count, mine = &p.recvs, &c.recvs
		err = c.ch.Recv(c.recv, stream, op.Out, n, op.Tag, timeout)
	}
	if err != nil {
		return status.Wrap(status.System, err, "gosym: %s on cuda:%d", p2pWho(op), device)
	}
	count.Add(1)
	mine.Add(1)
	c.lastRecv.Store(op.Kind == ops.Recv)
	return nil
}

// deviceError is the error a kernel of this channel recorded, nil while
// none. It is sticky: after a timeout the two sides' counters are out of
// step, and after a drained mismatch the pair's programs disagree, so every
// later CUDA send or recv with that peer fails with it (collectives and the
// other peers' channels go on).
func (c *p2pPeer) deviceError(grp Group, peer int) error {
	w, set := c.ch.HostError()
	if !set {
		return nil
	}
	code := status.Internal
	switch w[0] {
	case cuda.ErrTimeout:
		code = status.Timeout
	case cuda.ErrPeerLost:
		code = status.Peer
	case cuda.ErrMismatch:
		code = status.InvalidArg
	}
	return status.Errorf(code, "gosym: CUDA send/recv between ranks %d and %d of group %q on cuda:%d: a kernel recorded %s; "+
		"the pair cannot run CUDA send/recv any more", grp.Rank, peer, grp.Name, c.device, p2pErrorText(peer, w))
}

// DeviceError is the group's error once a peer was lost (Abort), else the
// first error any channel's kernels recorded, nil if none (the endpoint's
// DeviceError, stats; host memory only).
func (p *P2P) DeviceError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lost != nil {
		return p.lost
	}
	if p.closed { // close frees the channels without the lock
		return nil
	}
	for r, c := range p.peers {
		if c == nil || !isDone(c.done) || c.ch == nil {
			continue
		}
		if err := c.deviceError(p.grp, r); err != nil {
			return err
		}
	}
	return nil
}

// isDone reports whether ch is closed, without blocking.
func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// channel returns the channel with op.Peer, opening it on first use. Only
// one caller opens it; others wait for that handshake, which has its own
// deadline.
func (p *P2P) channel(op *ops.Op, device int, capturing bool) (*p2pPeer, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, status.Errorf(status.Closed, "gosym: %s on a destroyed group", op.Kind)
	}
	if p.peers == nil {
		p.peers = make([]*p2pPeer, p.grp.World)
	}
	c := p.peers[op.Peer]
	if c == nil && capturing {
		p.mu.Unlock()
		return nil, status.Errorf(status.InvalidArg, "gosym: %s on CUDA inside a CUDA graph capture: the first CUDA send/recv between two ranks sets up their channel, which cannot be captured; run one before capturing",
			p2pWho(op))
	}
	opener := c == nil
	if opener {
		c = &p2pPeer{done: make(chan struct{}), device: device}
		p.peers[op.Peer] = c
	}
	p.mu.Unlock()
	if opener {
		p.link.Ring(op.Peer) // the peer's responder runs its half
		p.finish(c, p.open(c, op.Peer, fmt.Sprintf("gosym: %s on cuda:%d: setting up the CUDA p2p channel", p2pWho(op), c.device)))
	} else {
		t := time.NewTimer(2 * p.grp.Timeout)
		select {
		case <-c.done:
			t.Stop()
		case <-t.C:
			return nil, status.Errorf(status.Timeout, "gosym: %s on CUDA: the channel with rank %d is still being set up after %v",
				p2pWho(op), op.Peer, 2*p.grp.Timeout)
		}
	}
	if c.err != nil && c.asked { // the responder's error: say which op met it
		return nil, status.Wrap(status.CodeOf(c.err), c.err, "gosym: %s on cuda:%d", p2pWho(op), device)
	}
	if c.err != nil {
		return nil, c.err
	}
	if c.device != device {
		return nil, status.Errorf(status.InvalidArg, "gosym: %s on cuda:%d, but this rank's channel with rank %d is on cuda:%d (one device per rank and group)",
			p2pWho(op), device, op.Peer, c.device)
	}
	return c, nil
}

// finish records the outcome of c's handshake and releases its waiters.
func (p *P2P) finish(c *p2pPeer, err error) {
	c.err = err
	if err == nil {
		p.channels.Add(1)
		p.plane.ClaimOrdinal(c.device)
	}
	close(c.done)
}

// p2pSlotBytes reads GOSYM_GPU_P2P_SLOT_BYTES: the outbox slot of one
// block (rounded down to a multiple of 16); both sides of a channel must
// use the same. A round of a message is P2PBlocks slots, and a sender runs
// up to P2PSlots rounds ahead of its receiver.
func p2pSlotBytes() uintptr {
	return uintptr(max(16, config.GPUP2PSlotBytes.Get()&^15))
}

// p2pErrorText describes the error words of a channel with peer.
func p2pErrorText(peer int, w [cuda.P2PErrorWords]uint32) string {
	switch w[0] {
	case cuda.ErrTimeout:
		what := "a free slot (its receiver did not consume)"
		if w[1]&0xff == 1 {
			what = "data (its sender did not send)"
		}
		return fmt.Sprintf("a timeout: block %d waited for %s from rank %d", w[1]>>8, what, peer)
	case cuda.ErrMismatch:
		return fmt.Sprintf("a mismatch: rank %d sent %d bytes with tag %d, which a recv of another size or tag drained",
			peer, uint64(w[2])|uint64(w[3])<<32, int64(uint64(w[4])|uint64(w[5])<<32))
	case cuda.ErrConfig:
		return fmt.Sprintf("a bad launch (%#x, slot %d)", w[1], w[2])
	case cuda.ErrPeerLost:
		return fmt.Sprintf("an abort: rank %d exited", w[1]&0xff)
	}
	return fmt.Sprintf("error %d", w[0])
}

// Stats adds the channels' counters to m.
func (p *P2P) Stats(m map[string]any) {
	m["gpu_p2p_channels"] = p.channels.Load()
	m["gpu_p2p_answered"] = p.answered.Load()
	m["gpu_p2p_sends"] = p.sends.Load()
	m["gpu_p2p_recvs"] = p.recvs.Load()
	m["gpu_p2p_slot_bytes"] = int64(p2pSlotBytes())
	if err := p.DeviceError(); err != nil {
		m["gpu_p2p_error"] = err.Error()
	}
}
