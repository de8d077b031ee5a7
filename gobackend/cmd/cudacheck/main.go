// Command cudacheck is the smoke test of the CUDA data plane on a real GPU:
// it loads libcuda and NVRTC through package cuda, reports the driver and
// the devices (attribute reads only), compiles and loads every kernel of
// package kernels, and runs the kernels against a float64 host reference:
// one-shot, two-shot and LL all-reduce with several "ranks" simulated on one
// GPU (each rank its own buffers, pads and stream), the LL data movement
// (gs_llmove: broadcast, all_gather, all_to_all, gather, scatter, back to
// back and between LL all-reduces), the copy and barrier kernels,
// stream memory operations, the barrier timeout, and, with two GPUs, real
// cross-GPU runs over VMM mappings with a few timings, and the semaphore
// protocol of issue #6 (cuda.Sema, the code the backend runs) with the pull
// kernel: all_reduce and root-only reduce, 10k back-to-back ops, the
// point-to-point kernels (p2p.cu) on one GPU and across two, and gs_a2av
// (all_to_all(v) paced pair by pair, p2p.cu) on simulated ranks of one GPU:
// skewed splits back to back, a size mismatch and a timeout. The NVLS
// kernels (nvls.cu) are compiled, loaded and looked up, never launched.
//
// It never touches NVLink multicast: it refuses to start unless
// NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
// NVSHMEM_DISABLE_NVLS=1 are set, and it never calls EnableMulticast.
//
// Output: one PASS/FAIL line per case and a JSON summary (-json, default
// $OUT/cudacheck.json when $OUT is set). Exit status: 0 all passed, 1 some
// case failed, 2 the environment is unsafe or has no CUDA, 3 timed out.
//
// Build (on a machine with Go; the binary needs only libc at run time):
//
//	CGO_ENABLED=1 go build -trimpath -buildvcs=false -o build/cudacheck ./gobackend/cmd/cudacheck
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/kernels"
)

// safeEnv must hold exactly, or nothing runs.
var safeEnv = [][2]string{
	{"NCCL_NVLS_ENABLE", "0"},
	{"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"},
	{"NVSHMEM_DISABLE_NVLS", "1"},
}

type caseResult struct {
	Name   string  `json:"name"`
	Pass   bool    `json:"pass"`
	Skip   bool    `json:"skip,omitempty"`
	Detail string  `json:"detail,omitempty"`
	Ms     float64 `json:"ms"`
}

type deviceInfo struct {
	Ordinal           int    `json:"ordinal"`
	Name              string `json:"name"`
	Arch              int    `json:"arch"`
	SMs               int    `json:"sms"`
	VMM               int    `json:"vmm"`
	PosixFD           int    `json:"posix_fd_handles"`
	Fabric            int    `json:"fabric_handles"`
	Multicast         int    `json:"multicast_supported"`
	UnifiedAddressing int    `json:"unified_addressing"`
	PCI               string `json:"pci"`
}

type compileInfo struct {
	Source   string  `json:"source"`
	Bytes    int     `json:"bytes"`
	ColdMs   float64 `json:"cold_ms"`
	CachedMs float64 `json:"cached_ms"`
}

type kernelInfo struct {
	Name  string `json:"name"`
	Regs  int    `json:"regs"`
	Local int    `json:"local_bytes"`
}

type timing struct {
	Name  string  `json:"name"`
	Bytes int     `json:"bytes"`
	Us    float64 `json:"us_per_op"`
}

type report struct {
	Pass          bool              `json:"pass"`
	Error         string            `json:"error,omitempty"`
	Safety        map[string]string `json:"safety"`
	DriverVersion int               `json:"driver_version"`
	DriverPath    string            `json:"driver_path"`
	NVRTCVersion  string            `json:"nvrtc_version"`
	NVRTCPath     string            `json:"nvrtc_path"`
	NVRTCArchs    []int             `json:"nvrtc_archs"`
	HasVMM        bool              `json:"has_vmm_symbols"`
	HasMemOps     bool              `json:"has_stream_memops_symbols"`
	MulticastGate string            `json:"multicast_gate"`
	// DependentLaunch: the kernels launched as programmatic dependents
	// (GOSYM_GPU_PDL=1 where the driver and GPU can, as in the engine)
	DependentLaunch bool          `json:"dependent_launch"`
	Devices         []deviceInfo  `json:"devices"`
	Compile         []compileInfo `json:"compile"`
	Kernels         []kernelInfo  `json:"kernels"`
	Cases           []caseResult  `json:"cases"`
	Timings         []timing      `json:"timings"`
	ElapsedS        float64       `json:"elapsed_s"`
}

var (
	mu    sync.Mutex // guards rep against the watchdogs
	rep   = report{Safety: map[string]string{}}
	start = time.Now()

	jsonPath string // where finish writes the report
	// caseTimeout (-case-timeout; 0: none) bounds one case: a driver call
	// or kernel that never returns then fails the run naming its case,
	// where the run's own timeout could only say that time ran out.
	caseTimeout time.Duration
	// giveUp ends the run from a watchdog; tests replace it.
	giveUp = func(code int) { finish(jsonPath, code) }
)

func main() {
	flag.StringVar(&jsonPath, "json", "", "write the JSON summary here (default $OUT/cudacheck.json)")
	timeout := flag.Duration("timeout", 8*time.Minute, "give up after this long")
	flag.DurationVar(&caseTimeout, "case-timeout", 2*time.Minute,
		"give up, naming the case, when one case takes longer than this (0: no limit)")
	quick := flag.Bool("quick", false, "skip the large sizes and the timings")
	flag.Parse()
	if jsonPath == "" && os.Getenv("OUT") != "" {
		jsonPath = filepath.Join(os.Getenv("OUT"), "cudacheck.json")
	}
	time.AfterFunc(*timeout, func() {
		mu.Lock()
		rep.Error = fmt.Sprintf("timed out after %v", *timeout)
		mu.Unlock()
		fmt.Println("FAIL timeout:", *timeout)
		giveUp(3)
	})
	code := run(*quick)
	finish(jsonPath, code)
}

func finish(path string, code int) {
	mu.Lock()
	rep.ElapsedS = time.Since(start).Seconds()
	rep.Pass = code == 0
	data, _ := json.MarshalIndent(&rep, "", "  ")
	mu.Unlock()
	if path != "" {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			fmt.Println("cannot write", path, err)
		}
	}
	os.Exit(code)
}

func fatal(code int, format string, args ...any) int {
	msg := fmt.Sprintf(format, args...)
	fmt.Println("ERROR", msg)
	mu.Lock()
	rep.Error = msg
	mu.Unlock()
	return code
}

func run(quick bool) int {
	for _, kv := range safeEnv {
		v := os.Getenv(kv[0])
		rep.Safety[kv[0]] = v
		fmt.Printf("safety %s=%q\n", kv[0], v)
		if v != kv[1] {
			return fatal(2, "refusing to run: %s must be %s", kv[0], kv[1])
		}
	}
	d, err := cuda.Load()
	if err != nil {
		return fatal(2, "driver: %v", err)
	}
	rep.DriverVersion, rep.DriverPath = d.Version(), d.Path()
	rep.HasVMM, rep.HasMemOps = d.HasVMM(), d.HasStreamMemOps()
	fmt.Printf("driver %d (%s) vmm-symbols=%v memops-symbols=%v\n", d.Version(), d.Path(), rep.HasVMM, rep.HasMemOps)

	n, err := d.DeviceCount()
	if err != nil || n == 0 {
		return fatal(2, "no devices: %v", err)
	}
	for i := 0; i < n; i++ {
		info, err := describe(d, i)
		if err != nil {
			return fatal(1, "device %d: %v", i, err)
		}
		rep.Devices = append(rep.Devices, info)
		fmt.Printf("device %d: %s sm_%d sms=%d vmm=%d posix_fd=%d fabric=%d multicast=%d uva=%d pci=%s\n",
			i, info.Name, info.Arch, info.SMs, info.VMM, info.PosixFD, info.Fabric, info.Multicast,
			info.UnifiedAddressing, info.PCI)
	}
	// The gate's answer here, for the record; nothing multicast is called.
	ok, reason := cuda.MulticastAllowed(os.Getenv, rep.Devices[0].Multicast == 1)
	rep.MulticastGate = fmt.Sprintf("allowed=%v: %s", ok, reason)
	fmt.Println("multicast gate:", rep.MulticastGate)

	nv, err := cuda.LoadNVRTC()
	if err != nil {
		return fatal(2, "nvrtc: %v", err)
	}
	maj, min := nv.Version()
	rep.NVRTCVersion, rep.NVRTCPath, rep.NVRTCArchs = fmt.Sprintf("%d.%d", maj, min), nv.Path(), nv.Archs()
	fmt.Printf("nvrtc %d.%d (%s) archs=%v\n", maj, min, nv.Path(), nv.Archs())

	rep.DependentLaunch = config.GPUPDL.Get() == "1" && d.DependentLaunch(0)
	fmt.Printf("dependent launches %v\n", rep.DependentLaunch)
	c := &checker{d: d, nv: nv, arch: rep.Devices[0].Arch, quick: quick, dependent: rep.DependentLaunch,
		comp: &cuda.Compiler{NV: nv, Dir: cuda.DefaultCacheDir()}}
	defer c.close()
	if code := c.setup(); code != 0 {
		return code
	}
	c.runCases()
	mu.Lock()
	defer mu.Unlock()
	passed, failed, skipped := 0, 0, 0
	for _, r := range rep.Cases {
		switch {
		case r.Skip:
			skipped++
		case r.Pass:
			passed++
		default:
			failed++
		}
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 {
		return 1
	}
	return 0
}

func describe(d *cuda.Driver, ordinal int) (deviceInfo, error) {
	dev, err := d.Device(ordinal)
	if err != nil {
		return deviceInfo{}, err
	}
	info := deviceInfo{Ordinal: ordinal}
	if info.Name, err = d.DeviceName(dev); err != nil {
		return info, err
	}
	if info.Arch, err = d.DeviceArch(dev); err != nil {
		return info, err
	}
	attr := func(a cuda.Attribute) int {
		v, err := d.DeviceAttribute(dev, a)
		if err != nil {
			return -1
		}
		return v
	}
	info.SMs = attr(cuda.AttrMultiprocessorCount)
	info.VMM = attr(cuda.AttrVirtualMemoryManagement)
	info.PosixFD = attr(cuda.AttrHandleTypePosixFD)
	info.Fabric = attr(cuda.AttrHandleTypeFabric)
	info.Multicast = attr(cuda.AttrMulticastSupported)
	info.UnifiedAddressing = attr(cuda.AttrUnifiedAddressing)
	info.PCI = fmt.Sprintf("%04x:%02x:%02x", attr(cuda.AttrPCIDomainID), attr(cuda.AttrPCIBusID),
		attr(cuda.AttrPCIDeviceID))
	return info, nil
}

// record runs one case, catching panics so that one broken case cannot hide
// the others.
func record(name string, f func() error) {
	t0 := time.Now()
	if caseTimeout > 0 {
		stuck := time.AfterFunc(caseTimeout, func() {
			msg := fmt.Sprintf("%s: not done after %v (a driver call or a kernel that never returned)", name,
				caseTimeout)
			mu.Lock()
			rep.Error = msg
			rep.Cases = append(rep.Cases, caseResult{Name: name, Detail: msg,
				Ms: float64(time.Since(t0).Microseconds()) / 1000})
			mu.Unlock()
			fmt.Println("FAIL", msg)
			giveUp(3)
		})
		defer stuck.Stop()
	}
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
			}
		}()
		err = f()
	}()
	r := caseResult{Name: name, Pass: err == nil, Ms: float64(time.Since(t0).Microseconds()) / 1000}
	switch {
	case err == errSkip:
		r.Pass, r.Skip = true, true
		fmt.Printf("SKIP %s\n", name)
	case err != nil:
		r.Detail = err.Error()
		fmt.Printf("FAIL %s: %v\n", name, err)
	default:
		fmt.Printf("PASS %s (%.1f ms)\n", name, r.Ms)
	}
	mu.Lock()
	rep.Cases = append(rep.Cases, r)
	mu.Unlock()
}

var errSkip = fmt.Errorf("skipped")

func (c *checker) compileAll() error {
	compiled := 0
	for _, src := range kernels.Sources() {
		if src == cuda.NVLSSource && c.arch < 90 {
			fmt.Printf("compile %s: skipped, multimem needs sm_90 (device is sm_%d)\n", src, c.arch)
			continue
		}
		compiled++
		text, err := cuda.KernelSource(src)
		if err != nil {
			return err
		}
		// Cold: no cache at all (skipped by -quick); then the shared cache
		// twice, so the second call must be a hit.
		var img []byte
		var coldMs float64
		if !c.quick {
			t0 := time.Now()
			if img, err = (&cuda.Compiler{NV: c.nv}).Compile(text, src, c.arch); err != nil {
				return err
			}
			coldMs = float64(time.Since(t0).Microseconds()) / 1000
		}
		warm, err := c.comp.Compile(text, src, c.arch)
		if err != nil {
			return err
		}
		if img == nil {
			img = warm
		}
		t0 := time.Now()
		again, err := c.comp.Compile(text, src, c.arch)
		if err != nil {
			return err
		}
		cachedMs := float64(time.Since(t0).Microseconds()) / 1000
		if string(again) != string(img) {
			return fmt.Errorf("%s: cached image differs from a fresh compile", src)
		}
		rep.Compile = append(rep.Compile, compileInfo{Source: src, Bytes: len(img), ColdMs: coldMs, CachedMs: cachedMs})
		fmt.Printf("compile %s for sm_%d: %d bytes, %.0f ms cold, %.1f ms cached\n", src, c.arch, len(img), coldMs, cachedMs)
	}
	st := c.comp.Stats()
	if st.Hits < int64(compiled) {
		return fmt.Errorf("compile cache: %+v, expected a hit per source", st)
	}
	return nil
}
