package symm

// Signatures of collectives. An op whose parameters differ between ranks
// (another count, dtype or root) must fail with a message naming both, on
// every rank, not hang until the timeout. Each rank publishes a signature
// of each collective it posts (the parameters every rank must share) in a
// ring of its control region, then compares the peers' signatures of the
// same op among those already published. Each pair is compared by at least
// one of its two ranks: both publish before they read (sequentially
// consistent atomics), so the later of the two sees the earlier's. A rank
// that finds a difference refuses the op (Refuse) and tells the peers that
// already posted it.

import (
	"sync/atomic"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// SigRing is how many collectives' signatures a rank keeps: two ranks
// that post an op more than this many ops apart do not compare it (their
// kernels' timeout still ends a wait for it).
const SigRing = 256

const sigBytes = 16 // the signature, then the op's sequence number

func (l *Layout) sigOff(seq uint64) int { return l.offSigs + int(seq%SigRing)*sigBytes }

// Sign publishes sig as this rank's signature of collective seq and
// compares it with the peers that already published seq. It returns the
// first peer whose signature differs (-1 if none) with that signature, and
// every peer that already published seq (those whose kernels may wait for
// this rank), in a slice that the next Sign reuses. Its caller runs the
// team's collectives one at a time.
func (t *Team) Sign(seq, sig uint64) (peer int, theirs uint64, posted []int) {
	own := t.ctrl[t.Rank]
	off := t.L.sigOff(seq)
	atomic.StoreUint64(own.Word64(off+8), 0) // the entry is being written
	atomic.StoreUint64(own.Word64(off), sig)
	atomic.StoreUint64(own.Word64(off+8), seq)
	peer, posted = -1, t.posted[:0]
	for r := range t.ctrl {
		if r == t.Rank {
			continue
		}
		s, ok := t.SigOf(r, seq)
		if !ok {
			continue
		}
		posted = append(posted, r)
		if s != sig && peer < 0 {
			peer, theirs = r, s
		}
	}
	t.posted = posted
	return peer, theirs, posted
}

// SigOf is rank r's published signature of collective seq, if r published
// it and has not yet published one SigRing ops later.
func (t *Team) SigOf(r int, seq uint64) (uint64, bool) {
	c, off := t.ctrl[r], t.L.sigOff(seq)
	if atomic.LoadUint64(c.Word64(off+8)) != seq {
		return 0, false
	}
	sig := atomic.LoadUint64(c.Word64(off))
	return sig, atomic.LoadUint64(c.Word64(off+8)) == seq
}

// Refuse marks collective seq refused by this rank: every wait of a peer
// for this rank fails from now on (waitGE), so a peer inside a host round
// of that op (an agreement of the CUDA plane, say) fails at once.
func (t *Team) Refuse(seq uint64) {
	t.store(t.ctrl[t.Rank].Word32(offRefused), uint32(seq)|1)
}

// refused is the error of a wait for rank r after r refused a collective.
func (t *Team) refused(r int, who Who) error {
	if atomic.LoadUint32(t.ctrl[r].Word32(offRefused)) == 0 {
		return nil
	}
	return status.Errorf(status.Mismatch, "gosym: %s: rank %d refused a collective whose arguments differ between ranks "+
		"(its error names them); rank %d waited for it", who, r, t.Rank)
}
