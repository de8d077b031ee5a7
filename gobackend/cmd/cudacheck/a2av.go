package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// gs_a2av (p2p.cu) on simulated ranks of one GPU: the all_to_all(v) that
// runs the channel protocol for every ordered pair of ranks at once, over
// a staging of the checker's per rank (plain device memory: on one GPU
// every simulated rank may read it) and the signal pads of padsFor, whose
// counters carry over from launch to launch and from case to case. Every
// case launches back to back on fresh data with random skewed splits
// (empty pieces, single bytes, odd sizes at odd offsets, one pair that
// wraps the slots many times over); every byte of every input, output
// and guard is compared with a host reference, and the staging must hold
// nothing outside the slots.
//
// The blocks of one launch wait on the blocks of the other ranks'
// launches, so every simulated rank's pair blocks must be resident on the
// GPU at once: cuda.ResidentBlocks bounds nb by what the GPU holds.

// a2avCase is a gs_a2av case: launches launches back to back, each on
// world simulated ranks with nb blocks per pair and direction.
type a2avCase struct {
	world, nb int
	capped    bool    // nb is less than cuda.A2AVBlocksFor asked, for residency
	stage     uintptr // staging bytes of each rank
	slotWant  int     // the slot asked of cuda.A2AVSlotBytes
	launches  int
	piece     int  // the largest random piece
	big       int  // the big pair has at least this many bytes (and always 2*A2AVSlots+3 rounds)
	self      int  // a large local piece, for several copy blocks
	push      bool // the senders store into the receivers' stagings (GOSYM_GPU_A2AV_PUSH)
	misalign
}

// region is the bytes of one peer's region of a staging (world-1 of them).
func (k a2avCase) region() uint64 { return cuda.A2AVRegion(k.stage, k.world) }

func (k a2avCase) slot() uint64 { return cuda.A2AVSlotBytes(uintptr(k.region()), k.nb, k.slotWant) }

func (k a2avCase) String() string {
	s := fmt.Sprintf("gs_a2av world=%d nb=%d", k.world, k.nb)
	if k.capped {
		s += " (capped: residency)"
	}
	if k.push {
		s += " push"
	}
	return s + fmt.Sprintf(" slot=%d region=%d misalign=%d/%d, %d launches back to back, skewed splits", k.slot(),
		k.region(), k.srcMis, k.dstMis, k.launches)
}

// a2avCases are the gs_a2av cases of runCases, on the pads of padsFor.
func (c *checker) a2avCases(g *gpu, padsFor func(world int) (*padSet, error)) {
	fn, err := g.function(cuda.A2AVKernel)
	if err != nil {
		record("gs_a2av loaded", func() error { return err })
		return
	}
	resident := c.d.ResidentBlocks(g.dev, fn, cuda.BlockThreads)
	fmt.Printf("gs_a2av: %d blocks of %d threads resident at once\n", resident, cuda.BlockThreads)
	mis := [][2]int{{0, 0}, {1, 3}, {5, 13}, {7, 7}, {0, 9}, {3, 0}}
	var ks []a2avCase
	if c.quick {
		// The fake driver runs every thread of a launch as an OS thread:
		// small worlds and grids, a few rounds per pair.
		for i, k := range []a2avCase{
			{world: 2, nb: 1, slotWant: 4 << 10},
			{world: 2, nb: 2, slotWant: 1 << 30},
			{world: 3, nb: 1, slotWant: 1 << 30},
		} {
			k.stage, k.launches, k.piece, k.self = 96<<10+80, 3, 6000, 40001
			k.misalign = misalign{mis[i+1][0], mis[i+1][1]}
			ks = append(ks, k)
		}
	} else {
		for _, world := range []int{2, 3, 4} {
			for _, want := range []int{2, 32} {
				for _, slot := range []int{4 << 10, 1 << 30} { // small: many rounds; the largest that fits
					k := a2avCase{world: world, nb: cuda.A2AVBlocksFor(world, want), slotWant: slot,
						stage: 4<<20 + 4000, launches: 4, piece: 256 << 10, big: 1 << 20, self: 1<<20 + 5}
					if fit := resident / (world * 2 * (world - 1)); k.nb > fit {
						k.nb, k.capped = max(fit, 1), true
					}
					m := mis[len(ks)%len(mis)]
					k.misalign = misalign{m[0], m[1]}
					ks = append(ks, k)
				}
			}
		}
	}
	for _, k := range ks { // every case pulling, then pushing
		k.push = true
		ks = append(ks, k)
	}
	for _, k := range ks {
		record(k.String(), func() error {
			if k.world*2*(k.world-1)*k.nb > resident {
				return fmt.Errorf("%d pair blocks cannot be resident at once (%d fit)", k.world*2*(k.world-1)*k.nb,
					resident)
			}
			pads, err := padsFor(k.world)
			if err != nil {
				return err
			}
			return c.runA2AV(g, pads, k)
		})
	}
	mk := a2avCase{world: 3, nb: cuda.A2AVBlocksFor(3, 8), stage: 1<<20 + 48, slotWant: 4 << 10, launches: 3,
		piece: 64 << 10, big: 256 << 10, self: 300001, misalign: misalign{1, 3}}
	if c.quick {
		mk = a2avCase{world: 2, nb: 1, stage: 48<<10 + 16, slotWant: 4 << 10, launches: 3, piece: 3000, self: 5000,
			misalign: misalign{1, 3}}
	}
	tk := a2avCase{world: 2, nb: cuda.A2AVBlocksFor(2, 4), stage: 256 << 10, slotWant: 4 << 10, launches: 1,
		piece: 4096, self: 1001, misalign: misalign{5, 13}}
	if c.quick {
		tk.nb = 1
	}
	for _, push := range []bool{false, true} {
		mk.push, tk.push = push, push
		record(fmt.Sprintf("gs_a2av mismatch: rank 0 sends rank 1 more than it expects (world=%d nb=%d slot=%d push=%t): "+
			"rank 1 records it, leaves the piece, the next launches run in step", mk.world, mk.nb, mk.slot(), push),
			func() error { return c.a2avMismatchCase(g, mk) })
		record(fmt.Sprintf("gs_a2av timeout names the missing rank (rank 1 absent, 5 ms, nb=%d push=%t)", tk.nb, push),
			func() error { return c.a2avTimeoutCase(g, tk) })
	}
}

// a2avStart makes k's staging (the caller frees it), reads the pads'
// counters before the case and seeds its random source.
func (c *checker) a2avStart(g *gpu, pads *padSet, k a2avCase, seed string, stream uint64) (*a2avStaging, a2avCounts, *rand.Rand, error) {
	st, err := c.newA2AVStaging(g, k)
	if err != nil {
		return nil, nil, nil, err
	}
	before, err := readA2AVCounts(pads)
	if err != nil {
		st.free()
		return nil, nil, nil, err
	}
	return st, before, rand.New(rand.NewPCG(seedOf(seed), stream)), nil
}

// runA2AV runs k's launches back to back on pads and a staging of its own.
func (c *checker) runA2AV(g *gpu, pads *padSet, k a2avCase) error {
	st, before, rng, err := c.a2avStart(g, pads, k, k.String(), 13)
	if err != nil {
		return err
	}
	defer st.free()
	var next []func() (step, error)
	var sends [][][]uint64
	for j := range k.launches {
		next = append(next, func() (step, error) {
			send := k.splits(rng, j)
			sends = append(sends, send)
			return c.newA2AVStep(g, pads, st, k, send, transpose(send), rng)
		})
	}
	if err := c.runFresh(g, pads, next...); err != nil {
		return err
	}
	if err := k.checkCounts(pads, before, sends); err != nil {
		return err
	}
	return st.check(k)
}

// a2avCounts is every rank's gs_a2av counter words, from
// cuda.PadA2AVReadyWord on: ready, ack, sent and recvd, each of
// MaxRanks*A2AVBlocks words (peer*A2AVBlocks + block).
type a2avCounts [][]uint32

const a2avCountWords = 4 * cuda.MaxRanks * cuda.A2AVBlocks

func readA2AVCounts(pads *padSet) (a2avCounts, error) {
	var cs a2avCounts
	for _, b := range pads.bufs {
		w, err := b.read(cuda.PadA2AVReadyWord*4, 4*a2avCountWords)
		if err != nil {
			return nil, err
		}
		c := make([]uint32, a2avCountWords)
		for i := range c {
			c[i] = le32(w[4*i:])
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// checkCounts checks that every pair's four counters (the sender's sent
// and ack, the receiver's ready and recvd) moved on from before by the
// chunks of the launches with these split matrices (rounds of the
// sender's piece, at least one), those of blocks past nb not at all.
func (k a2avCase) checkCounts(pads *padSet, before a2avCounts, sends [][][]uint64) error {
	after, err := readA2AVCounts(pads)
	if err != nil {
		return err
	}
	const n = cuda.MaxRanks * cuda.A2AVBlocks
	const ready, ack, sent, recvd = 0, n, 2 * n, 3 * n
	round := uint64(k.nb) * k.slot()
	for i := range k.world {
		for q := range k.world {
			if q == i {
				continue
			}
			var chunks uint32
			for _, s := range sends {
				chunks += uint32(max((s[i][q]+round-1)/round, 1))
			}
			for b := range cuda.A2AVBlocks {
				want := chunks
				if b >= k.nb {
					want = 0
				}
				for _, w := range []struct {
					name     string
					rank, at int
				}{
					{"sent", i, sent + q*cuda.A2AVBlocks + b}, {"ack", i, ack + q*cuda.A2AVBlocks + b},
					{"ready", q, ready + i*cuda.A2AVBlocks + b}, {"recvd", q, recvd + i*cuda.A2AVBlocks + b},
				} {
					if got := after[w.rank][w.at] - before[w.rank][w.at]; got != want {
						return fmt.Errorf("pair %d->%d block %d: %s (rank %d's pad) moved by %d chunks, want %d",
							i, q, b, w.name, w.rank, got, want)
					}
				}
			}
		}
	}
	return nil
}

// a2avMismatchCase launches a correct all_to_all(v), then one in which
// rank 0 sends rank 1 more bytes than rank 1 expects, back to back on
// fresh pads: rank 1 must record the mismatch naming rank 0, drain the
// piece and leave its output untouched, every other piece must arrive;
// with rank 1's error cleared, two more correct launches on the same pads
// show the counters stayed in step.
func (c *checker) a2avMismatchCase(g *gpu, k a2avCase) error {
	pads, err := c.newPads(g, k.world)
	if err != nil {
		return err
	}
	st, before, rng, err := c.a2avStart(g, pads, k, "gs_a2av mismatch", 17)
	if err != nil {
		return err
	}
	defer st.free()
	good := k.splits(rng, 0)
	first, err := c.newA2AVStep(g, pads, st, k, good, transpose(good), rng)
	if err != nil {
		return err
	}
	defer first.free()
	send := k.splits(rng, 2)
	recv := transpose(send)
	// Rank 1 expects one round's worth at most; rank 0 sends it several
	// rounds, which rank 1 must drain in step.
	recv[1][0] = uint64(rng.IntN(int(k.slot()))) | 1
	send[0][1] = recv[1][0] + 4*uint64(k.nb)*k.slot() + 13
	bad, err := c.newA2AVStep(g, pads, st, k, send, recv, rng)
	if err != nil {
		return err
	}
	defer bad.free()
	for _, s := range []*a2avStep{first, bad} {
		if err := s.launch(c, g, pads); err != nil {
			return err
		}
	}
	if err := c.syncAll(g, k.world); err != nil {
		return err
	}
	for r, b := range pads.bufs {
		w, err := b.read(cuda.PadErrorWord*4, 12)
		if err != nil {
			return err
		}
		code, detail, missing := le32(w), le32(w[4:]), le32(w[8:])
		if r != 1 {
			if code != 0 || missing != 0 {
				return fmt.Errorf("rank %d pad error: code=%d detail=%#x missing=%#x, want none", r, code, detail,
					missing)
			}
			continue
		}
		if code != cuda.ErrMismatch || detail&cuda.A2AVDetail == 0 || (detail>>16)&0xff != cuda.A2AVMismatch ||
			detail&0xff != 0 || int(detail>>8&0xff) >= k.nb || missing != 1 {
			return fmt.Errorf("rank 1 error words code=%d detail=%#x missing=%#x, want code=%d detail=%#x|%#x|block<<8 "+
				"(block < %d, peer 0) missing=0x1", code, detail, missing, cuda.ErrMismatch, cuda.A2AVDetail,
				cuda.A2AVMismatch<<16, k.nb)
		}
	}
	for i, s := range []*a2avStep{first, bad} {
		if err := s.check(); err != nil {
			return fmt.Errorf("launch %d: %w", i, err)
		}
	}
	// The host takes the error in; the pads go on.
	if err := c.d.MemcpyHtoD(g.ctx, pads.bufs[1].ptr+cuda.PadErrorWord*4, make([]byte, 12)); err != nil {
		return err
	}
	sends := [][][]uint64{good, send} // the sender's piece sets the chunks
	next := func() (step, error) {
		send := k.splits(rng, 1)
		sends = append(sends, send)
		return c.newA2AVStep(g, pads, st, k, send, transpose(send), rng)
	}
	if err := c.runFresh(g, pads, next, next); err != nil {
		return fmt.Errorf("after the mismatch: %w", err)
	}
	if err := k.checkCounts(pads, before, sends); err != nil {
		return err
	}
	return st.check(k)
}

// a2avTimeoutCase launches rank 0's part of k (a world of 2) with rank 1
// absent: its pair blocks must give up on rank 1 after 5 ms, naming it,
// while its own piece is still copied. Pushing, rank 0 must not have
// stored a byte into rank 1's staging: rank 1 never granted a slot (its
// staging may hold another op's data until its own launch begins).
func (c *checker) a2avTimeoutCase(g *gpu, k a2avCase) error {
	pads, err := c.newPads(g, 2)
	if err != nil {
		return err
	}
	st, err := c.newA2AVStaging(g, k)
	if err != nil {
		return err
	}
	defer st.free()
	rng := rand.New(rand.NewPCG(seedOf("gs_a2av timeout"), 19))
	// More rounds than slots: the sender blocks run out of slots, the
	// receiver blocks wait for data.
	send := [][]uint64{{uint64(k.self), uint64(cuda.A2AVSlots+1)*uint64(k.nb)*k.slot() + 3}, {777, 5}}
	s, err := c.newA2AVStep(g, pads, st, k, send, transpose(send), rng)
	if err != nil {
		return err
	}
	defer s.free()
	// Nothing arrives from rank 1, and rank 1 itself never runs.
	s.keep(1, 1)
	s.keep(3, 0)
	s.keep(3, 1)
	p := s.ps[0]
	p.TimeoutNs = 5_000_000
	grid, block := cuda.A2AVGrid(2, k.nb, send[0][0])
	code, detail, missing, err := c.launchAlone(g, s.fn, grid, block, &p, pads)
	if err != nil {
		return err
	}
	what := detail >> 16 & 0xff
	if code != cuda.ErrTimeout || missing != 2 || detail&cuda.A2AVDetail == 0 || detail&0xff != 1 ||
		(what != cuda.A2AVWaitSlot && what != cuda.A2AVWaitData) || int(detail>>8&0xff) >= k.nb {
		return fmt.Errorf("error words code=%d detail=%#x missing=%#x, want code=%d detail=%#x|what<<16|block<<8|1 "+
			"(what %d or %d, block < %d) missing=0x2", code, detail, missing, cuda.ErrTimeout, cuda.A2AVDetail,
			cuda.A2AVWaitSlot, cuda.A2AVWaitData, k.nb)
	}
	if k.push {
		got, err := st.bufs[1].read(0, st.bufs[1].size)
		if err != nil {
			return err
		}
		for j, v := range got {
			if v != 0xab {
				return fmt.Errorf("rank 1's staging changed at byte %d before rank 1 granted a slot", j-guardBytes)
			}
		}
	}
	return s.check()
}

// splits is a random skewed split matrix for launch j of k: s[i][q] is
// what rank i sends rank q. Most pieces are small, empty or a single
// byte; one pair wraps every block's slots several times; launch 1 (mod
// 3) has a rank that sends nothing at all and one that gets a single byte
// from every other rank, launch 2 large local pieces.
func (k a2avCase) splits(rng *rand.Rand, j int) [][]uint64 {
	w := k.world
	s := make([][]uint64, w)
	for i := range s {
		s[i] = make([]uint64, w)
		for q := range s[i] {
			switch rng.IntN(8) {
			case 0, 1:
			case 2:
				s[i][q] = 1
			case 3:
				s[i][q] = uint64(rng.IntN(48))
			default:
				s[i][q] = uint64(rng.IntN(k.piece + 1))
			}
		}
	}
	from := rng.IntN(w)
	to := (from + 1 + rng.IntN(w-1)) % w
	round := uint64(k.nb) * k.slot()
	big := max(uint64(2*cuda.A2AVSlots+3)*round, uint64(k.big))
	s[from][to] = big + uint64(rng.IntN(int(min(round, 1<<16))))/2*2 + 1
	switch j % 3 {
	case 1:
		idle := (from + 1) % w
		for q := range w {
			s[idle][q] = 0
			if q != idle && q != from {
				s[q][from] = 1
			}
		}
	case 2:
		for r := range w {
			s[r][r] = uint64(k.self + rng.IntN(k.self/8+1))
		}
	}
	return s
}

func transpose(m [][]uint64) [][]uint64 {
	t := make([][]uint64, len(m))
	for i := range t {
		t[i] = make([]uint64, len(m))
		for q := range t[i] {
			t[i][q] = m[q][i]
		}
	}
	return t
}

// a2avStaging is one staging per simulated rank, guardBytes either side,
// filled with 0xab; the slots of each of its world-1 regions lie in the
// region's first nb*A2AVSlots*slot bytes, nothing else may change.
type a2avStaging struct {
	bufs []*dbuf
	ptrs [cuda.MaxRanks]uintptr
}

func (c *checker) newA2AVStaging(g *gpu, k a2avCase) (*a2avStaging, error) {
	st := &a2avStaging{}
	for r := range k.world {
		b, err := c.alloc(g, k.stage+2*guardBytes)
		if err != nil {
			st.free()
			return nil, err
		}
		st.bufs = append(st.bufs, b)
		if err := b.fill(0xab); err != nil {
			st.free()
			return nil, err
		}
		st.ptrs[r] = b.ptr + guardBytes
	}
	return st, nil
}

func (st *a2avStaging) free() { freeAll(st.bufs) }

// check finds a byte of a staging that changed outside the slots: in
// the guards, past the slots of a region or past the last region.
func (st *a2avStaging) check(k a2avCase) error {
	region, used := k.region(), uint64(k.nb*cuda.A2AVSlots)*k.slot()
	for r, b := range st.bufs {
		got, err := b.read(0, b.size)
		if err != nil {
			return err
		}
		for j, v := range got {
			if v == 0xab {
				continue
			}
			off := int64(j) - guardBytes
			if off >= 0 && off < int64(k.stage) {
				if q := uint64(off) / region; q < uint64(k.world-1) && uint64(off)%region < used {
					continue
				}
			}
			return fmt.Errorf("rank %d staging: byte %d (of %d; region %d, slots in its first %d) changed to %#x",
				r, off, k.stage, region, used, v)
		}
	}
	return nil
}

// a2avStep is one gs_a2av launch on every simulated rank, on fresh data:
// rank r's input is bufs[2r] and its output bufs[2r+1], each with
// guardBytes before and after its data; the input is the pieces rank r
// sends ranks 0, 1, ... one after another, the output the pieces it
// expects from them. want is what every buffer must hold after the launch.
type a2avStep struct {
	k          a2avCase
	fn         *cuda.Function
	send, recv [][]uint64 // send[i][q]: what rank i sends q; recv[r][q]: what r expects from q
	bufs       []*dbuf
	before     [][]byte
	want       [][]byte
	ps         []cuda.A2AVParams
	st         *a2avStaging // its slots are scrubbed behind every rank's launch
}

// piece is where piece q of buffer i lies in it, and its length.
func (s *a2avStep) piece(i, q int) (at, n uintptr) {
	sizes := s.send[i/2]
	if i%2 == 1 {
		sizes = s.recv[i/2]
	}
	at = s.k.dataAt(i)
	for _, m := range sizes[:q] {
		at += uintptr(m)
	}
	return at, uintptr(sizes[q])
}

func (c *checker) newA2AVStep(g *gpu, pads *padSet, st *a2avStaging, k a2avCase, send, recv [][]uint64,
	rng *rand.Rand) (s *a2avStep, err error) {
	fn, err := g.function(cuda.A2AVKernel)
	if err != nil {
		return nil, err
	}
	s = &a2avStep{k: k, fn: fn, send: send, recv: recv, st: st}
	defer func() {
		if err != nil {
			s.free()
			s = nil
		}
	}()
	// The memory before the launch: guards and outputs 0xab, random inputs.
	for i := range 2 * k.world {
		end, n := s.piece(i, k.world-1)
		b := make([]byte, end+n+guardBytes)
		for j := range b {
			b[j] = 0xab
		}
		if i%2 == 0 {
			random(rng, b[s.k.dataAt(i):end+n])
		}
		s.before = append(s.before, b)
		d, err := c.upload(g, b)
		if err != nil {
			return s, err
		}
		s.bufs = append(s.bufs, d)
		s.want = append(s.want, append([]byte(nil), b...))
	}
	// The reference: piece q of rank r's output is piece r of q's input,
	// where r expects what q sends (else it stays as it was).
	for r := range k.world {
		for q := range k.world {
			if send[q][r] != recv[r][q] {
				continue
			}
			at, n := s.piece(2*r+1, q)
			from, _ := s.piece(2*q, r)
			copy(s.want[2*r+1][at:at+n], s.before[2*q][from:from+n])
		}
	}
	s.ps = make([]cuda.A2AVParams, k.world)
	for r := range k.world {
		p := &s.ps[r]
		for q := range k.world {
			in, _ := s.piece(2*r, q)
			out, _ := s.piece(2*r+1, q)
			p.Src[q], p.Dst[q] = s.bufs[2*r].ptr+in, s.bufs[2*r+1].ptr+out
			p.Send[q], p.Recv[q] = send[r][q], recv[r][q]
		}
		p.Stages, p.Pads = st.ptrs, pads.ptrs
		p.Region, p.SlotBytes, p.TimeoutNs = k.region(), k.slot(), timeoutNs
		p.NB, p.World, p.Rank = int32(k.nb), int32(k.world), int32(r)
		if k.push {
			p.Push = 1
		}
	}
	return s, nil
}

// keep says piece q of buffer i must stay as it was.
func (s *a2avStep) keep(i, q int) {
	at, n := s.piece(i, q)
	copy(s.want[i][at:at+n], s.before[i][at:at+n])
}

func (s *a2avStep) free() { freeAll(s.bufs) }

// launch enqueues every rank's launch, each followed on its stream by
// writes of 0xab over the slots of that rank's staging: its regions must
// be free once the launch has ended (every chunk consumed), for whatever
// stages into them next.
func (s *a2avStep) launch(c *checker, g *gpu, _ *padSet) error {
	used := uintptr(s.k.nb*cuda.A2AVSlots) * uintptr(s.k.slot())
	for r := range s.k.world {
		grid, block := cuda.A2AVGrid(s.k.world, s.k.nb, s.send[r][r])
		if err := c.d.Launch(s.fn, grid, block, 0, g.streams[r], &s.ps[r]); err != nil {
			return err
		}
		for q := range s.k.world - 1 {
			at := s.st.ptrs[r] + uintptr(q)*uintptr(s.k.region())
			if err := c.d.MemsetD32Async(g.ctx, at, 0xabababab, used/4, g.streams[r]); err != nil {
				return err
			}
		}
	}
	return nil
}

// check compares every byte of every buffer with the reference.
func (s *a2avStep) check() error {
	return checkBufs(s.bufs, s.want, func(i, first int, got []byte, bad int) error {
		where := "a guard"
		for q := range s.k.world {
			if at, n := s.piece(i, q); uintptr(first) >= at && uintptr(first) < at+n {
				where = fmt.Sprintf("piece %d (%d bytes) at %d", q, n, uintptr(first)-at)
			}
		}
		return fmt.Errorf("rank %d %s: %d bytes wrong, the first in %s is %#x, want %#x", i/2,
			[2]string{"input", "output"}[i%2], bad, where, got[first], s.want[i][first])
	})
}
