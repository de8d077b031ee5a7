package cuda

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/kernels"
)

var update = flag.Bool("update", false, "rewrite kernels/params.cuh from the Go tables")

func TestParamsHeader(t *testing.T) {
	want := ParamsHeader()
	path := filepath.Join("..", "..", "..", "kernels", paramsHeaderFileName)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
	}
	got, err := kernels.FS.ReadFile(paramsHeaderFileName)
	require.NoError(t, err, "kernels/%s is missing: run with -update", paramsHeaderFileName)
	require.Equal(t, want, string(got), "kernels/%s is stale: run go test ./gobackend/internal/cuda -run TestParamsHeader -update", paramsHeaderFileName)
}

func TestParamLayouts(t *testing.T) {
	for _, s := range paramStructs {
		t.Run(s.Name, func(t *testing.T) {
			require.Equal(t, s.GoType.Size(), s.Size)
			for i, f := range s.Fields {
				require.Equal(t, s.GoType.Field(i).Offset, f.Offset, f.Name)
			}
		})
	}
	require.Equal(t, uintptr(280), arLayout.Size) // the scale is a double
	off := map[string]uintptr{}
	for _, f := range arLayout.Fields {
		off[f.Name] = f.Offset
	}
	require.Equal(t, map[string]uintptr{"peers": 0, "pads": 64, "stages": 128, "slot": 192, "out": 200,
		"in": 208, "numel": 216, "src_offset": 224, "in_stride": 232, "stage_stride": 240, "timeout_ns": 248,
		"scale": 256, "post": 264, "world": 268, "rank": 272}, off)
}

func TestLayoutRejectsBadTags(t *testing.T) {
	type unknownType struct {
		A uint64 `cuda:"a,size_t"`
	}
	type badLen struct {
		A [4]uintptr `cuda:"a,void *,GS_MAX_RANKS"`
	}
	type unknownLen struct {
		A [4]uintptr `cuda:"a,void *,GS_NOPE"`
	}
	type wrongKind struct {
		A int64 `cuda:"a,unsigned long long"`
	}
	type noTag struct {
		A int32
	}
	type goPadsDifferently struct {
		A int32   `cuda:"a,int"`
		B float64 `cuda:"b,double"`
	}
	cases := []struct {
		name string
		v    any
		want string
	}{
		{"unknown C type", unknownType{}, "unknown C type"},
		{"array length", badLen{}, "is not an array of GS_MAX_RANKS"},
		{"unknown length", unknownLen{}, "unknown length"},
		{"kind", wrongKind{}, "cannot carry"},
		{"no tag", noTag{}, "bad cuda tag"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := layoutOf("x", reflect.TypeOf(c.v))
			require.ErrorContains(t, err, c.want)
		})
	}
	// Same rules on both sides: accepted.
	s, err := layoutOf("ok", reflect.TypeOf(goPadsDifferently{}))
	require.NoError(t, err)
	require.Equal(t, uintptr(8), s.Fields[1].Offset)
}

func TestPadLayoutFits(t *testing.T) {
	// Flags and counters of MaxBlocks x MaxRanks barriers, then the error
	// words; the semaphores come after them, whole.
	require.Equal(t, []int{0, 1024, 2048, 2049, 2050},
		[]int{PadFlagsWord, PadCountersWord, PadErrorWord, PadErrorDetailWord, PadErrorMissingWord})
	require.Greater(t, PadHostErrorWord, PadErrorMissingWord)
	require.Zero(t, PadHostErrorWord%2, "the host error pointer is 8-byte aligned")
	require.Greater(t, PadSemaReadyWord, PadHostErrorWord+1, "the semaphores come after the host error pointer")
	require.Less(t, HostErrorMissing, HostErrorWords)
	require.GreaterOrEqual(t, PadSemaDoneWord, PadSemaReadyWord+MaxRanks)
	require.GreaterOrEqual(t, padUsedWords, PadSemaDoneWord+MaxRanks)
	require.Zero(t, PadSemaReadyWord%16, "semaphores start on a 64-byte boundary")
	require.LessOrEqual(t, 4*padUsedWords, PadBytes)
	require.Equal(t, 0, PadBytes%16)
	require.LessOrEqual(t, defaultReduceBlocks, MaxBlocks)
	require.LessOrEqual(t, defaultCopyBlocks, MaxBlocks)
}

func TestNVLSKernelChoice(t *testing.T) {
	for _, c := range []struct {
		dt   dtype.DType
		op   dtype.RedOp
		name string
	}{
		{dtype.Float32, dtype.Sum, "gs_nvls_f32_sum"}, {dtype.Float16, dtype.Max, "gs_nvls_f16_max"},
		{dtype.BFloat16, dtype.Min, "gs_nvls_bf16_min"}, {dtype.BFloat16, dtype.Sum, "gs_nvls_bf16_sum"},
	} {
		k, err := NVLSKernel(c.dt, c.op)
		require.NoError(t, err)
		require.Equal(t, c.name, k.Name)
		require.Equal(t, NVLSSource, k.Source)
	}
	// What PTX lacks, and what would need a scale after the switch's rounding.
	for _, c := range []struct {
		dt dtype.DType
		op dtype.RedOp
	}{{dtype.Float32, dtype.Min}, {dtype.Float32, dtype.Max}, {dtype.Float16, dtype.Product},
		{dtype.Int32, dtype.Sum}, {dtype.BFloat16, dtype.Avg}, {dtype.Float32, dtype.PremulSum}} {
		_, err := NVLSKernel(c.dt, c.op)
		require.ErrorIs(t, err, ErrNotSupported, "%s %s", c.dt, c.op)
	}
	require.Len(t, KernelsIn(NVLSSource), 7)
	k, post, err := ReduceKernel(Pull, dtype.BFloat16, dtype.Avg)
	require.NoError(t, err)
	require.Equal(t, "gs_pull_bf16_sum", k.Name)
	require.EqualValues(t, PostDiv, post)
}

func TestKernelTable(t *testing.T) {
	seen := map[string]bool{}
	sources := kernels.Sources()
	for _, k := range Kernels() {
		require.False(t, seen[k.Name], "duplicate %s", k.Name)
		seen[k.Name] = true
		require.Contains(t, sources, k.Source, k.Name)
		require.NotEmpty(t, k.Params, k.Name)
		require.True(t, strings.HasPrefix(k.Name, "gs_"), k.Name)
	}
	for _, src := range sources {
		require.NotEmpty(t, KernelsIn(src), "%s defines no kernel in the table", src)
	}
}

// Every dtype NCCL 2.28 reduces has a kernel of every algorithm for every
// op it allows; bool runs uint8's (SUM as MAX, as torch maps it for NCCL);
// int16 and the bitwise ops have none (NCCL has neither).
func TestReduceKernelDTypes(t *testing.T) {
	types := map[dtype.DType]string{dtype.Float32: "f32", dtype.Float16: "f16", dtype.BFloat16: "bf16",
		dtype.Float64: "f64", dtype.Int8: "i8", dtype.Uint8: "u8", dtype.Int32: "i32", dtype.Int64: "i64",
		dtype.Float8E4M3: "f8e4m3", dtype.Float8E5M2: "f8e5m2", dtype.Bool: "u8"}
	ops := map[dtype.RedOp]string{dtype.Sum: "sum", dtype.Avg: "sum", dtype.PremulSum: "sum",
		dtype.Product: "prod", dtype.Min: "min", dtype.Max: "max"}
	for _, a := range []Algo{OneShot, TwoShot, Pull, LL} {
		for dt, tn := range types {
			for op, on := range ops {
				k, post, err := ReduceKernel(a, dt, op)
				if dtype.Supports(dt, op) != nil {
					require.ErrorIs(t, err, ErrNotSupported, "%s %s", dt, op)
					continue
				}
				require.NoError(t, err, "%s %s %s", a, dt, op)
				if dt == dtype.Bool && op == dtype.Sum {
					on = "max"
				}
				require.Equal(t, "gs_"+a.String()+"_"+tn+"_"+on, k.Name)
				require.Equal(t, map[dtype.RedOp]int32{dtype.Avg: PostDiv, dtype.PremulSum: PostMul}[op], post)
			}
		}
		for _, c := range []struct {
			dt dtype.DType
			op dtype.RedOp
		}{{dtype.Int16, dtype.Sum}, {dtype.Int32, dtype.BAnd}, {dtype.Bool, dtype.BOr}, {dtype.Bool, dtype.Avg}} {
			_, _, err := ReduceKernel(a, c.dt, c.op)
			require.ErrorIs(t, err, ErrNotSupported, "%s %s", c.dt, c.op)
		}
	}
}
