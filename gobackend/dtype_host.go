package gobackend

import (
	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/host"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// hostReduceSupport refuses, before the op takes a sequence number, a
// reduction of host memory that only the CUDA data plane has: fp8, which
// NCCL reduces and Gloo does not.
func hostReduceSupport(op *Op) error {
	switch op.Kind {
	case ops.AllReduce, ops.Reduce, ops.ReduceScatter:
		return hostFloat8(op.Kind.String(), op.DType)
	}
	return nil
}

// hostFloat8 refuses what (a reduction of host memory) of dt where dt is fp8.
func hostFloat8(what string, dt DType) error {
	if dt.IsFloat8() {
		return status.Errorf(status.NotSupported, "gosym: %s of %s on CPU tensors is not supported (Gloo has no fp8 reductions; CUDA tensors reduce it)",
			what, dt)
	}
	return nil
}

// HostReduce reduces host memory outside any group: dst <- srcs[0] op
// srcs[1] op ... op srcs[k-1], count elements of dt each, combined in order
// by the CPU plane's loops (float16/bfloat16 accumulate in float32), in
// shares across the goroutines a rank of a group of ranks ranks gets
// (GOSYM_THREADS, else cores / ranks). A group across hosts finishes a
// reduction with it (the rail's swaps): the engine's loops, not torch's,
// whose intra-op threads a job not launched by torchrun leaves at one per
// core in every rank.
func HostReduce(dst uintptr, srcs []uintptr, count int, dt DType, op RedOp, scale float64, ranks int) error {
	if !dt.Valid() {
		return status.Errorf(status.InvalidArg, "gosym: host_reduce: unknown dtype %d", int(dt))
	}
	if err := hostFloat8("host_reduce", dt); err != nil {
		return err
	}
	if err := dtype.Supports(dt, op); err != nil {
		return status.Errorf(status.NotSupported, "gosym: host_reduce: %v", err)
	}
	if len(srcs) == 0 || count < 0 {
		return status.Errorf(status.InvalidArg, "gosym: host_reduce: %d sources of %d elements", len(srcs), count)
	}
	es := dt.Size()
	return coll.ParReduce(threadsFor(ranks), dst, srcs, count*es, es, func(d uintptr, s []uintptr, c int) error {
		return host.Reduce(d, s, c, dt, op, scale)
	})
}
