package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// The CUDA binding protocol (direct.go, reg.go) on simulated ranks:
// goroutines with their own memreg domain, a fake driver (allocations with
// IPC handles, open/close bookkeeping) and an in-process agreement.

// fakeAlloc is one cudaMalloc allocation of a simulated rank.
type fakeAllocation struct{ base, size uintptr }

func fakeHandle(rank int, a fakeAllocation, gen int) cuda.IpcHandle {
	var h cuda.IpcHandle
	binary.LittleEndian.PutUint64(h[:], uint64(a.base))
	binary.LittleEndian.PutUint64(h[8:], uint64(rank+1))
	binary.LittleEndian.PutUint64(h[16:], uint64(gen))
	return h
}

// fakeRank is a simulated rank: memreg.CUDA (for its domain) and ipcMaps
// (for its side of the direct path) over the same fake allocations.
type fakeRank struct {
	rank   int
	dom    *memreg.Domain
	reg    *registry
	counts Counters

	mu        sync.Mutex
	allocs    []fakeAllocation
	gen       int                        // bumped by realloc: a new allocation at the same address
	open      map[uintptr]cuda.IpcHandle // peer allocations mapped here
	nextVA    uintptr
	opens     int
	idles     int
	failOpen  func(h cuda.IpcHandle) bool
	capturing bool
	vmm       bool // the allocations are VMM memory, exported by fd (gosym.empty's)
	swap      *fakeSwap
	parts     map[uintptr]fakeMapped // VMM ranges mapped here (vmmOpen)

	// paged memory (torch's expandable segments): pages mapped in this
	// rank, the retains the code holds on them, allocation handle values
	pages      []fakePage
	retains    map[cuda.AllocHandle]int
	nextH      cuda.AllocHandle
	physGen    int
	badRelease int // releases of handles not retained
	failExport bool
}

func newFakeRank(t *testing.T, rank int) *fakeRank {
	f := &fakeRank{rank: rank, dom: memreg.NewDomain(), open: map[uintptr]cuda.IpcHandle{}, parts: map[uintptr]fakeMapped{},
		retains: map[cuda.AllocHandle]int{}}
	f.dom.SetCUDA(f)
	f.reg = &registry{dom: f.dom, bufs: memreg.NewDomain()}
	f.reg.bufs.SetCUDA(f)
	f.allocs = []fakeAllocation{{base: uintptr(0x7f0000000000 + rank<<36), size: 64 << 20}}
	t.Cleanup(func() { f.dom.Close(); f.reg.bufs.Close() })
	return f
}

func (f *fakeRank) Share(device int, addr uintptr, n int) (*memreg.CUDAShare, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.allocs {
		if addr >= a.base && addr+uintptr(n) <= a.base+a.size {
			s := &memreg.CUDAShare{Base: uint64(a.base), Size: uint64(a.size), VMM: f.vmm}
			if !f.vmm {
				s.Handle = fakeHandle(f.rank, a, f.gen)
			}
			return s, "", nil
		}
	}
	return nil, "not device memory", nil
}

// fakeFDs maps the fds the fake VMM exports and swaps (real descriptors of
// /dev/null, so that a leak or a double close shows) to the allocation they
// stand for.
var fakeFDs = struct {
	sync.Mutex
	of map[int]cuda.IpcHandle
}{of: map[int]cuda.IpcHandle{}}

func fakeFD(h cuda.IpcHandle) (int, error) {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		fakeFDs.Lock()
		fakeFDs.of[fd] = h
		fakeFDs.Unlock()
	}
	return fd, err
}

func fakeFDClose(fd int) {
	fakeFDs.Lock()
	delete(fakeFDs.of, fd)
	fakeFDs.Unlock()
	unix.Close(fd)
}

func (f *fakeRank) vmmExport(addr uintptr) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.allocs {
		if f.vmm && addr >= a.base && addr < a.base+a.size {
			return fakeFD(fakeHandle(f.rank, a, f.gen))
		}
	}
	return -1, errors.New("cuMemRetainAllocationHandle: invalid value")
}

// vmmOpen maps the allocations fds stand for side by side: the range is
// recorded under its first part in open and with every part in parts.
func (f *fakeRank) vmmOpen(fds []int, sizes []uintptr) (uintptr, error) {
	if len(fds) == 0 || len(fds) != len(sizes) {
		return 0, fmt.Errorf("vmmOpen of %d fds and %d sizes", len(fds), len(sizes))
	}
	hs := make([]cuda.IpcHandle, len(fds))
	for i, fd := range fds {
		fakeFDs.Lock()
		h, ok := fakeFDs.of[fd]
		fakeFDs.Unlock()
		if !ok {
			return 0, fmt.Errorf("cuMemImportFromShareableHandle: fd %d is no export", fd)
		}
		hs[i] = h
	}
	va, err := f.ipcOpen(hs[0])
	if err == nil {
		f.mu.Lock()
		f.parts[va] = fakeMapped{hs, sizes}
		f.mu.Unlock()
	}
	return va, err
}

func (f *fakeRank) vmmClose(va uintptr, sizes []uintptr) error {
	f.mu.Lock()
	m, ok := f.parts[va]
	delete(f.parts, va)
	f.mu.Unlock()
	if !ok || !slices.Equal(m.sizes, sizes) {
		return fmt.Errorf("vmmClose of %#x with sizes %v: mapped %v", va, sizes, m.sizes)
	}
	return f.ipcClose(va)
}

// fakeMapped is a VMM range mapped here: what each part maps, and sizes.
type fakeMapped struct {
	hs    []cuda.IpcHandle
	sizes []uintptr
}

// fakeSwap is the fd exchange of a simulated group: each rank's exported
// fds are duplicated for every peer, as SCM_RIGHTS would.
type fakeSwap struct {
	ag    *fakeAgree
	swaps int // exchanges completed (counted by rank 0)
}

func (w *fakeSwap) of(rank int) swapFunc {
	return func(body []byte, fds []int) ([]comm.FDMsg, func(), error) {
		le := binary.LittleEndian
		b := le.AppendUint64(nil, uint64(len(fds)))
		for _, fd := range fds {
			b = le.AppendUint64(b, uint64(fd))
		}
		all, err := w.ag.of(rank)(append(b, body...))
		if err != nil {
			return nil, nil, err
		}
		if rank == 0 {
			w.swaps++
		}
		msgs := make([]comm.FDMsg, len(all))
		done := func() { closeFakes(msgs) }
		for r, b := range all {
			n := int(le.Uint64(b))
			msgs[r] = comm.FDMsg{OK: n > 0, Body: b[8+8*n:]}
			for i := 0; i < n && r != rank; i++ {
				fakeFDs.Lock()
				h := fakeFDs.of[int(le.Uint64(b[8+8*i:]))]
				fakeFDs.Unlock()
				d, err := fakeFD(h)
				if err != nil {
					done()
					return nil, nil, err
				}
				msgs[r].FDs = append(msgs[r].FDs, d)
			}
		}
		// Every rank's dups are made before the senders close their fds.
		w.ag.of(rank)(nil)
		return msgs, done, nil
	}
}

func closeFakes(msgs []comm.FDMsg) {
	for _, m := range msgs {
		for _, d := range m.FDs {
			fakeFDClose(d)
		}
	}
}

func (f *fakeRank) Open(int, *memreg.CUDAShare) (uintptr, error) { return 0, errors.New("unused") }
func (f *fakeRank) ExportFD(int, *memreg.CUDAShare) (int, error) { return -1, errors.New("unused") }
func (f *fakeRank) OpenFD(int, *memreg.CUDAShare, int) (uintptr, error) {
	return 0, errors.New("unused")
}
func (f *fakeRank) Close(int, *memreg.CUDAShare, uintptr) error { return errors.New("unused") }

func (f *fakeRank) ipcExport(addr uintptr) (uintptr, uintptr, cuda.IpcHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.allocs {
		if !f.vmm && addr >= a.base && addr < a.base+a.size {
			return a.base, a.size, fakeHandle(f.rank, a, f.gen), nil
		}
	}
	return 0, 0, cuda.IpcHandle{}, errors.New("cuMemGetAddressRange: invalid value")
}

func (f *fakeRank) ipcOpen(h cuda.IpcHandle) (uintptr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failOpen != nil && f.failOpen(h) {
		return 0, errors.New("cuIpcOpenMemHandle: injected failure")
	}
	f.nextVA += 1 << 32
	va := 0x500000000000 + f.nextVA
	f.open[va] = h
	f.opens++
	return va, nil
}

func (f *fakeRank) ipcClose(va uintptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.open[va]; !ok {
		return fmt.Errorf("close of %#x, which is not open", va)
	}
	delete(f.open, va)
	return nil
}

func (f *fakeRank) ipcIdle() error {
	f.mu.Lock()
	f.idles++
	f.mu.Unlock()
	return nil
}

func (f *fakeRank) state() (opens, mapped, idles int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opens, len(f.open), f.idles
}

func (f *fakeRank) side() *directSide {
	sd := &directSide{rank: f.rank, world: -1, ipc: f, reg: f.reg, counters: &f.counts, capturing: f.capturing}
	if f.swap != nil {
		sd.swapFD = f.swap.of(f.rank)
	}
	return sd
}

// fakeAgree is the host agreement of a simulated group: an allgather.
type fakeAgree struct {
	mu     sync.Mutex
	cond   *sync.Cond
	world  int
	gen    int
	in     [][]byte
	n      int
	out    [][]byte
	rounds int // completed
}

func newFakeAgree(world int) *fakeAgree {
	a := &fakeAgree{world: world, in: make([][]byte, world)}
	a.cond = sync.NewCond(&a.mu)
	return a
}

func (a *fakeAgree) of(rank int) agreeFunc {
	return func(meta []byte) ([][]byte, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		gen := a.gen
		a.in[rank] = append([]byte(nil), meta...)
		if a.n++; a.n == a.world {
			a.out, a.in, a.n = a.in, make([][]byte, a.world), 0
			a.gen++
			a.rounds++
			a.cond.Broadcast()
		}
		for a.gen == gen {
			a.cond.Wait()
		}
		return a.out, nil
	}
}

// opResult is what one rank's direct op decided.
type opResult struct {
	peers *peersOf
	ok    bool
	err   error
}

// runOp runs one direct op's agreement on every rank at once: rank r's
// buffer is [addrs[r], +n) (0: none), with the given mode; it returns each
// rank's result and how many host rounds the op took.
func runOp(ranks []*fakeRank, addrs []uintptr, n uintptr, mode directMode) ([]opResult, int) {
	w := len(ranks)
	ag := newFakeAgree(w)
	res := make([]opResult, w)
	var wg sync.WaitGroup
	for r, f := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sd := f.side()
			sd.world = w
			var lo, span uintptr
			if addrs[r] != 0 {
				lo, span = addrs[r], n
			}
			metas, _ := ag.of(r)(sd.record(lo, span, mode == directAny))
			op := &ops.Op{Kind: ops.AllGather}
			sd.everyNeeds = true // every rank maps every rank's buffer, as Team.direct's ops
			res[r].peers, res[r].ok, res[r].err = sd.negotiate(metas, everyone(w), everyone(w), mode, op, ag.of(r))
		}()
	}
	wg.Wait()
	return res, ag.rounds
}

func fakeGroup(t *testing.T, world int) ([]*fakeRank, []*memreg.Memh, []uintptr) {
	return fakeGroupIn(t, world, func(f *fakeRank) *memreg.Domain { return f.dom })
}

// vmmGroup is fakeGroup over VMM memory (gosym.empty's): the ranks swap
// fds to bind it, and each rank's buffer is registered by the user (its
// domain) or, implicit, as gosym.empty registers its buffers.
func vmmGroup(t *testing.T, world int, implicit bool) ([]*fakeRank, []*memreg.Memh, []uintptr, *fakeSwap) {
	sw := &fakeSwap{ag: newFakeAgree(world)}
	ranks, ms, addrs := fakeGroupIn(t, world, func(f *fakeRank) *memreg.Domain {
		f.vmm, f.swap = true, sw
		if implicit {
			return f.reg.bufs
		}
		return f.dom
	})
	return ranks, ms, addrs, sw
}

// fakeGroupIn makes world ranks, each with a buffer of 1 MiB registered in
// the domain dom gives (dom may set the rank up first).
func fakeGroupIn(t *testing.T, world int, dom func(f *fakeRank) *memreg.Domain) ([]*fakeRank, []*memreg.Memh, []uintptr) {
	ranks := make([]*fakeRank, world)
	ms := make([]*memreg.Memh, world)
	addrs := make([]uintptr, world)
	for r := range ranks {
		ranks[r] = newFakeRank(t, r)
		addrs[r] = ranks[r].allocs[0].base + 4096*uintptr(r+1)
		m, err := dom(ranks[r]).Map(addrs[r], 1<<20, 0)
		require.NoError(t, err)
		require.True(t, m.Shareable())
		ms[r] = m
	}
	return ranks, ms, addrs
}

func regStats(g *registry) map[string]any {
	m := map[string]any{}
	g.stats(m)
	return m
}

// eachPeer checks that every rank's op went direct with its own buffer
// where it is, and calls peer with where rank r found peer p's buffer.
func eachPeer(t *testing.T, ranks []*fakeRank, res []opResult, addrs []uintptr, peer func(r, p int, got uintptr)) {
	t.Helper()
	for r := range ranks {
		require.NoError(t, res[r].err)
		require.True(t, res[r].ok, "rank %d", r)
		for p := range ranks {
			got := res[r].peers.at(p, addrs[p])
			if p == r {
				assert.Equal(t, addrs[p], got)
				continue
			}
			peer(r, p, got)
		}
	}
}

// checkPeers checks that every rank found every peer's buffer where the
// fake mapped that peer's allocation.
func checkPeers(t *testing.T, ranks []*fakeRank, res []opResult, addrs []uintptr) {
	t.Helper()
	eachPeer(t, ranks, res, addrs, func(r, p int, got uintptr) {
		f := ranks[r]
		f.mu.Lock()
		h, mapped := f.open[got-(addrs[p]-ranks[p].allocs[0].base)]
		f.mu.Unlock()
		require.True(t, mapped, "rank %d: rank %d's buffer translates to %#x, not a mapping", r, p, got)
		assert.Equal(t, fakeHandle(p, ranks[p].allocs[0], ranks[p].gen), h)
	})
}

// TestGPUBindOnceReuse: the first op on registered buffers exchanges and
// votes (two rounds) and binds every rank's memh; later ops take one round,
// open nothing and hit the cache.
func TestGPUBindOnceReuse(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ranks, ms, addrs := fakeGroup(t, world)
			res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
			checkPeers(t, ranks, res, addrs)
			assert.Equal(t, 2, rounds, "a fresh binding votes")
			for r, f := range ranks {
				st := regStats(f.reg)
				assert.Equal(t, int64(1), st["gpu_bindings_created"])
				assert.Equal(t, int64(world-1), st["gpu_peer_map_misses"])
				assert.Equal(t, 1, ms[r].Bindings())
			}
			for i := 1; i <= 5; i++ {
				res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
				checkPeers(t, ranks, res, addrs)
				assert.Equal(t, 1, rounds, "bound buffers skip the vote")
				for _, f := range ranks {
					st := regStats(f.reg)
					assert.Equal(t, int64(1), st["gpu_bindings_created"])
					assert.Equal(t, int64(i), st["gpu_bindings_reused"])
					assert.Equal(t, int64(world-1), st["gpu_peer_map_misses"])
					assert.Equal(t, int64(i*(world-1)), st["gpu_peer_map_hits"])
					assert.Equal(t, int64(i+1), st["gpu_reg_direct_ops"])
					opens, mapped, _ := f.state()
					assert.Equal(t, world-1, opens)
					assert.Equal(t, world-1, mapped)
				}
			}
			for r, f := range ranks {
				f.reg.close(f)
				_, mapped, _ := f.state()
				assert.Equal(t, 0, mapped, "close unmaps everything")
				assert.Equal(t, 0, ms[r].Bindings(), "close removes the group's bindings")
				assert.Equal(t, int64(1), regStats(f.reg)["gpu_bindings_released"])
			}
		})
	}
}

// TestGPUUnmapRetires: unmapping a bound memh retires it; the next round
// carries the id and the peers drop their mapping once the device is idle.
// Freed and reallocated at the same address, the buffer registers anew
// (another id, another handle): a miss, never the old mapping.
func TestGPUUnmapRetires(t *testing.T) {
	ranks, ms, addrs := fakeGroup(t, 2)
	res, _ := runOp(ranks, addrs, 1<<20, directRegistered)
	checkPeers(t, ranks, res, addrs)

	require.NoError(t, ranks[1].dom.Unmap(ms[1]))
	assert.Equal(t, int64(1), regStats(ranks[1].reg)["gpu_bindings_released"])
	// Rank 1's buffer is not registered any more: this op stages (a mixed
	// registration between the thresholds would not even meet here), but
	// its round carries the retired id.
	res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 1, rounds)
	for _, x := range res {
		require.NoError(t, x.err)
		assert.False(t, x.ok)
	}
	_, mapped, idles := ranks[0].state()
	assert.Equal(t, 0, mapped, "rank 0 dropped rank 1's mapping")
	assert.Equal(t, 1, idles, "after waiting for the device")
	assert.Equal(t, int64(1), regStats(ranks[0].reg)["gpu_peer_map_dropped"])

	ranks[1].mu.Lock()
	ranks[1].gen++ // freed and reallocated at the same address
	ranks[1].mu.Unlock()
	m, err := ranks[1].dom.Map(addrs[1], 1<<20, 0)
	require.NoError(t, err)
	require.NotEqual(t, ms[1].ID(), m.ID())
	res, rounds = runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 2, rounds, "the new memh is bound afresh")
	checkPeers(t, ranks, res, addrs) // the new handle, not the old mapping
	assert.Equal(t, int64(2), regStats(ranks[0].reg)["gpu_peer_map_misses"])
	for _, f := range ranks {
		f.reg.close(f)
	}
}

// TestGPUBindFailureStages: a rank that cannot map a peer's fresh memh
// votes no: every rank stages, the exporter stops offering that memh (the
// next op takes one round and stages), and nothing stays mapped.
func TestGPUBindFailureStages(t *testing.T) {
	ranks, ms, addrs := fakeGroup(t, 3)
	bad := fakeHandle(0, ranks[0].allocs[0], 0)
	ranks[2].failOpen = func(h cuda.IpcHandle) bool { return h == bad }
	res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 2, rounds)
	for r, x := range res {
		require.NoError(t, x.err)
		assert.False(t, x.ok, "rank %d", r)
	}
	assert.Equal(t, 0, ms[0].Bindings(), "rank 0's memh was refused, not bound")
	for r := 1; r < 3; r++ {
		assert.Equal(t, 1, ms[r].Bindings(), "rank %d's memh was mapped by all", r)
	}
	_, mapped, _ := ranks[1].state()
	assert.Equal(t, 1, mapped, "rank 1 dropped rank 0's mapping, kept rank 2's")

	res, rounds = runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 1, rounds, "a refused memh is published unshareable: no vote")
	for _, x := range res {
		assert.False(t, x.ok)
	}
	// Large enough for the per-op path, rank 0's buffer still goes direct
	// (once rank 2 can open it): published per op, not as a registration.
	ranks[2].failOpen = nil
	res, _ = runOp(ranks, addrs, 1<<20, directAny)
	checkPeers(t, ranks, res, addrs)
	assert.Equal(t, int64(1), ranks[1].counts.ipcOpens.Load(), "rank 0's allocation, in the per-op cache")
	assert.Equal(t, 0, ms[0].Bindings())
	for _, f := range ranks {
		f.reg.close(f)
		_, mapped, _ := f.state()
		assert.Equal(t, 0, mapped)
	}
}

// TestGPUCaptureDefers: while a graph is captured a fresh memh is not
// bound (the op stages) and a retired mapping is not closed (no device
// sync); bound memhs still go direct, and the next op outside the capture
// closes what was deferred.
func TestGPUCaptureDefers(t *testing.T) {
	ranks, ms, addrs := fakeGroup(t, 2)
	for _, f := range ranks {
		f.capturing = true
	}
	res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 1, rounds)
	assert.False(t, res[0].ok, "no fresh binding under capture")
	for _, f := range ranks {
		f.capturing = false
	}
	res, _ = runOp(ranks, addrs, 1<<20, directRegistered)
	checkPeers(t, ranks, res, addrs)
	for _, f := range ranks {
		f.capturing = true
	}
	res, rounds = runOp(ranks, addrs, 1<<20, directRegistered)
	checkPeers(t, ranks, res, addrs)
	assert.Equal(t, 1, rounds, "bound memhs go direct under capture")

	require.NoError(t, ranks[1].dom.Unmap(ms[1]))
	runOp(ranks, addrs, 1<<20, directRegistered)
	_, mapped, idles := ranks[0].state()
	assert.Equal(t, 0, idles, "no device sync under capture")
	assert.Equal(t, 0, len(ranks[0].reg.peers))
	assert.Equal(t, 1, mapped, "the close waits")
	ranks[0].capturing = false
	ranks[1].capturing = false
	runOp(ranks, addrs, 1<<20, directNone)
	_, mapped, idles = ranks[0].state()
	assert.Equal(t, 1, idles)
	assert.Equal(t, 0, mapped)
	for _, f := range ranks {
		f.reg.close(f)
	}
}

// TestGPULegacyAndMixed: unregistered buffers go direct only from
// directMin (directAny), through the per-op path and its handle cache; the
// first op on an allocation votes, later ops on it skip the vote (every
// rank holds it mapped: registry.held); in registered mode they keep the
// op staged.
func TestGPULegacyAndMixed(t *testing.T) {
	ranks, ms, addrs := fakeGroup(t, 2)
	require.NoError(t, ranks[1].dom.Unmap(ms[1]))
	res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 1, rounds)
	assert.False(t, res[0].ok)
	for i := range 3 {
		res, rounds = runOp(ranks, addrs, 1<<20, directAny)
		checkPeers(t, ranks, res, addrs)
		want := 1
		if i == 0 {
			want = 2
		}
		assert.Equal(t, want, rounds, "op %d: a per-op export votes once per allocation", i)
		assert.Equal(t, int64(i), ranks[0].counts.voteSkips.Load())
		assert.Equal(t, int64(1), ranks[0].counts.ipcOpens.Load())
		assert.Equal(t, int64(i), ranks[0].counts.ipcHits.Load())
	}
	assert.Equal(t, 1, ms[0].Bindings(), "rank 0's registered memh was bound along the way")
	for _, f := range ranks {
		f.reg.close(f)
		_, mapped, _ := f.state()
		assert.Equal(t, 0, mapped)
	}
}

// TestGPUHeldOnlyByAgreement: a per-op allocation is held (its ops skip
// the vote) only after a vote every rank passed: one a rank could not map
// votes again next time, and a buffer freed and reallocated at the same
// address (a new handle) is voted on afresh and mapped anew, never served
// by the old mapping.
func TestGPUHeldOnlyByAgreement(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ranks, ms, addrs := fakeGroup(t, world)
			for r, f := range ranks {
				require.NoError(t, f.dom.Unmap(ms[r]))
			}
			last := world - 1
			bad := fakeHandle(0, ranks[0].allocs[0], 0)
			ranks[last].failOpen = func(h cuda.IpcHandle) bool { return h == bad }
			res, rounds := runOp(ranks, addrs, 1<<20, directAny)
			assert.Equal(t, 2, rounds)
			for r, x := range res {
				require.NoError(t, x.err)
				assert.False(t, x.ok, "rank %d: rank %d could not map rank 0's buffer", r, last)
			}
			ranks[last].failOpen = nil
			res, rounds = runOp(ranks, addrs, 1<<20, directAny)
			assert.Equal(t, 2, rounds, "not held: the failed vote held nothing")
			checkPeers(t, ranks, res, addrs)
			res, rounds = runOp(ranks, addrs, 1<<20, directAny)
			assert.Equal(t, 1, rounds, "held now")
			checkPeers(t, ranks, res, addrs)

			ranks[0].mu.Lock()
			ranks[0].gen++ // freed and reallocated at the same address
			ranks[0].mu.Unlock()
			res, rounds = runOp(ranks, addrs, 1<<20, directAny)
			assert.Equal(t, 2, rounds, "a new handle votes")
			checkPeers(t, ranks, res, addrs) // the new handle's mapping, not the old one
			res, rounds = runOp(ranks, addrs, 1<<20, directAny)
			assert.Equal(t, 1, rounds)
			checkPeers(t, ranks, res, addrs)
			for _, f := range ranks {
				f.reg.close(f)
				assert.False(t, f.reg.isHeld(ipcKey{0, bad}), "close forgets what was held")
			}
		})
	}
}

func TestGPURecordRoundTrip(t *testing.T) {
	f := newFakeRank(t, 0)
	for i := range 11 {
		f.reg.retire(uint64(100 + i))
	}
	sd := f.side()
	rg := decodeRegion(sd.record(f.allocs[0].base+64, 128, true))
	assert.True(t, rg.ok())
	assert.False(t, rg.registered())
	assert.Equal(t, f.allocs[0].base, rg.base)
	assert.Equal(t, f.allocs[0].size, rg.size)
	assert.Equal(t, fakeHandle(0, f.allocs[0], 0), rg.h)
	assert.Equal(t, []uint64{100, 101, 102, 103, 104, 105, 106, 107}, rg.retired)
	rg = decodeRegion(sd.record(0, 0, true))
	assert.False(t, rg.ok())
	assert.Equal(t, []uint64{108, 109, 110}, rg.retired)
	rg = decodeRegion(sd.record(f.allocs[0].base+f.allocs[0].size-8, 16, true))
	assert.False(t, rg.ok(), "spans the allocation's end")

	m, err := f.dom.Map(f.allocs[0].base+4096, 8192, 0)
	require.NoError(t, err)
	rg = decodeRegion(sd.record(m.Address()+16, 100, false))
	assert.True(t, rg.registered())
	assert.False(t, rg.bound())
	assert.Equal(t, m.ID(), rg.id)
	assert.Same(t, m, sd.fresh)
	rg = decodeRegion(sd.record(m.Address()+8000, 1000, false))
	assert.False(t, rg.ok(), "past the memh, and no per-op export asked for")
}

// fdsOpen is how many fds of the fake VMM are open; the ones the code
// under test closed leave the table here.
func fdsOpen() int {
	fakeFDs.Lock()
	defer fakeFDs.Unlock()
	for fd := range fakeFDs.of {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			delete(fakeFDs.of, fd)
		}
	}
	return len(fakeFDs.of)
}

// TestGPUVMMBindOnceReuse: registered VMM memory (gosym.empty's, mem_map'ed)
// binds like memory with an IPC handle, its fd sent once over the links:
// the first op swaps fds and votes, later ops take one round, swap nothing
// and hit the cache; close unmaps it all and no fd stays open.
func TestGPUVMMBindOnceReuse(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ranks, ms, addrs, sw := vmmGroup(t, world, false)
			res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
			checkPeers(t, ranks, res, addrs)
			assert.Equal(t, 2, rounds, "a fresh binding votes")
			assert.Equal(t, 1, sw.swaps, "one fd exchange binds every rank's memh")
			assert.Equal(t, 0, fdsOpen(), "the exchanged fds are closed once mapped")
			for r, f := range ranks {
				assert.Equal(t, 1, ms[r].Bindings())
				assert.Equal(t, int64(world-1), regStats(f.reg)["gpu_peer_map_misses"])
			}
			for i := 1; i <= 3; i++ {
				res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
				checkPeers(t, ranks, res, addrs)
				assert.Equal(t, 1, rounds, "bound buffers skip the vote")
				assert.Equal(t, 1, sw.swaps, "and send no fd")
				for _, f := range ranks {
					assert.Equal(t, int64(i*(world-1)), regStats(f.reg)["gpu_peer_map_hits"])
				}
			}
			for r, f := range ranks {
				f.reg.close(f)
				_, mapped, _ := f.state()
				assert.Equal(t, 0, mapped, "close unmaps everything")
				assert.Equal(t, 0, ms[r].Bindings())
			}
		})
	}
}

// TestGPUVMMImplicit: gosym.empty's buffers, registered implicitly, are
// looked at only where every rank takes the round anyway (directAny):
// between the thresholds they stay staged with no round and no fd. From
// directMin they bind once; freeing one (its implicit memh unmapped)
// retires it and the peers drop their mapping.
func TestGPUVMMImplicit(t *testing.T) {
	ranks, ms, addrs, sw := vmmGroup(t, 2, true)
	res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 1, rounds)
	assert.Equal(t, 0, sw.swaps)
	for _, x := range res {
		require.NoError(t, x.err)
		assert.False(t, x.ok, "not the user's registration: staged")
	}
	res, rounds = runOp(ranks, addrs, 1<<20, directAny)
	checkPeers(t, ranks, res, addrs)
	assert.Equal(t, 2, rounds)
	assert.Equal(t, 1, sw.swaps)
	res, rounds = runOp(ranks, addrs, 1<<20, directAny)
	checkPeers(t, ranks, res, addrs)
	assert.Equal(t, 1, rounds, "bound: no vote, no fd")
	assert.Equal(t, 1, sw.swaps)

	require.NoError(t, ranks[1].reg.bufs.Unmap(ms[1])) // Buf.Free
	runOp(ranks, addrs, 1<<20, directNone)
	_, mapped, _ := ranks[0].state()
	assert.Equal(t, 0, mapped, "rank 0 dropped rank 1's mapping")
	for _, f := range ranks {
		f.reg.close(f)
	}
	assert.Equal(t, 0, fdsOpen())
}

// TestGPUVMMExportFails: a rank whose fd export fails sends none; the
// peers cannot map its memh, the vote fails on every rank, the memh is
// refused (published unshareable from then on: no swap, no vote) and
// nothing leaks.
func TestGPUVMMExportFails(t *testing.T) {
	ranks, ms, addrs, sw := vmmGroup(t, 2, false)
	ranks[0].mu.Lock()
	ranks[0].gen = -1 // fakeRank.vmmExport finds no exportable allocation
	ranks[0].vmm = false
	ranks[0].mu.Unlock()
	// Rank 0's memh still says VMM (resolved at map time).
	res, rounds := runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 2, rounds)
	assert.Equal(t, 1, sw.swaps)
	for r, x := range res {
		require.NoError(t, x.err)
		assert.False(t, x.ok, "rank %d", r)
	}
	assert.Equal(t, 0, ms[0].Bindings(), "refused")
	assert.Equal(t, 1, ms[1].Bindings(), "rank 1's memh was mapped by all")
	res, rounds = runOp(ranks, addrs, 1<<20, directRegistered)
	assert.Equal(t, 1, rounds)
	assert.Equal(t, 1, sw.swaps, "a refused memh is not offered again")
	assert.False(t, res[0].ok)
	for _, f := range ranks {
		f.reg.close(f)
		_, mapped, _ := f.state()
		assert.Equal(t, 0, mapped)
	}
	assert.Equal(t, 0, fdsOpen())
}
