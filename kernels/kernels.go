// Package kernels holds the CUDA C++ sources of gosym's device code and the
// images compiled from them ahead of time (prebuilt/, written by
// gobackend/cmd/kernelgen during the build). A device none of the images fits
// compiles the sources at run time with NVRTC (see package
// gobackend/internal/cuda), so they use no system headers: every type and
// intrinsic they need is a compiler builtin or declared in common.cuh.
//
// params.cuh is generated from the Go parameter structs; do not edit it.
package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// FS holds the kernel sources (*.cu) and the headers they include (*.cuh).
//
//go:embed *.cu *.cuh
var FS embed.FS

// Prebuilt holds prebuilt/<source>.<target>.img, the images kernelgen
// compiled when the library was built (none where the build had no NVRTC).
// Its README keeps the pattern matching in a tree without images.
//
//go:embed prebuilt
var Prebuilt embed.FS

// Sources lists the compilable files (*.cu), sorted.
func Sources() []string {
	names, _ := fs.Glob(FS, "*.cu")
	sort.Strings(names)
	return names
}

// Source returns a .cu file with its local #include "x.cuh" lines replaced
// by the headers' text (each header once), so NVRTC gets one self-contained
// program and a hash of it covers everything the compiled code depends on.
func Source(name string) (string, error) {
	var b strings.Builder
	if err := expand(&b, name, map[string]bool{}, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func expand(b *strings.Builder, name string, seen map[string]bool, depth int) error {
	if depth > 8 {
		return fmt.Errorf("kernels: includes nested too deeply at %s", name)
	}
	text, err := FS.ReadFile(name)
	if err != nil {
		return fmt.Errorf("kernels: %w", err)
	}
	seen[name] = true
	fmt.Fprintf(b, "#line 1 \"%s\"\n", name)
	for i, line := range strings.SplitAfter(string(text), "\n") {
		inc, ok := localInclude(line)
		if !ok {
			b.WriteString(line)
			continue
		}
		if !seen[inc] {
			if err := expand(b, path.Clean(inc), seen, depth+1); err != nil {
				return fmt.Errorf("%w (included from %s:%d)", err, name, i+1)
			}
		}
		fmt.Fprintf(b, "#line %d \"%s\"\n", i+2, name)
	}
	return nil
}

// localInclude recognises `#include "file"`; system includes (<...>) are
// left alone and fail in NVRTC, which is the point.
func localInclude(line string) (string, bool) {
	s := strings.TrimSpace(line)
	if !strings.HasPrefix(s, "#") {
		return "", false
	}
	s = strings.TrimSpace(strings.TrimPrefix(s, "#"))
	if !strings.HasPrefix(s, "include") {
		return "", false
	}
	s = strings.TrimSpace(strings.TrimPrefix(s, "include"))
	if len(s) < 2 || s[0] != '"' {
		return "", false
	}
	end := strings.IndexByte(s[1:], '"')
	if end < 0 {
		return "", false
	}
	return s[1 : 1+end], true
}
