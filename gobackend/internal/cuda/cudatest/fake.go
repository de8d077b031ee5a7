// Package cudatest serves tests that need a CUDA driver on machines with
// none: it builds testdata/fakecuda.cpp, a libcuda stand-in
// with four host-memory "GPUs" whose launches run the real kernel sources
// compiled for the host (kernels/testdata/emu.h).
package cudatest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/stretchr/testify/require"
)

// FakeLibrary builds the fake libcuda into a temporary directory of t and
// returns its path, for GOSYM_LIBCUDA. It skips t where there is no g++.
func FakeLibrary(t testing.TB) string {
	t.Helper()
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++")
	}
	_, here, _, _ := runtime.Caller(0)
	testDir := filepath.Dir(here)    // gobackend/internal/cuda/cudatest
	cudaDir := filepath.Dir(testDir) // gobackend/internal/cuda
	kernels := filepath.Join(cudaDir, "..", "..", "..", "kernels")
	lib := filepath.Join(t.TempDir(), "libfakecuda.so")
	out, err := exec.Command(cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-pthread", "-Wall",
		"-Wno-unknown-pragmas", "-include", filepath.Join(kernels, "testdata", "emu.h"), "-I", kernels,
		"-I", cudaDir, "-o", lib, filepath.Join(testDir, "testdata", "fakecuda.cpp")).CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake libcuda: %v\n%s", err, out)
	}
	return lib
}

// InFakeChild runs the test named by t in a child process of this test
// binary, against the fake libcuda (kernels/testdata's host emulation of
// the real kernels): a driver, once loaded, stays for the process, and the
// other tests of this package run without CUDA. It returns true in the
// parent, which has checked the child's verdict, and false in the child,
// which goes on with the test's body.
func InFakeChild(t *testing.T) bool {
	t.Helper()
	if os.Getenv("GOSYM_TEST_FAKE_CUDA") != "" {
		return false
	}
	if _, err := cuda.LoadNVRTC(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.v"}
	if d, ok := t.Deadline(); ok { // the child times out first, so its goroutines are shown
		if left := time.Until(d) - 15*time.Second; left > 0 {
			args = append(args, "-test.timeout="+left.String())
		}
	}
	cmd := exec.Command(os.Args[0], args...)
	// The kernel cache is the user's (keyed by source, arch and NVRTC):
	// the children share it, so allreduce.cu compiles once per machine,
	// not once per child (about a minute each on a busy host).
	cmd.Env = append(os.Environ(), "GOSYM_TEST_FAKE_CUDA=1", "GOSYM_LIBCUDA="+FakeLibrary(t))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--- PASS: "+t.Name())
	return true
}
