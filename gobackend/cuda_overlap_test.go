package gobackend

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// With GOSYM_GPU_CE_OVERLAP_MIN at 1 byte, a copy-engine move's local
// piece runs on the team's second stream: all_gather and all_to_all (equal
// splits and splits that differ) on the direct path with the copy engines
// at every size, on the fake driver's three devices, twice each (the
// stream and its events are reused). Results exact when the op's stream
// is done (the fake driver delays the local copy: a missing join shows),
// outputs poisoned, and every op counted as having run its own piece
// beside the others.
func TestCUDAMoveLocalPieceBeside(t *testing.T) {
	if st := ceMoves(t, "1"); st != nil {
		require.EqualValues(t, 6, st["gpu_ce_beside"], "%v", st)
	}
}

// The same with the threshold above every op, and unset: the fake driver's
// GPUs have no measurement, so the overlap is off there. One stream, the
// same results.
func TestCUDAMoveLocalPieceInTurn(t *testing.T) {
	for _, v := range []string{"1073741824", ""} {
		t.Run("min="+v, func(t *testing.T) {
			if st := ceMoves(t, v); st != nil {
				require.EqualValues(t, 0, st["gpu_ce_beside"], "%v", st)
			}
		})
	}
}

// ceMoves runs the ops of the two tests above with GOSYM_GPU_CE_OVERLAP_MIN
// set to overlap ("": unset) and returns rank 0's counters (nil in the
// parent process).
func ceMoves(t *testing.T, overlap string) map[string]any {
	t.Setenv("GOSYM_GPU_DIRECT_MIN", "1")
	t.Setenv("GOSYM_GPU_DIRECT_CE_MIN", "0")
	t.Setenv("GOSYM_GPU_LL_MAX", "0")
	t.Setenv("GOSYM_GPU_CE_OVERLAP_MIN", overlap)
	// the local piece's copy late: without the join the op's stream would end before it
	t.Setenv("FAKECUDA_LOCAL_COPY_DELAY_MS", "200")
	if inP2PFakeCUDA(t) {
		return nil
	}
	const world, n = 3, 1001 // elements per piece (odd: no piece is aligned alike)
	devices := []int{0, 1, 2}
	ranks := p2pGroup(t, devices, 20*time.Second)
	eps := make([]*Endpoint, world)
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	alloc := func(rk *p2pRank, vals []float32) uintptr {
		p, err := rk.g.Driver().MemAlloc(rk.g.Context(), uintptr(4*len(vals)))
		require.NoError(t, err)
		t.Cleanup(func() { rk.g.Driver().MemFree(rk.g.Context(), p) })
		b := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		require.NoError(t, rk.g.Driver().MemcpyHtoD(rk.g.Context(), p, b))
		return p
	}
	read := func(rk *p2pRank, p uintptr, count int) []float32 {
		b := make([]byte, 4*count)
		require.NoError(t, rk.g.Driver().MemcpyDtoH(rk.g.Context(), b, p))
		out := make([]float32, count)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out
	}
	const poison = -7
	filled := func(count int, f func(i int) float32) []float32 {
		v := make([]float32, count)
		for i := range v {
			v[i] = f(i)
		}
		return v
	}
	// what rank r sends rank j at element e; how many where the splits differ
	val := func(r, j, e int) float32 { return float32(r*100000+j*10000+e) + 0.5 }
	skew := func(r, j int) int { return n * (r + j + 1) }
	run := func(what string, mk func(r int) *Op, check func(r int)) {
		errs := postCUDAAll(eps, func(r int) int { return devices[r] },
			func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) }, mk)
		require.Equal(t, make([]error, world), errs, what)
		for _, rk := range ranks {
			rk.sync(t)
		}
		for r := range world {
			check(r)
		}
	}
	var before map[string]any
	for rep := range 3 { // rep 0 sets the plane up and binds: 1 and 2 are counted
		if rep == 1 {
			before = eps[0].StatsMap()
		}
		// all_gather: rank r's n elements into piece r of every rank's output (one past it poisoned)
		outs := make([]uintptr, world)
		for r, rk := range ranks {
			outs[r] = alloc(rk, filled(world*n+1, func(int) float32 { return poison }))
		}
		run("all_gather", func(r int) *Op {
			in := alloc(ranks[r], filled(n, func(e int) float32 { return val(r, 0, e) }))
			return &Op{Kind: ops.AllGather, DType: dtype.Float32, Count: n, In: in, Out: outs[r]}
		}, func(r int) {
			got := read(ranks[r], outs[r], world*n+1)
			for e := range world * n {
				require.Equal(t, val(e/n, 0, e%n), got[e], "rep %d all_gather: rank %d element %d", rep, r, e)
			}
			require.EqualValues(t, poison, got[world*n], "rep %d all_gather: rank %d past the output", rep, r)
		})
		// all_to_all_single of equal splits: piece j of rank r's input to rank j
		for r, rk := range ranks {
			outs[r] = alloc(rk, filled(world*n+1, func(int) float32 { return poison }))
		}
		run("all_to_all", func(r int) *Op {
			in := alloc(ranks[r], filled(world*n, func(e int) float32 { return val(r, e/n, e%n) }))
			return &Op{Kind: ops.AllToAll, DType: dtype.Float32, Count: n, In: in, Out: outs[r]}
		}, func(r int) {
			got := read(ranks[r], outs[r], world*n+1)
			for e := range world * n {
				require.Equal(t, val(e/n, r, e%n), got[e], "rep %d all_to_all: rank %d element %d", rep, r, e)
			}
			require.EqualValues(t, poison, got[world*n], "rep %d all_to_all: rank %d past the output", rep, r)
		})
		// splits that differ, each output piece a buffer of its own: rank r sends rank j (r+j+1)*n
		outPieces := make([][]Piece, world)
		for r, rk := range ranks {
			for j := range world {
				p := alloc(rk, filled(skew(j, r)+1, func(int) float32 { return poison }))
				outPieces[r] = append(outPieces[r], Piece{Addr: p, Count: skew(j, r)})
			}
		}
		run("all_to_all skewed", func(r int) *Op {
			// one input buffer (all_to_all_single with split sizes): the peers read it in place
			var vals []float32
			for j := range world {
				vals = append(vals, filled(skew(r, j), func(e int) float32 { return val(r, j, e) })...)
			}
			in := alloc(ranks[r], vals)
			op := &Op{Kind: ops.AllToAll, DType: dtype.Float32, OutPieces: outPieces[r]}
			for j := range world {
				op.InPieces = append(op.InPieces, Piece{Addr: in, Count: skew(r, j)})
				in += uintptr(4 * skew(r, j))
			}
			return op
		}, func(r int) {
			for j, pc := range outPieces[r] {
				got := read(ranks[r], pc.Addr, pc.Count+1)
				for e := range pc.Count {
					require.Equal(t, val(j, r, e), got[e], "rep %d skewed: rank %d from %d element %d", rep, r, j, e)
				}
				require.EqualValues(t, poison, got[pc.Count], "rep %d skewed: rank %d from %d past the piece", rep, r, j)
			}
		})
	}
	st := eps[0].StatsMap()
	for k, v := range st {
		if b, ok := before[k].(int64); ok {
			st[k] = v.(int64) - b
		}
	}
	require.EqualValues(t, 6, st["gpu_direct_ops"], "every op on the direct path: %v", st)
	return st
}
