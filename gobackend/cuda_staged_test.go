package gobackend

import (
	"fmt"
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/stretchr/testify/require"
)

// TestCUDAStagedMovesReadByShares: the staged data-movement ops (gs_copy
// below GOSYM_GPU_CE_MIN, the LL kernel off) over many blocks, on the fake
// driver, which runs a rank's blocks one after another. gs_copy's start
// barrier pairs block b of every rank, so a rank that stages nothing (a
// broadcast's or a scatter's receivers) must read only the share its block b
// covers: before session 43 they read the whole segment with a grid-wide
// stride, and here block 0 of a receiver read the root's later shares before
// the root's later blocks had staged them (the CUDA fuzzer met the same on one
// GPU shared by two processes). Every element arrives, and the outputs'
// poison shows what was not written.
func TestCUDAStagedMovesReadByShares(t *testing.T) {
	const world, n = 3, 20011 // 80 KB a piece: ten blocks of gs_copy
	t.Setenv("GOSYM_GPU_LL_MAX", "0")
	if inP2PFakeCUDA(t) {
		return
	}
	ranks := p2pGroup(t, []int{0, 1, 2}, 5*time.Second)
	runCUDAOpCases(t, ranks, n, func(k ops.Kind) bool {
		return k == ops.Broadcast || k == ops.Scatter || k == ops.Gather || k == ops.AllGather || k == ops.AllToAll
	})
}

// runCUDAOpCases runs each of opCases whose kind keep accepts on the ranks'
// fake devices, n elements a piece, fresh inputs, poisoned outputs, and
// checks every element of every rank's output.
func runCUDAOpCases(t *testing.T, ranks []*p2pRank, n int, keep func(ops.Kind) bool) {
	world := len(ranks)
	eps := make([]*Endpoint, world)
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	for _, c := range opCases {
		if !keep(c.kind) {
			continue
		}
		name := c.name
		if name == "" {
			name = fmt.Sprint(c.kind)
		}
		t.Run(name, func(t *testing.T) {
			in := make([][]float32, world)
			for r := range in {
				in[r] = make([]float32, world*n)
				for e := range in[r] {
					in[r][e] = float32(r*1000003+e) + 0.5
				}
			}
			outs, wants := make([][][]float32, world), make([][][]float32, world)
			errs := postCUDAAll(eps, func(r int) int { return ranks[r].device },
				func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) },
				func(r int) *Op {
					op, out, want := c.build(world, r, n, in)
					outs[r], wants[r] = out, want
					return op
				})
			require.Equal(t, make([]error, world), errs)
			for _, rk := range ranks {
				rk.sync(t)
			}
			for r := range world {
				for i, want := range wants[r] {
					for e := range want {
						if outs[r][i][e] != want[e] {
							require.Equal(t, want[e], outs[r][i][e], "rank %d output %d element %d", r, i, e)
						}
					}
				}
			}
		})
	}
}
