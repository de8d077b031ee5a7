package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTimingCountsDriverCallsOnlyWhenOn(t *testing.T) {
	withFake(t, func(d *Driver) {
		defer SetTiming(false)
		calls0, ns0 := Timed()
		_, err := d.DeviceCount()
		require.NoError(t, err)
		calls1, _ := Timed()
		require.Equal(t, calls0, calls1, "a driver call counted while timing is off")

		SetTiming(true)
		for i := 0; i < 3; i++ {
			_, err := d.DeviceCount()
			require.NoError(t, err)
		}
		calls2, ns2 := Timed()
		require.Equal(t, calls0+3, calls2, "each driver call counts once while timing is on")
		require.GreaterOrEqual(t, ns2, ns0)

		SetTiming(false)
		_, err = d.DeviceCount()
		require.NoError(t, err)
		calls3, _ := Timed()
		require.Equal(t, calls2, calls3, "timing goes off again")
	})
}
