package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// Runs of paged VMM memory (pages.go) on simulated ranks whose memory
// is an expandable segment: abutting pages, each its own allocation, which
// the test unmaps and replaces as torch would. The fake reuses a handle
// value the code holds no retain on, as a driver may, so a run that kept
// no retain would be served stale.

// fakePage is one page mapped in a simulated rank: its handle value and
// the allocation behind it (phys, what an export of it names).
type fakePage struct {
	base, size uintptr
	h          cuda.AllocHandle
	phys       cuda.IpcHandle
}

const fakePageSize = 2 << 20

// pagedGroup makes world ranks whose memory is npages pages of
// fakePageSize from the rank's usual base, swapping fds with each other.
func pagedGroup(t *testing.T, world, npages int) ([]*fakeRank, *fakeSwap) {
	sw := &fakeSwap{ag: newFakeAgree(world)}
	ranks := make([]*fakeRank, world)
	for r := range ranks {
		f := newFakeRank(t, r)
		base := f.allocs[0].base
		f.allocs, f.vmm, f.swap = nil, true, sw // no IPC handle, no gosym.empty buffer
		for i := range npages {
			f.pages = append(f.pages, fakePage{base: base + uintptr(i)*fakePageSize, size: fakePageSize})
			f.remap(i)
		}
		ranks[r] = f
	}
	return ranks, sw
}

// remap replaces page i's allocation, as torch unmapping a page and mapping
// a new one there: the new handle takes the old value when the code holds
// no retain on it.
func (f *fakeRank) remap(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := &f.pages[i]
	if p.h == 0 || f.retains[p.h] > 0 {
		f.nextH++
		p.h = f.nextH + cuda.AllocHandle(f.rank)<<32
	}
	f.physGen++
	binary.LittleEndian.PutUint64(p.phys[:], uint64(f.physGen))
	binary.LittleEndian.PutUint64(p.phys[8:], uint64(f.rank+1))
	copy(p.phys[16:], "page")
}

// unmapPage removes page i (torch gave it back).
func (f *fakeRank) unmapPage(i int) {
	f.mu.Lock()
	f.pages[i].size = 0
	f.mu.Unlock()
}

func (f *fakeRank) pageAt(addr uintptr) (uintptr, uintptr, cuda.AllocHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.pages {
		if addr >= p.base && addr < p.base+p.size {
			f.retains[p.h]++
			return p.base, p.size, p.h, nil
		}
	}
	return 0, 0, 0, errors.New("cuMemGetAddressRange: invalid value")
}

func (f *fakeRank) pageRetain(addr uintptr) (cuda.AllocHandle, error) {
	_, _, h, err := f.pageAt(addr)
	return h, err
}

func (f *fakeRank) pageRelease(h cuda.AllocHandle) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.retains[h] == 0 {
		f.badRelease++
		return
	}
	if f.retains[h]--; f.retains[h] == 0 {
		delete(f.retains, h)
	}
}

func (f *fakeRank) pageExport(h cuda.AllocHandle) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failExport || f.retains[h] == 0 {
		return -1, fmt.Errorf("cuMemExportToShareableHandle of %#x: invalid handle", h)
	}
	for _, p := range f.pages {
		if p.h == h && p.size > 0 {
			return fakeFD(p.phys)
		}
	}
	return -1, fmt.Errorf("cuMemExportToShareableHandle of %#x: not mapped", h)
}

// held is how many retains the code holds, in all.
func (f *fakeRank) held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.retains {
		n += c
	}
	return n
}

// pagesOf is what a peer must map for [addr, addr+n): the allocations
// covering it, and where addr lies from the first one.
func (f *fakeRank) pagesOf(addr, n uintptr) ([]cuda.IpcHandle, uintptr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cuda.IpcHandle
	var off uintptr
	for _, p := range f.pages {
		if p.size > 0 && p.base < addr+n && p.base+p.size > addr {
			if out == nil {
				off = addr - p.base
			}
			out = append(out, p.phys)
		}
	}
	return out, off
}

// checkPaged checks that every rank found every peer's buffer [addrs[p],
// +n) in a mapping of that peer's current pages, at the right offset.
func checkPaged(t *testing.T, ranks []*fakeRank, res []opResult, addrs []uintptr, n uintptr) {
	t.Helper()
	eachPeer(t, ranks, res, addrs, func(r, p int, got uintptr) {
		want, off := ranks[p].pagesOf(addrs[p], n)
		f := ranks[r]
		f.mu.Lock()
		m, mapped := f.parts[got-off]
		f.mu.Unlock()
		require.True(t, mapped, "rank %d: rank %d's buffer translates to %#x, not a mapping", r, p, got)
		assert.Equal(t, want, m.hs, "rank %d maps rank %d's current pages", r, p)
	})
}

func runPaged(ranks []*fakeRank, addrs []uintptr, n uintptr) ([]opResult, int) {
	return runOp(ranks, addrs, n, directAny)
}

// closeAndCheck closes every rank's group side and checks that nothing is
// held: no retain, no mapping, no fd, no release of what was not retained.
func closeAndCheck(t *testing.T, ranks []*fakeRank) {
	t.Helper()
	for r, f := range ranks {
		f.reg.close(f)
		_, mapped, _ := f.state()
		assert.Equal(t, 0, mapped, "rank %d: close unmaps everything", r)
		assert.Empty(t, f.parts, "rank %d", r)
		assert.Equal(t, 0, f.held(), "rank %d: close releases every retain", r)
		assert.Equal(t, 0, f.badRelease, "rank %d", r)
	}
	assert.Equal(t, 0, fdsOpen())
}

// TestGPUPagedRunBindOnce: buffers spanning three pages bind on the first
// op (one fd exchange of three fds per rank, a vote), then take one round;
// the exporter holds exactly one retain per page of its run.
func TestGPUPagedRunBindOnce(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ranks, sw := pagedGroup(t, world, 8)
			const n = 5 << 20
			addrs := make([]uintptr, world)
			for r, f := range ranks {
				addrs[r] = f.pages[0].base + 1<<20 - 4096*uintptr(r) // pages 0 to 2
			}
			res, rounds := runPaged(ranks, addrs, n)
			checkPaged(t, ranks, res, addrs, n)
			assert.Equal(t, 2, rounds, "a fresh run votes")
			assert.Equal(t, 1, sw.swaps)
			assert.Equal(t, 0, fdsOpen(), "the exchanged fds are closed once mapped")
			for _, f := range ranks {
				assert.Equal(t, 3, f.held(), "one retain per page of the run")
				assert.Equal(t, int64(1), regStats(f.reg)["gpu_page_runs_made"])
				assert.Equal(t, int64(world-1), regStats(f.reg)["gpu_peer_map_misses"])
				assert.Equal(t, int64(0), regStats(f.reg)["gpu_reg_direct_ops"], "runs are not user registrations")
			}
			for i := 1; i <= 3; i++ {
				res, rounds := runPaged(ranks, addrs, n)
				checkPaged(t, ranks, res, addrs, n)
				assert.Equal(t, 1, rounds, "a bound run skips the vote")
				assert.Equal(t, 1, sw.swaps, "and sends no fd")
				for _, f := range ranks {
					assert.Equal(t, 3, f.held(), "the walk's retains are released")
					assert.Equal(t, int64(i*(world-1)), regStats(f.reg)["gpu_peer_map_hits"])
					assert.Equal(t, int64(1), regStats(f.reg)["gpu_page_runs_made"])
				}
			}
			closeAndCheck(t, ranks)
		})
	}
}

// TestGPUPagedRunRemap: torch replaces a page of a bound run. The next op
// retires the run (its retains released, the peers drop their mapping)
// and binds a new one: the peers map the new page, never the old. The
// fake gives the new page the old handle value when the code holds no
// retain on it, so a run that kept none would match and serve the old
// page.
func TestGPUPagedRunRemap(t *testing.T) {
	ranks, sw := pagedGroup(t, 2, 8)
	const n = 5 << 20
	addrs := []uintptr{ranks[0].pages[2].base, ranks[1].pages[2].base + 4096} // pages 2 to 4
	res, _ := runPaged(ranks, addrs, n)
	checkPaged(t, ranks, res, addrs, n)
	ranks[1].remap(3)
	res, rounds := runPaged(ranks, addrs, n)
	checkPaged(t, ranks, res, addrs, n)
	assert.Equal(t, 2, rounds, "the new run votes")
	assert.Equal(t, 2, sw.swaps)
	assert.Equal(t, int64(1), regStats(ranks[1].reg)["gpu_page_runs_retired"])
	assert.Equal(t, 3, ranks[1].held(), "the new run's pages; the old run's released")
	assert.Equal(t, int64(1), regStats(ranks[0].reg)["gpu_peer_map_dropped"], "rank 0 dropped the old run's mapping")
	_, mapped, _ := ranks[0].state()
	assert.Equal(t, 1, mapped)
	closeAndCheck(t, ranks)
}

// TestGPUPagedRunSweep: a run whose page torch gave back is retired by the
// sweep of ops on other buffers, within a few ops, and its retains go.
func TestGPUPagedRunSweep(t *testing.T) {
	ranks, _ := pagedGroup(t, 2, 16)
	const n = 3 << 20
	at := func(page int) []uintptr { return []uintptr{ranks[0].pages[page].base, ranks[1].pages[page].base} }
	for _, page := range []int{0, 4, 8} {
		res, _ := runPaged(ranks, at(page), n)
		checkPaged(t, ranks, res, at(page), n)
	}
	assert.Equal(t, 6, ranks[1].held())
	ranks[1].unmapPage(0)
	for range 3 {
		res, _ := runPaged(ranks, at(8), n)
		checkPaged(t, ranks, res, at(8), n)
	}
	assert.Equal(t, int64(1), regStats(ranks[1].reg)["gpu_page_runs_retired"])
	assert.Equal(t, 4, ranks[1].held(), "the run of the freed page is released")
	assert.Equal(t, int64(1), regStats(ranks[0].reg)["gpu_peer_map_dropped"])
	// The buffer at page 4 still goes direct on its bound run.
	res, rounds := runPaged(ranks, at(4), n)
	checkPaged(t, ranks, res, at(4), n)
	assert.Equal(t, 1, rounds)
	closeAndCheck(t, ranks)
}

// TestGPUPagedRunCaptured: a bound run of pages 0-2 serves a captured op
// on page 0 alone (the graph bakes in the peers' mappings). Torch then
// gives back page 2, which the graph does not use: the sweep unpublishes
// the run but keeps it, so the mapping a replay reads stays open and its
// pages stay retained; the next op on page 0 publishes a new run, and the
// group's end releases the kept one.
func TestGPUPagedRunCaptured(t *testing.T) {
	ranks, _ := pagedGroup(t, 2, 8)
	at := func(page int) []uintptr { return []uintptr{ranks[0].pages[page].base, ranks[1].pages[page].base} }
	capture := func(on bool) {
		for _, f := range ranks {
			f.capturing = on
		}
	}
	res, _ := runPaged(ranks, at(0), 5<<20) // pages 0-2: the run binds
	checkPaged(t, ranks, res, at(0), 5<<20)
	capture(true)
	res, rounds := runPaged(ranks, at(0), 1<<20)
	require.True(t, res[0].ok && res[1].ok)
	assert.Equal(t, 1, rounds, "the bound run goes direct under capture")
	replayed := res[0].peers.at(1, at(0)[1])
	capture(false)
	ranks[1].unmapPage(2)
	res, _ = runPaged(ranks, at(4), 1<<20) // another buffer: its sweep finds the change
	checkPaged(t, ranks, res, at(4), 1<<20)
	assert.Equal(t, int64(1), regStats(ranks[1].reg)["gpu_page_runs_kept"])
	assert.Equal(t, int64(0), regStats(ranks[1].reg)["gpu_page_runs_retired"])
	assert.Equal(t, int64(0), regStats(ranks[0].reg)["gpu_peer_map_dropped"])
	ranks[0].mu.Lock()
	_, open := ranks[0].parts[replayed]
	ranks[0].mu.Unlock()
	assert.True(t, open, "the mapping the graph reads stays open")
	assert.Equal(t, 4, ranks[1].held(), "the kept run's 3 pages and page 4's run")
	res, rounds = runPaged(ranks, at(0), 1<<20) // eager again: rank 1 publishes a new run of page 0
	require.True(t, res[0].ok && res[1].ok)
	assert.Equal(t, 2, rounds, "the new run votes")
	assert.NotEqual(t, replayed, res[0].peers.at(1, at(0)[1]), "read through the new run's mapping")
	assert.Equal(t, int64(3), regStats(ranks[1].reg)["gpu_page_runs_made"])
	closeAndCheck(t, ranks)
}

// TestGPUPagedRunLimits: a run of more pages than a binding may send, a
// fresh run under graph capture, and a failed export all stage on every
// rank and leave nothing retained; a refused run is not offered again.
func TestGPUPagedRunLimits(t *testing.T) {
	t.Run("too many pages", func(t *testing.T) {
		ranks, sw := pagedGroup(t, 2, maxRunFDs+2)
		addrs := []uintptr{ranks[0].pages[0].base, ranks[1].pages[0].base}
		res, rounds := runPaged(ranks, addrs, (maxRunFDs+1)*fakePageSize)
		for r, x := range res {
			require.NoError(t, x.err)
			assert.False(t, x.ok, "rank %d", r)
			assert.Equal(t, 0, ranks[r].held())
		}
		assert.Equal(t, 1, rounds)
		assert.Equal(t, 0, sw.swaps)
		closeAndCheck(t, ranks)
	})
	t.Run("capture", func(t *testing.T) {
		ranks, _ := pagedGroup(t, 2, 4)
		addrs := []uintptr{ranks[0].pages[0].base, ranks[1].pages[0].base}
		for _, f := range ranks {
			f.capturing = true
		}
		res, _ := runPaged(ranks, addrs, 1<<20)
		assert.False(t, res[0].ok, "no fresh run while capturing")
		assert.Equal(t, 0, ranks[0].held())
		for _, f := range ranks {
			f.capturing = false
		}
		res, _ = runPaged(ranks, addrs, 1<<20)
		checkPaged(t, ranks, res, addrs, 1<<20)
		for _, f := range ranks {
			f.capturing = true
		}
		res, rounds := runPaged(ranks, addrs, 1<<20)
		checkPaged(t, ranks, res, addrs, 1<<20)
		assert.Equal(t, 1, rounds, "a bound run goes direct under capture")
		closeAndCheck(t, ranks)
	})
	t.Run("capture, published unbound", func(t *testing.T) {
		ranks, sw := pagedGroup(t, 2, 4)
		addrs := []uintptr{ranks[0].pages[0].base, ranks[1].pages[0].base}
		// Each rank publishes a run in an op that stages (the other has no buffer).
		for r := range ranks {
			only := make([]uintptr, 2)
			only[r] = addrs[r]
			res, _ := runPaged(ranks, only, 1<<20)
			assert.False(t, res[r].ok)
			assert.Equal(t, 1, ranks[r].held(), "rank %d published its run", r)
		}
		for _, f := range ranks {
			f.capturing = true
		}
		res, _ := runPaged(ranks, addrs, 1<<20)
		assert.False(t, res[0].ok, "no binding while capturing")
		assert.Equal(t, 0, sw.swaps, "no fd exchange while capturing")
		for _, f := range ranks {
			f.capturing = false
		}
		res, _ = runPaged(ranks, addrs, 1<<20)
		checkPaged(t, ranks, res, addrs, 1<<20)
		assert.Equal(t, 1, sw.swaps)
		closeAndCheck(t, ranks)
	})
	t.Run("export fails", func(t *testing.T) {
		ranks, sw := pagedGroup(t, 2, 4)
		addrs := []uintptr{ranks[0].pages[0].base, ranks[1].pages[0].base}
		ranks[0].failExport = true
		res, rounds := runPaged(ranks, addrs, 3<<20)
		assert.Equal(t, 2, rounds)
		for r, x := range res {
			require.NoError(t, x.err)
			assert.False(t, x.ok, "rank %d", r)
		}
		res, rounds = runPaged(ranks, addrs, 3<<20)
		assert.False(t, res[1].ok)
		assert.Equal(t, 1, rounds, "a refused run is not offered again")
		assert.Equal(t, 1, sw.swaps)
		closeAndCheck(t, ranks)
	})
}

// TestGPUPagedRunRegistered: paged memory a user registered (a private
// memh: it has no IPC handle) goes direct as a run between the thresholds
// (directRegistered), where unregistered memory stays staged.
func TestGPUPagedRunRegistered(t *testing.T) {
	ranks, sw := pagedGroup(t, 2, 4)
	addrs := []uintptr{ranks[0].pages[0].base + 4096, ranks[1].pages[0].base}
	const n = 3 << 20
	res, rounds := runOp(ranks, addrs, n, directRegistered)
	assert.False(t, res[0].ok, "not registered: staged")
	assert.Equal(t, 1, rounds)
	for r, f := range ranks {
		m, err := f.dom.Map(addrs[r], n, 0)
		require.NoError(t, err)
		require.False(t, m.Shareable(), "paged memory registers private")
	}
	res, rounds = runOp(ranks, addrs, n, directRegistered)
	checkPaged(t, ranks, res, addrs, n)
	assert.Equal(t, 2, rounds)
	assert.Equal(t, 1, sw.swaps)
	res, rounds = runOp(ranks, addrs, n, directRegistered)
	checkPaged(t, ranks, res, addrs, n)
	assert.Equal(t, 1, rounds, "bound: one round")
	closeAndCheck(t, ranks)
}
