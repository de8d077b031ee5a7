package gobackend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// postCUDAAll posts one CUDA op per rank concurrently (each PostCUDA runs
// its op before it returns) and returns every rank's error.
func postCUDAAll(eps []*Endpoint, device func(r int) int, stream func(r int) uintptr, mk func(r int) *Op) []error {
	return postCUDAAllCapturing(eps, false, device, stream, mk)
}

// postCUDAAllCapturing is postCUDAAll with every rank saying whether its
// stream is being captured into a CUDA graph.
func postCUDAAllCapturing(eps []*Endpoint, capturing bool, device func(r int) int, stream func(r int) uintptr,
	mk func(r int) *Op) []error {
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for r, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = ep.PostCUDA(mk(r), device(r), stream(r), capturing)
		}()
	}
	wg.Wait()
	return errs
}

// cudaDevices is the number of usable CUDA devices, 0 without CUDA.
func cudaDevices() int {
	d, err := cuda.Load()
	if err != nil {
		return 0
	}
	n, err := d.DeviceCount()
	if err != nil {
		return 0
	}
	return n
}

func TestPostCUDARefusesOtherOpsLocally(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 8)
	for _, op := range []*Op{
		// NCCL reduces no int16, and has no bitwise ops.
		{Kind: ops.ReduceScatter, DType: dtype.Int16, Count: 4, Out: addr(buf), InPieces: []Piece{{Addr: addr(buf), Count: 4}, {Addr: addr(buf[4:]), Count: 4}}},
		{Kind: ops.AllReduce, DType: dtype.Int16, Count: 4, In: addr(buf), Out: addr(buf)},
		{Kind: ops.AllReduce, DType: dtype.Int8, RedOp: dtype.BAnd, Count: 4, In: addr(buf), Out: addr(buf)},
		{Kind: ops.AllReduce, DType: dtype.Int32, RedOp: dtype.Avg, Count: 4, In: addr(buf), Out: addr(buf)},
		{Kind: ops.AllReduce, DType: dtype.Bool, RedOp: dtype.Avg, Count: 4, In: addr(buf), Out: addr(buf)},
	} {
		_, err := eps[0].PostCUDA(op, 0, 0, false)
		require.Error(t, err, "%s %s", op.Kind, op.DType)
		require.Equal(t, status.NotSupported, status.CodeOf(err), "%v", err)
	}
	// Nothing reached the peer: the group still runs host collectives.
	errs := postAll(t, eps, func(r int) *Op {
		return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 4, In: addr(buf), Out: addr(buf)}
	})
	require.Equal(t, []error{nil, nil}, errs)
}

// Without CUDA every rank's setup fails locally; they still agree, and all
// of them report NotSupported, for this op and every later CUDA op, while
// host collectives keep working. On a GPU machine the test is skipped.
func TestCUDASetupFailureIsAgreedAndSticky(t *testing.T) {
	if cudaDevices() > 0 {
		t.Skip("CUDA is available here; this test covers machines without it")
	}
	eps := group(t, 2, 10*time.Second)
	bufs := [][]float32{{1, 2, 3}, {10, 20, 30}}
	arOp := func(r int) *Op {
		return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 3, In: addr(bufs[r]), Out: addr(bufs[r])}
	}
	dev := func(int) int { return 0 }
	str := func(int) uintptr { return 0 }
	for try := 0; try < 2; try++ {
		for r, err := range postCUDAAll(eps, dev, str, arOp) {
			require.Error(t, err, "rank %d", r)
			require.Equal(t, status.NotSupported, status.CodeOf(err), "rank %d: %v", r, err)
			require.ErrorContains(t, err, "CUDA data plane is not available")
		}
	}
	for r, err := range postCUDAAll(eps, dev, str, func(int) *Op { return &Op{Kind: ops.Barrier} }) {
		require.Equal(t, status.NotSupported, status.CodeOf(err), "rank %d: %v", r, err)
	}
	require.Equal(t, []error{nil, nil}, postAll(t, eps, arOp))
	require.Equal(t, []float32{11, 22, 33}, bufs[0])
	require.EqualValues(t, 0, eps[0].StatsMap()["gpu_ops"])
	require.EqualValues(t, -1, eps[0].StatsMap()["gpu_device"])
}

// On a machine with CUDA: two ranks of one process (on two devices when
// there are two) all-reduce device buffers through the CUDA data plane.
func TestCUDAAllReduce(t *testing.T) {
	ndev := cudaDevices()
	if ndev == 0 {
		t.Skip("no CUDA device here")
	}
	d, err := cuda.Load()
	require.NoError(t, err)
	const world = 2
	eps := group(t, world, 30*time.Second)
	type rankBufs struct {
		ctx cuda.Context
		dev cuda.Device
		buf uintptr
		s   cuda.Stream
	}
	n := 4<<20 + 3
	rb := make([]rankBufs, world)
	for r := range rb {
		dev, err := d.Device(r % ndev)
		require.NoError(t, err)
		ctx, err := d.RetainPrimaryContext(dev)
		require.NoError(t, err)
		t.Cleanup(func() { d.ReleasePrimaryContext(dev) })
		buf, err := d.MemAlloc(ctx, uintptr(4*n))
		require.NoError(t, err)
		t.Cleanup(func() { d.MemFree(ctx, buf) })
		s, err := d.StreamCreate(ctx, cuda.StreamNonBlocking)
		require.NoError(t, err)
		t.Cleanup(func() { d.StreamDestroy(ctx, s) })
		rb[r] = rankBufs{ctx, dev, buf, s}
	}
	for _, count := range []int{1, 3, 1025, n} {
		for _, op := range []dtype.RedOp{dtype.Sum, dtype.Avg, dtype.Max} {
			t.Run(fmt.Sprintf("%s/%d", op, count), func(t *testing.T) {
				host := make([][]byte, world)
				for r := range host {
					host[r] = make([]byte, 4*count)
					for i := 0; i < count; i++ {
						binary.LittleEndian.PutUint32(host[r][4*i:], math.Float32bits(float32(i%97+r)))
					}
					require.NoError(t, d.MemcpyHtoD(rb[r].ctx, rb[r].buf, host[r]))
				}
				errs := postCUDAAll(eps, func(r int) int { return r % ndev }, func(r int) uintptr { return uintptr(rb[r].s) },
					func(r int) *Op {
						return &Op{Kind: ops.AllReduce, DType: dtype.Float32, RedOp: op, Count: count, In: rb[r].buf, Out: rb[r].buf}
					})
				require.Equal(t, []error{nil, nil}, errs)
				for r := range rb {
					require.NoError(t, d.StreamSynchronize(rb[r].ctx, rb[r].s))
					got := make([]byte, 4*count)
					require.NoError(t, d.MemcpyDtoH(rb[r].ctx, got, rb[r].buf))
					for i := 0; i < count; i++ {
						a, b := float32(i%97), float32(i%97+1)
						want := map[dtype.RedOp]float32{dtype.Sum: a + b, dtype.Avg: (a + b) / 2, dtype.Max: b}[op]
						g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:]))
						if g != want {
							require.Equal(t, want, g, "rank %d element %d", r, i)
						}
					}
				}
			})
		}
	}
	errs := postCUDAAll(eps, func(r int) int { return r % ndev }, func(r int) uintptr { return uintptr(rb[r].s) },
		func(int) *Op { return &Op{Kind: ops.Barrier} })
	require.Equal(t, []error{nil, nil}, errs)
	// A CUDA op on another device than the group's is refused.
	if ndev > 1 {
		_, err := eps[0].PostCUDA(&Op{Kind: ops.Barrier}, 1, 0, false)
		require.Equal(t, status.InvalidArg, status.CodeOf(err), "%v", err)
		require.False(t, errors.Is(err, cuda.ErrNoCUDA))
	}
}
