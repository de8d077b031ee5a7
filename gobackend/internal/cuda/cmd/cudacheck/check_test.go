package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// TestAgainstFakeDriver runs the whole check, in -quick mode, against
// testdata/fakecuda.cpp: a libcuda stand-in with two host-memory "GPUs"
// whose launches run the real kernel sources compiled for the host. It
// proves the check program and the Go/C launch path (parameter blobs,
// contexts, streams, VMM, memops, cuGetProcAddress) before the one run on
// real hardware. Needs g++ and NVRTC (the kernels are still compiled, to
// check the cache and the CUBIN the fake inspects).
func TestAgainstFakeDriver(t *testing.T) {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++")
	}
	if _, err := cuda.LoadNVRTC(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	lib := filepath.Join(t.TempDir(), "libfakecuda.so")
	out, err := exec.Command(cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-pthread", "-Wall",
		"-Wno-unknown-pragmas", "-include", "../../../../../kernels/testdata/emu.h",
		"-I", "../../../../../kernels", "-I", "../..", "-o", lib, "testdata/fakecuda.cpp").CombinedOutput()
	require.NoError(t, err, "%s", out)

	t.Setenv("GOSYM_LIBCUDA", lib)
	t.Setenv("GOSYM_KERNEL_CACHE", t.TempDir())
	for _, kv := range safeEnv {
		t.Setenv(kv[0], kv[1])
	}
	t.Setenv("GOSYM_NVLS", "1") // the safety variables must win over an opt-in
	code := run(true)
	for _, c := range rep.Cases {
		if !c.Pass {
			t.Errorf("%s: %s", c.Name, c.Detail)
		}
	}
	require.Equal(t, 0, code, rep.Error)
	require.Contains(t, rep.MulticastGate, "allowed=false")
	require.Greater(t, len(rep.Cases), 60)
}

func TestRefusesUnsafeEnvironment(t *testing.T) {
	for _, kv := range safeEnv {
		t.Run(kv[0], func(t *testing.T) {
			for _, o := range safeEnv {
				t.Setenv(o[0], o[1])
			}
			os.Unsetenv(kv[0])
			require.Equal(t, 2, run(true))
			t.Setenv(kv[0], "")
			require.Equal(t, 2, run(true))
		})
	}
}
