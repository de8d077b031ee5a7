package main

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"syscall"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
)

const (
	big        = 4<<20 + 3 // the "4M+3" size of the brief
	guardBytes = 64
	timeoutNs  = 5_000_000_000 // no barrier of a passing case gets near this
)

func (c *checker) runCases() {
	g := c.gpus[0]
	pads := map[int]*padSet{}
	padsFor := func(world int) (*padSet, error) {
		if pads[world] == nil {
			ps, err := c.newPads(g, world)
			if err != nil {
				return nil, err
			}
			pads[world] = ps
		}
		return pads[world], nil
	}
	ar := func(k arCase) {
		record(k.String(), func() error {
			if c.quick && k.numel > 1<<20 {
				return errSkip
			}
			ps, err := padsFor(k.world)
			if err != nil {
				return err
			}
			return c.runAR(g, ps, k)
		})
	}
	floats := []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Float16}
	// The brief's matrix: one-shot sum, world 1 and 2 (simulated), all sizes.
	for _, dt := range floats {
		for _, world := range []int{1, 2} {
			for _, n := range []int{1, 3, 1025, big} {
				ar(arCase{algo: cuda.OneShot, dt: dt, op: dtype.Sum, world: world, numel: n})
			}
		}
	}
	for _, dt := range floats {
		for _, n := range []int{1, 3, 1025, big} {
			ar(arCase{algo: cuda.TwoShot, dt: dt, op: dtype.Sum, world: 2, numel: n})
		}
	}
	// Operators and integer types.
	for _, k := range []arCase{
		{dt: dtype.Float32, op: dtype.Product}, {dt: dtype.Float32, op: dtype.Min},
		{dt: dtype.Float32, op: dtype.Max}, {dt: dtype.Float32, op: dtype.Avg},
		{dt: dtype.Float32, op: dtype.PremulSum}, {dt: dtype.BFloat16, op: dtype.Avg},
		{dt: dtype.BFloat16, op: dtype.Max}, {dt: dtype.Float16, op: dtype.Product},
		{dt: dtype.Float16, op: dtype.Min}, {dt: dtype.Int32, op: dtype.Sum},
		{dt: dtype.Int32, op: dtype.Min}, {dt: dtype.Int32, op: dtype.Product},
		{dt: dtype.Int64, op: dtype.Sum}, {dt: dtype.Int64, op: dtype.Max},
	} {
		for _, algo := range []cuda.Algo{cuda.OneShot, cuda.TwoShot} {
			k.algo, k.world, k.numel = algo, 2, 1025
			ar(k)
		}
	}
	// Alignment: a common misalignment (scalar head, then vectors), an out
	// that is misaligned against its inputs (all scalar), odd sizes.
	ar(arCase{algo: cuda.OneShot, dt: dtype.Float16, op: dtype.Sum, world: 2, numel: 4099, mis: 1, outMis: 1})
	ar(arCase{algo: cuda.OneShot, dt: dtype.BFloat16, op: dtype.Sum, world: 2, numel: 4099, outMis: 3})
	ar(arCase{algo: cuda.TwoShot, dt: dtype.Float32, op: dtype.Sum, world: 2, numel: 4099, mis: 1})
	ar(arCase{algo: cuda.OneShot, dt: dtype.Float32, op: dtype.Sum, world: 2, numel: 0})
	// Reduce-scatter (one-shot reading at rank * numel), and four ranks.
	ar(arCase{algo: cuda.OneShot, dt: dtype.Float32, op: dtype.Sum, world: 2, numel: 1025, scatter: true})
	ar(arCase{algo: cuda.OneShot, dt: dtype.BFloat16, op: dtype.Sum, world: 4, numel: 65539})
	ar(arCase{algo: cuda.TwoShot, dt: dtype.Float32, op: dtype.Sum, world: 4, numel: 65539})
	// LL: each case launches three times back to back on the same pads
	// (both parities of every block, the counters and LL areas carried
	// across cases, gs_llmove's too).
	for _, k := range []arCase{
		{dt: dtype.Float32, op: dtype.Sum, world: 2, numel: 1}, {dt: dtype.Float32, op: dtype.Sum, world: 2, numel: 1025},
		{dt: dtype.BFloat16, op: dtype.Sum, world: 2, numel: 4099, mis: 1, outMis: 3},
		{dt: dtype.Float16, op: dtype.Min, world: 4, numel: 3}, {dt: dtype.Float32, op: dtype.Avg, world: 2, numel: 16001},
		{dt: dtype.Int64, op: dtype.Sum, world: 2, numel: cuda.LLMaxBytes / 8},
		{dt: dtype.Int32, op: dtype.Product, world: 4, numel: 20011, mis: 1},
		{dt: dtype.BFloat16, op: dtype.Max, world: 2, numel: cuda.LLMaxBytes/2 - 1},
	} {
		k.algo = cuda.LL
		ar(k)
	}
	c.dtypeCases(ar)
	c.moveCases(g, padsFor)
	c.a2avCases(g, padsFor)

	record("gs_copy all-to-all, 2 simulated ranks, 1 MiB+7 chunks", func() error {
		ps, err := padsFor(2)
		if err != nil {
			return err
		}
		return c.copyCase(g, ps, 2, 1<<20+7)
	})
	c.stepsCases(g, padsFor)
	record("gs_barrier x200, 2 simulated ranks", func() error {
		ps, err := padsFor(2)
		if err != nil {
			return err
		}
		return c.barrierCase(g, ps, 2, 200)
	})
	record("barrier timeout is reported (rank 1 absent, 5 ms)", func() error { return c.timeoutCase(g) })
	record("semaphore wait timeout names the missing rank (rank 1 absent, 5 ms)", func() error {
		return c.semaTimeoutCase(g)
	})
	for i, gi := range c.gpus {
		record(fmt.Sprintf("nvls.cu on device %d: load, look up every multimem kernel (no launch, no multicast)", i),
			func() error { return c.nvlsLoadCase(gi, i) })
	}
	record("stream memory operations (write/wait value, batch)", func() error { return c.memopsCase(g) })
	record("pointer attributes, address range, IPC handle", func() error { return c.pointerCase(g) })
	c.crossGPU()
	c.p2pCases()
}

// dtypeCases runs every operator on the types added for issue 22 (float64,
// int8, uint8, bool, fp8) through every algorithm, at 2, 3 and 4 simulated
// ranks (the algorithm and the world rotate with the operator), with odd
// sizes, a misaligned case and the reduce_scatter read of the one-shot.
func (c *checker) dtypeCases(ar func(arCase)) {
	ops := []dtype.RedOp{dtype.Sum, dtype.Product, dtype.Min, dtype.Max, dtype.Avg, dtype.PremulSum}
	shapes := [][2]arCase{ // per algorithm; operator i takes shape i%2 of each
		{{algo: cuda.OneShot, world: 2, numel: 1025}, {algo: cuda.OneShot, world: 3, numel: 515, scatter: true}},
		{{algo: cuda.TwoShot, world: 3, numel: 4099}, {algo: cuda.TwoShot, world: 4, numel: 33, mis: 1}},
		{{algo: cuda.LL, world: 4, numel: 2053, mis: 1, outMis: 3}, {algo: cuda.LL, world: 3, numel: 17}},
	}
	for _, dt := range []dtype.DType{dtype.Float64, dtype.Int8, dtype.Uint8, dtype.Bool, dtype.Float8E4M3, dtype.Float8E5M2} {
		for i, op := range ops {
			if dtype.Supports(dt, op) != nil {
				continue
			}
			for _, sh := range shapes {
				k := sh[i%2]
				k.dt, k.op = dt, op
				ar(k)
			}
		}
	}
}

// ---- all-reduce -------------------------------------------------------------------

type arCase struct {
	algo    cuda.Algo
	dt      dtype.DType
	op      dtype.RedOp
	world   int
	numel   int
	mis     int  // elements by which every input starts past 16-byte alignment
	outMis  int  // the same for the one-shot outputs
	scatter bool // one-shot reading rank r's chunk of world*numel inputs
}

func (k arCase) String() string {
	s := fmt.Sprintf("%s %s %s world=%d n=%d", k.algo, k.dt, k.op, k.world, k.numel)
	if k.mis != 0 || k.outMis != 0 {
		s += fmt.Sprintf(" misalign=%d/%d", k.mis, k.outMis)
	}
	if k.scatter {
		s += " reduce-scatter"
	}
	return s
}

// outOfPlace says whether k's kernel writes a separate output (every
// algorithm but the in-place two-shot).
func (k arCase) outOfPlace() bool { return k.algo != cuda.TwoShot }

func seedOf(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// step is one launch on every simulated rank of a case: launch enqueues
// it on the ranks' streams; check reads its results once they have synced.
type step interface {
	launch(c *checker, g *gpu, pads *padSet) error
	check() error
	free()
}

// runFresh makes a step with each of next, runs them back to back
// (runSteps) and frees them.
func (c *checker) runFresh(g *gpu, pads *padSet, next ...func() (step, error)) error {
	var launches []step
	defer func() {
		for _, s := range launches {
			s.free()
		}
	}()
	for _, f := range next {
		s, err := f()
		if err != nil {
			return err
		}
		launches = append(launches, s)
	}
	return c.runSteps(g, pads, launches)
}

// runSteps launches back to back, with no sync between them (a rank may run
// ahead of its peers, as on the backend's streams), then checks every
// rank's pad and each step's results.
func (c *checker) runSteps(g *gpu, pads *padSet, launches []step) error {
	for _, s := range launches {
		if err := s.launch(c, g, pads); err != nil {
			return err
		}
	}
	if err := c.syncAll(g, len(pads.bufs)); err != nil {
		return err
	}
	if err := pads.errors(); err != nil {
		return err
	}
	if err := pads.checkLLSeq(); err != nil {
		return err
	}
	checked := map[step]bool{}
	for i, s := range launches {
		if checked[s] {
			continue
		}
		checked[s] = true
		if err := s.check(); err != nil {
			return fmt.Errorf("launch %d: %w", i, err)
		}
	}
	return nil
}

func (c *checker) runAR(g *gpu, pads *padSet, k arCase) error {
	s, err := c.newARStep(g, pads, k)
	if err != nil {
		return err
	}
	defer s.free()
	launches := []step{s}
	if k.algo == cuda.LL {
		launches = []step{s, s, s} // both parities of every block, the first again
	}
	return c.runSteps(g, pads, launches)
}

// arStep is an all-reduce case on simulated ranks of one GPU: its buffers,
// inputs and every rank's parameters.
type arStep struct {
	k           arCase
	fn          *cuda.Function
	grid, block cuda.Dim3
	scale       float64
	inputs      [][]byte
	ins, outs   []*dbuf
	ps          []cuda.ARParams
}

func (c *checker) newARStep(g *gpu, pads *padSet, k arCase) (s *arStep, err error) {
	kern, post, err := cuda.ReduceKernel(k.algo, k.dt, k.op)
	if err != nil {
		return nil, err
	}
	fn, err := g.function(kern)
	if err != nil {
		return nil, err
	}
	es := uintptr(k.dt.Size())
	total := k.numel
	if k.scatter {
		total *= k.world
	}
	rng := rand.New(rand.NewPCG(seedOf(k.String()), 7))
	s = &arStep{k: k, fn: fn, inputs: make([][]byte, k.world), ins: make([]*dbuf, k.world),
		outs: make([]*dbuf, k.world), ps: make([]cuda.ARParams, k.world)}
	defer func() {
		if err != nil {
			s.free()
			s = nil
		}
	}()
	inLen := uintptr(total)*es + uintptr(k.mis)*es + guardBytes
	outLen := uintptr(k.numel)*es + uintptr(k.outMis)*es + guardBytes
	for r := 0; r < k.world; r++ {
		s.inputs[r] = genData(rng, k.dt, k.op, total)
		if s.ins[r], err = c.alloc(g, inLen); err != nil {
			return s, err
		}
		if err := s.ins[r].fill(0xab); err != nil {
			return s, err
		}
		if err := c.d.MemcpyHtoD(g.ctx, s.ins[r].ptr+uintptr(k.mis)*es, s.inputs[r]); err != nil {
			return s, err
		}
		if k.outOfPlace() {
			if s.outs[r], err = c.alloc(g, outLen); err != nil {
				return s, err
			}
			if err := s.outs[r].fill(0xab); err != nil {
				return s, err
			}
		}
	}
	s.scale = 1
	switch k.op {
	case dtype.Avg:
		s.scale = float64(k.world)
	case dtype.PremulSum:
		s.scale = 0.375
	}
	var areas [cuda.MaxRanks]uintptr
	if k.algo == cuda.LL {
		if areas, err = c.llAreas(g, pads); err != nil {
			return s, err
		}
	}
	for r := 0; r < k.world; r++ {
		p := &s.ps[r]
		for q := 0; q < k.world; q++ {
			p.Peers[q] = s.ins[q].ptr + uintptr(k.mis)*es
			if k.algo == cuda.LL {
				p.Peers[q] = areas[q]
			}
		}
		if k.algo == cuda.LL {
			p.In = s.ins[r].ptr + uintptr(k.mis)*es
		}
		p.Pads = pads.ptrs
		if k.outOfPlace() {
			p.Out = s.outs[r].ptr + uintptr(k.outMis)*es
		}
		p.Numel = uint64(k.numel)
		if k.scatter {
			p.SrcOffset = uint64(r * k.numel)
		}
		p.TimeoutNs, p.Scale, p.Post = timeoutNs, s.scale, post
		p.World, p.Rank = int32(k.world), int32(r)
	}
	s.grid, s.block = cuda.ReduceGrid(k.algo, uint64(k.numel), int(es), k.world)
	if k.algo == cuda.LL {
		s.grid, s.block = cuda.LLGrid(uint64(k.numel), int(es))
	}
	return s, nil
}

func (s *arStep) free() { freeAll(s.ins, s.outs) }

func (s *arStep) launch(c *checker, g *gpu, pads *padSet) error {
	return c.launchAll(g, pads, s.fn, s.k.algo == cuda.LL, s.grid, s.block, func(r int) cuda.Param { return &s.ps[r] })
}

// check reads every rank's result and its buffer's guards.
func (s *arStep) check() error {
	k, es := s.k, uintptr(s.k.dt.Size())
	total := k.numel
	if k.scatter {
		total *= k.world
	}
	results := make([][]byte, k.world)
	for r := 0; r < k.world; r++ {
		buf, at := s.ins[r], uintptr(k.mis)*es
		if k.outOfPlace() {
			buf, at = s.outs[r], uintptr(k.outMis)*es
		}
		whole, err := buf.read(0, buf.size)
		if err != nil {
			return err
		}
		n := uintptr(k.numel) * es
		if k.algo == cuda.TwoShot {
			n = uintptr(total) * es
		}
		for i, b := range whole {
			if (uintptr(i) < at || uintptr(i) >= at+n) && b != 0xab {
				return fmt.Errorf("rank %d: byte %d outside the result was overwritten", r, i)
			}
		}
		results[r] = whole[at : at+uintptr(k.numel)*es]
		if k.outOfPlace() {
			in, err := s.ins[r].read(uintptr(k.mis)*es, uintptr(total)*es)
			if err != nil {
				return err
			}
			if string(in) != string(s.inputs[r]) {
				return fmt.Errorf("rank %d: %s modified its input", r, k.algo)
			}
		}
	}
	for r := 1; r < k.world && !k.scatter; r++ { // a scatter gives each rank its own chunk
		if string(results[r]) != string(results[0]) {
			return fmt.Errorf("ranks 0 and %d got different bits", r)
		}
	}
	for r := 0; r < k.world; r++ {
		if err := checkResult(k, s.inputs, r, results[r], s.scale); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// f8Of is the fp8 format of dt, if it is one.
func f8Of(dt dtype.DType) (f8Format, bool) {
	switch dt {
	case dtype.Float8E4M3:
		return e4m3, true
	case dtype.Float8E5M2:
		return e5m2, true
	}
	return f8Format{}, false
}

// genData makes n random elements: integers of every bit pattern (bool:
// half of them zero, the rest any byte), floats in [-1, 1) (near 1
// for PRODUCT), float64 with bits past float32's, fp8 with a few values
// that overflow when summed.
func genData(rng *rand.Rand, dt dtype.DType, op dtype.RedOp, n int) []byte {
	es := dt.Size()
	out := make([]byte, n*es)
	for i := 0; i < n; i++ {
		e := out[i*es:]
		switch dt {
		case dtype.Int32:
			binary.LittleEndian.PutUint32(e, rng.Uint32())
			continue
		case dtype.Int64:
			binary.LittleEndian.PutUint64(e, rng.Uint64())
			continue
		case dtype.Int8, dtype.Uint8:
			e[0] = byte(rng.Uint32())
			continue
		case dtype.Bool:
			e[0] = byte(rng.Uint32() >> 1)
			if rng.IntN(2) == 0 {
				e[0] = 0
			}
			continue
		}
		f := float32(rng.Float64()*2 - 1)
		if op == dtype.Product {
			f = float32(0.75 + rng.Float64()/2)
		}
		switch dt {
		case dtype.Float32:
			binary.LittleEndian.PutUint32(e, math.Float32bits(f))
		case dtype.Float64:
			binary.LittleEndian.PutUint64(e, math.Float64bits(float64(f)+rng.Float64()*0x1p-30))
		case dtype.Float16:
			binary.LittleEndian.PutUint16(e, f32ToF16(f))
		case dtype.BFloat16:
			binary.LittleEndian.PutUint16(e, f32ToBF16(f))
		default:
			ff, _ := f8Of(dt)
			x := float64(f)
			if op != dtype.Product && rng.IntN(16) == 0 {
				x *= ff.toF64(ff.maxCode()) * 0.75
			}
			e[0] = ff.fromF64(x)
		}
	}
	return out
}

func decodeF(dt dtype.DType, b []byte) float64 {
	switch dt {
	case dtype.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
	case dtype.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	case dtype.Float16:
		return float64(f16ToF32(binary.LittleEndian.Uint16(b)))
	case dtype.BFloat16:
		return float64(bf16ToF32(binary.LittleEndian.Uint16(b)))
	}
	f, _ := f8Of(dt)
	return f.toF64(b[0])
}

func decodeI(dt dtype.DType, b []byte) int64 {
	switch dt {
	case dtype.Int32:
		return int64(int32(binary.LittleEndian.Uint32(b)))
	case dtype.Int8:
		return int64(int8(b[0]))
	case dtype.Uint8, dtype.Bool:
		return int64(b[0])
	}
	return int64(binary.LittleEndian.Uint64(b))
}

// wrapI folds x into dt's range (two's complement), as the kernels store it.
func wrapI(dt dtype.DType, x int64) int64 {
	switch dt {
	case dtype.Int32:
		return int64(int32(x))
	case dtype.Int8:
		return int64(int8(x))
	case dtype.Uint8, dtype.Bool:
		return int64(uint8(x))
	}
	return x
}

// foldI is op on two integers of dt; bool is bytes, with SUM as MAX
// (torch's mapping for NCCL: on 0/1 bytes, SUM and MAX are OR, PRODUCT and
// MIN are AND).
func foldI(dt dtype.DType, op dtype.RedOp, a, b int64) int64 {
	if dt == dtype.Bool && op == dtype.Sum {
		op = dtype.Max
	}
	switch op {
	case dtype.Sum:
		return wrapI(dt, a+b)
	case dtype.Product:
		return wrapI(dt, a*b)
	case dtype.Min:
		return min(a, b)
	}
	return max(a, b)
}

// foldF is op on two floats (NaN-propagating MIN and MAX, as torch's).
func foldF[F float32 | float64](op dtype.RedOp, a, b F) F {
	switch op {
	case dtype.Product:
		return a * b
	case dtype.Min, dtype.Max:
		if a != a || b != b {
			return F(math.NaN())
		}
		if op == dtype.Min {
			return min(a, b)
		}
		return max(a, b)
	}
	return a + b
}

// f8Want is an fp8 result as the kernels must give it: the inputs folded
// in rank order in float32, scaled there, rounded once to fp8.
func f8Want(k arCase, inputs [][]byte, off int, scale float64) float64 {
	f, _ := f8Of(k.dt)
	acc := float32(f.toF64(inputs[0][off]))
	for r := 1; r < k.world; r++ {
		acc = foldF(k.op, acc, float32(f.toF64(inputs[r][off])))
	}
	switch k.op {
	case dtype.Avg:
		acc /= float32(scale)
	case dtype.PremulSum:
		acc *= float32(scale)
	}
	return f.toF64(f.fromF64(float64(acc)))
}

// checkResult compares with a float64 reference (integers: exactly, with
// two's-complement wrap-around; fp8: exactly, as a float32 fold in rank
// order and one rounding give it). The tolerance of the other floats
// allows the accumulation (world-1 roundings in float32, or float64 for
// float64) plus the final rounding to the stored type.
func checkResult(k arCase, inputs [][]byte, rank int, got []byte, scale float64) error {
	es := k.dt.Size()
	base := 0
	if k.scatter {
		base = rank * k.numel
	}
	outEps := map[dtype.DType]float64{dtype.Float32: 0x1p-24, dtype.Float16: 0x1p-11, dtype.BFloat16: 0x1p-8,
		dtype.Float64: 0x1p-53}[k.dt]
	tiny := map[dtype.DType]float64{dtype.Float32: 0x1p-149, dtype.Float16: 0x1p-24, dtype.BFloat16: 0x1p-133}[k.dt]
	accEps := 0x1p-24
	if k.dt == dtype.Float64 {
		accEps = 0x1p-53
	}
	_, isF8 := f8Of(k.dt)
	bad, first := 0, ""
	for i := 0; i < k.numel; i++ {
		off := (base + i) * es
		if !k.dt.IsFloat() {
			acc := decodeI(k.dt, inputs[0][off:])
			for r := 1; r < k.world; r++ {
				acc = foldI(k.dt, k.op, acc, decodeI(k.dt, inputs[r][off:]))
			}
			if g := decodeI(k.dt, got[i*es:]); g != acc {
				bad++
				if first == "" {
					first = fmt.Sprintf("element %d: got %d, want %d", i, g, acc)
				}
			}
			continue
		}
		acc := decodeF(k.dt, inputs[0][off:])
		mag := math.Abs(acc)
		for r := 1; r < k.world; r++ {
			x := decodeF(k.dt, inputs[r][off:])
			mag += math.Abs(x)
			acc = foldF(k.op, acc, x)
		}
		switch k.op {
		case dtype.Avg:
			acc, mag = acc/scale, mag/scale
		case dtype.PremulSum:
			acc, mag = acc*scale, mag*scale
		case dtype.Product, dtype.Min, dtype.Max:
			mag = math.Abs(acc)
		}
		tol := outEps*math.Abs(acc) + float64(k.world+1)*accEps*mag + tiny
		if k.op == dtype.Min || k.op == dtype.Max {
			tol = 0 // the answer is one of the inputs
		}
		if isF8 {
			acc, tol = f8Want(k, inputs, off, scale), 0
		}
		g := decodeF(k.dt, got[i*es:])
		if math.IsNaN(acc) && math.IsNaN(g) {
			continue
		}
		if math.IsNaN(g) || !(math.Abs(g-acc) <= tol) {
			bad++
			if first == "" {
				first = fmt.Sprintf("element %d: got %g, want %g (tolerance %g)", i, g, acc, tol)
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d elements wrong; first %s", bad, k.numel, first)
	}
	return nil
}

// ---- copy, barrier, timeout ---------------------------------------------------------

func (c *checker) copyCase(g *gpu, pads *padSet, world int, chunk uintptr) error {
	fn := g.fns[cuda.CopyKernel.Name]
	rng := rand.New(rand.NewPCG(3, 4))
	ins, outs := make([]*dbuf, world), make([]*dbuf, world)
	host := make([][]byte, world)
	defer freeAll(ins, outs)
	var err error
	for r := 0; r < world; r++ {
		host[r] = make([]byte, chunk*uintptr(world))
		for i := range host[r] {
			host[r][i] = byte(rng.Uint32())
		}
		if ins[r], err = c.alloc(g, chunk*uintptr(world)+16); err != nil {
			return err
		}
		if outs[r], err = c.alloc(g, chunk*uintptr(world)+16); err != nil {
			return err
		}
		// Inputs start 3 bytes in, outputs 5: the kernel must find the widest
		// co-aligned access for every segment.
		if err := c.d.MemcpyHtoD(g.ctx, ins[r].ptr+3, host[r]); err != nil {
			return err
		}
	}
	ps := make([]cuda.CopyParams, world)
	for r := 0; r < world; r++ {
		p := &ps[r]
		for q := 0; q < world; q++ {
			p.Dst[q] = outs[r].ptr + 5 + uintptr(q)*chunk
			p.Src[q] = ins[q].ptr + 3 + uintptr(r)*chunk
			p.Bytes[q] = uint64(chunk)
		}
		p.Pads = pads.ptrs
		p.TimeoutNs, p.NSeg, p.World, p.Rank = timeoutNs, int32(world), int32(world), int32(r)
		p.Sync = cuda.SyncStart | cuda.SyncEnd
	}
	grid, block := cuda.CopyGrid(uint64(chunk))
	for r := 0; r < world; r++ {
		if err := c.d.Launch(fn, grid, block, 0, g.streams[r], &ps[r]); err != nil {
			return err
		}
	}
	if err := c.syncAll(g, world); err != nil {
		return err
	}
	if err := pads.errors(); err != nil {
		return err
	}
	for r := 0; r < world; r++ {
		got, err := outs[r].read(5, chunk*uintptr(world))
		if err != nil {
			return err
		}
		for q := 0; q < world; q++ {
			want := host[q][uintptr(r)*chunk : uintptr(r+1)*chunk]
			if string(got[uintptr(q)*chunk:uintptr(q+1)*chunk]) != string(want) {
				return fmt.Errorf("rank %d: segment from rank %d differs", r, q)
			}
		}
	}
	return nil
}

func (c *checker) barrierCase(g *gpu, pads *padSet, world, times int) error {
	fn := g.fns[cuda.BarrierKernel.Name]
	grid, block := cuda.BarrierGrid()
	for i := 0; i < times; i++ {
		for r := 0; r < world; r++ {
			p := cuda.BarrierParams{Pads: pads.ptrs, TimeoutNs: timeoutNs, World: int32(world), Rank: int32(r)}
			if err := c.d.Launch(fn, grid, block, 0, g.streams[r], &p); err != nil {
				return err
			}
		}
	}
	if err := c.syncAll(g, world); err != nil {
		return err
	}
	return pads.errors()
}

func (c *checker) timeoutCase(g *gpu) error {
	grid, block := cuda.BarrierGrid()
	return c.expectTimeout(g, cuda.BarrierKernel, grid, block, func(pads *padSet) cuda.Param {
		return &cuda.BarrierParams{Pads: pads.ptrs, TimeoutNs: 5_000_000, World: 2, Rank: 0}
	}, -1)
}

// launchAlone launches fn on rank 0's stream (its peers never run), waits
// for it and returns rank 0's error words: code, detail, missing ranks.
func (c *checker) launchAlone(g *gpu, fn *cuda.Function, grid, block cuda.Dim3, p cuda.Param,
	pads *padSet) (code, detail, missing uint32, err error) {
	if err = c.d.Launch(fn, grid, block, 0, g.streams[0], p); err != nil {
		return 0, 0, 0, err
	}
	if err = c.d.StreamSynchronize(g.ctx, g.streams[0]); err != nil {
		return 0, 0, 0, err
	}
	w, err := pads.bufs[0].read(cuda.PadErrorWord*4, 12)
	if err != nil {
		return 0, 0, 0, err
	}
	return le32(w), le32(w[4:]), le32(w[8:]), nil
}

// expectTimeout launches k on rank 0 of a fresh pair of pads (left
// unusable afterwards, as documented) with rank 1 absent, and checks that it
// gave up naming rank 1 (and, unless detail < 0, with that detail word).
func (c *checker) expectTimeout(g *gpu, k *cuda.Kernel, grid, block cuda.Dim3, param func(*padSet) cuda.Param,
	detail int64) error {
	pads, err := c.newPads(g, 2)
	if err != nil {
		return err
	}
	code, got, missing, err := c.launchAlone(g, g.fns[k.Name], grid, block, param(pads), pads)
	if err != nil {
		return err
	}
	if code != cuda.ErrTimeout || missing != 2 || (detail >= 0 && int64(got) != detail) {
		return fmt.Errorf("error words code=%d detail=%#x missing=%#x, want code=%d detail=%#x missing=0x2", code,
			got, missing, cuda.ErrTimeout, detail)
	}
	return nil
}

func (c *checker) memopsCase(g *gpu) error {
	if !c.d.HasStreamMemOps() {
		return errSkip
	}
	b, err := c.alloc(g, 16)
	if err != nil {
		return err
	}
	defer b.free()
	if err := b.fill(0); err != nil {
		return err
	}
	s0, s1 := g.streams[0], g.streams[1]
	// s1 waits for s0's write, then copies the word: the copy must see it.
	if err := c.d.StreamWaitValue32(g.ctx, s1, b.ptr, 7, cuda.WaitGEQ); err != nil {
		return err
	}
	if err := c.d.MemcpyDtoDAsync(g.ctx, b.ptr+4, b.ptr, 4, s1); err != nil {
		return err
	}
	if err := c.d.StreamWriteValue32(g.ctx, s0, b.ptr, 7); err != nil {
		return err
	}
	if err := c.d.StreamBatchMemOp(g.ctx, s0, []cuda.MemOp{{Addr: b.ptr + 8, Value: 9}}); err != nil {
		return err
	}
	if err := c.d.StreamBatchMemOp(g.ctx, s1, []cuda.MemOp{{Wait: true, Addr: b.ptr + 8, Value: 9, Flags: cuda.WaitEQ}}); err != nil {
		return err
	}
	if err := c.syncAll(g, 2); err != nil {
		return err
	}
	w, err := b.read(0, 12)
	if err != nil {
		return err
	}
	if le32(w) != 7 || le32(w[4:]) != 7 || le32(w[8:]) != 9 {
		return fmt.Errorf("words %v, want 7 7 9", w)
	}
	return nil
}

func (c *checker) pointerCase(g *gpu) error {
	b, err := c.alloc(g, 1<<20)
	if err != nil {
		return err
	}
	defer b.free()
	ord, err := c.d.PointerAttribute(b.ptr+100, cuda.PointerDeviceOrdinal)
	if err != nil {
		return err
	}
	base, size, err := c.d.AddressRange(g.ctx, b.ptr+100)
	if err != nil {
		return err
	}
	if ord != 0 || base != b.ptr || size < 1<<20 {
		return fmt.Errorf("ordinal %d, range %#x+%d for allocation %#x", ord, base, size, b.ptr)
	}
	if _, err := c.d.IpcGetMemHandle(g.ctx, b.ptr); err != nil {
		return err
	}
	return nil
}

// ---- two GPUs ---------------------------------------------------------------------

// vmem is physical memory on one GPU mapped at one address that both GPUs
// may access: in one process, that is all a peer mapping needs.
type vmem struct {
	h    cuda.AllocHandle
	va   uintptr
	size uintptr
}

func (c *checker) newVMem(owner *gpu, size uintptr) (*vmem, error) {
	gran, err := c.d.AllocationGranularity(owner.ctx, owner.dev, cuda.HandleTypePosixFD, false)
	if err != nil {
		return nil, err
	}
	size = (size + gran - 1) / gran * gran
	h, err := c.d.MemCreate(owner.ctx, owner.dev, size, cuda.HandleTypePosixFD)
	if err != nil {
		return nil, err
	}
	c.onClose(func() error { return c.d.MemRelease(owner.ctx, h) })
	va, err := c.d.MemAddressReserve(owner.ctx, size, gran)
	if err != nil {
		return nil, err
	}
	c.onClose(func() error { return c.d.MemAddressFree(owner.ctx, va, size) })
	if err := c.d.MemMap(owner.ctx, va, size, h); err != nil {
		return nil, err
	}
	c.onClose(func() error { return c.d.MemUnmap(owner.ctx, va, size) })
	var devs []cuda.Device
	for _, g := range c.gpus {
		devs = append(devs, g.dev)
	}
	if err := c.d.MemSetAccess(owner.ctx, va, size, devs); err != nil {
		return nil, err
	}
	return &vmem{h: h, va: va, size: size}, nil
}

// twoGPUsOverVMM reports whether the first two devices can share VMM memory.
func (c *checker) twoGPUsOverVMM() bool { return c.gpusOverVMM(2) }

// gpusOverVMM reports whether the first n opened devices can share VMM
// memory.
func (c *checker) gpusOverVMM(n int) bool {
	usable := len(c.gpus) >= n && c.d.HasVMM()
	for _, dev := range rep.Devices[:min(n, len(rep.Devices))] {
		usable = usable && dev.VMM == 1 && dev.PosixFD == 1
	}
	return usable
}

// crossGPU runs ranks on distinct GPUs over VMM mappings: two of them for
// the matrix, the semaphore protocol and the timings, and every opened GPU
// (up to four; the fake driver has four) for all-reduces of several types
// at 3 and 4 ranks.
func (c *checker) crossGPU() {
	if !c.twoGPUsOverVMM() {
		record("two GPUs over VMM", func() error { return errSkip })
		return
	}
	gs := c.gpus
	if !c.gpusOverVMM(len(gs)) {
		gs = gs[:2]
	}
	var data []*vmem
	var pads *padSet
	var setupErr error
	record(fmt.Sprintf("VMM: create on each of %d GPUs, map, grant every GPU access", len(gs)), func() error {
		data, pads, setupErr = c.vmmSetup(gs)
		return setupErr
	})
	record("VMM: export a POSIX fd, import it, read through the import", func() error {
		if setupErr != nil {
			return errSkip
		}
		return c.exportImport(gs[0], gs[1], data[0])
	})
	if setupErr != nil {
		return
	}
	for _, algo := range []cuda.Algo{cuda.OneShot, cuda.TwoShot} {
		for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
			for _, n := range []int{1025, big} {
				k := arCase{algo: algo, dt: dt, op: dtype.Sum, world: 2, numel: n}
				record("2 GPUs "+k.String(), func() error {
					if c.quick && n > 1<<20 {
						return errSkip
					}
					return c.runARN(gs[:2], data, pads, k, 0)
				})
			}
		}
	}
	for world := 3; world <= len(gs); world++ {
		for _, algo := range []cuda.Algo{cuda.OneShot, cuda.TwoShot} {
			for _, dt := range []dtype.DType{dtype.Float32, dtype.Float64, dtype.BFloat16, dtype.Int8, dtype.Bool,
				dtype.Float8E5M2} {
				k := arCase{algo: algo, dt: dt, op: dtype.Sum, world: world, numel: 1025}
				record(fmt.Sprintf("%d GPUs %s", world, k), func() error { return c.runARN(gs[:world], data, pads, k, 0) })
			}
		}
	}
	c.semaCases(gs, data, pads)
	if c.quick {
		return
	}
	for _, algo := range []cuda.Algo{cuda.OneShot, cuda.TwoShot} {
		for _, bytes := range []int{4 << 10, 64 << 10, 1 << 20, 16 << 20} {
			k := arCase{algo: algo, dt: dtype.BFloat16, op: dtype.Sum, world: 2, numel: bytes / 2}
			record(fmt.Sprintf("2 GPUs timing %s bf16 %d bytes", algo, bytes), func() error {
				return c.runARN(gs[:2], data, pads, k, 40)
			})
		}
	}
}

// vmmSetup makes each GPU's data buffer and signal pad, mapped for all.
func (c *checker) vmmSetup(gs []*gpu) ([]*vmem, *padSet, error) {
	const bufBytes = 40 << 20 // room for 4M+3 fp32 elements
	var data []*vmem
	for _, g := range gs {
		v, err := c.newVMem(g, bufBytes)
		if err != nil {
			return nil, nil, err
		}
		data = append(data, v)
	}
	ps := &padSet{}
	for r, g := range gs {
		v, err := c.newVMem(g, cuda.PadBytes)
		if err != nil {
			return nil, nil, err
		}
		if err := c.d.MemsetD32Async(g.ctx, v.va, 0, v.size/4, g.streams[0]); err != nil {
			return nil, nil, err
		}
		if err := c.d.StreamSynchronize(g.ctx, g.streams[0]); err != nil {
			return nil, nil, err
		}
		ps.bufs = append(ps.bufs, &dbuf{c: c, ctx: g.ctx, ptr: v.va, size: cuda.PadBytes})
		ps.ptrs[r] = v.va
	}
	return data, ps, nil
}

func (c *checker) exportImport(g0, g1 *gpu, v *vmem) error {
	fd, err := c.d.MemExportFD(g0.ctx, v.h)
	if err != nil {
		return err
	}
	h, err := c.d.MemImportFD(g1.ctx, fd)
	syscall.Close(fd)
	if err != nil {
		return err
	}
	defer c.d.MemRelease(g1.ctx, h)
	va, err := c.d.MemAddressReserve(g1.ctx, v.size, 0)
	if err != nil {
		return err
	}
	defer c.d.MemAddressFree(g1.ctx, va, v.size)
	if err := c.d.MemMap(g1.ctx, va, v.size, h); err != nil {
		return err
	}
	defer c.d.MemUnmap(g1.ctx, va, v.size)
	if err := c.d.MemSetAccess(g1.ctx, va, v.size, []cuda.Device{g1.dev}); err != nil {
		return err
	}
	pattern := []byte("gosym: written by GPU 0's mapping, read through the imported one")
	if err := c.d.MemcpyHtoD(g0.ctx, v.va+4096, pattern); err != nil {
		return err
	}
	got := make([]byte, len(pattern))
	if err := c.d.MemcpyDtoH(g1.ctx, got, va+4096); err != nil {
		return err
	}
	if string(got) != string(pattern) {
		return fmt.Errorf("imported mapping reads %q", got)
	}
	return nil
}

// runARN runs an all-reduce with rank r on GPU r of gs over the VMM
// buffers (k.world must be len(gs)); with iters > 0 it also times iters
// back-to-back calls.
func (c *checker) runARN(gs []*gpu, data []*vmem, pads *padSet, k arCase, iters int) error {
	world := len(gs)
	kern, post, err := cuda.ReduceKernel(k.algo, k.dt, k.op)
	if err != nil {
		return err
	}
	es := uintptr(k.dt.Size())
	n := uintptr(k.numel) * es
	rng := rand.New(rand.NewPCG(seedOf(k.String()), 9))
	inputs := make([][]byte, world)
	outs := make([]*dbuf, world)
	defer freeAll(outs)
	ps := make([]cuda.ARParams, world)
	for r, g := range gs {
		inputs[r] = genData(rng, k.dt, k.op, k.numel)
		if err := c.d.MemcpyHtoD(g.ctx, data[r].va, inputs[r]); err != nil {
			return err
		}
		if outs[r], err = c.alloc(g, n+guardBytes); err != nil {
			return err
		}
	}
	for r := range gs {
		p := &ps[r]
		for q := range gs {
			p.Peers[q] = data[q].va
		}
		p.Pads = pads.ptrs
		if k.algo == cuda.OneShot {
			p.Out = outs[r].ptr
		}
		p.Numel, p.TimeoutNs, p.Scale, p.Post = uint64(k.numel), timeoutNs, 1, post
		p.World, p.Rank = int32(world), int32(r)
	}
	grid, block := cuda.ReduceGrid(k.algo, uint64(k.numel), int(es), world)
	launch := func() error {
		for r, g := range gs {
			if err := c.d.Launch(g.fns[kern.Name], grid, block, 0, g.streams[0], &ps[r]); err != nil {
				return err
			}
		}
		return nil
	}
	if err := launch(); err != nil {
		return err
	}
	if err := c.settle(gs, pads, false); err != nil {
		return err
	}
	results := make([][]byte, world)
	for r, g := range gs {
		results[r] = make([]byte, n)
		src := data[r].va
		if k.algo == cuda.OneShot {
			src = outs[r].ptr
		}
		if err := c.d.MemcpyDtoH(g.ctx, results[r], src); err != nil {
			return err
		}
	}
	for r := 1; r < world; r++ {
		if string(results[r]) != string(results[0]) {
			return fmt.Errorf("GPUs 0 and %d got different bits", r)
		}
	}
	if err := checkResult(k, inputs, 0, results[0], 1); err != nil {
		return err
	}
	if iters == 0 {
		return nil
	}
	// Timing: the inputs change (two-shot works in place), the launches do not.
	var worst float64
	evs := make([][2]cuda.Event, world)
	for r, g := range gs {
		for i := range evs[r] {
			e, err := c.d.EventCreate(g.ctx, 0)
			if err != nil {
				return err
			}
			defer c.d.EventDestroy(g.ctx, e)
			evs[r][i] = e
		}
	}
	for i := 0; i < 5; i++ { // warm-up
		if err := launch(); err != nil {
			return err
		}
	}
	for r, g := range gs {
		if err := c.d.EventRecord(g.ctx, evs[r][0], g.streams[0]); err != nil {
			return err
		}
	}
	for i := 0; i < iters; i++ {
		if err := launch(); err != nil {
			return err
		}
	}
	for r, g := range gs {
		if err := c.d.EventRecord(g.ctx, evs[r][1], g.streams[0]); err != nil {
			return err
		}
	}
	for r, g := range gs {
		if err := c.d.EventSynchronize(g.ctx, evs[r][1]); err != nil {
			return err
		}
		ms, err := c.d.EventElapsed(g.ctx, evs[r][0], evs[r][1])
		if err != nil {
			return err
		}
		worst = max(worst, float64(ms)*1000/float64(iters))
	}
	if err := pads.errors(); err != nil {
		return err
	}
	fmt.Printf("  timing %s bf16 %d bytes: %.1f us/op\n", k.algo, n, worst)
	mu.Lock()
	rep.Timings = append(rep.Timings, timing{Name: k.algo.String() + " bf16 2xGPU", Bytes: int(n), Us: worst})
	mu.Unlock()
	return nil
}
