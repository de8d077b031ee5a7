package host

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
)

var (
	allDTypes = []dtype.DType{dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16,
		dtype.Int8, dtype.Uint8, dtype.Int16, dtype.Int32, dtype.Int64, dtype.Bool}
	allOps = []dtype.RedOp{dtype.Sum, dtype.Avg, dtype.Product, dtype.Min, dtype.Max,
		dtype.PremulSum, dtype.BAnd, dtype.BOr, dtype.BXor}
	testKs    = []int{1, 2, 3, 4}
	testSizes = []int{0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 1023, 1025, 4099}
	// raceSizes still crosses the kernels' 1024-element chunks.
	raceSizes = []int{0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 1025}
)

// isas lists the kernel sets this machine can run, best first, and makes
// sure the best one is selected again when the test ends.
func isas(tb testing.TB) []string {
	tb.Helper()
	best := reduceSelectISA(false)
	tb.Cleanup(func() { reduceSelectISA(false) })
	if best == "generic" {
		return []string{best}
	}
	return []string{best, "generic"}
}

func selectISA(tb testing.TB, name string) {
	tb.Helper()
	require.Equal(tb, name, reduceSelectISA(name == "generic"))
}

// forEachISA runs f once per kernel set, as a subtest named after it.
func forEachISA(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	for _, name := range isas(t) {
		selectISA(t, name)
		t.Run(name, f)
	}
}

// ---- reference conversions, in float64 arithmetic ---------------------------

// refH2F converts binary16 bits to float32 by decoding the fields.
func refH2F(h uint16) float32 {
	sign, exp, mant := h>>15, int(h>>10&0x1f), uint32(h&0x3ff)
	var v float64
	switch exp {
	case 0x1f:
		// Inf or NaN: keep the payload and quieten it, as vcvtph2ps does.
		quiet := uint32(0)
		if mant != 0 {
			quiet = 0x00400000
		}
		return math.Float32frombits(uint32(sign)<<31 | 0x7f800000 | quiet | mant<<13)
	case 0:
		v = math.Ldexp(float64(mant), -24)
	default:
		v = math.Ldexp(float64(1024+mant), exp-25)
	}
	if sign != 0 {
		v = -v
	}
	return float32(v)
}

// refRound rounds |x| (finite, > 0) to a binary format with mantBits
// stored mantissa bits, minimum normal exponent minExp and maximum exponent
// maxExp, nearest even. It returns the biased exponent field and mantissa, or
// ok=false on overflow.
func refRound(a float64, mantBits, minExp, maxExp int) (expField, mant uint32, ok bool) {
	_, e := math.Frexp(a) // a = f * 2^e, f in [0.5, 1)
	e--                   // a = 1.x * 2^e
	if e < minExp {
		e = minExp // subnormal: fixed quantum 2^(minExp-mantBits)
	}
	q := math.RoundToEven(math.Ldexp(a, mantBits-e)) // exact in float64
	if q >= math.Ldexp(1, mantBits+1) {              // carried into the next binade
		q /= 2
		e++
	}
	if e > maxExp {
		return 0, 0, false
	}
	if q < math.Ldexp(1, mantBits) { // still subnormal
		return 0, uint32(q), true
	}
	bias := -minExp + 1
	return uint32(e + bias), uint32(q) - 1<<mantBits, true
}

func refF2H(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := math.Abs(float64(f))
	switch {
	case math.IsNaN(float64(f)):
		return sign | 0x7e00 | uint16(u>>13&0x3ff)
	case math.IsInf(float64(f), 0):
		return sign | 0x7c00
	case a == 0:
		return sign
	}
	e, m, ok := refRound(a, 10, -14, 15)
	if !ok {
		return sign | 0x7c00
	}
	return sign | uint16(e<<10|m)
}

func refB2F(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func refF2B(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := math.Abs(float64(f))
	switch {
	case math.IsNaN(float64(f)):
		return uint16(u>>16) | 0x40
	case math.IsInf(float64(f), 0):
		return sign | 0x7f80
	case a == 0:
		return sign
	}
	e, m, ok := refRound(a, 7, -126, 127)
	if !ok {
		return sign | 0x7f80
	}
	return sign | uint16(e<<7|m)
}

func isNaN16(h uint16, dt dtype.DType) bool {
	if dt == dtype.BFloat16 {
		return h&0x7fff > 0x7f80
	}
	return h&0x7fff > 0x7c00
}

func TestConvertersAllHalfPatterns(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		src := make([]uint16, 1<<16)
		for i := range src {
			src[i] = uint16(i)
		}
		for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
			wide := make([]float32, len(src))
			back := make([]uint16, len(src))
			toF, fromF, refTo, refFrom := cF16ToF32, cF32ToF16, refH2F, refF2H
			quiet := uint16(0x200)
			if dt == dtype.BFloat16 {
				toF, fromF, refTo, refFrom, quiet = cBF16ToF32, cF32ToBF16, refB2F, refF2B, 0x40
			}
			toF(wide, src)
			fromF(back, wide)
			for i, h := range src {
				if want := math.Float32bits(refTo(h)); want != math.Float32bits(wide[i]) {
					require.Failf(t, "widening", "%s %#04x: got %#08x, want %#08x", dt, h, math.Float32bits(wide[i]), want)
				}
				want := h
				if isNaN16(h, dt) {
					want |= quiet
				}
				if back[i] != want || refFrom(wide[i]) != want {
					require.Failf(t, "round trip", "%s %#04x: got %#04x, reference %#04x, want %#04x", dt, h, back[i], refFrom(wide[i]), want)
				}
			}
		}
	})
}

// roundingProbes returns, for a 16-bit format, every finite value, the
// midpoint to its upper neighbour (exact in float32: one bit more than the
// narrow format) and the float32 values on either side of both.
func roundingProbes(widen func(uint16) float32) []float32 {
	var out []float32
	up, down := float32(math.Inf(1)), float32(math.Inf(-1))
	for h := 1; h < 0xffff; h++ {
		lo, hi := widen(uint16(h)), widen(uint16(h+1))
		if math.IsNaN(float64(lo)) || math.IsInf(float64(lo), 0) || math.IsNaN(float64(hi)) {
			continue
		}
		if math.IsInf(float64(hi), 0) { // past the largest finite value: one more step of the same size
			hi = float32(2*float64(lo) - float64(widen(uint16(h-1))))
		}
		mid := float32((float64(lo) + float64(hi)) / 2)
		out = append(out, lo, math.Nextafter32(lo, up), math.Nextafter32(lo, down),
			mid, math.Nextafter32(mid, up), math.Nextafter32(mid, down))
	}
	return out
}

// TestConvertersRounding checks float32 -> fp16/bf16 at and around every
// rounding boundary, at special values and on random bit patterns.
func TestConvertersRounding(t *testing.T) {
	in := append(roundingProbes(refH2F), roundingProbes(refB2F)...)
	rng := rand.New(rand.NewSource(1))
	for range 1 << 20 {
		in = append(in, math.Float32frombits(rng.Uint32()))
	}
	for _, u := range []uint32{0, 1 << 31, 0x7f800001, 0xffc00000, 0x7fbfffff, 0x7f800000, 0xff800000,
		0x477fefff, 0x477ff000, 0x477fffff, 0x47800000, 0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0x00000001,
		0x80000001, 0x33000000, 0x33000001, 0x337fffff, 0x387fe000} {
		in = append(in, math.Float32frombits(u))
	}
	wantH := make([]uint16, len(in))
	wantB := make([]uint16, len(in))
	for i, f := range in {
		wantH[i], wantB[i] = refF2H(f), refF2B(f)
	}
	forEachISA(t, func(t *testing.T) {
		h := make([]uint16, len(in))
		b := make([]uint16, len(in))
		cF32ToF16(h, in)
		cF32ToBF16(b, in)
		for i, f := range in {
			if h[i] != wantH[i] || b[i] != wantB[i] {
				require.Failf(t, "rounding", "%#08x: float16 %#04x (want %#04x), bfloat16 %#04x (want %#04x)",
					math.Float32bits(f), h[i], wantH[i], b[i], wantB[i])
			}
		}
	})
}

// ---- reference reduction ----------------------------------------------------

func minMax32(op dtype.RedOp, a, b float32) float32 {
	switch {
	case a != a:
		return a
	case b != b:
		return b
	case op == dtype.Min && b < a, op == dtype.Max && b > a:
		return b
	}
	return a
}

func minMax64(op dtype.RedOp, a, b float64) float64 {
	switch {
	case a != a:
		return a
	case b != b:
		return b
	case op == dtype.Min && b < a, op == dtype.Max && b > a:
		return b
	}
	return a
}

// ref32 is the float32 reduction exactly as specified: source order, one
// rounding per operation (the float32 conversions forbid fusing).
func ref32(op dtype.RedOp, xs []float32, scale float64) float32 {
	pre := func(x float32) float32 {
		if op == dtype.PremulSum {
			return float32(float32(scale) * x)
		}
		return x
	}
	acc := pre(xs[0])
	for _, x := range xs[1:] {
		x = pre(x)
		switch op {
		case dtype.Sum, dtype.Avg, dtype.PremulSum:
			acc = float32(acc + x)
		case dtype.Product:
			acc = float32(acc * x)
		default:
			acc = minMax32(op, acc, x)
		}
	}
	if op == dtype.Avg {
		acc = float32(acc / float32(len(xs)))
	}
	return acc
}

func ref64(op dtype.RedOp, xs []float64, scale float64) float64 {
	pre := func(x float64) float64 {
		if op == dtype.PremulSum {
			return float64(scale * x)
		}
		return x
	}
	acc := pre(xs[0])
	for _, x := range xs[1:] {
		x = pre(x)
		switch op {
		case dtype.Sum, dtype.Avg, dtype.PremulSum:
			acc = float64(acc + x)
		case dtype.Product:
			acc = float64(acc * x)
		default:
			acc = minMax64(op, acc, x)
		}
	}
	if op == dtype.Avg {
		acc = float64(acc / float64(len(xs)))
	}
	return acc
}

// refInt reduces raw integer bits of width size bytes; signed selects the
// comparison for Min/Max.
func refInt(op dtype.RedOp, xs []uint64, size int, signed bool) uint64 {
	shift := uint(64 - 8*size)
	less := func(a, b uint64) bool {
		if signed {
			return int64(a<<shift)>>shift < int64(b<<shift)>>shift
		}
		return a < b
	}
	acc := xs[0]
	for _, x := range xs[1:] {
		switch op {
		case dtype.Sum:
			acc += x
		case dtype.Product:
			acc *= x
		case dtype.Min:
			if less(x, acc) {
				acc = x
			}
		case dtype.Max:
			if less(acc, x) {
				acc = x
			}
		case dtype.BAnd:
			acc &= x
		case dtype.BOr:
			acc |= x
		case dtype.BXor:
			acc ^= x
		}
	}
	return acc << shift >> shift
}

func refBool(op dtype.RedOp, xs []uint64) uint64 {
	acc := xs[0] != 0
	for _, x := range xs[1:] {
		b := x != 0
		switch op {
		case dtype.Sum, dtype.Max, dtype.BOr:
			acc = acc || b
		case dtype.Product, dtype.Min, dtype.BAnd:
			acc = acc && b
		case dtype.BXor:
			acc = acc != b
		}
	}
	if acc {
		return 1
	}
	return 0
}

// reference reduces vals[j][i] over j for every i, as Reduce should.
func reference(dt dtype.DType, op dtype.RedOp, vals [][]uint64, scale float64) []uint64 {
	n, k := len(vals[0]), len(vals)
	out := make([]uint64, n)
	switch dt {
	case dtype.Float32, dtype.Float16, dtype.BFloat16:
		widen := func(x uint64) float32 { return math.Float32frombits(uint32(x)) }
		narrow := func(f float32) uint64 { return uint64(math.Float32bits(f)) }
		if dt == dtype.Float16 {
			widen = func(x uint64) float32 { return refH2F(uint16(x)) }
			narrow = func(f float32) uint64 { return uint64(refF2H(f)) }
		} else if dt == dtype.BFloat16 {
			widen = func(x uint64) float32 { return refB2F(uint16(x)) }
			narrow = func(f float32) uint64 { return uint64(refF2B(f)) }
		}
		fs := make([]float32, k)
		for i := range out {
			for j := range fs {
				fs[j] = widen(vals[j][i])
			}
			out[i] = narrow(ref32(op, fs, scale))
		}
	case dtype.Float64:
		fs := make([]float64, k)
		for i := range out {
			for j := range fs {
				fs[j] = math.Float64frombits(vals[j][i])
			}
			out[i] = math.Float64bits(ref64(op, fs, scale))
		}
	default:
		xs := make([]uint64, k)
		for i := range out {
			for j := range xs {
				xs[j] = vals[j][i]
			}
			if dt == dtype.Bool {
				out[i] = refBool(op, xs)
			} else {
				out[i] = refInt(op, xs, dt.Size(), dt != dtype.Uint8)
			}
		}
	}
	return out
}

// toFloat64 decodes a float element for the tolerance check.
func toFloat64(dt dtype.DType, x uint64) float64 {
	switch dt {
	case dtype.Float32:
		return float64(math.Float32frombits(uint32(x)))
	case dtype.Float16:
		return float64(refH2F(uint16(x)))
	case dtype.BFloat16:
		return float64(refB2F(uint16(x)))
	}
	return math.Float64frombits(x)
}

// sameElem compares result bits; any NaN equals any NaN (payloads may differ
// with operand order, which the Go compiler is free to choose).
func sameElem(dt dtype.DType, a, b uint64) bool {
	switch dt {
	case dtype.Float32:
		return a == b || math.IsNaN(float64(math.Float32frombits(uint32(a)))) && math.IsNaN(float64(math.Float32frombits(uint32(b))))
	case dtype.Float64:
		return a == b || math.IsNaN(math.Float64frombits(a)) && math.IsNaN(math.Float64frombits(b))
	case dtype.Float16, dtype.BFloat16:
		return a == b || isNaN16(uint16(a), dt) && isNaN16(uint16(b), dt)
	}
	return a == b
}

// ---- buffers ----------------------------------------------------------------

const (
	guardLen = 64
	poison   = 0xa5
)

// testBuf is n elements at a byte offset inside a larger poisoned buffer.
type testBuf struct {
	mem  []byte
	off  int
	size int
	n    int
}

func newTestBuf(n, size, off int) *testBuf {
	b := &testBuf{mem: make([]byte, guardLen+off+n*size+guardLen), off: guardLen + off, size: size, n: n}
	for i := range b.mem {
		b.mem[i] = poison
	}
	return b
}

func (b *testBuf) addr() uintptr { return uintptr(unsafe.Pointer(&b.mem[b.off])) }

func (b *testBuf) get(i int) uint64 {
	p := b.mem[b.off+i*b.size:]
	switch b.size {
	case 1:
		return uint64(p[0])
	case 2:
		return uint64(binary.NativeEndian.Uint16(p))
	case 4:
		return uint64(binary.NativeEndian.Uint32(p))
	}
	return binary.NativeEndian.Uint64(p)
}

func (b *testBuf) set(i int, v uint64) {
	p := b.mem[b.off+i*b.size:]
	switch b.size {
	case 1:
		p[0] = byte(v)
	case 2:
		binary.NativeEndian.PutUint16(p, uint16(v))
	case 4:
		binary.NativeEndian.PutUint32(p, uint32(v))
	default:
		binary.NativeEndian.PutUint64(p, v)
	}
}

func (b *testBuf) values() []uint64 {
	v := make([]uint64, b.n)
	for i := range v {
		v[i] = b.get(i)
	}
	return v
}

// checkGuards asserts that nothing outside the n elements was written.
func (b *testBuf) checkGuards(t *testing.T, what string) bool {
	t.Helper()
	end := b.off + b.n*b.size
	for _, r := range [][2]int{{0, b.off}, {end, len(b.mem)}} {
		for i := r[0]; i < r[1]; i++ {
			if b.mem[i] != poison {
				return assert.Failf(t, "guard overwritten", "%s: byte %d (data at [%d, %d)) is %#x", what, i, b.off, end, b.mem[i])
			}
		}
	}
	return true
}

var (
	f32Specials = []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001,
		0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff}
	f64Specials = []uint64{0, 1 << 63, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000,
		0x7ff0000000000001, 1, 0x800fffffffffffff, 0x7fefffffffffffff}
	f16Specials  = []uint16{0, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7d01, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff}
	bf16Specials = []uint16{0, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f}
)

// randElem draws raw element bits: mostly ordinary values over a few binades,
// sometimes special values (zeros, infinities, NaNs, subnormals, extremes) and
// arbitrary bit patterns.
func randElem(rng *rand.Rand, dt dtype.DType) uint64 {
	r := rng.Intn(32)
	v := rng.NormFloat64() * math.Ldexp(1, rng.Intn(9)-4)
	switch dt {
	case dtype.Float32:
		if r == 0 {
			return uint64(f32Specials[rng.Intn(len(f32Specials))])
		} else if r == 1 {
			return uint64(rng.Uint32())
		}
		return uint64(math.Float32bits(float32(v)))
	case dtype.Float64:
		if r == 0 {
			return f64Specials[rng.Intn(len(f64Specials))]
		} else if r == 1 {
			return rng.Uint64()
		}
		return math.Float64bits(v)
	case dtype.Float16, dtype.BFloat16:
		specials, narrow := f16Specials, refF2H
		if dt == dtype.BFloat16 {
			specials, narrow = bf16Specials, refF2B
		}
		if r == 0 {
			return uint64(specials[rng.Intn(len(specials))])
		} else if r == 1 {
			return uint64(uint16(rng.Uint32()))
		}
		return uint64(narrow(float32(v)))
	case dtype.Bool:
		switch {
		case r < 16:
			return 0
		case r < 28:
			return 1
		}
		return uint64(rng.Intn(255) + 1) // nonzero bytes other than 1 are true too
	}
	return rng.Uint64() // truncated to the element size by set
}

// ---- the table test ---------------------------------------------------------

// placement says where dst lives relative to the sources.
type placement int

const (
	separate  placement = iota // its own buffer
	inFirst                    // dst == srcs[0]
	inLast                     // dst == srcs[k-1]
	dupSource                  // its own buffer; srcs[1] == srcs[0]
)

func (p placement) String() string {
	return [...]string{"separate", "dst=srcs[0]", "dst=srcs[k-1]", "srcs[1]=srcs[0]"}[p]
}

// runCase reduces fresh random data with every kernel set and checks the
// result against the reference; it reports the first wrong element only.
func runCase(t *testing.T, isaNames []string, dt dtype.DType, op dtype.RedOp, k, n int, where placement, seed int64) {
	t.Helper()
	name := fmt.Sprintf("%s %s k=%d n=%d %s", dt, op, k, n, where)
	rng := rand.New(rand.NewSource(seed))
	size := dt.Size()
	srcs := make([]*testBuf, k)
	for j := range srcs {
		srcs[j] = newTestBuf(n, size, (int(seed)+j)%4)
		for i := range n {
			srcs[j].set(i, randElem(rng, dt))
		}
	}
	if where == dupSource {
		srcs[1] = srcs[0]
	}
	var dst *testBuf
	switch where {
	case inFirst:
		dst = srcs[0]
	case inLast:
		dst = srcs[k-1]
	default:
		dst = newTestBuf(n, size, (int(seed)+k)%4)
	}
	scale := 3.0 // must be ignored unless PREMUL_SUM
	if op == dtype.PremulSum {
		scale = 0.1 + rng.Float64() // rarely exact in float32
	}
	vals := make([][]uint64, k)
	pristine := make([][]byte, k)
	addrs := make([]uintptr, k)
	for j, s := range srcs {
		vals[j] = s.values()
		pristine[j] = append([]byte(nil), s.mem...)
		addrs[j] = s.addr()
	}
	want := reference(dt, op, vals, scale)

	for _, isa := range isaNames {
		selectISA(t, isa)
		for j, s := range srcs {
			copy(s.mem, pristine[j]) // undo the previous in-place run
		}
		what := name + " on " + isa
		require.NoError(t, Reduce(dst.addr(), addrs, n, dt, op, scale), what)
		runtime.KeepAlive(srcs)
		runtime.KeepAlive(dst)

		for i, w := range want {
			if got := dst.get(i); !sameElem(dt, w, got) {
				xs := make([]uint64, k)
				for j := range xs {
					xs[j] = vals[j][i]
				}
				require.Failf(t, "wrong element", "%s: element %d of %#x: got %#x, want %#x", what, i, xs, got, w)
			}
		}
		if dt.IsFloat() && (op == dtype.Sum || op == dtype.Avg || op == dtype.PremulSum) {
			xs := make([]uint64, k)
			for i := range n {
				for j := range xs {
					xs[j] = vals[j][i]
				}
				checkTolerance(t, what, i, dt, op, xs, scale, dst.get(i))
			}
		}
		dst.checkGuards(t, what+" dst")
		for j, s := range srcs {
			s.checkGuards(t, fmt.Sprintf("%s src %d", what, j))
			if s != dst && !slices.Equal(vals[j], s.values()) {
				require.Failf(t, "source modified", "%s: source %d", what, j)
			}
		}
	}
}

// checkTolerance compares a sum against float64 arithmetic, loosely: this
// catches a wrong scale or a dropped source that an identically wrong
// reference would hide.
func checkTolerance(t *testing.T, name string, i int, dt dtype.DType, op dtype.RedOp, xs []uint64, scale float64, got uint64) {
	t.Helper()
	sc := 1.0
	if op == dtype.PremulSum {
		sc = scale
		if dt != dtype.Float64 {
			sc = float64(float32(scale))
		}
	}
	var exact, mag float64
	for _, x := range xs {
		v := toFloat64(dt, x) * sc
		exact += v
		mag += math.Abs(v)
	}
	if op == dtype.Avg {
		exact /= float64(len(xs))
		mag /= float64(len(xs))
	}
	g := toFloat64(dt, got)
	if math.IsInf(mag, 0) || math.IsNaN(mag) || math.IsInf(g, 0) {
		return
	}
	// Accumulation error grows with k; the final rounding costs half an
	// output ulp, at least half the smallest subnormal.
	accEps, outEps, outMin := 0x1p-24, 0x1p-24, 0x1p-149
	switch dt {
	case dtype.Float64:
		accEps, outEps, outMin = 0x1p-53, 0x1p-53, 0x1p-1074
	case dtype.Float16:
		outEps, outMin = 0x1p-11, 0x1p-24
	case dtype.BFloat16:
		outEps, outMin = 0x1p-8, 0x1p-133
	}
	tol := 2*float64(len(xs))*accEps*mag + outEps*math.Abs(exact) + outMin
	if math.Abs(g-exact) > tol {
		require.Failf(t, "outside tolerance", "%s: element %d: got %g, float64 says %g (tolerance %g)", name, i, g, exact, tol)
	}
}

func TestReduceTable(t *testing.T) {
	names := isas(t)
	sizes := testSizes
	if raceEnabled {
		sizes = raceSizes
	}
	for _, dt := range allDTypes {
		for _, op := range allOps {
			if dtype.Supports(dt, op) != nil {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				seed := int64(dt)*1000 + int64(op)*100
				for _, k := range testKs {
					for _, n := range sizes {
						for where := separate; where <= dupSource; where++ {
							if where == dupSource && k < 2 {
								continue
							}
							seed++
							runCase(t, names, dt, op, k, n, where, seed)
						}
					}
				}
			})
		}
	}
}

// TestReduceLargeK covers more sources than the table, over several of the
// kernels' chunks.
func TestReduceLargeK(t *testing.T) {
	names := isas(t)
	for i, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Int32, dtype.Bool} {
		runCase(t, names, dt, dtype.Sum, 9, 3*1024+5, inLast, int64(i))
		runCase(t, names, dt, dtype.Max, 8, 2049, inFirst, int64(i))
	}
}

func TestReduceKnownValues(t *testing.T) {
	f32 := func(vs ...float32) *testBuf {
		b := newTestBuf(len(vs), 4, 0)
		for i, v := range vs {
			b.set(i, uint64(math.Float32bits(v)))
		}
		return b
	}
	nan := float32(math.NaN())
	a := f32(1, 2, nan, -0.0, 5)
	b := f32(3, nan, 1, 0, 6)
	dst := newTestBuf(5, 4, 0)
	for _, tc := range []struct {
		op   dtype.RedOp
		want []float32
	}{
		{dtype.Sum, []float32{4, nan, nan, 0, 11}},
		{dtype.Avg, []float32{2, nan, nan, 0, 5.5}},
		{dtype.Min, []float32{1, nan, nan, -0.0, 5}},
		{dtype.Max, []float32{3, nan, nan, -0.0, 6}},
		{dtype.Product, []float32{3, nan, nan, -0.0, 30}},
		{dtype.PremulSum, []float32{2, nan, nan, 0, 5.5}},
	} {
		require.NoError(t, Reduce(dst.addr(), []uintptr{a.addr(), b.addr()}, 5, dtype.Float32, tc.op, 0.5))
		for i, w := range tc.want {
			got := math.Float32frombits(uint32(dst.get(i)))
			if w != w {
				assert.Truef(t, got != got, "%s element %d: got %v, want NaN", tc.op, i, got)
			} else {
				assert.Equalf(t, math.Float32bits(w), math.Float32bits(got), "%s element %d: got %v, want %v", tc.op, i, got, w)
			}
		}
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(dst)
}

func TestReduceErrors(t *testing.T) {
	buf := newTestBuf(64, 8, 0)
	p := buf.addr()
	for _, tc := range []struct {
		name string
		dst  uintptr
		srcs []uintptr
		n    int
		dt   dtype.DType
		op   dtype.RedOp
		want string
	}{
		{"avg of ints", p, []uintptr{p}, 4, dtype.Int32, dtype.Avg, dtype.Supports(dtype.Int32, dtype.Avg).Error()},
		{"bitwise float", p, []uintptr{p}, 4, dtype.Float16, dtype.BXor, dtype.Supports(dtype.Float16, dtype.BXor).Error()},
		{"bad dtype", p, []uintptr{p}, 4, dtype.DType(99), dtype.Sum, dtype.Supports(dtype.DType(99), dtype.Sum).Error()},
		{"bad op", p, []uintptr{p}, 4, dtype.Int8, dtype.RedOp(-1), dtype.Supports(dtype.Int8, dtype.RedOp(-1)).Error()},
		{"no sources", p, nil, 4, dtype.Int8, dtype.Sum, "no sources"},
		{"negative n", p, []uintptr{p}, -1, dtype.Int8, dtype.Sum, "negative"},
		{"nil dst", 0, []uintptr{p}, 4, dtype.Int8, dtype.Sum, "destination"},
		{"nil src", p, []uintptr{p, 0}, 4, dtype.Int8, dtype.Sum, "source 1"},
		{"wrapping src", p, []uintptr{^uintptr(0) - 2}, 4, dtype.Int8, dtype.Sum, "source 0"},
		{"overflowing n", p, []uintptr{p}, math.MaxInt, dtype.Int64, dtype.Sum, "overflow"},
		{"partial overlap", p + 8, []uintptr{p + 8, p}, 2, dtype.Int64, dtype.Sum, "partially overlaps"},
		{"partial overlap by one byte", p, []uintptr{p + 7}, 1, dtype.Int64, dtype.Sum, "partially overlaps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Reduce(tc.dst, tc.srcs, tc.n, tc.dt, tc.op, 1)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// Adjacent ranges are fine; n == 0 touches nothing, not even a nil address.
	require.NoError(t, Reduce(p, []uintptr{p + 8}, 1, dtype.Int64, dtype.Sum, 1))
	require.NoError(t, Reduce(0, []uintptr{0, 0}, 0, dtype.Float32, dtype.Sum, 1))
	runtime.KeepAlive(buf)
}

// ---- benchmarks -------------------------------------------------------------

var benchSizes = []int{1 << 20, 16 << 20}

// benchReduce reports throughput as destination bytes per second (the size
// of the tensor being reduced), comparable with BenchmarkCopy.
func benchReduce(b *testing.B, dt dtype.DType, op dtype.RedOp, k int, inPlace bool) {
	defer reduceSelectISA(false)
	best := reduceSelectISA(false)
	isas := []string{best}
	if best != "generic" {
		isas = append(isas, "generic")
	}
	for _, isa := range isas {
		for _, nbytes := range benchSizes {
			b.Run(fmt.Sprintf("%s/%dMiB", isa, nbytes>>20), func(b *testing.B) {
				reduceSelectISA(isa == "generic")
				n := nbytes / dt.Size()
				bufs := make([][]byte, k+1)
				addrs := make([]uintptr, k)
				for j := range bufs {
					bufs[j] = make([]byte, nbytes)
					for i := range bufs[j] {
						bufs[j][i] = byte(i*7+j) & 0x3f // small finite values for every dtype
					}
				}
				for j := range addrs {
					addrs[j] = uintptr(unsafe.Pointer(&bufs[j][0]))
				}
				dst := uintptr(unsafe.Pointer(&bufs[k][0]))
				if inPlace {
					dst = addrs[0]
				}
				b.SetBytes(int64(nbytes))
				b.ResetTimer()
				for b.Loop() {
					if err := Reduce(dst, addrs, n, dt, op, 0.5); err != nil {
						b.Fatal(err)
					}
				}
				runtime.KeepAlive(bufs)
			})
		}
	}
}

func BenchmarkReduceFloat32Sum2(b *testing.B) { benchReduce(b, dtype.Float32, dtype.Sum, 2, false) }
func BenchmarkReduceFloat32Sum2InPlace(b *testing.B) {
	benchReduce(b, dtype.Float32, dtype.Sum, 2, true)
}
func BenchmarkReduceFloat32Sum4(b *testing.B)  { benchReduce(b, dtype.Float32, dtype.Sum, 4, false) }
func BenchmarkReduceFloat32Avg4(b *testing.B)  { benchReduce(b, dtype.Float32, dtype.Avg, 4, false) }
func BenchmarkReduceFloat16Sum2(b *testing.B)  { benchReduce(b, dtype.Float16, dtype.Sum, 2, false) }
func BenchmarkReduceBFloat16Sum2(b *testing.B) { benchReduce(b, dtype.BFloat16, dtype.Sum, 2, false) }
func BenchmarkReduceBFloat16Sum4(b *testing.B) { benchReduce(b, dtype.BFloat16, dtype.Sum, 4, false) }
func BenchmarkReduceInt64Max2(b *testing.B)    { benchReduce(b, dtype.Int64, dtype.Max, 2, false) }

// BenchmarkCopy is the yardstick: Go's copy of the same sizes.
func BenchmarkCopy(b *testing.B) {
	for _, nbytes := range benchSizes {
		b.Run(fmt.Sprintf("%dMiB", nbytes>>20), func(b *testing.B) {
			src, dst := make([]byte, nbytes), make([]byte, nbytes)
			b.SetBytes(int64(nbytes))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}
