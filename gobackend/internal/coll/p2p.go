package coll

import (
	"time"

	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Point-to-point messages travel through the sender's mailbox for the
// receiver, a chunk at a time (see symm's mailbox). Messages between one
// ordered pair arrive in the order they were sent. A send completes when
// its last chunk is in the mailbox, so small sends complete without the
// receiver (eager); a large one waits for the receiver to drain.

// SendMsg sends o (Kind Send) to o.Peer. Only the peer's send worker calls it.
func (x *Exec) SendMsg(o *Op, deadline time.Time) error {
	d, nb, box := o.Peer, o.Count*o.DType.Size(), x.T.BoxBytes()
	for off := 0; off == 0 || off < nb; off += box {
		c := min(box, nb-off)
		k := x.sentK[d] + 1
		if err := x.T.WaitBoxFree(d, k, o.Who(), deadline); err != nil {
			return err
		}
		x.copy(x.T.Box(x.Rank, d, int(k&1)), o.In+uintptr(off), c)
		x.T.PostChunk(d, k, symm.ChunkHeader{Tag: o.Tag, Total: uint64(nb), Off: uint64(off), Len: uint64(c)})
		x.sentK[d] = k
	}
	return nil
}

// RecvMsg receives the next message from o.Peer into o (Kind Recv). A
// message whose size or tag differs is drained (so the pair stays in
// step) and reported. Only the peer's receive worker calls it.
func (x *Exec) RecvMsg(o *Op, deadline time.Time) error {
	s, nb := o.Peer, o.Count*o.DType.Size()
	var bad error
	for {
		k := x.recvK[s] + 1
		h, err := x.T.WaitChunk(s, k, o.Who(), deadline)
		if err != nil {
			return err
		}
		if h.Total != uint64(nb) || h.Tag != o.Tag {
			if bad == nil {
				bad = status.Errorf(status.Mismatch,
					"gosym: recv (seq %d) from rank %d: expected %d bytes with tag %d, the message has %d bytes with tag %d",
					o.Seq, s, nb, o.Tag, h.Total, h.Tag)
			}
		} else {
			x.copy(o.Out+uintptr(h.Off), x.T.Box(s, x.Rank, int(k&1)), int(h.Len))
		}
		x.T.AckChunk(s, k)
		x.recvK[s] = k
		if h.Off+h.Len >= h.Total {
			return bad
		}
	}
}
