package gobackend

import (
	"sync"
	"testing"
	"time"

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
