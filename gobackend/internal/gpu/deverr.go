package gpu

// Errors the kernels record. A kernel that waits for a peer past the
// group's timeout records the error on its rank's pad and in a pinned host
// block (cuda.ErrorWords) and returns; the pads are then out of step on
// every rank. Run loads the block's code before it enqueues each CUDA
// op and, once it is set, fails that op and every later one with the
// error below; stats and DeviceError (the barrier's wait) show it too.

import (
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// deviceError is the group's error for what a kernel recorded in w, nil
// while nothing is recorded.
func deviceError(grp Group, w *cuda.ErrorWords, ordinal int, seq uint64) error {
	de, set := w.Load()
	if !set {
		return nil
	}
	if de.Code == cuda.ErrMismatch && de.Detail&cuda.SigDetail != 0 {
		return status.Errorf(status.Mismatch, "gosym: a CUDA collective of group %q on cuda:%d: %s; "+
			"the group cannot run CUDA ops any more", grp.Name, ordinal, refusedBy(grp, de.Detail, seq))
	}
	if de.Code == cuda.ErrTimeout {
		return status.Errorf(status.Timeout, "gosym: a CUDA collective of group %q on cuda:%d: Timed out after %v waiting for ranks %v (%s); "+
			"the group cannot run CUDA ops any more", grp.Name, ordinal, grp.Timeout, de.Ranks(), de.Where())
	}
	if de.Code == cuda.ErrPeerLost { // only where DeviceError did not find the host's own error
		return status.Errorf(status.Peer, "gosym: a CUDA collective of group %q on cuda:%d was aborted: rank %d exited; "+
			"the group cannot run CUDA ops any more", grp.Name, ordinal, de.Detail&0xff)
	}
	if de.Code == cuda.ErrMismatch {
		return status.Errorf(status.Mismatch, "gosym: a CUDA collective of group %q on cuda:%d found the ranks' arguments disagree (%s); "+
			"the group cannot run CUDA ops any more", grp.Name, ordinal, de.Where())
	}
	return status.Errorf(status.Internal, "gosym: a CUDA kernel of group %q on cuda:%d failed with code %d (%s); "+
		"the group cannot run CUDA ops any more", grp.Name, ordinal, de.Code, de.Where())
}

// DeviceError is the error a kernel of grp's CUDA collectives recorded on
// this rank, or the group's once a peer was lost (Abort), nil if none. It
// reads host memory only.
func (g *State) DeviceError(grp Group) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lost != nil {
		return g.lost
	}
	if g.deferErr != nil {
		return g.deferErr
	}
	if g.live == nil {
		return nil
	}
	return deviceError(grp, g.live.errw, g.Ordinal(), g.seq.Load())
}

// deviceErrorCode is the recorded code for stats, 0 while none.
func (g *State) deviceErrorCode() uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.live == nil {
		return 0
	}
	return g.live.errw.Code()
}
