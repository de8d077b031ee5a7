package gobackend

// The CUDA data plane of an endpoint: setup, devices and the group's
// symmetric GPU buffers. The collectives themselves are in gpu_ops.go; all
// are stream-ordered on the caller's stream.
//
// The first CUDA op of a group sets it up on every rank (collectives run in
// the same order everywhere, so every rank reaches that op): each rank
// allocates two VMM buffers, control (its signal pad) and data (staging),
// sends their POSIX fds to every peer over the authenticated links and maps
// theirs; a host barrier then confirms that every rank succeeded. If one did not, every rank fails
// CUDA ops on that group with the same NotSupported error from then on, and
// the host data plane keeps working.
//
// An op only enqueues work on the caller's stream (gpu_ops.go). The
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

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// gpuArgs says where a posted CUDA op runs.
type gpuArgs struct {
	device    int         // CUDA device ordinal
	stream    cuda.Stream // the caller's stream
	capturing bool        // the caller says the stream is being captured (runGPU also asks the driver)
	// task, when set, runs instead of an op: group-wide setup that must
	// happen in collective order (contiguous views).
	task func(who symm.Who, deadline time.Time) error
}

// gpuState is an endpoint's CUDA side. CUDA ops go through the collective
// queue like every collective (they share its sequence numbers); their
// device and stream wait in pending, by sequence number, until they run.
type gpuState struct {
	mu       sync.Mutex
	pending  map[uint64]gpuArgs
	npending atomic.Int32

	// Used only by whoever runs the collective queue, and by Destroy after
	// the workers stopped.
	team *gpuTeam
	err  error // why the data plane could not start on this group, or a kernel's error (sticky)
	// errw is team.errw for readers off the queue (stats, DeviceError),
	// under mu: close takes it away before freeing it.
	errw *cuda.ErrorWords

	ops      atomic.Int64
	captured atomic.Int64 // ops enqueued while their stream was being captured (a CUDA graph)
	joins    atomic.Int64 // ops that waited for the group's previous op on another stream (gpu_order.go)
	device   atomic.Int32 // ordinal + 1 once set up, for stats
	stage    atomic.Int64
	counters gpuCounters
	algos    gpuAlgoStats // which reduction algorithm ran (gpu_sema.go)
	nvls     atomic.Bool  // a multicast object is bound over the group's buffers
	reg      gpuReg       // bindings of registered CUDA memory, peer mappings (gpu_reg.go)
}

// gpuCounters count what the data plane did, for the endpoint's stats.
type gpuCounters struct {
	directOps atomic.Int64 // ops that ran on the peers' own buffers (gpu_direct.go)
	ipcOpens  atomic.Int64 // peer allocations mapped (cache misses)
	ipcHits   atomic.Int64 // peer allocations found mapped
	llMoves   atomic.Int64 // data movement by one gs_llmove launch (gpu_ops.go, llMove)
	pacedA2A  atomic.Int64 // all_to_all by one gs_a2av launch (gpu_ops.go, allToAllPaced)
}

func (g *gpuState) add(seq uint64, a gpuArgs) {
	g.mu.Lock()
	if g.pending == nil {
		g.pending = map[uint64]gpuArgs{}
	}
	g.pending[seq] = a
	g.mu.Unlock()
	g.npending.Add(1)
}

// take returns (and forgets) the CUDA arguments of collective seq, if it
// is a CUDA op. Host ops pay one atomic load.
func (g *gpuState) take(seq uint64) (gpuArgs, bool) {
	if g.npending.Load() == 0 {
		return gpuArgs{}, false
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

func (g *gpuState) close() {
	g.mu.Lock()
	g.errw = nil
	g.mu.Unlock()
	if g.team != nil {
		g.team.close()
		g.team = nil
	}
}

func (g *gpuState) stats(m map[string]any) {
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

// PostCUDA posts an op on CUDA device memory of device (an ordinal; a
// negative device means host memory, as Post); capturing says the stream
// is being captured into a CUDA graph. The op is enqueued on stream before
// PostCUDA returns, after every collective posted before it (send and
// recv: after the pair's earlier CUDA messages, see gpu_p2p.go); the
// returned Work is already complete on the host.
func (e *Endpoint) PostCUDA(op *Op, device int, stream uintptr, capturing bool) (*Work, error) {
	if device < 0 {
		return e.Post(op)
	}
	if op.Kind == coll.Recv && op.Peer == coll.AnySource {
		return nil, status.Errorf(status.NotSupported, "gosym: recv from any source into CUDA memory: the engine matches CUDA messages per pair (the Python package learns the sender first)")
	}
	noteProcessDevice(device) // for the p2p responders of other groups
	if op.Kind.IsP2P() {
		return e.runP2PCUDA(op, device, stream, capturing)
	}
	if err := gpuKernelSupport(op); err != nil {
		return nil, err
	}
	coll.Even(op, e.Size)
	if err := coll.Check(op, e.Rank, e.Size); err != nil {
		return nil, err
	}
	if err := checkUBR(op); err != nil {
		return nil, err
	}
	// Refused before it takes a sequence number, so it never reaches the
	// peers (an op that failed on one rank alone would put the ranks out of
	// step). runGPU checks again in case the first CUDA op is still running.
	if d := int(e.gpu.device.Load()) - 1; d >= 0 && d != device {
		return nil, status.Errorf(status.InvalidArg, "gosym: %s on cuda:%d, but group %q runs on cuda:%d on this rank (one device per rank and group)",
			op.Kind, device, e.Name, d)
	}
	return e.runQueued(op, gpuArgs{device: device, stream: cuda.Stream(stream), capturing: capturing})
}

// runQueued runs op with its CUDA arguments in collective order, on this
// thread, so a CUDA op is enqueued here, in stream order with whatever the
// caller enqueues next. When the collective queue is idle (the common case:
// the caller's previous op is done) op runs at once, as if queued and
// drained, with no Work to queue and no arguments to park; else it is
// queued behind the others and the queue runs here until it ran.
func (e *Endpoint) runQueued(op *Op, a gpuArgs) (*Work, error) {
	e.mu.Lock()
	if err := e.usable(op.Kind); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	e.seq++
	w := &Work{op: *op}
	w.op.Seq = e.seq
	e.stats.Posted.Add(1)
	if e.coll.claimIdle() { // nothing can be queued ahead of op: posts hold e.mu
		e.mu.Unlock()
		w.err = e.finished(e.runCollOp(&w.op, a, true))
		e.coll.unclaim()
		w.done = closedDone
	} else {
		w.q, w.done = e.coll, make(chan struct{})
		e.gpu.add(w.op.Seq, a)
		e.coll.push(w, false)
		e.mu.Unlock()
		w.Wait(-1)
	}
	if w.err != nil {
		return nil, w.err
	}
	return w, nil
}

// RunCUDA is Run for an op that PostCUDA takes: a host op (device < 0) runs
// to completion; a CUDA op is done on the host once it is enqueued.
func (e *Endpoint) RunCUDA(op *Op, device int, stream uintptr, capturing bool) error {
	if device < 0 {
		return e.Run(op)
	}
	_, err := e.PostCUDA(op, device, stream, capturing)
	return err
}

// runTask runs task on every rank in collective order, as the op named
// name: it may talk to the peers (links, team barriers) like a collective.
func (e *Endpoint) runTask(name string, task func(who symm.Who, deadline time.Time) error) error {
	_, err := e.runQueued(&Op{Kind: coll.Barrier}, gpuArgs{device: -1, task: func(who symm.Who, deadline time.Time) error {
		who.Op = name
		return task(who, deadline)
	}})
	return err
}

// runGPU runs a CUDA op on the collective queue.
func (e *Endpoint) runGPU(op *Op, a gpuArgs, deadline time.Time) error {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return status.Errorf(status.Closed, "gosym: %s on a destroyed group", op.Kind)
	}
	g := &e.gpu
	if g.err != nil {
		return g.err
	}
	if g.team == nil {
		t, err := e.startGPU(a.device, op.Who(), deadline)
		if err != nil {
			if status.CodeOf(err) == status.NotSupported {
				g.err = err
			}
			return err
		}
		// Every rank asks, so that the gate's answer is agreed; on the lent
		// machines it is no (their safety variables) and nothing multicast
		// is ever called.
		mc, err := e.setupNVLS(t, op.Who(), deadline)
		switch {
		case err == nil:
			t.nvls = mc
			g.nvls.Store(true)
		case status.CodeOf(err) != status.NotSupported: // links or barrier broke
			t.close()
			return err
		}
		t.counters, t.algos, t.reg = &g.counters, &g.algos, &g.reg
		// Over the links, by the current op's deadline: set once, used by
		// the few ops that bind a fresh VMM buffer.
		t.swapFD = func(body []byte, fds []int) ([]fdxMsg, func(), error) { return e.swapFD(body, fds, t.deadline) }
		g.team = t
		g.mu.Lock()
		g.errw = t.errw
		g.mu.Unlock()
		g.device.Store(int32(a.device) + 1)
		g.stage.Store(int64(t.stage))
	}
	t := g.team
	if a.device != t.g.ordinal {
		return status.Errorf(status.InvalidArg, "gosym: %s on cuda:%d, but group %q runs on cuda:%d (one device per rank and group)",
			op.Kind, a.device, e.Name, t.g.ordinal)
	}
	if t.errw.Code() != 0 { // a kernel of an earlier op timed out: the pads are out of step
		g.err = e.deviceError(t.errw, t.g.ordinal)
		return g.err
	}
	// Asked here, not by every caller: one driver call, no Python round;
	// the capture sequence orders the op (gpu_order.go).
	capturing, capture, err := t.g.d.StreamCaptureInfo(t.g.ctx, a.stream)
	if err != nil {
		return status.Wrap(status.System, err, "gosym: %s on cuda:%d: asking whether the stream is being captured", op.Kind, a.device)
	}
	capturing = capturing || a.capturing
	g.ops.Add(1)
	if capturing {
		g.captured.Add(1)
	}
	if err := t.order.before(t.g, a.stream, capture); err != nil {
		return status.Wrap(status.System, err, "gosym: %s on cuda:%d: waiting for the group's previous op on another stream", op.Kind, a.device)
	}
	agree := func(meta []byte) ([][]byte, error) { return e.team.Barrier(meta, op.Who(), deadline) }
	t.capturing, t.deadline = capturing, deadline
	err = t.run(op, a.stream, agree)
	if oerr := t.order.after(t.g, a.stream, capture); oerr != nil && err == nil {
		err = status.Wrap(status.System, oerr, "gosym: %s on cuda:%d: recording the op's end for the group's next op", op.Kind, a.device)
	}
	g.joins.Store(int64(t.order.joins))
	var coded *status.Error
	if err != nil && !errors.As(err, &coded) {
		return status.Wrap(status.System, err, "gosym: %s on cuda:%d", op.Who(), a.device)
	}
	return err
}

// gpuConfig holds the CUDA data plane's tunables, read when a group sets
// it up. Every rank must read the same values: they decide launch shapes.
type gpuConfig struct {
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

func gpuConfigFromEnv() gpuConfig {
	return gpuConfig{
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
func (c gpuConfig) shared() []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, uint64(c.a2avBlocks))
	binary.LittleEndian.PutUint64(b[8:], uint64(c.a2avSlot))
	return b
}

// sharedMismatch explains a peer's announcement of shared() that differs
// from this rank's.
func (c gpuConfig) sharedMismatch(r int, theirs []byte) error {
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

// gpuHelloMagic marks a rank's announcement of its GPU buffer (its size,
// with its fd).
const gpuHelloMagic = 0x50475347 // "GSGP"

// startGPU sets up the group's CUDA data plane on every rank together.
// Local failures do not stop this rank from taking part in the exchange and
// the agreement barrier, so that the links and the barrier count stay in
// step; they turn into NotSupported on every rank.
func (e *Endpoint) startGPU(device int, who symm.Who, deadline time.Time) (*gpuTeam, error) {
	who.Op += " (CUDA setup)"
	if e.Size > cuda.MaxRanks { // the same answer on every rank: no exchange needed
		return nil, status.Errorf(status.NotSupported, "gosym: the CUDA data plane handles groups of up to %d ranks, group %q has %d",
			cuda.MaxRanks, e.Name, e.Size)
	}
	t, local := newGPUTeam(device, e.Rank, e.Size, gpuConfigFromEnv(), e.Timeout)
	for i, sy := range t.symms() { // both exchanges run whatever happened locally
		if err := e.shareSymm(t, sy, gpuHelloMagic+uint32(i), &local, deadline); err != nil {
			t.close() // the links are out of step: the group cannot go on
			return nil, status.Wrap(status.Peer, err, "gosym: %s", who)
		}
	}
	if local == nil {
		local = t.zeroPad()
	}
	if local != nil {
		debugf("rank %d: CUDA data plane setup failed: %v", e.Rank, local)
	}
	failed, err := e.agreeAll(local == nil, who, deadline)
	if err != nil {
		t.close()
		return nil, err
	}
	if len(failed) > 0 {
		t.close()
		why := fmt.Sprintf("ranks %v could not set it up", failed)
		if local != nil {
			why = fmt.Sprintf("%s; this rank: %v", why, local)
		}
		return nil, status.Errorf(status.NotSupported, "gosym: the CUDA data plane is not available on group %q (%s)", e.Name, why)
	}
	return t, nil
}

// shareSymm sends this rank's buffer of sy to every peer and maps theirs.
// A local failure (already in *local, or met here) is recorded in *local
// and this rank still takes part in the exchange; the error returned is a
// link failure.
func (e *Endpoint) shareSymm(t *gpuTeam, sy *gpuSymm, magic uint32, local *error, deadline time.Time) error {
	fd := -1
	if *local == nil {
		fd, *local = t.exportFD(sy)
	}
	body := binary.LittleEndian.AppendUint64(nil, uint64(sy.size))
	body = append(body, t.cfg.shared()...)
	msgs, err := e.exchangeFD(magic, body, oneFD(fd), deadline)
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		return err
	}
	defer closeFDX(msgs)
	for r, m := range msgs {
		switch {
		case r == e.Rank || *local != nil:
		case !m.ok:
			*local = fmt.Errorf("rank %d could not set up its GPU %s buffer", r, sy.name)
		case len(m.body) < 8:
			*local = fmt.Errorf("rank %d announced its GPU %s buffer in %d bytes (another gosym version?)", r, sy.name, len(m.body))
		case uintptr(binary.LittleEndian.Uint64(m.body)) != sy.size:
			*local = fmt.Errorf("rank %d's GPU %s buffer has %d bytes, this rank's %d (different GPUs?)", r, sy.name,
				binary.LittleEndian.Uint64(m.body), sy.size)
		default:
			if *local = t.cfg.sharedMismatch(r, m.body[8:]); *local == nil {
				*local = t.importPeer(sy, r, m.fd())
			}
		}
	}
	return nil
}

// ---- devices (process-wide) -----------------------------------------------------

// gpuDevice is one CUDA device of this process: torch's primary context
// (retained for the life of the process) and the compiled kernels, shared
// by every group on the device.
type gpuDevice struct {
	d       *cuda.Driver
	ordinal int
	dev     cuda.Device
	ctx     cuda.Context
	arch    int
	gran    uintptr
	memops  bool // the driver has the stream memory operations (the semaphore protocol)

	mu   sync.Mutex
	mods map[string]*gpuModule
}

// gpuModule is one kernels/*.cu source, compiled once per process (NVRTC,
// cached on disk) and loaded once per device.
type gpuModule struct {
	once sync.Once
	m    *cuda.Module
	err  error
	fns  map[string]*cuda.Function // every kernel of the source, looked up by once
}

var gpuDevices struct {
	mu sync.Mutex
	m  map[int]*gpuDeviceOnce
}

type gpuDeviceOnce struct {
	once sync.Once
	g    *gpuDevice
	err  error
}

var gpuCompiler struct {
	once sync.Once
	c    *cuda.Compiler
	err  error
}

// openGPU returns device ordinal, opening it on first use.
func openGPU(ordinal int) (*gpuDevice, error) {
	gpuDevices.mu.Lock()
	if gpuDevices.m == nil {
		gpuDevices.m = map[int]*gpuDeviceOnce{}
	}
	o := gpuDevices.m[ordinal]
	if o == nil {
		o = &gpuDeviceOnce{}
		gpuDevices.m[ordinal] = o
	}
	gpuDevices.mu.Unlock()
	o.once.Do(func() { o.g, o.err = newGPUDevice(ordinal) })
	return o.g, o.err
}

func newGPUDevice(ordinal int) (*gpuDevice, error) {
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
	return &gpuDevice{d: d, ordinal: ordinal, dev: dev, ctx: ctx, arch: arch, gran: gran, memops: d.HasStreamMemOps(),
		mods: map[string]*gpuModule{}}, nil
}

// module returns the loaded kernels of source, compiling them on first use.
func (g *gpuDevice) module(source string) (*gpuModule, error) {
	g.mu.Lock()
	m := g.mods[source]
	if m == nil {
		m = &gpuModule{fns: map[string]*cuda.Function{}}
		g.mods[source] = m
	}
	g.mu.Unlock()
	m.once.Do(func() {
		gpuCompiler.once.Do(func() {
			nv, err := cuda.LoadNVRTC()
			gpuCompiler.c, gpuCompiler.err = &cuda.Compiler{NV: nv, Dir: cuda.DefaultCacheDir()}, err
		})
		if m.err = gpuCompiler.err; m.err == nil {
			m.m, m.err = g.d.LoadKernels(g.ctx, gpuCompiler.c, g.arch, source)
		}
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

// function returns kernel k of a module loaded by module.
func (g *gpuDevice) function(k *cuda.Kernel) (*cuda.Function, error) {
	m, err := g.module(k.Source)
	if err != nil {
		return nil, err
	}
	if f := m.fns[k.Name]; f != nil {
		return f, nil
	}
	return nil, fmt.Errorf("gosym: kernel %s is not one of %s's", k.Name, k.Source)
}

// ---- the group's buffers --------------------------------------------------------

// gpuTeam is one rank's view of a group's GPU buffers: its own (exported)
// and every peer's (imported), each mapped at an address of this process.
// Control (the signal pads the kernels' barriers and semaphores write) and
// data (the staging) are separate allocations, so that nothing that moves
// data can ever reach a pad, and a multicast object covers data alone.
type gpuTeam struct {
	g           *gpuDevice
	cfg         gpuConfig
	rank, world int
	ctrl, data  gpuSymm
	stage       uintptr // bytes of staging, a multiple of 16
	llArea      uintptr // bytes of the LL area after the staging (0: none; gpu_ops.go, llReduce)
	timeoutNs   uint64
	pads        [cuda.MaxRanks]uintptr
	stages      [cuda.MaxRanks]uintptr
	fns         map[*cuda.Kernel]*cuda.Function // this team's lookups, unlocked
	used        bool                            // kernels were enqueued: close must wait for them
	reg         *gpuReg                         // bindings and peer mappings (gpu_reg.go, gpu_direct.go)
	counters    *gpuCounters
	algos       *gpuAlgoStats
	capturing   bool            // the current op's stream is being captured (a CUDA graph)
	deadline    time.Time       // the current op's
	swapFD      gpuSwapFD       // the fd exchange over the links, by deadline (gpu_direct.go)
	nvls        *cuda.McBinding // a multicast object over every rank's buffer, or nil (gpu_nvls.go)
	order       gpuOrder        // the last op's stream and end event (gpu_order.go)

	errw *cuda.ErrorWords // where this rank's kernels copy their errors (gpu_deverr.go)
}

// gpuSymm is one symmetric allocation of a group: a buffer of size bytes on
// every rank, each mapped here.
type gpuSymm struct {
	name string
	size uintptr
	bufs []gpuMapping // by rank
}

// symms lists the team's allocations, in the order setup shares them.
func (t *gpuTeam) symms() []*gpuSymm { return []*gpuSymm{&t.ctrl, &t.data} }

// gpuMapping is one rank's buffer as mapped here; each field records a step
// to undo.
type gpuMapping struct {
	h      cuda.AllocHandle
	held   bool
	va     uintptr
	mapped bool
}

// newGPUTeam allocates and maps this rank's buffer and loads the kernels.
// On error the team is still returned, for close.
func newGPUTeam(device, rank, world int, cfg gpuConfig, timeout time.Duration) (*gpuTeam, error) {
	t := &gpuTeam{cfg: cfg, rank: rank, world: world, timeoutNs: uint64(timeout.Nanoseconds()),
		ctrl: gpuSymm{name: "control", bufs: make([]gpuMapping, world)},
		data: gpuSymm{name: "data", bufs: make([]gpuMapping, world)},
		fns:  map[*cuda.Kernel]*cuda.Function{}}
	g, err := openGPU(device)
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
	// Loaded now, not at first use, which may be under graph capture.
	srcs := []string{"allreduce.cu", cuda.BarrierKernel.Source}
	if cfg.a2avBlocks > 0 {
		srcs = append(srcs, cuda.A2AVKernel.Source)
	}
	for _, src := range srcs {
		if _, err := g.module(src); err != nil {
			return t, err
		}
	}
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
func (t *gpuTeam) mapBuf(sy *gpuSymm, r int) error {
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
func (t *gpuTeam) exportFD(sy *gpuSymm) (int, error) {
	return t.g.d.MemExportFD(t.g.ctx, sy.bufs[t.rank].h)
}

// importPeer maps rank r's buffer of sy from the fd it sent (the caller
// closes fd).
func (t *gpuTeam) importPeer(sy *gpuSymm, r, fd int) error {
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
// CUDA graphs stay in step). A private stream keeps the caller's streams
// out of it.
func (t *gpuTeam) zeroPad() error {
	g := t.g
	s, err := g.d.StreamCreate(g.ctx, cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer g.d.StreamDestroy(g.ctx, s)
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
	return g.d.StreamSynchronize(g.ctx, s)
}

func (t *gpuTeam) function(k *cuda.Kernel) (*cuda.Function, error) {
	if f := t.fns[k]; f != nil {
		return f, nil
	}
	f, err := t.g.function(k)
	if err == nil {
		t.fns[k] = f
	}
	return f, err
}

// close waits until the device is idle (kernels on the caller's streams
// may still read these buffers), then unmaps and releases everything.
func (t *gpuTeam) close() {
	g := t.g
	if g == nil {
		return
	}
	if t.used {
		if err := g.d.CtxSynchronize(g.ctx); err != nil && !errors.Is(err, cuda.ErrNotSupported) {
			debugf("rank %d: cuCtxSynchronize before unmapping the GPU buffers: %v", t.rank, err)
		}
	}
	if t.nvls != nil { // the multicast object goes before the buffers it covers
		if err := t.nvls.Close(); err != nil {
			debugf("rank %d: releasing the multicast object: %v", t.rank, err)
		}
		t.nvls = nil
	}
	t.closeIPC()
	t.order.close(g)
	if err := t.errw.Close(); err != nil {
		debugf("rank %d: freeing the host error block: %v", t.rank, err)
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
			*b = gpuMapping{}
		}
	}
}
