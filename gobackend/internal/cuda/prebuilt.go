package cuda

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/gosym/gosym/kernels"
)

// Target is what one compilation produces: a CUBIN for one architecture, or
// PTX for an architecture and every newer one (the driver JIT-compiles it).
type Target struct {
	Arch int // 10*major + minor
	PTX  bool
}

// PrebuiltTargets are the images the build compiles (gobackend/cmd/kernelgen):
// CUBINs for Hopper (H100, H200) and Blackwell (B200), PTX for any other GPU
// from Hopper on.
var PrebuiltTargets = []Target{{Arch: 90}, {Arch: 100}, {Arch: 90, PTX: true}}

func (t Target) String() string {
	if t.PTX {
		return fmt.Sprintf("compute_%d", t.Arch)
	}
	return fmt.Sprintf("sm_%d", t.Arch)
}

func (t Target) option() string { return "-arch=" + t.String() }

// ParseTarget reads "sm_90" or "compute_90".
func ParseTarget(s string) (Target, error) {
	var t Target
	var num string
	switch {
	case strings.HasPrefix(s, "sm_"):
		num = strings.TrimPrefix(s, "sm_")
	case strings.HasPrefix(s, "compute_"):
		num, t.PTX = strings.TrimPrefix(s, "compute_"), true
	default:
		return t, fmt.Errorf("cuda: target %q is neither sm_NN nor compute_NN", s)
	}
	if _, err := fmt.Sscanf(num, "%d", &t.Arch); err != nil || t.Arch < 10 || fmt.Sprint(t.Arch) != num {
		return t, fmt.Errorf("cuda: target %q has no architecture number", s)
	}
	return t, nil
}

// CompileTarget compiles src for t, without the cache (kernelgen's way in).
func (nv *NVRTC) CompileTarget(src, name string, t Target) ([]byte, error) {
	return nv.compileFor(src, name, t.Arch, t.option(), t.PTX)
}

const prebuiltMagic = "gosym-prebuilt-v1\n"

// PrebuiltFile is where kernelgen puts source name's image for t, relative
// to the kernels package.
func PrebuiltFile(name string, t Target) string {
	return path.Join("prebuilt", name+"."+t.String()+".img")
}

// prebuiltKey hashes everything an image depends on except the NVRTC that
// made it: the expanded source, its name, the target and the options.
func prebuiltKey(src, name string, t Target) [sha256.Size]byte {
	h := sha256.New()
	for _, part := range []string{prebuiltMagic, src, name, t.String(), strings.Join(compileOptions, "\x01")} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

// EncodePrebuilt is an image file: the magic, the key of what it was built
// from, the image's SHA-256, then the image.
func EncodePrebuilt(src, name string, t Target, img []byte) []byte {
	key, sum := prebuiltKey(src, name, t), sha256.Sum256(img)
	return slices.Concat([]byte(prebuiltMagic), key[:], sum[:], img)
}

// DecodePrebuilt returns the image in data if data was built from exactly
// src and name for t and is intact.
func DecodePrebuilt(data []byte, src, name string, t Target) ([]byte, bool) {
	head := len(prebuiltMagic) + 2*sha256.Size
	if len(data) <= head || string(data[:len(prebuiltMagic)]) != prebuiltMagic {
		return nil, false
	}
	key := prebuiltKey(src, name, t)
	rest := data[len(prebuiltMagic):]
	if !bytes.Equal(rest[:sha256.Size], key[:]) {
		return nil, false
	}
	img := data[head:]
	sum := sha256.Sum256(img)
	return img, bytes.Equal(sum[:], rest[sha256.Size:2*sha256.Size])
}

// prebuiltFor finds the image of src for a device of compute capability
// arch in fsys: its own CUBIN, else the PTX of the newest architecture not
// newer than it. A stale or damaged image is passed over.
func prebuiltFor(fsys fs.FS, src, name string, arch int) ([]byte, Target, bool) {
	if fsys == nil {
		return nil, Target{}, false
	}
	try := func(t Target) ([]byte, bool) {
		data, err := fs.ReadFile(fsys, PrebuiltFile(name, t))
		if err != nil {
			return nil, false
		}
		return DecodePrebuilt(data, src, name, t)
	}
	if img, ok := try(Target{Arch: arch}); ok {
		return img, Target{Arch: arch}, true
	}
	var ptx []Target
	for _, t := range PrebuiltTargets {
		if t.PTX && t.Arch <= arch {
			ptx = append(ptx, t)
		}
	}
	slices.SortFunc(ptx, func(a, b Target) int { return b.Arch - a.Arch })
	for _, t := range ptx {
		if img, ok := try(t); ok {
			return img, t, true
		}
	}
	return nil, Target{}, false
}

// fallbackOnce says once per process that kernels are compiled at run time.
var fallbackOnce sync.Once

func noteFallback(name string, arch int, nvErr error) {
	fallbackOnce.Do(func() {
		why := "compiling them with NVRTC (cached on disk)"
		if nvErr != nil {
			why = fmt.Sprintf("and NVRTC is not available (%v)", nvErr)
		}
		fmt.Fprintf(os.Stderr, "gosym: this libgosym.so has no prebuilt kernels for sm_%d (%s); %s\n",
			arch, name, why)
	})
}

// kernelsPrebuilt is the library's embedded images.
var kernelsPrebuilt fs.FS = kernels.Prebuilt
