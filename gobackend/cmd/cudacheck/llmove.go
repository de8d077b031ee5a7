package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
)

// gs_llmove (copy.cu) on simulated ranks of one GPU: broadcast, all_gather,
// all_to_all, gather and scatter set up as the backend does
// (gobackend/internal/gpu/ops.go, llMove), launched back to back and between gs_ll
// launches on the same pads and LL areas; every byte of every buffer,
// guards included, is compared with a host reference.

// moveCases are the gs_llmove cases of runCases, on the pads (and LL
// areas) of padsFor, shared with the gs_ll cases. A launch of the largest
// segment takes world × LLBlocks blocks that must all be resident at once
// (the simulated ranks wait for each other): those run on 2 ranks.
func (c *checker) moveCases(g *gpu, padsFor func(world int) (*padSet, error)) {
	mis := [][2]int{{0, 0}, {1, 0}, {0, 3}, {5, 13}, {7, 7}}
	for kind := moveBroadcast; kind <= moveScatter; kind++ {
		for i, n := range []int{1, 3, 8, 9, 4100, 60001, cuda.LLMaxBytes} {
			v := i + int(kind)
			k := moveCase{kind: kind, world: 2 + v%3, bytes: n, inPlace: v%2 == 1, misalign: misalign{mis[v%5][0],
				mis[v%5][1]}}
			if n == cuda.LLMaxBytes {
				k.world = 2
			}
			if v/2%2 == 1 {
				k.root = k.world - 1
			}
			record(k.String()+", 3 launches back to back", func() error {
				pads, err := padsFor(k.world)
				if err != nil {
					return err
				}
				rng := rand.New(rand.NewPCG(seedOf(k.String()), 11))
				next := func() (step, error) { return c.newMoveStep(g, pads, k, rng) }
				return c.runFresh(g, pads, next, next, next)
			})
		}
	}
	record("gs_ll and gs_llmove in turn, back to back on 2 simulated ranks, grids 1 to 64", func() error {
		pads, err := padsFor(2)
		if err != nil {
			return err
		}
		return c.mixedLLCase(g, pads)
	})
	for _, k := range []moveCase{
		{kind: moveAllGather, world: 2, bytes: 8}, // rank 0 waits for rank 1's lines
		{kind: moveBroadcast, world: 2, bytes: 8}, // the root waits for rank 1's handshake line
	} {
		record(fmt.Sprintf("gs_llmove %s timeout names the missing rank (rank 1 absent, 5 ms)", k.kind), func() error {
			return c.moveTimeoutCase(g, k)
		})
	}
}

// mixedLLCase launches gs_ll all-reduces and gs_llmove launches in turn,
// back to back on pads' group, with different grids: they share the LL
// areas and every block's launch counter.
func (c *checker) mixedLLCase(g *gpu, pads *padSet) error {
	world := len(pads.bufs)
	rng := rand.New(rand.NewPCG(5, 6))
	var next []func() (step, error)
	for i, st := range []struct{ numel, moveBytes int }{ // f32 elements of gs_ll, bytes of gs_llmove
		{3, 60001}, {cuda.LLMaxBytes / 4, 9}, {20011, cuda.LLMaxBytes}, {1, 4100}, {cuda.LLMaxBytes/4 - 1, 1},
	} {
		ar := arCase{algo: cuda.LL, dt: dtype.Float32, op: dtype.Sum, world: world, numel: st.numel, mis: i % 2}
		mv := moveCase{kind: moveKind(i), world: world, root: i % world, bytes: st.moveBytes, inPlace: i%2 == 0,
			misalign: misalign{i % 3, 2*i + 1}}
		next = append(next, func() (step, error) { return c.newARStep(g, pads, ar) },
			func() (step, error) { return c.newMoveStep(g, pads, mv, rng) })
	}
	return c.runFresh(g, pads, next...)
}

// moveTimeoutCase launches rank 0's part of k (a world of 2) with rank 1
// absent: block 0 must give up on rank 1 after 5 ms.
func (c *checker) moveTimeoutCase(g *gpu, k moveCase) error {
	pads, err := c.newPads(g, 2) // for the step's LL areas; expectTimeout brings its own pads
	if err != nil {
		return err
	}
	s, err := c.newMoveStep(g, pads, k, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		return err
	}
	defer s.free()
	p := s.ps[0]
	p.TimeoutNs = 5_000_000
	grid, block := cuda.LLGrid(uint64(k.bytes), 1)
	return c.expectTimeout(g, cuda.LLMoveKernel, grid, block, func(pads *padSet) cuda.Param {
		p.Pads = pads.ptrs
		return &p
	}, cuda.LLWaitDetail|1)
}

type moveKind int

const (
	moveBroadcast moveKind = iota
	moveAllGather
	moveAllToAll
	moveGather
	moveScatter
)

func (m moveKind) String() string {
	return [...]string{"broadcast", "all_gather", "all_to_all", "gather", "scatter"}[m]
}

// Where a segment of a gs_llmove launch lies: off bytes into its rank's
// input (segIn) or output (segOut); segNone: none (a null pointer).
type seg struct {
	buf int
	off uintptr
}

const (
	segNone = iota - 1
	segIn
	segOut
)

type moveCase struct {
	kind        moveKind
	world, root int
	bytes       int // per segment
	inPlace     bool
	misalign
}

func (k moveCase) String() string {
	s := fmt.Sprintf("gs_llmove %s world=%d", k.kind, k.world)
	if k.kind == moveBroadcast || k.kind == moveGather || k.kind == moveScatter {
		s += fmt.Sprintf(" root=%d", k.root)
	}
	s += fmt.Sprintf(" bytes=%d misalign=%d/%d", k.bytes, k.srcMis, k.dstMis)
	if k.inPlace {
		s += " in place"
	}
	return s
}

// layout says, for rank r, what it sends rank q (src[r][q]) and where what
// q sends lands (dst[r][q]), and the length of every rank's input and
// output (one a rank does not use must stay untouched). In place, the
// root's or every rank's input is its chunk of the output (scatter: the
// root's output is its chunk of the input).
func (k moveCase) layout() (src, dst [][]seg, inLen, outLen uintptr) {
	n, w := uintptr(k.bytes), uintptr(k.world)
	inLen, outLen = n, w*n
	switch k.kind {
	case moveBroadcast:
		outLen = n
	case moveAllToAll:
		inLen = w * n
	case moveScatter:
		inLen, outLen = w*n, n
	}
	in := func(c int) seg { return seg{segIn, uintptr(c) * n} }   // chunk c of the input
	out := func(c int) seg { return seg{segOut, uintptr(c) * n} } // chunk c of the output
	src, dst = make([][]seg, k.world), make([][]seg, k.world)
	for r := range k.world {
		src[r], dst[r] = make([]seg, k.world), make([]seg, k.world)
		for q := range k.world {
			src[r][q], dst[r][q] = seg{buf: segNone}, seg{buf: segNone}
			switch k.kind {
			case moveBroadcast:
				if r == k.root {
					src[r][q] = in(0)
					if k.inPlace {
						src[r][q] = out(0)
					}
				}
				if q == k.root {
					dst[r][q] = out(0)
				}
			case moveAllGather:
				src[r][q], dst[r][q] = in(0), out(q)
				if k.inPlace {
					src[r][q] = out(r)
				}
			case moveAllToAll:
				src[r][q], dst[r][q] = in(q), out(q)
				if k.inPlace {
					src[r][q] = out(q)
				}
			case moveGather:
				if q == k.root {
					src[r][q] = in(0)
					if k.inPlace && r == k.root {
						src[r][q] = out(r)
					}
				}
				if r == k.root {
					dst[r][q] = out(q)
				}
			case moveScatter:
				if r == k.root {
					src[r][q] = in(q)
				}
				if q == k.root {
					dst[r][q] = out(0)
					if k.inPlace && r == k.root {
						dst[r][q] = in(r)
					}
				}
			}
		}
	}
	return src, dst, inLen, outLen
}

// moveStep is one gs_llmove launch of a moveCase on fresh data: rank r's
// input is bufs[2r] and its output bufs[2r+1], each with guardBytes before
// and after its data; want is what every buffer must hold after it.
type moveStep struct {
	k    moveCase
	fn   *cuda.Function
	bufs []*dbuf
	want [][]byte
	ps   []cuda.LLMoveParams
}

func (c *checker) newMoveStep(g *gpu, pads *padSet, k moveCase, rng *rand.Rand) (s *moveStep, err error) {
	fn, err := g.function(cuda.LLMoveKernel)
	if err != nil {
		return nil, err
	}
	s = &moveStep{k: k, fn: fn}
	defer func() {
		if err != nil {
			s.free()
			s = nil
		}
	}()
	areas, err := c.llAreas(g, pads)
	if err != nil {
		return s, err
	}
	src, dst, inLen, outLen := k.layout()
	// The memory before the launch: guards and outputs 0xab, random inputs.
	before := make([][]byte, 2*k.world)
	for i := range before {
		n := inLen
		if i%2 == 1 {
			n = outLen
		}
		before[i] = make([]byte, s.k.dataAt(i)+n+guardBytes)
		for j := range before[i] {
			before[i][j] = 0xab
		}
	}
	at := func(r int, sg seg) []byte { // the bytes of sg in before
		i := 2*r + sg.buf
		return before[i][s.k.dataAt(i)+sg.off:]
	}
	for r := range k.world {
		random(rng, at(r, seg{segIn, 0})[:inLen])
		for _, sg := range src[r] {
			if sg.buf == segOut {
				random(rng, at(r, sg)[:k.bytes])
			}
		}
	}
	for i, b := range before {
		d, err := c.upload(g, b)
		if err != nil {
			return s, err
		}
		s.bufs = append(s.bufs, d)
		s.want = append(s.want, append([]byte(nil), before[i]...))
	}
	// The reference: every rank r's dst[r][q] gets q's src[q][r] as it was.
	for r := range k.world {
		for q := range k.world {
			if d := dst[r][q]; d.buf != segNone {
				i := 2*r + d.buf
				copy(s.want[i][s.k.dataAt(i)+d.off:][:k.bytes], at(q, src[q][r])[:k.bytes])
			}
		}
	}
	ptr := func(r int, sg seg) uintptr {
		if sg.buf == segNone {
			return 0
		}
		i := 2*r + sg.buf
		return s.bufs[i].ptr + s.k.dataAt(i) + sg.off
	}
	s.ps = make([]cuda.LLMoveParams, k.world)
	for r := range k.world {
		p := &s.ps[r]
		p.Areas, p.Pads = areas, pads.ptrs
		for q := range k.world {
			p.Src[q], p.Dst[q] = ptr(r, src[r][q]), ptr(r, dst[r][q])
		}
		p.Bytes, p.TimeoutNs, p.World, p.Rank = uint64(k.bytes), timeoutNs, int32(k.world), int32(r)
	}
	return s, nil
}

func random(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

func (s *moveStep) free() { freeAll(s.bufs) }

func (s *moveStep) launch(c *checker, g *gpu, pads *padSet) error {
	grid, block := cuda.LLGrid(uint64(s.k.bytes), 1)
	return c.launchAll(g, pads, s.fn, true, grid, block, func(r int) cuda.Param { return &s.ps[r] })
}

// check compares every byte of every buffer with the reference.
func (s *moveStep) check() error {
	return checkBufs(s.bufs, s.want, func(i, first int, got []byte, bad int) error {
		at := s.k.dataAt(i)
		return fmt.Errorf("rank %d %s: %d bytes wrong, the first at %d (the data: [0, %d)) is %#x, want %#x",
			i/2, [2]string{"input", "output"}[i%2], bad, first-int(at), len(got)-int(at)-guardBytes, got[first],
			s.want[i][first])
	})
}

// checkBufs reads each buffer back and compares it with want, byte for
// byte; the first buffer that differs is reported by report (its index,
// the first wrong byte, what was read, and how many bytes differ).
func checkBufs(bufs []*dbuf, want [][]byte, report func(i, first int, got []byte, bad int) error) error {
	for i, b := range bufs {
		got, err := b.read(0, b.size)
		if err != nil {
			return err
		}
		bad, first := 0, 0
		for j := range got {
			if got[j] != want[i][j] {
				if bad == 0 {
					first = j
				}
				bad++
			}
		}
		if bad > 0 {
			return report(i, first, got, bad)
		}
	}
	return nil
}
