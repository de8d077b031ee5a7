package main

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// The point-to-point kernels (p2p.cu) on a channel whose two sides the
// checker lays out itself: on one GPU (two simulated ranks, cuMemAlloc) and
// across two GPUs (VMM memory both may access: in one process that is what
// the backend's IPC mappings give). The backend's handshake needs two
// processes; the GPU suite covers it.

// p2pSlot is small, so that a few MiB take many rounds and wrap the slots.
const p2pSlot = 16 << 10

// p2pPair is a channel: side r's control words and outbox, on gpus[r].
type p2pPair struct {
	gpus      [2]*gpu
	ctrl, box [2]*dbuf
}

// newP2PPair lays a channel out over g0 and g1 (the same GPU for simulated
// ranks), control words zeroed.
func (c *checker) newP2PPair(g0, g1 *gpu) (*p2pPair, error) {
	p := &p2pPair{gpus: [2]*gpu{g0, g1}}
	for r, g := range p.gpus {
		for _, b := range []struct {
			to   **dbuf
			size uintptr
		}{{&p.ctrl[r], cuda.P2PCtrlBytes}, {&p.box[r], cuda.P2PDataBytes(p2pSlot)}} {
			d, err := c.sharedBuf(g, g0 != g1, b.size)
			if err != nil {
				return nil, err
			}
			*b.to = d
		}
		if err := p.ctrl[r].fill(0); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// sharedBuf is device memory of g: VMM memory every GPU may access when
// shared, else a cuMemAlloc allocation. Freed at the checker's close.
func (c *checker) sharedBuf(g *gpu, shared bool, size uintptr) (*dbuf, error) {
	if !shared {
		b, err := c.alloc(g, size)
		if err == nil {
			c.onClose(func() error { b.free(); return nil })
		}
		return b, err
	}
	v, err := c.newVMem(g, size)
	if err != nil {
		return nil, err
	}
	return &dbuf{c: c, ctx: g.ctx, ptr: v.va, size: size}, nil
}

// launch enqueues rank me's half of a message (send: buf is the source;
// recv: the destination) on stream s of its GPU.
func (p *p2pPair) launch(c *checker, me int, send bool, s int, buf uintptr, n uint64, tag int64, timeout uint64) error {
	k, from := cuda.P2PRecvKernel, 1-me
	if send {
		k, from = cuda.P2PSendKernel, me
	}
	g := p.gpus[me]
	fn, err := g.function(k)
	if err != nil {
		return err
	}
	grid, block := cuda.P2PGrid()
	return c.d.Launch(fn, grid, block, 0, g.streams[s], &cuda.P2PParams{Buf: buf, Ctrl: p.ctrl[me].ptr,
		PeerCtrl: p.ctrl[1-me].ptr, Box: p.box[from].ptr, Bytes: n, Tag: tag, SlotBytes: p2pSlot, TimeoutNs: timeout})
}

// errorWords reads side r's error words.
func (p *p2pPair) errorWords(r int) ([cuda.P2PErrorWords]uint32, error) {
	var w [cuda.P2PErrorWords]uint32
	b, err := p.ctrl[r].read(4*cuda.P2PErrorWord, 4*cuda.P2PErrorWords)
	for i := range w {
		if err == nil {
			w[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
	}
	return w, err
}

func (p *p2pPair) clean() error {
	for r := range p.ctrl {
		w, err := p.errorWords(r)
		if err != nil {
			return err
		}
		if w[0] != 0 {
			return fmt.Errorf("side %d recorded error %d (detail %#x, %v)", r, w[0], w[1], w[2:])
		}
	}
	return nil
}

// p2pMsg is one message: n bytes from rank from, its source and destination
// starting smis and dmis bytes past an aligned address.
type p2pMsg struct {
	from       int
	n          int
	smis, dmis uintptr
}

// p2pStream sends msgs back to back, each rank's sends on its stream 0 and
// receives on stream 1, with no host sync until all are enqueued, and
// checks every byte, every guard and both sides' error words.
func (c *checker) p2pStream(p *p2pPair, msgs []p2pMsg, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 11))
	type bufs struct {
		want     []byte
		src, dst *dbuf
	}
	all := make([]bufs, len(msgs))
	defer func() {
		for _, b := range all {
			freeAll([]*dbuf{b.src, b.dst})
		}
	}()
	for i, m := range msgs {
		b := &all[i]
		b.want = make([]byte, m.n)
		for j := range b.want {
			b.want[j] = byte(rng.Uint32())
		}
		var err error
		if b.src, err = c.alloc(p.gpus[m.from], uintptr(m.n)+16+guardBytes); err != nil {
			return err
		}
		if err = c.d.MemcpyHtoD(p.gpus[m.from].ctx, b.src.ptr+m.smis, b.want); err != nil {
			return err
		}
		if b.dst, err = c.alloc(p.gpus[1-m.from], uintptr(m.n)+16+guardBytes); err != nil {
			return err
		}
		if err = b.dst.fill(0xab); err != nil {
			return err
		}
	}
	for i, m := range msgs {
		n := uint64(m.n)
		if err := p.launch(c, m.from, true, 0, all[i].src.ptr+m.smis, n, int64(i), timeoutNs); err != nil {
			return err
		}
		if err := p.launch(c, 1-m.from, false, 1, all[i].dst.ptr+m.dmis, n, int64(i), timeoutNs); err != nil {
			return err
		}
	}
	for _, g := range p.gpus {
		if err := c.syncAll(g, 2); err != nil {
			return err
		}
	}
	if err := p.clean(); err != nil {
		return err
	}
	for i, m := range msgs {
		whole, err := all[i].dst.read(0, all[i].dst.size)
		if err != nil {
			return err
		}
		for j, b := range whole {
			in := uintptr(j) >= m.dmis && uintptr(j) < m.dmis+uintptr(m.n)
			if in && b != all[i].want[uintptr(j)-m.dmis] {
				return fmt.Errorf("message %d (%d bytes from rank %d): byte %d differs", i, m.n, m.from, uintptr(j)-m.dmis)
			}
			if !in && b != 0xab {
				return fmt.Errorf("message %d: byte %d outside the destination was written", i, j)
			}
		}
	}
	return nil
}

// p2pMismatch: rank 1 expects 999 bytes where rank 0 sends 1000 with tag
// 7: it drains the message, writes nothing, records rank 0's size and tag;
// the channel goes on.
func (c *checker) p2pMismatch(p *p2pPair) error {
	src, err := c.alloc(p.gpus[0], 1000)
	if err != nil {
		return err
	}
	defer src.free()
	dst, err := c.alloc(p.gpus[1], 999)
	if err != nil {
		return err
	}
	defer dst.free()
	if err := dst.fill(0xab); err != nil {
		return err
	}
	if err := p.launch(c, 0, true, 0, src.ptr, 1000, 7, timeoutNs); err != nil {
		return err
	}
	if err := p.launch(c, 1, false, 1, dst.ptr, 999, 7, timeoutNs); err != nil {
		return err
	}
	for _, g := range p.gpus {
		if err := c.syncAll(g, 2); err != nil {
			return err
		}
	}
	w, err := p.errorWords(1)
	if err != nil {
		return err
	}
	if w[0] != cuda.ErrMismatch || w[2] != 1000 || w[4] != 7 {
		return fmt.Errorf("error words %v, want a mismatch naming 1000 bytes and tag 7", w)
	}
	got, err := dst.read(0, 999)
	if err != nil {
		return err
	}
	if !allBytes(got, 0xab) {
		return fmt.Errorf("the destination was written")
	}
	clear := make([]byte, 4*cuda.P2PErrorWords)
	if err := c.d.MemcpyHtoD(p.gpus[1].ctx, p.ctrl[1].ptr+4*cuda.P2PErrorWord, clear); err != nil {
		return err
	}
	return c.p2pStream(p, []p2pMsg{{from: 0, n: 4099, smis: 1, dmis: 2}, {from: 1, n: 33}}, 3)
}

// p2pTimeout: a receiver whose sender never comes gives up after 5 ms and
// says which block waited for data.
func (c *checker) p2pTimeout(g *gpu) error {
	p, err := c.newP2PPair(g, g)
	if err != nil {
		return err
	}
	dst, err := c.alloc(g, 64)
	if err != nil {
		return err
	}
	defer dst.free()
	if err := p.launch(c, 1, false, 1, dst.ptr, 64, 0, 5_000_000); err != nil {
		return err
	}
	if err := c.syncAll(g, 2); err != nil {
		return err
	}
	w, err := p.errorWords(1)
	if err != nil {
		return err
	}
	if w[0] != cuda.ErrTimeout || w[1]&0xff != 1 {
		return fmt.Errorf("error words %v, want a timeout waiting for data", w)
	}
	return nil
}

// p2pCases runs the point-to-point kernels on one GPU and, with two, across
// them.
func (c *checker) p2pCases() {
	type where struct {
		name   string
		g0, g1 *gpu
	}
	places := []where{{"1 GPU", c.gpus[0], c.gpus[0]}}
	if c.twoGPUsOverVMM() {
		places = append(places, where{"2 GPUs", c.gpus[0], c.gpus[1]})
	}
	round := cuda.P2PBlocks * p2pSlot
	for _, at := range places {
		var p *p2pPair
		record(fmt.Sprintf("p2p %s: channel (control + outbox per side)", at.name), func() error {
			var err error
			p, err = c.newP2PPair(at.g0, at.g1)
			return err
		})
		if p == nil {
			continue
		}
		record(fmt.Sprintf("p2p %s: sizes 0 to 4M+3, odd offsets, both ways at once", at.name), func() error {
			sizes := []int{0, 1, 3, 17, 1025}
			if !c.quick { // several rounds, the last many times the outbox
				sizes = append(sizes, round-1, round+1, big, big)
			}
			var msgs []p2pMsg
			for i, n := range sizes {
				msgs = append(msgs, p2pMsg{from: i % 2, n: n, smis: uintptr(i % 16), dmis: uintptr((i * 7) % 16)})
			}
			return c.p2pStream(p, msgs, 1)
		})
		record(fmt.Sprintf("p2p %s: 200 messages back to back, no host sync", at.name), func() error {
			if c.quick {
				return errSkip
			}
			rng := rand.New(rand.NewPCG(5, 6))
			msgs := make([]p2pMsg, 200)
			for i := range msgs {
				msgs[i] = p2pMsg{from: rng.IntN(2), n: rng.IntN(3 * round), smis: uintptr(rng.IntN(16)), dmis: uintptr(rng.IntN(16))}
			}
			return c.p2pStream(p, msgs, 2)
		})
		record(fmt.Sprintf("p2p %s: a size mismatch is drained and reported", at.name), func() error {
			return c.p2pMismatch(p)
		})
	}
	record("p2p: a receiver without a sender times out (5 ms)", func() error { return c.p2pTimeout(c.gpus[0]) })
}
