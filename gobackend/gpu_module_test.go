package gobackend

import (
	"os"
	"os/exec"
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
	if os.Getenv("GOSYM_TEST_FAKE_CUDA") == "" {
		if _, err := cuda.LoadNVRTC(); err != nil {
			t.Skipf("no NVRTC: %v", err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestModuleLooksUpEveryKernelAtLoad$", "-test.v")
		cmd.Env = append(os.Environ(), "GOSYM_TEST_FAKE_CUDA=1", "GOSYM_LIBCUDA="+cudatest.FakeLibrary(t),
			"GOSYM_KERNEL_CACHE="+t.TempDir())
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestModuleLooksUpEveryKernelAtLoad")
		return
	}
	g, err := openGPU(0)
	require.NoError(t, err)
	for _, src := range []string{"copy.cu", "p2p.cu", "allreduce.cu"} {
		m, err := g.module(src)
		require.NoError(t, err, src)
		ks := cuda.KernelsIn(src)
		require.NotEmpty(t, ks)
		require.Len(t, m.fns, len(ks), "%s: every kernel looked up at load", src)
		for _, k := range ks {
			f, err := g.function(k)
			require.NoError(t, err)
			require.Same(t, m.fns[k.Name], f, k.Name)
		}
	}
	_, err = g.function(&cuda.Kernel{Name: "gs_nothing", Source: "copy.cu"})
	require.EqualError(t, err, "gosym: kernel gs_nothing is not one of copy.cu's")
}
