package main

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// stepsSlotHead is where a rank's steps start in its slot of pinned host
// memory, past the word and the count its gs_copy_steps launch reads first.
const stepsSlotHead = 64

// stepsCase launches gs_copy_steps on every simulated rank's stream before
// its steps exist, an all_gather of n bytes per rank, direct (chunk 0: one
// step pulling the peers' inputs) or staged in steps of chunk bytes (each
// stages a chunk and pulls the peers' stagings; the last starts earlier,
// as gs_copy_steps asks). A goroutine publishes the steps after 200 ms with
// plain stores into pinned host memory (steps and count, then the word)
// while this thread frees device memory: cuMemFree waits for the device
// holding the lock every driver call takes (scripts/syncprobe.py), so the
// case shows that a launch released without a driver call survives it.
// Returns how long the free took along with the outcome.
func (c *checker) stepsCase(g *gpu, pads *padSet, world int, n, chunk uintptr) (time.Duration, error) {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(chunk)))
	nsteps, length := 1, n
	if chunk > 0 {
		length = min(chunk, n)
		nsteps = int((n + length - 1) / length)
	}
	ins, outs, stages := make([]*dbuf, world), make([]*dbuf, world), make([]*dbuf, world)
	defer freeAll(ins, outs)
	defer freeAll(stages)
	host := make([][]byte, world)
	var err error
	for r := range world {
		host[r] = make([]byte, n)
		for i := range host[r] {
			host[r][i] = byte(rng.Uint32())
		}
		if ins[r], err = c.alloc(g, n); err != nil {
			return 0, err
		}
		if outs[r], err = c.alloc(g, n*uintptr(world)); err != nil {
			return 0, err
		}
		if stages[r], err = c.alloc(g, length); err != nil {
			return 0, err
		}
		if err := outs[r].fill(0xab); err != nil {
			return 0, err
		}
		if err := c.d.MemcpyHtoD(g.ctx, ins[r].ptr, host[r]); err != nil {
			return 0, err
		}
	}
	slot := stepsSlotHead + uintptr(nsteps)*unsafe.Sizeof(cuda.CopyParams{})
	mem, err := c.d.MemHostAlloc(g.ctx, uintptr(world)*slot, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.d.MemFreeHost(g.ctx, mem) }()
	clear(unsafe.Slice((*byte)(mem), uintptr(world)*slot))
	dev, err := c.d.MemHostDevicePointer(g.ctx, mem)
	if err != nil {
		return 0, err
	}
	fn := g.fns[cuda.StepsKernel.Name]
	grid, block := cuda.CopyGrid(uint64(length))
	for r := range world {
		p := cuda.StepsParams{Head: dev + uintptr(r)*slot, Steps: dev + uintptr(r)*slot + stepsSlotHead,
			Pad: pads.ptrs[r], TimeoutNs: timeoutNs, Want: 1, Max: int32(nsteps)}
		if err := c.d.Launch(fn, grid, block, 0, g.streams[r], &p); err != nil {
			return 0, err
		}
	}
	victim, err := c.alloc(g, 1<<20)
	if err != nil {
		return 0, err
	}
	published := make(chan struct{})
	go func() { // no driver call from here on
		defer close(published)
		time.Sleep(200 * time.Millisecond)
		for r := range world {
			base := unsafe.Add(mem, uintptr(r)*slot)
			for s := range nsteps {
				at := min(uintptr(s)*length, n-length)
				p := (*cuda.CopyParams)(unsafe.Add(base, stepsSlotHead+uintptr(s)*unsafe.Sizeof(cuda.CopyParams{})))
				*p = cuda.CopyParams{Pads: pads.ptrs, TimeoutNs: timeoutNs, World: int32(world), Rank: int32(r),
					Sync: cuda.SyncStart | cuda.SyncEnd}
				k := 0
				if chunk > 0 {
					p.Dst[k], p.Src[k], p.Bytes[k] = stages[r].ptr, ins[r].ptr+at, uint64(length)
					k++
					p.NPre = 1
				}
				for q := range world {
					src := ins[q].ptr + at
					if chunk > 0 && q != r {
						src = stages[q].ptr
					}
					p.Dst[k], p.Src[k], p.Bytes[k] = outs[r].ptr+uintptr(q)*n+at, src, uint64(length)
					k++
				}
				p.NSeg = int32(k)
			}
			atomic.StoreUint32((*uint32)(unsafe.Add(base, 4)), uint32(nsteps))
			atomic.StoreUint32((*uint32)(base), 1)
		}
	}()
	t0 := time.Now()
	victim.free()
	freed := time.Since(t0)
	<-published
	if err := c.syncAll(g, world); err != nil {
		return freed, err
	}
	if err := pads.errors(); err != nil {
		return freed, err
	}
	for r := range world {
		got, err := outs[r].read(0, n*uintptr(world))
		if err != nil {
			return freed, err
		}
		for q := range world {
			if string(got[uintptr(q)*n:uintptr(q+1)*n]) != string(host[q]) {
				return freed, fmt.Errorf("rank %d: the part from rank %d differs", r, q)
			}
		}
	}
	return freed, nil
}

// stepsCases runs stepsCase at 2 simulated ranks, direct and staged.
func (c *checker) stepsCases(g *gpu, padsFor func(int) (*padSet, error)) {
	for _, k := range []struct{ n, chunk uintptr }{{1<<20 + 7, 0}, {3<<20 + 5, 1 << 20}} {
		how := "direct"
		if k.chunk > 0 {
			how = fmt.Sprintf("staged in %d-byte steps", k.chunk)
		}
		record(fmt.Sprintf("gs_copy_steps all_gather of %d bytes, 2 simulated ranks, %s, released by host stores during a cuMemFree",
			k.n, how), func() error {
			ps, err := padsFor(2)
			if err != nil {
				return err
			}
			freed, err := c.stepsCase(g, ps, 2, k.n, k.chunk)
			if err == nil {
				fmt.Printf("    (cuMemFree returned after %v)\n", freed.Round(time.Millisecond))
			}
			return err
		})
	}
}
