package gpu

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

func TestGPUAlgoStats(t *testing.T) {
	var s algoStats
	op := &ops.Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 3}
	for _, a := range []algoKind{algoOneShot, algoSema, algoSema, algoNVLS, algoSema, algoLL, algoArPush, algoArPush} {
		s.Add(a, 0, op)
	}
	m := map[string]any{}
	s.stats(m)
	require.Equal(t, map[string]any{"gpu_algo_oneshot": int64(1), "gpu_algo_twoshot": int64(0),
		"gpu_algo_sema_unicast": int64(3), "gpu_algo_nvls": int64(1), "gpu_algo_ll": int64(1),
		"gpu_algo_arpush": int64(2)}, m)
}

func TestReduceScale(t *testing.T) {
	require.Equal(t, float64(4), reduceScale(&ops.Op{RedOp: dtype.Avg}, 4))
	require.Equal(t, float64(0.5), reduceScale(&ops.Op{RedOp: dtype.PremulSum, Scale: 0.5}, 4))
	require.Equal(t, float64(1), reduceScale(&ops.Op{RedOp: dtype.Max, Scale: 0.5}, 4))
}

// memPeers is Peers for ranks simulated in one process: the barrier is a
// fakeAgree, and an fd a rank announces reaches each peer as a dup (what
// the links' SCM_RIGHTS does across processes).
type memPeers struct {
	ag   *fakeAgree
	rank int
}

func (p memPeers) Barrier(meta []byte, _ symm.Who, _ time.Time) ([][]byte, error) {
	return p.ag.of(p.rank)(meta)
}

func (p memPeers) AgreeAll(ok bool, who symm.Who, deadline time.Time) ([]int, error) {
	all, err := p.Barrier([]byte{boolByte(ok)}, who, deadline)
	var failed []int
	for r, b := range all {
		if len(b) != 1 || b[0] != 1 {
			failed = append(failed, r)
		}
	}
	return failed, err
}

func (p memPeers) ExchangeFD(_ uint32, body []byte, fds []int, deadline time.Time) ([]comm.FDMsg, error) {
	meta := binary.LittleEndian.AppendUint64(nil, uint64(len(fds)))
	for _, fd := range fds {
		meta = binary.LittleEndian.AppendUint64(meta, uint64(fd))
	}
	all, err := p.Barrier(append(meta, body...), symm.Who{}, deadline)
	if err != nil {
		return nil, err
	}
	msgs := make([]comm.FDMsg, len(all))
	for r, b := range all {
		n := int(binary.LittleEndian.Uint64(b))
		msgs[r] = comm.FDMsg{OK: n > 0, Body: b[8+8*n:]}
		for i := 0; i < n && r != p.rank; i++ {
			d, err := unix.Dup(int(binary.LittleEndian.Uint64(b[8+8*i:])))
			if err != nil {
				return nil, err
			}
			msgs[r].FDs = append(msgs[r].FDs, d)
		}
	}
	_, err = p.Barrier(nil, symm.Who{}, deadline) // every dup is made before the senders close
	return msgs, err
}

func boolByte(ok bool) byte {
	if ok {
		return 1
	}
	return 0
}

// nvlsPeersAll runs f on every rank's nvlsPeers at once.
func nvlsPeersAll(world int, f func(r int, p *nvlsPeers)) {
	ag := newFakeAgree(world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grp := Group{Name: "test", Rank: r, World: world, Timeout: 5 * time.Second, Peers: memPeers{ag, r}}
			f(r, &nvlsPeers{grp: grp, who: symm.Who{Op: "test", Seq: 1}, deadline: time.Now().Add(5 * time.Second)})
		}()
	}
	wg.Wait()
}

// The multicast setup's collectives over the group's Peers:
// the root's fd reaches every other rank (the same open file), a root
// without one shares nothing, and every rank learns who failed a step.
func TestNVLSPeers(t *testing.T) {
	var pipe [2]int
	require.NoError(t, unix.Pipe2(pipe[:], unix.O_CLOEXEC))
	defer unix.Close(pipe[0])
	got := make([]int, 3)
	errs := make([]error, 3)
	nvlsPeersAll(3, func(r int, p *nvlsPeers) {
		fd := -1
		if r == 1 {
			fd = pipe[1]
		}
		got[r], errs[r] = p.ShareFD(1, fd)
	})
	unix.Close(pipe[1])
	require.Equal(t, []error{nil, nil, nil}, errs)
	require.Equal(t, -1, got[1])
	for _, r := range []int{0, 2} {
		require.GreaterOrEqual(t, got[r], 0)
		_, err := unix.Write(got[r], []byte{byte('a' + r)})
		require.NoError(t, err)
		unix.Close(got[r])
	}
	buf := make([]byte, 4)
	n, err := unix.Read(pipe[0], buf)
	require.NoError(t, err)
	require.ElementsMatch(t, []byte("ac"), buf[:n])

	nvlsPeersAll(3, func(r int, p *nvlsPeers) { got[r], errs[r] = p.ShareFD(0, -1) })
	require.Equal(t, []int{-1, -1, -1}, got)
	require.Equal(t, []error{nil, nil, nil}, errs)

	failed := make([][]int, 3)
	for _, bad := range [][]int{nil, {2}, {0, 2}} {
		nvlsPeersAll(3, func(r int, p *nvlsPeers) {
			ok := true
			for _, b := range bad {
				ok = ok && b != r
			}
			failed[r], errs[r] = p.Agree(fmt.Sprintf("step %v", bad), ok)
		})
		require.Equal(t, []error{nil, nil, nil}, errs)
		require.Equal(t, [][]int{bad, bad, bad}, failed)
	}
}

// The simulated ranks compare no signatures (symm/sig.go is tested over
// real teams in gobackend).
func (memPeers) Sign(uint64, uint64) (int, uint64, []int) { return -1, 0, nil }
func (memPeers) SigOf(int, uint64) (uint64, bool)         { return 0, false }
func (memPeers) Refuse(uint64)                            {}
