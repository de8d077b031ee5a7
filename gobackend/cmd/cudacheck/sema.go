package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// Issue #6 on the device: the NVLS kernels are loaded and looked up (never
// launched: there is no multicast object, and there must not be one), and
// the semaphore protocol runs for real with the unicast pull kernel.

// nvlsLoadCase loads nvls.cu into g's context and looks up every NVLS
// kernel.
func (c *checker) nvlsLoadCase(g *gpu, ordinal int) error {
	if c.arch < 90 {
		return errSkip
	}
	m, err := c.d.LoadKernels(g.ctx, c.comp, c.arch, cuda.NVLSSource)
	if err != nil {
		return err
	}
	defer m.Unload()
	ks := cuda.KernelsIn(cuda.NVLSSource)
	if len(ks) == 0 {
		return fmt.Errorf("no NVLS kernel in the table")
	}
	for _, k := range ks {
		f, err := m.Function(k)
		if err != nil {
			return err
		}
		if ordinal == 0 {
			regs, _ := f.Attribute(cuda.FuncNumRegs)
			local, _ := f.Attribute(cuda.FuncLocalSizeBytes)
			mu.Lock()
			rep.Kernels = append(rep.Kernels, kernelInfo{Name: k.Name, Regs: regs, Local: local})
			mu.Unlock()
		}
	}
	return nil
}

// semaTimeoutCase: rank 1 never signals; gs_sema_wait on rank 0 gives up
// after 5 ms and names rank 1 and the semaphore in the pad's error words.
func (c *checker) semaTimeoutCase(g *gpu) error {
	grid, block := cuda.SemaWaitGrid()
	return c.expectTimeout(g, cuda.SemaWaitKernel, grid, block, func(pads *padSet) cuda.Param {
		return &cuda.SemaParams{Pad: pads.ptrs[0], TimeoutNs: 5_000_000, Word: cuda.PadSemaDoneWord, Mask: 2}
	}, cuda.PadSemaDoneWord<<8|1)
}

// semaStageBytes is the staging per round in these cases: small enough
// that 4M+3 elements take many rounds back to back (with -quick, which
// skips that size, 1023 and 1025 elements take several).
func (c *checker) semaStageBytes() uintptr {
	if c.quick {
		return 1 << 10
	}
	return 1 << 20
}

// semaRanks builds rank r's cuda.Sema on GPU r over the VMM buffers of
// crossGPU: data[r] is rank r's staging, pads its signal pad.
func (c *checker) semaRanks(gs []*gpu, data []*vmem, pads *padSet, memop bool) []*cuda.Sema {
	ms := make([]*cuda.Sema, len(gs))
	for r, g := range gs {
		ms[r] = &cuda.Sema{D: c.d, Ctx: g.ctx, Rank: r, World: len(gs), Pads: pads.ptrs,
			StageBytes: c.semaStageBytes(), TimeoutNs: timeoutNs, MemopWait: memop,
			Function: g.function}
		for q := range gs {
			ms[r].Stages[q] = data[q].va
		}
	}
	return ms
}

func waitName(memop bool) string {
	if memop {
		return "memop waits"
	}
	return "kernel waits"
}

type semaCase struct {
	dt    dtype.DType
	numel int
	root  int // negative: all_reduce
	memop bool
	world int // GPUs; 0: 2
}

func (k semaCase) String() string {
	op := "all_reduce"
	if k.root >= 0 {
		op = fmt.Sprintf("reduce root=%d", k.root)
	}
	return fmt.Sprintf("%d GPUs sema-unicast %s %s sum n=%d (%s)", max(k.world, 2), op, k.dt, k.numel, waitName(k.memop))
}

// settle waits for stream 0 of every GPU and checks the pads for errors
// (and, with semas, that every semaphore was consumed).
func (c *checker) settle(gs []*gpu, pads *padSet, semas bool) error {
	for _, g := range gs {
		if err := c.d.StreamSynchronize(g.ctx, g.streams[0]); err != nil {
			return err
		}
	}
	if err := pads.errors(); err != nil || !semas {
		return err
	}
	return semaSemaphoresClear(pads)
}

// semaSemaphoresClear checks that every semaphore is back to 0 on every pad.
func semaSemaphoresClear(pads *padSet) error {
	for r, b := range pads.bufs {
		w, err := b.read(cuda.PadSemaReadyWord*4, 2*cuda.MaxRanks*4)
		if err != nil {
			return err
		}
		for i := 0; i < len(w); i += 4 {
			if v := le32(w[i:]); v != 0 {
				return fmt.Errorf("rank %d: semaphore word %d is %d after the op", r, cuda.PadSemaReadyWord+i/4, v)
			}
		}
	}
	return nil
}

// runSema runs one op on both GPUs and checks every rank: the result
// against a float64 reference (all_reduce: identical bits on both), guards
// around the outputs, inputs unchanged everywhere (non-roots included),
// pads free of errors and semaphores consumed.
func (c *checker) runSema(gs []*gpu, data []*vmem, pads *padSet, k semaCase) error {
	es := uintptr(k.dt.Size())
	n := uintptr(k.numel) * es
	rng := rand.New(rand.NewPCG(seedOf(k.String()), 11))
	ms := c.semaRanks(gs, data, pads, k.memop)
	inputs := make([][]byte, len(gs))
	ins, outs := make([]*dbuf, len(gs)), make([]*dbuf, len(gs))
	defer freeAll(ins, outs)
	var err error
	for r, g := range gs {
		inputs[r] = genData(rng, k.dt, dtype.Sum, k.numel)
		if ins[r], err = c.alloc(g, n+guardBytes); err != nil {
			return err
		}
		if outs[r], err = c.alloc(g, n+guardBytes); err != nil {
			return err
		}
		for _, b := range []*dbuf{ins[r], outs[r]} {
			if err := b.fill(0xab); err != nil {
				return err
			}
		}
		if err := c.d.MemcpyHtoD(g.ctx, ins[r].ptr, inputs[r]); err != nil {
			return err
		}
	}
	for r, g := range gs {
		o := cuda.SemaOp{In: ins[r].ptr, Out: outs[r].ptr, Count: k.numel, DType: k.dt, Op: dtype.Sum, Scale: 1,
			Root: k.root}
		if k.root >= 0 && r != k.root {
			o.Out = 0 // a non-root has no output
		}
		if err := ms[r].Reduce(g.streams[0], o); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if err := c.settle(gs, pads, true); err != nil {
		return err
	}
	var results [][]byte
	for r := range gs {
		in, err := ins[r].read(0, ins[r].size)
		if err != nil {
			return err
		}
		if string(in[:n]) != string(inputs[r]) || !allBytes(in[n:], 0xab) {
			return fmt.Errorf("rank %d: its input changed", r)
		}
		out, err := outs[r].read(0, outs[r].size)
		if err != nil {
			return err
		}
		if k.root >= 0 && r != k.root {
			if !allBytes(out, 0xab) {
				return fmt.Errorf("rank %d (not the root) got output", r)
			}
			continue
		}
		if !allBytes(out[n:], 0xab) {
			return fmt.Errorf("rank %d: bytes past the output were written", r)
		}
		results = append(results, out[:n])
	}
	for _, res := range results[1:] {
		if string(res) != string(results[0]) {
			return fmt.Errorf("the two GPUs got different bits")
		}
	}
	return checkResult(arCase{dt: k.dt, op: dtype.Sum, world: len(gs), numel: k.numel}, inputs, 0, results[0], 1)
}

func allBytes(b []byte, v byte) bool {
	for _, x := range b {
		if x != v {
			return false
		}
	}
	return true
}

// semaBackToBack enqueues ops all_reduce / reduce(0) / reduce(1) ops in
// turn, with no host synchronisation, on inputs the streams themselves
// fill with values unique to (op, rank), in a random rank order per op and
// with occasional large memsets on one GPU to make the GPUs drift apart.
// After each op the stream copies the first and the last element of every
// output that op produced to a record; every record must be the sum of
// that op's inputs. A round that read a peer's staging of another op, or
// ran before a peer staged, breaks a record.
func (c *checker) semaBackToBack(gs []*gpu, data []*vmem, pads *padSet, ops int, memop bool) error {
	const n = 1023
	ms := c.semaRanks(gs, data, pads, memop)
	rng := rand.New(rand.NewPCG(uint64(ops), 13))
	var bufs []*dbuf
	defer func() { freeAll(bufs) }() // bufs grows below
	alloc := func(g *gpu, size uintptr, fill byte) (*dbuf, error) {
		b, err := c.alloc(g, size)
		if err == nil {
			bufs = append(bufs, b)
			err = b.fill(fill)
		}
		return b, err
	}
	ins, outs, recs, delays := make([]*dbuf, 2), make([]*dbuf, 2), make([]*dbuf, 2), make([]*dbuf, 2)
	var err error
	for r, g := range gs {
		if ins[r], err = alloc(g, n*4, 0); err != nil {
			return err
		}
		if outs[r], err = alloc(g, n*4, 0); err != nil {
			return err
		}
		if recs[r], err = alloc(g, uintptr(ops)*8, 0xff); err != nil {
			return err
		}
		delaySize := uintptr(64 << 20)
		if c.quick {
			delaySize = 64 << 10
		}
		if delays[r], err = alloc(g, delaySize, 0); err != nil {
			return err
		}
	}
	value := func(i, r int) float32 { return float32(1 + (i*7+r*3)%1000) }
	roots := []int{-1, 0, 1}
	for i := 0; i < ops; i++ {
		root := roots[i%3]
		for _, r := range rng.Perm(2) {
			g, s := gs[r], gs[r].streams[0]
			if rng.IntN(50) == 0 {
				if err := c.d.MemsetD32Async(g.ctx, delays[r].ptr, uint32(i), delays[r].size/4, s); err != nil {
					return err
				}
			}
			if err := c.d.MemsetD32Async(g.ctx, ins[r].ptr, math.Float32bits(value(i, r)), n, s); err != nil {
				return err
			}
			o := cuda.SemaOp{In: ins[r].ptr, Out: outs[r].ptr, Count: n, DType: dtype.Float32, Op: dtype.Sum,
				Scale: 1, Root: root}
			if err := ms[r].Reduce(s, o); err != nil {
				return fmt.Errorf("op %d rank %d: %w", i, r, err)
			}
			if root >= 0 && root != r {
				continue
			}
			rec := recs[r].ptr + uintptr(i)*8
			if err := c.d.MemcpyDtoDAsync(g.ctx, rec, outs[r].ptr, 4, s); err != nil {
				return err
			}
			if err := c.d.MemcpyDtoDAsync(g.ctx, rec+4, outs[r].ptr+4*(n-1), 4, s); err != nil {
				return err
			}
		}
	}
	if err := c.settle(gs, pads, true); err != nil {
		return err
	}
	bad, first := 0, ""
	for r := range gs {
		got, err := recs[r].read(0, recs[r].size)
		if err != nil {
			return err
		}
		for i := 0; i < ops; i++ {
			if root := roots[i%3]; root >= 0 && root != r {
				continue
			}
			want := value(i, 0) + value(i, 1)
			for _, w := range []uint32{binary.LittleEndian.Uint32(got[8*i:]), binary.LittleEndian.Uint32(got[8*i+4:])} {
				if math.Float32frombits(w) != want {
					if bad++; first == "" {
						first = fmt.Sprintf("op %d rank %d: got %g, want %g", i, r, math.Float32frombits(w), want)
					}
				}
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d wrong records; first %s", bad, first)
	}
	return nil
}

// semaCases is issue #6's matrix on two GPUs, with both kinds of waits,
// then the pull kernel of other types, and every GPU of gs at once.
func (c *checker) semaCases(all []*gpu, data []*vmem, pads *padSet) {
	gs := all[:2]
	for _, memop := range []bool{false, true} {
		for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
			for _, n := range []int{1, 3, 5, 1023, 1025, big} {
				for _, root := range []int{-1, 1} {
					k := semaCase{dt: dt, numel: n, root: root, memop: memop}
					record(k.String(), func() error {
						if c.quick && n > 1<<20 {
							return errSkip
						}
						return c.runSema(gs, data, pads, k)
					})
				}
			}
		}
		ops := 10000
		if c.quick {
			ops = 300
		}
		record(fmt.Sprintf("2 GPUs sema-unicast %d back-to-back all_reduce/reduce ops, no host sync (%s)", ops,
			waitName(memop)), func() error { return c.semaBackToBack(gs, data, pads, ops, memop) })
	}
	for _, dt := range []dtype.DType{dtype.Float64, dtype.Int8, dtype.Float8E4M3} {
		for _, root := range []int{-1, 1} {
			k := semaCase{dt: dt, numel: 1025, root: root, world: 2}
			record(k.String(), func() error { return c.runSema(gs, data, pads, k) })
		}
	}
	if len(all) > 2 {
		for _, dt := range []dtype.DType{dtype.Float32, dtype.Float64} {
			for _, root := range []int{-1, len(all) - 1} {
				k := semaCase{dt: dt, numel: 1025, root: root, world: len(all)}
				record(k.String(), func() error { return c.runSema(all, data, pads, k) })
			}
		}
	}
}
