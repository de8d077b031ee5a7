package gobackend

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// TestCUDAAllToAllOnlyOwnPieceDiffers: on the fake driver, an all_to_all
// whose pieces are passed (as torch's all_to_all and all_to_all_single with
// split sizes pass them), each a buffer of its own, all of k elements but
// rank 0's to itself: ranks 1 and 2 see only equal pieces, rank 0 does not.
// Every rank must take the same path: before ops.Op.EvenPieces, 1 and 2 took
// LL or the chunk path on their look while rank 0 waited to agree on the
// splits, and all hung until the group's timeout (the CUDA fuzzer found it
// at worlds 2 and 4). Then the equal-split form without pieces, which skips
// the agreement. Outputs are poisoned, with one element past each piece.
func TestCUDAAllToAllOnlyOwnPieceDiffers(t *testing.T) {
	if inP2PFakeCUDA(t) {
		return
	}
	const world = 3
	devices := []int{0, 1, 2}
	ranks := p2pGroup(t, devices, 5*time.Second) // a regression fails in seconds
	eps := make([]*Endpoint, world)
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	dev := func(r int) int { return devices[r] }
	stream := func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) }
	sync := func() {
		for _, rk := range ranks {
			rk.sync(t)
		}
	}
	val := func(i, j, e int) float32 { return float32(i*10000+j*100+e) + 0.5 }
	const poison = -7
	for _, k := range []int{0, 1, 5, 16, 4096} {
		ok := t.Run(fmt.Sprintf("k%d", k), func(t *testing.T) {
			size := func(i, j int) int {
				if i == 0 && j == 0 {
					return k + 3
				}
				return k
			}
			ins, outs := make([][][]float32, world), make([][][]float32, world)
			for i := range world {
				ins[i], outs[i] = make([][]float32, world), make([][]float32, world)
				for j := range world {
					ins[i][j] = make([]float32, size(i, j)+1) // +1: a piece of 0 has an address
					for e := range size(i, j) {
						ins[i][j][e] = val(i, j, e)
					}
					outs[i][j] = make([]float32, size(j, i)+1)
					for e := range outs[i][j] {
						outs[i][j][e] = poison
					}
				}
			}
			errs := postCUDAAll(eps, dev, stream, func(r int) *Op {
				op := &Op{Kind: ops.AllToAll, DType: dtype.Float32}
				for j := range world {
					op.InPieces = append(op.InPieces, Piece{Addr: addr(ins[r][j]), Count: size(r, j)})
					op.OutPieces = append(op.OutPieces, Piece{Addr: addr(outs[r][j]), Count: size(j, r)})
				}
				return op
			})
			require.Equal(t, make([]error, world), errs)
			sync()
			for r := range world {
				for j := range world {
					for e := range size(j, r) {
						require.Equal(t, val(j, r, e), outs[r][j][e], "rank %d from %d element %d", r, j, e)
					}
					require.Equal(t, float32(poison), outs[r][j][size(j, r)], "rank %d from %d: past the piece", r, j)
				}
			}
		})
		if !ok { // the group is broken: later ops would only queue more spinning kernels
			return
		}
	}
	// The equal-split form (no pieces: ops.Even makes them and marks the op).
	const n = 40
	in, out := make([][]float32, world), make([][]float32, world)
	for r := range world {
		in[r], out[r] = make([]float32, n*world), make([]float32, n*world)
		for e := range in[r] {
			in[r][e], out[r][e] = val(r, e/n, e%n), poison
		}
	}
	errs := postCUDAAll(eps, dev, stream, func(r int) *Op {
		return &Op{Kind: ops.AllToAll, DType: dtype.Float32, Count: n, In: addr(in[r]), Out: addr(out[r])}
	})
	require.Equal(t, make([]error, world), errs)
	sync()
	for r := range world {
		for e := range out[r] {
			require.Equal(t, val(e/n, r, e%n), out[r][e], "equal split: rank %d element %d", r, e)
		}
	}
}

// TestCUDAAllToAllEqualPaced: with gs_a2av on (GOSYM_GPU_A2AV_BLOCKS) and
// GOSYM_GPU_A2A_PACED_MIN set, an equal-split all_to_all (one buffer, no
// pieces) whose input has at least that many bytes per rank runs gs_a2av on
// every rank, and a smaller one does not (no LL kernel here: it takes small
// ones first); pieces passed, even all equal, are splits that may differ
// elsewhere, so they run gs_a2av at any size. Every element arrives, and
// the element past each rank's output stays poisoned. One group for all, in
// turn: staged, paced, paced, staged, paced.
func TestCUDAAllToAllEqualPaced(t *testing.T) {
	const world, k = 3, 1000 // k elements a piece: 12000 bytes of input per rank
	t.Setenv("GOSYM_GPU_A2AV_BLOCKS", "4")
	t.Setenv("GOSYM_GPU_A2A_PACED_MIN", fmt.Sprint(world*4*k))
	t.Setenv("GOSYM_GPU_LL_MAX", "0")
	if inP2PFakeCUDA(t) {
		return
	}
	ranks := p2pGroup(t, []int{0, 1, 2}, 5*time.Second) // a regression fails in seconds
	for _, c := range []struct {
		n      int
		pieces bool
		paced  bool
	}{{k - 1, false, false}, {k, false, true}, {k - 1, true, true}, {k - 1, false, false}, {3 * k, false, true}} {
		t.Run(fmt.Sprintf("n%d-pieces%v", c.n, c.pieces), func(t *testing.T) {
			require.Equal(t, c.paced, equalAllToAllPaced(t, ranks, c.n, c.pieces))
		})
	}
}

// equalAllToAllPaced runs one all_to_all of n elements to and from every
// rank of ranks (pieces: passed one per rank, else one buffer), checks
// every rank's output, and says whether rank 0 ran it on gs_a2av.
func equalAllToAllPaced(t *testing.T, ranks []*p2pRank, n int, pieces bool) bool {
	world := len(ranks)
	eps := make([]*Endpoint, world)
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	val := func(i, j, e int) float32 { return float32(i*100000+j*10000+e) + 0.5 }
	const poison = -7
	in, out := make([][]float32, world), make([][]float32, world)
	for r := range world {
		in[r], out[r] = make([]float32, n*world), make([]float32, n*world+1)
		for e := range in[r] {
			in[r][e] = val(r, e/n, e%n)
		}
		for e := range out[r] {
			out[r][e] = poison
		}
	}
	before := eps[0].StatsMap()["gpu_paced_all_to_all"].(int64)
	errs := postCUDAAll(eps, func(r int) int { return r },
		func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) },
		func(r int) *Op {
			if !pieces {
				return &Op{Kind: ops.AllToAll, DType: dtype.Float32, Count: n, In: addr(in[r]), Out: addr(out[r])}
			}
			op := &Op{Kind: ops.AllToAll, DType: dtype.Float32}
			for j := range world {
				op.InPieces = append(op.InPieces, Piece{Addr: addr(in[r][j*n:]), Count: n})
				op.OutPieces = append(op.OutPieces, Piece{Addr: addr(out[r][j*n:]), Count: n})
			}
			return op
		})
	require.Equal(t, make([]error, world), errs)
	for _, rk := range ranks {
		rk.sync(t)
	}
	for r := range world {
		for e := range n * world {
			require.Equal(t, val(e/n, r, e%n), out[r][e], "rank %d element %d", r, e)
		}
		require.Equal(t, float32(poison), out[r][n*world], "rank %d: past the output", r)
	}
	return eps[0].StatsMap()["gpu_paced_all_to_all"].(int64)-before == 1
}
