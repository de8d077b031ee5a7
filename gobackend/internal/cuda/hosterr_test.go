package cuda

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// The block is allocated pinned and device-mapped, starts clear, shows what
// a kernel writes (played here by the test) and is freed exactly once.
func TestErrorWordsLifecycle(t *testing.T) {
	withFake(t, func(d *Driver) {
		w, err := NewErrorWords(d, 0)
		require.NoError(t, err)
		require.NotZero(t, w.Device())
		require.Equal(t, uintptr(w.host), w.Device(), "the fake maps host memory at its own address")
		_, set := w.Load()
		require.False(t, set)
		require.Zero(t, w.Code())

		words := w.words // what the kernel writes through Device()
		atomic.StoreUint32(&words[HostErrorMissing], 0b1010)
		atomic.StoreUint32(&words[HostErrorDetail], 3<<8|1)
		atomic.StoreUint32(&words[HostErrorCode], ErrTimeout)
		e, set := w.Load()
		require.True(t, set)
		require.Equal(t, DeviceError{Code: ErrTimeout, Detail: 3<<8 | 1, Missing: 0b1010}, e)
		require.Equal(t, []int{1, 3}, e.Ranks())
		require.Equal(t, "kernel barrier, block 3", e.Where())

		require.NoError(t, w.Close())
		require.NoError(t, w.Close(), "a second close is a no-op")
		require.EqualValues(t, 1, fakeCalls("cuMemHostAlloc"))
		require.EqualValues(t, 1, fakeCalls("cuMemFreeHost"))
		log := fakeLog()
		var allocated, freed uint64
		for _, c := range log {
			switch c.Name {
			case "cuMemHostAlloc":
				allocated = c.Arg
			case "cuMemFreeHost":
				freed = c.Arg
			}
		}
		require.Equal(t, allocated, freed, "the block allocated is the one freed")
	})
}

func TestErrorWordsFailures(t *testing.T) {
	t.Run("alloc", func(t *testing.T) {
		withFake(t, func(d *Driver) {
			fakeFailAt("cuMemHostAlloc", 1)
			w, err := NewErrorWords(d, 0)
			require.Nil(t, w)
			require.ErrorContains(t, err, "cuMemHostAlloc")
			require.Zero(t, fakeCalls("cuMemFreeHost"), "nothing to free")
		})
	})
	t.Run("device pointer", func(t *testing.T) {
		withFake(t, func(d *Driver) {
			fakeFailAt("cuMemHostGetDevicePointer", 1)
			w, err := NewErrorWords(d, 0)
			require.Nil(t, w)
			require.ErrorContains(t, err, "cuMemHostGetDevicePointer")
			require.EqualValues(t, 1, fakeCalls("cuMemFreeHost"), "the block does not leak")
		})
	})
	t.Run("missing symbol fails the load", func(t *testing.T) {
		_, _, err := fakeDriver("cuMemHostAlloc")
		var se *SymbolError
		require.ErrorAs(t, err, &se)
		require.Equal(t, []string{"cuMemHostAlloc"}, se.Missing)
	})
	require.NoError(t, (*ErrorWords)(nil).Close())
}

func TestDeviceErrorWhere(t *testing.T) {
	for _, c := range []struct {
		e    DeviceError
		want string
	}{
		{DeviceError{Code: ErrTimeout, Detail: 0<<8 | 1}, "kernel barrier, block 0"},
		{DeviceError{Code: ErrTimeout, Detail: 127<<8 | 1}, "kernel barrier, block 127"},
		{DeviceError{Code: ErrTimeout, Detail: PadSemaReadyWord<<8 | 2}, "semaphore wait for staged input, rank 2"},
		{DeviceError{Code: ErrTimeout, Detail: PadSemaDoneWord<<8 | 5}, "semaphore wait for release, rank 5"},
		{DeviceError{Code: ErrTimeout, Detail: LLWaitDetail | 63<<8 | 1}, "LL kernel, block 63 waiting for the lines of rank 1"},
		{DeviceError{Code: ErrConfig, Detail: 129<<16 | 32}, "launch configuration or parameters out of range, detail 0x810020"},
		{DeviceError{Code: ErrTimeout, Detail: A2AVDetail | A2AVWaitSlot<<16 | 31<<8 | 7}, "all_to_all, block 31 waiting for rank 7 to consume a chunk"},
		{DeviceError{Code: ErrTimeout, Detail: A2AVDetail | A2AVWaitData<<16 | 2<<8 | 1}, "all_to_all, block 2 waiting for rank 1's chunk"},
		{DeviceError{Code: ErrMismatch, Detail: A2AVDetail | A2AVMismatch<<16 | 5<<8 | 3},
			"all_to_all: rank 3 sent this rank a piece of another size than this rank's output split for it"},
	} {
		require.Equal(t, c.want, c.e.Where())
	}
	require.Empty(t, DeviceError{}.Ranks())
	require.Equal(t, []int{0, 7}, DeviceError{Missing: 0x81}.Ranks())
}

// A block over ordinary memory (for tests elsewhere) behaves the same and
// owns nothing.
func TestErrorWordsAt(t *testing.T) {
	var words [HostErrorWords]uint32
	w := ErrorWordsAt(&words)
	require.Equal(t, uintptr(unsafe.Pointer(&words)), w.Device())
	words[HostErrorMissing], words[HostErrorCode] = 4, ErrConfig
	e, set := w.Load()
	require.True(t, set)
	require.Equal(t, DeviceError{Code: ErrConfig, Missing: 4}, e)
	require.NoError(t, w.Close())
}
