package main

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestF16RoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := f16ToF32(uint16(h))
		if f != f {
			continue
		}
		require.Equal(t, uint16(h), f32ToF16(f), "%#04x", h)
	}
	for _, c := range []struct {
		f float32
		h uint16
	}{{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {1 + 1.0/2048, 0x3c00},
		{1 + 3.0/2048, 0x3c02}, {5.960464477539063e-08, 0x0001}, {2.9802322387695312e-08, 0x0000}} {
		require.Equal(t, c.h, f32ToF16(c.f), "%v", c.f)
	}
}

func TestBF16Rounding(t *testing.T) {
	for b := 0; b < 1<<16; b++ {
		f := bf16ToF32(uint16(b))
		if f != f {
			continue
		}
		require.Equal(t, uint16(b), f32ToBF16(f), "%#04x", b)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		u := rng.Uint32()
		f := math.Float32frombits(u)
		if f != f {
			continue
		}
		rne := uint16((u + 0x7fff + (u>>16)&1) >> 16) // the usual bit trick
		require.Equal(t, rne, f32ToBF16(f), "%#08x", u)
	}
}

// Every finite fp8 code survives decode and encode; the rounding of a few
// values between codes, ties, saturation and NaN.
func TestF8Codec(t *testing.T) {
	for _, f := range []f8Format{e4m3, e5m2} {
		for b := 0; b < 256; b++ {
			v := f.toF64(uint8(b))
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			require.Equal(t, uint8(b), f.fromF64(v), "%#02x", b)
		}
	}
	for _, c := range []struct {
		f    f8Format
		x    float64
		want uint8
	}{{e4m3, 1, 0x38}, {e4m3, 448, 0x7e}, {e4m3, 1e6, 0x7e}, {e4m3, -1e6, 0xfe}, {e4m3, math.Inf(1), 0x7e},
		{e4m3, 1 + 1.0/16, 0x38}, {e4m3, 1 + 3.0/16, 0x3a}, {e4m3, 0x1p-9, 0x01}, {e4m3, 0x1p-10, 0x00},
		{e4m3, math.NaN(), 0x7f}, {e5m2, 57344, 0x7b}, {e5m2, math.Inf(-1), 0xfb}, {e5m2, 1, 0x3c},
		{e5m2, 0x1p-16, 0x01}, {e5m2, 1 + 1.0/8, 0x3c}, {e5m2, 1 + 3.0/8, 0x3e}} {
		require.Equal(t, c.want, c.f.fromF64(c.x), "%v %v", c.f, c.x)
	}
}
