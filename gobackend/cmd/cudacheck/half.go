package main

import "math"

// Element codecs of the host reference, written independently of the
// kernels: round to nearest even, NaN stays NaN.

func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := int(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		v := float32(man) / (1 << 24)
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | uint32(exp-15+127)<<23 | man<<13)
}

func f32ToF16(f float32) uint16 {
	if f != f {
		return 0x7e00
	}
	d := float64(f)
	sign := uint16(0)
	if math.Signbit(d) {
		sign, d = 0x8000, -d
	}
	if d >= 65520 { // rounds to infinity
		return sign | 0x7c00
	}
	if d < math.Ldexp(1, -14) { // subnormal: steps of 2^-24
		return sign | uint16(math.RoundToEven(d*(1<<24)))
	}
	frac, exp := math.Frexp(d) // d = frac * 2^exp, frac in [0.5, 1)
	m := math.RoundToEven(frac * 2048)
	if m == 2048 {
		m, exp = 1024, exp+1
	}
	return sign | uint16(exp-1+15)<<10 | uint16(m-1024)
}

func bf16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

func f32ToBF16(f float32) uint16 {
	if f != f {
		return 0x7fc0
	}
	u := math.Float32bits(f)
	sign, mag := uint16(u>>16)&0x8000, u&0x7fffffff
	lo := mag & 0xffff0000
	if lo == mag || mag >= 0x7f800000 {
		return sign | uint16(lo>>16)
	}
	// The upper neighbour is lo plus one bf16 ulp (2^(e-7), or 2^-133 for
	// subnormals); past the largest finite value that is infinity.
	e := int(lo>>23) - 127
	if lo>>23 == 0 {
		e = -126
	}
	a, flo := float64(math.Float32frombits(mag)), float64(math.Float32frombits(lo))
	dlo, dhi := a-flo, flo+math.Ldexp(1, e-7)-a
	if dlo < dhi || (dlo == dhi && (lo>>16)&1 == 0) {
		return sign | uint16(lo>>16)
	}
	return sign | uint16((lo+0x10000)>>16)
}

// f8Format is an OCP FP8 format: mantissa bits, exponent bias, and whether
// the all-ones exponent holds infinity and NaN (e5m2) or only magnitude
// 0x7f is NaN (e4m3fn).
type f8Format struct {
	m, bias int
	ieee    bool
}

var (
	e4m3 = f8Format{m: 3, bias: 7}
	e5m2 = f8Format{m: 2, bias: 15, ieee: true}
)

// toF64 decodes b from its fields.
func (f f8Format) toF64(b uint8) float64 {
	e, m := int(b&0x7f)>>f.m, int(b)&(1<<f.m-1)
	var v float64
	switch {
	case !f.ieee && b&0x7f == 0x7f, f.ieee && e == 0x7f>>f.m && m != 0:
		v = math.NaN()
	case f.ieee && e == 0x7f>>f.m:
		v = math.Inf(1)
	case e == 0:
		v = math.Ldexp(float64(m), 1-f.bias-f.m)
	default:
		v = math.Ldexp(float64(1<<f.m+m), e-f.bias-f.m)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return v
}

// maxCode is the largest finite magnitude's code.
func (f f8Format) maxCode() uint8 {
	if f.ieee {
		return 0x7b
	}
	return 0x7e
}

// fromF64 is the nearest finite code by search, ties to the even code,
// saturating at the largest finite value (NCCL's __NV_SATFINITE
// conversion); NaN stays NaN.
func (f f8Format) fromF64(x float64) uint8 {
	if math.IsNaN(x) {
		return 0x7f
	}
	sign := uint8(0)
	if math.Signbit(x) {
		sign = 0x80
	}
	a, top := math.Abs(x), f.maxCode()
	if a >= f.toF64(top) {
		return sign | top
	}
	best, bestD := uint8(0), a
	for c := uint8(1); c <= top; c++ {
		if d := math.Abs(f.toF64(c) - a); d < bestD || (d == bestD && c%2 == 0) {
			best, bestD = c, d
		}
	}
	return sign | best
}
