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
	// Pull: one-shot without the kernel's own barriers, for callers that
	// order the launch themselves (the semaphore protocol of sema.go).
	Pull
	// LL: every rank sends its input to every peer as lines that carry
	// their own flag, and reduces what arrives: no barrier, one trip over
	// NVLink (gs_ll; inputs up to LLMaxBytes).
	LL
	// ArPush: two-shot whose reduce-scatter half pushes into the peers'
	// stagings and folds locally (gs_arpush; ARParams.Stages and Slot).
	ArPush
)

func (a Algo) String() string {
	switch a {
	case OneShot:
		return "oneshot"
	case TwoShot:
		return "twoshot"
	case Pull:
		return "pull"
	case LL:
		return "ll"
	case ArPush:
		return "arpush"
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
	// Every type NCCL 2.28 reduces (bool runs uint8's kernels: kernelParts).
	// One GS_AR_KERNELS line each in allreduce.cu.
	reduceTypes = []typeName{{dtype.Float32, "f32"}, {dtype.Float16, "f16"}, {dtype.BFloat16, "bf16"},
		{dtype.Int32, "i32"}, {dtype.Int64, "i64"}, {dtype.Float64, "f64"}, {dtype.Int8, "i8"},
		{dtype.Uint8, "u8"}, {dtype.Float8E4M3, "f8e4m3"}, {dtype.Float8E5M2, "f8e5m2"}}
	reduceOps = []opName{{dtype.Sum, "sum", PostNone}, {dtype.Avg, "sum", PostDiv}, {dtype.PremulSum, "sum", PostMul},
		{dtype.Product, "prod", PostNone}, {dtype.Min, "min", PostNone}, {dtype.Max, "max", PostNone}}
)

// The kernels of package kernels, by name.
var (
	CopyKernel     = &Kernel{Name: "gs_copy", Source: "copy.cu", Params: []*Struct{copyLayout}}
	BarrierKernel  = &Kernel{Name: "gs_barrier", Source: "copy.cu", Params: []*Struct{barrierLayout}}
	SemaWaitKernel = &Kernel{Name: "gs_sema_wait", Source: "copy.cu", Params: []*Struct{semaLayout}}
	P2PSendKernel  = &Kernel{Name: "gs_p2p_send", Source: "p2p.cu", Params: []*Struct{p2pLayout}}
	P2PRecvKernel  = &Kernel{Name: "gs_p2p_recv", Source: "p2p.cu", Params: []*Struct{p2pLayout}}
	LLMoveKernel   = &Kernel{Name: "gs_llmove", Source: "copy.cu", Params: []*Struct{llMoveLayout}}
	A2AVKernel     = &Kernel{Name: "gs_a2av", Source: "p2p.cu", Params: []*Struct{a2avLayout}}
	RelayKernel    = &Kernel{Name: "gs_bcast_relay", Source: "copy.cu", Params: []*Struct{relayLayout}}
	StepsKernel    = &Kernel{Name: "gs_copy_steps", Source: "copy.cu", Params: []*Struct{stepsLayout}}
	allKernels     = buildKernels()
	kernelByName   = func() map[string]*Kernel {
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

// ReduceSource holds the one- and two-shot reduction kernels.
const ReduceSource = "allreduce.cu"

// NVLSSource holds the multimem (NVLink SHARP) kernels. It compiles for
// sm_90 and newer only, and nothing launches its kernels unless a multicast
// object exists, which only MulticastAllowed can let happen.
const NVLSSource = "nvls.cu"

// The (type, operator) pairs multimem.ld_reduce has: PTX knows no f32
// min/max, no product, and accumulates f16/bf16 sums in fp32 (.acc::f32).
var nvlsPairs = []struct {
	dt dtype.DType
	op dtype.RedOp
}{
	{dtype.Float32, dtype.Sum},
	{dtype.Float16, dtype.Sum}, {dtype.Float16, dtype.Min}, {dtype.Float16, dtype.Max},
	{dtype.BFloat16, dtype.Sum}, {dtype.BFloat16, dtype.Min}, {dtype.BFloat16, dtype.Max},
}

func nvlsKernelName(typ, op string) string { return "gs_nvls_" + typ + "_" + op }

func buildKernels() []*Kernel {
	ks := []*Kernel{CopyKernel, BarrierKernel, SemaWaitKernel, P2PSendKernel, P2PRecvKernel, LLMoveKernel, A2AVKernel,
		RelayKernel, StepsKernel}
	for _, a := range []Algo{OneShot, TwoShot, Pull, LL, ArPush} {
		for _, t := range reduceTypes {
			for _, op := range []string{"sum", "prod", "min", "max"} {
				ks = append(ks, &Kernel{Name: reduceKernelName(a, t.name, op), Source: ReduceSource,
					Params: []*Struct{arLayout}})
			}
		}
	}
	for _, p := range nvlsPairs {
		t, o, _ := kernelParts(p.dt, p.op)
		ks = append(ks, &Kernel{Name: nvlsKernelName(t.name, o.name), Source: NVLSSource,
			Params: []*Struct{nvlsLayout}})
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
// and scale the sum in its accumulator's precision (Scale = world size for
// AVG, the factor for PREMUL_SUM). Unsupported pairs wrap ErrNotSupported.
func ReduceKernel(a Algo, dt dtype.DType, op dtype.RedOp) (*Kernel, int32, error) {
	if p, ok := reducePicks[reduceKey{a, dt, op}]; ok {
		return p.k, p.post, p.err
	}
	return pickReduceKernel(a, dt, op)
}

// reduceKey and reducePick memoize ReduceKernel for every valid (algo,
// type, operator): each CUDA op asks, and the pick builds a kernel name.
type reduceKey struct {
	a  Algo
	dt dtype.DType
	op dtype.RedOp
}

type reducePick struct {
	k    *Kernel
	post int32
	err  error
}

var reducePicks = func() map[reduceKey]reducePick {
	m := map[reduceKey]reducePick{}
	for _, a := range []Algo{OneShot, TwoShot, Pull, LL, ArPush} {
		for dt := dtype.DType(0); dt.Valid(); dt++ {
			for op := dtype.RedOp(0); op.Valid(); op++ {
				k, post, err := pickReduceKernel(a, dt, op)
				m[reduceKey{a, dt, op}] = reducePick{k, post, err}
			}
		}
	}
	return m
}()

func pickReduceKernel(a Algo, dt dtype.DType, op dtype.RedOp) (*Kernel, int32, error) {
	if err := dtype.Supports(dt, op); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrNotSupported, err)
	}
	t, o, ok := kernelParts(dt, op)
	k := kernelByName[reduceKernelName(a, t.name, o.name)]
	if !ok || k == nil {
		return nil, 0, fmt.Errorf("%w: no %s kernel for %s %s", ErrNotSupported, a, dt, op)
	}
	return k, o.post, nil
}

// kernelParts are the kernel name parts of (dt, op). bool reduces as
// torch hands it to NCCL: as uint8, with SUM as MAX (ProcessGroupNCCL's
// getNcclReduceOp), so PRODUCT and MIN are AND and MAX is OR on 0/1 bytes.
func kernelParts(dt dtype.DType, op dtype.RedOp) (typeName, opName, bool) {
	if dt == dtype.Bool {
		dt = dtype.Uint8
		if op == dtype.Sum {
			op = dtype.Max
		}
	}
	ti := slices.IndexFunc(reduceTypes, func(t typeName) bool { return t.dt == dt })
	oi := slices.IndexFunc(reduceOps, func(o opName) bool { return o.op == op })
	if ti < 0 || oi < 0 {
		return typeName{}, opName{}, false
	}
	return reduceTypes[ti], reduceOps[oi], true
}

// NVLSKernel picks the multimem kernel for (dt, op). Only SUM, MIN and MAX
// of float32 (SUM only), float16 and bfloat16 exist; anything else wraps
// ErrNotSupported (the caller falls back to a unicast kernel).
func NVLSKernel(dt dtype.DType, op dtype.RedOp) (*Kernel, error) {
	for _, p := range nvlsPairs {
		if p.dt == dt && p.op == op {
			t, o, _ := kernelParts(dt, op)
			return kernelByName[nvlsKernelName(t.name, o.name)], nil
		}
	}
	return nil, fmt.Errorf("%w: multimem.ld_reduce has no %s %s", ErrNotSupported, dt, op)
}

// NVLSGrid is the launch shape of an NVLS kernel for numel elements of
// esize bytes; mode NVLSInPlace splits the work over world ranks. Every
// rank computes the same grid.
func NVLSGrid(mode int32, numel uint64, esize, world int) (grid, block Dim3) {
	a := OneShot
	if mode == NVLSInPlace {
		a = TwoShot
	}
	return ReduceGridLimit(a, numel, esize, world, MaxBlocks)
}

// SemaWaitGrid is the launch shape of gs_sema_wait.
func SemaWaitGrid() (grid, block Dim3) { return D1(1), D1(32) }

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
	if (a == TwoShot || a == ArPush) && world > 1 {
		work = (work + uint64(world) - 1) / uint64(world)
	}
	blocks := (work + BlockThreads - 1) / BlockThreads
	blocks = min(max(blocks, 1), uint64(min(max(limit, 1), MaxBlocks)))
	return D1(uint32(blocks)), D1(BlockThreads)
}

// LLGrid is the launch shape of gs_ll for numel elements of esize bytes
// (and of gs_llmove for segments of numel bytes, esize 1):
// one block per LLLines lines of 8 data bytes. The caller keeps the input
// within LLMaxBytes.
func LLGrid(numel uint64, esize int) (grid, block Dim3) {
	lines := (numel*uint64(esize) + 7) / 8
	blocks := min(max((lines+LLLines-1)/LLLines, 1), LLBlocks)
	return D1(uint32(blocks)), D1(LLThreads)
}

// LLAreaBytes is the size of one rank's LL area in a group of world ranks
// whose gs_ll launches take at most maxBytes (at most LLMaxBytes).
func LLAreaBytes(world, maxBytes int) uintptr {
	grid, _ := LLGrid(uint64(min(max(maxBytes, 1), LLMaxBytes)), 1)
	return uintptr(grid.X) * 2 * uintptr(world) * LLLines * LLLineBytes
}

// CopyGrid is the launch shape of gs_copy for a largest segment of bytes.
func CopyGrid(bytes uint64) (grid, block Dim3) { return CopyGridLimit(bytes, defaultCopyBlocks) }

// a2avSelfShare is the bytes of the local piece per block of gs_a2av.
const a2avSelfShare = 512 << 10

// CopyGridLimit is CopyGrid with at most limit blocks (clamped to
// 1..MaxBlocks).
func CopyGridLimit(bytes uint64, limit int) (grid, block Dim3) {
	blocks := (bytes/vectorBytes + BlockThreads - 1) / BlockThreads
	return D1(uint32(min(max(blocks, 1), uint64(min(max(limit, 1), MaxBlocks))))), D1(BlockThreads)
}

// P2PGrid is the launch shape of gs_p2p_send and gs_p2p_recv, for any
// message: the grid never depends on the size, so that a receiver that
// expected another size still meets every block of its sender.
func P2PGrid() (grid, block Dim3) { return D1(P2PBlocks), D1(BlockThreads) }

// A2AVGrid is the launch shape of gs_a2av for world ranks, nb blocks per
// pair and direction, and a local piece of self bytes: the pair blocks
// (the same number on every rank), then the local copy's, one per
// a2avSelfShare bytes, at least one (it also checks the local splits).
func A2AVGrid(world, nb int, self uint64) (grid, block Dim3) {
	blocks := max(min((self+a2avSelfShare-1)/a2avSelfShare, A2AVSelfBlocksMax), 1)
	return D1(uint32(2*(world-1)*nb) + uint32(blocks)), D1(BlockThreads)
}

// A2AVBlocksFor is the nb of gs_a2av for world ranks under a limit of
// want: at most A2AVBlocks, and the pair blocks of a launch stay within
// MaxBlocks (they wait on one another, so all must be resident at once).
func A2AVBlocksFor(world, want int) int {
	if world < 2 {
		return max(min(want, A2AVBlocks), 1)
	}
	return max(min(want, A2AVBlocks, MaxBlocks/(2*(world-1))), 1)
}

// A2AVRegion is the bytes of each of the world-1 regions of a staging of
// stage bytes that gs_a2av uses, one per other rank (a multiple of 16).
func A2AVRegion(stage uintptr, world int) uint64 {
	return uint64(stage/uintptr(max(world-1, 1))) &^ 15
}

// A2AVSlotBytes is gs_a2av's slot for a region of region bytes, nb blocks
// and a wanted slot of want bytes: a multiple of 16 that fits nb ×
// A2AVSlots slots in the region; 0 if not even 16 bytes fit.
func A2AVSlotBytes(region uintptr, nb, want int) uint64 {
	fit := uint64(region) / uint64(nb*A2AVSlots)
	return min(uint64(max(want, 16)), fit) &^ 15
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
