// Package cudatest serves tests that need a CUDA driver on machines with
// none: it builds cmd/cudacheck/testdata/fakecuda.cpp, a libcuda stand-in
// with four host-memory "GPUs" whose launches run the real kernel sources
// compiled for the host (kernels/testdata/emu.h).
package cudatest

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
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
	cudaDir := filepath.Dir(filepath.Dir(here)) // gobackend/internal/cuda
	kernels := filepath.Join(cudaDir, "..", "..", "..", "kernels")
	lib := filepath.Join(t.TempDir(), "libfakecuda.so")
	out, err := exec.Command(cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-pthread", "-Wall",
		"-Wno-unknown-pragmas", "-include", filepath.Join(kernels, "testdata", "emu.h"), "-I", kernels,
		"-I", cudaDir, "-o", lib, filepath.Join(cudaDir, "cmd", "cudacheck", "testdata", "fakecuda.cpp")).CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake libcuda: %v\n%s", err, out)
	}
	return lib
}
