package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// optIn is the environment of an operator who asked for NVLS and nothing else.
func optIn(extra map[string]string) map[string]string {
	m := map[string]string{"GOSYM_NVLS": "1"}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// Each of these, alone, must keep multicast off.
var multicastVetoes = []struct {
	name string
	env  map[string]string
	dev  bool
}{
	{"GOSYM_NVLS unset", map[string]string{}, true},
	{"GOSYM_NVLS=0", map[string]string{"GOSYM_NVLS": "0"}, true},
	{"GOSYM_NVLS=true", map[string]string{"GOSYM_NVLS": "true"}, true},
	{"NCCL_NVLS_ENABLE=0", optIn(map[string]string{"NCCL_NVLS_ENABLE": "0"}), true},
	{"NCCL_NVLS_ENABLE=junk", optIn(map[string]string{"NCCL_NVLS_ENABLE": "junk"}), true},
	{"TORCH_SYMM_MEM_DISABLE_MULTICAST=1", optIn(map[string]string{"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}), true},
	{"TORCH_SYMM_MEM_DISABLE_MULTICAST=yes", optIn(map[string]string{"TORCH_SYMM_MEM_DISABLE_MULTICAST": "yes"}), true},
	{"NVSHMEM_DISABLE_NVLS=1", optIn(map[string]string{"NVSHMEM_DISABLE_NVLS": "1"}), true},
	{"device lacks multicast", optIn(nil), false},
	{"the GPU machine's environment", optIn(map[string]string{"NCCL_NVLS_ENABLE": "0",
		"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}), true},
}

func TestMulticastAllowed(t *testing.T) {
	for _, c := range multicastVetoes {
		t.Run(c.name, func(t *testing.T) {
			ok, reason := MulticastAllowed(envOf(c.env), c.dev)
			require.False(t, ok)
			require.NotEmpty(t, reason)
		})
	}
	for _, env := range []map[string]string{
		optIn(nil),
		optIn(map[string]string{"GOSYM_NVLS": " 1 "}),
		optIn(map[string]string{"NCCL_NVLS_ENABLE": "1"}),
		optIn(map[string]string{"NCCL_NVLS_ENABLE": "2"}),
		optIn(map[string]string{"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NVSHMEM_DISABLE_NVLS": "false"}),
	} {
		ok, reason := MulticastAllowed(envOf(env), true)
		require.True(t, ok, "%v: %s", env, reason)
	}
}

// The reason names the variable that said no, so an operator can act on it.
func TestMulticastReasonNamesTheVeto(t *testing.T) {
	_, reason := MulticastAllowed(envOf(optIn(map[string]string{"NVSHMEM_DISABLE_NVLS": "1"})), true)
	require.Contains(t, reason, "NVSHMEM_DISABLE_NVLS=1")
	_, reason = MulticastAllowed(envOf(map[string]string{}), true)
	require.Contains(t, reason, "GOSYM_NVLS")
}

// Through the driver: no veto lets cuMulticastCreate be reached, or even
// looked up.
func TestEnableMulticastNeverReachesDriverWhenVetoed(t *testing.T) {
	for _, c := range multicastVetoes {
		t.Run(c.name, func(t *testing.T) {
			withFake(t, func(d *Driver) {
				if c.dev {
					fakeSetAttr(AttrMulticastSupported, 1)
				}
				mc, err := d.EnableMulticast(envOf(c.env), 0)
				require.ErrorIs(t, err, ErrNotSupported)
				require.Nil(t, mc)
				require.Zero(t, fakeMulticastLookups())
				require.False(t, fakeMulticastEnabled(d))
				require.Zero(t, fakeCalls("cuMulticastCreate"))
				require.Equal(t, codeRefused, fakeCallMulticastCreate(d))
				require.Zero(t, fakeCalls("cuMulticastCreate"))
			})
		})
	}
}

// Positive control: with the gate open the same path does reach the driver,
// so the tests above prove the gate and not a broken fake.
func TestEnableMulticastWhenAllowed(t *testing.T) {
	withFake(t, func(d *Driver) {
		fakeSetAttr(AttrMulticastSupported, 1)
		mc, err := d.EnableMulticast(envOf(optIn(nil)), 0)
		require.NoError(t, err)
		require.Positive(t, fakeMulticastLookups())
		h, err := mc.Create(0, MulticastProp{NumDevices: 2, Size: 2 << 20, HandleTypes: HandleTypePosixFD})
		require.NoError(t, err)
		require.EqualValues(t, 0x6d63, h)
		require.EqualValues(t, 1, fakeCalls("cuMulticastCreate"))
		again, err := d.EnableMulticast(envOf(optIn(nil)), 0)
		require.NoError(t, err)
		require.Same(t, mc, again)
		// A veto still refuses a new Enable even after one succeeded.
		_, err = d.EnableMulticast(envOf(map[string]string{"GOSYM_NVLS": "0"}), 0)
		require.ErrorIs(t, err, ErrNotSupported)
	})
}

// The C wrappers refuse on their own: slots filled without the gate (as a
// bug elsewhere might) are still never called.
func TestMulticastWrapperRefusesWithoutGate(t *testing.T) {
	withFake(t, func(d *Driver) {
		fakeFillMulticastSlots(d)
		require.False(t, fakeMulticastEnabled(d))
		require.Equal(t, codeRefused, fakeCallMulticastCreate(d))
		require.Zero(t, fakeCalls("cuMulticastCreate"))
	})
}

func TestEnableMulticastMissingSymbols(t *testing.T) {
	withFake(t, func(d *Driver) {
		fakeSetAttr(AttrMulticastSupported, 1)
		_, err := d.EnableMulticast(envOf(optIn(nil)), 0)
		require.ErrorIs(t, err, ErrNotSupported)
		var se *SymbolError
		require.ErrorAs(t, err, &se)
		require.Equal(t, []string{"cuMulticastBindMem"}, se.Missing)
	}, "cuMulticastBindMem")
}
