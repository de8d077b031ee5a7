package gobackend

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// withSlots connects a 2-rank group whose teams have n sync slots.
func withSlots(t *testing.T, n int) []*Endpoint {
	eps, errs := connect(t, 2, 20*time.Second, func(_ int, c *Config) { c.Slots = n })
	for _, err := range errs {
		require.NoError(t, err)
	}
	return eps
}

// TestSlotIsReusedAfterItsBarrier shows the hazard the copies design out
// (UCC alltoallv race): rank 1's slot for publication s still holds it after
// N-1 further publications, and holds publication s+N after the N-th, while
// the copy Barrier returned still holds publication s.
func TestSlotIsReusedAfterItsBarrier(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("slots%d", n), func(t *testing.T) {
			eps := withSlots(t, n)
			who := symm.Who{Op: "test"}
			meta := func(r, i int) []byte { return bytes.Repeat([]byte{byte(16*r + i)}, 16) }
			snaps := make([][][]byte, 2)
			barriers := func(from, to int) { // publications from..to-1 of both ranks
				errs := make(chan error, 2)
				for r, ep := range eps {
					go func() {
						var err error
						for i := from; i < to && err == nil; i++ {
							var got [][]byte
							got, err = ep.team.Barrier(meta(r, i), who, time.Now().Add(5*time.Second))
							if i == 0 {
								snaps[r] = got
							}
						}
						errs <- err
					}()
				}
				require.NoError(t, <-errs)
				require.NoError(t, <-errs)
			}
			barriers(0, n)
			s := eps[0].team.Published() - uint32(n) + 1 // the first publication
			stamp, live := eps[0].team.PeekSlot(1, s)
			require.Equal(t, s, stamp, "N-1 later publications leave slot s alone")
			require.Equal(t, meta(1, 0), live[:16])
			barriers(n, n+1)
			stamp, live = eps[0].team.PeekSlot(1, s)
			require.Equal(t, s+uint32(n), stamp, "the N-th later publication reuses the slot")
			require.Equal(t, meta(1, n), live[:16], "a read after the barrier sees another op's metadata")
			require.Equal(t, meta(1, 0), snaps[0][1], "the copy keeps rank 1's publication s")
		})
	}
}

// delayedAllToAll runs 4N+1 uneven direct all_to_all ops on a group with n
// sync slots. Rank 1 posts them all first; rank 0 is held after each op's
// completion barrier, before its release step, until rank 1 has published
// its next op (it has run ahead). Each op uses one of three input buffers
// per rank and its own counts, so consecutive ops publish different
// metadata. It checks every result, and the peer-mapping cache and its pins
// afterwards; it returns, for every op but the last, what a late reader on
// rank 0 would find in rank 1's slot of that op once rank 1 ran ahead.
func delayedAllToAll(t *testing.T, n int) []lateRead {
	eps := withSlots(t, n)
	for _, ep := range eps {
		ep.exec.DirectMin = 1
	}
	const size, bufs = 1000, 3
	nops := 4*max(n, 2) + 1
	cnt := func(k, s, d int) int { return 100 + 300*s + 200*d + 37*(k%5) } // uneven, fits size
	in := make([][][]float32, 2)
	for r := range in {
		for b := 0; b < bufs; b++ {
			buf := shared(t, 2*size)
			for i := range buf {
				buf[i] = rand.Float32()
			}
			in[r] = append(in[r], buf)
		}
	}
	outs := make([][][]float32, nops)
	for k := range outs {
		for range eps {
			out := shared(t, 2*size)
			for i := range out {
				out[i] = -1 // poison: what no piece covers stays -1
			}
			outs[k] = append(outs[k], out)
		}
	}
	var late []lateRead
	var hookErr atomic.Value
	fail := func(format string, args ...any) { hookErr.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
	team := eps[0].team // rank 0's view of both ranks' control regions
	pins := func() int64 { return eps[0].bind.Stats()["peer_map_pins"] }
	coll.Hook = func(at coll.HookPoint, rank int, o *Op) {
		if rank != 0 || o.Kind != ops.AllToAll {
			return
		}
		k := int(o.Seq) - 1   // rank 0 posts nothing else
		p := team.Published() // this op's last publication: its metadata, or its bind vote
		switch at {
		case coll.AfterAgree:
			if stamp, _ := team.PeekSlot(1, p); stamp != p || pins() != 0 {
				fail("op %d after agreement: rank 1's slot holds publication %d, not %d; %d pins", k, stamp, p, pins())
			}
		case coll.BeforeRelease:
			if pins() != 1 {
				fail("op %d before release: %d pins, want 1 (rank 1's region)", k, pins())
			}
			if k == nops-1 {
				return // rank 1 has nothing left to run ahead into
			}
			for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
				if stamp, _ := team.PeekSlot(1, p+1); stamp == p+1 {
					break
				}
				if time.Now().After(deadline) {
					fail("op %d: rank 1 never published its next op", k)
					return
				}
			}
			stamp, live := team.PeekSlot(1, p) // what a late reader would see
			l := lateRead{op: k, ahead: stamp - p, voted: k < bufs}
			l.countIntact = binary.LittleEndian.Uint64(live[symm.SlotHeaderBytes:]) == uint64(cnt(k, 1, 0))
			late = append(late, l)
		}
	}
	defer func() { coll.Hook = nil }()
	post := func(r, k int) *Work {
		op := &Op{Kind: ops.AllToAll, DType: dtype.Float32}
		src := in[r][k%bufs]
		for d := 0; d < 2; d++ {
			op.InPieces = append(op.InPieces, Piece{Addr: addr(src[d*size:]), Count: cnt(k, r, d)})
			op.OutPieces = append(op.OutPieces, Piece{Addr: addr(outs[k][r][d*size:]), Count: cnt(k, d, r)})
		}
		w, err := eps[r].Post(op)
		require.NoError(t, err)
		return w
	}
	works := make([][2]*Work, nops)
	for k := range works { // rank 1 queues everything first
		works[k][1] = post(1, k)
	}
	for k := range works {
		works[k][0] = post(0, k)
	}
	for k := range works {
		for r := range eps {
			require.NoError(t, works[k][r].Wait(-1))
			for s := 0; s < 2; s++ {
				c := cnt(k, s, r)
				got := outs[k][r][s*size : (s+1)*size]
				require.Equal(t, in[s][k%bufs][r*size:r*size+c], got[:c], "op %d rank %d from %d", k, r, s)
				require.Equal(t, fill(-1, size-c), got[c:], "op %d rank %d from %d: past the piece", k, r, s)
			}
		}
	}
	if e := hookErr.Load(); e != nil {
		t.Fatal(e)
	}
	require.Len(t, late, nops-1, "rank 0 saw rank 1 run ahead at every op but the last")
	for r, ep := range eps {
		st := ep.bind.Stats()
		assert.Equal(t, int64(0), st["peer_map_pins"], "rank %d: every pin released", r)
		assert.Equal(t, int64(bufs), st["peer_maps"], "rank %d maps each of its peer's input regions once", r)
		assert.Equal(t, int64(bufs), st["peer_map_misses"], "rank %d", r)
		assert.Equal(t, int64(nops), st["peer_map_hits"], "rank %d pins its peer's region once per op", r)
		assert.Equal(t, int64(0), st["peer_map_dropped"], "rank %d", r)
		if n >= symm.MinSlots {
			assert.Equal(t, int64(0), ep.team.SlotStalls(), "rank %d: no publication waited for a slot", r)
		}
	}
	return late
}

// lateRead is what a read of rank 1's slot of op `op` would find after the
// completion barrier, once rank 1 ran ahead: ahead is the slot's stamp
// minus the op's publication; countIntact says whether the count rank 1
// sends rank 0 is still the op's (meaningless for ops that first bind a
// buffer: their last publication is a one-byte vote).
type lateRead struct {
	op                 int
	ahead              uint32
	voted, countIntact bool
}

func fill(v float32, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// TestDirectAllToAllWithDelayedRank: with N sync slots, rank 0 held
// between the completion barrier and the release of each of 4N+1 ops while
// rank 1 runs ahead into the next op: results stay right, pins return to
// zero, and rank 1 gets exactly one op ahead, so the held op's slot is
// still intact (the bound on running ahead: N-1 ops, here 1).
func TestDirectAllToAllWithDelayedRank(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("slots%d", n), func(t *testing.T) {
			for _, l := range delayedAllToAll(t, n) {
				require.Equal(t, uint32(0), l.ahead, "op %d: rank 1's slot of the held op holds a later publication", l.op)
				require.True(t, l.voted || l.countIntact, "op %d", l.op)
			}
		})
	}
}

// TestLateSlotReadBreaks is the negative of the test above: with one slot
// (below the minimum; the slot wait keeps it sound) rank 1's next op reuses
// the held op's slot, so a release step that read the slot after the
// barrier would find the next op's metadata (its counts), while the op's
// private copy keeps the results right.
func TestLateSlotReadBreaks(t *testing.T) {
	checked := 0
	for _, l := range delayedAllToAll(t, 1) {
		require.Equal(t, uint32(1), l.ahead, "op %d: the slot holds rank 1's next publication", l.op)
		if !l.voted {
			require.False(t, l.countIntact, "op %d: a late read sees the next op's count", l.op)
			checked++
		}
	}
	require.Positive(t, checked)
}

// TestSlotCountMustAgree: ranks configured with different GOSYM_SLOTS fail
// to connect, each naming the setting.
func TestSlotCountMustAgree(t *testing.T) {
	_, errs := connect(t, 2, 5*time.Second, func(r int, c *Config) { c.Slots = 2 + 2*r })
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		require.Equal(t, status.Mismatch, status.CodeOf(err))
		require.Contains(t, err.Error(), "GOSYM_SLOTS=", "rank %d", r)
	}
}

// TestSlotsFromEnv: GOSYM_SLOTS is validated, not silently replaced.
func TestSlotsFromEnv(t *testing.T) {
	for v, want := range map[string]int{"": symm.DefaultSlots, "2": 2, "7": 7, "256": 256} {
		t.Setenv("GOSYM_SLOTS", v)
		c, err := DefaultConfig(2)
		require.NoError(t, err, v)
		require.Equal(t, want, c.Slots, v)
	}
	for _, v := range []string{"1", "0", "-3", "257", "four", "2.5"} {
		t.Setenv("GOSYM_SLOTS", v)
		_, err := NewEndpoint(0, 2, time.Second, "bad")
		require.Error(t, err, v)
		require.Equal(t, status.InvalidArg, status.CodeOf(err), v)
		require.True(t, strings.Contains(err.Error(), "GOSYM_SLOTS=") && strings.Contains(err.Error(), "from 2 to 256"), err.Error())
	}
}
