package cuda

import (
	"fmt"
	"slices"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/kernels"
)

// Algo is an all-reduce algorithm of allreduce.cu.
type Algo int

const (
	// OneShot: every rank reads every peer and writes its own output.
	OneShot Algo = iota
	// TwoShot: each rank reduces 1/world and pushes it to every peer, in place.
	TwoShot
)

func (a Algo) String() string {
	switch a {
	case OneShot:
		return "oneshot"
	case TwoShot:
		return "twoshot"
	}
	return fmt.Sprintf("algo(%d)", int(a))
}

// Kernel name parts for the element types and operators allreduce.cu
// instantiates.
type typeName struct {
	dt   dtype.DType
	name string
}

type opName struct {
	op   dtype.RedOp
	name string
	post int32
}

var (
	reduceTypes = []typeName{{dtype.Float32, "f32"}, {dtype.Float16, "f16"}, {dtype.BFloat16, "bf16"},
		{dtype.Int32, "i32"}, {dtype.Int64, "i64"}}
	reduceOps = []opName{{dtype.Sum, "sum", PostNone}, {dtype.Avg, "sum", PostDiv}, {dtype.PremulSum, "sum", PostMul},
		{dtype.Product, "prod", PostNone}, {dtype.Min, "min", PostNone}, {dtype.Max, "max", PostNone}}
)

// The kernels of package kernels, by name.
var (
	CopyKernel    = &Kernel{Name: "gs_copy", Source: "copy.cu", Params: []*Struct{copyLayout}}
	BarrierKernel = &Kernel{Name: "gs_barrier", Source: "copy.cu", Params: []*Struct{barrierLayout}}
	allKernels    = buildKernels()
	kernelByName  = func() map[string]*Kernel {
		m := map[string]*Kernel{}
		for _, k := range allKernels {
			m[k.Name] = k
		}
		return m
	}()
)

func reduceKernelName(a Algo, typ, op string) string {
	return "gs_" + a.String() + "_" + typ + "_" + op
}

func buildKernels() []*Kernel {
	ks := []*Kernel{CopyKernel, BarrierKernel}
	for _, a := range []Algo{OneShot, TwoShot} {
		for _, t := range reduceTypes {
			for _, op := range []string{"sum", "prod", "min", "max"} {
				ks = append(ks, &Kernel{Name: reduceKernelName(a, t.name, op), Source: "allreduce.cu",
					Params: []*Struct{arLayout}})
			}
		}
	}
	return ks
}

// Kernels lists every kernel gosym compiles.
func Kernels() []*Kernel { return slices.Clone(allKernels) }

// KernelsIn lists the kernels defined in one source file.
func KernelsIn(source string) []*Kernel {
	var out []*Kernel
	for _, k := range allKernels {
		if k.Source == source {
			out = append(out, k)
		}
	}
	return out
}

// ReduceKernel picks the all-reduce kernel for (dt, op) and the value of
// ARParams.Post that goes with it: AVG and PREMUL_SUM run the sum kernel
// and scale the fp32 result (Scale = world size for AVG, the factor for
// PREMUL_SUM). Unsupported pairs wrap ErrNotSupported.
func ReduceKernel(a Algo, dt dtype.DType, op dtype.RedOp) (*Kernel, int32, error) {
	if err := dtype.Supports(dt, op); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrNotSupported, err)
	}
	ti := slices.IndexFunc(reduceTypes, func(t typeName) bool { return t.dt == dt })
	oi := slices.IndexFunc(reduceOps, func(o opName) bool { return o.op == op })
	if ti < 0 || oi < 0 {
		return nil, 0, fmt.Errorf("%w: no %s kernel for %s %s", ErrNotSupported, a, dt, op)
	}
	k := kernelByName[reduceKernelName(a, reduceTypes[ti].name, reduceOps[oi].name)]
	if k == nil {
		return nil, 0, fmt.Errorf("%w: no %s kernel for %s %s", ErrNotSupported, a, dt, op)
	}
	return k, reduceOps[oi].post, nil
}

// ReduceGrid is the launch shape of an all-reduce kernel for numel elements
// of esize bytes. It depends only on its arguments, so every rank of a
// collective computes the same grid, which the per-block barriers require.
func ReduceGrid(a Algo, numel uint64, esize, world int) (grid, block Dim3) {
	return ReduceGridLimit(a, numel, esize, world, defaultReduceBlocks)
}

// ReduceGridLimit is ReduceGrid with at most limit blocks (clamped to
// 1..MaxBlocks): large reductions are bandwidth-bound and gain from more
// blocks than the latency-oriented default.
func ReduceGridLimit(a Algo, numel uint64, esize, world, limit int) (grid, block Dim3) {
	work := (numel*uint64(esize) + vectorBytes - 1) / vectorBytes // 16-byte vectors
	if a == TwoShot && world > 1 {
		work = (work + uint64(world) - 1) / uint64(world)
	}
	blocks := (work + BlockThreads - 1) / BlockThreads
	blocks = min(max(blocks, 1), uint64(min(max(limit, 1), MaxBlocks)))
	return D1(uint32(blocks)), D1(BlockThreads)
}

// CopyGrid is the launch shape of gs_copy for a largest segment of bytes.
func CopyGrid(bytes uint64) (grid, block Dim3) {
	blocks := (bytes/vectorBytes + BlockThreads - 1) / BlockThreads
	return D1(uint32(min(max(blocks, 1), defaultCopyBlocks))), D1(BlockThreads)
}

// BarrierGrid is the launch shape of gs_barrier.
func BarrierGrid() (grid, block Dim3) { return D1(1), D1(32) }

// KernelSource is the complete program text of a kernels/*.cu file, as
// NVRTC compiles it.
func KernelSource(source string) (string, error) { return kernels.Source(source) }

// LoadKernels compiles a kernels/*.cu file for arch (through c's cache) and
// loads it into ctx.
func (d *Driver) LoadKernels(ctx Context, c *Compiler, arch int, source string) (*Module, error) {
	src, err := KernelSource(source)
	if err != nil {
		return nil, err
	}
	img, err := c.Compile(src, source, arch)
	if err != nil {
		return nil, err
	}
	return d.LoadModule(ctx, img)
}
