package cuda

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadOnThisMachine(t *testing.T) {
	d, err := Load()
	skipIfNoCUDA(t, err)
	require.GreaterOrEqual(t, d.Version(), MinDriverVersion)
	n, err := d.DeviceCount()
	require.NoError(t, err)
	require.Positive(t, n)
}

func TestOpenMissingLibraryIsErrNoCUDA(t *testing.T) {
	_, err := openDriver("/nonexistent/libcuda.so.1")
	require.ErrorIs(t, err, ErrNoCUDA)
	require.ErrorContains(t, err, "/nonexistent/libcuda.so.1")
}

// A library that loads but is not libcuda: a broken install, not "no CUDA".
func TestOpenWrongLibraryIsSymbolError(t *testing.T) {
	_, err := openDriver("libc.so.6")
	var se *SymbolError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []string{"cuInit"}, se.Missing)
	require.NotErrorIs(t, err, ErrNoCUDA)
}

func TestFakeDriverLoads(t *testing.T) {
	withFake(t, func(d *Driver) {
		require.Equal(t, 13000, d.Version())
		require.True(t, d.HasVMM())
		require.True(t, d.HasStreamMemOps())
		require.Zero(t, fakeMulticastLookups(), "the loader must not look up multicast symbols")
		require.False(t, fakeMulticastEnabled(d))
	})
}

func TestMissingRequiredSymbolFailsLoad(t *testing.T) {
	for _, name := range []string{"cuLaunchKernel", "cuMemcpyDtoDAsync", "cuIpcOpenMemHandle"} {
		t.Run(name, func(t *testing.T) {
			_, _, err := fakeDriver(name, "cuMemCreate")
			var se *SymbolError
			require.ErrorAs(t, err, &se)
			require.Equal(t, []string{name}, se.Missing) // optional ones are not reported
			require.NotErrorIs(t, err, ErrNoCUDA)
		})
	}
}

func TestMissingOptionalSymbolIsNotSupported(t *testing.T) {
	withFake(t, func(d *Driver) {
		require.False(t, d.HasVMM())
		require.True(t, d.HasStreamMemOps())
		_, err := d.MemCreate(0, 0, 2<<20, HandleTypePosixFD)
		require.ErrorIs(t, err, ErrNotSupported)
		require.ErrorIs(t, err, &DriverError{Op: "cuMemCreate", Code: codeNoSymbol})
		require.Zero(t, fakeCalls("cuMemCreate"))
		// The rest of the tier still works.
		_, err = d.MemAddressReserve(0, 2<<20, 0)
		require.NoError(t, err)
		require.EqualValues(t, 1, fakeCalls("cuMemAddressReserve"))
	}, "cuMemCreate")
	withFake(t, func(d *Driver) {
		require.False(t, d.HasStreamMemOps())
		require.ErrorIs(t, d.StreamWaitValue32(0, 0, 0x1000, 1, WaitGEQ), ErrNotSupported)
	}, "cuStreamWaitValue32")
}

func TestOldDriverIsErrNoCUDA(t *testing.T) {
	withFake(t, func(d *Driver) {
		fakeSetVersion(11080)
		err := d.finishLoad("fake")
		require.ErrorIs(t, err, ErrNoCUDA)
		require.ErrorContains(t, err, "11.8")
	})
}

func TestDriverErrorsCarryOpAndCode(t *testing.T) {
	withFake(t, func(d *Driver) {
		fakeSetResult("cuMemAlloc", 2)
		_, err := d.MemAlloc(0, 1<<20)
		require.ErrorIs(t, err, &DriverError{Code: 2})
		require.ErrorIs(t, err, &DriverError{Op: "cuMemAlloc", Code: 2})
		require.NotErrorIs(t, err, &DriverError{Op: "cuMemFree", Code: 2})
		require.EqualError(t, err, "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2)")
	})
}

func TestDriverErrorIs(t *testing.T) {
	cases := []struct {
		code    int
		noCUDA  bool
		notSupp bool
	}{
		{codeNoSymbol, false, true},
		{codeRefused, false, true},
		{resultNotSupported, false, true},
		{resultNoDevice, true, false},
		{resultStubLibrary, true, false},
		{700, false, false},
	}
	for _, c := range cases {
		t.Run(ResultName(c.code), func(t *testing.T) {
			err := fmt.Errorf("wrapped: %w", &DriverError{Op: "x", Code: c.code})
			require.Equal(t, c.noCUDA, errors.Is(err, ErrNoCUDA))
			require.Equal(t, c.notSupp, errors.Is(err, ErrNotSupported))
		})
	}
	require.Equal(t, "CUresult(12345)", ResultName(12345))
}

// Every context-taking call makes its context current and then puts back
// the caller's, because Go may run on a thread that torch also uses.
func TestContextIsRestored(t *testing.T) {
	withFake(t, func(d *Driver) {
		const torchCtx, ourCtx = Context(0x1000), Context(0x2000)
		fakeSetCurrentContext(d, torchCtx)
		before := fakeCalls("cuCtxSetCurrent")
		_, err := d.MemAlloc(ourCtx, 64)
		require.NoError(t, err)
		require.Equal(t, torchCtx, fakeCurrentContext(d))
		require.EqualValues(t, 2, fakeCalls("cuCtxSetCurrent")-before) // switch in, switch back

		before = fakeCalls("cuCtxSetCurrent")
		require.NoError(t, d.MemFree(torchCtx, 0x10)) // already current: no switch
		require.NoError(t, d.MemFree(0, 0x10))        // no context: left alone
		require.EqualValues(t, 0, fakeCalls("cuCtxSetCurrent")-before)
		require.Equal(t, torchCtx, fakeCurrentContext(d))

		fakeSetResult("cuMemAlloc", 2) // a failing call restores too
		_, err = d.MemAlloc(ourCtx, 64)
		require.Error(t, err)
		require.Equal(t, torchCtx, fakeCurrentContext(d))
	})
}

func TestLaunchChecksArguments(t *testing.T) {
	withFake(t, func(d *Driver) {
		m, err := d.LoadModule(0x3000, []byte{1, 2, 3})
		require.NoError(t, err)
		k, post, err := ReduceKernel(OneShot, 0, 0) // float32 sum
		require.NoError(t, err)
		require.EqualValues(t, PostNone, post)
		f, err := m.Function(k)
		require.NoError(t, err)
		grid, block := ReduceGrid(OneShot, 1000, 4, 2)

		require.ErrorContains(t, d.Launch(f, grid, block, 0, 0), "0 arguments, the kernel takes 1")
		require.ErrorContains(t, d.Launch(f, grid, block, 0, 0, &CopyParams{}),
			"argument 0 is gs_copy_params, the kernel takes gs_ar_params")
		require.ErrorContains(t, d.Launch(f, grid, block, 0, 0, &ARParams{}, &ARParams{}),
			"2 arguments")
		require.Zero(t, fakeCalls("cuLaunchKernel"))

		require.NoError(t, d.Launch(f, grid, block, 0, 0, &ARParams{World: 1}))
		require.EqualValues(t, 1, fakeCalls("cuLaunchKernel"))
		fakeSetResult("cuLaunchKernel", 701)
		err = d.Launch(f, grid, block, 0, 0, &ARParams{World: 1})
		require.ErrorIs(t, err, &DriverError{Code: 701})
		require.ErrorContains(t, err, k.Name)
		require.NoError(t, m.Unload())
	})
}

// A module set to dependent launches goes through cuLaunchKernelEx with
// one attribute, programmatic stream serialization on; where the driver
// lacks the function, through cuLaunchKernel. DependentLaunch says yes only
// for sm_90 and newer on CUDA 12.3 and newer with the function there.
func TestDependentLaunch(t *testing.T) {
	launch := func(d *Driver, dependent bool) {
		m, err := d.LoadModule(0x3000, []byte{1, 2, 3})
		require.NoError(t, err)
		defer m.Unload()
		m.SetDependentLaunch(dependent)
		k, _, err := ReduceKernel(LL, 0, 0)
		require.NoError(t, err)
		f, err := m.Function(k)
		require.NoError(t, err)
		grid, block := LLGrid(4096, 4)
		require.NoError(t, d.Launch(f, grid, block, 0, 0, &ARParams{World: 1}))
	}
	withFake(t, func(d *Driver) {
		fakeSetAttr(AttrComputeCapabilityMajor, 9)
		fakeSetAttr(AttrComputeCapabilityMinor, 0)
		for _, v := range []struct {
			version, major int
			want           bool
		}{{13000, 9, true}, {12030, 10, true}, {12020, 9, false}, {13000, 8, false}} {
			fakeSetVersion(v.version)
			fakeSetAttr(AttrComputeCapabilityMajor, v.major)
			d.version = v.version
			require.Equal(t, v.want, d.DependentLaunch(0), "CUDA %d, sm_%d0", v.version, v.major)
		}

		launch(d, true)
		require.EqualValues(t, 0, fakeCalls("cuLaunchKernel"))
		require.EqualValues(t, 1, fakeCalls("cuLaunchKernelEx"))
		grid, _ := LLGrid(4096, 4)
		require.Contains(t, fakeLog(), fakeCall{"cuLaunchKernelEx", uint64(grid.X)<<16 | 6<<8 | 1})
		fakeSetResult("cuLaunchKernelEx", 701)
		launch(d, false) // a plain module never calls it
		require.EqualValues(t, 1, fakeCalls("cuLaunchKernel"))
		require.EqualValues(t, 1, fakeCalls("cuLaunchKernelEx"))
	})
	withFake(t, func(d *Driver) {
		require.False(t, d.DependentLaunch(0))
		launch(d, true) // the setting cannot reach a function the driver lacks
		require.EqualValues(t, 1, fakeCalls("cuLaunchKernel"))
	}, "cuLaunchKernelEx")
}

func TestReduceKernelSelection(t *testing.T) {
	for _, c := range []struct {
		dt, op int32
		name   string
		post   int32
		ok     bool
	}{
		{0, 0, "gs_twoshot_f32_sum", PostNone, true},  // float32 SUM
		{0, 1, "gs_twoshot_f32_sum", PostDiv, true},   // float32 AVG
		{3, 5, "gs_twoshot_bf16_sum", PostMul, true},  // bfloat16 PREMUL_SUM
		{2, 3, "gs_twoshot_f16_min", PostNone, true},  // float16 MIN
		{8, 2, "gs_twoshot_i64_prod", PostNone, true}, // int64 PRODUCT
		{7, 1, "", 0, false},                          // int32 AVG: undefined
		{1, 0, "gs_twoshot_f64_sum", PostNone, true},  // float64 SUM
		{6, 0, "", 0, false},                          // int16: no kernel
		{9, 6, "", 0, false},                          // bool BAND: no kernel
	} {
		k, post, err := ReduceKernel(TwoShot, dtypeOf(c.dt), redOpOf(c.op))
		if !c.ok {
			require.ErrorIs(t, err, ErrNotSupported)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.name, k.Name)
		require.Equal(t, c.post, post)
	}
}

func TestReduceGridIsBounded(t *testing.T) {
	for _, n := range []uint64{0, 1, 3, 1025, 4<<20 + 3, 1 << 40} {
		for _, a := range []Algo{OneShot, TwoShot} {
			g, b := ReduceGrid(a, n, 2, 8)
			require.GreaterOrEqual(t, g.X, uint32(1))
			require.LessOrEqual(t, g.X, uint32(defaultReduceBlocks))
			require.Equal(t, D1(BlockThreads), b)
		}
	}
	g, _ := CopyGrid(1 << 30)
	require.LessOrEqual(t, g.X, uint32(MaxBlocks))
	for _, limit := range []int{-1, 0, 1, 24, 64, 1000} {
		g, _ := ReduceGridLimit(OneShot, 1<<30, 4, 2, limit)
		require.Equal(t, uint32(min(max(limit, 1), MaxBlocks)), g.X, "limit %d", limit)
	}
}

// gs_ll's grid is one block per LLLines lines of 8 bytes, and a rank's LL
// area holds two parities of world regions for every block its largest
// launch has.
func TestLLGridAndArea(t *testing.T) {
	for _, c := range []struct {
		numel  uint64
		es     int
		blocks uint32
	}{{1, 4, 1}, {LLLines * 2, 4, 1}, {LLLines*2 + 1, 4, 2}, {LLMaxBytes / 2, 2, LLBlocks}, {LLMaxBytes / 8, 8, LLBlocks}} {
		g, b := LLGrid(c.numel, c.es)
		require.Equal(t, D1(c.blocks), g, "%d elements of %d bytes", c.numel, c.es)
		require.Equal(t, D1(LLThreads), b)
	}
	require.Equal(t, uintptr((64<<10)/8/LLLines*2*2*LLLines*LLLineBytes), LLAreaBytes(2, 64<<10))
	require.Equal(t, uintptr(LLBlocks*2*8*LLLines*LLLineBytes), LLAreaBytes(8, 1<<40))
	require.Equal(t, uintptr(2*3*LLLines*LLLineBytes), LLAreaBytes(3, 1))
}

// The library must load where there is no CUDA: nothing may link against
// libcuda or libnvrtc. This checks the test binary, which links this package
// the same way libgosym.so does.
func TestNoLinkTimeCUDADependency(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	f, err := elf.Open(exe)
	require.NoError(t, err)
	defer f.Close()
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	allowed := map[string]bool{"libc.so.6": true, "libdl.so.2": true, "libpthread.so.0": true,
		"libm.so.6": true, "libresolv.so.2": true}
	for _, l := range libs {
		require.False(t, strings.Contains(l, "cuda") || strings.Contains(l, "nvrtc"), "links %s", l)
		require.True(t, allowed[l], "unexpected dynamic dependency %s", l)
	}
	syms, err := f.ImportedSymbols()
	require.NoError(t, err)
	for _, s := range syms {
		require.False(t, strings.HasPrefix(s.Name, "cu") && !strings.HasPrefix(s.Name, "cuserid") ||
			strings.HasPrefix(s.Name, "nvrtc"), "imports %s", s.Name)
	}
}

// residentBlocks counts blocks per SM by threads and by registers, which
// the driver allocates per warp in units of 256.
func TestResidentBlocks(t *testing.T) {
	for _, c := range []struct{ sms, threadsSM, regsSM, regs, threads, want int }{
		{132, 2048, 65536, 64, 512, 264}, // H200, gs_a2av: two blocks an SM
		{132, 2048, 65536, 62, 512, 264}, // 62 registers round up to 64 a thread
		{132, 2048, 65536, 65, 512, 132}, // 65 round up to 72: one block
		{132, 2048, 65536, 0, 512, 528},  // registers unknown: threads alone
		{40, 1024, 65536, 64, 512, 80},   // threads bind first
		{132, 2048, 65536, 64, 0, 0},
	} {
		require.Equal(t, c.want, residentBlocks(c.sms, c.threadsSM, c.regsSM, c.regs, c.threads), "%+v", c)
	}
}
