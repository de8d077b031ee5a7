package gobackend

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/cuda/cudatest"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// The CUDA point-to-point patterns that NCCL completes, on simulated ranks
// of one process against the fake libcuda (four host-memory GPUs whose
// launches run the real p2p kernels, and whose legacy IPC opens within the
// process): rank r of a group runs on fake device r. Each rank posts its
// program on its own goroutine, as separate processes would, every CUDA
// send and recv on a stream of its own per peer and direction (as the
// Python side does), with no host synchronisation until all are posted;
// then every destination is compared with its sender's data, past a
// poisoned guard. The slots are 256 bytes, so the larger messages outgrow a
// channel's outbox (16 blocks x 4 slots) and a send waits on the device for
// its receiver.

// inP2PFakeCUDA runs the calling test in a child process against the fake
// libcuda (cudatest.InFakeChild), with 256-byte slots and p2p kernel blocks of 32
// threads (fewer OS threads per launch); it returns true in the parent.
func inP2PFakeCUDA(t *testing.T) bool {
	t.Setenv("GOSYM_GPU_P2P_SLOT_BYTES", "256")
	t.Setenv("FAKECUDA_P2P_THREADS", "32")
	return cudatest.InFakeChild(t)
}

// p2pStep is one CUDA send or recv of a rank's program; msg names the
// message (its sender's data and its receiver's expectation).
type p2pStep struct {
	send bool
	peer int
	n    int // float32 elements
	msg  int
}

// p2pRank is a simulated rank of a group: its endpoint, its fake device,
// and its streams by (peer, recv).
type p2pRank struct {
	ep      *Endpoint
	device  int
	g       *gpu.Device
	streams map[[2]int]cuda.Stream
}

func (s *p2pRank) stream(t *testing.T, peer int, recv bool) cuda.Stream {
	k := [2]int{peer, 0}
	if recv {
		k[1] = 1
	}
	if st, ok := s.streams[k]; ok {
		return st
	}
	st, err := s.g.Driver().StreamCreate(s.g.Context(), cuda.StreamNonBlocking)
	require.NoError(t, err)
	s.streams[k] = st
	// Gone from the cache with the stream: a later test (a subtest after the one that made
	// it) gets a stream of its own, not a destroyed one (on the fake driver a launch on a
	// destroyed stream never returned).
	t.Cleanup(func() {
		delete(s.streams, k)
		s.g.Driver().StreamDestroy(s.g.Context(), st)
	})
	return st
}

func (s *p2pRank) sync(t *testing.T) {
	for _, st := range s.streams {
		require.NoError(t, s.g.Driver().StreamSynchronize(s.g.Context(), st))
	}
}

// p2pGroup connects a group whose rank r runs on fake device devices[r],
// destroyed at the end of t by every rank at once (as processes would: a
// rank's teardown waits for its peers to leave their channels).
func p2pGroup(t testing.TB, devices []int, timeout time.Duration) []*p2pRank {
	withProcessDevice(t, -1) // no responder takes another simulated rank's device
	eps := group(t, len(devices), timeout)
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, ep := range eps {
			wg.Add(1)
			go func() { defer wg.Done(); ep.Destroy() }()
		}
		wg.Wait()
	})
	ranks := make([]*p2pRank, len(devices))
	for r, d := range devices {
		g, err := gpu.Open(d)
		require.NoError(t, err)
		ranks[r] = &p2pRank{ep: eps[r], device: d, g: g, streams: map[[2]int]cuda.Stream{}}
	}
	return ranks
}

// p2pGuard is how many poisoned elements follow each destination.
const p2pGuard = 8

// msgValue is element i of message m: distinct per message and element.
func msgValue(m, i int) float32 { return float32(m*100003+i%65521) + 0.25 }

// runP2PProgram runs prog (prog[r]: rank r's steps, in post order) and
// checks every message. delay[r], if set, is how long rank r waits before
// posting (a late rank).
func runP2PProgram(t *testing.T, ranks []*p2pRank, prog [][]p2pStep, delay []time.Duration) {
	t.Helper()
	type buf struct {
		ptr uintptr
		g   *gpu.Device
		n   int
	}
	bufs := make([][]buf, len(prog))
	for r, steps := range prog {
		g := ranks[r].g
		for _, s := range steps {
			b := make([]byte, 4*(s.n+p2pGuard))
			for i := range b {
				b[i] = 0xff // NaN: a poisoned destination, or the source's guard
			}
			if s.send {
				for i := 0; i < s.n; i++ {
					binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(msgValue(s.msg, i)))
				}
			}
			p, err := g.Driver().MemAlloc(g.Context(), uintptr(len(b)))
			require.NoError(t, err)
			t.Cleanup(func() { g.Driver().MemFree(g.Context(), p) })
			require.NoError(t, g.Driver().MemcpyHtoD(g.Context(), p, b))
			bufs[r] = append(bufs[r], buf{ptr: p, g: g, n: s.n})
		}
	}
	errs := make([]error, len(prog))
	var wg sync.WaitGroup
	for r, steps := range prog {
		streams := make([]cuda.Stream, len(steps))
		for i, s := range steps {
			streams[i] = ranks[r].stream(t, s.peer, !s.send)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r < len(delay) {
				time.Sleep(delay[r])
			}
			for i, s := range steps {
				op := &Op{Kind: ops.Recv, DType: dtype.Float32, Peer: s.peer, Count: s.n, Out: bufs[r][i].ptr}
				if s.send {
					op = &Op{Kind: ops.Send, DType: dtype.Float32, Peer: s.peer, Count: s.n, In: bufs[r][i].ptr}
				}
				if _, err := ranks[r].ep.PostCUDA(op, ranks[r].device, uintptr(streams[i]), false); err != nil {
					errs[r] = fmt.Errorf("rank %d step %d (%+v): %w", r, i, s, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for _, rk := range ranks {
		rk.sync(t)
	}
	for r, steps := range prog {
		for i, s := range steps {
			if s.send {
				continue
			}
			b := bufs[r][i]
			got := make([]byte, 4*(b.n+p2pGuard))
			require.NoError(t, b.g.Driver().MemcpyDtoH(b.g.Context(), got, b.ptr))
			for j := 0; j < b.n+p2pGuard; j++ {
				v := binary.LittleEndian.Uint32(got[4*j:])
				if j < b.n {
					require.Equal(t, msgValue(s.msg, j), math.Float32frombits(v), "rank %d step %d (%+v) element %d", r, i, s, j)
				} else {
					require.Equal(t, uint32(0xffffffff), v, "rank %d step %d: guard element %d written", r, i, j-b.n)
				}
			}
		}
	}
	for _, rk := range ranks {
		require.NoError(t, rk.ep.DeviceError())
	}
}

// p2pProgram builds per-rank programs from messages: each message (from,
// to, n) becomes a send in from's program and a recv in to's, placed by
// order, which returns the position key of a step (lower first; ties keep
// the message order).
type p2pMessage struct{ from, to, n int }

func p2pProgram(world int, msgs []p2pMessage, order func(rank int, s p2pStep) int) [][]p2pStep {
	prog := make([][]p2pStep, world)
	for m, x := range msgs {
		prog[x.from] = append(prog[x.from], p2pStep{send: true, peer: x.to, n: x.n, msg: m})
		prog[x.to] = append(prog[x.to], p2pStep{peer: x.from, n: x.n, msg: m})
	}
	if order != nil {
		for r := range prog {
			keyed := prog[r]
			for i := 1; i < len(keyed); i++ { // a stable insertion sort by key
				for j := i; j > 0 && order(r, keyed[j]) < order(r, keyed[j-1]); j-- {
					keyed[j], keyed[j-1] = keyed[j-1], keyed[j]
				}
			}
		}
	}
	return prog
}

// ring is a ring of messages of n elements, rank r to rank r+dir.
func ring(world, dir, n int) []p2pMessage {
	var msgs []p2pMessage
	for r := 0; r < world; r++ {
		msgs = append(msgs, p2pMessage{r, (r + dir + world) % world, n})
	}
	return msgs
}

// recvFirst puts a rank's receives before its sends; sendFirst the other
// way round.
func recvFirst(_ int, s p2pStep) int {
	if s.send {
		return 1
	}
	return 0
}

func sendFirst(r int, s p2pStep) int { return 1 - recvFirst(r, s) }

// pipeline1F1B is a 1F1B pipeline schedule over world stages and mb
// micro-batches: activations go forward (stage s to s+1), gradients back.
// Each stage posts, per step, the receives and sends of that step
// together (batch_isend_irecv style), so that forward sends and backward
// receives are in flight at once; interleaved additionally sends the
// next micro-batch's activation before the current gradient's receive.
func pipeline1F1B(world, mb, n int, interleaved bool) [][]p2pStep {
	prog := make([][]p2pStep, world)
	id := func(fwd bool, s, m int) int { // message of micro-batch m leaving stage s
		k := 2 * (s*mb + m)
		if !fwd {
			k++
		}
		return k
	}
	for s := 0; s < world; s++ {
		warm := min(world-s-1, mb)
		var ops []p2pStep
		fwdRecv := func(m int) {
			if s > 0 {
				ops = append(ops, p2pStep{peer: s - 1, n: n, msg: id(true, s-1, m)})
			}
		}
		fwdSend := func(m int) {
			if s < world-1 {
				ops = append(ops, p2pStep{send: true, peer: s + 1, n: n, msg: id(true, s, m)})
			}
		}
		bwdRecv := func(m int) {
			if s < world-1 {
				ops = append(ops, p2pStep{peer: s + 1, n: n, msg: id(false, s+1, m)})
			}
		}
		bwdSend := func(m int) {
			if s > 0 {
				ops = append(ops, p2pStep{send: true, peer: s - 1, n: n, msg: id(false, s, m)})
			}
		}
		f, b := 0, 0
		for ; f < warm; f++ {
			fwdRecv(f)
			fwdSend(f)
		}
		for f < mb { // steady state: one forward, one backward
			fwdRecv(f)
			if interleaved {
				fwdSend(f)
				bwdRecv(b)
			} else {
				bwdRecv(b)
				fwdSend(f)
			}
			f++
			bwdSend(b)
			b++
		}
		for ; b < mb; b++ {
			bwdRecv(b)
			bwdSend(b)
		}
		prog[s] = ops
	}
	return prog
}

// TestCUDAP2PPatternsFake: every pattern, as the group's first CUDA
// point-to-point, at 2, 3 and 4 ranks; then again on the channels it made;
// then the responder's cases.
func TestCUDAP2PPatternsFake(t *testing.T) {
	if inP2PFakeCUDA(t) {
		return
	}
	const small, big = 33, 5000 // 132 bytes; 20000 bytes > 16 KiB of outbox
	for _, world := range []int{2, 3, 4} {
		devices := make([]int, world)
		for r := range devices {
			devices[r] = r
		}
		type pattern struct {
			name string
			prog func() [][]p2pStep
		}
		var allPairs []p2pMessage
		for a := 0; a < world; a++ {
			for b := 0; b < world; b++ {
				if a != b {
					allPairs = append(allPairs, p2pMessage{a, b, big})
				}
			}
		}
		// rotated: rank r talks to r+1 first, then r+2, ...; reversed: the
		// other way round (a cyclic order of first contacts in both).
		rotated := func(r int, s p2pStep) int { return (s.peer - r + world) % world }
		reversed := func(r int, s p2pStep) int { return (r - s.peer + world) % world }
		patterns := []pattern{
			{"ring forward", func() [][]p2pStep { return p2pProgram(world, ring(world, 1, big), sendFirst) }},
			{"ring backward, recv first", func() [][]p2pStep { return p2pProgram(world, ring(world, -1, big), recvFirst) }},
			{"rings both ways", func() [][]p2pStep {
				return p2pProgram(world, append(ring(world, 1, big), ring(world, -1, small)...), sendFirst)
			}},
			{"all pairs, rotated", func() [][]p2pStep { return p2pProgram(world, allPairs, rotated) }},
			{"all pairs, reversed", func() [][]p2pStep { return p2pProgram(world, allPairs, reversed) }},
			{"1F1B", func() [][]p2pStep { return pipeline1F1B(world, 4, big, false) }},
			{"1F1B interleaved", func() [][]p2pStep { return pipeline1F1B(world, 4, big, true) }},
		}
		for _, p := range patterns {
			t.Run(fmt.Sprintf("w%d/%s", world, p.name), func(t *testing.T) {
				ranks := p2pGroup(t, devices, 20*time.Second)
				runP2PProgram(t, ranks, p.prog(), nil) // the group's first CUDA p2p
				runP2PProgram(t, ranks, p.prog(), nil) // and again, on the channels it made
				for _, rk := range ranks {
					peers := map[int]bool{}
					for k := range rk.streams {
						peers[k[0]] = true
					}
					require.EqualValues(t, len(peers), rk.ep.StatsMap()["gpu_p2p_channels"],
						"rank %d: a channel per peer it talked to", rk.ep.Rank)
				}
			})
		}
	}
	responderCases(t)
}

// responderCases: the side that did not ask answers from its engine. A
// rank that posts late (its caller elsewhere) still meets its peers'
// channels; glare (both sides of every pair asking at once) converges on
// one channel per pair; a subgroup (on devices 1 and 3 of four) works as a
// group of its own.
func responderCases(t *testing.T) {
	t.Run("late peer", func(t *testing.T) {
		ranks := p2pGroup(t, []int{0, 1, 2}, 20*time.Second)
		prog := p2pProgram(3, ring(3, 1, 700), sendFirst)
		runP2PProgram(t, ranks, prog, []time.Duration{0, 300 * time.Millisecond, 0})
		answered := ranks[1].ep.StatsMap()["gpu_p2p_answered"].(int64)
		require.True(t, answered >= 1 && answered <= 2, "rank 1 answered rank 0 (and maybe 2) while asleep: %d", answered)
	})
	t.Run("glare", func(t *testing.T) {
		for try := 0; try < 3; try++ {
			ranks := p2pGroup(t, []int{0, 1, 2, 3}, 20*time.Second)
			var msgs []p2pMessage
			for a := 0; a < 4; a++ {
				for b := 0; b < 4; b++ {
					if a != b {
						msgs = append(msgs, p2pMessage{a, b, 5})
					}
				}
			}
			runP2PProgram(t, ranks, p2pProgram(4, msgs, nil), nil)
			for _, rk := range ranks {
				require.EqualValues(t, 3, rk.ep.StatsMap()["gpu_p2p_channels"])
			}
		}
	})
	t.Run("subgroup", func(t *testing.T) {
		ranks := p2pGroup(t, []int{1, 3}, 20*time.Second)
		runP2PProgram(t, ranks, p2pProgram(2, append(ring(2, 1, 5000), ring(2, 1, 3)...), recvFirst), nil)
	})
}
