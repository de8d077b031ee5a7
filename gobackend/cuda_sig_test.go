package gobackend

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda/cudatest"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// TestGPUMismatchedArgsNamedOnEveryRank: one rank passes another count
// (or dtype) to a CUDA all_reduce than the others. Every rank must fail
// with an error naming both ranks' arguments, well before the group's
// timeout (internal/gpu/sig.go): the rank that posts last refuses the op
// and aborts the kernels its peers already enqueued; they raise at their
// next op. Both orders: the odd rank posts last, then first.
func TestGPUMismatchedArgsNamedOnEveryRank(t *testing.T) {
	if cudatest.InFakeChild(t) {
		return
	}
	world := simWorld(t)
	ranks := newSimRanks(t, world, 1)
	const n = 64
	for _, c := range []struct {
		name      string
		oddFirst  bool
		odd       Op
		oddSays   string
		othersSay string
	}{
		{"count, odd rank last", false, Op{Kind: ops.AllReduce, Count: n / 2}, "all_reduce, 32 elements of float32, SUM", "all_reduce, 64 elements of float32, SUM"},
		{"dtype, odd rank first", true, Op{Kind: ops.AllReduce, Count: n, DType: dtype.Int32}, "all_reduce, 64 elements of int32, SUM", "all_reduce, 64 elements of float32, SUM"},
	} {
		t.Run(c.name, func(t *testing.T) {
			eps := group(t, world, time.Minute) // a timeout would take a minute: the test allows 15 s
			odd := world - 1
			post := func(r int, op Op) error {
				buf := make([]float32, n)
				op.In, op.Out = addr(buf), addr(buf)
				_, err := eps[r].PostCUDA(&op, r, uintptr(ranks[r].streams[0]), false)
				return err
			}
			all := func(op func(r int) Op, ranks []int) []error {
				errs := make([]error, world)
				var wg sync.WaitGroup
				for _, r := range ranks {
					wg.Add(1)
					go func() { defer wg.Done(); errs[r] = post(r, op(r)) }()
				}
				wg.Wait()
				return errs
			}
			good := func(int) Op { return Op{Kind: ops.AllReduce, Count: n} }
			every := make([]int, world)
			others := make([]int, 0, world)
			for r := range every {
				every[r] = r
				if r != odd {
					others = append(others, r)
				}
			}
			require.Equal(t, make([]error, world), all(good, every), "the plane's first op")
			drain(t, ranks, 15*time.Second)
			first, second := others, []int{odd}
			if c.oddFirst {
				first, second = second, first
			}
			pick := func(r int) Op {
				if r == odd {
					return c.odd
				}
				return good(r)
			}
			errs := all(pick, first)
			errs2 := all(pick, second)
			for _, r := range second {
				errs[r] = errs2[r]
			}
			start := time.Now()
			drain(t, ranks, 15*time.Second) // the first ranks' kernels were aborted, not timed out
			for _, r := range first {
				require.NoError(t, errs[r], "rank %d posted before the refusal", r)
				errs[r] = post(r, good(r)) // the abort surfaces at the next op
			}
			for r, err := range errs {
				require.Error(t, err, "rank %d", r)
				msg := err.Error()
				require.Contains(t, msg, "arguments differ", "rank %d", r)
				require.Contains(t, msg, c.oddSays, "rank %d", r)
				require.Contains(t, msg, c.othersSay, "rank %d", r)
				// and the group stays failed
				require.Error(t, post(r, good(r)), "rank %d after the mismatch", r)
			}
			require.Less(t, time.Since(start), 30*time.Second)
		})
	}
}
