// Package gpu is the CUDA data plane of an endpoint: setup, devices and the
// group's symmetric GPU buffers (here), the collectives (ops.go, direct.go,
// sema.go), registered memory (reg.go, pages.go, mem.go) and the order of
// ops across streams (order.go). It reaches its endpoint only through Group
// and Peers (plane.go); all ops are stream-ordered on the caller's stream.
package gpu

//
// The first CUDA op of a group sets it up on every rank (collectives run in
// the same order everywhere, so every rank reaches that op): each rank
// allocates two VMM buffers, control (its signal pad) and data (staging),
// sends their POSIX fds to every peer over the authenticated links and maps
// theirs; a host barrier then confirms that every rank succeeded. If one did not, every rank fails
// CUDA ops on that group with the same NotSupported error from then on, and
// the host data plane keeps working.
//
// An op only enqueues work on the caller's stream (ops.go). The
// host never waits for the GPU, so the Work completes as soon as the work is
// enqueued and the stream carries the ordering, as with NCCL; the same
// enqueue sequence is what a CUDA graph captures.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Args says where a posted CUDA op runs.
type Args struct {
	Device    int         // CUDA device ordinal
	Stream    cuda.Stream // the caller's stream
	Capturing bool        // the caller says the stream is being captured (Run also asks the driver)
	// Task, when set, runs instead of an op: group-wide setup that must
	// happen in collective order (contiguous views).
	Task func(who symm.Who, deadline time.Time) error
}

// State is an endpoint's CUDA side. CUDA ops go through the collective
// queue like every collective (they share its sequence numbers); their
// device and stream wait in pending, by sequence number, until they run.
type State struct {
	mu       sync.Mutex
	pending  map[uint64]Args
	npending atomic.Int32

	// Used only by whoever runs the collective queue, and by Destroy after
	// the workers stopped.
	team *Team
	err  error // why the data plane could not start on this group, or a kernel's error (sticky)
	// errw is team.errw for readers off the queue (stats, DeviceError),
	// under mu: close takes it away before freeing it.
	errw *cuda.ErrorWords

	ops      atomic.Int64
	seq      atomic.Uint64 // the latest op's sequence number (a peer's refusal names it by its low bits)
	captured atomic.Int64  // ops enqueued while their stream was being captured (a CUDA graph)
	joins    atomic.Int64  // ops that waited for the group's previous op on another stream (order.go)
	device   atomic.Int32  // ordinal + 1 once set up, for stats
	stage    atomic.Int64
	counters Counters
	algos    algoStats   // which reduction algorithm ran (sema.go)
	nvls     atomic.Bool // a multicast object is bound over the group's buffers
	reg      registry    // bindings of registered CUDA memory, peer mappings (reg.go)
}

// Counters count what the data plane did, for the endpoint's stats.
type Counters struct {
	directOps atomic.Int64 // ops that ran on the peers' own buffers (direct.go)
	ipcOpens  atomic.Int64 // peer allocations mapped (cache misses)
	ipcHits   atomic.Int64 // peer allocations found mapped
	llMoves   atomic.Int64 // data movement by one gs_llmove launch (ops.go, llMove)
	pacedA2A  atomic.Int64 // all_to_all by one gs_a2av launch (ops.go, allToAllPaced)
}

// Park keeps a's op (collective seq) until the queue runs it (Take).
func (g *State) Park(seq uint64, a Args) {
	g.mu.Lock()
	if g.pending == nil {
		g.pending = map[uint64]Args{}
	}
	g.pending[seq] = a
	g.mu.Unlock()
	g.npending.Add(1)
}

// Take returns (and forgets) the CUDA arguments of collective seq, if it
// is a CUDA op. Host ops pay one atomic load.
func (g *State) Take(seq uint64) (Args, bool) {
	if g.npending.Load() == 0 {
		return Args{}, false
	}
	g.mu.Lock()
	a, ok := g.pending[seq]
	if ok {
		delete(g.pending, seq)
	}
	g.mu.Unlock()
	if ok {
		g.npending.Add(-1)
	}
	return a, ok
}

// Close frees the group's GPU buffers once the device is idle.
func (g *State) Close() {
	g.mu.Lock()
	g.errw = nil
	g.mu.Unlock()
	if g.team != nil {
		g.team.close()
		g.team = nil
	}
}

// Ordinal is the device of the group's CUDA ops on this rank, -1 before
// the first.
func (g *State) Ordinal() int { return int(g.device.Load()) - 1 }

// Err is why the plane cannot run the group's CUDA ops (setup refused, a
// kernel's error), nil while it can.
func (g *State) Err() error { return g.err }

// ClaimOrdinal records device d as the group's on this rank unless one is
// (a p2p channel opened before any collective).
func (g *State) ClaimOrdinal(d int) { g.device.CompareAndSwap(0, int32(d)+1) }

// Stats adds the plane's counters to m.
func (g *State) Stats(m map[string]any) {
	m["gpu_ops"] = g.ops.Load()
	m["gpu_captured_ops"] = g.captured.Load()
	m["gpu_stream_joins"] = g.joins.Load()
	m["gpu_device"] = int(g.device.Load()) - 1
	m["gpu_stage_bytes"] = g.stage.Load()
	m["gpu_direct_ops"] = g.counters.directOps.Load()
	m["gpu_ipc_opens"] = g.counters.ipcOpens.Load()
	m["gpu_ipc_hits"] = g.counters.ipcHits.Load()
	m["gpu_ll_moves"] = g.counters.llMoves.Load()
	m["gpu_paced_all_to_all"] = g.counters.pacedA2A.Load()
	m["gpu_nvls"] = g.nvls.Load()
	m["gpu_device_error"] = g.deviceErrorCode()
	g.algos.stats(m)
	g.reg.stats(m)
}

// Config holds the CUDA data plane's tunables, read when a group sets
// it up. Every rank must read the same values: they decide launch shapes.
type Config struct {
	stageBytes int // GOSYM_GPU_STAGE_BYTES: one rank's staging; larger ops run in chunks
	twoShotMin int // GOSYM_GPU_TWOSHOT_MIN: chunks of at least this many bytes run two-shot
	bigBlocks  int // GOSYM_GPU_BLOCKS: block limit of chunks of at least twoShotMin bytes (bandwidth-bound)
	ceMin      int // GOSYM_GPU_CE_MIN: data-movement chunks of at least this many bytes use the copy engines
	copyBlocks int // GOSYM_GPU_COPY_BLOCKS: block limit of gs_copy (chunks below ceMin)
	// GOSYM_GPU_DIRECT_CE_MIN: data movement on the direct path uses the
	// copy engines from this many bytes, gs_copy with bigBlocks below
	directCEMin int
	directMin   int // GOSYM_GPU_DIRECT_MIN: ops of at least this many bytes per rank use the peers' buffers
	// GOSYM_GPU_MOVE_DIRECT_MIN: the same for broadcast and all_gather,
	// which read one buffer per peer and save a whole staging copy
	moveDirectMin int
	// GOSYM_GPU_A2AV_DIRECT_MIN: the same for all_to_all whose splits
	// differ, which agrees on them on the host anyway, so reading in
	// place costs it one round less than it costs the others
	a2avDirectMin int
	// GOSYM_GPU_CAPTURE_DIRECT_MIN: the same for all_reduce and
	// reduce_scatter while the stream is captured into a CUDA graph
	captureDirectMin int
	regMin           int // GOSYM_GPU_REG_DIRECT_MIN: directMin for ops on registered (mem_map'ed) buffers
	semaMin          int // GOSYM_GPU_SEMA_MIN: reductions of at least this many bytes use the semaphore protocol
	fuseMax          int // GOSYM_GPU_FUSE_MAX: one-shot chunks of at most this many bytes stage inside the kernel, outside graph capture
	llMax            int // GOSYM_GPU_LL_MAX: all_reduce of at most this many bytes runs the LL kernel (0: never)
	// GOSYM_GPU_A2AV_BLOCKS: blocks per pair and direction of gs_a2av, the
	// all_to_all of splits that differ between ranks with no host round
	// (0, the default: agree on the splits on the host, which reads large
	// pieces in place and is faster from 16 MiB); GOSYM_GPU_A2AV_SLOT_BYTES:
	// its slot. Checked equal on every rank at setup (a pair's chunks depend
	// on both).
	a2avBlocks, a2avSlot int
}

func ConfigFromEnv() Config {
	return Config{
		stageBytes: config.GPUStageBytes.Get(),
		twoShotMin: config.GPUTwoShotMin.Get(),
		bigBlocks:  config.GPUBlocks.Or(cuda.MaxBlocks),
		ceMin:      config.GPUCEMin.Get(),
		copyBlocks: config.GPUCopyBlocks.Get(),
		// Measured on 2×H200 (docs/DECISIONS.md):
		// gs_copy wins at 16 MiB, the copy engines from 64 MiB.
		directCEMin: config.GPUDirectCEMin.Get(),
		directMin:   config.GPUDirectMin.Get(),
		// Measured on 2×H200: direct wins at 4 MiB (docs/DECISIONS.md).
		moveDirectMin: config.GPUMoveDirectMin.Get(),
		// Measured on 2×H200: direct wins from 4 MiB, not at 1 MiB
		// (docs/DECISIONS.md).
		a2avDirectMin: config.GPUA2AVDirectMin.Get(),
		// Measured on 2×H200: see docs/DECISIONS.md.
		captureDirectMin: config.GPUCaptureDirectMin.Get(),
		regMin:           config.GPURegDirectMin.Get(),
		semaMin:          config.GPUSemaMin.Get(),
		fuseMax:          config.GPUFuseMax.Get(),
		// Measured on 2×H200: LL wins to 256 KiB (docs/DECISIONS.md).
		llMax: min(config.GPULLMax.Get(), cuda.LLMaxBytes),
		// Off: measured on 2×H200, see docs/DECISIONS.md.
		a2avBlocks: min(config.GPUA2AVBlocks.Get(), cuda.A2AVBlocks),
		a2avSlot:   config.GPUA2AVSlotBytes.Get(),
	}
}

// shared is what of cfg every rank of a group must have the same, as
// setup announces it: gs_a2av's shape (its pairs pace each other).
func (c Config) shared() []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, uint64(c.a2avBlocks))
	binary.LittleEndian.PutUint64(b[8:], uint64(c.a2avSlot))
	return b
}

// sharedMismatch explains a peer's announcement of shared() that differs
// from this rank's.
func (c Config) sharedMismatch(r int, theirs []byte) error {
	if len(theirs) == 16 && string(theirs) == string(c.shared()) {
		return nil
	}
	if len(theirs) != 16 {
		return fmt.Errorf("rank %d announced %d bytes of settings, this rank 16 (another gosym version?)", r, len(theirs))
	}
	le := binary.LittleEndian
	return fmt.Errorf("rank %d runs GOSYM_GPU_A2AV_BLOCKS=%d and GOSYM_GPU_A2AV_SLOT_BYTES=%d, this rank %d and %d (every rank must use the same; the blocks are capped by what each GPU holds resident)",
		r, le.Uint64(theirs), le.Uint64(theirs[8:]), c.a2avBlocks, c.a2avSlot)
}

// a2avResident is the blocks per pair of gs_a2av for a wish of want, in
// a group of world ranks, on a GPU that holds resident blocks of it at
// once: a pair block waits for its peer's, so every pair block of a
// launch must be resident, or the launch waits out the group's timeout.
// (A GPU of another model on another rank may hold fewer: setup's
// announcement of shared() then fails, naming the rank.)
func a2avResident(want, world, resident int) (int, error) {
	fit := resident / (2 * (world - 1))
	if fit < 1 {
		return 0, fmt.Errorf("gosym: the paced all_to_all (GOSYM_GPU_A2AV_BLOCKS) needs at least %d blocks of %d threads resident at once for %d ranks; this GPU holds %d: unset GOSYM_GPU_A2AV_BLOCKS",
			2*(world-1), cuda.BlockThreads, world, resident)
	}
	return min(want, fit), nil
}

// helloMagic marks a rank's announcement of its GPU buffer (its size,
// with its fd).
const helloMagic = 0x50475347 // "GSGP"

// ---- devices (process-wide) -----------------------------------------------------

// Device is one CUDA device of this process: torch's primary context
// (retained for the life of the process) and the compiled kernels, shared
// by every group on the device.
type Device struct {
	d       *cuda.Driver
	ordinal int
	dev     cuda.Device
	ctx     cuda.Context
	arch    int
	gran    uintptr
	memops  bool // the driver has the stream memory operations (the semaphore protocol)

	mu   sync.Mutex
	mods map[string]*kernelModule
}

// kernelModule is one kernels/*.cu source, compiled once per process (NVRTC,
// cached on disk) and loaded once per device.
type kernelModule struct {
	once sync.Once
	m    *cuda.Module
	err  error
	fns  map[string]*cuda.Function // every kernel of the source, looked up by once
}

var openDevices struct {
	mu sync.Mutex
	m  map[int]*deviceOnce
}

type deviceOnce struct {
	once sync.Once
	g    *Device
	err  error
}

// Open returns device ordinal, opening it on first use.
func Open(ordinal int) (*Device, error) {
	openDevices.mu.Lock()
	if openDevices.m == nil {
		openDevices.m = map[int]*deviceOnce{}
	}
	o := openDevices.m[ordinal]
	if o == nil {
		o = &deviceOnce{}
		openDevices.m[ordinal] = o
	}
	openDevices.mu.Unlock()
	o.once.Do(func() {
		if o.g, o.err = newDevice(ordinal); o.err == nil {
			o.err = o.g.loadModules()
		}
	})
	return o.g, o.err
}

// loadModules loads every module a group may use when the device is
// opened, before any kernel of ours runs on it: not at first use, which may
// be under graph capture, or while a receive of this rank spins on the
// device (sends and receives are enqueued at their call), where CUDA's lazy
// loading would wait for that kernel while its sender may be waiting for
// this rank. NVLS's module is loaded only where multicast is allowed
// (nvls.go).
func (g *Device) loadModules() error {
	for _, src := range []string{cuda.ReduceSource, cuda.BarrierKernel.Source, cuda.P2PSendKernel.Source} {
		if _, err := g.Module(src); err != nil {
			return err
		}
	}
	return nil
}

func newDevice(ordinal int) (*Device, error) {
	d, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	if !d.HasVMM() {
		return nil, fmt.Errorf("%w: the CUDA driver lacks the virtual memory management API", cuda.ErrNotSupported)
	}
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal >= n {
		return nil, fmt.Errorf("cuda:%d does not exist (%d devices visible)", ordinal, n)
	}
	dev, err := d.Device(ordinal)
	if err != nil {
		return nil, err
	}
	for _, a := range []struct {
		attr cuda.Attribute
		what string
	}{{cuda.AttrVirtualMemoryManagement, "virtual memory management"}, {cuda.AttrHandleTypePosixFD, "POSIX fd handles"}} {
		if v, err := d.DeviceAttribute(dev, a.attr); err != nil || v != 1 {
			return nil, fmt.Errorf("%w: cuda:%d does not support %s", cuda.ErrNotSupported, ordinal, a.what)
		}
	}
	arch, err := d.DeviceArch(dev)
	if err != nil {
		return nil, err
	}
	ctx, err := d.RetainPrimaryContext(dev)
	if err != nil {
		return nil, err
	}
	gran, err := d.AllocationGranularity(ctx, dev, cuda.HandleTypePosixFD, false)
	if err != nil {
		d.ReleasePrimaryContext(dev)
		return nil, err
	}
	return &Device{d: d, ordinal: ordinal, dev: dev, ctx: ctx, arch: arch, gran: gran, memops: d.HasStreamMemOps(),
		mods: map[string]*kernelModule{}}, nil
}

// Module returns the loaded kernels of source, compiling them on first use.
func (g *Device) Module(source string) (*kernelModule, error) {
	g.mu.Lock()
	m := g.mods[source]
	if m == nil {
		m = &kernelModule{fns: map[string]*cuda.Function{}}
		g.mods[source] = m
	}
	g.mu.Unlock()
	m.once.Do(func() {
		m.m, m.err = g.d.LoadKernels(g.ctx, cuda.DefaultCompiler(), g.arch, source)
		// Every kernel is looked up now, not at its first launch. Under lazy
		// loading (CUDA_MODULE_LOADING=LAZY, Linux's default since CUDA 12.2)
		// cuModuleGetFunction is what puts a kernel on the device, and that
		// may wait for the context's running kernels: a lookup at first use
		// could then wait on one of ours that spins until a peer's kernel
		// runs, and that peer's may wait on this rank's next launch.
		for _, k := range cuda.KernelsIn(source) {
			if m.err != nil {
				break
			}
			m.fns[k.Name], m.err = m.m.Function(k)
		}
	})
	return m, m.err
}

// Function returns kernel k of a module loaded by Module.
func (g *Device) Function(k *cuda.Kernel) (*cuda.Function, error) {
	m, err := g.Module(k.Source)
	if err != nil {
		return nil, err
	}
	if f := m.fns[k.Name]; f != nil {
		return f, nil
	}
	return nil, fmt.Errorf("gosym: kernel %s is not one of %s's", k.Name, k.Source)
}

// Driver is the CUDA driver the device runs on.
func (g *Device) Driver() *cuda.Driver { return g.d }

// Context is the device's primary context (torch's).
func (g *Device) Context() cuda.Context { return g.ctx }

// Ordinal is the device's CUDA ordinal.
func (g *Device) Ordinal() int { return g.ordinal }

// ---- the group's buffers --------------------------------------------------------

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
	used        bool                            // kernels were enqueued: close must wait for them
	reg         *registry                       // bindings and peer mappings (reg.go, direct.go)
	counters    *Counters
	algos       *algoStats
	capturing   bool            // the current op's stream is being captured (a CUDA graph)
	deadline    time.Time       // the current op's
	swapFD      swapFunc        // the fd exchange over the links, by deadline (direct.go)
	nvls        *cuda.McBinding // a multicast object over every rank's buffer, or nil (nvls.go)
	order       streamOrder     // the last op's stream and end event (order.go)

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
		fns:  map[*cuda.Kernel]*cuda.Function{}}
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
	if cfg.a2avBlocks > 0 && world > 1 {
		f, err := t.function(cuda.A2AVKernel)
		if err != nil {
			return t, err
		}
		if t.cfg.a2avBlocks, err = a2avResident(cfg.a2avBlocks, world, g.d.ResidentBlocks(g.dev, f, cuda.BlockThreads)); err != nil {
			return t, err
		}
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

// privately runs enqueue on a stream of its own and waits for it: the
// caller's streams, which may hold kernels waiting for peers, stay out of it.
func (g *Device) privately(enqueue func(s cuda.Stream) error) error {
	s, err := g.d.StreamCreate(g.ctx, cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer g.d.StreamDestroy(g.ctx, s)
	if err := enqueue(s); err != nil {
		return err
	}
	return g.d.StreamSynchronize(g.ctx, s)
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
// may still read these buffers), then unmaps and releases everything.
func (t *Team) close() {
	g := t.g
	if g == nil {
		return
	}
	if t.used {
		if err := g.d.CtxSynchronize(g.ctx); err != nil && !errors.Is(err, cuda.ErrNotSupported) {
			dlog.Printf("rank %d: cuCtxSynchronize before unmapping the GPU buffers: %v", t.rank, err)
		}
	}
	if t.nvls != nil { // the multicast object goes before the buffers it covers
		if err := t.nvls.Close(); err != nil {
			dlog.Printf("rank %d: releasing the multicast object: %v", t.rank, err)
		}
		t.nvls = nil
	}
	t.closeIPC()
	t.order.close(g)
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
