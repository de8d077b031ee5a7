package coll

import (
	"errors"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Par covers [0, n) once, in shares that start aligned, no more than threads of them and
// none but the last below ParMin.
func TestParCoversTheRangeOnce(t *testing.T) {
	for _, c := range []struct{ threads, n, align int }{
		{1, 5 * ParMin, 64}, {4, ParMin - 1, 64}, {4, 3*ParMin + 17, 64}, {8, 2*ParMin + 1, 8},
		{3, 10 * ParMin, 64}, {16, 16*ParMin - 64, 64},
	} {
		var mu sync.Mutex
		var shares [][2]int
		Par(c.threads, c.n, c.align, func(lo, hi int) {
			mu.Lock()
			shares = append(shares, [2]int{lo, hi})
			mu.Unlock()
		})
		covered := make([]int, c.n)
		for _, s := range shares {
			assert.Zero(t, s[0]%c.align, "share %v of %+v starts unaligned", s, c)
			for i := s[0]; i < s[1]; i++ {
				covered[i]++
			}
		}
		for i, k := range covered {
			require.Equal(t, 1, k, "byte %d of %+v covered %d times (shares %v)", i, c, k, shares)
		}
		assert.LessOrEqual(t, len(shares), max(1, c.threads), "%+v: %v", c, shares)
		for _, s := range shares {
			if s[1] < c.n {
				assert.GreaterOrEqual(t, s[1]-s[0], ParMin, "share %v of %+v below ParMin", s, c)
			}
		}
		if c.threads > 1 && c.n >= 2*ParMin {
			assert.Greater(t, len(shares), 1, "%+v ran in one share", c)
		}
	}
}

// ParReduce offsets every source and the destination alike, and returns a share's error.
func TestParReduceOffsetsEverySource(t *testing.T) {
	n := 3*ParMin/4 + 5 // elements of 4 bytes: shares of ParMin bytes and a short last one
	a, b, dst := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range a {
		a[i], b[i], dst[i] = float32(i), float32(2*i+1), -1
	}
	addr := func(x []float32) uintptr { return uintptr(unsafe.Pointer(&x[0])) }
	err := ParReduce(4, addr(dst), []uintptr{addr(a), addr(b)}, 4*n, 4, func(d uintptr, s []uintptr, c int) error {
		// every address of a share lies the same distance into its own slice
		off := int(d-addr(dst)) / 4
		if int(s[0]-addr(a))/4 != off || int(s[1]-addr(b))/4 != off {
			return errors.New("sources offset unlike the destination")
		}
		for i := off; i < off+c; i++ {
			dst[i] = a[i] + b[i]
		}
		return nil
	})
	require.NoError(t, err)
	for i := range dst {
		require.Equal(t, float32(3*i+1), dst[i], "element %d", i)
	}
	boom := errors.New("boom")
	err = ParReduce(4, addr(dst), []uintptr{addr(a)}, 4*n, 4, func(d uintptr, s []uintptr, c int) error {
		if d != addr(dst) {
			return boom
		}
		return nil
	})
	assert.ErrorIs(t, err, boom)
}
