package gobackend

// The host side of the CUDA p2p channels (internal/gpu's P2P): the team's
// bell, and the host point-to-point path that carries a channel's
// handshake under a reserved tag (p2pSetupTag), not the mesh links, which
// collective-queue tasks use at the same time.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// p2pFrameBytes is the size of every handshake message (a length, then
// the payload): receives are posted before the peer's size is known.
const p2pFrameBytes = 256

// p2pLink is gpu.P2PLink over the endpoint: its team's bell, its host
// send/recv for the handshakes, its failure and its peers' exits.
type p2pLink struct {
	*symm.Team // Ring, Bell, Rings, WaitBell, Aborted
	e          *Endpoint
}

func (l p2pLink) Handshake(peer int, deadline time.Time) cuda.P2PPeer {
	return &p2pMailbox{e: l.e, peer: peer, deadline: deadline}
}

func (l p2pLink) Fail(err error) { l.e.fail(err) }

func (l p2pLink) Dead() []int { return l.Mesh.Dead() }

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
		m.e.stranded.add(out, in)
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

// strandedFrames are the frames of handshakes that failed with their
// works posted: they stay alive until Destroy (after the workers stopped).
type strandedFrames struct {
	mu     sync.Mutex
	frames [][]byte
}

func (s *strandedFrames) add(frames ...[]byte) {
	s.mu.Lock()
	s.frames = append(s.frames, frames...)
	s.mu.Unlock()
}

// drop lets the frames go: the workers that could touch them are gone.
func (s *strandedFrames) drop() {
	s.mu.Lock()
	s.frames = nil
	s.mu.Unlock()
}
