package coll

import (
	"time"

	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
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
	// Acquire is where rank r's region id starts, mapped here, and pins
	// that mapping until release is called (a retired mapping is unmapped
	// on its last release). ok is false if it is not mapped.
	Acquire(r int, id uint64) (base uintptr, release func(), ok bool)
}

// zc is this rank's zero-copy view of one op's input.
type zc struct {
	id, off uint64
	flags   uint32
	displ   []uint64
	retired []uint64
}

// contributes reports whether rank r's input is read by op kind k.
func contributes(k ops.Kind, r, root int) bool {
	return !((k == ops.Broadcast || k == ops.Scatter) && r != root)
}

// view prepares this rank's zero-copy description of o.
func (x *Exec) view(o *ops.Op) *zc {
	if x.D == nil || o.Kind == ops.Barrier {
		return nil
	}
	z := &zc{retired: x.D.Retired(maxRetired)}
	start, n, displ := ops.InputSpan(o)
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
func (x *Exec) settle(o *ops.Op, ms []meta, deadline time.Time) (direct, restage bool, err error) {
	if x.D == nil || o.Kind == ops.Barrier {
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
func (x *Exec) contributesData(o *ops.Op, ms []meta, r int) bool {
	if o.Kind == ops.AllToAll || o.Kind == ops.ReduceScatter || o.Kind == ops.Scatter {
		for _, c := range ms[r].in {
			if c > 0 {
				return true
			}
		}
		return false
	}
	return ms[r].count > 0
}

// mapInputs is the map step of a direct op: where every contributing
// rank's input starts, here, taken from ms (this op's private copy of the
// sync slots, never the slots themselves), with each peer mapping pinned
// until release. A rank without a shareable input has no data to give.
func (x *Exec) mapInputs(o *ops.Op, ms []meta) (ins []uintptr, release func(), err error) {
	ins = make([]uintptr, len(ms))
	var pins []func()
	release = func() {
		for _, p := range pins {
			p()
		}
	}
	for r, m := range ms {
		if m.inID == 0 || !contributes(o.Kind, r, o.Root) {
			continue
		}
		base, pin, ok := x.D.Acquire(r, m.inID)
		if !ok {
			release()
			return nil, nil, status.Errorf(status.Internal, "gosym: %s: rank %d's region %d is not mapped here", o.Who(), r, m.inID)
		}
		pins = append(pins, pin)
		ins[r] = base + uintptr(m.inOff)
	}
	return ins, release, nil
}

// HookPoint names where Hook runs.
type HookPoint int

// Hook points of a direct op.
const (
	AfterAgree    HookPoint = iota // after the metadata barrier, before the map step
	BeforeRelease                  // after the completion barrier, before the release step
)

// Hook, when set (tests only), runs on the rank's collective goroutine at
// the points of a direct op: tests hold one rank there to show that the
// op's private copies keep it correct while the peers run ahead, and that
// the live slots would not.
var Hook func(at HookPoint, rank int, o *ops.Op)

func hook(at HookPoint, rank int, o *ops.Op) {
	if h := Hook; h != nil {
		h(at, rank, o)
	}
}

// runDirect runs o reading the peers' inputs in place: map, one copy (or
// one reduction) per byte, then a completion barrier so no rank reuses its
// input while a peer may still read it, then release. All-reduce is
// two-shot instead, which needs no completion barrier (see allReduceDirect).
func (x *Exec) runDirect(o *ops.Op, ms []meta, deadline time.Time) error {
	hook(AfterAgree, x.Rank, o)
	ins, release, err := x.mapInputs(o, ms)
	if err != nil {
		return err
	}
	defer release()
	if err = x.direct(o, ms, ins, deadline); err == nil {
		hook(BeforeRelease, x.Rank, o)
	}
	return err
}

// direct moves the bytes of a direct op; ins[r] is where rank r's input is
// mapped here.
func (x *Exec) direct(o *ops.Op, ms []meta, ins []uintptr, deadline time.Time) error {
	world, me, es := x.T.World(), x.Rank, o.DType.Size()
	nb := o.Count * es
	switch o.Kind {
	case ops.AllReduce:
		return x.allReduceDirect(o, ins, deadline)
	case ops.Reduce:
		if me == o.Root && nb > 0 {
			if err := x.reduce(o, o.Out, ins, nb); err != nil {
				return err
			}
		}
	case ops.ReduceScatter:
		if nb > 0 {
			srcs := make([]uintptr, world)
			for r := range srcs {
				srcs[r] = ins[r] + uintptr(ms[r].displ[me])
			}
			if err := x.reduce(o, o.Out, srcs, nb); err != nil {
				return err
			}
		}
	case ops.Broadcast:
		x.copy(o.Out, ins[o.Root], nb)
	case ops.AllGather, ops.Gather:
		if o.Kind == ops.AllGather || me == o.Root {
			for r, p := range o.OutPieces {
				x.copy(p.Addr, ins[r], nb)
			}
		}
	case ops.Scatter:
		x.copy(o.Out, ins[o.Root]+uintptr(ms[o.Root].displ[me]), nb)
	case ops.AllToAll:
		for r, p := range o.OutPieces {
			x.copy(p.Addr, ins[r]+uintptr(ms[r].displ[me]), p.Count*es)
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
func (x *Exec) allReduceDirect(o *ops.Op, ins []uintptr, deadline time.Time) error {
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
				srcs[r] = ins[r] + off
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
