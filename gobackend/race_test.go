package gobackend

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// TestSlotIsReusedAfterItsBarrier shows the hazard the snapshots design
// out (UCC alltoallv race): a sync slot read after the barrier that lets
// its owner reuse it holds another op's metadata, while the copy Barrier
// returned still holds this op's.
func TestSlotIsReusedAfterItsBarrier(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	who := symm.Who{Op: "test"}
	meta := func(b byte) []byte { return bytes.Repeat([]byte{b}, 16) }
	snaps := make([][][]byte, 2)
	half := eps[0].team.NextHalf() // the slot the first barrier uses
	done := make(chan struct{})
	for r, ep := range eps {
		go func() {
			defer func() { done <- struct{}{} }()
			var err error
			snaps[r], err = ep.team.Barrier(meta(0xA0+byte(r)), who, time.Now().Add(5*time.Second))
			require.NoError(t, err)
			for i := 0; i < 2; i++ { // the slot's parity comes round again
				_, err = ep.team.Barrier(meta(0xB0+byte(r)), who, time.Now().Add(5*time.Second))
				require.NoError(t, err)
			}
		}()
	}
	<-done
	<-done
	require.Equal(t, meta(0xA1), snaps[0][1], "the snapshot keeps rank 1's metadata")
	live := eps[0].team.PeekSlot(1, half)[:16]
	require.Equal(t, meta(0xB1), live, "the live slot now holds a later op's metadata")
}

// TestDirectAllToAllWithDelayedRank delays rank 0 after every metadata
// barrier while rank 1 posts 4*16 async uneven all_to_all ops back to back
// on the same buffers: all results are right and the peer-mapping cache
// ends where it started (one mapping per peer region, no drops).
func TestDirectAllToAllWithDelayedRank(t *testing.T) {
	eps := group(t, 2, 20*time.Second)
	for _, ep := range eps {
		ep.exec.DirectMin = 1
	}
	coll.AfterAgreeHook = func(rank int, o *Op) {
		if rank == 0 && o.Kind == coll.AllToAll {
			time.Sleep(2 * time.Millisecond)
		}
	}
	defer func() { coll.AfterAgreeHook = nil }()
	const n = 1000
	cnt := func(s, d int) int { return 100 + 300*s + 200*d } // uneven, fits n
	in := [][]float32{shared(t, 2*n), shared(t, 2*n)}
	const ops = 4 * 16
	outs := make([][][]float32, ops)
	works := make([][]*Work, ops)
	for k := 0; k < ops; k++ {
		outs[k] = make([][]float32, 2)
		for r := range eps {
			outs[k][r] = shared(t, 2*n)
		}
	}
	for r := range in {
		for i := range in[r] {
			in[r][i] = rand.Float32()
		}
	}
	post := func(r, k int) *Work {
		op := &Op{Kind: coll.AllToAll, DType: dtype.Float32}
		for d := 0; d < 2; d++ {
			op.InPieces = append(op.InPieces, Piece{Addr: addr(in[r][d*n:]), Count: cnt(r, d)})
			op.OutPieces = append(op.OutPieces, Piece{Addr: addr(outs[k][r][d*n:]), Count: cnt(d, r)})
		}
		w, err := eps[r].Post(op)
		require.NoError(t, err)
		return w
	}
	for k := 0; k < ops; k++ { // rank 1 queues everything first
		works[k] = append(works[k], nil, post(1, k))
	}
	for k := 0; k < ops; k++ {
		works[k][0] = post(0, k)
	}
	for k := 0; k < ops; k++ {
		for r := range eps {
			require.NoError(t, works[k][r].Wait(-1))
			for s := 0; s < 2; s++ {
				require.Equal(t, in[s][r*n:r*n+cnt(s, r)], outs[k][r][s*n:s*n+cnt(s, r)], "op %d rank %d from %d", k, r, s)
			}
		}
	}
	for r, ep := range eps {
		st := ep.bind.stats()
		require.Equal(t, int64(1), st["peer_maps"], "rank %d maps its peer's input region once", r)
		require.Equal(t, int64(1), st["peer_map_misses"], "rank %d", r)
		require.Equal(t, int64(0), st["peer_map_dropped"], "rank %d", r)
	}
}
