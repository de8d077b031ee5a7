package gpu

// The group's symmetric GPU buffers: this rank's control and data
// allocations and every peer's, mapped here, and their teardown.

import (
	"fmt"
	"time"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
)

// helloMagic marks a rank's announcement of its GPU buffer (its size,
// with its fd).
const helloMagic = 0x50475347 // "GSGP"

// Team is one rank's view of a group's GPU buffers: its own (exported)
// and every peer's (imported), each mapped at an address of this process.
// Control (the signal pads the kernels' barriers and semaphores write) and
// data (the staging) are separate allocations, so that nothing that moves
// data can ever reach a pad, and a multicast object covers data alone.
type Team struct {
	g           *Device
	cfg         Config
	rank, world int
	ctrl, data  symmBuf
	stage       uintptr // bytes of staging, a multiple of 16
	llArea      uintptr // bytes of the LL area after the staging (0: none; ops.go, llReduce)
	timeoutNs   uint64
	pads        [cuda.MaxRanks]uintptr
	stages      [cuda.MaxRanks]uintptr
	fns         map[*cuda.Kernel]*cuda.Function // this team's lookups, unlocked
	// The LL launches' parameters, kept: a parameter handed to Launch
	// escapes (an interface), and the small ops would allocate one each.
	// An allocation of its own (cgo's check refuses a pointer into memory
	// that holds Go pointers); the team runs one op at a time.
	ll        *llParams
	used      bool      // kernels were enqueued: close must wait for them
	reg       *registry // bindings and peer mappings (reg.go, direct.go)
	counters  *Counters
	algos     *algoStats
	capturing bool            // the current op's stream is being captured (a CUDA graph)
	deadline  time.Time       // the current op's
	swapFD    swapFunc        // the fd exchange over the links, by deadline (direct.go)
	nvls      *cuda.McBinding // a multicast object over every rank's buffer, or nil (nvls.go)
	order     streamOrder     // the last op's stream and end event (order.go)
	ce        ceSide          // the second copy stream (overlap.go)
	df        deferral        // the internal stream and flag of deferred ops (defer.go)

	errw *cuda.ErrorWords // where this rank's kernels copy their errors (deverr.go)
}

// symmBuf is one symmetric allocation of a group: a buffer of size bytes on
// every rank, each mapped here.
type symmBuf struct {
	name string
	size uintptr
	bufs []bufMapping // by rank
}

// symms lists the team's allocations, in the order setup shares them.
func (t *Team) symms() []*symmBuf { return []*symmBuf{&t.ctrl, &t.data} }

// bufMapping is one rank's buffer as mapped here; each field records a step
// to undo.
type bufMapping struct {
	h      cuda.AllocHandle
	held   bool
	va     uintptr
	mapped bool
}

// newTeam allocates and maps this rank's buffer and loads the kernels.
// On error the team is still returned, for close.
func newTeam(device, rank, world int, cfg Config, timeout time.Duration) (*Team, error) {
	t := &Team{cfg: cfg, rank: rank, world: world, timeoutNs: uint64(timeout.Nanoseconds()),
		ctrl: symmBuf{name: "control", bufs: make([]bufMapping, world)},
		data: symmBuf{name: "data", bufs: make([]bufMapping, world)},
		fns:  map[*cuda.Kernel]*cuda.Function{}, ll: new(llParams)}
	g, err := Open(device)
	if err != nil {
		return t, err
	}
	t.g = g
	round := func(n uintptr) uintptr { return (n + g.gran - 1) / g.gran * g.gran }
	t.ctrl.size = round(cuda.PadBytes)
	t.stage = round(uintptr(max(cfg.stageBytes, 64<<10)))
	if cfg.llMax > 0 && world > 1 {
		t.llArea = cuda.LLAreaBytes(world, cfg.llMax)
	}
	t.data.size = round(t.stage + t.llArea)
	t.cfg.a2avBlocks = min(cfg.a2avKnob.at(world, g.arch, 0), cuda.A2AVBlocks)
	if t.cfg.a2avBlocks > 0 && world > 1 {
		f, err := t.function(cuda.A2AVKernel)
		if err != nil {
			return t, err
		}
		if t.cfg.a2avBlocks, err = a2avResident(t.cfg.a2avBlocks, world, g.d.ResidentBlocks(g.dev, f, cuda.BlockThreads)); err != nil {
			return t, err
		}
		t.cfg.a2aPacedMin = cfg.a2aPacedKnob.at(world, g.arch, 0)
	}
	for _, sy := range t.symms() {
		own := &sy.bufs[rank]
		if own.h, err = g.d.MemCreate(g.ctx, g.dev, sy.size, cuda.HandleTypePosixFD); err != nil {
			return t, err
		}
		own.held = true
		if err = t.mapBuf(sy, rank); err != nil {
			return t, err
		}
	}
	t.errw, err = cuda.NewErrorWords(g.d, g.ctx)
	return t, err
}

// mapBuf maps rank r's buffer of sy (its handle already held) for this
// device.
func (t *Team) mapBuf(sy *symmBuf, r int) error {
	g, b := t.g, &sy.bufs[r]
	var err error
	if b.va, err = g.d.MemAddressReserve(g.ctx, sy.size, g.gran); err != nil {
		return err
	}
	if err = g.d.MemMap(g.ctx, b.va, sy.size, b.h); err != nil {
		return err
	}
	b.mapped = true
	if err = g.d.MemSetAccess(g.ctx, b.va, sy.size, []cuda.Device{g.dev}); err != nil {
		return err
	}
	if sy == &t.ctrl {
		t.pads[r] = b.va
	} else {
		t.stages[r] = b.va
	}
	return nil
}

// exportFD returns a POSIX fd for this rank's buffer of sy, owned by the
// caller.
func (t *Team) exportFD(sy *symmBuf) (int, error) {
	return t.g.d.MemExportFD(t.g.ctx, sy.bufs[t.rank].h)
}

// importPeer maps rank r's buffer of sy from the fd it sent (the caller
// closes fd).
func (t *Team) importPeer(sy *symmBuf, r, fd int) error {
	h, err := t.g.d.MemImportFD(t.g.ctx, fd)
	if err != nil {
		return fmt.Errorf("import rank %d's GPU %s buffer: %w", r, sy.name, err)
	}
	sy.bufs[r].h, sy.bufs[r].held = h, true
	if err := t.mapBuf(sy, r); err != nil {
		return fmt.Errorf("map rank %d's GPU %s buffer: %w", r, sy.name, err)
	}
	return nil
}

// zeroPad clears this rank's signal pad before any peer may write to it:
// the barrier counters start at zero and only grow afterwards (so replayed
// CUDA graphs stay in step).
func (t *Team) zeroPad() error {
	g := t.g
	return g.privately(func(s cuda.Stream) error {
		if err := g.d.MemsetD32Async(g.ctx, t.pads[t.rank], 0, t.ctrl.size/4, s); err != nil {
			return err
		}
		// The LL area too: its lines' flags start below every launch's flag.
		if t.llArea > 0 {
			if err := g.d.MemsetD32Async(g.ctx, t.stages[t.rank]+t.stage, 0, t.llArea/4, s); err != nil {
				return err
			}
		}
		// The pad names the host error block (two words, low first).
		at, hp := t.pads[t.rank]+4*cuda.PadHostErrorWord, uint64(t.errw.Device())
		for i, v := range []uint32{uint32(hp), uint32(hp >> 32)} {
			if err := g.d.MemsetD32Async(g.ctx, at+uintptr(4*i), v, 1, s); err != nil {
				return err
			}
		}
		return nil
	})
}

func (t *Team) function(k *cuda.Kernel) (*cuda.Function, error) {
	if f := t.fns[k]; f != nil {
		return f, nil
	}
	f, err := t.g.Function(k)
	if err == nil {
		t.fns[k] = f
	}
	return f, err
}

// close waits until the device is idle (kernels on the caller's streams
// may still read these buffers), then unmaps and releases everything. A
// device still busy after wait (a kernel that no abort reached) keeps the
// buffers: they stay mapped, with a warning, rather than be freed under a
// kernel that may still touch them.
func (t *Team) close(wait time.Duration) {
	g := t.g
	if g == nil {
		return
	}
	if t.used && !g.idle(wait, fmt.Sprintf("rank %d, unmapping its group's GPU buffers", t.rank)) {
		return
	}
	if t.nvls != nil { // the multicast object goes before the buffers it covers
		if err := t.nvls.Close(); err != nil {
			dlog.Printf("rank %d: releasing the multicast object: %v", t.rank, err)
		}
		t.nvls = nil
	}
	t.closeIPC()
	t.order.close(g)
	t.ce.close(g)
	t.df.close(g)
	if err := t.errw.Close(); err != nil {
		dlog.Printf("rank %d: freeing the host error block: %v", t.rank, err)
	}
	t.errw = nil
	for _, sy := range t.symms() {
		for r := range sy.bufs {
			b := &sy.bufs[r]
			if b.mapped {
				g.d.MemUnmap(g.ctx, b.va, sy.size)
			}
			if b.va != 0 {
				g.d.MemAddressFree(g.ctx, b.va, sy.size)
			}
			if b.held {
				g.d.MemRelease(g.ctx, b.h)
			}
			*b = bufMapping{}
		}
	}
}
