package coll

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Every collective publishes its arguments in its rank's sync slot with the
// first barrier; after it every rank checks all slots the same way, so a
// disagreement fails on every rank at the same point and the group stays
// usable. Layout: the fixed header, then per-rank input and output element
// counts (the alltoall matrix row of this rank).

type meta struct {
	kind    ops.Kind
	dtype   int32
	redop   int32
	root    int32
	count   uint64
	seq     uint64
	scale   float64
	in, out []uint64

	// zero-copy: the region holding this rank's input (0: none), the
	// input's offset in it, flags, piece displacements from the input
	// start, and region ids this rank stopped sharing.
	inID, inOff uint64
	flags       uint32
	displ       []uint64
	retired     []uint64
}

// meta flags
const (
	flagFresh  = 1 << iota // inID is not bound to this group yet
	flagBindOK             // (bind agreement) this rank mapped every fresh region
	maxRetired = 4
	offDirect  = 40
	offRetired = 64
)

func encodeMeta(o *ops.Op, world int, z *zc) []byte {
	b := make([]byte, symm.SlotHeaderBytes+24*world)
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(o.Kind))
	le.PutUint32(b[4:], uint32(o.DType))
	le.PutUint32(b[8:], uint32(o.RedOp))
	le.PutUint32(b[12:], uint32(int32(o.Root)))
	le.PutUint64(b[16:], uint64(o.Count))
	le.PutUint64(b[24:], o.Seq)
	le.PutUint64(b[32:], math.Float64bits(o.Scale))
	for r := 0; r < world; r++ {
		if r < len(o.InPieces) {
			le.PutUint64(b[symm.SlotHeaderBytes+8*r:], uint64(o.InPieces[r].Count))
		}
		if r < len(o.OutPieces) {
			le.PutUint64(b[symm.SlotHeaderBytes+8*(world+r):], uint64(o.OutPieces[r].Count))
		}
	}
	if z != nil {
		le.PutUint64(b[offDirect:], z.id)
		le.PutUint64(b[offDirect+8:], z.off)
		le.PutUint32(b[offDirect+16:], z.flags)
		le.PutUint32(b[offDirect+20:], uint32(len(z.retired)))
		for i, id := range z.retired {
			le.PutUint64(b[offRetired+8*i:], id)
		}
		for r, d := range z.displ {
			le.PutUint64(b[symm.SlotHeaderBytes+8*(2*world+r):], d)
		}
	}
	return b
}

func decodeMeta(b []byte, world int) meta {
	le := binary.LittleEndian
	m := meta{
		kind: ops.Kind(le.Uint32(b[0:])), dtype: int32(le.Uint32(b[4:])), redop: int32(le.Uint32(b[8:])),
		root: int32(le.Uint32(b[12:])), count: le.Uint64(b[16:]), seq: le.Uint64(b[24:]),
		scale: math.Float64frombits(le.Uint64(b[32:])),
	}
	all := make([]uint64, 3*world) // one allocation for the three rows
	m.in, m.out, m.displ = all[:world:world], all[world:2*world:2*world], all[2*world:]
	for r := 0; r < world; r++ {
		m.in[r] = le.Uint64(b[symm.SlotHeaderBytes+8*r:])
		m.out[r] = le.Uint64(b[symm.SlotHeaderBytes+8*(world+r):])
		m.displ[r] = le.Uint64(b[symm.SlotHeaderBytes+8*(2*world+r):])
	}
	m.inID, m.inOff = le.Uint64(b[offDirect:]), le.Uint64(b[offDirect+8:])
	m.flags = le.Uint32(b[offDirect+16:])
	for i := 0; i < int(min(le.Uint32(b[offDirect+20:]), maxRetired)); i++ {
		m.retired = append(m.retired, le.Uint64(b[offRetired+8*i:]))
	}
	return m
}

// agree checks every rank's published arguments against rank 0's, and
// the alltoall matrix for consistency.
func agree(o *ops.Op, ms []meta) error {
	differ := func(what string, f func(m meta) string) error {
		var parts []string
		for r, m := range ms {
			parts = append(parts, fmt.Sprintf("rank %d: %s", r, f(m)))
		}
		return status.Errorf(status.Mismatch, "gosym: %s (seq %d): ranks disagree on %s: %s",
			o.Kind, o.Seq, what, strings.Join(parts, ", "))
	}
	for _, m := range ms[1:] {
		a := ms[0]
		switch {
		case m.kind != a.kind || m.seq != a.seq:
			return differ("the operation", func(m meta) string { return fmt.Sprintf("%s #%d", m.kind, m.seq) })
		case m.dtype != a.dtype:
			return differ("the dtype", func(m meta) string { return dtype.DType(m.dtype).String() })
		case m.root != a.root:
			return differ("the root", func(m meta) string { return fmt.Sprint(m.root) })
		case o.Kind != ops.AllToAll && m.count != a.count:
			return differ("the element count", func(m meta) string { return fmt.Sprint(m.count) })
		case (o.Kind == ops.AllReduce || o.Kind == ops.Reduce || o.Kind == ops.ReduceScatter) &&
			(m.redop != a.redop || math.Float64bits(m.scale) != math.Float64bits(a.scale)):
			return differ("the reduce op", func(m meta) string { return fmt.Sprintf("%s(%g)", dtype.RedOp(m.redop), m.scale) })
		}
	}
	if o.Kind == ops.AllToAll {
		for i := range ms {
			for j := range ms {
				if ms[i].in[j] != ms[j].out[i] {
					return status.Errorf(status.Mismatch,
						"gosym: all_to_all (seq %d): rank %d sends %d elements to rank %d, which expects %d from it",
						o.Seq, i, ms[i].in[j], j, ms[j].out[i])
				}
			}
		}
	}
	return nil
}
