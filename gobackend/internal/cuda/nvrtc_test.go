package cuda

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/kernels"
)

// loadNVRTC opens NVRTC for a test or skips it. CI finds the library through
// GOSYM_NVRTC (the torch venv ships one in nvidia/cu13/lib).
func loadNVRTC(t *testing.T) *NVRTC {
	t.Helper()
	nv, err := LoadNVRTC()
	skipIfNoCUDA(t, err)
	return nv
}

func TestCompileEveryKernelSource(t *testing.T) {
	nv := loadNVRTC(t)
	c := &Compiler{NV: nv, Dir: t.TempDir()}
	for _, src := range kernels.Sources() {
		t.Run(src, func(t *testing.T) {
			text, err := KernelSource(src)
			require.NoError(t, err)
			img, err := c.Compile(text, src, 90)
			require.NoError(t, err)
			require.Greater(t, len(img), 1000)
			again, err := c.Compile(text, src, 90)
			require.NoError(t, err)
			require.Equal(t, img, again)
		})
	}
	n := int64(len(kernels.Sources()))
	require.Equal(t, CacheStats{Hits: n, Misses: n}, c.Stats())
}

// TestKernelEntriesMatchTable compiles to PTX and checks that the kernels
// defined are exactly those of the Go table, each taking the parameters the
// table says, byte for byte.
func TestKernelEntriesMatchTable(t *testing.T) {
	nv := loadNVRTC(t)
	entry := regexp.MustCompile(`\.entry (\w+)\(\s*((?:\.param[^\n]*\n?\s*)*)\)`)
	param := regexp.MustCompile(`\.param \.align (\d+) \.b8 \w+\[(\d+)\]`)
	for _, src := range kernels.Sources() {
		t.Run(src, func(t *testing.T) {
			text, err := KernelSource(src)
			require.NoError(t, err)
			ptx, err := nv.compileFor(text, src, 90, "-arch=compute_90", true)
			require.NoError(t, err)
			found := map[string][]string{}
			for _, m := range entry.FindAllStringSubmatch(string(ptx), -1) {
				var sizes []string
				for _, p := range param.FindAllStringSubmatch(m[2], -1) {
					sizes = append(sizes, p[1]+"/"+p[2])
				}
				found[m[1]] = sizes
			}
			want := map[string][]string{}
			for _, k := range KernelsIn(src) {
				var sizes []string
				for _, p := range k.Params {
					sizes = append(sizes, strconv.Itoa(int(p.Align))+"/"+strconv.Itoa(int(p.Size)))
				}
				want[k.Name] = sizes
			}
			require.Equal(t, want, found)
		})
	}
}

func TestCompileCacheRepairsDamage(t *testing.T) {
	nv := loadNVRTC(t)
	dir := t.TempDir()
	c := &Compiler{NV: nv, Dir: dir}
	src := `extern "C" __global__ void k(int *p) { p[threadIdx.x] = 1; }`
	img, err := c.Compile(src, "k.cu", 90)
	require.NoError(t, err)
	file := filepath.Join(dir, c.Key(src, "k.cu", 90)+".bin")
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	for _, damage := range [][]byte{
		data[:len(data)/2],              // truncated
		append([]byte("junk"), data...), // bad magic
		func() []byte { b := append([]byte{}, data...); b[len(b)-1] ^= 0xff; return b }(), // bad sum
	} {
		require.NoError(t, os.WriteFile(file, damage, 0o644))
		got, err := c.Compile(src, "k.cu", 90)
		require.NoError(t, err)
		require.Equal(t, img, got)
		fixed, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Equal(t, data, fixed)
	}
	require.Equal(t, CacheStats{Hits: 0, Misses: 4, Corrupt: 3}, c.Stats())
	left, err := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	require.NoError(t, err)
	require.Empty(t, left, "temporary files left behind")
}

func TestCompileKeyCoversInputs(t *testing.T) {
	c := &Compiler{NV: &NVRTC{major: 13, minor: 0}}
	base := c.Key("src", "a.cu", 90)
	require.NotEqual(t, base, c.Key("src2", "a.cu", 90))
	require.NotEqual(t, base, c.Key("src", "b.cu", 90))
	require.NotEqual(t, base, c.Key("src", "a.cu", 80))
	other := &Compiler{NV: &NVRTC{major: 13, minor: 1}}
	require.NotEqual(t, base, other.Key("src", "a.cu", 90))
	require.Equal(t, base, c.Key("src", "a.cu", 90))
}

func TestCompileErrorCarriesLog(t *testing.T) {
	nv := loadNVRTC(t)
	c := &Compiler{NV: nv}
	_, err := c.Compile(`extern "C" __global__ void k() { undefined_thing(); }`, "bad.cu", 90)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Log, "undefined_thing")
	_, err = c.Compile(`#include <cuda_runtime.h>`, "sys.cu", 90)
	require.ErrorAs(t, err, &ce)
}

func TestTargetSelection(t *testing.T) {
	nv := &NVRTC{major: 13, archs: []int{75, 80, 86, 89, 90, 100, 120}}
	for _, c := range []struct {
		arch int
		opt  string
		ptx  bool
		ok   bool
	}{
		{90, "-arch=sm_90", false, true},
		{87, "-arch=compute_86", true, true}, // newer than some, not supported itself
		{130, "-arch=compute_120", true, true},
		{70, "", false, false},
	} {
		opt, ptx, err := nv.target(c.arch)
		if !c.ok {
			require.ErrorIs(t, err, ErrNotSupported)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.opt, opt)
		require.Equal(t, c.ptx, ptx)
	}
}

func TestNVRTCCandidates(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	only := nvrtcCandidates(env(map[string]string{"GOSYM_NVRTC": "/x/libnvrtc.so.13", "CUDA_HOME": "/c"}))
	require.Equal(t, []libCandidate{{path: "/x/libnvrtc.so.13"}}, only)
	all := nvrtcCandidates(env(map[string]string{"CUDA_HOME": "/c"}))
	require.Equal(t, libCandidate{path: "libnvrtc.so.13", noload: true}, all[0])
	require.Contains(t, all, libCandidate{path: "/c/lib64/libnvrtc.so.13"})
	require.Contains(t, all, libCandidate{path: "/usr/local/cuda/lib64/libnvrtc.so.12"})
}

func TestNoNVRTCIsErrNoCUDA(t *testing.T) {
	_, err := openNVRTC([]libCandidate{{path: "/nonexistent/libnvrtc.so.13"}})
	require.ErrorIs(t, err, ErrNoCUDA)
	_, err = openNVRTC([]libCandidate{{path: "libc.so.6"}})
	var se *SymbolError
	require.ErrorAs(t, err, &se)
	require.NotErrorIs(t, err, ErrNoCUDA)
}
