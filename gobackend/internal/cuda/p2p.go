package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A point-to-point channel joins two ranks for the kernels of p2p.cu. Each
// side owns two cuMemAlloc allocations, kept apart: a control allocation
// (P2PCtrlBytes: the counters the peer signals into, its own counts, the
// headers and error words) and a data allocation, its outbox
// (P2PBlocks x P2PSlots slots of SlotBytes). The sides exchange their
// cuIpcGetMemHandle handles through a P2PPeer and open each other's: a
// sender writes its own outbox and signals into the receiver's control; a
// receiver reads the sender's outbox over NVLink and acknowledges into the
// sender's control. Nothing else of the group takes part.

// The channel hello: what one side tells the other about its allocations.
const (
	p2pHelloMagic   = 0x50325347 // "GS2P"
	p2pHelloVersion = 1
	// magic, version, ok, blocks, slots, pad | ctrl bytes, slot bytes, data bytes | two handles
	p2pHelloBytes = 6*4 + 3*8 + 2*len(IpcHandle{})
)

// P2PPeer carries a channel's handshake to the peer. Exchange sends msg
// and returns the message the peer passed to its Exchange at the same
// step; both sides call it the same number of times. An error means the
// link itself failed (a timeout, a dead peer): the caller gives up on the
// peer.
type P2PPeer interface {
	Exchange(step string, msg []byte) ([]byte, error)
}

// P2PSpec says how to open a channel: the context of this side's device,
// the peer's rank (for messages), and the slot size (a multiple of 16; the
// peer must use the same).
type P2PSpec struct {
	Ctx       Context
	Peer      int
	SlotBytes uintptr
}

// P2PDataBytes is the size of one side's outbox for slots of slot bytes.
func P2PDataBytes(slot uintptr) uintptr { return P2PBlocks * P2PSlots * slot }

// P2PChannel is this rank's end of a channel: its own allocations and the
// peer's, opened here. Close it after the device is idle.
type P2PChannel struct {
	Ctrl, Data         uintptr // this side's allocations
	PeerCtrl, PeerData uintptr // the peer's, mapped here
	SlotBytes          uintptr

	d    *Driver
	spec P2PSpec
	errw *ErrorWords // pinned copy of this side's first error (HostError)
}

// OpenP2P opens a channel with spec.Peer. Both sides call it together:
//
//  1. allocate and zero the control allocation, allocate the outbox, and
//     export both (cuIpcGetMemHandle);
//  2. exchange hellos (ok flag, layout, sizes, handles) and check the
//     peer's against this side's;
//  3. open the peer's handles; exchange a confirmation.
//
// A side that fails locally still takes part in both exchanges, saying so,
// so that the peer never waits for it: then both sides release what they
// made and return an error wrapping ErrNotSupported that names the side
// and the step. An error of the peer link itself is returned as it is,
// after releasing.
func OpenP2P(d *Driver, spec P2PSpec, peer P2PPeer) (*P2PChannel, error) {
	c := &P2PChannel{d: d, spec: spec, SlotBytes: spec.SlotBytes}
	step, local := "allocation", c.allocate()
	if local == nil {
		step = "export"
	}
	msg, local := c.hello(local)
	hello, err := peer.Exchange("handles", msg)
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if local == nil {
		step, local = "open", c.open(hello)
	}
	got, err := peer.Exchange("confirm", []byte{boolByte(local == nil)})
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if local == nil && len(got) == 1 && got[0] == 1 {
		return c, nil
	}
	why := fmt.Sprintf("rank %d could not open its end", spec.Peer)
	if local != nil {
		why = fmt.Sprintf("this rank failed at %s: %v", step, local)
	}
	if cerr := c.Close(); cerr != nil {
		why += fmt.Sprintf(" (and releasing: %v)", cerr)
	}
	return nil, fmt.Errorf("%w: p2p channel with rank %d: %s", ErrNotSupported, spec.Peer, why)
}

// RefuseP2P takes a peer's OpenP2P through both its steps for a side that
// cannot open a channel at all (no CUDA, no kernels), so that the peer
// fails at once instead of waiting. It returns only errors of the link.
func RefuseP2P(peer P2PPeer) error {
	msg, _ := (&P2PChannel{}).hello(errRefused)
	if _, err := peer.Exchange("handles", msg); err != nil {
		return err
	}
	_, err := peer.Exchange("confirm", []byte{0})
	return err
}

var errRefused = errors.New("refused")

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// allocate makes this side's allocations; what it made is recorded for
// Close even when a later step fails.
func (c *P2PChannel) allocate() error {
	d, ctx := c.d, c.spec.Ctx
	if c.SlotBytes < 16 || c.SlotBytes%16 != 0 {
		return fmt.Errorf("slot size %d is not a positive multiple of 16", c.SlotBytes)
	}
	var err error
	if c.Ctrl, err = d.MemAlloc(ctx, P2PCtrlBytes); err != nil {
		return err
	}
	if c.Data, err = d.MemAlloc(ctx, P2PDataBytes(c.SlotBytes)); err != nil {
		return err
	}
	if c.errw, err = NewErrorWords(d, ctx); err != nil {
		return err
	}
	return c.zeroCtrl()
}

// zeroCtrl clears the control allocation before the peer may signal into
// it (the counters start at zero and only grow).
func (c *P2PChannel) zeroCtrl() error {
	return c.d.Privately(c.spec.Ctx, func(s Stream) error {
		return c.d.MemsetD32Async(c.spec.Ctx, c.Ctrl, 0, P2PCtrlBytes/4, s)
	})
}

// hello is this side's announcement after allocating with result local:
// the layout, and the handles unless local or the export failed (then its
// ok word is 0 and the error is returned with it).
func (c *P2PChannel) hello(local error) ([]byte, error) {
	b := make([]byte, p2pHelloBytes)
	le := binary.LittleEndian
	le.PutUint32(b[0:], p2pHelloMagic)
	le.PutUint32(b[4:], p2pHelloVersion)
	le.PutUint32(b[12:], P2PBlocks)
	le.PutUint32(b[16:], P2PSlots)
	le.PutUint64(b[24:], P2PCtrlBytes)
	le.PutUint64(b[32:], uint64(c.SlotBytes))
	le.PutUint64(b[40:], uint64(P2PDataBytes(c.SlotBytes)))
	if local != nil {
		return b, local
	}
	for i, p := range []uintptr{c.Ctrl, c.Data} {
		h, err := c.d.IpcGetMemHandle(c.spec.Ctx, p)
		if err != nil {
			return b, err // ok stays 0: the peer fails too
		}
		copy(b[48+i*len(h):], h[:])
	}
	le.PutUint32(b[8:], 1)
	return b, nil
}

// open checks the peer's hello against this side and opens its handles.
func (c *P2PChannel) open(hello []byte) error {
	le := binary.LittleEndian
	switch {
	case len(hello) != p2pHelloBytes || le.Uint32(hello[0:]) != p2pHelloMagic:
		return fmt.Errorf("rank %d sent a malformed hello (%d bytes)", c.spec.Peer, len(hello))
	case le.Uint32(hello[4:]) != p2pHelloVersion:
		return fmt.Errorf("rank %d speaks channel version %d, this rank %d", c.spec.Peer, le.Uint32(hello[4:]), p2pHelloVersion)
	case le.Uint32(hello[8:]) != 1:
		return fmt.Errorf("rank %d could not allocate or export its end", c.spec.Peer)
	case le.Uint32(hello[12:]) != P2PBlocks || le.Uint32(hello[16:]) != P2PSlots || le.Uint64(hello[24:]) != P2PCtrlBytes:
		return fmt.Errorf("rank %d lays its channel out differently (another build of gosym?)", c.spec.Peer)
	case le.Uint64(hello[32:]) != uint64(c.SlotBytes) || le.Uint64(hello[40:]) != uint64(P2PDataBytes(c.SlotBytes)):
		return fmt.Errorf("rank %d uses %d-byte slots, this rank %d (GOSYM_GPU_P2P_SLOT_BYTES must be the same on every rank)",
			c.spec.Peer, le.Uint64(hello[32:]), c.SlotBytes)
	}
	var h IpcHandle
	var err error
	copy(h[:], hello[48:])
	if c.PeerCtrl, err = c.d.IpcOpenMemHandle(c.spec.Ctx, h, IpcLazyEnablePeerAccess); err != nil {
		return fmt.Errorf("open rank %d's control allocation: %w", c.spec.Peer, err)
	}
	copy(h[:], hello[48+len(h):])
	if c.PeerData, err = c.d.IpcOpenMemHandle(c.spec.Ctx, h, IpcLazyEnablePeerAccess); err != nil {
		return fmt.Errorf("open rank %d's outbox: %w", c.spec.Peer, err)
	}
	return nil
}

// Close releases the peer's mappings, then this side's allocations, each
// once, even when a step fails; the device must be idle (no kernel of the
// channel running). It may be called again. A channel that was used is
// torn down with Leave, Settled, then Close.
func (c *P2PChannel) Close() error {
	err := c.closeImports()
	d, ctx := c.d, c.spec.Ctx
	var errs []error
	for _, p := range []*uintptr{&c.Ctrl, &c.Data} {
		if *p != 0 {
			errs = append(errs, d.MemFree(ctx, *p))
			*p = 0
		}
	}
	errs = append(errs, c.errw.Close())
	c.errw = nil
	return errors.Join(append(errs, err)...)
}

func (c *P2PChannel) closeImports() error {
	var errs []error
	for _, p := range []*uintptr{&c.PeerCtrl, &c.PeerData} {
		if *p != 0 {
			errs = append(errs, c.d.IpcCloseMemHandle(c.spec.Ctx, *p))
			*p = 0
		}
	}
	return errors.Join(errs...)
}

// Leave is the first step of a teardown, once this device is idle: it sets
// the GONE word in the peer's control (this side will not touch the peer's
// memory again) and closes this side's mappings of the peer's memory.
// CUDA calls freeing exported memory before its importer closed it
// undefined, so a side frees its own allocations (Close) once the peer is
// gone too, or has drained and did not leave within a grace period (it
// goes on running; see Settled). tell false skips the GONE word: the
// peer's process exited, and nothing of it is to be written any more.
func (c *P2PChannel) Leave(tell bool) error {
	var err error
	if c.PeerCtrl != 0 && tell {
		err = c.d.Privately(c.spec.Ctx, func(s Stream) error {
			return c.d.MemsetD32Async(c.spec.Ctx, c.PeerCtrl+4*P2PGoneWord, 1, 1, s)
		})
	}
	return errors.Join(err, c.closeImports())
}

// Abort leaves code with detail in this side's ABORT words (detail
// first), through a stream of its own while kernels of the channel may
// spin on the caller's streams: every wait of those kernels, and of any
// launched later, records it as the channel's error and returns.
func (c *P2PChannel) Abort(code, detail uint32) error {
	if c.Ctrl == 0 {
		return nil
	}
	return c.d.Privately(c.spec.Ctx, func(s Stream) error {
		return c.d.PutAbort(c.spec.Ctx, s, c.Ctrl, P2PAbortWord, P2PAbortDetailWord, code, detail)
	})
}

// Settled reports what this side's control says about the peer: gone, it
// left the channel (it will not touch this side's memory again), and
// drained, it consumed every chunk this side sent (a correct peer has no
// reason to read this side's memory again). The device must be idle (a
// synchronous copy of the control allocation).
func (c *P2PChannel) Settled() (gone, drained bool, err error) {
	b := make([]byte, P2PCtrlBytes)
	if err := c.d.MemcpyDtoH(c.spec.Ctx, b, c.Ctrl); err != nil {
		return false, false, err
	}
	gone, drained = settled(b)
	return gone, drained, nil
}

// settled is Settled's answer for a copy of a control allocation.
func settled(ctrl []byte) (gone, drained bool) {
	word := func(i int) uint32 { return binary.LittleEndian.Uint32(ctrl[4*i:]) }
	for b := 0; b < P2PBlocks; b++ {
		if word(P2PSentWord+b*P2PLineWords) != word(P2PAckWord+b*P2PLineWords) {
			return word(P2PGoneWord) != 0, false
		}
	}
	return word(P2PGoneWord) != 0, true
}

// Send enqueues on s the sending half of a message of n bytes at src with
// tag (f: gs_p2p_send, loaded in the channel's context); the receiver must
// enqueue the same n and tag. timeoutNs bounds every wait of the kernel.
func (c *P2PChannel) Send(f *Function, s Stream, src uintptr, n uint64, tag int64, timeoutNs uint64) error {
	return c.launch(f, s, P2PParams{Buf: src, Box: c.Data, Bytes: n, Tag: tag}, timeoutNs)
}

// Recv enqueues on s the receiving half into dst (f: gs_p2p_recv). A
// message of another size or tag is drained without writing dst and
// recorded in this side's error words (ErrorWords).
func (c *P2PChannel) Recv(f *Function, s Stream, dst uintptr, n uint64, tag int64, timeoutNs uint64) error {
	return c.launch(f, s, P2PParams{Buf: dst, Box: c.PeerData, Bytes: n, Tag: tag}, timeoutNs)
}

func (c *P2PChannel) launch(f *Function, s Stream, p P2PParams, timeoutNs uint64) error {
	if c.Ctrl == 0 || c.PeerCtrl == 0 {
		return fmt.Errorf("cuda: p2p channel with rank %d is closed", c.spec.Peer)
	}
	p.Ctrl, p.PeerCtrl, p.SlotBytes, p.TimeoutNs = c.Ctrl, c.PeerCtrl, uint64(c.SlotBytes), timeoutNs
	if c.errw != nil {
		p.HostErr = c.errw.Device()
	}
	grid, block := P2PGrid()
	return c.d.Launch(f, grid, block, 0, s, &p)
}

// P2PChannelAt is a channel with no memory whose pinned error words are w:
// for tests that play the kernels' part.
func P2PChannelAt(w *ErrorWords) *P2PChannel { return &P2PChannel{errw: w} }

// HostError returns the first error a kernel of this side recorded (its
// error words: code, detail, then the bytes and tag of a mismatched
// message) from the pinned copy: atomic loads, no driver call, so it is
// checked before every op. ok is false while none is recorded.
func (c *P2PChannel) HostError() (w [P2PErrorWords]uint32, ok bool) {
	if c.errw == nil {
		return w, false
	}
	all := c.errw.Words()
	copy(w[:], all[:])
	return w, w[0] != 0
}

// ErrorWords reads this side's error words (code, detail, then the bytes
// and tag of a mismatched message) with a synchronous copy: for teardown
// and checks, when the device is idle.
func (c *P2PChannel) ErrorWords() ([P2PErrorWords]uint32, error) {
	var w [P2PErrorWords]uint32
	b := make([]byte, 4*P2PErrorWords)
	if err := c.d.MemcpyDtoH(c.spec.Ctx, b, c.Ctrl+4*P2PErrorWord); err != nil {
		return w, err
	}
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w, nil
}
