package ops

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// TestEvenMarksEqualSplit: an all_to_all posted without pieces gets world
// equal pieces and EqualSplit (the contract that lets a rank skip agreeing
// on the splits); one posted with pieces keeps them and never gets the flag,
// even when they are all equal here: a peer's own piece may differ.
func TestEvenMarksEqualSplit(t *testing.T) {
	const world = 3
	o := &Op{Kind: AllToAll, DType: dtype.Float32, Count: 5, In: 0x1000, Out: 0x2000}
	Even(o, world)
	require.True(t, o.EqualSplit)
	require.Zero(t, o.Count)
	require.Len(t, o.InPieces, world)
	for r := range world {
		require.Equal(t, Piece{Addr: 0x1000 + uintptr(r)*20, Count: 5}, o.InPieces[r])
		require.Equal(t, Piece{Addr: 0x2000 + uintptr(r)*20, Count: 5}, o.OutPieces[r])
	}
	ps := []Piece{{0x1000, 5}, {0x1014, 5}, {0x1028, 5}}
	v := &Op{Kind: AllToAll, DType: dtype.Float32, InPieces: ps, OutPieces: ps}
	Even(v, world)
	require.False(t, v.EqualSplit, "pieces passed by the caller")
	g := &Op{Kind: AllGather, DType: dtype.Float32, Count: 5, In: 0x1000, Out: 0x2000}
	Even(g, world)
	require.False(t, g.EqualSplit)
	require.Len(t, g.OutPieces, world)
}
