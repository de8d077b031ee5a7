package cuda

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/leakcheck"
)

// lockstep simulates a group in one process for the collective setup: one
// goroutine per rank, but only one runs at a time, in rank order between
// collective calls, so that the shared fake driver sees every call in a
// fixed order (the n-th call of a function is always the same rank's).
type lockstep struct {
	mu    sync.Mutex
	cond  *sync.Cond
	world int
	turn  int // the rank that may run
	round int // collective calls completed
	// This round's deposits, then the last completed round's results.
	fd, root int
	oks      []bool
	fds      []int // by rank: what ShareFD returns
	failed   []int
	msgs     [][]byte // by rank: this round's Exchange deposits
	got      [][]byte // by rank: the last completed round's
}

type lockstepPeer struct {
	l      *lockstep
	rank   int
	rounds int
}

func newLockstep(world int) *lockstep {
	l := &lockstep{world: world, oks: make([]bool, world), fd: -1, msgs: make([][]byte, world)}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// call deposits this rank's part, completes the round if it is the last
// rank, hands the turn on and waits for the round's result and its turn.
func (p *lockstepPeer) call(deposit func(), result func()) {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	deposit()
	if p.rank == l.world-1 {
		l.complete()
		l.round++
	}
	l.turn = (p.rank + 1) % l.world
	l.cond.Broadcast()
	for l.turn != p.rank || l.round <= p.rounds {
		l.cond.Wait()
	}
	p.rounds++
	result()
}

// complete computes a round's results. A shared fd is duplicated for each
// receiver now, while the root still holds it, as SCM_RIGHTS would.
func (l *lockstep) complete() {
	l.got = slices.Clone(l.msgs)
	l.failed = nil
	for r, ok := range l.oks {
		if !ok {
			l.failed = append(l.failed, r)
		}
	}
	l.fds = make([]int, l.world)
	for r := range l.fds {
		l.fds[r] = -1
		if r != l.root && l.fd >= 0 {
			nfd, err := syscall.Dup(l.fd)
			if err != nil {
				panic(err)
			}
			l.fds[r] = nfd
		}
	}
	l.fd = -1
}

func (p *lockstepPeer) ShareFD(root, fd int) (got int, err error) {
	p.call(func() {
		p.l.root = root
		if p.rank == root {
			p.l.fd = fd
		}
	}, func() { got = p.l.fds[p.rank] })
	return got, nil
}

// Exchange (a P2PPeer between ranks 0 and 1) returns the other rank's message.
func (p *lockstepPeer) Exchange(step string, msg []byte) (got []byte, err error) {
	p.call(func() { p.l.msgs[p.rank] = msg }, func() { got = p.l.got[1-p.rank] })
	return got, nil
}

func (p *lockstepPeer) Agree(step string, ok bool) (failed []int, err error) {
	p.call(func() { p.l.oks[p.rank] = ok }, func() { failed = slices.Clone(p.l.failed) })
	return failed, nil
}

// run runs f for every rank, each in its turn.
func (l *lockstep) run(f func(p *lockstepPeer)) {
	var wg sync.WaitGroup
	for r := 0; r < l.world; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &lockstepPeer{l: l, rank: r}
			l.mu.Lock()
			for l.turn != r {
				l.cond.Wait()
			}
			l.mu.Unlock()
			f(p)
			l.mu.Lock()
			l.turn = (r + 1) % l.world
			l.cond.Broadcast()
			l.mu.Unlock()
		}()
	}
	wg.Wait()
}

// mcGroup is one setup attempt over a simulated group: each rank's buffer
// (a fake VMM handle), binding and error.
type mcGroup struct {
	bufs  []AllocHandle
	binds []*McBinding
	errs  []error
}

func setupGroup(t *testing.T, d *Driver, world, root int, env func(rank int) func(string) string,
	prepare func(rank int) error) *mcGroup {
	t.Helper()
	g := &mcGroup{bufs: make([]AllocHandle, world), binds: make([]*McBinding, world), errs: make([]error, world)}
	for r := range g.bufs {
		h, err := d.MemCreate(0, Device(r), 4<<20, HandleTypePosixFD)
		require.NoError(t, err)
		g.bufs[r] = h
	}
	newLockstep(world).run(func(p *lockstepPeer) {
		r := p.rank
		spec := McSpec{Dev: Device(r), Rank: r, World: world, Root: root, Mem: g.bufs[r], Size: 4 << 20}
		var prep func() error
		if prepare != nil {
			prep = func() error { return prepare(r) }
		}
		g.binds[r], g.errs[r] = SetupMulticast(d, env(r), spec, p, prep)
	})
	return g
}

// release closes every binding, then releases every buffer, as a team
// teardown must.
func (g *mcGroup) release(t *testing.T, d *Driver) {
	for _, b := range g.binds {
		if b != nil {
			require.NoError(t, b.Close())
		}
	}
	for _, h := range g.bufs {
		require.NoError(t, d.MemRelease(0, h))
	}
}

func optInEnv(int) func(string) string { return envOf(optIn(nil)) }

// checkReleases walks the fake's log and checks that everything the setup
// acquired was released exactly once and in order: a multicast mapping
// before its address range, a binding before its object, every multicast
// object before any buffer. skip is the one call that was made to fail.
func checkReleases(t *testing.T, log []fakeCall, skip fakeCall, skipN int64) {
	t.Helper()
	seen := map[string]int64{}
	type life struct{ got, put, used, unused int } // log indices, -1 if absent
	ranges, mcs := map[uint64]*life{}, map[uint64]*life{}
	get := func(m map[uint64]*life, k uint64) *life {
		if m[k] == nil {
			m[k] = &life{-1, -1, -1, -1}
		}
		return m[k]
	}
	once := func(at *int, i int, what string) {
		require.Equal(t, -1, *at, "%s twice (log entry %d)", what, i)
		*at = i
	}
	firstBufRelease := len(log)
	for i, c := range log {
		seen[c.Name]++
		if c.Name == skip.Name && seen[c.Name] == skipN {
			continue // the failed call acquired nothing
		}
		switch c.Name {
		case "cuMemAddressReserve":
			once(&get(ranges, c.Arg).got, i, "reserve")
		case "cuMemMap":
			once(&get(ranges, c.Arg).used, i, "map")
		case "cuMemUnmap":
			once(&get(ranges, c.Arg).unused, i, "unmap")
		case "cuMemAddressFree":
			once(&get(ranges, c.Arg).put, i, "free")
		case "cuMulticastCreate", "cuMemImportFromShareableHandle":
			once(&get(mcs, c.Arg).got, i, "create/import")
		case "cuMulticastBindMem":
			once(&get(mcs, c.Arg).used, i, "bind")
		case "cuMulticastUnbind":
			once(&get(mcs, c.Arg).unused, i, "unbind")
		case "cuMemRelease":
			if c.Arg >= 0x20000 { // a buffer (cuMemCreate's handles)
				firstBufRelease = min(firstBufRelease, i)
				continue
			}
			once(&get(mcs, c.Arg).put, i, "release")
		}
	}
	for what, m := range map[string]map[uint64]*life{"address range": ranges, "multicast object": mcs} {
		for k, l := range m {
			name := fmt.Sprintf("%s %#x", what, k)
			require.NotEqual(t, -1, l.got, "%s released but never acquired", name)
			require.Greater(t, l.put, l.got, "%s not released", name)
			require.Equal(t, l.used == -1, l.unused == -1, "%s: mapped/bound %d, undone %d", name, l.used, l.unused)
			if l.used != -1 {
				require.Less(t, l.got, l.used, name)
				require.Less(t, l.used, l.unused, name)
				require.Less(t, l.unused, l.put, "%s: undone after its release", name)
			}
			if what == "multicast object" {
				require.Less(t, l.put, firstBufRelease, "%s released after a buffer it covers", name)
			}
		}
	}
}

func TestSetupMulticastBindsEveryRank(t *testing.T) {
	for _, c := range []struct{ world, root int }{{2, 0}, {2, 1}, {4, 0}, {8, 3}} {
		t.Run(fmt.Sprintf("world=%d root=%d", c.world, c.root), func(t *testing.T) {
			fds := leakcheck.OpenFDs()
			withFake(t, func(d *Driver) {
				fakeSetAttr(AttrMulticastSupported, 1)
				g := setupGroup(t, d, c.world, c.root, optInEnv, nil)
				require.Equal(t, make([]error, c.world), g.errs)
				addrs := map[uintptr]bool{}
				for _, b := range g.binds {
					require.NotZero(t, b.Addr)
					addrs[b.Addr] = true
				}
				require.Len(t, addrs, c.world)
				require.EqualValues(t, 1, fakeCalls("cuMulticastCreate"))
				require.EqualValues(t, 1, fakeCalls("cuMemExportToShareableHandle"))
				require.EqualValues(t, c.world-1, fakeCalls("cuMemImportFromShareableHandle"))
				for _, f := range []string{"cuMulticastAddDevice", "cuMulticastBindMem", "cuMemMap", "cuMemSetAccess"} {
					require.EqualValues(t, c.world, fakeCalls(f), f)
				}
				// No rank bound memory before every rank had added its device.
				log := fakeLog()
				adds, firstBind := -1, len(log)
				for i, e := range log {
					if e.Name == "cuMulticastAddDevice" {
						adds = i
					}
					if e.Name == "cuMulticastBindMem" {
						firstBind = min(firstBind, i)
					}
				}
				require.Less(t, adds, firstBind)
				g.release(t, d)
				n := len(fakeLog())
				for _, b := range g.binds {
					require.NoError(t, b.Close()) // again: nothing left to do
				}
				require.Len(t, fakeLog(), n)
				checkReleases(t, fakeLog(), fakeCall{}, 0)
				require.EqualValues(t, c.world, fakeCalls("cuMulticastUnbind"))
			})
			require.Equal(t, fds, leakcheck.OpenFDs(), "file descriptors leaked")
		})
	}
}

// A failure at any step, on any one rank, makes every rank fall back
// (NotSupported naming that rank) and release, in order, all it made.
func TestSetupMulticastFailureAtEachStep(t *testing.T) {
	const world = 3 // ranks run in order 0, 1, 2 between agreements; root 0
	for _, c := range []struct {
		fn   string
		n    int64 // which call fails
		rank int   // whose call that is
	}{
		{"cuMulticastGetGranularity", 2, 1},
		{"cuMulticastCreate", 1, 0},
		{"cuMemExportToShareableHandle", 1, 0},
		{"cuMemImportFromShareableHandle", 2, 2},
		{"cuMulticastAddDevice", 1, 0},
		{"cuMulticastAddDevice", 3, 2},
		{"cuMulticastBindMem", 2, 1},
		{"cuMemAddressReserve", 1, 0},
		{"cuMemMap", 3, 2},
		{"cuMemSetAccess", 2, 1},
	} {
		t.Run(fmt.Sprintf("%s#%d", c.fn, c.n), func(t *testing.T) {
			fds := leakcheck.OpenFDs()
			withFake(t, func(d *Driver) {
				fakeSetAttr(AttrMulticastSupported, 1)
				fakeFailAt(c.fn, c.n)
				g := setupGroup(t, d, world, 0, optInEnv, nil)
				for r, err := range g.errs {
					require.ErrorIs(t, err, ErrNotSupported, "rank %d", r)
					require.Nil(t, g.binds[r])
					require.Regexp(t, fmt.Sprintf(`ranks \[[0-9 ]*%d[0-9 ]*\] failed`, c.rank), err.Error())
				}
				require.ErrorContains(t, g.errs[c.rank], "CUDA_ERROR_UNKNOWN")
				g.release(t, d)
				checkReleases(t, fakeLog(), fakeCall{Name: c.fn}, c.n)
			})
			require.Equal(t, fds, leakcheck.OpenFDs(), "file descriptors leaked")
		})
	}
}

// The gate is agreed before anything multicast happens: one rank's veto
// (or failed preparation) keeps cuMulticastCreate from being reached on
// every rank.
func TestSetupMulticastVetoOnOneRank(t *testing.T) {
	for _, v := range multicastVetoes {
		t.Run(v.name, func(t *testing.T) {
			withFake(t, func(d *Driver) {
				fakeSetAttr(AttrMulticastSupported, 1)
				if !v.dev {
					// The device attribute is global in the fake; the
					// device veto is covered by TestEnableMulticastNeverReachesDriverWhenVetoed.
					t.Skip("per-rank device support cannot be faked")
				}
				env := func(r int) func(string) string {
					if r == 1 {
						return envOf(v.env)
					}
					return envOf(optIn(nil))
				}
				g := setupGroup(t, d, 3, 0, env, nil)
				for _, err := range g.errs {
					require.ErrorIs(t, err, ErrNotSupported)
					require.ErrorContains(t, err, "ranks [1] failed at the gate")
				}
				require.Zero(t, fakeCalls("cuMulticastCreate"))
				require.Zero(t, fakeCalls("cuMulticastAddDevice"))
				g.release(t, d)
			})
		})
	}
	withFake(t, func(d *Driver) {
		fakeSetAttr(AttrMulticastSupported, 1)
		g := setupGroup(t, d, 2, 0, optInEnv, func(r int) error {
			if r == 1 {
				return errors.New("no NVLS kernels")
			}
			return nil
		})
		for _, err := range g.errs {
			require.ErrorIs(t, err, ErrNotSupported)
		}
		require.ErrorContains(t, g.errs[1], "no NVLS kernels")
		require.Zero(t, fakeCalls("cuMulticastCreate"))
		g.release(t, d)
	})
}

// Sizes the object cannot cover, and bad group shapes, fail the gate.
func TestSetupMulticastChecksItsSpec(t *testing.T) {
	withFake(t, func(d *Driver) {
		fakeSetAttr(AttrMulticastSupported, 1)
		l := newLockstep(1)
		l.run(func(p *lockstepPeer) {
			for _, spec := range []McSpec{
				{World: 1, Size: 3 << 20, Mem: 1},          // not a multiple of 2 MiB
				{World: 1, Size: 2 << 20, MemOffset: 4096}, // misaligned offset
				{World: 1, Root: 1, Size: 2 << 20},
				{World: MaxRanks + 1, Size: 2 << 20},
				{World: 1},
			} {
				_, err := SetupMulticast(d, envOf(optIn(nil)), spec, p, nil)
				require.ErrorIs(t, err, ErrNotSupported, "%+v", spec)
			}
		})
		require.Zero(t, fakeCalls("cuMulticastCreate"))
	})
}
