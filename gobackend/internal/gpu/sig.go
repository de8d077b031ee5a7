package gpu

// Collectives whose arguments differ between ranks. A CUDA collective
// needs no host round, so nothing else would notice: a rank with another
// count launches another grid and its peers wait for lines that never
// come. Run publishes each op's signature (symm/sig.go) before it enqueues
// anything; a rank that finds a peer's differs refuses the op, tells the
// peers that already enqueued theirs through their pads (their kernels'
// waits give up, gs_wait), and breaks the group on every rank: an op the
// peers' kernels started and left is out of step for good, as after a
// device timeout.

import (
	"fmt"
	"strings"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// The fields of a signature, low bits first. Each field is its value + 1,
// 0 where the op does not compare it; a count with no dtype is in bytes.
const (
	sigKindBits, sigDTypeBits, sigRedBits, sigRootBits = 6, 6, 4, 10
	sigDTypeShift                                      = sigKindBits
	sigRedShift                                        = sigDTypeShift + sigDTypeBits
	sigRootShift                                       = sigRedShift + sigRedBits
	sigCountShift                                      = sigRootShift + sigRootBits
	sigCountMax                                        = 1<<(64-sigCountShift) - 2
)

// signature is what every rank must pass alike for op: the kind; for
// reductions the dtype, the operator and the count; for data movement the
// bytes; the root. Counts that may differ between ranks (all_to_all's
// splits, uneven all_gather and reduce_scatter pieces, gather and scatter)
// are not compared: gs_a2av checks splits itself.
func signature(op *ops.Op) uint64 {
	var dt, red, root, count uint64
	elems := op.Count
	switch op.Kind {
	case ops.AllReduce, ops.Reduce, ops.ReduceScatter:
		dt, red = uint64(op.DType)+1, uint64(op.RedOp)+1
	case ops.Broadcast, ops.AllGather:
		elems *= op.DType.Size()
	default:
		elems = -1
	}
	if op.Kind == ops.ReduceScatter && !even(op.InPieces, op.Count) || op.Kind == ops.AllGather && !even(op.OutPieces, op.Count) {
		elems = -1
	}
	if elems >= 0 {
		count = uint64(min(elems, sigCountMax)) + 1
	}
	switch op.Kind {
	case ops.Reduce, ops.Broadcast, ops.Gather, ops.Scatter:
		root = uint64(op.Root) + 1
	}
	return uint64(op.Kind) | dt<<sigDTypeShift | red<<sigRedShift | root<<sigRootShift | count<<sigCountShift
}

func even(ps []ops.Piece, n int) bool {
	for _, p := range ps {
		if p.Count != n {
			return false
		}
	}
	return true
}

// describeSig says what sig holds, as a user passed it.
func describeSig(sig uint64) string {
	field := func(shift, bits int) uint64 { return sig >> shift & (1<<bits - 1) }
	parts := []string{ops.Kind(field(0, sigKindBits)).String()}
	dt, red, root, count := field(sigDTypeShift, sigDTypeBits), field(sigRedShift, sigRedBits), field(sigRootShift, sigRootBits), sig>>sigCountShift
	switch {
	case count != 0 && dt != 0:
		parts = append(parts, fmt.Sprintf("%d elements of %s", count-1, dtype.DType(dt-1).String()))
	case count != 0:
		parts = append(parts, fmt.Sprintf("%d bytes", count-1))
	case dt != 0:
		parts = append(parts, dtype.DType(dt-1).String())
	}
	if red != 0 {
		parts = append(parts, dtype.RedOp(red-1).String())
	}
	if root != 0 {
		parts = append(parts, fmt.Sprintf("root %d", root-1))
	}
	return strings.Join(parts, ", ")
}

// checkSig publishes op's signature; when a peer's differs it refuses op
// (symm.Team.Refuse), aborts the kernels of the peers that already
// enqueued it, and returns the error naming both.
func (t *Team) checkSig(grp Group, op *ops.Op) error {
	mine := signature(op)
	peer, theirs, posted := grp.Peers.Sign(op.Seq, mine)
	if peer < 0 {
		return nil
	}
	grp.Peers.Refuse(op.Seq)
	aerr := t.abortPeers(posted, cuda.SigDetail|uint32(grp.Rank)<<16|uint32(op.Seq&0xffff))
	err := mismatchError(grp, op, differ(peer, theirs, grp.Rank, mine))
	if aerr != nil {
		return status.Wrap(status.Mismatch, aerr, "%v (telling ranks %v failed)", err, posted)
	}
	return err
}

func differ(peer int, theirs uint64, me int, mine uint64) string {
	return fmt.Sprintf("the ranks' arguments differ: rank %d passed %s; rank %d (this rank) passed %s", peer, describeSig(theirs), me, describeSig(mine))
}

func mismatchError(grp Group, op *ops.Op, why string) error {
	return status.Errorf(status.Mismatch, "gosym: %s (seq %d) of group %q on CUDA tensors: %s; the group cannot run CUDA ops any more",
		op.Kind, op.Seq, grp.Name, why)
}

// explainRefusal is the error of op's host round (an agreement of the
// direct path, say) when it failed because a peer refused op: both ranks'
// arguments; nil for other errors.
func explainRefusal(grp Group, op *ops.Op, err error) error {
	if status.CodeOf(err) != status.Mismatch {
		return nil
	}
	mine := signature(op)
	for r := range grp.World {
		if theirs, ok := grp.Peers.SigOf(r, op.Seq); ok && r != grp.Rank && theirs != mine {
			return mismatchError(grp, op, differ(r, theirs, grp.Rank, mine))
		}
	}
	return nil
}

// abortPeers leaves a mismatch's abort with detail on each of ranks' pads.
func (t *Team) abortPeers(ranks []int, detail uint32) error {
	return t.abort(ranks, cuda.ErrMismatch, detail)
}

// abort leaves code with detail in the abort words of each of ranks' pads
// (detail first), on a stream of its own: the caller's streams may hold
// kernels that spin on those pads.
func (t *Team) abort(ranks []int, code, detail uint32) error {
	if len(ranks) == 0 {
		return nil
	}
	g := t.g
	return g.privately(func(s cuda.Stream) error {
		for _, q := range ranks {
			if err := g.d.PutAbort(g.ctx, s, t.pads[q], cuda.PadAbortWord, cuda.PadAbortDetailWord, code, detail); err != nil {
				return err
			}
		}
		return nil
	})
}

// refusedBy is the message of a kernel error that a peer's refusal left
// (detail has cuda.SigDetail), naming both ranks' arguments where the
// signatures are still published; seq is the latest op this rank ran.
func refusedBy(grp Group, detail uint32, seq uint64) string {
	peer := int(detail >> 16 & 0xff)
	at := seq - (seq-uint64(detail&0xffff))&0xffff // the latest op with those low bits
	mine, ok1 := grp.Peers.SigOf(grp.Rank, at)
	theirs, ok2 := grp.Peers.SigOf(peer, at)
	if !ok1 || !ok2 {
		return fmt.Sprintf("rank %d refused collective %d: the ranks' arguments differ (its error names them)", peer, at)
	}
	return fmt.Sprintf("collective %d: %s", at, differ(peer, theirs, grp.Rank, mine))
}
