package gpu

// Issue #6, the parts that run on any GPUs that map each other: reduce
// and all_reduce with the semaphore protocol of cuda.Sema (per-peer
// semaphores in the signal pads set by stream memory operations), with the
// unicast pull kernel or, where a multicast object was set up (nvls.go),
// with multimem.ld_reduce; and per-algorithm counters that make the choice
// visible. Team.reduction (ops.go) picks the algorithm.

import (
	"sync"
	"sync/atomic"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// semaMemopWait is GOSYM_GPU_SEMA_WAIT=memop: the protocol waits with
// stream memory operations, as the seed does, instead of gs_sema_wait. It
// saves a launch per wait but has no deadline: a rank that never arrives
// stalls the stream for good. Read once; a rank's waits are its own
// business, so the ranks need not agree on it.
var semaMemopWait = sync.OnceValue(func() bool { return config.GPUSemaWait.Get() == "memop" })

// semaReduce enqueues op on stream s with the semaphore protocol and the
// unicast pull kernel: an all_reduce when root < 0, otherwise a reduce whose
// result only root gets (op.Out may be 0 elsewhere, and no rank's input is
// written). Every rank must run the same op with the same root.
func (t *Team) semaReduce(op *ops.Op, s cuda.Stream, root int) error {
	return t.semaRun(op, s, root, 0)
}

// nvlsReduce is semaReduce with the NVLS kernels, reading every rank's
// staging through mc, the stagings' multicast address (nvlsStageAddr of
// the group's binding). All-reduce runs in place (every rank reduces a
// slice and multicasts it: identical bits everywhere) then copies out;
// reduce runs one-shot at the root. Only SUM, MIN, MAX of float32 (SUM),
// float16 and bfloat16 exist (cuda.NVLSKernel); the caller falls back for
// the rest.
func (t *Team) nvlsReduce(op *ops.Op, s cuda.Stream, root int, mc uintptr) error {
	return t.semaRun(op, s, root, mc)
}

func (t *Team) semaRun(op *ops.Op, s cuda.Stream, root int, mc uintptr) error {
	if op.Count == 0 {
		return nil
	}
	t.used = true
	m := &cuda.Sema{D: t.g.d, Ctx: t.g.ctx, Rank: t.rank, World: t.world, Pads: t.pads, Stages: t.stages,
		StageBytes: t.stage, Mc: mc, TimeoutNs: t.timeoutNs, MemopWait: semaMemopWait(), Function: t.function}
	return m.Reduce(s, cuda.SemaOp{In: op.In, Out: op.Out, Count: op.Count, DType: op.DType, Op: op.RedOp,
		Scale: reduceScale(op, t.world), Root: root, NVLS: mc != 0})
}

// reduceScale is the kernels' Scale for op: the world size for AVG, the
// factor for PREMUL_SUM, 1 otherwise.
func reduceScale(op *ops.Op, world int) float64 {
	switch op.RedOp {
	case dtype.Avg:
		return float64(world)
	case dtype.PremulSum:
		return op.Scale
	}
	return 1
}

// algoKind is a CUDA reduction algorithm, as the counters name it.
type algoKind int

const (
	algoOneShot algoKind = iota // one-shot kernel, block barriers
	algoTwoShot                 // two-shot kernel, block barriers
	algoSema                    // semaphore protocol, unicast pull kernel
	algoNVLS                    // semaphore protocol, multimem.ld_reduce
	algoLL                      // LL kernel: flagged lines into the peers' LL areas, no barrier
	algoArPush                  // gs_arpush: two-shot whose reduce-scatter half pushes
	numGPUAlgos
)

var algoNames = [numGPUAlgos]string{"oneshot", "twoshot", "sema_unicast", "nvls", "ll", "arpush"}

func (a algoKind) String() string { return algoNames[a] }

// algoStats counts the CUDA reductions of a group per algorithm, so that
// tests and users see which one ran (stats gpu_algo_<name>), and logs with
// GOSYM_DEBUG whenever the group's choice changes.
type algoStats struct {
	n    [numGPUAlgos]atomic.Int64
	last atomic.Int32 // the previous op's algorithm + 1
}

// Add counts one op of this rank run with a.
func (s *algoStats) Add(a algoKind, rank int, op *ops.Op) {
	s.n[a].Add(1)
	if prev := s.last.Swap(int32(a) + 1); prev != int32(a)+1 {
		dlog.Printf("rank %d: CUDA %s of %d %s (seq %d) runs %s", rank, op.Kind, op.Count, op.DType, op.Seq, a)
	}
}

func (s *algoStats) stats(m map[string]any) {
	for a := range numGPUAlgos {
		m["gpu_algo_"+a.String()] = s.n[a].Load()
	}
}
