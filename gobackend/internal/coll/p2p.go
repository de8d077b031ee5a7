package coll

import (
	"time"

	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Point-to-point messages travel through the sender's mailbox for the
// receiver, a chunk at a time (see symm's mailbox). Messages between one
// ordered pair arrive in the order they were sent; the receiver matches them
// to posted receives by tag (see the endpoint's inbox). A send completes when
// its last chunk is in the mailbox, so small sends complete without the
// receiver (eager); a large one waits for the receiver to drain.

// SendMsg sends o (Kind Send) to o.Peer. Only the peer's send worker calls it.
func (x *Exec) SendMsg(o *ops.Op, deadline time.Time) error {
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

// NextMessage waits for the first chunk of the next message from peer s
// and returns its header without consuming it. Messages from one peer are
// read in send order; the caller matches them to receives by tag.
func (x *Exec) NextMessage(s int, who symm.Who, deadline time.Time) (symm.ChunkHeader, error) {
	return x.T.WaitChunk(s, x.recvK[s]+1, who, deadline)
}

// TakeMessage consumes the message whose first chunk NextMessage returned,
// copying it to dst (dst == 0 drops it), and acknowledges its chunks.
func (x *Exec) TakeMessage(s int, h symm.ChunkHeader, dst uintptr, who symm.Who, deadline time.Time) error {
	for {
		k := x.recvK[s] + 1
		if dst != 0 {
			x.copy(dst+uintptr(h.Off), x.T.Box(s, x.Rank, int(k&1)), int(h.Len))
		}
		x.T.AckChunk(s, k)
		x.recvK[s] = k
		if h.Off+h.Len >= h.Total {
			return nil
		}
		var err error
		if h, err = x.T.WaitChunk(s, k+1, who, deadline); err != nil {
			return err
		}
	}
}
