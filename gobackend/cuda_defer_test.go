package gobackend

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/cuda/cudatest"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// inDeferFakeCUDA is inP2PFakeCUDA with deferred ops on, every all_reduce
// of directMin bytes or more on the direct path (a host round each) and
// those of at most llMax on the LL kernel (0: none; the others stage).
func inDeferFakeCUDA(t *testing.T, directMin, llMax string) bool {
	t.Setenv("GOSYM_GPU_DIRECT_MIN", directMin)
	t.Setenv("GOSYM_GPU_LL_MAX", llMax)
	t.Setenv("GOSYM_GPU_DEFER", "1")
	return inP2PFakeCUDA(t)
}

// syncWithin synchronizes rk's streams and fails the test, saying what,
// if they are not idle within 90 s (a deferred op's flag never written; the
// emulated kernels under -race on a loaded 2-core machine take tens of seconds).
func syncWithin(t *testing.T, rk *p2pRank, r int, what string) {
	synced := make(chan struct{})
	go func() { rk.sync(t); close(synced) }()
	select {
	case <-synced:
	case <-time.After(90 * time.Second):
		t.Fatalf("%s: rank %d's stream was never released", what, r)
	}
}

// deferGroup is three simulated ranks on the fake driver's three devices
// (inDeferFakeCUDA), a float32 buffer of n elements per rank, and their group set up by one
// small all_reduce (a group's first op runs on its caller's thread).
func deferGroup(t *testing.T, n int, timeout time.Duration) ([]*p2pRank, []uintptr) {
	ranks := p2pGroup(t, []int{0, 1, 2}, timeout)
	bufs := make([]uintptr, len(ranks))
	for r, rk := range ranks {
		p, err := rk.g.Driver().MemAlloc(rk.g.Context(), uintptr(4*n))
		require.NoError(t, err)
		t.Cleanup(func() { rk.g.Driver().MemFree(rk.g.Context(), p) })
		bufs[r] = p
	}
	eps := make([]*Endpoint, len(ranks))
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	errs := postCUDAAll(eps, func(r int) int { return ranks[r].device },
		func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) },
		func(r int) *Op {
			return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 1, In: bufs[r], Out: bufs[r]}
		})
	require.Equal(t, make([]error, len(ranks)), errs)
	for _, rk := range ranks {
		rk.sync(t)
	}
	return ranks, bufs
}

// postAlone posts op on rank rk's stream from this goroutine and fails the
// test if the call does not return by itself (its peers have not posted:
// a caller that ran the op's host round would wait for them).
func postAlone(t *testing.T, rk *p2pRank, r int, op *Op) {
	done := make(chan error, 1)
	go func() {
		_, err := rk.ep.PostCUDA(op, rk.device, uintptr(rk.stream(t, r, false)), false)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err, "rank %d", r)
	case <-time.After(5 * time.Second):
		t.Fatalf("rank %d: a direct all_reduce did not return before its peers posted", r)
	}
}

// Deferred ops (gpu/defer.go): a direct all_reduce returns to its caller
// before any peer posted, two in a row queue behind each other, and every
// rank's stream holds what comes after them until they ran: the results,
// read after a stream synchronize alone, are exact.
func TestCUDADeferredOpsReturnBeforeThePeers(t *testing.T) {
	if inDeferFakeCUDA(t, "1", "0") {
		return
	}
	const n = 5003
	ranks, bufs := deferGroup(t, n, 10*time.Second)
	val := func(r, i int) float32 { return float32((i*7+r*13)%61) - 30 }
	for r, rk := range ranks {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(val(r, i)))
		}
		require.NoError(t, rk.g.Driver().MemcpyHtoD(rk.g.Context(), bufs[r], b))
	}
	// rank by rank, one goroutine: a post that waited for its peers would hang here
	for rep := range 2 {
		for r, rk := range ranks {
			postAlone(t, rk, r, &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: n - rep, In: bufs[r], Out: bufs[r]})
		}
	}
	for _, rk := range ranks {
		rk.sync(t)
	}
	for r, rk := range ranks {
		b := make([]byte, 4*n)
		require.NoError(t, rk.g.Driver().MemcpyDtoH(rk.g.Context(), b, bufs[r]))
		for i := range n {
			s := val(0, i) + val(1, i) + val(2, i) // small integers: exact in any order
			want := 3 * s                          // summed twice: the second op sums three copies of s
			if i == n-1 {
				want = s // the second op's count stops short of it
			}
			if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])); got != want {
				require.Equal(t, want, got, "rank %d element %d", r, i)
			}
		}
		st := rk.ep.StatsMap()
		require.EqualValues(t, 2, st["gpu_deferred_ops"], "%v", st)
		require.EqualValues(t, 3, st["gpu_direct_ops"], "%v", st)
		require.NoError(t, rk.ep.DeviceError())
	}
}

// A deferred op that fails after its caller returned (the ranks disagree
// on its count) still releases its caller's stream, and its error reaches
// the group's next CUDA op and DeviceError (what every CUDA Work's wait()
// asks), naming the op.
func TestCUDADeferredOpErrorReachesTheNextOp(t *testing.T) {
	if inDeferFakeCUDA(t, "1", "0") {
		return
	}
	const n = 4096
	ranks, bufs := deferGroup(t, n+1, 3*time.Second)
	for r, rk := range ranks {
		count := n
		if r == 2 {
			count = n + 1
		}
		postAlone(t, rk, r, &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: count, In: bufs[r], Out: bufs[r]})
	}
	for r, rk := range ranks {
		syncWithin(t, rk, r, "after a failed deferred op")
	}
	deadline := time.Now().Add(10 * time.Second)
	for r, rk := range ranks {
		for rk.ep.DeviceError() == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		err := rk.ep.DeviceError()
		require.Error(t, err, "rank %d", r)
		require.True(t, strings.Contains(err.Error(), "all_reduce"), "rank %d: %v", r, err)
		_, err = rk.ep.PostCUDA(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 1, In: bufs[r], Out: bufs[r]},
			rk.device, uintptr(rk.stream(t, r, false)), false)
		require.Error(t, err, "rank %d: the next op", r)
	}
}

// A deferred op runs on the queue's worker while its caller's stream waits
// for the worker's flag, so nothing the worker does may wait for the whole
// device: dropping the peers' mappings of a memh that rank 0 unmapped
// (registry.forget) waits for the group's last op instead of the context
// (Team.ipcIdle), and the op after the unmap completes with exact results.
func TestCUDADeferredOpDropsPeerMappings(t *testing.T) {
	if inDeferFakeCUDA(t, "1", "0") {
		return
	}
	const n = 4096
	ranks, bufs := deferGroup(t, n, 10*time.Second)
	memhs := make([]*Memh, len(ranks))
	for r, rk := range ranks {
		m, err := MemMap(bufs[r], 4*n, rk.device)
		require.NoError(t, err)
		memhs[r] = m
		if r > 0 {
			t.Cleanup(func() { require.NoError(t, MemUnmap(m)) })
		}
	}
	fill := func() {
		for r, rk := range ranks {
			b := make([]byte, 4*n)
			for i := range n {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r+1)))
			}
			require.NoError(t, rk.g.Driver().MemcpyHtoD(rk.g.Context(), bufs[r], b))
		}
	}
	run := func(what string) {
		fill()
		for r, rk := range ranks {
			postAlone(t, rk, r, &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: n, In: bufs[r], Out: bufs[r]})
		}
		for r, rk := range ranks {
			syncWithin(t, rk, r, what) // hangs if the worker waits for the whole device
		}
		for r, rk := range ranks {
			b := make([]byte, 4*n)
			require.NoError(t, rk.g.Driver().MemcpyDtoH(rk.g.Context(), b, bufs[r]))
			for _, i := range []int{0, n / 2, n - 1} {
				require.Equal(t, float32(1+2+3), math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])), "%s: rank %d element %d", what, r, i)
			}
			require.NoError(t, rk.ep.DeviceError(), what)
		}
	}
	run("registered")
	require.NoError(t, MemUnmap(memhs[0]))
	run("after rank 0's unmap")
	for r, rk := range ranks[1:] {
		st := rk.ep.StatsMap()
		require.EqualValues(t, 1, st["gpu_peer_map_dropped"], "rank %d: %v", r+1, st)
		require.EqualValues(t, 2, st["gpu_deferred_ops"], "rank %d: %v", r+1, st)
	}
}

// Deferred ops and ops run on the caller's thread, posted in turns on two
// streams per rank, each rank from its own goroutine with jitter (FSDP2's
// all_gather and reduce_scatter streams, with small ops between): the
// group's ops still run on each device in one order (gpu/order.go joins
// the internal stream and the callers'), and every result is exact. The
// small ops run the LL kernel, or (llMax 0) one-shot over the staging.
func TestCUDADeferredAndLLOpsInterleaveOnTwoStreams(t *testing.T) {
	if inDeferFakeCUDA(t, "8192", "1024") { // 16 KiB ops deferred (direct), 64 B ones LL at the call
		return
	}
	deferInterleave(t)
}

func TestCUDADeferredAndStagedOpsInterleaveOnTwoStreams(t *testing.T) {
	if inDeferFakeCUDA(t, "8192", "0") { // 16 KiB ops deferred (direct), 64 B ones staged at the call
		return
	}
	deferInterleave(t)
}

func deferInterleave(t *testing.T) {
	const big, small, nops = 4096, 16, 9
	count := func(i int) int {
		if i%3 == 2 {
			return small
		}
		return big
	}
	val := func(r, i int) float32 { return float32(10*r + i + 1) }
	ranks, _ := deferGroup(t, 1, 60*time.Second) // jittered posts on two streams: slow emulation, no error expected
	bufs := make([][]uintptr, len(ranks))
	for r, rk := range ranks {
		rk.stream(t, 100, false) // the two caller streams, made before the goroutines read the map
		rk.stream(t, 101, false)
		for i := range nops {
			p, err := rk.g.Driver().MemAlloc(rk.g.Context(), uintptr(4*count(i)))
			require.NoError(t, err)
			t.Cleanup(func() { rk.g.Driver().MemFree(rk.g.Context(), p) })
			b := make([]byte, 4*count(i))
			for k := range count(i) {
				binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(val(r, i)))
			}
			require.NoError(t, rk.g.Driver().MemcpyHtoD(rk.g.Context(), p, b))
			bufs[r] = append(bufs[r], p)
		}
	}
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for r, rk := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for i := range nops {
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				op := &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: count(i), In: bufs[r][i], Out: bufs[r][i]}
				if _, err := rk.ep.PostCUDA(op, rk.device, uintptr(rk.stream(t, 100+i%2, false)), false); err != nil {
					errs[r] = fmt.Errorf("op %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, make([]error, len(ranks)), errs)
	for r, rk := range ranks {
		syncWithin(t, rk, r, "two streams")
	}
	deferred := 0
	for i := range nops {
		if count(i) == big {
			deferred++
		}
	}
	for r, rk := range ranks {
		for i := range nops {
			var want float32
			for q := range ranks {
				want += val(q, i)
			}
			b := make([]byte, 4*count(i))
			require.NoError(t, rk.g.Driver().MemcpyDtoH(rk.g.Context(), b, bufs[r][i]))
			for k := range count(i) {
				if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:])); got != want {
					require.Equal(t, want, got, "rank %d op %d element %d", r, i, k)
				}
			}
		}
		st := rk.ep.StatsMap()
		require.EqualValues(t, deferred, st["gpu_deferred_ops"], "rank %d: %v", r, st)
		require.Positive(t, st["gpu_stream_joins"], "rank %d: %v", r, st)
		require.NoError(t, rk.ep.DeviceError())
	}
}

// A deferred op's event (gpu/defer.go) goes back to the pool once the
// internal stream's wait for it is enqueued, and the next deferred op may
// record it on another caller's stream before that wait ran: records of one
// event on two streams then complete in any order, and each wait must be
// for the record that was the event's latest at the call, as on a GPU. The
// fake driver once kept one "last completed record" per event, which went
// back when the earlier record completed last: the internal stream then
// waited for good for the later one (TestCUDADeferredAndLLOpsInterleaveOnTwoStreams
// hung about once in 20 runs on a loaded machine), and a wait for the
// earlier record was released by the later one.
func TestCUDADeferredEventRecordedAgainOnAnotherStream(t *testing.T) {
	if cudatest.InFakeChild(t) {
		return
	}
	g, err := gpu.Open(0)
	require.NoError(t, err)
	d, ctx := g.Driver(), g.Context()
	var a, b, c cuda.Stream
	for _, s := range []*cuda.Stream{&a, &b, &c} {
		*s, err = d.StreamCreate(ctx, cuda.StreamNonBlocking)
		require.NoError(t, err)
		st := *s
		t.Cleanup(func() { d.StreamDestroy(ctx, st) })
	}
	words, err := d.MemAlloc(ctx, 8) // a gate that holds stream a, a mark that stream c writes
	require.NoError(t, err)
	t.Cleanup(func() { d.MemFree(ctx, words) })
	gate, mark := words, words+4
	require.NoError(t, d.MemcpyHtoD(ctx, words, make([]byte, 8)))
	word := func(p uintptr) uint32 {
		b := make([]byte, 4)
		require.NoError(t, d.MemcpyDtoH(ctx, b, p))
		return binary.LittleEndian.Uint32(b)
	}
	ev, err := d.EventCreate(ctx, cuda.EventDisableTiming)
	require.NoError(t, err)
	t.Cleanup(func() { d.EventDestroy(ctx, ev) })

	// record 1 on a, behind the gate; c waits for it, then writes the mark
	require.NoError(t, d.StreamWaitValue32(ctx, a, gate, 1, cuda.WaitGEQ))
	require.NoError(t, d.EventRecord(ctx, ev, a))
	require.NoError(t, d.StreamWaitEvent(ctx, c, ev))
	require.NoError(t, d.StreamWriteValue32(ctx, c, mark, 1))
	// record 2 on b completes at once: it must not release c
	require.NoError(t, d.EventRecord(ctx, ev, b))
	require.NoError(t, d.StreamSynchronize(ctx, b))
	time.Sleep(100 * time.Millisecond)
	if m := word(mark); m != 0 { // goes on: what follows shows the other half
		t.Errorf("a wait for an event's record was released by a later record of it on another stream (mark %d)", m)
	}
	// open the gate: record 1 completes after record 2, and c goes on
	require.NoError(t, d.MemcpyHtoD(ctx, gate, []byte{1, 0, 0, 0}))
	require.NoError(t, d.StreamSynchronize(ctx, a))
	require.NoError(t, d.StreamSynchronize(ctx, c))
	require.EqualValues(t, 1, word(mark))
	// a wait enqueued now is for record 2, complete long ago
	require.NoError(t, d.StreamWaitEvent(ctx, c, ev))
	require.NoError(t, d.StreamWriteValue32(ctx, c, mark, 2))
	synced := make(chan error, 1)
	go func() { synced <- d.StreamSynchronize(ctx, c) }()
	select {
	case err := <-synced:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.NoError(t, d.EventRecord(ctx, ev, b)) // releases the stuck wait, so that cleanup returns
		t.Fatal("a wait for an event's latest record never returned: an earlier record of it completed last")
	}
	require.EqualValues(t, 2, word(mark))
	done, err := d.EventQuery(ctx, ev)
	require.NoError(t, err)
	require.True(t, done)
}
