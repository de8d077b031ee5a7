package gobackend

// Errors the kernels record. A kernel that waits for a peer past the
// group's timeout records the error on its rank's pad and in a pinned host
// block (cuda.ErrorWords) and returns; the pads are then out of step on
// every rank. runGPU loads the block's code before it enqueues each CUDA
// op and, once it is set, fails that op and every later one with the
// error below; stats and DeviceError (the barrier's wait) show it too.

import (
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// deviceError is the group's error for what a kernel recorded in w, nil
// while nothing is recorded.
func (e *Endpoint) deviceError(w *cuda.ErrorWords, ordinal int) error {
	de, set := w.Load()
	if !set {
		return nil
	}
	if de.Code == cuda.ErrTimeout {
		return status.Errorf(status.Timeout, "gosym: a CUDA collective of group %q on cuda:%d: Timed out after %v waiting for ranks %v (%s); "+
			"the group cannot run CUDA ops any more", e.Name, ordinal, e.Timeout, de.Ranks(), de.Where())
	}
	if de.Code == cuda.ErrMismatch {
		return status.Errorf(status.Mismatch, "gosym: a CUDA collective of group %q on cuda:%d found the ranks' arguments disagree (%s); "+
			"the group cannot run CUDA ops any more", e.Name, ordinal, de.Where())
	}
	return status.Errorf(status.Internal, "gosym: a CUDA kernel of group %q on cuda:%d failed with code %d (%s); "+
		"the group cannot run CUDA ops any more", e.Name, ordinal, de.Code, de.Where())
}

// DeviceError is the error a CUDA kernel of this group recorded on this
// rank (a peer that did not arrive in time, a p2p message that did not
// match), nil if none. It reads host memory only: callers use it after
// waiting on the GPU (a barrier).
func (e *Endpoint) DeviceError() error {
	g := &e.gpu
	g.mu.Lock()
	var err error
	if g.errw != nil {
		err = e.deviceError(g.errw, int(g.device.Load())-1)
	}
	g.mu.Unlock()
	if err != nil {
		return err
	}
	return e.p2p.deviceError(e)
}

// deviceErrorCode is the recorded code for stats, 0 while none.
func (g *gpuState) deviceErrorCode() uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.errw == nil {
		return 0
	}
	return g.errw.Code()
}
