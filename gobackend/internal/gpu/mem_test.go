package gpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda/cudatest"
)

// Segments of torch's caching allocator are shareable bufs registered
// implicitly (the direct path finds them without asking the driver), found
// again by address when freed, once; an address gosym did not hand out is
// refused. Against the fake libcuda, in a child process.
func TestSegmentsAreRegisteredBufsFreedOnce(t *testing.T) {
	if cudatest.InFakeChild(t) {
		return
	}
	before := Segments()
	a, err := AllocSegment(0, 3<<20+1)
	require.NoError(t, err)
	b, err := AllocSegment(1, 100)
	require.NoError(t, err)
	require.NotEqual(t, a, b)
	require.Equal(t, before+2, Segments())
	buf := liveBuf(0, a+(3<<20), 1) // the last requested byte lies in the live buf
	require.NotNil(t, buf)
	require.Equal(t, a, buf.Addr())
	m, ok := bufDomain.Find(a+64, 1<<20)
	require.True(t, ok, "registered implicitly, as gosym.empty's")
	require.Same(t, buf.m, m)
	require.Nil(t, liveBuf(0, b, 1), "a segment of device 1 is not device 0's")
	require.NoError(t, FreeSegment(a))
	require.Nil(t, liveBuf(0, a, 1))
	require.ErrorContains(t, FreeSegment(a), "is not a segment of gosym's allocator")
	require.ErrorContains(t, FreeSegment(12345), "is not a segment of gosym's allocator")
	require.NoError(t, FreeSegment(b))
	require.Equal(t, before, Segments())
}
