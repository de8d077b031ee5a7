package gobackend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// postCUDAAll posts one CUDA op per rank concurrently (each PostCUDA runs
// its op before it returns) and returns every rank's error.
func postCUDAAll(eps []*Endpoint, device func(r int) int, stream func(r int) uintptr, mk func(r int) *Op) []error {
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for r, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = ep.PostCUDA(mk(r), device(r), stream(r), false)
		}()
	}
	wg.Wait()
	return errs
}

// cudaDevices is the number of usable CUDA devices, 0 without CUDA.
func cudaDevices() int {
	d, err := cuda.Load()
	if err != nil {
		return 0
	}
	n, err := d.DeviceCount()
	if err != nil {
		return 0
	}
	return n
}

func TestPostCUDARefusesOtherOpsLocally(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 8)
	for _, op := range []*Op{
		// NCCL reduces no int16, and has no bitwise ops.
		{Kind: coll.ReduceScatter, DType: dtype.Int16, Count: 4, Out: addr(buf), InPieces: []Piece{{Addr: addr(buf), Count: 4}, {Addr: addr(buf[4:]), Count: 4}}},
		{Kind: coll.AllReduce, DType: dtype.Int16, Count: 4, In: addr(buf), Out: addr(buf)},
		{Kind: coll.AllReduce, DType: dtype.Int8, RedOp: dtype.BAnd, Count: 4, In: addr(buf), Out: addr(buf)},
		{Kind: coll.AllReduce, DType: dtype.Int32, RedOp: dtype.Avg, Count: 4, In: addr(buf), Out: addr(buf)},
		{Kind: coll.AllReduce, DType: dtype.Bool, RedOp: dtype.Avg, Count: 4, In: addr(buf), Out: addr(buf)},
	} {
		_, err := eps[0].PostCUDA(op, 0, 0, false)
		require.Error(t, err, "%s %s", op.Kind, op.DType)
		require.Equal(t, status.NotSupported, status.CodeOf(err), "%v", err)
	}
	// Nothing reached the peer: the group still runs host collectives.
	errs := postAll(t, eps, func(r int) *Op {
		return &Op{Kind: coll.AllReduce, DType: dtype.Float32, Count: 4, In: addr(buf), Out: addr(buf)}
	})
	require.Equal(t, []error{nil, nil}, errs)
}

// Without CUDA every rank's setup fails locally; they still agree, and all
// of them report NotSupported, for this op and every later CUDA op, while
// host collectives keep working. On a GPU machine the test is skipped.
func TestCUDASetupFailureIsAgreedAndSticky(t *testing.T) {
	if cudaDevices() > 0 {
		t.Skip("CUDA is available here; this test covers machines without it")
	}
	eps := group(t, 2, 10*time.Second)
	bufs := [][]float32{{1, 2, 3}, {10, 20, 30}}
	arOp := func(r int) *Op {
		return &Op{Kind: coll.AllReduce, DType: dtype.Float32, Count: 3, In: addr(bufs[r]), Out: addr(bufs[r])}
	}
	dev := func(int) int { return 0 }
	str := func(int) uintptr { return 0 }
	for try := 0; try < 2; try++ {
		for r, err := range postCUDAAll(eps, dev, str, arOp) {
			require.Error(t, err, "rank %d", r)
			require.Equal(t, status.NotSupported, status.CodeOf(err), "rank %d: %v", r, err)
			require.ErrorContains(t, err, "CUDA data plane is not available")
		}
	}
	for r, err := range postCUDAAll(eps, dev, str, func(int) *Op { return &Op{Kind: coll.Barrier} }) {
		require.Equal(t, status.NotSupported, status.CodeOf(err), "rank %d: %v", r, err)
	}
	require.Equal(t, []error{nil, nil}, postAll(t, eps, arOp))
	require.Equal(t, []float32{11, 22, 33}, bufs[0])
	require.EqualValues(t, 0, eps[0].StatsMap()["gpu_ops"])
	require.EqualValues(t, -1, eps[0].StatsMap()["gpu_device"])
}

// On a machine with CUDA: two ranks of one process (on two devices when
// there are two) all-reduce device buffers through the CUDA data plane.
func TestCUDAAllReduce(t *testing.T) {
	ndev := cudaDevices()
	if ndev == 0 {
		t.Skip("no CUDA device here")
	}
	d, err := cuda.Load()
	require.NoError(t, err)
	const world = 2
	eps := group(t, world, 30*time.Second)
	type rankBufs struct {
		ctx cuda.Context
		dev cuda.Device
		buf uintptr
		s   cuda.Stream
	}
	n := 4<<20 + 3
	rb := make([]rankBufs, world)
	for r := range rb {
		dev, err := d.Device(r % ndev)
		require.NoError(t, err)
		ctx, err := d.RetainPrimaryContext(dev)
		require.NoError(t, err)
		t.Cleanup(func() { d.ReleasePrimaryContext(dev) })
		buf, err := d.MemAlloc(ctx, uintptr(4*n))
		require.NoError(t, err)
		t.Cleanup(func() { d.MemFree(ctx, buf) })
		s, err := d.StreamCreate(ctx, cuda.StreamNonBlocking)
		require.NoError(t, err)
		t.Cleanup(func() { d.StreamDestroy(ctx, s) })
		rb[r] = rankBufs{ctx, dev, buf, s}
	}
	for _, count := range []int{1, 3, 1025, n} {
		for _, op := range []dtype.RedOp{dtype.Sum, dtype.Avg, dtype.Max} {
			t.Run(fmt.Sprintf("%s/%d", op, count), func(t *testing.T) {
				host := make([][]byte, world)
				for r := range host {
					host[r] = make([]byte, 4*count)
					for i := 0; i < count; i++ {
						binary.LittleEndian.PutUint32(host[r][4*i:], math.Float32bits(float32(i%97+r)))
					}
					require.NoError(t, d.MemcpyHtoD(rb[r].ctx, rb[r].buf, host[r]))
				}
				errs := postCUDAAll(eps, func(r int) int { return r % ndev }, func(r int) uintptr { return uintptr(rb[r].s) },
					func(r int) *Op {
						return &Op{Kind: coll.AllReduce, DType: dtype.Float32, RedOp: op, Count: count, In: rb[r].buf, Out: rb[r].buf}
					})
				require.Equal(t, []error{nil, nil}, errs)
				for r := range rb {
					require.NoError(t, d.StreamSynchronize(rb[r].ctx, rb[r].s))
					got := make([]byte, 4*count)
					require.NoError(t, d.MemcpyDtoH(rb[r].ctx, got, rb[r].buf))
					for i := 0; i < count; i++ {
						a, b := float32(i%97), float32(i%97+1)
						want := map[dtype.RedOp]float32{dtype.Sum: a + b, dtype.Avg: (a + b) / 2, dtype.Max: b}[op]
						g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:]))
						if g != want {
							require.Equal(t, want, g, "rank %d element %d", r, i)
						}
					}
				}
			})
		}
	}
	errs := postCUDAAll(eps, func(r int) int { return r % ndev }, func(r int) uintptr { return uintptr(rb[r].s) },
		func(int) *Op { return &Op{Kind: coll.Barrier} })
	require.Equal(t, []error{nil, nil}, errs)
	// A CUDA op on another device than the group's is refused.
	if ndev > 1 {
		_, err := eps[0].PostCUDA(&Op{Kind: coll.Barrier}, 1, 0, false)
		require.Equal(t, status.InvalidArg, status.CodeOf(err), "%v", err)
		require.False(t, errors.Is(err, cuda.ErrNoCUDA))
	}
}

// The LL and direct-copy tunables: LL_MAX is clamped to what the kernel's
// area layout allows (0 turns it off), DIRECT_CE_MIN takes 0 (copy engines
// always), and the defaults are the measured ones.
func TestGPUConfigLLAndDirectCopy(t *testing.T) {
	cfg := gpuConfigFromEnv()
	require.Equal(t, 256<<10, cfg.llMax)
	require.Equal(t, 32<<20, cfg.directCEMin)
	t.Setenv("GOSYM_GPU_LL_MAX", "1073741824")
	t.Setenv("GOSYM_GPU_DIRECT_CE_MIN", "0")
	cfg = gpuConfigFromEnv()
	require.Equal(t, cuda.LLMaxBytes, cfg.llMax)
	require.Equal(t, 0, cfg.directCEMin)
	t.Setenv("GOSYM_GPU_LL_MAX", "0")
	require.Equal(t, 0, gpuConfigFromEnv().llMax)
	tm := &gpuTeam{cfg: gpuConfig{llMax: 4096}, llArea: cuda.LLAreaBytes(2, 4096)}
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
	cfg := gpuConfigFromEnv()
	require.Equal(t, 8<<20, cfg.directMin)
	require.Equal(t, 4<<20, cfg.moveDirectMin)
	tm := &gpuTeam{cfg: gpuConfig{directMin: 8 << 20, moveDirectMin: 4 << 20, twoShotMin: 2 << 20, captureDirectMin: 1}}
	want := map[coll.Kind][2]int{ // eager, captured
		coll.AllReduce:     {2 << 20, 1},
		coll.ReduceScatter: {8 << 20, 1},
		coll.Broadcast:     {4 << 20, 4 << 20},
		coll.AllGather:     {4 << 20, 4 << 20},
		coll.AllToAll:      {8 << 20, 8 << 20},
		coll.Reduce:        {8 << 20, 8 << 20},
	}
	for kind, w := range want {
		for i, capturing := range []bool{false, true} {
			tm.capturing = capturing
			require.Equal(t, w[i], tm.directMin(&Op{Kind: kind}), "%v, capturing %v", kind, capturing)
		}
	}
	// all_to_all whose splits differ: from a2avDirectMin, captured or not
	require.Equal(t, 2<<20, cfg.a2avDirectMin)
	tm.cfg.a2avDirectMin = 2 << 20
	a2a := &Op{Kind: coll.AllToAll}
	for _, capturing := range []bool{false, true} {
		tm.capturing = capturing
		require.Equal(t, 2<<20, tm.allToAllDirectMin(a2a, true))
		require.Equal(t, 8<<20, tm.allToAllDirectMin(a2a, false), "equal splits: directMin")
	}
	tm.cfg.directMin = 1 << 20 // a lower directMin wins over every kind's own
	tm.capturing = false
	for kind := range want {
		require.LessOrEqual(t, tm.directMin(&Op{Kind: kind}), 1<<20, "%v", kind)
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
	pieces := func(r, which int) []coll.Piece {
		ps := make([]coll.Piece, 4)
		for q := range ps {
			ps[q] = coll.Piece{Addr: base(r, which) + uintptr(q)*400, Count: count}
		}
		return ps
	}
	for world := 2; world <= 4; world++ {
		root := world - 1
		ops := map[coll.Kind]func(r int) *Op{
			coll.Broadcast: func(r int) *Op { return &Op{Kind: coll.Broadcast, Root: root, In: base(r, 1), Out: base(r, 2)} },
			coll.AllGather: func(r int) *Op { return &Op{Kind: coll.AllGather, In: base(r, 1), OutPieces: pieces(r, 2)[:world]} },
			coll.Gather: func(r int) *Op {
				op := &Op{Kind: coll.Gather, Root: root, In: base(r, 1)}
				if r == root {
					op.OutPieces = pieces(r, 2)[:world]
				}
				return op
			},
			coll.Scatter: func(r int) *Op {
				op := &Op{Kind: coll.Scatter, Root: root, Out: base(r, 2)}
				if r == root {
					op.InPieces = pieces(r, 1)[:world]
				}
				return op
			},
			coll.AllToAll: func(r int) *Op {
				return &Op{Kind: coll.AllToAll, InPieces: pieces(r, 1)[:world], OutPieces: pieces(r, 2)[:world]}
			},
		}
		for kind, mk := range ops {
			ps := make([]cuda.LLMoveParams, world)
			for r := range world {
				tm := &gpuTeam{rank: r, world: world, cfg: gpuConfig{llMax: 4096}, llArea: cuda.LLAreaBytes(world, 4096)}
				op := mk(r)
				op.DType, op.Count = dtype.Float32, count
				if kind == coll.AllToAll {
					op.Count = 0 // its pieces carry the counts, as coll.Even leaves them
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
			case coll.Broadcast:
				require.Equal(t, base(root, 1), ps[root].Src[0])
				require.Equal(t, base(0, 2), ps[0].Dst[root])
			case coll.AllToAll:
				require.Equal(t, base(1, 1)+400*0, ps[1].Src[0]) // rank 1's piece for rank 0
				require.Equal(t, base(0, 2)+400*1, ps[0].Dst[1]) // lands in rank 0's piece from rank 1
			case coll.Scatter:
				require.Equal(t, base(root, 1)+400*0, ps[root].Src[0])
			}
		}
	}
	tm := &gpuTeam{rank: 0, world: 2, cfg: gpuConfig{llMax: 4096}, llArea: cuda.LLAreaBytes(2, 4096)}
	big := &Op{Kind: coll.Broadcast, DType: dtype.Float32, Count: 1025, In: 1, Out: 1}
	_, ok := tm.llMoveParams(big)
	require.False(t, ok, "past LL_MAX")
	uneven := &Op{Kind: coll.AllToAll, DType: dtype.Float32,
		InPieces: []coll.Piece{{Addr: 8, Count: 1}, {Addr: 16, Count: 2}}, OutPieces: []coll.Piece{{Addr: 32, Count: 1}, {Addr: 40, Count: 2}}}
	_, ok = tm.llMoveParams(uneven)
	require.False(t, ok, "uneven all_to_all")
	tm.llArea = 0
	_, ok = tm.llMoveParams(&Op{Kind: coll.Broadcast, DType: dtype.Float32, Count: 1, In: 1, Out: 1})
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
			tm := &gpuTeam{rank: r, world: world, stage: stage, cfg: gpuConfig{a2avBlocks: 32, a2avSlot: 64 << 10}}
			for q := range world {
				tm.stages[q], tm.pads[q] = uintptr(q+1)<<40, uintptr(q+1)<<36
			}
			op := &Op{Kind: coll.AllToAll, DType: dtype.BFloat16}
			var in, out uintptr
			for q := range world {
				op.InPieces = append(op.InPieces, coll.Piece{Addr: uintptr(r+1)<<32 + in, Count: split(r, q)})
				op.OutPieces = append(op.OutPieces, coll.Piece{Addr: uintptr(r+1)<<32 + 1<<31 + out, Count: split(q, r)})
				in, out = in+uintptr(split(r, q))*2, out+uintptr(split(q, r))*2
			}
			ps[r] = tm.a2avParams(op)
			p := ps[r]
			require.EqualValues(t, r, p.Rank)
			require.Equal(t, tm.stages, p.Stages)
			require.Equal(t, tm.pads, p.Pads)
			require.EqualValues(t, tm.region(), p.Region)
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
	tm := &gpuTeam{rank: 0, world: 2, stage: 32 << 20, cfg: gpuConfig{a2avBlocks: 8, a2avSlot: 4096}}
	p := tm.a2avParams(&Op{Kind: coll.AllToAll, DType: dtype.Float32, InPieces: make([]coll.Piece, 2), OutPieces: make([]coll.Piece, 2)})
	require.EqualValues(t, 8, p.NB)
	require.EqualValues(t, 4096, p.SlotBytes)
	grid, _ := cuda.A2AVGrid(2, 8, 0)
	require.EqualValues(t, 17, grid.X, "16 pair blocks and one that checks the local splits")
	grid, _ = cuda.A2AVGrid(2, 8, 100<<20)
	require.EqualValues(t, 16+cuda.A2AVSelfBlocksMax, grid.X)
}

// gs_a2av's settings are announced at setup; a rank whose differ is named.
func TestGPUConfigSharedMismatch(t *testing.T) {
	a := gpuConfig{a2avBlocks: 16, a2avSlot: 65536}
	require.NoError(t, a.sharedMismatch(1, a.shared()))
	b := a
	b.a2avBlocks = 0
	require.EqualError(t, a.sharedMismatch(3, b.shared()),
		"rank 3 runs GOSYM_GPU_A2AV_BLOCKS=0 and GOSYM_GPU_A2AV_SLOT_BYTES=65536, this rank 16 and 65536 (every rank must use the same; the blocks are capped by what each GPU holds resident)")
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
