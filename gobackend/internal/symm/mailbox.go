package symm

import (
	"encoding/binary"
	"time"
)

// Point-to-point mailboxes: rank s owns, for each peer d, two mailbox
// halves in its data region and a header per half in its control region.
// Chunk k (1-based, counted per ordered pair) uses half k&1. The sender may
// fill half k&1 once the receiver has acknowledged chunk k-2; the receiver
// may read chunk k once the sender's sent word reaches k. Two halves let
// the sender fill one while the receiver drains the other.

// ChunkHeader describes one mailbox chunk.
type ChunkHeader struct {
	Tag   int64
	Total uint64 // bytes of the whole message
	Off   uint64 // offset of this chunk in the message
	Len   uint64 // bytes in this chunk
}

// BoxBytes is the capacity of one mailbox half.
func (t *Team) BoxBytes() int { return t.L.BoxBytes }

// Box is the address of rank s's mailbox half for peer d.
func (t *Team) Box(s, d, half int) uintptr {
	return t.data[s].Addr() + uintptr(t.L.boxOff(d, half))
}

// WaitBoxFree waits until this rank may fill its mailbox half for chunk k
// to peer d.
func (t *Team) WaitBoxFree(d int, k uint32, who Who, deadline time.Time) error {
	return t.waitGE(d, t.ctrl[d].Word32(t.L.ackedOff(t.Rank)), k-2, who, deadline, true)
}

// PostChunk publishes chunk k to peer d after its data was written to
// Box(Rank, d, k&1).
func (t *Team) PostChunk(d int, k uint32, h ChunkHeader) {
	b := t.ctrl[t.Rank].Bytes()[t.L.hdrOff(d, int(k&1)):]
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(h.Tag))
	le.PutUint64(b[8:], h.Total)
	le.PutUint64(b[16:], h.Off)
	le.PutUint64(b[24:], h.Len)
	t.store(t.ctrl[t.Rank].Word32(t.L.sentOff(d)), k)
}

// WaitChunk waits for chunk k from peer s and returns its header; its data
// is at Box(s, Rank, k&1) until AckChunk.
func (t *Team) WaitChunk(s int, k uint32, who Who, deadline time.Time) (ChunkHeader, error) {
	if err := t.waitGE(s, t.ctrl[s].Word32(t.L.sentOff(t.Rank)), k, who, deadline, true); err != nil {
		return ChunkHeader{}, err
	}
	b := t.ctrl[s].Bytes()[t.L.hdrOff(t.Rank, int(k&1)):]
	le := binary.LittleEndian
	return ChunkHeader{Tag: int64(le.Uint64(b[0:])), Total: le.Uint64(b[8:]), Off: le.Uint64(b[16:]), Len: le.Uint64(b[24:])}, nil
}

// AckChunk tells peer s that chunk k has been consumed.
func (t *Team) AckChunk(s int, k uint32) {
	t.store(t.ctrl[t.Rank].Word32(t.L.ackedOff(s)), k)
}
