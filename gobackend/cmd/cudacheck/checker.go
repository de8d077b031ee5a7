package main

import (
	"fmt"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/kernels"
)

// gpu is one device as the checker uses it: its primary context, streams
// (one per simulated rank), and the kernels loaded into that context.
type gpu struct {
	dev     cuda.Device
	ctx     cuda.Context
	streams []cuda.Stream
	mods    []*cuda.Module
	fns     map[string]*cuda.Function
}

// function is kernel k as loaded on g.
func (g *gpu) function(k *cuda.Kernel) (*cuda.Function, error) {
	if f := g.fns[k.Name]; f != nil {
		return f, nil
	}
	return nil, fmt.Errorf("kernel %s not loaded", k.Name)
}

// misalign is how far past 16-byte alignment a case's inputs and outputs
// start (after a guard) in the buffers of a step: even buffers are
// inputs, odd ones outputs.
type misalign struct{ srcMis, dstMis int }

// dataAt is where the data of buffer i starts in it.
func (m misalign) dataAt(i int) uintptr {
	if i%2 == 0 {
		return guardBytes + uintptr(m.srcMis)
	}
	return guardBytes + uintptr(m.dstMis)
}

type checker struct {
	d     *cuda.Driver
	nv    *cuda.NVRTC
	comp  *cuda.Compiler
	arch  int
	quick bool
	// dependent: every module's kernels launch as programmatic dependents
	dependent bool
	gpus      []*gpu
	// cleanups run in reverse order at close.
	cleanups []func() error
}

const simRanks = 4 // the most ranks simulated on one GPU

func (c *checker) onClose(f func() error) { c.cleanups = append(c.cleanups, f) }

func (c *checker) close() {
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		if err := c.cleanups[i](); err != nil {
			fmt.Println("cleanup:", err)
		}
	}
	c.cleanups = nil
}

func (c *checker) setup() int {
	var setupErr error
	record("compile every kernel source (NVRTC, cache)", func() error {
		setupErr = c.compileAll()
		return setupErr
	})
	if setupErr != nil {
		return 1
	}
	n := len(rep.Devices)
	for i := 0; i < n && i < 4; i++ { // four: cross-GPU runs of 3 and 4 ranks
		record(fmt.Sprintf("device %d: context, streams, modules, kernels", i), func() error {
			g, err := c.openGPU(i)
			if err == nil {
				c.gpus = append(c.gpus, g)
			}
			setupErr = err
			return err
		})
		if setupErr != nil {
			return 1
		}
	}
	return 0
}

func (c *checker) openGPU(ordinal int) (*gpu, error) {
	dev, err := c.d.Device(ordinal)
	if err != nil {
		return nil, err
	}
	ctx, err := c.d.RetainPrimaryContext(dev)
	if err != nil {
		return nil, err
	}
	c.onClose(func() error { return c.d.ReleasePrimaryContext(dev) })
	g := &gpu{dev: dev, ctx: ctx, fns: map[string]*cuda.Function{}}
	for i := 0; i < simRanks; i++ {
		s, err := c.d.StreamCreate(ctx, cuda.StreamNonBlocking)
		if err != nil {
			return nil, err
		}
		c.onClose(func() error { return c.d.StreamDestroy(ctx, s) })
		g.streams = append(g.streams, s)
	}
	for _, src := range kernels.Sources() {
		if src == cuda.NVLSSource {
			continue // loaded on its own, by nvlsLoadCase: a failure there must not stop the rest
		}
		m, err := c.d.LoadKernels(ctx, c.comp, c.arch, src)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", src, err)
		}
		c.onClose(m.Unload)
		m.SetDependentLaunch(c.dependent)
		g.mods = append(g.mods, m)
		for _, k := range cuda.KernelsIn(src) {
			f, err := m.Function(k)
			if err != nil {
				return nil, err
			}
			g.fns[k.Name] = f
			if ordinal == 0 {
				regs, _ := f.Attribute(cuda.FuncNumRegs)
				local, _ := f.Attribute(cuda.FuncLocalSizeBytes)
				rep.Kernels = append(rep.Kernels, kernelInfo{Name: k.Name, Regs: regs, Local: local})
				if local > 0 {
					fmt.Printf("note: %s uses %d bytes of local memory (spills)\n", k.Name, local)
				}
			}
		}
	}
	return g, nil
}

// ---- device memory helpers ------------------------------------------------------

// dbuf is a device allocation of its own (freed by free).
type dbuf struct {
	c    *checker
	ctx  cuda.Context
	ptr  uintptr
	size uintptr
}

func (c *checker) alloc(g *gpu, size uintptr) (*dbuf, error) {
	p, err := c.d.MemAlloc(g.ctx, max(size, 1))
	if err != nil {
		return nil, err
	}
	return &dbuf{c: c, ctx: g.ctx, ptr: p, size: size}, nil
}

func (b *dbuf) free() { _ = b.c.d.MemFree(b.ctx, b.ptr) }

// upload allocates a buffer of len(b) bytes on g holding b.
func (c *checker) upload(g *gpu, b []byte) (*dbuf, error) {
	d, err := c.alloc(g, uintptr(len(b)))
	if err != nil {
		return nil, err
	}
	if err := c.d.MemcpyHtoD(g.ctx, d.ptr, b); err != nil {
		d.free()
		return nil, err
	}
	return d, nil
}

// freeAll frees every buffer of sets that was allocated (nil entries are
// the ones a failed case never reached).
func freeAll(sets ...[]*dbuf) {
	for _, set := range sets {
		for _, b := range set {
			if b != nil {
				b.free()
			}
		}
	}
}

func (b *dbuf) fill(v byte) error {
	host := make([]byte, b.size)
	for i := range host {
		host[i] = v
	}
	return b.c.d.MemcpyHtoD(b.ctx, b.ptr, host)
}

func (b *dbuf) read(off, n uintptr) ([]byte, error) {
	out := make([]byte, n)
	return out, b.c.d.MemcpyDtoH(b.ctx, out, b.ptr+off)
}

// padSet is one signal pad per rank, zeroed once; its counters then grow
// across every launch that uses it, as in production. Its LL areas (made by
// llAreas) carry over with the LL counters; llSeq counts the LL launches of
// each block, what every rank's counters must say.
type padSet struct {
	bufs  []*dbuf
	ptrs  [cuda.MaxRanks]uintptr
	areas [cuda.MaxRanks]uintptr
	llSeq [cuda.LLBlocks]uint32
}

func (c *checker) newPads(g *gpu, world int) (*padSet, error) {
	ps := &padSet{}
	for r := 0; r < world; r++ {
		b, err := c.alloc(g, cuda.PadBytes)
		if err != nil {
			return nil, err
		}
		c.onClose(func() error { b.free(); return nil })
		if err := b.fill(0); err != nil {
			return nil, err
		}
		ps.bufs = append(ps.bufs, b)
		ps.ptrs[r] = b.ptr
	}
	return ps, nil
}

// errors reads every rank's error words; nil when all are clear.
func (ps *padSet) errors() error {
	for r, b := range ps.bufs {
		w, err := b.read(cuda.PadErrorWord*4, 12)
		if err != nil {
			return err
		}
		code, detail, missing := le32(w[0:]), le32(w[4:]), le32(w[8:])
		if code != 0 || missing != 0 {
			return fmt.Errorf("rank %d pad error: code=%d detail=%#x missing-ranks=%#x", r, code, detail, missing)
		}
	}
	return nil
}

// checkLLSeq compares every rank's LL launch counters with the LL
// launches counted (launchAll).
func (ps *padSet) checkLLSeq() error {
	for r, b := range ps.bufs {
		w, err := b.read(cuda.PadLLSeqWord*4, cuda.LLBlocks*4)
		if err != nil {
			return err
		}
		for blk, want := range ps.llSeq {
			if got := le32(w[4*blk:]); got != want {
				return fmt.Errorf("rank %d: LL launch counter of block %d is %d, want %d", r, blk, got, want)
			}
		}
	}
	return nil
}

// newLLAreas is an LL area per rank of a group of world ranks, zeroed (no
// line holds a flag), for launches of up to LLMaxBytes; freed at close.
func (c *checker) newLLAreas(g *gpu, world int) (areas [cuda.MaxRanks]uintptr, err error) {
	for r := 0; r < world; r++ {
		b, err := c.alloc(g, cuda.LLAreaBytes(world, cuda.LLMaxBytes))
		if err != nil {
			return areas, err
		}
		c.onClose(func() error { b.free(); return nil })
		if err := b.fill(0); err != nil {
			return areas, err
		}
		areas[r] = b.ptr
	}
	return areas, nil
}

// llAreas are the LL areas of pads' group, made on first use.
func (c *checker) llAreas(g *gpu, ps *padSet) ([cuda.MaxRanks]uintptr, error) {
	if ps.areas[0] == 0 {
		areas, err := c.newLLAreas(g, len(ps.bufs))
		if err != nil {
			return areas, err
		}
		ps.areas = areas
	}
	return ps.areas, nil
}

// launchAll launches fn on every rank's stream of g, with param(r); an LL
// launch (ll: gs_ll or gs_llmove) is counted on every block it has.
func (c *checker) launchAll(g *gpu, pads *padSet, fn *cuda.Function, ll bool, grid, block cuda.Dim3,
	param func(r int) cuda.Param) error {
	for r := range pads.bufs {
		if err := c.d.Launch(fn, grid, block, 0, g.streams[r], param(r)); err != nil {
			return err
		}
	}
	for b := 0; ll && b < int(grid.X); b++ {
		pads.llSeq[b]++
	}
	return nil
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func (c *checker) syncAll(g *gpu, world int) error {
	for r := 0; r < world; r++ {
		if err := c.d.StreamSynchronize(g.ctx, g.streams[r]); err != nil {
			return err
		}
	}
	return nil
}
