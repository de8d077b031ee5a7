// Command kernelgen compiles every kernels/*.cu ahead of time, so that
// libgosym.so loads its kernels without compiling anything at run time. It
// writes kernels/prebuilt/<source>.<target>.img for each target (CUBINs and
// PTX, cuda.PrebuiltTargets by default), which `go build` then embeds.
//
// Images that already match their source are kept, so a rebuild compiles
// only what changed; images of sources or targets no longer built are
// removed. Without NVRTC it says so and exits 0 without -stamp: the library
// then compiles at run time, and the next build tries again.
//
//	go run ./gobackend/cmd/kernelgen [-out kernels/prebuilt] [-targets sm_90,sm_100,compute_90] [-stamp FILE]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/kernels"
)

func main() {
	var targetList []string
	for _, t := range cuda.PrebuiltTargets {
		targetList = append(targetList, t.String())
	}
	out := flag.String("out", "kernels/prebuilt", "directory of the images (the kernels package's prebuilt/)")
	targetsFlag := flag.String("targets", strings.Join(targetList, ","), "comma-separated sm_NN (CUBIN) and compute_NN (PTX)")
	stamp := flag.String("stamp", "", "file to touch once every image is in place")
	jobs := flag.Int("j", runtime.NumCPU(), "compilations at once")
	flag.Parse()
	if err := run(*out, *targetsFlag, *stamp, *jobs); err != nil {
		fmt.Fprintln(os.Stderr, "kernelgen:", err)
		os.Exit(1)
	}
}

type job struct {
	name, src string
	t         cuda.Target
	file      string
}

func run(out, targetsFlag, stamp string, jobs int) error {
	var targets []cuda.Target
	for _, s := range strings.Split(targetsFlag, ",") {
		t, err := cuda.ParseTarget(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	var todo []job
	want := map[string]bool{}
	for _, name := range kernels.Sources() {
		src, err := cuda.KernelSource(name)
		if err != nil {
			return err
		}
		for _, t := range targets {
			file := filepath.Join(out, filepath.Base(cuda.PrebuiltFile(name, t)))
			want[filepath.Base(file)] = true
			if data, err := os.ReadFile(file); err == nil {
				if _, ok := cuda.DecodePrebuilt(data, src, name, t); ok {
					continue
				}
			}
			todo = append(todo, job{name, src, t, file})
		}
	}
	if err := removeStale(out, want); err != nil {
		return err
	}
	if len(todo) > 0 {
		nv, err := cuda.LoadNVRTC()
		if err != nil {
			fmt.Fprintf(os.Stderr, "kernelgen: %v\nkernelgen: building without prebuilt kernels for %d "+
				"image(s): libgosym.so will compile them at run time with NVRTC\n", err, len(todo))
			return nil
		}
		maj, min := nv.Version()
		fmt.Printf("kernelgen: NVRTC %d.%d, %d image(s) to build\n", maj, min, len(todo))
		if err := build(nv, todo, jobs); err != nil {
			return err
		}
	}
	if stamp != "" {
		return os.WriteFile(stamp, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644)
	}
	return nil
}

// build compiles the jobs, jobs at a time; NVRTC takes concurrent programs.
func build(nv *cuda.NVRTC, todo []job, jobs int) error {
	sem := make(chan struct{}, max(1, jobs))
	var wg sync.WaitGroup
	errs := make([]error, len(todo))
	for i, j := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			start := time.Now()
			img, err := nv.CompileTarget(j.src, j.name, j.t)
			if err == nil {
				err = cuda.WriteFileAtomic(j.file, cuda.EncodePrebuilt(j.src, j.name, j.t, img))
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s for %s: %w", j.name, j.t, err)
				return
			}
			fmt.Printf("kernelgen: %s %s: %d KiB in %.1fs\n", j.name, j.t, len(img)>>10, time.Since(start).Seconds())
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func removeStale(dir string, want map[string]bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "*.img"))
	for _, f := range old {
		if !want[filepath.Base(f)] {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	return nil
}
