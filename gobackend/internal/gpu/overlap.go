package gpu

// The local piece beside the peers' on the copy engines. One stream's
// copy-engine copies run one after another, so a move whose segments are
// a peer's piece over NVLink and this rank's own piece (all_gather,
// all_to_all: HBM to HBM, no link) spent the local copy's time before or
// after the link's: at 2 GPUs a 1 GiB all_to_all took 1708 µs where
// NCCL's took 1619 (BENCHMARKS.md, session 32), 512 MiB of local copy at
// ~1.3 TB/s serialised with 512 MiB over the link at ~390 GB/s. The local
// segment runs on the team's second stream instead, forked from the op's
// stream and joined back before the op's closing barrier, so the op ends
// only when both have. Only the local piece moves: the 4-GPU probe
// (nvswitch_probe.cu) measured several copy-engine copies to peers at
// once moving less per GPU than one stream's in turn (197 against 230
// GB/s), so the peers' pieces stay on one stream. Where it pays is
// measured per world and GPU (GOSYM_GPU_CE_OVERLAP_MIN, choice.go): off
// where nobody measured it.
//
// Under graph capture the fork and join are captured like any event
// record and wait, so the graph holds the same two branches; the stream
// and events are made outside a capture only (a capture then serialises).

import (
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
)

// ceSide is the team's second copy stream and its fork and join events
// (all zero until the first move that uses them).
type ceSide struct {
	s          cuda.Stream
	fork, join cuda.Event
	failed     bool // the driver refused them once: not asked again
}

// ready makes the stream and events once; false where it cannot now (under
// capture, or the driver refused: the move then runs on one stream).
func (c *ceSide) ready(g *Device, capturing bool) bool {
	if c.join != 0 {
		return true
	}
	if capturing || c.failed {
		return false
	}
	s, err := g.d.StreamCreate(g.ctx, cuda.StreamNonBlocking)
	if err == nil {
		c.s = s
		if c.fork, err = g.d.EventCreate(g.ctx, cuda.EventDisableTiming); err == nil {
			c.join, err = g.d.EventCreate(g.ctx, cuda.EventDisableTiming)
		}
	}
	if err != nil {
		dlog.Printf("cuda:%d: no second copy stream: %v", g.ordinal, err)
		c.close(g)
		c.failed = true
		return false
	}
	return true
}

// copyBeside enqueues seg on the second stream after what s holds now;
// joinTo then makes s wait for it.
func (c *ceSide) copyBeside(g *Device, seg copySeg, s cuda.Stream) error {
	if err := g.d.EventRecord(g.ctx, c.fork, s); err != nil {
		return err
	}
	if err := g.d.StreamWaitEvent(g.ctx, c.s, c.fork); err != nil {
		return err
	}
	if err := g.d.MemcpyDtoDAsync(g.ctx, seg.dst, seg.src, seg.n, c.s); err != nil {
		return err
	}
	return g.d.EventRecord(g.ctx, c.join, c.s)
}

// joinTo makes s wait for the copy copyBeside enqueued.
func (c *ceSide) joinTo(g *Device, s cuda.Stream) error {
	return g.d.StreamWaitEvent(g.ctx, s, c.join)
}

// close destroys what ready made; the caller made sure the device is idle.
func (c *ceSide) close(g *Device) {
	for _, e := range []cuda.Event{c.fork, c.join} {
		if e != 0 {
			if err := g.d.EventDestroy(g.ctx, e); err != nil {
				dlog.Printf("destroying a copy event: %v", err)
			}
		}
	}
	if c.s != 0 {
		if err := g.d.StreamDestroy(g.ctx, c.s); err != nil {
			dlog.Printf("destroying the second copy stream: %v", err)
		}
	}
	*c = ceSide{}
}
