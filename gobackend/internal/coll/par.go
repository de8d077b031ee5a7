package coll

import "sync"

// ParMin is the smallest share of a copy or reduction worth a goroutine of
// its own: below it the hand-off costs more than the bytes.
const ParMin = 256 << 10

// Par splits [0, n) bytes into at most threads shares of ParMin bytes or
// more, each starting at a multiple of align, and runs fn on them at once
// (the first on the calling goroutine), returning when all have.
func Par(threads, n, align int, fn func(lo, hi int)) {
	t := min(threads, n/ParMin)
	if t <= 1 {
		fn(0, n)
		return
	}
	share := (n/t + align - 1) / align * align
	var wg sync.WaitGroup
	for lo := share; lo < n; lo += share {
		wg.Add(1)
		go func(lo int) {
			defer wg.Done()
			fn(lo, min(lo+share, n))
		}(lo)
	}
	fn(0, min(share, n))
	wg.Wait()
}

// ParReduce runs reduce (a Plane's Reduce of fixed dtype and op) over n bytes of
// elements of es bytes at dst and srcs in Par's shares, each share's
// addresses offset alike; the first error any share returned.
func ParReduce(threads int, dst uintptr, srcs []uintptr, n, es int,
	reduce func(dst uintptr, srcs []uintptr, count int) error) error {
	var err error
	var mu sync.Mutex
	Par(threads, n, 64, func(lo, hi int) {
		s := make([]uintptr, len(srcs))
		for i, a := range srcs {
			s[i] = a + uintptr(lo)
		}
		if e := reduce(dst+uintptr(lo), s, (hi-lo)/es); e != nil {
			mu.Lock()
			err = e
			mu.Unlock()
		}
	})
	return err
}
