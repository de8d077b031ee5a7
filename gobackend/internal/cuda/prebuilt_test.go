package cuda

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/gosym/gosym/kernels"
)

func TestParseTarget(t *testing.T) {
	for s, want := range map[string]Target{"sm_90": {Arch: 90}, "compute_90": {Arch: 90, PTX: true}, "sm_100": {Arch: 100}} {
		got, err := ParseTarget(s)
		if err != nil || got != want || got.String() != s {
			t.Errorf("ParseTarget(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "sm90", "sm_", "sm_9x", "compute_", "sm_090", "lto_90"} {
		if _, err := ParseTarget(s); err == nil {
			t.Errorf("ParseTarget(%q) took it", s)
		}
	}
}

func TestPrebuiltRoundTripAndStaleness(t *testing.T) {
	img := []byte("\x7fELF image bytes")
	data := EncodePrebuilt("src A", "x.cu", Target{Arch: 90}, img)
	if got, ok := DecodePrebuilt(data, "src A", "x.cu", Target{Arch: 90}); !ok || string(got) != string(img) {
		t.Fatalf("round trip: %q, %v", got, ok)
	}
	for name, c := range map[string]struct {
		src, name string
		t         Target
	}{
		"other source": {"src B", "x.cu", Target{Arch: 90}},
		"other name":   {"src A", "y.cu", Target{Arch: 90}},
		"other arch":   {"src A", "x.cu", Target{Arch: 100}},
		"PTX, not sm":  {"src A", "x.cu", Target{Arch: 90, PTX: true}},
	} {
		if _, ok := DecodePrebuilt(data, c.src, c.name, c.t); ok {
			t.Errorf("%s: a stale image was taken", name)
		}
	}
	bad := append([]byte(nil), data...)
	bad[len(bad)-1] ^= 1
	if _, ok := DecodePrebuilt(bad, "src A", "x.cu", Target{Arch: 90}); ok {
		t.Error("a damaged image was taken")
	}
	if _, ok := DecodePrebuilt(data[:20], "src A", "x.cu", Target{Arch: 90}); ok {
		t.Error("a truncated image was taken")
	}
}

func TestPrebuiltChoice(t *testing.T) {
	const src, name = "the source", "k.cu"
	file := func(tg Target) *fstest.MapFile {
		return &fstest.MapFile{Data: EncodePrebuilt(src, name, tg, []byte(tg.String()))}
	}
	fsys := fstest.MapFS{
		PrebuiltFile(name, Target{Arch: 90}):            file(Target{Arch: 90}),
		PrebuiltFile(name, Target{Arch: 100}):           file(Target{Arch: 100}),
		PrebuiltFile(name, Target{Arch: 90, PTX: true}): file(Target{Arch: 90, PTX: true}),
	}
	for arch, want := range map[int]string{90: "sm_90", 100: "sm_100", 120: "compute_90", 103: "compute_90"} {
		img, tg, ok := prebuiltFor(fsys, src, name, arch)
		if !ok || string(img) != want || tg.String() != want {
			t.Errorf("sm_%d: got %q (%v, %v), want %s", arch, img, tg, ok, want)
		}
	}
	if _, _, ok := prebuiltFor(fsys, src, name, 80); ok {
		t.Error("sm_80 took an image built for a newer GPU")
	}
	if _, _, ok := prebuiltFor(fsys, "edited source", name, 90); ok {
		t.Error("an image of an older source was taken")
	}
}

func TestCompilerWithoutNVRTC(t *testing.T) {
	const src, name = "the source", "k.cu"
	fsys := fstest.MapFS{PrebuiltFile(name, Target{Arch: 90}): {Data: EncodePrebuilt(src, name, Target{Arch: 90}, []byte("cubin"))}}
	nvErr := errors.New("no libnvrtc here")
	c := &Compiler{Prebuilt: fsys, NVErr: nvErr}
	img, err := c.Compile(src, name, 90)
	if err != nil || string(img) != "cubin" || c.Stats().Prebuilt != 1 {
		t.Fatalf("prebuilt: %q, %v, %+v", img, err, c.Stats())
	}
	_, err = c.Compile(src, name, 80)
	if err == nil || !errors.Is(err, nvErr) || !strings.Contains(err.Error(), "sm_80") {
		t.Fatalf("no image and no NVRTC: %v", err)
	}
}

// The library's own images, where the build made them, match the sources
// it carries (kernelgen and the embed agree on names and keys).
func TestEmbeddedPrebuiltMatchSources(t *testing.T) {
	n := 0
	for _, k := range kernels.Sources() {
		src, err := KernelSource(k)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range PrebuiltTargets {
			if data, err := fs.ReadFile(kernelsPrebuilt, PrebuiltFile(k, tg)); err == nil {
				if _, ok := DecodePrebuilt(data, src, k, tg); ok {
					n++
				}
			}
		}
	}
	if n == 0 {
		t.Skip("this build has no prebuilt kernels (kernelgen ran without NVRTC)")
	}
	if want := len(kernels.Sources()) * len(PrebuiltTargets); n != want {
		t.Fatalf("%d of %d prebuilt images match their sources: run kernelgen (make lib)", n, want)
	}
}
