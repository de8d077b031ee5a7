package gpu

import (
	"testing"

	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/stretchr/testify/require"
)

// reduce_scatter's pieces: evenly spaced by a multiple of the element size
// take the fused launch; one piece (a world of one) does too, at stride 0;
// anything else is staged piece by piece.
func TestPieceStride(t *testing.T) {
	at := func(addrs ...uintptr) []ops.Piece {
		p := make([]ops.Piece, len(addrs))
		for i, a := range addrs {
			p[i] = ops.Piece{Addr: a}
		}
		return p
	}
	for _, c := range []struct {
		name   string
		pieces []ops.Piece
		es     uintptr
		stride uintptr
		even   bool
	}{
		{"one piece", at(0x1000), 4, 0, true},
		{"even", at(0x1000, 0x1400, 0x1800, 0x1c00), 4, 0x400, true},
		{"stride not of the element", at(0x1000, 0x1006, 0x100c), 4, 6, false},
		{"uneven", at(0x1000, 0x1400, 0x1900), 4, 0, false},
		{"backwards", at(0x1400, 0x1000), 4, 0, false},
		{"none", nil, 4, 0, false},
	} {
		stride, even := pieceStride(c.pieces, c.es)
		require.Equal(t, c.even, even, c.name)
		if even {
			require.Equal(t, c.stride, stride, c.name)
		}
	}
}
