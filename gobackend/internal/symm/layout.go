// Package symm holds a group's symmetric memory: every rank's control region
// (signal words, sync slots) and data region (staging halves, point-to-point
// mailboxes), shared with the peers, plus the waits built on them.
package symm

import (
	"encoding/binary"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// Control region layout (one per rank and endpoint, written only by its
// owner except for the waiters word and the bell words). Each signal word
// sits on its own cache line so that ranks polling different words do not
// false-share (the bell's per-peer counts share lines: they are rung once
// per channel).
const (
	lineSize     = 64
	ctrlMagic    = 0x4c525443 // "CTRL"
	ctrlVersion  = 4
	offMagic     = 0
	offRefused   = 16           // in the header line: the collective this rank refused (sig.go), 0 if none
	offStep      = 1 * lineSize // barrier arrivals, monotonic (serial arithmetic)
	offWaiters   = 2 * lineSize // peers sleeping on a word of this region
	offClosed    = 3 * lineSize // set when the owner destroys the endpoint
	offSnapped   = 4 * lineSize // the last publication whose slots the owner copied out
	offBell      = 5 * lineSize // rung by peers (Ring); the owner sleeps on it
	offP2P       = 6 * lineSize // per peer: sent (a line), acked (a line)
	p2pWordsSize = 2 * lineSize
	p2pHdrSize   = lineSize // per peer and mailbox half
)

// Sync slot count (GOSYM_SLOTS): at least MinSlots, so that the slot wait
// never stalls a rank (see Team.Barrier); at most MaxSlots, to bound the
// control region.
const (
	MinSlots     = 2
	MaxSlots     = 256
	DefaultSlots = 4
)

// Layout is the geometry every rank of a group derives from the same inputs.
type Layout struct {
	World      int
	StageBytes int // bytes of one staging half
	BoxBytes   int // bytes of one mailbox half
	Slots      int // sync slots (N): publication s uses slot s mod N
	SlotBytes  int // bytes of one sync slot's metadata (after its stamp line)

	offHdr, offBells, offSlots, offSigs, CtrlBytes int
	offBoxes, DataBytes                            int

	// Settings is what else every rank must share (the engine's agreed
	// settings, internal/config), sent with the regions; CheckSettings
	// names a peer's difference. Both may be nil.
	Settings      []byte
	CheckSettings func(rank int, theirs []byte) error
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

// NewLayout computes offsets for a group of world ranks with slots sync
// slots (callers validate slots; tests may use 1 to show the hazard).
func NewLayout(world, stageBytes, boxBytes, slots int) Layout {
	l := Layout{World: world, StageBytes: roundUp(stageBytes, 4096), BoxBytes: roundUp(boxBytes, 4096), Slots: max(1, slots)}
	l.SlotBytes = roundUp(SlotHeaderBytes+24*world+SlotExtraBytes, lineSize)
	l.offHdr = offP2P + world*p2pWordsSize
	l.offBells = l.offHdr + world*2*p2pHdrSize
	l.offSlots = l.offBells + roundUp(4*world, lineSize)
	l.offSigs = l.offSlots + l.Slots*(lineSize+l.SlotBytes)
	l.CtrlBytes = roundUp(l.offSigs+SigRing*sigBytes, 4096)
	l.offBoxes = 2 * l.StageBytes
	l.DataBytes = l.offBoxes + world*2*l.BoxBytes
	return l
}

// SlotHeaderBytes is the fixed part of a sync slot, before the per-rank
// counts.
const SlotHeaderBytes = 128

// SlotExtraBytes is room in a sync slot beyond the host collectives'
// metadata (header + 24 bytes per rank), for the CUDA data plane's
// agreements: all_to_all's splits and addresses (24 bytes per rank, as the
// host's) plus one buffer record.
const SlotExtraBytes = 192

func (l *Layout) sentOff(peer int) int      { return offP2P + peer*p2pWordsSize }
func (l *Layout) ackedOff(peer int) int     { return offP2P + peer*p2pWordsSize + lineSize }
func (l *Layout) hdrOff(peer, half int) int { return l.offHdr + (peer*2+half)*p2pHdrSize }
func (l *Layout) stageOff(half int) int     { return half * l.StageBytes }
func (l *Layout) bellsOff(peer int) int     { return l.offBells + 4*peer }
func (l *Layout) boxOff(peer, half int) int { return l.offBoxes + (peer*2+half)*l.BoxBytes }

// stampOff is the word saying which publication slot s mod N holds; the
// slot's metadata follows on the next line (bodyOff).
func (l *Layout) stampOff(s uint32) int {
	return l.offSlots + int(s%uint32(l.Slots))*(lineSize+l.SlotBytes)
}
func (l *Layout) bodyOff(s uint32) int { return l.stampOff(s) + lineSize }

type setting struct {
	name string
	v    int
}

// agreed are the settings every rank of a group must share, named as the
// user sets them.
func (l *Layout) agreed() []setting {
	return []setting{
		{"GOSYM_SLOTS", l.Slots}, {"GOSYM_STAGE_BYTES", l.StageBytes}, {"GOSYM_BOX_BYTES", l.BoxBytes},
		{"control region bytes", l.CtrlBytes}, {"data region bytes", l.DataBytes},
	}
}

// encode is what a rank sends its peers with its region fds: the agreed
// geometry, then Settings.
func (l *Layout) encode() []byte {
	fs := l.agreed()
	b := make([]byte, 8*len(fs), 8*len(fs)+len(l.Settings))
	for i, f := range fs {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(f.v))
	}
	return append(b, l.Settings...)
}

// agree checks rank r's encoded layout against this one and names the
// first setting that differs.
func (l *Layout) agree(r int, got []byte) error {
	fs := l.agreed()
	if len(got) < 8*len(fs) || (l.CheckSettings == nil && len(got) != 8*len(fs)) {
		return status.Errorf(status.Peer, "gosym: rank %d sent a region layout of %d bytes, not %d (another gosym version?)", r, len(got), 8*len(fs))
	}
	if l.CheckSettings != nil {
		if err := l.CheckSettings(r, got[8*len(fs):]); err != nil {
			return err
		}
	}
	for i, f := range fs {
		if v := binary.LittleEndian.Uint64(got[8*i:]); v != uint64(f.v) {
			return status.Errorf(status.Mismatch, "gosym: rank %d uses %s=%d, this rank %d: every rank of a group must use the same",
				r, f.name, v, f.v)
		}
	}
	return nil
}
