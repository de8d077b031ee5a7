package gobackend

import (
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/stretchr/testify/require"
)

// Every op's kernels launch as programmatic dependents where GOSYM_GPU_PDL
// is on (the fake driver reports CUDA 13 and sm_90): the fake libcuda
// refuses any plain launch here, so a path that bypassed cuLaunchKernelEx
// fails, and the results are checked element by element. The LL path
// (small pieces) and the staged one (GOSYM_GPU_LL_MAX below the pieces)
// both run, at three ranks.
func TestCUDAKernelsLaunchAsDependents(t *testing.T) {
	testCUDALaunches(t, "1", "dependent")
}

// With GOSYM_GPU_PDL=0 no launch is a dependent: the fake refuses them.
func TestCUDAKernelsLaunchPlainWithPDLOff(t *testing.T) {
	testCUDALaunches(t, "0", "plain")
}

func testCUDALaunches(t *testing.T, pdl, kind string) {
	t.Setenv("GOSYM_GPU_PDL", pdl)
	t.Setenv("FAKECUDA_LAUNCHES", kind)
	t.Setenv("GOSYM_GPU_LL_MAX", "4096")
	if inP2PFakeCUDA(t) {
		return
	}
	ranks := p2pGroup(t, []int{0, 1, 2}, 5*time.Second)
	every := func(ops.Kind) bool { return true }
	for _, n := range []int{100, 3001} { // 400 B a piece: LL; 12 KB: staged
		runCUDAOpCases(t, ranks, n, every)
	}
	for r, rk := range ranks {
		require.Equal(t, pdl == "1", rk.ep.StatsMap()["gpu_dependent_launch"], "rank %d", r)
	}
}
