package gpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/cuda/cudatest"
)

// A module looks up every kernel of its source when it loads (under lazy
// loading that is what puts them on the device), so that no launch of a
// group ever waits on a lookup. Run against the fake libcuda in a child
// process of this test binary: the driver, once loaded, stays for the
// process, and the other tests of this package run without CUDA.
func TestModuleLooksUpEveryKernelAtLoad(t *testing.T) {
	if cudatest.InFakeChild(t) {
		return
	}
	g, err := Open(0)
	require.NoError(t, err)
	for _, src := range []string{"copy.cu", "p2p.cu", "allreduce.cu"} {
		m, err := g.Module(src)
		require.NoError(t, err, src)
		ks := cuda.KernelsIn(src)
		require.NotEmpty(t, ks)
		require.Len(t, m.fns, len(ks), "%s: every kernel looked up at load", src)
		for _, k := range ks {
			f, err := g.Function(k)
			require.NoError(t, err)
			require.Same(t, m.fns[k.Name], f, k.Name)
		}
	}
	_, err = g.Function(&cuda.Kernel{Name: "gs_nothing", Source: "copy.cu"})
	require.EqualError(t, err, "gosym: kernel gs_nothing is not one of copy.cu's")
}
