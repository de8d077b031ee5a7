package gpu

// Issue order across streams. A group's CUDA collectives run on the device
// in the order they were issued, whatever streams they came from, as
// ProcessGroupNCCL's do on its one internal stream per group. gosym
// enqueues each op on the caller's own stream (no extra launch, capturable),
// so when an op comes on another stream than the group's previous op, its
// stream first waits for an event recorded right after that op. Then no
// kernel can spin for a peer that is still running an earlier op of the
// group behind it on another stream (FSDP2 issues all_gather and
// reduce_scatter on two streams; their kernels share the group's LL lines,
// staging and pads, which are used in op order).
//
// The event is recorded right after every op, not when a later op on
// another stream asks for it: recorded then, it would also cover work the
// caller put on the old stream since, which may wait for ops of other
// groups issued later, a cycle that ProcessGroupNCCL does not have.
//
// Captured ops are ordered only within their capture sequence: a graph
// cannot wait for eager work, and eager work must not wait for an event
// recorded inside a capture. Point-to-point ops are not part of the order
// (as with NCCL, whose sends and receives do not wait for collectives on
// other streams): a send issued before a collective may complete only after
// the peer's collective, which would otherwise wait for it.

import (
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
)

// streamOrder is a team's record of its last op: its stream, its capture
// sequence and the event recorded after it. Used by whoever runs the
// collective queue.
type streamOrder struct {
	ev      cuda.Event // recorded right after each op (0: not made yet)
	any     bool       // an op was recorded
	stream  cuda.Stream
	capture uint64 // the last op's capture sequence id, 0 if it was not captured
	joins   uint64 // ops that waited for the previous op on another stream (stats)
}

// before makes s wait for the group's previous op when that op ran on
// another stream of the same capture sequence (or both eager).
func (o *streamOrder) before(g *Device, s cuda.Stream, capture uint64) error {
	if !o.any || o.stream == s || o.capture != capture {
		return nil
	}
	o.joins++
	return g.d.StreamWaitEvent(g.ctx, s, o.ev)
}

// after records the event right after the op just enqueued on s.
func (o *streamOrder) after(g *Device, s cuda.Stream, capture uint64) error {
	if o.ev == 0 {
		ev, err := g.d.EventCreate(g.ctx, cuda.EventDisableTiming)
		if err != nil {
			return err
		}
		o.ev = ev
	}
	if err := g.d.EventRecord(g.ctx, o.ev, s); err != nil {
		return err
	}
	o.any, o.stream, o.capture = true, s, capture
	return nil
}

// close destroys the event; the caller made sure the device is idle.
func (o *streamOrder) close(g *Device) {
	if o.ev != 0 {
		if err := g.d.EventDestroy(g.ctx, o.ev); err != nil {
			dlog.Printf("destroying the order event: %v", err)
		}
	}
	*o = streamOrder{}
}
