package ops

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// TestEvenMarksEvenPieces: an op posted without pieces gets world equal,
// evenly spaced pieces and EvenPieces (the contract that lets a rank choose
// a path by their layout without asking the others); one posted with pieces
// keeps them and never gets the flag, even when they look even here.
func TestEvenMarksEvenPieces(t *testing.T) {
	const world = 3
	o := &Op{Kind: AllToAll, DType: dtype.Float32, Count: 5, In: 0x1000, Out: 0x2000}
	Even(o, world)
	require.True(t, o.EvenPieces)
	require.Zero(t, o.Count)
	require.Len(t, o.InPieces, world)
	for r := range world {
		require.Equal(t, Piece{Addr: 0x1000 + uintptr(r)*20, Count: 5}, o.InPieces[r])
		require.Equal(t, Piece{Addr: 0x2000 + uintptr(r)*20, Count: 5}, o.OutPieces[r])
	}
	ps := []Piece{{0x1000, 5}, {0x1014, 5}, {0x1028, 5}}
	v := &Op{Kind: AllToAll, DType: dtype.Float32, InPieces: ps, OutPieces: ps}
	Even(v, world)
	require.False(t, v.EvenPieces, "pieces passed by the caller")
	g := &Op{Kind: AllGather, DType: dtype.Float32, Count: 5, In: 0x1000, Out: 0x2000}
	Even(g, world)
	require.True(t, g.EvenPieces)
	require.Len(t, g.OutPieces, world)
	rs := &Op{Kind: ReduceScatter, DType: dtype.Float32, Count: 5, In: 0x1000, Out: 0x2000}
	Even(rs, world)
	require.True(t, rs.EvenPieces)
	require.Equal(t, Piece{Addr: 0x1000 + 2*20, Count: 5}, rs.InPieces[2])
	rv := &Op{Kind: ReduceScatter, DType: dtype.Float32, Count: 5, Out: 0x2000, InPieces: ps}
	Even(rv, world)
	require.False(t, rv.EvenPieces, "reduce_scatter's list form")
	ar := &Op{Kind: AllReduce, DType: dtype.Float32, Count: 5, In: 0x1000, Out: 0x1000}
	Even(ar, world)
	require.False(t, ar.EvenPieces, "no pieces to make")
}
