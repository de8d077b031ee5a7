package gobackend

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
)

// An all_to_all with split sizes whose inputs every rank registered
// (mem_map), where rank 0 sends nothing: it has no input to find
// registered, its peers have. Every rank must take the same path: the
// host agreement by default, the paced kernel with GOSYM_GPU_A2AV_BLOCKS
// set, but the agreement under graph capture. Before the paced choice was
// the setting's alone, rank 0 took the paced kernel there while ranks 1 and
// 2 waited to agree, until the group's timeout.

func TestCUDAAllToAllRegisteredSilentSender(t *testing.T) {
	silentSender(t, "", "", false, 0)
}

func TestCUDAAllToAllRegisteredSilentSenderPaced(t *testing.T) {
	silentSender(t, "4", "", false, 1)
}

// The same on the paced kernel pulling (GOSYM_GPU_A2AV_PUSH=0; it pushes by default).
func TestCUDAAllToAllRegisteredSilentSenderPacedPull(t *testing.T) {
	silentSender(t, "4", "0", false, 1)
}

// Under graph capture the ranks agree on the splits (once, at capture)
// though the paced kernel is set.
func TestCUDAAllToAllRegisteredSilentSenderPacedCaptured(t *testing.T) {
	silentSender(t, "4", "", true, 0)
}

// silentSender runs allToAllRegisteredSilentSender with GOSYM_GPU_A2AV_BLOCKS
// and GOSYM_GPU_A2AV_PUSH as given ("": unset), and checks how many of rank
// 0's all_to_alls ran paced (gs_a2av), and that it agreed on the host where
// none did.
func silentSender(t *testing.T, blocks, push string, capturing bool, paced int) {
	for k, v := range map[string]string{"GOSYM_GPU_A2AV_BLOCKS": blocks, "GOSYM_GPU_A2AV_PUSH": push} {
		if v != "" {
			t.Setenv(k, v)
		}
	}
	if inP2PFakeCUDA(t) {
		return
	}
	st := allToAllRegisteredSilentSender(t, capturing)
	require.EqualValues(t, paced, st["gpu_paced_all_to_all"], "%v", st)
	if paced == 0 {
		require.Positive(t, st["gpu_agree_rounds"], "%v", st)
	}
}

// allToAllRegisteredSilentSender runs the op (its callers say whether under
// capture), checks every rank's output, and gives rank 0's counters.
func allToAllRegisteredSilentSender(t *testing.T, capturing bool) map[string]any {
	const world, poison = 3, float32(-7)
	devices := []int{0, 1, 2}
	ranks := p2pGroup(t, devices, 5*time.Second) // a regression fails in seconds
	eps := make([]*Endpoint, world)
	for r, rk := range ranks {
		eps[r] = rk.ep
	}
	send := func(i, j int) int { // elements rank i sends rank j
		if i == 0 {
			return 0
		}
		return 10 + j
	}
	val := func(i, j, e int) float32 { return float32(i*10000+j*100+e) + 0.5 }
	alloc := func(r, n int, fill func(k int) float32) uintptr {
		g := ranks[r].g
		b := make([]byte, 4*n)
		for k := range n {
			binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(fill(k)))
		}
		p, err := g.Driver().MemAlloc(g.Context(), uintptr(len(b)))
		require.NoError(t, err)
		t.Cleanup(func() { g.Driver().MemFree(g.Context(), p) })
		require.NoError(t, g.Driver().MemcpyHtoD(g.Context(), p, b))
		return p
	}
	const room = 64 // elements per piece slot: every piece fits, with room for a guard
	ins, outs := make([]uintptr, world), make([]uintptr, world)
	for r := range world {
		ins[r] = alloc(r, room*world, func(k int) float32 { return val(r, k/room, k%room) })
		outs[r] = alloc(r, room*world, func(int) float32 { return poison })
		m, err := MemMap(ins[r], 4*room*world, devices[r])
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, MemUnmap(m)) })
	}
	errs := postCUDAAllCapturing(eps, capturing, func(r int) int { return devices[r] },
		func(r int) uintptr { return uintptr(ranks[r].stream(t, r, false)) },
		func(r int) *Op {
			op := &Op{Kind: ops.AllToAll, DType: dtype.Float32}
			for j := range world {
				op.InPieces = append(op.InPieces, Piece{Addr: ins[r] + uintptr(4*room*j), Count: send(r, j)})
				op.OutPieces = append(op.OutPieces, Piece{Addr: outs[r] + uintptr(4*room*j), Count: send(j, r)})
			}
			return op
		})
	require.Equal(t, make([]error, world), errs)
	for r, rk := range ranks {
		rk.sync(t)
		g := rk.g
		b := make([]byte, 4*room*world)
		require.NoError(t, g.Driver().MemcpyDtoH(g.Context(), b, outs[r]))
		got := func(k int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:])) }
		for j := range world {
			n := send(j, r)
			for e := range n {
				require.Equal(t, val(j, r, e), got(room*j+e), "rank %d from %d element %d", r, j, e)
			}
			require.Equal(t, poison, got(room*j+n), "rank %d from %d: past the piece", r, j)
		}
	}
	return eps[0].StatsMap()
}
