package gobackend

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// group connects world endpoints inside this process, as one rank each.
func group(t testing.TB, world int, timeout time.Duration) []*Endpoint {
	t.Helper()
	eps, errs := connect(t, world, timeout, nil)
	for _, err := range errs {
		require.NoError(t, err)
	}
	return eps
}

// connect creates world endpoints, lets adjust change each rank's config,
// and connects them; it returns every rank's Connect error.
func connect(t testing.TB, world int, timeout time.Duration, adjust func(r int, c *Config)) ([]*Endpoint, []error) {
	t.Helper()
	eps := make([]*Endpoint, world)
	blobs := make([][]byte, world)
	for r := range eps {
		ep, err := NewEndpoint(r, world, timeout, fmt.Sprintf("test%d", world))
		require.NoError(t, err)
		eps[r] = ep
		blobs[r] = ep.Blob()
		if adjust != nil {
			adjust(r, &ep.cfg)
		}
	}
	t.Cleanup(func() { destroyAll(t, eps) })
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r, ep := range eps {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = ep.Connect(blobs) }()
	}
	wg.Wait()
	return eps, errs
}

// failedTeardown bounds a group's teardown after a failed test: a rank's
// kernels may still wait there for a peer the failure stopped (on the fake
// driver, until the group's deadline), and a teardown that waits for them
// would hold the whole package until the test binary's timeout.
const failedTeardown = 2 * time.Minute

// destroyAll destroys the group's endpoints; after a failure it panics
// past failedTeardown, which ends the test binary with the failing test's
// output instead of hanging.
func destroyAll(t testing.TB, eps []*Endpoint) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, ep := range eps {
			if ep != nil {
				ep.Destroy()
			}
		}
	}()
	if !t.Failed() {
		<-done
		return
	}
	select {
	case <-done:
	case <-time.After(failedTeardown):
		panic(fmt.Sprintf("%s failed, and its group's teardown did not finish within %v "+
			"(kernels of a rank still waiting for a peer?)", t.Name(), failedTeardown))
	}
}

// pinned keeps every buffer handed to the engine reachable. Storing it here
// also makes it escape to the heap: a buffer on a goroutine stack would move
// when the stack grows, and the engine holds raw addresses.
var pinned sync.Map

func addr(b []float32) uintptr {
	if len(b) == 0 {
		return 0
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	pinned.Store(p, b)
	return p
}

// waitAll waits for every work and requires that each succeeded.
func waitAll(t *testing.T, ws ...*Work) {
	t.Helper()
	for i, w := range ws {
		require.NoError(t, w.Wait(-1), "work %d", i)
	}
}

// postAll posts one op per rank (built by mk) and waits for all of them.
func postAll(t *testing.T, eps []*Endpoint, mk func(r int) *Op) []error {
	works := make([]*Work, len(eps))
	for r, ep := range eps {
		w, err := ep.Post(mk(r))
		require.NoError(t, err)
		works[r] = w
	}
	errs := make([]error, len(eps))
	for r, w := range works {
		errs[r] = w.Wait(-1)
	}
	return errs
}

func TestAllReduceSumFloat32(t *testing.T) {
	for _, world := range []int{1, 2, 3, 4} {
		for _, n := range []int{0, 1, 3, 1025, 3<<20 + 7} {
			t.Run(fmt.Sprintf("w%d/n%d", world, n), func(t *testing.T) {
				eps := group(t, world, 20*time.Second)
				in := make([][]float32, world)
				out := make([][]float32, world)
				want := make([]float32, n)
				for r := range in {
					in[r] = make([]float32, n)
					out[r] = make([]float32, n)
					for i := range in[r] {
						in[r][i] = rand.Float32()
						out[r][i] = float32(-1e30)
					}
				}
				for i := range want {
					var s float32
					for r := range in {
						s += in[r][i]
					}
					want[i] = s
				}
				errs := postAll(t, eps, func(r int) *Op {
					return &Op{Kind: ops.AllReduce, DType: dtype.Float32, RedOp: dtype.Sum, Count: n, In: addr(in[r]), Out: addr(out[r])}
				})
				for r := range eps {
					require.NoError(t, errs[r])
					require.Equal(t, want, out[r], "rank %d", r)
				}
			})
		}
	}
}

func TestMismatchedCountsFailOnEveryRank(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	bufs := [][]float32{make([]float32, 10), make([]float32, 12)}
	errs := postAll(t, eps, func(r int) *Op {
		return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: len(bufs[r]), In: addr(bufs[r]), Out: addr(bufs[r])}
	})
	for _, err := range errs {
		require.ErrorContains(t, err, "disagree on the element count")
	}
	// The group stays usable after a mismatch.
	errs = postAll(t, eps, func(r int) *Op {
		return &Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 10, In: addr(bufs[r]), Out: addr(bufs[r])}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}

func TestMissingRankTimesOutNamingIt(t *testing.T) {
	eps := group(t, 3, 300*time.Millisecond)
	w, err := eps[0].Post(&Op{Kind: ops.Barrier})
	require.NoError(t, err)
	_, err = eps[1].Post(&Op{Kind: ops.Barrier})
	require.NoError(t, err)
	err = w.Wait(-1)
	require.ErrorContains(t, err, "barrier (seq 1): Timed out waiting for ranks [2]")
}
