package gpu

// The devices of this process (process-wide, shared by every group on a
// device): torch's primary context and the kernel modules.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
)

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
	// dependent: kernels launch as programmatic dependents of the previous
	// kernel of their stream (GOSYM_GPU_PDL, where the driver and GPU can)
	dependent bool

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
	g := &Device{d: d, ordinal: ordinal, dev: dev, ctx: ctx, arch: arch, gran: gran, memops: d.HasStreamMemOps(),
		dependent: config.GPUPDL.Get() == "1" && d.DependentLaunch(dev),
		mods:      map[string]*kernelModule{}}
	dlog.Printf("cuda:%d: sm_%d, CUDA %d, dependent launches %v", ordinal, arch, d.Version(), g.dependent)
	return g, nil
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
		if m.err == nil {
			m.m.SetDependentLaunch(g.dependent)
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

// privately is cuda.Driver.Privately in the device's context.
func (g *Device) privately(enqueue func(s cuda.Stream) error) error {
	return g.d.Privately(g.ctx, enqueue)
}

// idle waits for every stream of the device's context, for at most limit
// (what says who waits, for the warning), and reports whether it went idle.
// cuCtxSynchronize cannot be interrupted, so it runs on a goroutine of its
// own, which a kernel that never ends keeps until the process exits; a
// driver that cannot tell (the fake) counts as idle, as before teardown
// had a bound.
func (g *Device) idle(limit time.Duration, what string) bool {
	done := make(chan error, 1)
	go func() { done <- g.d.CtxSynchronize(g.ctx) }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, cuda.ErrNotSupported) {
			dlog.Printf("cuCtxSynchronize on cuda:%d (%s): %v", g.ordinal, what, err)
		}
		return true
	case <-t.C:
		dlog.Warnf("cuda:%d still runs kernels after %v (%s): its memory stays mapped, not freed under them", g.ordinal, limit, what)
		return false
	}
}

// processDevice is the CUDA device of this process's CUDA ops on any
// group (ordinal + 1; 0: none yet; -1: more than one). A p2p responder of
// a group that has run no CUDA op yet takes it (p2p_setup.go).
var processDevice atomic.Int32

// NoteProcessDevice records a CUDA op on device (every CUDA op the
// endpoint takes, collective or not).
func NoteProcessDevice(device int) {
	v := int32(device) + 1
	for {
		old := processDevice.Load()
		if old == v || old == -1 {
			return
		}
		next := v
		if old != 0 {
			next = -1
		}
		if processDevice.CompareAndSwap(old, next) {
			return
		}
	}
}

// SetProcessDevice sets what NoteProcessDevice records (ordinal + 1, 0
// none, -1 several) and returns what it was: for tests whose simulated
// ranks share one process, where no responder may take another rank's
// device.
func SetProcessDevice(v int32) (old int32) { return processDevice.Swap(v) }
