package gobackend

import (
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// hostReduceSupport refuses, before the op takes a sequence number, a
// reduction of host memory that only the CUDA data plane has: fp8, which
// NCCL reduces and Gloo does not.
func hostReduceSupport(op *Op) error {
	switch op.Kind {
	case ops.AllReduce, ops.Reduce, ops.ReduceScatter:
		if op.DType.IsFloat8() {
			return status.Errorf(status.NotSupported, "gosym: %s of %s on CPU tensors is not supported (Gloo has no fp8 reductions; CUDA tensors reduce it)",
				op.Kind, op.DType)
		}
	}
	return nil
}
