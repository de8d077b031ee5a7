package gpu

import (
	"testing"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/stretchr/testify/require"
)

// The LL and direct-copy tunables: LL_MAX is clamped to what the kernel's
// area layout allows (0 turns it off), DIRECT_CE_MIN takes 0 (copy engines
// always), and the defaults are the measured ones.
func TestGPUConfigLLAndDirectCopy(t *testing.T) {
	cfg := ConfigFromEnv()
	require.Equal(t, 256<<10, cfg.llMax)
	require.Equal(t, 32<<20, cfg.directCEMin)
	t.Setenv("GOSYM_GPU_LL_MAX", "1073741824")
	t.Setenv("GOSYM_GPU_DIRECT_CE_MIN", "0")
	cfg = ConfigFromEnv()
	require.Equal(t, cuda.LLMaxBytes, cfg.llMax)
	require.Equal(t, 0, cfg.directCEMin)
	t.Setenv("GOSYM_GPU_LL_MAX", "0")
	require.Equal(t, 0, ConfigFromEnv().llMax)
	tm := &Team{cfg: Config{llMax: 4096}, llArea: cuda.LLAreaBytes(2, 4096)}
	require.True(t, tm.lowLatency(1))
	require.True(t, tm.lowLatency(4096))
	require.False(t, tm.lowLatency(4097))
	require.False(t, tm.lowLatency(0))
	tm.llArea = 0 // a group of one rank has no LL area
	require.False(t, tm.lowLatency(1))
}

// Each kind's direct-path threshold: all_reduce from where it runs
// two-shot, broadcast and all_gather from moveDirectMin, the rest from
// directMin; under capture all_reduce and reduce_scatter from
// captureDirectMin; all_to_all with splits that differ from a2avDirectMin.
// None is ever above directMin.
func TestGPUDirectMinByKind(t *testing.T) {
	cfg := ConfigFromEnv()
	require.Equal(t, 8<<20, cfg.directMin)
	require.Equal(t, 4<<20, cfg.moveDirectMin)
	tm := &Team{cfg: Config{directMin: 8 << 20, moveDirectMin: 4 << 20, twoShotMin: 2 << 20, captureDirectMin: 1}}
	want := map[ops.Kind][2]int{ // eager, captured
		ops.AllReduce:     {2 << 20, 1},
		ops.ReduceScatter: {8 << 20, 1},
		ops.Broadcast:     {4 << 20, 4 << 20},
		ops.AllGather:     {4 << 20, 4 << 20},
		ops.AllToAll:      {8 << 20, 8 << 20},
		ops.Reduce:        {8 << 20, 8 << 20},
	}
	for kind, w := range want {
		for i, capturing := range []bool{false, true} {
			tm.capturing = capturing
			require.Equal(t, w[i], tm.directMin(&ops.Op{Kind: kind}), "%v, capturing %v", kind, capturing)
		}
	}
	// all_to_all whose splits differ: from a2avDirectMin, captured or not
	require.Equal(t, 2<<20, cfg.a2avDirectMin)
	tm.cfg.a2avDirectMin = 2 << 20
	a2a := &ops.Op{Kind: ops.AllToAll}
	for _, capturing := range []bool{false, true} {
		tm.capturing = capturing
		require.Equal(t, 2<<20, tm.allToAllDirectMin(a2a, true))
		require.Equal(t, 8<<20, tm.allToAllDirectMin(a2a, false), "equal splits: directMin")
	}
	tm.cfg.directMin = 1 << 20 // a lower directMin wins over every kind's own
	tm.capturing = false
	for kind := range want {
		require.LessOrEqual(t, tm.directMin(&ops.Op{Kind: kind}), 1<<20, "%v", kind)
	}
	require.Equal(t, 1<<20, tm.allToAllDirectMin(a2a, true))
}

// gs_llmove's parameters on every rank of groups of 2 to 4 fit together:
// rank q sends rank r data exactly when r expects data from q (else both
// exchange only the handshake), from the piece meant for r into the place
// r wants it; ops past LL_MAX and uneven all_to_all are left to the other
// paths.
func TestLLMoveParams(t *testing.T) {
	const count = 100 // float32: 400 bytes per segment
	base := func(r, which int) uintptr { return uintptr(r+1)<<32 | uintptr(which)<<20 }
	pieces := func(r, which int) []ops.Piece {
		ps := make([]ops.Piece, 4)
		for q := range ps {
			ps[q] = ops.Piece{Addr: base(r, which) + uintptr(q)*400, Count: count}
		}
		return ps
	}
	for world := 2; world <= 4; world++ {
		root := world - 1
		makers := map[ops.Kind]func(r int) *ops.Op{
			ops.Broadcast: func(r int) *ops.Op {
				return &ops.Op{Kind: ops.Broadcast, Root: root, In: base(r, 1), Out: base(r, 2)}
			},
			ops.AllGather: func(r int) *ops.Op {
				return &ops.Op{Kind: ops.AllGather, In: base(r, 1), OutPieces: pieces(r, 2)[:world]}
			},
			ops.Gather: func(r int) *ops.Op {
				op := &ops.Op{Kind: ops.Gather, Root: root, In: base(r, 1)}
				if r == root {
					op.OutPieces = pieces(r, 2)[:world]
				}
				return op
			},
			ops.Scatter: func(r int) *ops.Op {
				op := &ops.Op{Kind: ops.Scatter, Root: root, Out: base(r, 2)}
				if r == root {
					op.InPieces = pieces(r, 1)[:world]
				}
				return op
			},
			ops.AllToAll: func(r int) *ops.Op {
				return &ops.Op{Kind: ops.AllToAll, InPieces: pieces(r, 1)[:world], OutPieces: pieces(r, 2)[:world]}
			},
		}
		for kind, mk := range makers {
			ps := make([]cuda.LLMoveParams, world)
			for r := range world {
				tm := &Team{rank: r, world: world, cfg: Config{llMax: 4096}, llArea: cuda.LLAreaBytes(world, 4096)}
				op := mk(r)
				op.DType, op.Count = dtype.Float32, count
				if kind == ops.AllToAll {
					op.Count, op.EvenPieces = 0, true // as ops.Even leaves all_to_all_single
				}
				p, ok := tm.llMoveParams(op)
				require.True(t, ok, "%s world %d rank %d", kind, world, r)
				require.EqualValues(t, 400, p.Bytes)
				ps[r] = p
			}
			for q := range world {
				for r := range world {
					if q == r {
						continue
					}
					sends, expects := ps[q].Src[r] != 0, ps[r].Dst[q] != 0
					require.Equal(t, sends, expects, "%s world %d: rank %d sends rank %d %v, which expects %v", kind, world, q, r, sends, expects)
				}
			}
			switch kind { // where the data comes from and goes, spot checks
			case ops.Broadcast:
				require.Equal(t, base(root, 1), ps[root].Src[0])
				require.Equal(t, base(0, 2), ps[0].Dst[root])
			case ops.AllToAll:
				require.Equal(t, base(1, 1)+400*0, ps[1].Src[0]) // rank 1's piece for rank 0
				require.Equal(t, base(0, 2)+400*1, ps[0].Dst[1]) // lands in rank 0's piece from rank 1
			case ops.Scatter:
				require.Equal(t, base(root, 1)+400*0, ps[root].Src[0])
			}
		}
	}
	tm := &Team{rank: 0, world: 2, cfg: Config{llMax: 4096}, llArea: cuda.LLAreaBytes(2, 4096)}
	big := &ops.Op{Kind: ops.Broadcast, DType: dtype.Float32, Count: 1025, In: 1, Out: 1}
	_, ok := tm.llMoveParams(big)
	require.False(t, ok, "past LL_MAX")
	uneven := &ops.Op{Kind: ops.AllToAll, DType: dtype.Float32,
		InPieces: []ops.Piece{{Addr: 8, Count: 1}, {Addr: 16, Count: 2}}, OutPieces: []ops.Piece{{Addr: 32, Count: 1}, {Addr: 40, Count: 2}}}
	_, ok = tm.llMoveParams(uneven)
	require.False(t, ok, "uneven all_to_all")
	// Pieces equal on this rank but passed by the caller (torch's all_to_all or
	// split sizes): a peer's may differ (its own piece), so no LL without the flag.
	looks := &ops.Op{Kind: ops.AllToAll, DType: dtype.Float32,
		InPieces: []ops.Piece{{Addr: 8, Count: 2}, {Addr: 16, Count: 2}}, OutPieces: []ops.Piece{{Addr: 32, Count: 2}, {Addr: 40, Count: 2}}}
	_, ok = tm.llMoveParams(looks)
	require.False(t, ok, "locally equal pieces of an all_to_all with splits")
	looks.EvenPieces = true
	_, ok = tm.llMoveParams(looks)
	require.True(t, ok, "all_to_all_single without splits")
	tm.llArea = 0
	_, ok = tm.llMoveParams(&ops.Op{Kind: ops.Broadcast, DType: dtype.Float32, Count: 1, In: 1, Out: 1})
	require.False(t, ok, "no LL area")
}

// gs_a2av's parameter on every rank of a skewed all_to_all: what rank q
// sends rank r is what r expects from q, each rank's shape is the same
// (so the pairs' chunks match), the slots fit a region, and the grid has
// the same pair blocks everywhere with the local copy's after them.
func TestA2AVParams(t *testing.T) {
	const stage = 1 << 20
	for world := 2; world <= 8; world++ {
		split := func(q, r int) int { return (q*3 + r*5) % 7 * 37 } // elements q sends r, zeros included
		ps := make([]cuda.A2AVParams, world)
		for r := range world {
			tm := &Team{rank: r, world: world, stage: stage, cfg: Config{a2avBlocks: 32, a2avSlot: 64 << 10}}
			for q := range world {
				tm.stages[q], tm.pads[q] = uintptr(q+1)<<40, uintptr(q+1)<<36
			}
			op := &ops.Op{Kind: ops.AllToAll, DType: dtype.BFloat16}
			var in, out uintptr
			for q := range world {
				op.InPieces = append(op.InPieces, ops.Piece{Addr: uintptr(r+1)<<32 + in, Count: split(r, q)})
				op.OutPieces = append(op.OutPieces, ops.Piece{Addr: uintptr(r+1)<<32 + 1<<31 + out, Count: split(q, r)})
				in, out = in+uintptr(split(r, q))*2, out+uintptr(split(q, r))*2
			}
			ps[r] = tm.a2avParams(op)
			p := ps[r]
			require.EqualValues(t, r, p.Rank)
			require.Equal(t, tm.stages, p.Stages)
			require.Equal(t, tm.pads, p.Pads)
			require.EqualValues(t, (stage/(world-1))&^15, p.Region, "world %d: a region for each other rank", world)
			require.LessOrEqual(t, 2*(world-1)*int(p.NB), cuda.MaxBlocks, "world %d: pair blocks must all be resident", world)
			require.LessOrEqual(t, p.SlotBytes*uint64(p.NB)*cuda.A2AVSlots, p.Region, "world %d", world)
			require.Zero(t, p.SlotBytes%16)
			require.Positive(t, p.SlotBytes)
			grid, _ := cuda.A2AVGrid(world, int(p.NB), p.Send[r])
			require.Greater(t, int(grid.X), 2*(world-1)*int(p.NB))
		}
		for q := range world {
			require.Equal(t, ps[0].NB, ps[q].NB)
			require.Equal(t, ps[0].SlotBytes, ps[q].SlotBytes)
			for r := range world {
				require.Equal(t, ps[q].Send[r], ps[r].Recv[q], "world %d: rank %d sends rank %d", world, q, r)
				require.EqualValues(t, split(q, r)*2, ps[q].Send[r])
			}
		}
	}
	// A smaller setting caps the pair blocks; the slot is at most what was asked.
	tm := &Team{rank: 0, world: 2, stage: 32 << 20, cfg: Config{a2avBlocks: 8, a2avSlot: 4096}}
	p := tm.a2avParams(&ops.Op{Kind: ops.AllToAll, DType: dtype.Float32, InPieces: make([]ops.Piece, 2), OutPieces: make([]ops.Piece, 2)})
	require.EqualValues(t, 8, p.NB)
	require.EqualValues(t, 4096, p.SlotBytes)
	require.Zero(t, p.Push, "pulling where the config says so")
	tm.cfg.a2avPush = true
	require.EqualValues(t, 1, tm.a2avParams(&ops.Op{Kind: ops.AllToAll, DType: dtype.Float32, InPieces: make([]ops.Piece, 2), OutPieces: make([]ops.Piece, 2)}).Push)
	require.True(t, ConfigFromEnv().a2avPush, "pushing by default")
	t.Setenv("GOSYM_GPU_A2AV_PUSH", "0")
	require.False(t, ConfigFromEnv().a2avPush)
	grid, _ := cuda.A2AVGrid(2, 8, 0)
	require.EqualValues(t, 17, grid.X, "16 pair blocks and one that checks the local splits")
	grid, _ = cuda.A2AVGrid(2, 8, 100<<20)
	require.EqualValues(t, 16+cuda.A2AVSelfBlocksMax, grid.X)
}

// gs_a2av's settings are announced at setup; a rank whose differ is named.
func TestGPUConfigSharedMismatch(t *testing.T) {
	a := Config{a2avBlocks: 16, a2avSlot: 65536}
	require.NoError(t, a.sharedMismatch(1, a.shared()))
	b := a
	b.a2avBlocks = 0
	require.EqualError(t, a.sharedMismatch(3, b.shared()),
		"rank 3 runs GOSYM_GPU_A2AV_BLOCKS=0, GOSYM_GPU_A2AV_SLOT_BYTES=65536 and GOSYM_GPU_A2A_PACED_MIN=0, this rank 16, 65536 and 0 (every rank must use the same; the blocks are capped by what each GPU holds resident, and where unset both are measured per world and GPU)")
	c := a
	c.a2aPacedMin = 64 << 20
	require.ErrorContains(t, a.sharedMismatch(1, c.shared()), "GOSYM_GPU_A2A_PACED_MIN=67108864, this rank 16, 65536 and 0")
	require.ErrorContains(t, a.sharedMismatch(2, nil), "rank 2 announced 0 bytes of settings")
}

// gs_a2av's blocks per pair are capped by what the GPU holds resident
// (every pair block of a launch waits on its peer's); none fitting is an
// error that says what to unset.
func TestA2AVResident(t *testing.T) {
	for _, c := range []struct{ want, world, resident, nb int }{
		{64, 2, 264, 64}, // H200: 132 SMs, two blocks each
		{64, 2, 80, 40},
		{64, 4, 80, 13},
		{8, 8, 264, 8},
		{64, 2, 2, 1},
	} {
		nb, err := a2avResident(c.want, c.world, c.resident)
		require.NoError(t, err, "%+v", c)
		require.Equal(t, c.nb, nb, "%+v", c)
	}
	_, err := a2avResident(64, 3, 3)
	require.EqualError(t, err, "gosym: the paced all_to_all (GOSYM_GPU_A2AV_BLOCKS) needs at least 4 blocks of 512 threads resident at once for 3 ranks; this GPU holds 3: unset GOSYM_GPU_A2AV_BLOCKS")
}

// reduce_scatter's threshold is the one measured at its world and GPU (2
// MiB of output at 4 ranks of sm_90: measured.go), directMin at worlds or
// GPUs not measured, and GOSYM_GPU_RS_DIRECT_MIN where set; never above
// directMin.
func TestReduceScatterDirectMinByWorld(t *testing.T) {
	cfg := Config{directMin: 8 << 20, rsDirectMin: knobOf(config.GPURSDirectMin)}
	for world, want := range map[int]int{2: 8 << 20, 3: 8 << 20, 4: 2 << 20, 8: 8 << 20} {
		require.Equal(t, want, rsDirectMin(cfg, world, 90), "world %d", world)
		require.Equal(t, 8<<20, rsDirectMin(cfg, world, 100), "world %d on sm_100", world)
		tm := &Team{cfg: cfg, world: world, g: &Device{arch: 90}}
		require.Equal(t, want, tm.directMin(&ops.Op{Kind: ops.ReduceScatter}), "world %d", world)
	}
	cfg.rsDirectMin = knob{name: config.GPURSDirectMin.Name, set: 512 << 10}
	require.Equal(t, 512<<10, rsDirectMin(cfg, 2, 90))
	require.Equal(t, 512<<10, rsDirectMin(cfg, 4, 90))
	cfg.directMin = 256 << 10
	require.Equal(t, 256<<10, rsDirectMin(cfg, 4, 90))
	require.Equal(t, 256<<10, rsDirectMin(Config{directMin: 256 << 10, rsDirectMin: knobOf(config.GPURSDirectMin)}, 4, 90))
}
