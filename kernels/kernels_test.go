package kernels

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSources(t *testing.T) {
	require.Equal(t, []string{"allreduce.cu", "copy.cu", "nvls.cu", "p2p.cu"}, Sources())
}

// Every source expands to one program: headers pasted in once each, no
// #include left for NVRTC (which has no include path), no system header.
func TestSourceIsSelfContained(t *testing.T) {
	for _, name := range Sources() {
		src, err := Source(name)
		require.NoError(t, err)
		for _, line := range strings.Split(src, "\n") {
			require.False(t, strings.HasPrefix(strings.TrimSpace(line), "#include"), "%s: %s", name, line)
		}
		require.Equal(t, 1, strings.Count(src, "#define GOSYM_COMMON_CUH"), name)
		require.Equal(t, 1, strings.Count(src, "#define GOSYM_PARAMS_CUH"), name)
		require.Contains(t, src, "struct gs_ar_params", name)
		require.True(t, strings.HasPrefix(src, `#line 1 "`+name+`"`), name)
	}
}

// Every kernel starts with gs_kernel_begin(): the engine may launch any of
// them as a programmatic dependent of the kernel before it on the stream,
// and one that touched memory before the wait would race that kernel.
func TestEveryKernelBeginsWithTheDependencyWait(t *testing.T) {
	kernel := regexp.MustCompile(`__global__[^{;]*\{`)
	n := 0
	for _, name := range Sources() {
		text, err := FS.ReadFile(name)
		require.NoError(t, err)
		src := string(text)
		for _, at := range kernel.FindAllStringIndex(src, -1) {
			body := strings.TrimLeft(src[at[1]:], " \t\\\n")
			line := strings.Count(src[:at[0]], "\n") + 1
			require.True(t, strings.HasPrefix(body, "gs_kernel_begin();"), "%s:%d: a kernel whose first statement is not gs_kernel_begin()", name, line)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 11, "the kernels found") // 9 plain ones and 2 macros
}

func TestSourceErrors(t *testing.T) {
	_, err := Source("missing.cu")
	require.ErrorContains(t, err, "missing.cu")
}

func TestLocalInclude(t *testing.T) {
	for line, want := range map[string]string{
		`#include "common.cuh"`:        "common.cuh",
		`  #  include   "a.cuh"  // c`: "a.cuh",
		`#include <cuda_runtime.h>`:    "",
		`// #include "x.cuh"`:          "",
		`#include "unterminated`:       "",
		`#define X 1`:                  "",
	} {
		got, ok := localInclude(line)
		require.Equal(t, want != "", ok, line)
		require.Equal(t, want, got, line)
	}
}

// TestHostEmulation compiles allreduce.cu and copy.cu as host C++ with the
// shim of testdata/emu.h (one OS thread per rank, real atomics in the
// barrier) and runs testdata/emu_main.cpp: several hundred all-reduce,
// copy and barrier cases checked bit for bit, plus the timeout and
// bad-launch reports. It covers the index arithmetic, alignment handling and
// barrier protocol without a GPU; the device check covers the rest.
func TestHostEmulation(t *testing.T) { runEmulation(t, "testdata/emu_main.cpp") }

// TestHostEmulationP2P runs p2p.cu the same way (testdata/emu_p2p.cpp), with
// the threads of a block as OS threads and a real __syncthreads: messages
// of every size and alignment, many rounds that wrap the slots, streams of
// messages both ways at once from counters about to wrap, size and tag
// mismatches drained in step, timeouts and bad launches.
func TestHostEmulationP2P(t *testing.T) { runEmulation(t, "testdata/emu_p2p.cpp") }

// TestHostEmulationA2AV runs gs_a2av of p2p.cu (testdata/emu_a2av.cpp) with
// every block of every rank's launch at once, since their blocks wait on
// each other across ranks: all_to_alls over 1 to 4 ranks with empty, odd,
// multi-round and skewed pieces at every alignment, several back to back
// on the same pads from counters about to wrap, pieces whose two sizes
// disagree (between ranks and on one rank) drained in step, an absent
// rank's timeout and bad launches.
func TestHostEmulationA2AV(t *testing.T) { runEmulation(t, "testdata/emu_a2av.cpp") }

// TestHostEmulationARPush runs gs_arpush of allreduce.cu
// (testdata/emu_arpush.cpp) with every block of every rank at once and the
// threads of a block as OS threads (a rank's fold waits for every thread of
// its peers' blocks to have pushed): bit for bit against gs_twoshot on the
// same inputs at worlds 1 to 8, every phase, slots from one vector (many
// rounds) to the whole staging, ops back to back on one group's pads, and a
// bad slot refused.
func TestHostEmulationARPush(t *testing.T) { runEmulation(t, "testdata/emu_arpush.cpp") }

// TestHostEmulationSteps runs gs_copy_steps of copy.cu
// (testdata/emu_steps.cpp): launches that start before their steps exist,
// released by a host thread's plain stores, as a deferred op's worker will:
// all_gathers direct and staged over 1 to 4 ranks, back to back with the
// word wrapping, and a word never written, a count above the maximum and an
// abort on the pad each ending the launch with its error and nothing written.
func TestHostEmulationSteps(t *testing.T) { runEmulation(t, "testdata/emu_steps.cpp") }

// runEmulation builds program against emu.h (with the address and
// undefined-behaviour sanitizers where g++ has them) and runs it.
func runEmulation(t *testing.T, program string) {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++")
	}
	bin := filepath.Join(t.TempDir(), "emu")
	args := []string{"-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
		"-Wno-unknown-pragmas", "-include", "testdata/emu.h", "-I", ".", "-o", bin, program}
	sanitize := []string{"-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"}
	out, err := exec.Command(cxx, append(sanitize, args...)...).CombinedOutput()
	if err != nil && strings.Contains(string(out), "asan") {
		t.Logf("building without sanitizers: %s", out)
		out, err = exec.Command(cxx, args...).CombinedOutput()
	}
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `(?m)^\d+ passed, 0 failed$`, string(out))
	t.Logf("%s", strings.TrimSpace(string(out)))
}
