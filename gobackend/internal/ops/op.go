// Package ops is the vocabulary every data plane shares: an operation (Op,
// Kind, Piece), the pieces an op leaves implicit (Even), the checks every
// op passes before it is queued (Check), and the input span that zero-copy
// paths look up (InputSpan). The CPU plane's collectives (internal/coll)
// and the CUDA plane (internal/gpu) both run these ops, each with its own
// algorithms; neither imports the other.
package ops

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Kind is an operation; values are mirrored in cabi/gosym.h (GOSYM_OP_*).
type Kind int32

// Operations.
const (
	Barrier Kind = iota
	AllReduce
	Reduce
	Broadcast
	AllGather
	ReduceScatter
	AllToAll
	Gather
	Scatter
	Send
	Recv
	numKinds
)

var kindNames = [numKinds]string{"barrier", "all_reduce", "reduce", "broadcast", "all_gather",
	"reduce_scatter", "all_to_all", "gather", "scatter", "send", "recv"}

func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return fmt.Sprintf("op(%d)", int32(k))
	}
	return kindNames[k]
}

// IsP2P reports whether k is a point-to-point operation.
func (k Kind) IsP2P() bool { return k == Send || k == Recv }

// AnySource is the Peer of a Recv that takes a message from any rank
// (GOSYM_ANY_SOURCE).
const AnySource = -1

// Piece is a contiguous run of Count elements at Addr.
type Piece struct {
	Addr  uintptr
	Count int
}

// Op is one posted operation (see gosym_op_desc in cabi/gosym.h).
type Op struct {
	Kind      Kind
	DType     dtype.DType
	RedOp     dtype.RedOp
	Scale     float64
	Root      int
	Peer      int
	Tag       int64
	Count     int
	In, Out   uintptr
	InPieces  []Piece
	OutPieces []Piece
	Seq       uint64 // per-endpoint collective (or per-pair message) number
	// EvenPieces: ops.Even made this op's pieces (its caller passed one
	// buffer), so their layout is the same on every rank by contract: an
	// all_to_all is equal-split, a reduce_scatter's input pieces lie Count
	// elements apart. Pieces that merely look so on one rank say nothing of
	// the others' (a peer's own all_to_all piece may differ, its
	// reduce_scatter inputs lie elsewhere), so only this flag lets a rank
	// choose a path by their layout without agreeing on it.
	EvenPieces bool
}

// Who names the op in errors.
func (o *Op) Who() symm.Who { return symm.Who{Op: o.Kind.String(), Seq: o.Seq} }

// Even gives an op that leaves its per-rank pieces implicit (passes none)
// the pieces it means, so that a caller with one buffer need not build
// them: an all_to_all moves Count elements to and from every rank r (at In
// and Out plus r*Count elements), an all_gather puts rank r's Count
// elements at Out plus r*Count, a reduce_scatter reduces In plus r*Count
// into rank r. The op is then the one its caller would have posted with
// those pieces. Other ops, and ops that pass pieces, are left alone.
func Even(o *Op, world int) {
	var ins, outs bool
	switch o.Kind {
	case AllToAll:
		ins = len(o.InPieces) == 0 && len(o.OutPieces) == 0
		outs = ins
	case AllGather:
		outs = len(o.OutPieces) == 0
	case ReduceScatter:
		ins = len(o.InPieces) == 0
	}
	if (!ins && !outs) || !o.DType.Valid() || o.Count < 0 || o.Count > math.MaxInt/o.DType.Size()/max(1, world) {
		return // nothing implicit, or Check reports the op
	}
	step := uintptr(o.Count * o.DType.Size())
	even := func(base uintptr) []Piece {
		ps := make([]Piece, world)
		for r := range ps {
			ps[r] = Piece{Addr: base + uintptr(r)*step, Count: o.Count}
		}
		return ps
	}
	o.EvenPieces = true
	if ins {
		o.InPieces, o.In = even(o.In), 0
	}
	if outs {
		o.OutPieces, o.Out = even(o.Out), 0
	}
	if o.Kind == AllToAll {
		o.Count = 0 // as with explicit pieces: they carry the counts
	}
}

// Check validates an op against this rank's view of the group before it is
// queued, so bad input fails at once with InvalidArg and never reaches the
// peers.
func Check(o *Op, rank, world int) error {
	bad := func(format string, args ...any) error {
		return status.Errorf(status.InvalidArg, "gosym: %s: "+format, append([]any{o.Kind}, args...)...)
	}
	if o.Kind < 0 || o.Kind >= numKinds {
		return status.Errorf(status.InvalidArg, "gosym: unknown op %d", int32(o.Kind))
	}
	if !o.DType.Valid() {
		return bad("unknown dtype %d", int32(o.DType))
	}
	if o.Count < 0 {
		return bad("negative count %d", o.Count)
	}
	if o.Kind == AllReduce || o.Kind == Reduce || o.Kind == ReduceScatter {
		if err := dtype.Supports(o.DType, o.RedOp); err != nil {
			return status.Errorf(status.NotSupported, "gosym: %s: %v", o.Kind, err)
		}
	}
	needRoot := o.Kind == Reduce || o.Kind == Broadcast || o.Kind == Gather || o.Kind == Scatter
	if needRoot && (o.Root < 0 || o.Root >= world) {
		return bad("root %d is not a rank of a group of %d", o.Root, world)
	}
	if o.Kind == Recv && o.Peer == AnySource {
		if world < 2 {
			return bad("recv from any source in a group of 1: no other rank can send")
		}
	} else if o.Kind.IsP2P() && (o.Peer < 0 || o.Peer >= world || o.Peer == rank) {
		return bad("peer %d is not another rank of a group of %d (this is rank %d)", o.Peer, world, rank)
	}
	pieces := func(name string, p []Piece, want bool) error {
		if !want {
			return nil
		}
		if len(p) != world {
			return bad("%s has %d pieces, want one per rank (%d)", name, len(p), world)
		}
		for r, pc := range p {
			if pc.Count < 0 || (pc.Count > 0 && pc.Addr == 0) {
				return bad("%s piece %d is invalid (count %d)", name, r, pc.Count)
			}
		}
		return nil
	}
	isRoot := rank == o.Root
	if err := pieces("input", o.InPieces, o.Kind == ReduceScatter || o.Kind == AllToAll || (o.Kind == Scatter && isRoot)); err != nil {
		return err
	}
	if err := pieces("output", o.OutPieces, o.Kind == AllGather || o.Kind == AllToAll || (o.Kind == Gather && isRoot)); err != nil {
		return err
	}
	for _, ps := range [][]Piece{o.InPieces, o.OutPieces} {
		for r, pc := range ps {
			if (o.Kind == ReduceScatter || o.Kind == AllGather || o.Kind == Gather || o.Kind == Scatter) && pc.Count != o.Count {
				return bad("piece %d has %d elements, the op has %d per rank", r, pc.Count, o.Count)
			}
		}
	}
	es := o.DType.Size()
	span := func(what string, addr uintptr, count int) error {
		if count > math.MaxInt/es || addr+uintptr(count*es) < addr {
			return bad("%s of %d %s elements at %#x overflows the address space", what, count, o.DType, addr)
		}
		return nil
	}
	if err := span("buffer", max(o.In, o.Out), o.Count); err != nil {
		return err
	}
	for _, ps := range [][]Piece{o.InPieces, o.OutPieces} {
		for r, p := range ps {
			if err := span(fmt.Sprintf("piece %d", r), p.Addr, p.Count); err != nil {
				return err
			}
		}
	}
	if o.Kind == AllToAll && piecesOverlap(o.InPieces, o.OutPieces, es) {
		return bad("an input piece overlaps an output piece; all_to_all needs separate buffers")
	}
	if o.Count > 0 {
		needIn, needOut := buffers(o.Kind, isRoot)
		if (needIn && o.In == 0) || (needOut && o.Out == 0) {
			return bad("null buffer address for %d elements", o.Count)
		}
	}
	return nil
}

// buffers says which single-buffer addresses (In, Out) an op reads on
// this rank; pieces are checked separately.
func buffers(k Kind, isRoot bool) (in, out bool) {
	switch k {
	case AllReduce:
		return true, true
	case Reduce:
		return true, isRoot
	case Broadcast:
		return isRoot, true
	case AllGather, Gather, Send:
		return true, false
	case ReduceScatter, Scatter, Recv:
		return false, true
	}
	return false, false
}

// piecesOverlap reports whether any non-empty piece of a overlaps one of b
// (a sweep over the pieces sorted by address).
func piecesOverlap(a, b []Piece, es int) bool {
	type iv struct {
		lo, hi uintptr
		inA    bool
	}
	var ivs []iv
	for _, p := range a {
		if p.Count > 0 {
			ivs = append(ivs, iv{p.Addr, p.Addr + uintptr(p.Count*es), true})
		}
	}
	for _, p := range b {
		if p.Count > 0 {
			ivs = append(ivs, iv{p.Addr, p.Addr + uintptr(p.Count*es), false})
		}
	}
	slices.SortFunc(ivs, func(x, y iv) int { return cmp.Compare(x.lo, y.lo) })
	var endA, endB uintptr
	for _, v := range ivs {
		if v.inA {
			if v.lo < endB {
				return true
			}
			endA = max(endA, v.hi)
		} else {
			if v.lo < endA {
				return true
			}
			endB = max(endB, v.hi)
		}
	}
	return false
}

// InputSpan is the byte range this rank's input of o covers, and the piece
// displacements from its start: what a zero-copy path looks up.
func InputSpan(o *Op) (start uintptr, n int, displ []uint64) {
	es := o.DType.Size()
	if len(o.InPieces) == 0 {
		if o.In == 0 {
			return 0, 0, nil
		}
		return o.In, o.Count * es, nil
	}
	lo, n := piecesSpan(o.InPieces, es)
	if n == 0 {
		return 0, 0, nil
	}
	displ = make([]uint64, len(o.InPieces))
	for r, p := range o.InPieces {
		if p.Count > 0 {
			displ[r] = uint64(p.Addr - lo)
		}
	}
	return lo, n, displ
}

// piecesSpan is the byte range from the lowest to the highest end of the
// non-empty pieces.
func piecesSpan(ps []Piece, es int) (uintptr, int) {
	var lo, hi uintptr
	for _, p := range ps {
		if p.Count == 0 {
			continue
		}
		if lo == 0 || p.Addr < lo {
			lo = p.Addr
		}
		hi = max(hi, p.Addr+uintptr(p.Count*es))
	}
	if lo == 0 {
		return 0, 0
	}
	return lo, int(hi - lo)
}
