package gobackend

import (
	"sync"
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// BenchmarkAllReduce2 is the engine's own latency for a 1 KiB all-reduce
// between two endpoints of this process (no Python, no cgo).
func BenchmarkAllReduce2(b *testing.B) {
	eps := group(b, 2, 10*time.Second)
	b.ResetTimer()
	var wg sync.WaitGroup
	for r := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]float32, 256)
			op := &Op{Kind: coll.AllReduce, DType: dtype.Float32, Count: 256, In: addr(buf), Out: addr(buf)}
			for i := 0; i < b.N; i++ {
				w, _ := eps[r].Post(op)
				w.Wait(-1)
			}
		}()
	}
	wg.Wait()
}
