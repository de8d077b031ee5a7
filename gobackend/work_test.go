package gobackend

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// A caller that claimed the idle queue runs alone: work posted meanwhile
// waits, in order, and the worker runs it once the claim ends, with no
// waiter to help it along.
func TestQueueClaimIdleHoldsLaterWork(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	q := eps[0].coll
	require.True(t, q.claimIdle())
	require.False(t, q.claimIdle(), "a claimed queue is not idle")

	bufs := [2][]float32{{1, 2}, {10, 20}}
	works := make([]*Work, 2)
	for r, ep := range eps {
		w, err := ep.Post(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 2, In: addr(bufs[r]), Out: addr(bufs[r])})
		require.NoError(t, err)
		works[r] = w
	}
	time.Sleep(20 * time.Millisecond) // far beyond kickDelay
	done, _ := works[0].Done()
	require.False(t, done, "work ran on a queue another caller had claimed")

	q.unclaim()
	require.Eventually(t, func() bool { d, _ := works[0].Done(); return d }, 5*time.Second, time.Millisecond)
	for _, w := range works {
		require.NoError(t, w.Wait(5*time.Second))
	}
	require.Equal(t, []float32{11, 22}, bufs[0])
	require.Equal(t, []float32{11, 22}, bufs[1])

	// Idle again: a group task runs at once on the caller's thread, in
	// collective order with the ranks' other ops.
	require.False(t, eps[0].coll.running)
	ran := make([]int, 2)
	errs := make(chan error, 2)
	for r, ep := range eps {
		go func() {
			errs <- ep.runTask("probe", func(who symm.Who, deadline time.Time) error {
				ran[r]++
				return nil
			})
		}()
	}
	for range eps {
		require.NoError(t, <-errs)
	}
	require.Equal(t, []int{1, 1}, ran)
}
