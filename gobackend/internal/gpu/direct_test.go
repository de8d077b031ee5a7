package gpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// relayStep gives every rank the same slice for an op, a multiple of 16
// within [16 KiB, most], and at least eight slices per block's share
// where that share is large enough (a relaying block trails its puller by
// a slice: fewer slices would leave it idle longer).
func TestRelayStep(t *testing.T) {
	for _, c := range []struct {
		n          uint64
		m, g, most int
	}{{4 << 20, 3, 16, 512 << 10}, {1 << 30, 3, 16, 512 << 10}, {1<<30 + 7, 7, 18, 1 << 20}, {5 << 20, 2, 1, 16}, {100, 3, 16, 512 << 10}} {
		st := relayStep(c.n, c.m, c.g, c.most)
		require.Zero(t, st%16, "%+v", c)
		require.LessOrEqual(t, st, uint64(max(c.most, 16)), "%+v", c)
		if c.most >= 16<<10 {
			require.GreaterOrEqual(t, st, uint64(16<<10), "%+v", c)
		}
		per := ((c.n+uint64(c.m)-1)/uint64(c.m) + uint64(c.g) - 1) / uint64(c.g)
		if per/8 >= 16<<10 && per/8 <= uint64(c.most) {
			require.LessOrEqual(t, (per+st-1)/st, uint64(9), "%+v: slices per block", c)
			require.GreaterOrEqual(t, (per+st-1)/st, uint64(8), "%+v: slices per block", c)
		}
	}
}

// Broadcasts relay from three ranks and the configured size, never at two
// (one non-root: nothing to relay).
func TestRelaysFromThreeRanks(t *testing.T) {
	cfg := Config{relayMin: 4 << 20}
	for _, c := range []struct {
		world int
		n     uintptr
		want  bool
	}{{2, 1 << 30, false}, {3, 4 << 20, true}, {3, 4<<20 - 1, false}, {8, 1 << 30, true}} {
		tm := &Team{world: c.world, cfg: cfg}
		require.Equal(t, c.want, tm.relays(c.n), "world %d, %d bytes", c.world, c.n)
	}
}

// gs_arpush's slot: world slots of it and 16 bytes each fit in the
// staging, a whole number of 16-byte vectors, and enough for every block
// of the largest grid to own one vector of it.
func TestArPushSlotFitsTheStaging(t *testing.T) {
	for _, stage := range []uintptr{64 << 10, 1 << 20, 32 << 20} {
		for world := 2; world <= cuda.MaxRanks; world++ {
			for _, es := range []int{1, 2, 4, 8} {
				slot := arPushSlot(stage, world, es)
				require.LessOrEqual(t, uint64(world)*(slot*uint64(es)+16), uint64(stage), "stage %d world %d es %d", stage, world, es)
				require.Zero(t, slot*uint64(es)%16)
				require.GreaterOrEqual(t, slot, uint64(cuda.MaxBlocks*16/es))
			}
		}
	}
}
