package gpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// TestSignature: what every rank must pass alike is in an op's signature,
// and what may differ between ranks is not; describeSig reads it back.
func TestSignature(t *testing.T) {
	even := func(n, world int) []ops.Piece {
		ps := make([]ops.Piece, world)
		for i := range ps {
			ps[i].Count = n
		}
		return ps
	}
	for _, c := range []struct {
		op   ops.Op
		says string
	}{
		{ops.Op{Kind: ops.AllReduce, Count: 100, DType: dtype.BFloat16, RedOp: dtype.Max}, "all_reduce, 100 elements of bfloat16, MAX"},
		{ops.Op{Kind: ops.Reduce, Count: 7, Root: 2}, "reduce, 7 elements of float32, SUM, root 2"},
		{ops.Op{Kind: ops.Broadcast, Count: 10, DType: dtype.Int64, Root: 1}, "broadcast, 80 bytes, root 1"},
		{ops.Op{Kind: ops.AllGather, Count: 3, OutPieces: even(3, 4)}, "all_gather, 12 bytes"},
		{ops.Op{Kind: ops.AllGather, Count: 3, OutPieces: append(even(3, 3), ops.Piece{Count: 5})}, "all_gather"},
		{ops.Op{Kind: ops.ReduceScatter, Count: 4, InPieces: even(4, 2), RedOp: dtype.Avg}, "reduce_scatter, 4 elements of float32, AVG"},
		{ops.Op{Kind: ops.AllToAll, Count: 9}, "all_to_all"},
		{ops.Op{Kind: ops.Scatter, Count: 9, Root: 0}, "scatter, root 0"},
		{ops.Op{Kind: ops.Barrier}, "barrier"},
	} {
		require.Equal(t, c.says, describeSig(signature(&c.op)), "%+v", c.op)
	}
	a := ops.Op{Kind: ops.AllReduce, Count: 8}
	for _, b := range []ops.Op{
		{Kind: ops.AllReduce, Count: 9},
		{Kind: ops.AllReduce, Count: 8, DType: dtype.Float16},
		{Kind: ops.AllReduce, Count: 8, RedOp: dtype.Min},
		{Kind: ops.Reduce, Count: 8},
	} {
		require.NotEqual(t, signature(&a), signature(&b), "%+v", b)
	}
	// All_to_all's splits and a root's pieces may differ between ranks.
	x, y := ops.Op{Kind: ops.AllToAll, Count: 3, InPieces: even(3, 2)}, ops.Op{Kind: ops.AllToAll, Count: 5}
	require.Equal(t, signature(&x), signature(&y))
}
