package gobackend

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// BenchmarkOps2 is the engine's own latency for small collectives between
// two endpoints of this process (no Python, no cgo): post + wait of one op
// per rank and iteration.
func BenchmarkOps2(b *testing.B) {
	const n = 256 // 1 KiB of float32
	mk := map[string]func(r int, in, out []float32) *Op{
		"all_reduce": func(r int, in, out []float32) *Op {
			return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: n, In: addr(in), Out: addr(in)}
		},
		"broadcast": func(r int, in, out []float32) *Op {
			return &Op{Kind: ops.Broadcast, DType: dtype.Float32, Count: n, In: addr(in), Out: addr(in)}
		},
		"all_to_all": func(r int, in, out []float32) *Op {
			ins := []Piece{{Addr: addr(in), Count: n / 2}, {Addr: addr(in[n/2:]), Count: n / 2}}
			outs := []Piece{{Addr: addr(out), Count: n / 2}, {Addr: addr(out[n/2:]), Count: n / 2}}
			return &Op{Kind: ops.AllToAll, DType: dtype.Float32, InPieces: ins, OutPieces: outs}
		},
	}
	for _, name := range []string{"all_reduce", "broadcast", "all_to_all"} {
		b.Run(name, func(b *testing.B) {
			eps := group(b, 2, 10*time.Second)
			ops := make([]*Op, len(eps))
			for r := range eps {
				ops[r] = mk[name](r, make([]float32, n), make([]float32, n))
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			for r := range eps {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < b.N; i++ {
						w, err := eps[r].Post(ops[r])
						if err == nil {
							err = w.Wait(-1)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// BenchmarkPostWait1 is the engine's cost of one small op on a group of
// one: post + wait with no peer to wait for.
func BenchmarkPostWait1(b *testing.B) {
	eps := group(b, 1, 10*time.Second)
	buf := make([]float32, 256)
	op := &Op{Kind: ops.Broadcast, DType: dtype.Float32, Count: 256, In: addr(buf), Out: addr(buf)}
	b.ReportAllocs()
	for b.Loop() {
		w, err := eps[0].Post(op)
		if err == nil {
			err = w.Wait(-1)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPostCUDA is the engine's host path of one small eager CUDA
// all_reduce (1 KiB, the LL kernel) per rank and iteration, on two ranks of
// this process over the fake libcuda: what the engine adds to the driver's
// calls (the fake's are a queue push each). Run it in the fake's process,
// its kernels skipped (the LL ops have no host round that waits for them):
// FAKECUDA_SKIP_KERNELS=1 GOSYM_TEST_FAKE_CUDA=1
// GOSYM_LIBCUDA=<cudatest.FakeLibrary> go test -run '^$' -bench PostCUDA
// ./gobackend (post-ns/op is rank 0's time in PostCUDA).
func BenchmarkPostCUDA(b *testing.B) {
	if os.Getenv("GOSYM_TEST_FAKE_CUDA") == "" {
		b.Skip("needs the fake libcuda in this process: GOSYM_TEST_FAKE_CUDA=1 GOSYM_LIBCUDA=...")
	}
	const n = 256
	ranks := p2pGroup(b, []int{0, 1}, 10*time.Second)
	type rank struct {
		buf uintptr
		s   cuda.Stream
	}
	rs := make([]rank, len(ranks))
	for r, rk := range ranks {
		d, ctx := rk.g.Driver(), rk.g.Context()
		p, err := d.MemAlloc(ctx, 4*n)
		require.NoError(b, err)
		s, err := d.StreamCreate(ctx, cuda.StreamNonBlocking)
		require.NoError(b, err)
		b.Cleanup(func() { d.StreamDestroy(ctx, s); d.MemFree(ctx, p) })
		rs[r] = rank{p, s}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	spent := make([]time.Duration, len(ranks))
	for r, rk := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: n, In: rs[r].buf, Out: rs[r].buf}
			for i := 0; i < b.N; i++ {
				if i%64 == 0 {
					if err := rk.g.Driver().StreamSynchronize(rk.g.Context(), rs[r].s); err != nil {
						b.Error(err)
						return
					}
				}
				t0 := time.Now()
				_, err := rk.ep.PostCUDA(op, rk.device, uintptr(rs[r].s), false)
				spent[r] += time.Since(t0)
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(spent[0].Nanoseconds())/float64(b.N), "post-ns/op")
}
