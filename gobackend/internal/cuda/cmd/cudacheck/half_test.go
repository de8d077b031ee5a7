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
