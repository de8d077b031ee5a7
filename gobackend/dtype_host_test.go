package gobackend

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// fp8 reductions of host memory are refused before they reach the peers
// (Gloo has none); moving fp8 and reducing it on CUDA are not.
func TestHostRefusesFloat8Reductions(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 2)
	for _, dt := range []dtype.DType{dtype.Float8E4M3, dtype.Float8E5M2} {
		for _, k := range []ops.Kind{ops.AllReduce, ops.Reduce} {
			_, err := eps[0].post(&Op{Kind: k, DType: dt, Count: 8, In: addr(buf), Out: addr(buf)}, false)
			require.Equal(t, status.NotSupported, status.CodeOf(err), "%s %s: %v", k, dt, err)
			require.ErrorContains(t, err, dt.String())
		}
	}
	bufs := [][]float32{{1, 2}, {3, 4}}
	errs := postAll(t, eps, func(r int) *Op {
		return &Op{Kind: ops.Broadcast, DType: dtype.Float8E4M3, Count: 8, Root: 1, In: addr(bufs[r]), Out: addr(bufs[r])}
	})
	require.Equal(t, []error{nil, nil}, errs)
	require.Equal(t, []float32{3, 4}, bufs[0])
}
