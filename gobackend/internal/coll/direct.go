package coll

import (
	"time"
)

// Direct gives a collective zero-copy access to peers' inputs that live in
// memory the group can share (gosym.empty buffers, mapped registrations).
// Binding is lazy: the first op that meets a region on this group
// exchanges it with the peers once; later ops reuse the mapping.
type Direct interface {
	// Locate says which shareable region holds this rank's [addr, addr+n)
	// (id 0: none), addr's offset in it, and whether the group has not
	// bound the region yet.
	Locate(addr uintptr, n int) (id, off uint64, fresh bool)
	// Retired hands out (at most max) region ids this rank stopped sharing
	// since the last call; the peers drop their mappings of them.
	Retired(max int) []uint64
	// Forget drops this rank's mappings of rank r's retired regions.
	Forget(r int, ids []uint64)
	// Exchange maps fresh[r] (0: none) of every rank r: each rank sends its
	// own fresh region to every peer and maps theirs. All ranks call it
	// with the same fresh. It fails if this rank could not map them all.
	Exchange(fresh []uint64, deadline time.Time) error
	// Bound records that every rank mapped this rank's region id.
	Bound(id uint64)
	// Addr is where rank r's region id, at offset off, is mapped here.
	Addr(r int, id, off uint64) uintptr
}

// zc is this rank's zero-copy view of one op's input.
type zc struct {
	id, off uint64
	flags   uint32
	displ   []uint64
	retired []uint64
}

// inputSpan is the byte range this rank's input covers, and the piece
// displacements from its start.
func inputSpan(o *Op, es int) (start uintptr, n int, displ []uint64) {
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

// InputSpan is inputSpan for callers outside coll.
func InputSpan(o *Op) (uintptr, int, []uint64) { return inputSpan(o, o.DType.Size()) }

// contributes reports whether rank r's input is read by op kind k.
func contributes(k Kind, r, root int) bool {
	return !((k == Broadcast || k == Scatter) && r != root)
}

// view prepares this rank's zero-copy description of o.
func (x *Exec) view(o *Op) *zc {
	if x.D == nil || o.Kind == Barrier {
		return nil
	}
	z := &zc{retired: x.D.Retired(maxRetired)}
	start, n, displ := inputSpan(o, o.DType.Size())
	if n > 0 && n >= x.DirectMin && contributes(o.Kind, x.Rank, o.Root) {
		var fresh bool
		z.id, z.off, fresh = x.D.Locate(start, n)
		if z.id != 0 {
			z.displ = displ
			if fresh {
				z.flags |= flagFresh
			}
		}
	}
	return z
}

// settle runs after the first barrier: it drops retired peer mappings,
// binds fresh regions, and says whether every contributing rank's input
// can be read in place (direct) and whether a contributing rank skipped
// its staged first round because its input was shareable (restage).
func (x *Exec) settle(o *Op, ms []meta, deadline time.Time) (direct, restage bool, err error) {
	if x.D == nil || o.Kind == Barrier {
		return false, false, nil
	}
	fresh := make([]uint64, len(ms))
	anyFresh := false
	direct = true
	for r, m := range ms {
		if !contributes(o.Kind, r, o.Root) {
			continue
		}
		if m.inID == 0 {
			if x.contributesData(o, ms, r) {
				direct = false
			}
			continue
		}
		restage = true
		if m.flags&flagFresh != 0 {
			fresh[r], anyFresh = m.inID, true
		}
	}
	if anyFresh {
		ok := x.D.Exchange(fresh, deadline) == nil
		flag := []byte{0}
		if ok {
			flag[0] = 1
		}
		raw, err := x.T.Barrier(flag, o.Who(), deadline)
		if err != nil {
			return false, false, err
		}
		for _, f := range raw {
			if f[0] != 1 {
				ok = false
			}
		}
		if !ok {
			direct = false
		} else if fresh[x.Rank] != 0 {
			x.D.Bound(fresh[x.Rank])
		}
	}
	return direct && restage, restage, nil
}

// contributesData reports whether rank r has bytes to contribute.
func (x *Exec) contributesData(o *Op, ms []meta, r int) bool {
	if o.Kind == AllToAll || o.Kind == ReduceScatter || o.Kind == Scatter {
		for _, c := range ms[r].in {
			if c > 0 {
				return true
			}
		}
		return false
	}
	return ms[r].count > 0
}

// peerIn is where rank r's input starts, here.
func (x *Exec) peerIn(ms []meta, r int) uintptr {
	return x.D.Addr(r, ms[r].inID, ms[r].inOff)
}

// runDirect runs o reading the peers' inputs in place: one copy (or one
// reduction) per byte, then a completion barrier so no rank reuses its
// input while a peer may still read it. All-reduce is two-shot instead,
// which needs no completion barrier (see allReduceDirect).
func (x *Exec) runDirect(o *Op, ms []meta, deadline time.Time) error {
	world, me, es := x.T.World(), x.Rank, o.DType.Size()
	nb := o.Count * es
	in := func(r int) uintptr { return x.peerIn(ms, r) }
	switch o.Kind {
	case AllReduce:
		return x.allReduceDirect(o, ms, deadline)
	case Reduce:
		if me == o.Root && nb > 0 {
			srcs := make([]uintptr, world)
			for r := range srcs {
				srcs[r] = in(r)
			}
			if err := x.reduce(o, o.Out, srcs, nb); err != nil {
				return err
			}
		}
	case ReduceScatter:
		if nb > 0 {
			srcs := make([]uintptr, world)
			for r := range srcs {
				srcs[r] = in(r) + uintptr(ms[r].displ[me])
			}
			if err := x.reduce(o, o.Out, srcs, nb); err != nil {
				return err
			}
		}
	case Broadcast:
		x.copy(o.Out, in(o.Root), nb)
	case AllGather, Gather:
		if o.Kind == AllGather || me == o.Root {
			for r, p := range o.OutPieces {
				x.copy(p.Addr, in(r), nb)
			}
		}
	case Scatter:
		x.copy(o.Out, in(o.Root)+uintptr(ms[o.Root].displ[me]), nb)
	case AllToAll:
		for r, p := range o.OutPieces {
			x.copy(p.Addr, in(r)+uintptr(ms[r].displ[me]), p.Count*es)
		}
	}
	_, err := x.T.Barrier(nil, o.Who(), deadline)
	return err
}

// allReduceDirect is a two-shot all-reduce over in-place inputs. Per round
// (W slices of at most one staging share each): rank p reduces slice p of
// every rank's input into its staging half and its own output, then after
// a barrier every rank copies the other slices from their owners' staging.
// In-place is safe: slice p of a buffer is written only by its owner after
// the barrier that ends every peer's reads of it.
func (x *Exec) allReduceDirect(o *Op, ms []meta, deadline time.Time) error {
	world, me, es := x.T.World(), x.Rank, o.DType.Size()
	part := x.T.StageBytes() / world / 64 * 64
	per := part / es // elements of one slice, at most
	total := o.Count
	srcs := make([]uintptr, world)
	for base := 0; base < total; base += per * world {
		n := min(per*world, total-base)
		each := (n + world - 1) / world
		slice := func(q int) (uintptr, int) { // byte offset and length of slice q
			lo, hi := min(q*each, n), min((q+1)*each, n)
			return uintptr((base + lo) * es), (hi - lo) * es
		}
		h := x.T.NextHalf()
		off, c := slice(me)
		if c > 0 {
			for r := range srcs {
				srcs[r] = x.peerIn(ms, r) + off
			}
			if err := x.reduce(o, x.T.Stage(me, h), srcs, c); err != nil {
				return err
			}
			x.copy(o.Out+off, x.T.Stage(me, h), c)
		}
		if _, err := x.T.Barrier(nil, o.Who(), deadline); err != nil {
			return err
		}
		for q := 0; q < world; q++ {
			if off, c := slice(q); q != me && c > 0 {
				x.copy(o.Out+off, x.T.Stage(q, h), c)
			}
		}
	}
	return nil
}
