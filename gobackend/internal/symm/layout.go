// Package symm holds a group's symmetric memory: every rank's control region
// (signal words, sync slots) and data region (staging halves, point-to-point
// mailboxes), shared with the peers, plus the waits built on them.
package symm

// Control region layout (one per rank and endpoint, written only by its
// owner except for the waiters word). Each signal word sits on its own cache
// line so that ranks polling different words do not false-share.
const (
	lineSize     = 64
	ctrlMagic    = 0x4c525443 // "CTRL"
	ctrlVersion  = 1
	offMagic     = 0
	offStep      = 1 * lineSize // barrier arrivals, monotonic (serial arithmetic)
	offWaiters   = 2 * lineSize // peers sleeping on a word of this region
	offClosed    = 3 * lineSize // set when the owner destroys the endpoint
	offP2P       = 4 * lineSize // per peer: sent (a line), acked (a line)
	p2pWordsSize = 2 * lineSize
	p2pHdrSize   = lineSize // per peer and mailbox half
)

// Layout is the geometry every rank of a group derives from the same inputs.
type Layout struct {
	World      int
	StageBytes int // bytes of one staging half
	BoxBytes   int // bytes of one mailbox half
	SlotBytes  int // bytes of one sync slot

	offHdr, offSlots, CtrlBytes int
	offBoxes, DataBytes         int
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

// NewLayout computes offsets for a group of world ranks.
func NewLayout(world, stageBytes, boxBytes int) Layout {
	l := Layout{World: world, StageBytes: roundUp(stageBytes, 4096), BoxBytes: roundUp(boxBytes, 4096)}
	l.SlotBytes = roundUp(SlotHeaderBytes+24*world, lineSize)
	l.offHdr = offP2P + world*p2pWordsSize
	l.offSlots = l.offHdr + world*2*p2pHdrSize
	l.CtrlBytes = roundUp(l.offSlots+2*l.SlotBytes, 4096)
	l.offBoxes = 2 * l.StageBytes
	l.DataBytes = l.offBoxes + world*2*l.BoxBytes
	return l
}

// SlotHeaderBytes is the fixed part of a sync slot, before the per-rank
// counts.
const SlotHeaderBytes = 128

func (l *Layout) sentOff(peer int) int      { return offP2P + peer*p2pWordsSize }
func (l *Layout) ackedOff(peer int) int     { return offP2P + peer*p2pWordsSize + lineSize }
func (l *Layout) hdrOff(peer, half int) int { return l.offHdr + (peer*2+half)*p2pHdrSize }
func (l *Layout) slotOff(half int) int      { return l.offSlots + half*l.SlotBytes }
func (l *Layout) stageOff(half int) int     { return half * l.StageBytes }
func (l *Layout) boxOff(peer, half int) int { return l.offBoxes + (peer*2+half)*l.BoxBytes }
