// Package coll is the host data plane's collectives, written against two
// small interfaces: a Team (symmetric staging memory, barrier, mailboxes:
// symm.Team) and a Plane (how bytes are copied and reduced: host.Plane),
// with a Direct (memreg.Binder) for ops on registered memory. The ops are
// internal/ops's; the CUDA data plane (internal/gpu) runs the same ops
// with its own algorithms (kernels on the caller's stream), not Exec.
package coll

import (
	"time"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Team is the symmetric memory and synchronisation a collective runs on.
type Team interface {
	World() int
	StageBytes() int
	NextHalf() int
	Stage(rank, half int) uintptr
	Barrier(meta []byte, who symm.Who, deadline time.Time) ([][]byte, error)

	BoxBytes() int
	Box(src, dst, half int) uintptr
	WaitBoxFree(dst int, k uint32, who symm.Who, deadline time.Time) error
	PostChunk(dst int, k uint32, h symm.ChunkHeader)
	WaitChunk(src int, k uint32, who symm.Who, deadline time.Time) (symm.ChunkHeader, error)
	AckChunk(src int, k uint32)
}

// Plane moves and reduces bytes.
type Plane interface {
	Copy(dst, src uintptr, n int)
	Reduce(dst uintptr, srcs []uintptr, n int, dt dtype.DType, op dtype.RedOp, scale float64) error
}

// Exec runs collectives for one rank. Every collective is a sequence of
// rounds; in round k each rank writes ("puts") what it contributes into its
// own staging half, all ranks meet at a barrier, then each rank reads
// ("gets") what it needs from the peers' staging halves. Staging is double
// buffered by barrier parity: a rank writes half h only after the barrier
// that proves every peer finished reading it, so one barrier per round
// suffices, within an op and across ops.
type Exec struct {
	T       Team
	P       Plane
	Rank    int
	Threads int    // goroutines used for one large copy or reduction
	D       Direct // zero-copy access to shareable inputs; nil: always stage
	// DirectMin is the smallest input read in place: below it one staged
	// round (one barrier) beats zero-copy (two barriers).
	DirectMin int

	// point-to-point chunk counters, per peer; each is touched only by that
	// peer's send (or receive) worker.
	sentK, recvK []uint32
}

// NewExec prepares an executor for rank of t.
func NewExec(t Team, p Plane, rank, threads int) *Exec {
	w := t.World()
	return &Exec{T: t, P: p, Rank: rank, Threads: max(1, threads), sentK: make([]uint32, w), recvK: make([]uint32, w)}
}

func (x *Exec) copy(dst, src uintptr, n int) {
	if n <= 0 || dst == src {
		return
	}
	Par(x.Threads, n, 64, func(lo, hi int) { x.P.Copy(dst+uintptr(lo), src+uintptr(lo), hi-lo) })
}

func (x *Exec) reduce(o *ops.Op, dst uintptr, srcs []uintptr, n int) error {
	return ParReduce(x.Threads, dst, srcs, n, o.DType.Size(), func(d uintptr, s []uintptr, c int) error {
		return x.P.Reduce(d, s, c, o.DType, o.RedOp, o.Scale)
	})
}

// round is one step of a collective: put before the barrier, get after.
type round struct {
	put func(k, h int)
	get func(k, h int) error
}

// run drives rounds. The first barrier carries the op's metadata (and
// this rank's first round, unless its input is shareable and may be read
// in place); once all ranks agree, rounds(metas) says how many rounds the
// op takes (at least one, which carries the metadata even for empty ops).
func (x *Exec) run(o *ops.Op, deadline time.Time, rounds func(ms []meta) int, r round) error {
	z := x.view(o)
	h := x.T.NextHalf()
	if r.put != nil && (z == nil || z.id == 0) {
		r.put(0, h)
	}
	raw, err := x.T.Barrier(encodeMeta(o, x.T.World(), z), o.Who(), deadline)
	if err != nil {
		return err
	}
	ms := make([]meta, len(raw))
	for q, b := range raw {
		ms[q] = decodeMeta(b, len(raw))
		if x.D != nil && q != x.Rank && len(ms[q].retired) > 0 {
			x.D.Forget(q, ms[q].retired)
		}
	}
	if err := agree(o, ms); err != nil {
		return err
	}
	direct, restage, err := x.settle(o, ms, deadline)
	if err != nil {
		return err
	}
	if direct {
		return x.runDirect(o, ms, deadline)
	}
	n, k := max(1, rounds(ms)), 0
	if !restage {
		if r.get != nil {
			if err := r.get(0, h); err != nil {
				return err
			}
		}
		k = 1
	}
	for ; k < n; k++ {
		h := x.T.NextHalf()
		if r.put != nil {
			r.put(k, h)
		}
		if _, err := x.T.Barrier(nil, o.Who(), deadline); err != nil {
			return err
		}
		if r.get != nil {
			if err := r.get(k, h); err != nil {
				return err
			}
		}
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Run executes collective o (not send/recv) to completion.
func (x *Exec) Run(o *ops.Op, deadline time.Time) error {
	world, me := x.T.World(), x.Rank
	es := o.DType.Size()
	nb := o.Count * es
	whole := x.T.StageBytes() / 64 * 64 // one rank's share of a round: all of a half
	part := x.T.StageBytes() / world / 64 * 64
	fixed := func(total, per int) func([]meta) int {
		return func([]meta) int { return ceilDiv(total, per) }
	}
	span := func(k, per, total int) (int, int) { // byte range of round k
		off := k * per
		return off, max(0, min(per, total-off))
	}
	stages := func(h int, off uintptr) []uintptr {
		s := make([]uintptr, world)
		for r := range s {
			s[r] = x.T.Stage(r, h) + off
		}
		return s
	}
	isRoot := me == o.Root

	switch o.Kind {
	case ops.Barrier:
		return x.run(o, deadline, fixed(0, 1), round{})

	case ops.AllReduce, ops.Reduce:
		return x.run(o, deadline, fixed(nb, whole), round{
			put: func(k, h int) {
				off, c := span(k, whole, nb)
				x.copy(x.T.Stage(me, h), o.In+uintptr(off), c)
			},
			get: func(k, h int) error {
				off, c := span(k, whole, nb)
				if c == 0 || (o.Kind == ops.Reduce && !isRoot) {
					return nil
				}
				return x.reduce(o, o.Out+uintptr(off), stages(h, 0), c)
			},
		})

	case ops.Broadcast:
		return x.run(o, deadline, fixed(nb, whole), round{
			put: func(k, h int) {
				if isRoot {
					off, c := span(k, whole, nb)
					x.copy(x.T.Stage(me, h), o.In+uintptr(off), c)
					x.copy(o.Out+uintptr(off), o.In+uintptr(off), c)
				}
			},
			get: func(k, h int) error {
				if !isRoot {
					off, c := span(k, whole, nb)
					x.copy(o.Out+uintptr(off), x.T.Stage(o.Root, h), c)
				}
				return nil
			},
		})

	case ops.AllGather, ops.Gather:
		return x.run(o, deadline, fixed(nb, whole), round{
			put: func(k, h int) {
				off, c := span(k, whole, nb)
				x.copy(x.T.Stage(me, h), o.In+uintptr(off), c)
			},
			get: func(k, h int) error {
				if o.Kind == ops.Gather && !isRoot {
					return nil
				}
				off, c := span(k, whole, nb)
				for r, p := range o.OutPieces {
					x.copy(p.Addr+uintptr(off), x.T.Stage(r, h), c)
				}
				return nil
			},
		})

	case ops.ReduceScatter:
		return x.run(o, deadline, fixed(nb, part), round{
			put: func(k, h int) {
				off, c := span(k, part, nb)
				for r, p := range o.InPieces {
					x.copy(x.T.Stage(me, h)+uintptr(r*part), p.Addr+uintptr(off), c)
				}
			},
			get: func(k, h int) error {
				off, c := span(k, part, nb)
				if c == 0 {
					return nil
				}
				return x.reduce(o, o.Out+uintptr(off), stages(h, uintptr(me*part)), c)
			},
		})

	case ops.Scatter:
		return x.run(o, deadline, fixed(nb, part), round{
			put: func(k, h int) {
				if isRoot {
					off, c := span(k, part, nb)
					for r, p := range o.InPieces {
						x.copy(x.T.Stage(me, h)+uintptr(r*part), p.Addr+uintptr(off), c)
					}
				}
			},
			get: func(k, h int) error {
				off, c := span(k, part, nb)
				x.copy(o.Out+uintptr(off), x.T.Stage(o.Root, h)+uintptr(me*part), c)
				return nil
			},
		})

	case ops.AllToAll:
		return x.run(o, deadline, func(ms []meta) int {
			most := 0
			for _, m := range ms {
				for _, c := range m.in {
					most = max(most, int(c)*es)
				}
			}
			return ceilDiv(most, part)
		}, round{
			put: func(k, h int) {
				for r, p := range o.InPieces {
					if r != me { // my piece for myself skips staging
						off, c := span(k, part, p.Count*es)
						x.copy(x.T.Stage(me, h)+uintptr(r*part), p.Addr+uintptr(off), c)
					}
				}
			},
			get: func(k, h int) error {
				for r, p := range o.OutPieces {
					off, c := span(k, part, p.Count*es)
					src := x.T.Stage(r, h) + uintptr(me*part)
					if r == me {
						src = o.InPieces[me].Addr + uintptr(off)
					}
					x.copy(p.Addr+uintptr(off), src, c)
				}
				return nil
			},
		})
	}
	return status.Errorf(status.InvalidArg, "gosym: %s is not a collective", o.Kind)
}
