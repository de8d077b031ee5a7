package gobackend

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// lostWithin is how soon every survivor must have raised and drained after
// a peer was lost (the Python job's promise: 10 s after kill -9).
const lostWithin = 10 * time.Second

// TestCUDARankLostMidOp: rank 2 of 3 "dies" (its peers' meshes report its
// process exited, as its pidfd would) while rank 0 and 1 have a CUDA
// all_reduce spinning for its lines, rank 0 a recv from it pending and
// rank 1 a send to it waiting for free slots. The group's timeout is a
// minute: within lostWithin every survivor's watchdog names the lost rank,
// its pid and the ops, its kernels exit through the abort words (the
// streams drain, the device error is the abort), every later op, CUDA or
// host, fails at once with that error, and destroy returns.
func TestCUDARankLostMidOp(t *testing.T) {
	if inP2PFakeCUDA(t) {
		return
	}
	const world, dead = 3, 2
	ranks, eps, coll := lostGroup(t, world)
	allReduce := lostAllReduce
	p2p := func(r int, k ops.Kind, peer, n int) error { return lostP2P(t, ranks, eps, r, k, peer, n) }
	// The warm-up: the team, and the channels 0-2 and 1-2.
	require.Equal(t, make([]error, world), postCUDAAll(eps, func(r int) int { return r }, coll, allReduce))
	require.NoError(t, p2p(2, ops.Send, 0, 8))
	require.NoError(t, p2p(0, ops.Recv, 2, 8))
	require.NoError(t, p2p(1, ops.Send, 2, 8))
	require.NoError(t, p2p(2, ops.Recv, 1, 8))
	for _, rk := range ranks {
		rk.sync(t)
	}

	// Rank 2 takes no part in what follows; the survivors' kernels spin.
	survivors := eps[:dead]
	errs := postCUDAAll(survivors, func(r int) int { return r }, coll, allReduce)
	require.Equal(t, []error{nil, nil}, errs)
	require.NoError(t, p2p(0, ops.Recv, dead, 8))
	require.NoError(t, p2p(1, ops.Send, dead, 16<<10)) // 64 KiB: more than the outbox's 16 KiB
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	for _, ep := range survivors {
		ep.mesh.MarkExited(dead)
	}
	drain(t, simRanksOf(ranks[:dead]), lostWithin)
	pid := fmt.Sprintf("rank %d (pid %d) exited without destroying the group", dead, os.Getpid())
	want := [][]string{
		{pid, "its latest CUDA collective: all_reduce (seq 2)", "recv #2 from rank 2"},
		{pid, "its latest CUDA collective: all_reduce (seq 2)", "send #2 to rank 2"},
	}
	for r, ep := range survivors {
		err := ep.DeviceError()
		require.Equal(t, status.Peer, status.CodeOf(err), "rank %d: %v", r, err)
		for _, w := range want[r] {
			require.ErrorContains(t, err, w, "rank %d", r)
		}
		require.EqualValues(t, cuda.ErrPeerLost, ep.StatsMap()["gpu_device_error"], "rank %d: its kernel gave up on the abort", r)
	}
	require.Less(t, time.Since(start), lostWithin, "the survivors noticed and drained")

	// Every later op fails at once with that error: CUDA collectives,
	// sends and receives, host ops.
	for r, ep := range survivors {
		_, err := ep.PostCUDA(allReduce(r), r, coll(r), false)
		require.Equal(t, status.Peer, status.CodeOf(err), "rank %d: %v", r, err)
		require.ErrorContains(t, err, pid)
		require.ErrorContains(t, p2p(r, ops.Send, 1-r, 8), pid, "rank %d", r)
		host := []float32{1}
		require.ErrorContains(t, ep.Run(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 1, In: addr(host), Out: addr(host)}), pid)
	}
	require.Less(t, time.Since(start), lostWithin, "the later ops failed at once")

	// Teardown neither waits for the lost rank nor for the kernels.
	destroyAtOnce(t, survivors)
	require.Less(t, time.Since(start), lostWithin, "destroy returned")
	for r := range survivors { // the dead rank writes nothing into the survivors' channels
		eps[dead].mesh.MarkExited(r)
	}
}

// destroyAtOnce destroys the endpoints at once, each on a goroutine of its
// own, and requires that each returned no error.
func destroyAtOnce(t *testing.T, eps []*Endpoint) {
	var wg sync.WaitGroup
	for _, ep := range eps {
		wg.Add(1)
		go func() { defer wg.Done(); require.NoError(t, ep.Destroy()) }()
	}
	wg.Wait()
}

// lostAllReduce is an LL all_reduce of rank r: each rank's kernel waits for
// every peer's lines.
func lostAllReduce(r int) *Op {
	buf := make([]float32, 1024)
	return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: len(buf), In: addr(buf), Out: addr(buf)}
}

// lostP2P posts rank r's CUDA send or recv (k) of n floats with peer on the
// stream the pair's direction has.
func lostP2P(t *testing.T, ranks []*p2pRank, eps []*Endpoint, r int, k ops.Kind, peer, n int) error {
	buf := make([]float32, n)
	op := &Op{Kind: k, DType: dtype.Float32, Peer: peer, Count: n, In: addr(buf)}
	if k == ops.Recv {
		op.In, op.Out = 0, op.In
	}
	_, err := eps[r].PostCUDA(op, r, uintptr(ranks[r].stream(t, peer, k == ops.Recv)), false)
	return err
}

// TestCUDAAbortEndsKernels: rank 0 of 2 has a CUDA all_reduce spinning for
// rank 1's lines and a recv from it pending, rank 1 alive but elsewhere
// (what a group across hosts sees when a rank of another host failed and
// its host peer left the op). AbortCUDA ends them at once: the streams
// drain, the device error gives the reason, every later op fails with it
// and destroy returns, all well within the group's minute; rank 1, which
// was not aborted, still tears down.
func TestCUDAAbortEndsKernels(t *testing.T) {
	if inP2PFakeCUDA(t) {
		return
	}
	ranks, eps, coll := lostGroup(t, 2)
	require.Equal(t, []error{nil, nil}, postCUDAAll(eps, func(r int) int { return r }, coll, lostAllReduce))
	require.NoError(t, lostP2P(t, ranks, eps, 1, ops.Send, 0, 8))
	require.NoError(t, lostP2P(t, ranks, eps, 0, ops.Recv, 1, 8))
	for _, rk := range ranks {
		rk.sync(t)
	}

	require.Equal(t, []error{nil}, postCUDAAll(eps[:1], func(r int) int { return r }, coll, lostAllReduce))
	require.NoError(t, lostP2P(t, ranks, eps, 0, ops.Recv, 1, 8))
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	require.NoError(t, eps[0].AbortCUDA("a failure elsewhere"))
	drain(t, simRanksOf(ranks[:1]), lostWithin)
	err := eps[0].DeviceError()
	require.Equal(t, status.Peer, status.CodeOf(err), "%v", err)
	require.ErrorContains(t, err, "rank 0 aborted its CUDA work on the group: a failure elsewhere")
	require.EqualValues(t, cuda.ErrPeerLost, eps[0].StatsMap()["gpu_device_error"], "the kernel gave up on the abort")

	_, err = eps[0].PostCUDA(lostAllReduce(0), 0, coll(0), false)
	require.ErrorContains(t, err, "a failure elsewhere")
	require.ErrorContains(t, lostP2P(t, ranks, eps, 0, ops.Send, 1, 8), "a failure elsewhere")
	host := []float32{1}
	require.ErrorContains(t, eps[0].Run(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 1, In: addr(host), Out: addr(host)}),
		"a failure elsewhere")
	destroyAtOnce(t, eps)
	require.Less(t, time.Since(start), lostWithin, "aborted, drained, failed and destroyed")
}

// A peer that exits after destroying the group is no failure: the
// survivors' watchdogs do not fire, and what does not need it goes on
// (host messages between the two).
func TestCUDAPeerThatLeftIsNotLost(t *testing.T) {
	if inP2PFakeCUDA(t) {
		return
	}
	const world, left = 3, 2
	ranks, eps, coll := lostGroup(t, world)
	require.Equal(t, make([]error, world), postCUDAAll(eps, func(r int) int { return r }, coll, func(int) *Op { return &Op{Kind: ops.Barrier} }))
	for _, rk := range ranks {
		rk.sync(t)
	}
	require.NoError(t, eps[left].Destroy())
	for _, ep := range eps[:left] {
		ep.mesh.MarkExited(left)
	}
	time.Sleep(4 * eps[0].cfg.Watchdog)
	for r, ep := range eps[:left] {
		require.NoError(t, ep.DeviceError(), "rank %d", r)
	}
	a, b := []float32{7}, []float32{0}
	require.Equal(t, []error{nil, nil}, postAll(t, eps[:left], func(r int) *Op {
		if r == 0 {
			return &Op{Kind: ops.Send, DType: dtype.Float32, Peer: 1, Count: 1, In: addr(a)}
		}
		return &Op{Kind: ops.Recv, DType: dtype.Float32, Peer: 0, Count: 1, Out: addr(b)}
	}))
	require.Equal(t, a, b)
}

// lostGroup is a group of world simulated ranks on fake devices 0, 1, ...
// whose timeout (a minute) no test here waits out: its ranks, their
// endpoints, and each rank's stream for collectives.
func lostGroup(t *testing.T, world int) ([]*p2pRank, []*Endpoint, func(r int) uintptr) {
	devices := make([]int, world)
	for r := range devices {
		devices[r] = r
	}
	ranks := p2pGroup(t, devices, time.Minute)
	eps := make([]*Endpoint, world)
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	return ranks, eps, func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) }
}

// simRanksOf is ranks as drain takes them: each rank's device and streams.
func simRanksOf(ranks []*p2pRank) []*simRank {
	out := make([]*simRank, len(ranks))
	for i, rk := range ranks {
		s := &simRank{g: rk.g}
		for _, st := range rk.streams {
			s.streams = append(s.streams, st)
		}
		out[i] = s
	}
	return out
}
