package gobackend

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
// open a channel, and the group goes on.
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
// lives until the endpoint is destroyed.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// p2pSetupTag marks the host messages of a channel handshake. Post and Run
// refuse it for callers' messages, so the two can never be confused.
const p2pSetupTag = math.MinInt64

// p2pFrameBytes is the size of every handshake message (a length, then
// the payload): receives are posted before the peer's size is known.
const p2pFrameBytes = 256

// gpuP2P is an endpoint's CUDA point-to-point side: a channel per peer.
type gpuP2P struct {
	mu       sync.Mutex
	peers    []*p2pPeer // by rank, made on first use
	closed   bool
	stranded [][]byte     // frames of handshakes that failed with their works posted
	hint     atomic.Int32 // ordinal + 1 of this rank's first CUDA send/recv on the group

	channels, answered, sends, recvs atomic.Int64 // for the stats
}

// p2pPeer is the channel with one peer, or why there is none (sticky: the
// two sides failed together).
type p2pPeer struct {
	done   chan struct{} // closed once the handshake finished, either way
	asked  bool          // set up by the responder, at the peer's request
	device int           // -1 while a responder waits for this rank's device
	g      *gpu.Device
	ch     *cuda.P2PChannel
	err    error
	send   *cuda.Function
	recv   *cuda.Function
	used   atomic.Bool // kernels were enqueued: close waits for the device
}

// checkUserTag refuses the tag the channel handshake reserves.
func checkUserTag(op *Op) error {
	if op.Kind.IsP2P() && op.Tag == p2pSetupTag {
		return status.Errorf(status.InvalidArg, "gosym: %s: tag %d is reserved by gosym", op.Kind, op.Tag)
	}
	return nil
}

// p2pWho names a send or recv with its peer, for errors.
func p2pWho(op *Op) string {
	if op.Kind == ops.Send {
		return fmt.Sprintf("send to rank %d", op.Peer)
	}
	return fmt.Sprintf("recv from rank %d", op.Peer)
}

// runP2PCUDA enqueues a send or recv of CUDA device memory on stream
// (capturing: the stream is being captured into a CUDA graph). The op is
// matched with the peer's in the order of the pair's CUDA messages, one
// direction at a time; its size and tag must be the peer's (a receiver
// that expected another drains the message and writes nothing). The
// returned Work is complete.
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
	e.p2p.hint.CompareAndSwap(0, int32(device)+1) // a responder waiting for it goes on
	p, err := e.p2p.channel(e, op, device, capturing)
	if err != nil {
		return nil, err
	}
	if err := p.deviceError(e, op.Peer); err != nil {
		return nil, err
	}
	n := uint64(op.Count * op.DType.Size())
	timeout := uint64(e.Timeout.Nanoseconds())
	p.used.Store(true)
	count := &e.p2p.sends
	if op.Kind == ops.Send {
		err = p.ch.Send(p.send, cuda.Stream(stream), op.In, n, op.Tag, timeout)
	} else {
		count = &e.p2p.recvs
		err = p.ch.Recv(p.recv, cuda.Stream(stream), op.Out, n, op.Tag, timeout)
	}
	if err != nil {
		return nil, status.Wrap(status.System, err, "gosym: %s on cuda:%d", p2pWho(op), device)
	}
	count.Add(1)
	e.stats.Posted.Add(1)
	e.stats.Completed.Add(1)
	return &Work{op: *op, done: closedDone}, nil
}

// deviceError is the error a kernel of this channel recorded, nil while
// none. It is sticky: after a timeout the two sides' counters are out of
// step, and after a drained mismatch the pair's programs disagree, so every
// later CUDA send or recv with that peer fails with it (collectives and the
// other peers' channels go on).
func (c *p2pPeer) deviceError(e *Endpoint, peer int) error {
	w, set := c.ch.HostError()
	if !set {
		return nil
	}
	code := status.Internal
	switch w[0] {
	case cuda.ErrTimeout:
		code = status.Timeout
	case cuda.ErrMismatch:
		code = status.InvalidArg
	}
	return status.Errorf(code, "gosym: CUDA send/recv between ranks %d and %d of group %q on cuda:%d: a kernel recorded %s; "+
		"the pair cannot run CUDA send/recv any more", e.Rank, peer, e.Name, c.device, p2pErrorText(peer, w))
}

// deviceError is the first error any channel's kernels recorded, nil if
// none (DeviceError, stats; host memory only).
func (p *gpuP2P) deviceError(e *Endpoint) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed { // close frees the channels without the lock
		return nil
	}
	for r, c := range p.peers {
		if c == nil || !isDone(c.done) || c.ch == nil {
			continue
		}
		if err := c.deviceError(e, r); err != nil {
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
func (p *gpuP2P) channel(e *Endpoint, op *Op, device int, capturing bool) (*p2pPeer, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, status.Errorf(status.Closed, "gosym: %s on a destroyed group", op.Kind)
	}
	if p.peers == nil {
		p.peers = make([]*p2pPeer, e.Size)
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
		e.team.Ring(op.Peer) // the peer's responder runs its half
		p.finish(e, c, e.openP2P(c, op.Peer, fmt.Sprintf("gosym: %s on cuda:%d: setting up the CUDA p2p channel", p2pWho(op), c.device)))
	} else {
		t := time.NewTimer(2 * e.Timeout)
		select {
		case <-c.done:
			t.Stop()
		case <-t.C:
			return nil, status.Errorf(status.Timeout, "gosym: %s on CUDA: the channel with rank %d is still being set up after %v",
				p2pWho(op), op.Peer, 2*e.Timeout)
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
func (p *gpuP2P) finish(e *Endpoint, c *p2pPeer, err error) {
	c.err = err
	if err == nil {
		p.channels.Add(1)
		e.gpu.ClaimOrdinal(c.device)
	}
	close(c.done)
}

// openP2P runs this side's half of the handshake with peer (what names
// it in errors). Local failures (no CUDA, no device, a compile error) still
// take part, as refusals, so that the peer never waits for this rank;
// failures of either side are NotSupported on both.
func (e *Endpoint) openP2P(c *p2pPeer, peerRank int, what string) error {
	peer := &p2pMailbox{e: e, peer: peerRank, deadline: time.Now().Add(e.Timeout)}
	var err error
	if c.device < 0 {
		err = fmt.Errorf("this rank had run no CUDA op on group %q within %v of rank %d asking (its device is unknown)",
			e.Name, e.Timeout/2, peerRank)
	} else if c.g, err = gpu.Open(c.device); err == nil {
		if c.send, err = c.g.Function(cuda.P2PSendKernel); err == nil {
			c.recv, err = c.g.Function(cuda.P2PRecvKernel)
		}
	}
	if err != nil {
		dlog.Printf("rank %d: CUDA p2p with rank %d: %v", e.Rank, peerRank, err)
		if lerr := cuda.RefuseP2P(peer); lerr != nil {
			return linkError(e, lerr, what)
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
	return linkError(e, err, what)
}

// startListener starts the endpoint's listener (Connect calls it once the
// team exists); Destroy's Abort stops it, and waits for it with the
// workers.
func (p *gpuP2P) startListener(e *Endpoint) {
	e.workers.Add(1)
	go p.listen(e)
}

// listen sleeps on the bell and answers every peer that rang it.
func (p *gpuP2P) listen(e *Endpoint) {
	defer e.workers.Done()
	seen, rang := make([]uint32, e.Size), make([]uint32, e.Size)
	for {
		bell := e.team.Bell()
		if e.team.Aborted() {
			return
		}
		e.team.Rings(rang)
		for r, n := range rang {
			if n != seen[r] {
				seen[r] = n
				p.answer(e, r)
			}
		}
		e.team.WaitBell(bell, time.Minute)
	}
}

// answer starts this side's half of the channel with peer, which asked
// for it, unless a half is running or done (this rank asked too, or
// already answered).
func (p *gpuP2P) answer(e *Endpoint, peer int) {
	p.mu.Lock()
	if p.closed || peer < 0 || peer >= e.Size || peer == e.Rank {
		p.mu.Unlock()
		return
	}
	if p.peers == nil {
		p.peers = make([]*p2pPeer, e.Size)
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
		c.device = p.device(e, time.Now().Add(e.Timeout/2))
		p.finish(e, c, e.openP2P(c, peer, fmt.Sprintf("setting up the CUDA p2p channel that rank %d asked for (on cuda:%d)", peer, c.device)))
	}()
}

// processDevice is the CUDA device of this process's CUDA ops on any
// group (ordinal + 1; 0: none yet; -1: more than one).
var processDevice atomic.Int32

// noteProcessDevice records a CUDA op on device (PostCUDA).
func noteProcessDevice(device int) {
	v := int32(device) + 1
	for {
		old := processDevice.Load()
		if old == v || old == -1 {
			return
		}
		next := v
		if old != 0 {
			next = -1
		}
		if processDevice.CompareAndSwap(old, next) {
			return
		}
	}
}

// device is the device of this rank's CUDA ops on the group, else of its
// process's where they all ran on one (a new group whose first CUDA op is
// a peer's request: one GPU per process is the rule), waiting for one
// until deadline (or the group's destruction): -1 if none ran.
func (p *gpuP2P) device(e *Endpoint, deadline time.Time) int {
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		for _, d := range []int32{int32(e.gpu.Ordinal()) + 1, p.hint.Load(), processDevice.Load()} {
			if d > 0 {
				return int(d) - 1
			}
		}
		if time.Now().After(deadline) || e.team.Aborted() {
			return -1
		}
		time.Sleep(pause)
	}
}

// linkError is a handshake that broke on the host path: the pair is out
// of step, so the group is unusable, as after any failed p2p message.
func linkError(e *Endpoint, err error, what string) error {
	var coded *status.Error
	if !errors.As(err, &coded) {
		err = status.Wrap(status.Peer, err, "%s", what)
	} else {
		err = status.Wrap(status.CodeOf(err), err, "%s", what)
	}
	e.fail(err)
	return err
}

// p2pSlotBytes reads GOSYM_GPU_P2P_SLOT_BYTES: the outbox slot of one
// block (rounded down to a multiple of 16); both sides of a channel must
// use the same. A round of a message is P2PBlocks slots, and a sender runs
// up to P2PSlots rounds ahead of its receiver.
func p2pSlotBytes() uintptr {
	return uintptr(max(16, config.GPUP2PSlotBytes.Get()&^15))
}

// p2pMailbox carries a channel handshake over the host point-to-point
// path: each Exchange sends one frame to the peer and receives the peer's,
// both under p2pSetupTag.
type p2pMailbox struct {
	e        *Endpoint
	peer     int
	deadline time.Time
}

func (m *p2pMailbox) Exchange(step string, msg []byte) ([]byte, error) {
	if len(msg) > p2pFrameBytes-4 {
		return nil, fmt.Errorf("p2p handshake: a %d-byte message does not fit a frame", len(msg))
	}
	out, in := make([]byte, p2pFrameBytes), make([]byte, p2pFrameBytes)
	binary.LittleEndian.PutUint32(out, uint32(len(msg)))
	copy(out[4:], msg)
	op := func(k ops.Kind, buf []byte) Op {
		a := uintptr(unsafe.Pointer(&buf[0]))
		o := Op{Kind: k, DType: dtype.Uint8, Peer: m.peer, Tag: p2pSetupTag, Count: len(buf)}
		if k == ops.Send {
			o.In = a
		} else {
			o.Out = a
		}
		return o
	}
	so, ro := op(ops.Send, out), op(ops.Recv, in)
	sw, err := m.e.post(&so, true)
	if err != nil {
		return nil, err
	}
	rw, err := m.e.post(&ro, true)
	if err == nil {
		err = m.wait(rw, step)
	}
	err = errors.Join(err, m.wait(sw, step))
	if err != nil {
		// A work that timed out is still posted and may read or write its
		// frame later (by address): the frames stay alive until the
		// endpoint's workers are gone.
		m.e.p2p.strand(out, in)
		return nil, err
	}
	runtime.KeepAlive(out)
	n := binary.LittleEndian.Uint32(in)
	if n > p2pFrameBytes-4 {
		return nil, fmt.Errorf("p2p handshake: rank %d sent a frame of %d bytes", m.peer, n)
	}
	return in[4 : 4+n], nil
}

// wait waits for w until the handshake's deadline; a timeout names the
// peer and the step.
func (m *p2pMailbox) wait(w *Work, step string) error {
	left := time.Until(m.deadline)
	if left <= 0 {
		left = time.Millisecond
	}
	err := w.Wait(left)
	if status.CodeOf(err) == status.Timeout {
		return status.Errorf(status.Timeout, "timed out after %v waiting for rank %d (step %q; did it post the matching CUDA send/recv?)",
			m.e.Timeout, m.peer, step)
	}
	return err
}

// strand keeps frames alive until close (after the workers stopped).
func (p *gpuP2P) strand(frames ...[]byte) {
	p.mu.Lock()
	p.stranded = append(p.stranded, frames...)
	p.mu.Unlock()
}

// p2pGrace is how long Destroy waits for a peer that consumed everything
// to leave the channel too before freeing this side's memory anyway.
const p2pGrace = 2 * time.Second

// close waits for handshakes in flight (they fail fast once the endpoint
// is closed) and tears every channel down. Once the devices are idle, each
// side tells its peer it left and drops its mappings of the peer's memory
// (Leave); it frees its own allocations once the peer left too (so an
// importer always closes before its exporter frees when both ranks
// destroy the group), or consumed everything this side sent and did not
// leave within p2pGrace (it goes on running), or exited, or the group's
// timeout passed. Errors the kernels recorded are logged.
func (p *gpuP2P) close(e *Endpoint) {
	p.mu.Lock()
	p.closed = true
	peers := p.peers
	p.stranded = nil // the workers that could touch them are gone
	p.mu.Unlock()
	synced := map[*gpu.Device]bool{}
	var open []int
	for r, c := range peers {
		if c == nil {
			continue
		}
		<-c.done
		if c.ch == nil {
			continue
		}
		if c.used.Load() && !synced[c.g] {
			synced[c.g] = true
			if err := c.g.Driver().CtxSynchronize(c.g.Context()); err != nil && !errors.Is(err, cuda.ErrNotSupported) {
				dlog.Printf("rank %d: cuCtxSynchronize before closing the p2p channels: %v", e.Rank, err)
			}
		}
		if dlog.On {
			if w, err := c.ch.ErrorWords(); err == nil && w[0] != 0 {
				dlog.Printf("rank %d: the CUDA p2p channel with rank %d recorded %s", e.Rank, r, p2pErrorText(r, w))
			}
		}
		if err := c.ch.Leave(); err != nil {
			dlog.Printf("rank %d: leaving the CUDA p2p channel with rank %d: %v", e.Rank, r, err)
		}
		open = append(open, r)
	}
	start := time.Now()
	for pause := time.Millisecond; len(open) > 0; pause = min(2*pause, 50*time.Millisecond) {
		var dead []int
		if e.mesh != nil {
			dead = e.mesh.Dead()
		}
		waited := time.Since(start)
		left := open[:0]
		for _, r := range open {
			c := peers[r]
			gone, drained, err := c.ch.Settled()
			free := gone || err != nil || slices.Contains(dead, r) || waited > e.Timeout || (drained && waited > p2pGrace)
			if !free {
				left = append(left, r)
				continue
			}
			if !gone {
				dlog.Printf("rank %d: freeing the CUDA p2p channel with rank %d before it left (drained %v, %v)", e.Rank, r, drained, err)
			}
			if err := c.ch.Close(); err != nil {
				dlog.Printf("rank %d: closing the CUDA p2p channel with rank %d: %v", e.Rank, r, err)
			}
			c.ch = nil
		}
		open = left
		if len(open) > 0 {
			time.Sleep(pause)
		}
	}
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
	}
	return fmt.Sprintf("error %d", w[0])
}

func (p *gpuP2P) stats(e *Endpoint, m map[string]any) {
	m["gpu_p2p_channels"] = p.channels.Load()
	m["gpu_p2p_answered"] = p.answered.Load()
	m["gpu_p2p_sends"] = p.sends.Load()
	m["gpu_p2p_recvs"] = p.recvs.Load()
	m["gpu_p2p_slot_bytes"] = int64(p2pSlotBytes())
	if err := p.deviceError(e); err != nil {
		m["gpu_p2p_error"] = err.Error()
	}
}
