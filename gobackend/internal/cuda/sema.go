package cuda

import (
	"fmt"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// Sema is one rank's side of the semaphore protocol of NVIDIA Fuser #6038:
// reduce and all_reduce over staging buffers that every rank can address,
// ordered by per-peer semaphores in the ranks' signal pads (the endpoint's
// control memory) that stream memory operations set. A round (one chunk of
// staging) is, all stream-ordered on the caller's stream:
//
//	all_reduce  stage input -> set ready[me] at every peer -> wait for every
//	            peer's ready -> reduce -> set done[me] at every peer -> wait
//	            for every peer's done (nobody reads my staging any more)
//	reduce      every rank stages; a non-root sets ready[me] at the root and
//	            waits for the root's done; the root waits for every ready,
//	            reduces, then sets done[root] at every peer. Non-roots'
//	            inputs are never written, and only the root has an output.
//
// The reduce is the pull kernel (every rank reads every peer's staging in
// rank order: identical bits everywhere, runs on any GPUs that map each
// other), or with NVLS the multimem kernels through the stagings' multicast
// address (only where SetupMulticast succeeded).
//
// Semaphore values: each semaphore has one writer (the peer it is named
// after), which sets it to SemaSet, and one reader (the pad's owner), which
// waits for SemaSet and consumes it (writes 0). Every round therefore
// leaves every semaphore at 0. Monotonic sequence values, the other
// classic answer to the ABA problem of reusing flags, do not work here:
// stream memory operations write constants chosen at enqueue time, so a
// captured CUDA graph would replay the same values and its waits would pass
// at once on the second replay. Consuming makes a replayed round start from
// the state the captured one started from; back-to-back rounds are safe
// because a writer sets a semaphore again only after it waited for
// something the reader sends after consuming it (ready after the reader's
// done, done after the reader's ready).
//
// Waits: by default gs_sema_wait, a one-block kernel that polls with a
// deadline (TimeoutNs) and names the ranks that did not arrive in the pad's
// error words. With MemopWait the waits are cuStreamBatchMemOp waits, as in
// the seed: fewer launches, but a rank that never arrives stalls the
// stream for good (the driver has no timeout for them).
type Sema struct {
	D          *Driver
	Ctx        Context
	Rank       int
	World      int
	Pads       [MaxRanks]uintptr // every rank's signal pad, as mapped here (index: rank)
	Stages     [MaxRanks]uintptr // every rank's staging, as mapped here
	StageBytes uintptr           // bytes of each staging (a chunk), a multiple of 16
	Mc         uintptr           // the stagings' multicast address (McBinding); 0: none
	TimeoutNs  uint64            // deadline of each gs_sema_wait; 0: none
	MemopWait  bool              // wait with stream memory operations instead
	// Function returns a kernel loaded in Ctx (the pull or NVLS kernel,
	// gs_sema_wait).
	Function func(*Kernel) (*Function, error)
}

// SemaOp is one reduction for Sema.Reduce.
type SemaOp struct {
	In, Out uintptr // this rank's input and output; Out is unused on a reduce's non-roots
	Count   int
	DType   dtype.DType
	Op      dtype.RedOp
	Scale   float64 // AVG: the world size; PREMUL_SUM: the factor
	Root    int     // the reduce's root; negative: all_reduce
	NVLS    bool    // reduce with multimem.ld_reduce through Mc
}

// Reduce enqueues o on stream s, one protocol round per chunk of staging.
// Every rank of the group must enqueue the same op (count, type, root,
// NVLS) in the same order, as with any collective.
func (m *Sema) Reduce(s Stream, o SemaOp) error {
	if err := m.check(o); err != nil {
		return err
	}
	if o.Count == 0 {
		return nil
	}
	var k *Kernel
	var post int32
	var err error
	if o.NVLS {
		k, err = NVLSKernel(o.DType, o.Op)
	} else {
		k, post, err = ReduceKernel(Pull, o.DType, o.Op)
	}
	if err != nil {
		return err
	}
	f, err := m.Function(k)
	if err != nil {
		return err
	}
	var wait *Function
	if !m.MemopWait {
		if wait, err = m.Function(SemaWaitKernel); err != nil {
			return err
		}
	}
	es := o.DType.Size()
	chunk := int(m.StageBytes) / es
	for off := 0; off < o.Count; off += chunk {
		r := semaRound{m: m, s: s, o: &o, f: f, wait: wait, post: post, at: uintptr(off * es),
			n: min(chunk, o.Count-off)}
		if err := r.run(); err != nil {
			return err
		}
	}
	return nil
}

func (m *Sema) check(o SemaOp) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("cuda: semaphore reduce: "+format, args...)
	}
	switch {
	case m.World < 1 || m.World > MaxRanks || m.Rank < 0 || m.Rank >= m.World:
		return bad("rank %d of a group of %d (at most %d)", m.Rank, m.World, MaxRanks)
	case o.Root >= m.World:
		return bad("root %d of a group of %d", o.Root, m.World)
	case o.Count < 0:
		return bad("negative count %d", o.Count)
	case m.StageBytes < 16 || m.StageBytes%16 != 0:
		return bad("staging of %d bytes", m.StageBytes)
	case m.Function == nil:
		return bad("no kernel lookup")
	case o.NVLS && m.Mc == 0:
		return fmt.Errorf("%w: semaphore reduce: NVLS without a multicast mapping", ErrNotSupported)
	case o.Count > 0 && o.In == 0, o.Count > 0 && o.Out == 0 && (o.Root < 0 || o.Root == m.Rank):
		return bad("null buffer for %d elements", o.Count)
	}
	return nil
}

// semaRound is one chunk: n elements at byte offset at of the op's buffers.
type semaRound struct {
	m    *Sema
	s    Stream
	o    *SemaOp
	f    *Function // the reduce kernel
	wait *Function // gs_sema_wait, nil with MemopWait
	post int32
	at   uintptr
	n    int
}

func (r *semaRound) run() error {
	m, o := r.m, r.o
	me := m.Rank
	peers := (uint32(1)<<m.World - 1) &^ (1 << me) // every rank but me
	bytes := uintptr(r.n * o.DType.Size())
	if err := m.D.MemcpyDtoDAsync(m.Ctx, m.Stages[me], o.In+r.at, bytes, r.s); err != nil {
		return err
	}
	switch {
	case o.Root < 0:
		if err := r.exchange(PadSemaReadyWord, peers, PadSemaReadyWord, peers); err != nil {
			return err
		}
		if err := r.reduce(); err != nil {
			return err
		}
		if err := r.exchange(PadSemaDoneWord, peers, PadSemaDoneWord, peers); err != nil {
			return err
		}
		if o.NVLS { // in place: my staging holds every rank's result now
			return m.D.MemcpyDtoDAsync(m.Ctx, o.Out+r.at, m.Stages[me], bytes, r.s)
		}
		return nil
	case me == o.Root:
		if err := r.exchange(0, 0, PadSemaReadyWord, peers); err != nil {
			return err
		}
		if err := r.reduce(); err != nil {
			return err
		}
		return r.exchange(PadSemaDoneWord, peers, 0, 0)
	default:
		root := uint32(1) << o.Root
		return r.exchange(PadSemaReadyWord, root, PadSemaDoneWord, root)
	}
}

// exchange sets semaphore signal+me at every rank of to, then waits for
// (and consumes) semaphore wait+r of this rank's pad for every rank r of
// from.
func (r *semaRound) exchange(signal int, to uint32, wait int, from uint32) error {
	m := r.m
	me := m.Rank
	ops := make([]MemOp, 0, 3*MaxRanks)
	for q := 0; q < m.World; q++ {
		if to>>q&1 != 0 {
			ops = append(ops, MemOp{Addr: m.Pads[q] + 4*uintptr(signal+me), Value: SemaSet})
		}
	}
	if m.MemopWait {
		for _, consume := range []bool{false, true} {
			for q := 0; q < m.World; q++ {
				if from>>q&1 != 0 {
					op := MemOp{Wait: !consume, Addr: m.Pads[me] + 4*uintptr(wait+q), Value: SemaSet, Flags: WaitEQ}
					if consume {
						op.Value, op.Flags = 0, 0
					}
					ops = append(ops, op)
				}
			}
		}
	}
	if err := m.D.StreamBatchMemOp(m.Ctx, r.s, ops); err != nil {
		return err
	}
	if m.MemopWait || from == 0 {
		return nil
	}
	p := SemaParams{Pad: m.Pads[me], TimeoutNs: m.TimeoutNs, Word: int32(wait), Mask: from}
	grid, block := SemaWaitGrid()
	return m.D.Launch(r.wait, grid, block, 0, r.s, &p)
}

func (r *semaRound) reduce() error {
	m, o := r.m, r.o
	es := o.DType.Size()
	if !o.NVLS {
		p := ARParams{Peers: m.Stages, Pads: m.Pads, Out: o.Out + r.at, Numel: uint64(r.n), TimeoutNs: m.TimeoutNs,
			Scale: o.Scale, Post: r.post, World: int32(m.World), Rank: int32(m.Rank)}
		grid, block := ReduceGridLimit(Pull, uint64(r.n), es, m.World, MaxBlocks)
		return m.D.Launch(r.f, grid, block, 0, r.s, &p)
	}
	p := NVLSParams{Mc: m.Mc, Out: o.Out + r.at, Pad: m.Pads[m.Rank], Numel: uint64(r.n), Mode: NVLSOneShot,
		World: int32(m.World), Rank: int32(m.Rank)}
	if o.Root < 0 {
		p.Mode, p.Out = NVLSInPlace, 0
	}
	grid, block := NVLSGrid(p.Mode, uint64(r.n), es, m.World)
	return m.D.Launch(r.f, grid, block, 0, r.s, &p)
}
