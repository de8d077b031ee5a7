package gpu

// The collectives of the CUDA data plane. Each op is enqueued on the
// caller's stream as a loop over chunks of the symmetric staging; a chunk is
//
//	stage  copy what this rank contributes into its own staging;
//	move   wait for every rank (its data is staged), pull or reduce from
//	       the peers' staging over NVLink into this rank's output, and wait
//	       for every rank again (the staging may be reused by the next chunk).
//
// Below ceMin (data movement) or twoShotMin (reductions) both happen in one
// launch: block b stages exactly the byte range that block b of every peer
// later pulls, so the per-block barrier between them covers it. Larger
// chunks stage with the copy engines (cuMemcpyDtoDAsync).
//
// The move kernels are gs_copy (up to MaxSegs copies, for broadcast,
// gather, scatter, all_gather, all_to_all) and the one-shot reduction of
// allreduce.cu (all_reduce, reduce, reduce_scatter); large all_reduce
// chunks run two-shot. A rank with nothing to move in a chunk (a non-root)
// still launches the same grid with no segments: the per-block barriers
// need every rank in every block. Launch shapes depend only on sizes that
// are the same on every rank, never on what this rank happens to move.
//
// all_to_all's split sizes are known only to their owners. Where they
// differ between ranks, the ranks agree on every split first, through the
// host control plane (a sender and a receiver that disagree fail that op,
// before anything moves). With GOSYM_GPU_A2AV_BLOCKS set (and inputs not
// registered), each pair of ranks paces its own piece in one gs_a2av
// launch instead (p2p.cu): the pair's chunk count depends only on the
// piece, which both ends know, so the host runs no round; a receiver that
// expected another size drains the piece and the device records the
// mismatch, which the group's next op raises.

import (
	"encoding/binary"
	"fmt"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// agreeFunc exchanges a metadata block with every rank (the host control
// plane's barrier) and returns every rank's block, by rank.
type agreeFunc func(meta []byte) ([][]byte, error)

// KernelSupport says whether the CUDA data plane runs op at all; it is
// answered before the op takes a sequence number.
func KernelSupport(op *ops.Op) error {
	switch op.Kind {
	case ops.AllReduce, ops.Reduce, ops.ReduceScatter:
		if _, _, err := cuda.ReduceKernel(cuda.OneShot, op.DType, op.RedOp); err != nil {
			return status.Errorf(status.NotSupported, "gosym: %s of %s with %s on CUDA tensors: %v", op.Kind, op.DType, op.RedOp, err)
		}
	case ops.Barrier, ops.Broadcast, ops.AllGather, ops.Gather, ops.Scatter, ops.AllToAll:
	default:
		return status.Errorf(status.NotSupported, "gosym: %s on CUDA tensors is not supported", op.Kind)
	}
	return nil
}

// run enqueues op on stream s.
func (t *Team) run(op *ops.Op, s cuda.Stream, agree agreeFunc) error {
	if op.Kind == ops.AllReduce || op.Kind == ops.Reduce {
		return t.reduction(op, s, agree)
	}
	if done, err := t.llOp(op, s); done || err != nil {
		return err
	}
	if done, err := t.direct(op, s, agree); done || err != nil {
		return err
	}
	switch op.Kind {
	case ops.ReduceScatter:
		return t.reduceScatter(op, s)
	case ops.Broadcast:
		return t.broadcast(op, s)
	case ops.AllGather:
		return t.gather(op, s, -1)
	case ops.Gather:
		return t.gather(op, s, op.Root)
	case ops.Scatter:
		return t.scatter(op, s)
	case ops.AllToAll:
		return t.allToAll(op, s, agree)
	case ops.Barrier:
		return t.barrier(s)
	}
	return status.Errorf(status.NotSupported, "gosym: %s on CUDA tensors", op.Kind)
}

// reduction runs all_reduce or reduce with the algorithm for its size, and
// counts it: NVLS where a multicast object is bound and its kernels take
// the type and op; the LL kernel for small all_reduce (up to llMax); the
// direct two-shot on the peers' buffers for large in-place all_reduce; the
// semaphore protocol from semaMin bytes (off by
// default: measured slower than the kernels' block barriers, see
// docs/ARCHITECTURE.md); else one-shot or two-shot over the staging.
func (t *Team) reduction(op *ops.Op, s cuda.Stream, agree agreeFunc) error {
	root := -1
	if op.Kind == ops.Reduce {
		root = op.Root
	}
	n := op.Count * op.DType.Size()
	if t.nvls != nil {
		if _, err := cuda.NVLSKernel(op.DType, op.RedOp); err == nil {
			t.algos.Add(algoNVLS, t.rank, op)
			return t.nvlsReduce(op, s, root, nvlsStageAddr(t.nvls))
		}
	}
	if root < 0 && t.lowLatency(n) {
		t.algos.Add(algoLL, t.rank, op)
		return t.llReduce(op, op.In, 0, s)
	}
	if root < 0 {
		done, err := t.direct(op, s, agree)
		if done && t.cfg.arPush {
			t.algos.Add(algoArPush, t.rank, op)
		} else if done {
			t.algos.Add(algoTwoShot, t.rank, op)
		}
		if done || err != nil {
			return err
		}
	}
	if n >= t.cfg.semaMin && t.g.memops {
		t.algos.Add(algoSema, t.rank, op)
		return t.semaReduce(op, s, root)
	}
	if root < 0 && t.world > 1 && n >= t.cfg.twoShotMin {
		t.algos.Add(algoTwoShot, t.rank, op)
	} else {
		t.algos.Add(algoOneShot, t.rank, op)
	}
	return t.reduce(op, s, root)
}

// directMin is the size (bytes per rank) from which op takes the direct
// path. Its agreement rounds cost the host tens of microseconds per op;
// under CUDA graph capture they are paid once, at capture, and never at
// replay, so reductions, which save the staging copies (reduce_scatter one
// per rank), take it from captureDirectMin. Copies would trade one gs_copy
// launch for copy-engine copies between two barriers, and keep staging.
// Eager all_reduce takes it wherever it runs two-shot: the direct two-shot
// is the staged one without the copies in and out (4 MiB on 2×H200: 20.5
// µs against 42). broadcast and all_gather take it from moveDirectMin: the
// staged path copies every rank's whole input in before one byte crosses
// (4 MiB on 2×H200: broadcast 20.6 µs against 24.9, all_gather 23.0
// against 28.1).
func (t *Team) directMin(op *ops.Op) int {
	if t.capturing && (op.Kind == ops.AllReduce || op.Kind == ops.ReduceScatter) {
		return min(t.cfg.directMin, t.cfg.captureDirectMin)
	}
	return t.eagerDirectMin(op)
}

// eagerDirectMin is directMin outside graph capture: the settings alone,
// so a caller's thread may ask it (Team.agrees).
func (t *Team) eagerDirectMin(op *ops.Op) int {
	switch {
	case op.Kind == ops.AllReduce:
		return min(t.cfg.directMin, t.cfg.twoShotMin)
	case op.Kind == ops.Broadcast || op.Kind == ops.AllGather:
		return min(t.cfg.directMin, t.cfg.moveDirectMin)
	case op.Kind == ops.ReduceScatter:
		return rsDirectMin(t.cfg, t.world, t.arch())
	}
	return t.cfg.directMin
}

// rsDirectMin is the direct path's threshold for reduce_scatter, in bytes
// of one rank's output: GOSYM_GPU_RS_DIRECT_MIN where set, else what was
// measured at this world and GPU (2 MiB at 4×H200: measured.go), else
// directMin; never above directMin.
func rsDirectMin(cfg Config, world, arch int) int {
	if v := cfg.rsDirectMin.at(world, arch, 0); v > 0 {
		return min(cfg.directMin, v)
	}
	return cfg.directMin
}

// copySeg is one copy of a gs_copy launch.
type copySeg struct {
	dst, src uintptr
	n        uintptr
}

// stage copies n bytes from src into this rank's staging at off.
func (t *Team) stageIn(off, src, n uintptr, s cuda.Stream) error {
	if n == 0 {
		return nil
	}
	return t.g.d.MemcpyDtoDAsync(t.g.ctx, t.stages[t.rank]+off, src, n, s)
}

// staged is the segment that copies n bytes from src into this rank's
// staging at off.
func (t *Team) staged(off, src, n uintptr) copySeg { return copySeg{t.stages[t.rank] + off, src, n} }

// move stages pre (segments into this rank's staging), then makes segs
// between two barriers of all ranks, for a chunk of n bytes (n is the same
// on every rank): one gs_copy launch for chunks below ceMin (latency: the
// kernel stages too), else copy-engine copies for pre, a barrier, one per
// segment and a barrier (bandwidth: the copy engines drive NVLink faster
// than the few blocks gs_copy may use).
func (t *Team) move(pre, segs []copySeg, n uintptr, s cuda.Stream) error {
	if int(n) < t.cfg.ceMin {
		return t.copyKernel(pre, segs, t.copyGrid(n), cuda.SyncShares, s)
	}
	for _, sg := range pre {
		if sg.n > 0 {
			if err := t.g.d.MemcpyDtoDAsync(t.g.ctx, sg.dst, sg.src, sg.n, s); err != nil {
				return err
			}
		}
	}
	return t.moveCE(segs, -1, n, s)
}

// copyKernel launches gs_copy: pre, then a barrier of all ranks, segs and
// a barrier, in grid (which must be the same on every rank). sync adds
// cuda.SyncShares where segs read what the peers' pre staged in the same
// launch (move): each block then reads only the share its barrier covers.
func (t *Team) copyKernel(pre, segs []copySeg, grid cuda.Dim3, sync int32, s cuda.Stream) error {
	f, err := t.function(cuda.CopyKernel)
	if err != nil {
		return err
	}
	t.used = true
	p := cuda.CopyParams{Pads: t.pads, TimeoutNs: t.timeoutNs, World: int32(t.world), Rank: int32(t.rank),
		Sync: cuda.SyncStart | cuda.SyncEnd | sync}
	for i, part := range [][]copySeg{pre, segs} {
		for _, sg := range part {
			if sg.n == 0 {
				continue
			}
			if p.NSeg == cuda.MaxSegs {
				return fmt.Errorf("gs_copy takes %d segments at most", cuda.MaxSegs)
			}
			p.Dst[p.NSeg], p.Src[p.NSeg], p.Bytes[p.NSeg] = sg.dst, sg.src, uint64(sg.n)
			p.NSeg++
		}
		if i == 0 {
			p.NPre = p.NSeg
		}
	}
	_, block := cuda.CopyGrid(0)
	return t.g.d.Launch(f, grid, block, 0, s, &p)
}

// copyGrid is gs_copy's grid for chunks of n bytes.
func (t *Team) copyGrid(n uintptr) cuda.Dim3 {
	g, _ := cuda.CopyGridLimit(uint64(n), t.cfg.copyBlocks)
	return g
}

// inTurn lists the ranks in the order this rank reads (or writes) their
// pieces: the next rank first, its own last. When every rank moves a piece
// with every peer, each then works with a different peer at each step, so no
// GPU's links serve two ranks at once. In rank order every rank read rank 0
// first, then rank 1: one GPU's egress shared by world-1 readers at a time
// (all_gather ran at half NCCL's bandwidth on 4 H100s, whose one pair moves
// as fast as NCCL's whole ring: BENCHMARKS.md's probe).
func (t *Team) inTurn() []int {
	order := make([]int, t.world)
	for i := range order {
		order[i] = (t.rank + 1 + i) % t.world
	}
	return order
}

// chunks calls fn for each [at, at+n) of total bytes, n <= size.
func chunks(total, size uintptr, fn func(at, n uintptr) error) error {
	for at := uintptr(0); at < total; at += size {
		if err := fn(at, min(size, total-at)); err != nil {
			return err
		}
	}
	return nil
}

// broadcast: the root stages, every other rank pulls from the root's staging.
func (t *Team) broadcast(op *ops.Op, s cuda.Stream) error {
	total := uintptr(op.Count * op.DType.Size())
	return chunks(total, t.stage, func(at, n uintptr) error {
		var pre, segs []copySeg
		if t.rank == op.Root {
			pre = append(pre, t.staged(0, op.In+at, n))
			if op.Out != op.In {
				segs = append(segs, copySeg{op.Out + at, op.In + at, n})
			}
		} else {
			segs = append(segs, copySeg{op.Out + at, t.stages[op.Root], n})
		}
		return t.move(pre, segs, n, s)
	})
}

// gather (root >= 0) and all_gather (root < 0): every rank stages its input;
// the receivers pull every rank's staging into their output pieces.
func (t *Team) gather(op *ops.Op, s cuda.Stream, root int) error {
	total := uintptr(op.Count * op.DType.Size())
	return chunks(total, t.stage, func(at, n uintptr) error {
		var segs []copySeg
		if root < 0 || t.rank == root {
			for _, r := range t.inTurn() {
				segs = append(segs, copySeg{op.OutPieces[r].Addr + at, t.stages[r], n})
			}
		}
		return t.move([]copySeg{t.staged(0, op.In+at, n)}, segs, n, s)
	})
}

// region is the bytes of staging a rank gives each peer when it stages a
// piece per peer (scatter, reduce_scatter, all_to_all): 16-byte aligned.
func (t *Team) region() uintptr { return (t.stage / uintptr(t.world)) &^ 15 }

// scatter: the root stages piece r into region r; rank r pulls region r.
func (t *Team) scatter(op *ops.Op, s cuda.Stream) error {
	total, reg := uintptr(op.Count*op.DType.Size()), t.region()
	return chunks(total, reg, func(at, n uintptr) error {
		var pre []copySeg
		if t.rank == op.Root {
			for r, pc := range op.InPieces {
				pre = append(pre, t.staged(uintptr(r)*reg, pc.Addr+at, n))
			}
		}
		seg := copySeg{op.Out + at, t.stages[op.Root] + uintptr(t.rank)*reg, n}
		return t.move(pre, []copySeg{seg}, n, s)
	})
}

// reduceParams is the ARParams every reduction of op starts from.
func (t *Team) reduceParams(op *ops.Op) cuda.ARParams {
	return cuda.ARParams{Peers: t.stages, Pads: t.pads, TimeoutNs: t.timeoutNs, Scale: reduceScale(op, t.world),
		World: int32(t.world), Rank: int32(t.rank)}
}

// reduceKernel launches the one- or two-shot kernel of op with p, or, on a
// rank that receives nothing (reduce's non-roots: out == 0), gs_copy with
// no segments in the same grid, which takes part in the same barriers.
func (t *Team) reduceKernel(op *ops.Op, algo cuda.Algo, p *cuda.ARParams, s cuda.Stream) error {
	grid, block := t.reduceGrid(algo, p.Numel, op.DType.Size())
	if p.Out == 0 && p.In == 0 && algo == cuda.OneShot { // nothing to stage or to reduce here
		return t.copyKernel(nil, nil, grid, 0, s)
	}
	k, post, err := cuda.ReduceKernel(algo, op.DType, op.RedOp)
	if err != nil {
		return err
	}
	f, err := t.function(k)
	if err != nil {
		return err
	}
	t.used = true
	p.Post = post
	return t.g.d.Launch(f, grid, block, 0, s, p)
}

// reduceGrid is the launch shape of a reduction kernel for numel elements
// of es bytes: bandwidth-bound ones (two-shot, or a one-shot that reads
// twoShotMin bytes in all) may use bigBlocks.
func (t *Team) reduceGrid(algo cuda.Algo, numel uint64, es int) (grid, block cuda.Dim3) {
	if algo == cuda.LL {
		return cuda.LLGrid(numel, es)
	}
	if algo == cuda.TwoShot || int(numel)*es*t.world >= t.cfg.twoShotMin {
		return cuda.ReduceGridLimit(algo, numel, es, t.world, t.cfg.bigBlocks)
	}
	return cuda.ReduceGrid(algo, numel, es, t.world)
}

// lowLatency says whether an op of n bytes per rank and peer runs an LL
// kernel (gs_ll, gs_llmove): from 1 byte to llMax (at most
// cuda.LLMaxBytes), eager and captured alike, so it is taken before the
// direct path.
func (t *Team) lowLatency(n int) bool {
	return t.llArea > 0 && n > 0 && n <= t.cfg.llMax
}

// llReduce runs all_reduce (inStride 0) or reduce_scatter (in holds world
// pieces inStride elements apart, piece q for rank q) as one gs_ll launch:
// every rank sends its input into every peer's LL area as flagged lines
// and reduces what arrives in its own (allreduce.cu), with no barrier, no
// staging copy and no host round; the peers' LL areas lie after their
// staging.
func (t *Team) llReduce(op *ops.Op, in uintptr, inStride uint64, s cuda.Stream) error {
	p := &t.ll.ar
	*p = t.reduceParams(op)
	p.Peers = t.llAreas()
	p.In, p.InStride, p.Out, p.Numel = in, inStride, op.Out, uint64(op.Count)
	return t.reduceKernel(op, cuda.LL, p, s)
}

// llParams holds the parameters of the team's LL launches (Team.ll).
type llParams struct {
	ar   cuda.ARParams
	move cuda.LLMoveParams
}

// llAreas are the ranks' LL areas, as mapped here: after their staging.
func (t *Team) llAreas() (a [cuda.MaxRanks]uintptr) {
	for r := range t.world {
		a[r] = t.stages[r] + t.stage
	}
	return a
}

// llOp runs a reduce_scatter with evenly spaced pieces, or a broadcast,
// all_gather, gather, scatter or equal-split all_to_all, of at most llMax
// bytes per rank and peer as one LL launch: gs_ll with in_stride for the
// first, gs_llmove (copy.cu) for the rest. Each rank sends each peer its
// segment as LL lines, with no barrier, no staging copy and no host round.
// It reports false for the ops it does not take; every rank decides
// alike, from the segment size.
func (t *Team) llOp(op *ops.Op, s cuda.Stream) (bool, error) {
	if op.Kind == ops.ReduceScatter {
		// LL reads the input as one strided run, so only where every rank's is
		// one by contract (reduce_scatter_tensor): a rank whose list-form
		// pieces happened to lie evenly would take LL while its peers staged.
		if !op.EvenPieces || !t.lowLatency(op.Count*op.DType.Size()) {
			return false, nil
		}
		t.algos.Add(algoLL, t.rank, op)
		return true, t.llReduce(op, op.InPieces[0].Addr, uint64(op.Count), s)
	}
	p := &t.ll.move
	var ok bool
	if *p, ok = t.llMoveParams(op); !ok {
		return false, nil
	}
	f, err := t.function(cuda.LLMoveKernel)
	if err != nil {
		return true, err
	}
	t.used = true
	t.counters.llMoves.Add(1)
	grid, block := cuda.LLGrid(p.Bytes, 1)
	return true, t.g.d.Launch(f, grid, block, 0, s, p)
}

// llMoveParams is gs_llmove's parameter for op on this rank, if op is a
// data movement that the kernel takes: what this rank sends each peer
// (Src) and where what each peer sends it goes (Dst). Rank q's Src[r] is
// set exactly when rank r's Dst[q] is; the others exchange a handshake.
func (t *Team) llMoveParams(op *ops.Op) (cuda.LLMoveParams, bool) {
	p := cuda.LLMoveParams{Pads: t.pads, TimeoutNs: t.timeoutNs, World: int32(t.world), Rank: int32(t.rank)}
	n := uintptr(op.Count * op.DType.Size())
	pieces := func(dst *[cuda.MaxRanks]uintptr, ps []ops.Piece) {
		for q := range t.world {
			dst[q] = ps[q].Addr
		}
	}
	switch op.Kind {
	case ops.Broadcast:
		if t.rank == op.Root {
			for q := range t.world {
				p.Src[q] = op.In
			}
		}
		p.Dst[op.Root] = op.Out
	case ops.AllGather, ops.Gather:
		for q := range t.world {
			if op.Kind == ops.AllGather || q == op.Root {
				p.Src[q] = op.In
			}
		}
		if op.Kind == ops.AllGather || t.rank == op.Root {
			pieces(&p.Dst, op.OutPieces)
		}
	case ops.Scatter:
		if t.rank == op.Root {
			pieces(&p.Src, op.InPieces)
		}
		p.Dst[op.Root] = op.Out
	case ops.AllToAll:
		c, ok := equalSplit(op)
		if !ok {
			return p, false
		}
		n = c * uintptr(op.DType.Size())
		pieces(&p.Src, op.InPieces)
		pieces(&p.Dst, op.OutPieces)
	default:
		return p, false
	}
	if !t.lowLatency(int(n)) {
		return p, false
	}
	p.Areas, p.Bytes = t.llAreas(), uint64(n)
	return p, true
}

// reduce is all_reduce (root < 0) and reduce (only root writes its
// output), per chunk of staging:
//   - one-shot (small chunks): a copy into the staging, then one launch
//     that reads every rank's staging and writes the output (chunks of at
//     most fuseMax bytes outside graph capture: one launch that stages too);
//   - two-shot (all_reduce chunks of at least twoShotMin bytes): rank r
//     reduces slice r of every staging and writes it into every rank's
//     staging, then a copy to the output; each rank moves 1/world of the
//     data over NVLink twice instead of all of it once.
//
// Both fold in rank order, so every rank gets the same bits either way.
func (t *Team) reduce(op *ops.Op, s cuda.Stream, root int) error {
	if op.Count == 0 {
		return nil
	}
	p := t.reduceParams(op)
	es := uintptr(op.DType.Size())
	total := uintptr(op.Count) * es
	d, ctx := t.g.d, t.g.ctx
	return chunks(total, t.stage/es*es, func(at, n uintptr) error {
		algo := cuda.OneShot
		if root < 0 && t.world > 1 && int(n) >= t.cfg.twoShotMin {
			algo = cuda.TwoShot
		}
		p.Numel, p.Out, p.SrcOffset, p.In = uint64(n/es), op.Out+at, 0, 0
		// Fused staging saves a driver call per chunk (~20 µs eager on 2×H200)
		// but replays ~0.5-2 µs slower in a CUDA graph than copy + kernel.
		if algo == cuda.OneShot && t.fuses(n) {
			p.In = op.In + at // the kernel stages it (one launch, no copy)
		} else if err := t.stageIn(0, op.In+at, n, s); err != nil {
			return err
		}
		if root >= 0 && t.rank != root {
			p.Out = 0
		}
		if err := t.reduceKernel(op, algo, &p, s); err != nil {
			return err
		}
		if algo == cuda.TwoShot {
			return d.MemcpyDtoDAsync(ctx, op.Out+at, t.stages[t.rank], n, s)
		}
		return nil
	})
}

// reduceScatter: each rank stages its piece for rank r into region r, then
// rank r reduces region r of every rank's staging into its output.
func (t *Team) reduceScatter(op *ops.Op, s cuda.Stream) error {
	if op.Count == 0 {
		return nil
	}
	p := t.reduceParams(op)
	es := uintptr(op.DType.Size())
	reg := t.region() // a multiple of 16, so of every element size
	stride, even := pieceStride(op.InPieces, es)
	return chunks(uintptr(op.Count)*es, reg, func(at, n uintptr) error {
		p.Numel, p.Out, p.SrcOffset = uint64(n/es), op.Out+at, uint64(uintptr(t.rank)*reg/es)
		p.In, p.InStride, p.StageStride = 0, 0, 0
		// As reduce: fused staging saves world driver calls per chunk.
		if even && t.fuses(n*uintptr(t.world)) {
			p.In, p.InStride, p.StageStride = op.InPieces[0].Addr+at, uint64(stride/es), uint64(reg/es)
		} else {
			for r, pc := range op.InPieces {
				if err := t.stageIn(uintptr(r)*reg, pc.Addr+at, n, s); err != nil {
					return err
				}
			}
		}
		return t.reduceKernel(op, cuda.OneShot, &p, s)
	})
}

// fuses says whether a one-shot launch stages n bytes itself: up to
// fuseMax, and not under graph capture, where copy nodes replay faster.
func (t *Team) fuses(n uintptr) bool { return int(n) <= t.cfg.fuseMax && !t.capturing }

// pieceStride reports whether pieces lie evenly spaced, stride bytes apart
// (a positive multiple of es), as reduce_scatter_tensor's do. One piece (a
// world of one) is even at stride 0: the kernel reads piece 0 alone, so the
// op needs no staging copy.
func pieceStride(pieces []ops.Piece, es uintptr) (stride uintptr, even bool) {
	if len(pieces) == 1 {
		return 0, true
	}
	if len(pieces) == 0 || pieces[1].Addr <= pieces[0].Addr {
		return 0, false
	}
	stride = pieces[1].Addr - pieces[0].Addr
	for r := range pieces {
		if pieces[r].Addr != pieces[0].Addr+uintptr(r)*stride {
			return 0, false
		}
	}
	return stride, stride%es == 0
}

// allToAll: the ranks first agree on every split (bytes each rank sends to
// each rank, and expects from each); then, per chunk of one region, rank i
// stages its piece for rank j into region j, and pulls region i of every
// rank j's staging into its piece from j.
func (t *Team) allToAll(op *ops.Op, s cuda.Stream, agree agreeFunc) error {
	es := uintptr(op.DType.Size())
	n, even := equalSplit(op)
	if !t.capturing && t.pacedAllToAll(n*es, even) {
		return t.allToAllPaced(op, s)
	}
	if even && int(n*es) < t.directMin(op) && !t.allToAllRegistered(op, n*es) {
		// The equal-split all_to_all_single: every rank moves n elements to and
		// from every rank, so every rank knows the chunk count without asking.
		// (A rank whose splits differ asks; the others do not answer, and the
		// op fails at the group timeout, as an all_reduce of mismatched counts.)
		return t.allToAllChunks(op, s, n*es)
	}
	w := t.world
	le := binary.LittleEndian
	// the splits, then (direct.go) this rank's input region and pieces
	meta := make([]byte, 16*w+regionBytes+8*w)
	var inTotal, localMax uintptr
	for r := range w {
		in, out := uintptr(op.InPieces[r].Count)*es, uintptr(op.OutPieces[r].Count)*es
		le.PutUint64(meta[8*r:], uint64(op.InPieces[r].Count))
		le.PutUint64(meta[8*(w+r):], uint64(op.OutPieces[r].Count))
		le.PutUint64(meta[16*w+regionBytes+8*r:], uint64(op.InPieces[r].Addr))
		inTotal, localMax = inTotal+in, max(localMax, in, out)
	}
	// One side for the record and the negotiation: the record remembers this
	// rank's fresh memh, which the negotiation binds.
	sd := t.side()
	if w > 1 && inTotal > 0 {
		copy(meta[16*w:], t.allToAllRecord(sd, op, localMax))
	}
	all, err := agree(meta)
	if err != nil {
		return err
	}
	var longest uintptr
	skewed := false // the same on every rank: it reads every rank's splits
	for i, m := range all {
		if len(m) != len(meta) {
			return status.Errorf(status.Mismatch, "gosym: %s: rank %d sent %d bytes of split sizes, this rank %d (different group sizes?)",
				op.Who(), i, len(m), len(meta))
		}
		for j := range w {
			sends, expects := le.Uint64(m[8*j:]), le.Uint64(all[j][8*(w+i):])
			if sends != expects {
				return status.Errorf(status.Mismatch, "gosym: %s: rank %d sends %d elements to rank %d, which expects %d",
					op.Who(), i, sends, j, expects)
			}
			longest = max(longest, uintptr(sends)*es)
			skewed = skewed || sends != le.Uint64(all[0])
		}
	}
	if w > 1 {
		if done, err := t.allToAllDirect(sd, op, s, all, longest, t.allToAllDirectMin(op, skewed), agree); done || err != nil {
			return err
		}
	}
	return t.allToAllChunks(op, s, longest)
}

// pacedAllToAll says whether an eager all_to_all whose pieces have n bytes
// each (even: equal splits; else n means nothing) runs gs_a2av, from the
// settings alone (defer.go asks before the op runs): splits that differ
// wherever gs_a2av is on (GOSYM_GPU_A2AV_BLOCKS), on any inputs; equal
// splits from GOSYM_GPU_A2A_PACED_MIN bytes of input per rank (2×H200: the
// copy engines of the direct path move 325 GB/s each way where gs_a2av
// pushes 358). Not by whether this rank's input is registered: a rank that
// sends nothing has no input to find registered while its peers' are, and
// the ranks would part ways (the paced kernel here, the agreement there).
// The caller leaves out ops under graph capture: there the agreement's host
// round is paid once, at capture, and the replayed copies beat the paced
// kernel's pacing (2×H200, 10 per graph: 8.6 / 10.0 µs at 1 / 64 KiB,
// paced 12.3 / 12.6). Every rank captures the same ops (as for directMin).
func (t *Team) pacedAllToAll(n uintptr, even bool) bool {
	if t.cfg.a2avBlocks == 0 || t.world == 1 {
		return false
	}
	if !even {
		return true
	}
	in := int(n) * t.world
	return t.cfg.a2aPacedMin > 0 && in >= t.cfg.a2aPacedMin
}

// allToAllPaced runs an all_to_all as one gs_a2av launch: each pair of
// ranks moves its piece through the sender's staging region for the
// receiver, pacing itself through counters on the two pads.
func (t *Team) allToAllPaced(op *ops.Op, s cuda.Stream) error {
	f, err := t.function(cuda.A2AVKernel)
	if err != nil {
		return err
	}
	p := t.a2avParams(op)
	t.used = true
	t.counters.pacedA2A.Add(1)
	grid, block := cuda.A2AVGrid(t.world, int(p.NB), p.Send[t.rank])
	return t.g.d.Launch(f, grid, block, 0, s, &p)
}

// a2avParams is gs_a2av's parameter for op on this rank. Its shape (NB,
// SlotBytes, Region) comes from settings every rank shares.
func (t *Team) a2avParams(op *ops.Op) cuda.A2AVParams {
	es := uint64(op.DType.Size())
	nb := cuda.A2AVBlocksFor(t.world, t.cfg.a2avBlocks)
	region := cuda.A2AVRegion(t.stage, t.world)
	p := cuda.A2AVParams{Stages: t.stages, Pads: t.pads, Region: region,
		SlotBytes: cuda.A2AVSlotBytes(uintptr(region), nb, t.cfg.a2avSlot), TimeoutNs: t.timeoutNs,
		NB: int32(nb), World: int32(t.world), Rank: int32(t.rank)}
	if t.cfg.a2avPush {
		p.Push = 1
	}
	for q := range t.world {
		in, out := op.InPieces[q], op.OutPieces[q]
		p.Src[q], p.Send[q] = in.Addr, uint64(in.Count)*es
		p.Dst[q], p.Recv[q] = out.Addr, uint64(out.Count)*es
	}
	return p
}

// allToAllChunks runs all_to_all staged, in chunks of one region, for a
// longest piece (over all ranks) of longest bytes.
func (t *Team) allToAllChunks(op *ops.Op, s cuda.Stream, longest uintptr) error {
	es := uintptr(op.DType.Size())
	reg := t.region()
	return chunks(longest, reg, func(at, n uintptr) error {
		pre, segs := make([]copySeg, 0, t.world), make([]copySeg, 0, t.world)
		for _, j := range t.inTurn() {
			in, out := op.InPieces[j], op.OutPieces[j]
			if j == t.rank { // this rank's own piece moves locally, not through its staging
				segs = append(segs, copySeg{out.Addr + at, in.Addr + at, clip(uintptr(out.Count)*es, at, reg)})
				continue
			}
			pre = append(pre, t.staged(uintptr(j)*reg, in.Addr+at, clip(uintptr(in.Count)*es, at, reg)))
			segs = append(segs, copySeg{out.Addr + at, t.stages[j] + uintptr(t.rank)*reg, clip(uintptr(out.Count)*es, at, reg)})
		}
		// n (the longest piece's bytes in this chunk) is the same on every
		// rank: it picks the launch shape and kernel or copy engines.
		return t.move(pre, segs, n, s)
	})
}

// equalSplit is the count n every rank moves to and from every rank when
// the all_to_all op is equal-split by contract (ops.Op.EvenPieces). Only then
// may a rank pick a path without agreeing on the splits: every rank picks
// the same.
func equalSplit(op *ops.Op) (n uintptr, ok bool) {
	if !op.EvenPieces || len(op.InPieces) == 0 {
		return 0, false
	}
	return uintptr(op.InPieces[0].Count), true
}

// clip is how many of a piece's total bytes lie in [at, at+size).
func clip(total, at, size uintptr) uintptr {
	if total <= at {
		return 0
	}
	return min(total-at, size)
}

// barrier enqueues a barrier of all ranks on stream s.
func (t *Team) barrier(s cuda.Stream) error {
	f, err := t.function(cuda.BarrierKernel)
	if err != nil {
		return err
	}
	t.used = true
	p := cuda.BarrierParams{Pads: t.pads, TimeoutNs: t.timeoutNs, World: int32(t.world), Rank: int32(t.rank)}
	grid, block := cuda.BarrierGrid()
	return t.g.d.Launch(f, grid, block, 0, s, &p)
}
