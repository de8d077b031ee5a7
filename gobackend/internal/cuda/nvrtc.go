package cuda

/*
#include <stdlib.h>
#include "dispatch.h"
*/
import "C"

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/config"
)

// NVRTC is an opened libnvrtc. It needs neither a GPU nor libcuda.
type NVRTC struct {
	t            *C.gscu_nvrtc
	path         string
	major, minor int
	archs        []int // sorted, as 10*major + minor
}

var defaultNVRTC struct {
	once sync.Once
	nv   *NVRTC
	err  error
}

// LoadNVRTC opens NVRTC once per process. Search order: $GOSYM_NVRTC (a
// path, and nothing else if set); a libnvrtc.so.13/.12 that the process
// already loaded (torch's, found with RTLD_NOLOAD); the sonames on the
// library path; then $CUDA_HOME, $CUDA_PATH and /usr/local/cuda lib64. The
// error wraps ErrNoCUDA when none loads.
func LoadNVRTC() (*NVRTC, error) {
	defaultNVRTC.once.Do(func() {
		defaultNVRTC.nv, defaultNVRTC.err = openNVRTC(nvrtcCandidates(os.Getenv))
	})
	return defaultNVRTC.nv, defaultNVRTC.err
}

type libCandidate struct {
	path   string
	noload bool
}

func nvrtcCandidates(env func(string) string) []libCandidate {
	if p := env("GOSYM_NVRTC"); p != "" {
		return []libCandidate{{path: p}}
	}
	sonames := []string{"libnvrtc.so.13", "libnvrtc.so.12"}
	var out []libCandidate
	for _, s := range sonames {
		out = append(out, libCandidate{path: s, noload: true})
	}
	for _, s := range append(sonames, "libnvrtc.so") {
		out = append(out, libCandidate{path: s})
	}
	for _, root := range []string{env("CUDA_HOME"), env("CUDA_PATH"), "/usr/local/cuda"} {
		if root == "" {
			continue
		}
		for _, s := range append(sonames, "libnvrtc.so") {
			out = append(out, libCandidate{path: filepath.Join(root, "lib64", s)})
		}
	}
	return out
}

func openNVRTC(cands []libCandidate) (*NVRTC, error) {
	var tried []string
	for _, c := range cands {
		cpath := C.CString(c.path)
		var msg [512]C.char
		noload := C.int(0)
		if c.noload {
			noload = 1
		}
		lib := C.gscu_dlopen(cpath, noload, &msg[0], C.size_t(len(msg)))
		C.free(unsafe.Pointer(cpath))
		if lib == nil {
			if !c.noload {
				tried = append(tried, c.path)
			}
			continue
		}
		nv, err := newNVRTC(lib, c.path)
		if err != nil {
			C.gscu_dlclose(lib)
			return nil, err
		}
		return nv, nil
	}
	return nil, fmt.Errorf("%w: no NVRTC library (tried %s; set GOSYM_NVRTC to its path)",
		ErrNoCUDA, strings.Join(tried, ", "))
}

func newNVRTC(lib unsafe.Pointer, name string) (*NVRTC, error) {
	t := (*C.gscu_nvrtc)(C.calloc(1, C.size_t(unsafe.Sizeof(C.gscu_nvrtc{}))))
	C.gscu_nvrtc_resolve(t, lib)
	var missing []string
	for i := 0; i < int(C.GSCU_NUM_NVRTC_FUNCS); i++ {
		if C.gscu_nvrtc_sym_present(t, C.int(i)) == 0 {
			missing = append(missing, C.GoString(C.gscu_nvrtc_sym_name(C.int(i))))
		}
	}
	if len(missing) > 0 {
		C.free(unsafe.Pointer(t))
		return nil, &SymbolError{Library: name, Missing: missing}
	}
	nv := &NVRTC{t: t, path: name}
	var major, minor, n C.int
	C.gscu_nvrtcVersion(t, &major, &minor)
	nv.major, nv.minor = int(major), int(minor)
	if C.gscu_nvrtcGetNumSupportedArchs(t, &n) == 0 && n > 0 {
		archs := make([]C.int, int(n))
		if C.gscu_nvrtcGetSupportedArchs(t, &archs[0]) == 0 {
			for _, a := range archs {
				nv.archs = append(nv.archs, int(a))
			}
			slices.Sort(nv.archs)
		}
	}
	var buf [4096]C.char
	if C.gscu_dlpath(lib, &buf[0], C.size_t(len(buf))) == 0 {
		nv.path = C.GoString(&buf[0])
	}
	nv.preloadBuiltins()
	return nv, nil
}

// preloadBuiltins opens libnvrtc-builtins from libnvrtc's own directory.
// NVRTC dlopens it by soname at compile time, which fails when libnvrtc came
// from a directory that is not on the library path (a pip wheel); a copy
// that is already loaded satisfies that lookup. Failure is not an error:
// the library may be on the path after all.
func (nv *NVRTC) preloadBuiltins() {
	if !strings.Contains(nv.path, "/") {
		return
	}
	p := filepath.Join(filepath.Dir(nv.path),
		fmt.Sprintf("libnvrtc-builtins.so.%d.%d", nv.major, nv.minor))
	cp := C.CString(p)
	defer C.free(unsafe.Pointer(cp))
	C.gscu_dlopen(cp, 0, nil, 0) // kept open for the life of the process
}

// Version is NVRTC's (major, minor).
func (nv *NVRTC) Version() (int, int) { return nv.major, nv.minor }

// Path is the file NVRTC was loaded from.
func (nv *NVRTC) Path() string { return nv.path }

// Archs lists the SM architectures NVRTC can generate code for.
func (nv *NVRTC) Archs() []int { return slices.Clone(nv.archs) }

// target picks what to build for a device of compute capability arch: a
// CUBIN for arch itself when NVRTC supports it, otherwise PTX for the newest
// older architecture it supports (the driver JIT-compiles it).
func (nv *NVRTC) target(arch int) (opt string, ptx bool, err error) {
	if slices.Contains(nv.archs, arch) {
		return fmt.Sprintf("-arch=sm_%d", arch), false, nil
	}
	best := 0
	for _, a := range nv.archs {
		if a <= arch {
			best = a
		}
	}
	if best == 0 {
		return "", false, fmt.Errorf("%w: NVRTC %d.%d cannot target sm_%d (supports %v)",
			ErrNotSupported, nv.major, nv.minor, arch, nv.archs)
	}
	return fmt.Sprintf("-arch=compute_%d", best), true, nil
}

// compileOptions are passed to every compilation. No fast math: reductions
// must round exactly as the host data plane does.
var compileOptions = []string{"--std=c++17", "-DGOSYM_NVRTC=1"}

// compile runs NVRTC once, without the cache.
func (nv *NVRTC) compile(src, name string, arch int) ([]byte, error) {
	target, ptx, err := nv.target(arch)
	if err != nil {
		return nil, err
	}
	return nv.compileFor(src, name, arch, target, ptx)
}

// compileFor compiles with an explicit -arch option, to PTX or to CUBIN.
func (nv *NVRTC) compileFor(src, name string, arch int, target string, ptx bool) ([]byte, error) {
	csrc, cname := C.CString(src), C.CString(name)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cname))
	var prog C.nvrtcProgram
	if r := C.gscu_nvrtcCreateProgram(nv.t, &prog, csrc, cname, 0, nil, nil); r != 0 {
		return nil, &CompileError{Name: name, Arch: arch, Code: int(r), Log: nv.errorString(r)}
	}
	defer C.gscu_nvrtcDestroyProgram(nv.t, &prog)

	opts := append([]string{target}, compileOptions...)
	copts := make([]*C.char, len(opts))
	for i, o := range opts {
		copts[i] = C.CString(o)
		defer C.free(unsafe.Pointer(copts[i]))
	}
	// copts is a Go slice of C pointers: passing &copts[0] for the call is
	// allowed, NVRTC does not keep it.
	if r := C.gscu_nvrtcCompileProgram(nv.t, prog, C.int(len(copts)), &copts[0]); r != 0 {
		return nil, &CompileError{Name: name, Arch: arch, Code: int(r), Log: nv.programLog(prog)}
	}
	var n C.size_t
	if ptx {
		if r := C.gscu_nvrtcGetPTXSize(nv.t, prog, &n); r != 0 || n == 0 {
			return nil, &CompileError{Name: name, Arch: arch, Code: int(r), Log: "no PTX"}
		}
		out := make([]byte, int(n)) // NUL-terminated, as cuModuleLoadData wants PTX
		C.gscu_nvrtcGetPTX(nv.t, prog, (*C.char)(unsafe.Pointer(&out[0])))
		return out, nil
	}
	if r := C.gscu_nvrtcGetCUBINSize(nv.t, prog, &n); r != 0 || n == 0 {
		return nil, &CompileError{Name: name, Arch: arch, Code: int(r), Log: "no CUBIN"}
	}
	out := make([]byte, int(n))
	C.gscu_nvrtcGetCUBIN(nv.t, prog, (*C.char)(unsafe.Pointer(&out[0])))
	return out, nil
}

func (nv *NVRTC) errorString(r C.nvrtcResult) string {
	return C.GoString(C.gscu_nvrtcGetErrorString(nv.t, r))
}

func (nv *NVRTC) programLog(prog C.nvrtcProgram) string {
	var n C.size_t
	if C.gscu_nvrtcGetProgramLogSize(nv.t, prog, &n) != 0 || n <= 1 {
		return ""
	}
	buf := make([]byte, int(n))
	C.gscu_nvrtcGetProgramLog(nv.t, prog, (*C.char)(unsafe.Pointer(&buf[0])))
	return strings.TrimRight(string(buf), "\x00\n")
}

// ---- the compile cache ----------------------------------------------------------

// Compiler gives a source's kernel image for a device: one the build
// compiled ahead of time (Prebuilt) when one fits, else NVRTC's through an
// on-disk cache: a compiled image is stored under Dir, keyed by a hash of
// everything that determines it, and a later compilation of the same input
// reads it back. Entries carry a checksum; a damaged one is compiled again
// and replaced. Cache trouble never fails a compilation.
type Compiler struct {
	NV       *NVRTC // nil: no NVRTC (NVErr says why); only prebuilt images
	NVErr    error
	Dir      string // "" disables the cache
	Prebuilt fs.FS  // nil: none

	hits, misses, corrupt, prebuilt atomic.Int64
}

// CacheStats counts cache outcomes (for tests and diagnostics).
type CacheStats struct{ Hits, Misses, Corrupt, Prebuilt int64 }

// Stats returns the cache counters.
func (c *Compiler) Stats() CacheStats {
	return CacheStats{c.hits.Load(), c.misses.Load(), c.corrupt.Load(), c.prebuilt.Load()}
}

// DefaultCacheDir is $GOSYM_KERNEL_CACHE, else $XDG_CACHE_HOME/gosym/kernels,
// else ~/.cache/gosym/kernels ("" if there is no home either).
func DefaultCacheDir() string {
	if d := config.KernelCache.Get(); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "gosym", "kernels")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".cache", "gosym", "kernels")
	}
	return ""
}

var defaultCompiler struct {
	once sync.Once
	c    *Compiler
}

// DefaultCompiler is the process's: the library's prebuilt images, then
// NVRTC (when it loads) with the default cache directory.
func DefaultCompiler() *Compiler {
	defaultCompiler.once.Do(func() {
		c := &Compiler{Dir: DefaultCacheDir(), Prebuilt: kernelsPrebuilt}
		c.NV, c.NVErr = LoadNVRTC()
		defaultCompiler.c = c
	})
	return defaultCompiler.c
}

// Compile compiles src (named name in diagnostics) for compute capability
// arch with the process's compiler.
func Compile(src, name string, arch int) ([]byte, error) {
	return DefaultCompiler().Compile(src, name, arch)
}

const cacheMagic = "gosym-kernel-cache-v1\n"

// Key is the cache key of one compilation.
func (c *Compiler) Key(src, name string, arch int) string {
	h := sha256.New()
	for _, part := range []string{cacheMagic, src, name, strconv.Itoa(arch),
		fmt.Sprintf("nvrtc %d.%d", c.NV.major, c.NV.minor), strings.Join(compileOptions, "\x01")} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Compile returns the image (CUBIN, or NUL-terminated PTX) for src.
func (c *Compiler) Compile(src, name string, arch int) ([]byte, error) {
	if img, _, ok := prebuiltFor(c.Prebuilt, src, name, arch); ok {
		c.prebuilt.Add(1)
		return img, nil
	}
	if c.Prebuilt != nil {
		noteFallback(name, arch, c.NVErr)
	}
	if c.NV == nil {
		err := c.NVErr
		if err == nil {
			err = fmt.Errorf("%w: no NVRTC", ErrNoCUDA)
		}
		return nil, fmt.Errorf("no prebuilt kernel image of %s fits sm_%d: %w", name, arch, err)
	}
	if c.Dir == "" {
		c.misses.Add(1)
		return c.NV.compile(src, name, arch)
	}
	file := filepath.Join(c.Dir, c.Key(src, name, arch)+".bin")
	if img, ok := c.read(file); ok {
		c.hits.Add(1)
		return img, nil
	}
	c.misses.Add(1)
	img, err := c.NV.compile(src, name, arch)
	if err != nil {
		return nil, err
	}
	c.write(file, img)
	return img, nil
}

// An entry is cacheMagic, the SHA-256 of the image, then the image.
func (c *Compiler) read(file string) ([]byte, bool) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, false
	}
	head := len(cacheMagic) + sha256.Size
	if len(data) <= head || string(data[:len(cacheMagic)]) != cacheMagic {
		c.corrupt.Add(1)
		return nil, false
	}
	img := data[head:]
	sum := sha256.Sum256(img)
	if !bytes.Equal(sum[:], data[len(cacheMagic):head]) {
		c.corrupt.Add(1)
		return nil, false
	}
	return img, true
}

// write stores an entry atomically (WriteFileAtomic); cache trouble is
// not an error.
func (c *Compiler) write(file string, img []byte) {
	sum := sha256.Sum256(img)
	_ = WriteFileAtomic(file, slices.Concat([]byte(cacheMagic), sum[:], img))
}

// WriteFileAtomic writes data to file through a temporary file in the same
// directory (made if missing) renamed into place, so that a reader never
// sees a partial file: the kernel cache's entries, kernelgen's images.
func WriteFileAtomic(file string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
