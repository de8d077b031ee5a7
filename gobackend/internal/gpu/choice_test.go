package gpu

import (
	"testing"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/stretchr/testify/require"
)

// A knob takes its set value, else the step of its measured rows that
// covers the size at the team's world and GPU, else its default; rows of
// another world or GPU never apply.
func TestKnobByMeasurement(t *testing.T) {
	saved := measuredRows
	t.Cleanup(func() { measuredRows = saved })
	measuredRows = []measuredRow{
		{knob: "K", world: 4, arch: 90, from: 0, value: 32},
		{knob: "K", world: 4, arch: 90, from: 8 << 20, value: 16},
		{knob: "K", world: 4, arch: 90, from: 256 << 20, value: 32},
		{knob: "K", world: 3, arch: 90, from: 0, value: 7},
		{knob: "other", world: 4, arch: 90, from: 0, value: 99},
	}
	k := knob{name: "K", set: -1, def: 5}
	for n, want := range map[int]int{0: 32, 4 << 20: 32, 8 << 20: 16, 100 << 20: 16, 256 << 20: 32, 1 << 30: 32} {
		require.Equal(t, want, k.at(4, 90, n), "%d bytes", n)
	}
	require.Equal(t, 7, k.at(3, 90, 1<<30))
	for _, w := range []int{2, 5, 8} {
		require.Equal(t, 5, k.at(w, 90, 16<<20), "world %d: not measured", w)
	}
	require.Equal(t, 5, k.at(4, 100, 16<<20), "another GPU: not measured")
	k.set = 24
	require.Equal(t, 24, k.at(4, 90, 16<<20), "the environment wins")
	k.set = 0
	require.Equal(t, 0, k.at(4, 90, 16<<20), "set to 0 is set (GOSYM_GPU_A2AV_BLOCKS=0: the host agreement)")
}

// GOSYM_GPU_A2AV_BLOCKS is a knob: set, even to 0, it wins over a measured
// row; unset, the row of the team's world and GPU, else the default (0).
func TestA2AVBlocksKnob(t *testing.T) {
	saved := measuredRows
	t.Cleanup(func() { measuredRows = saved })
	measuredRows = append(measuredRows[:len(measuredRows):len(measuredRows)],
		measuredRow{knob: "GOSYM_GPU_A2AV_BLOCKS", world: 2, arch: 90, from: 0, value: 64})
	t.Setenv("GOSYM_GPU_A2AV_BLOCKS", "")
	cfg := ConfigFromEnv()
	require.Equal(t, 64, cfg.a2avKnob.at(2, 90, 0))
	require.Equal(t, 0, cfg.a2avKnob.at(4, 90, 0), "4 ranks: not measured, the host agreement")
	t.Setenv("GOSYM_GPU_A2AV_BLOCKS", "0")
	require.Equal(t, 0, ConfigFromEnv().a2avKnob.at(2, 90, 0))
	t.Setenv("GOSYM_GPU_A2AV_BLOCKS", "16")
	require.Equal(t, 16, ConfigFromEnv().a2avKnob.at(4, 90, 0))
}

// The generated rows name real settings, and each knob's rows at a world
// and GPU start from 0 and rise (at's step rule relies on both).
func TestMeasuredRowsWellFormed(t *testing.T) {
	last := map[[3]any]int{}
	for _, r := range measuredRows {
		_, ok := config.Lookup(r.knob)
		require.True(t, ok, "%s is not a setting", r.knob)
		require.Positive(t, r.value, "%+v", r)
		key := [3]any{r.knob, r.world, r.arch}
		prev, seen := last[key]
		if !seen {
			require.Zero(t, r.from, "%+v: the first row of its knob starts at 0", r)
		} else {
			require.Greater(t, r.from, prev, "%+v: rows rise", r)
		}
		last[key] = r.from
	}
}

// Broadcast's blocks per chunk at 4 ranks of H200s come from the table
// (16 between 8 and 256 MiB, 32 elsewhere), at 2 ranks the default.
func TestRelayBlocksMeasured(t *testing.T) {
	k := knobOf(config.GPURelayBlocks)
	if k.set >= 0 {
		t.Skip("GOSYM_GPU_RELAY_BLOCKS is set")
	}
	require.Equal(t, 16, k.at(4, 90, 64<<20))
	require.Equal(t, 32, k.at(4, 90, 1<<30))
	require.Equal(t, k.def, k.at(2, 90, 64<<20))
}

// The local piece beside the link's runs from 32 MiB at 2 ranks of H200s
// (the table), and nowhere it was not measured: 4 ranks, another GPU.
func TestCEOverlapMeasured(t *testing.T) {
	k := knobOf(config.GPUCEOverlapMin)
	if k.set >= 0 {
		t.Skip("GOSYM_GPU_CE_OVERLAP_MIN is set")
	}
	require.Equal(t, 32<<20, k.at(2, 90, 1<<30))
	require.Equal(t, 0, k.at(4, 90, 1<<30), "4 ranks: not measured, off")
	require.Equal(t, 0, k.at(2, 100, 1<<30), "another GPU: not measured, off")
}
