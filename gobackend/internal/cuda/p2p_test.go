package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// openPair opens a channel between ranks 0 and 1 of a lockstep group (rank
// 0 runs first between exchanges, so the n-th call of a driver function is
// always the same rank's); slot gives each rank's slot size.
func openPair(d *Driver, slot [2]uintptr) (chans [2]*P2PChannel, errs [2]error) {
	newLockstep(2).run(func(p *lockstepPeer) {
		r := p.rank
		chans[r], errs[r] = OpenP2P(d, P2PSpec{Peer: 1 - r, SlotBytes: slot[r]}, p)
	})
	return chans, errs
}

// checkP2PReleases walks the fake's log: every allocation is freed and
// every opened handle closed exactly once, every handle exported is one
// of the allocations, and nothing is released that was not acquired.
func checkP2PReleases(t *testing.T, log []fakeCall) {
	t.Helper()
	allocs, opens := map[uint64]int{}, map[uint64]int{}
	for i, c := range log {
		switch c.Name {
		case "cuMemAlloc", "cuIpcOpenMemHandle":
			if c.Arg == 0 {
				continue // the call that was made to fail acquired nothing
			}
			m := allocs
			if c.Name == "cuIpcOpenMemHandle" {
				m = opens
			}
			require.NotContains(t, m, c.Arg, "log entry %d: %s handed out %#x twice", i, c.Name, c.Arg)
			m[c.Arg] = 0
		case "cuIpcGetMemHandle":
			require.Contains(t, allocs, c.Arg, "log entry %d exports %#x, not an allocation", i, c.Arg)
		case "cuMemFree", "cuIpcCloseMemHandle":
			m := allocs
			if c.Name == "cuIpcCloseMemHandle" {
				m = opens
			}
			n, ok := m[c.Arg]
			require.True(t, ok, "log entry %d: %s of %#x, never acquired", i, c.Name, c.Arg)
			require.Zero(t, n, "log entry %d: %s of %#x twice", i, c.Name, c.Arg)
			m[c.Arg] = 1
		}
	}
	for _, m := range []map[uint64]int{allocs, opens} {
		for a, n := range m {
			require.Equal(t, 1, n, "%#x never released", a)
		}
	}
}

func TestP2POpenAndClose(t *testing.T) {
	withFake(t, func(d *Driver) {
		chans, errs := openPair(d, [2]uintptr{1 << 10, 1 << 10})
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		for r, c := range chans {
			require.NotZero(t, c.Ctrl, "rank %d", r)
			require.NotZero(t, c.Data, "rank %d", r)
			require.NotZero(t, c.PeerCtrl, "rank %d", r)
			require.NotZero(t, c.PeerData, "rank %d", r)
			require.NotEqual(t, c.Ctrl, c.Data, "rank %d: control and data are separate allocations", r)
		}
		require.EqualValues(t, 4, fakeCalls("cuMemAlloc"))
		require.EqualValues(t, 4, fakeCalls("cuIpcGetMemHandle"))
		require.EqualValues(t, 4, fakeCalls("cuIpcOpenMemHandle"))
		require.EqualValues(t, 2, fakeCalls("cuMemsetD32Async"), "each side zeroes its control")
		// Teardown, either side first: leave (tell the peer, drop the
		// mappings), settle, free. A second Close does nothing.
		for _, r := range []int{1, 0} {
			require.NoError(t, chans[r].Leave(true))
			require.Zero(t, chans[r].PeerCtrl)
			require.Zero(t, chans[r].PeerData)
			_, drained, err := chans[r].Settled()
			require.NoError(t, err)
			require.True(t, drained)
			require.NoError(t, chans[r].Close())
		}
		require.NoError(t, chans[0].Close())
		require.EqualValues(t, 4, fakeCalls("cuMemsetD32Async"), "two zeroings, two GONE words")
		require.EqualValues(t, 4, fakeCalls("cuMemFree"))
		require.EqualValues(t, 4, fakeCalls("cuIpcCloseMemHandle"))
		checkP2PReleases(t, fakeLog())
		err := chans[0].Send(nil, 0, 0, 0, 0, 0)
		require.ErrorContains(t, err, "closed")
	})
}

// What a side's control says about its peer at teardown: whether it left
// (GONE) and whether it acknowledged every chunk sent, in every block.
func TestP2PSettled(t *testing.T) {
	ctrl := make([]byte, P2PCtrlBytes)
	set := func(word int, v uint32) { binary.LittleEndian.PutUint32(ctrl[4*word:], v) }
	check := func(gone, drained bool, why string) {
		g, d := settled(ctrl)
		require.Equal(t, [2]bool{gone, drained}, [2]bool{g, d}, why)
	}
	check(false, true, "nothing sent")
	set(P2PSentWord+5*P2PLineWords, 9)
	set(P2PAckWord+5*P2PLineWords, 8)
	check(false, false, "block 5 has a chunk unconsumed")
	set(P2PAckWord+5*P2PLineWords, 9)
	set(P2PSentWord, 1)
	check(false, false, "block 0 has a chunk unconsumed")
	set(P2PGoneWord, 1)
	check(true, false, "the peer left without consuming it")
	set(P2PAckWord, 1)
	check(true, true, "the peer consumed everything and left")
}

// A failure at any step on either side fails both sides (NotSupported,
// naming the side that failed and the step) and releases everything.
func TestP2PFailureAtEachStep(t *testing.T) {
	for _, c := range []struct {
		fn   string
		n    int64 // which call fails: rank 0 runs first between exchanges
		rank int   // whose call that is
		step string
	}{
		{"cuMemAlloc", 1, 0, "allocation"},
		{"cuMemAlloc", 2, 0, "allocation"},
		{"cuMemAlloc", 4, 1, "allocation"},
		{"cuStreamCreate", 2, 1, "allocation"},
		{"cuMemsetD32Async", 1, 0, "allocation"},
		{"cuStreamSynchronize", 2, 1, "allocation"},
		{"cuIpcGetMemHandle", 2, 0, "export"},
		{"cuIpcGetMemHandle", 3, 1, "export"},
		{"cuIpcOpenMemHandle", 1, 0, "open"},
		{"cuIpcOpenMemHandle", 4, 1, "open"},
	} {
		t.Run(fmt.Sprintf("%s#%d", c.fn, c.n), func(t *testing.T) {
			withFake(t, func(d *Driver) {
				fakeFailAt(c.fn, c.n)
				chans, errs := openPair(d, [2]uintptr{4096, 4096})
				for r, err := range errs {
					require.ErrorIs(t, err, ErrNotSupported, "rank %d", r)
					require.Nil(t, chans[r])
				}
				require.ErrorContains(t, errs[c.rank], "this rank failed at "+c.step)
				require.ErrorContains(t, errs[c.rank], "CUDA_ERROR_UNKNOWN")
				other := errs[1-c.rank].Error()
				require.Contains(t, other, fmt.Sprintf("rank %d", c.rank), "the other side names the rank that failed")
				checkP2PReleases(t, fakeLog())
			})
		})
	}
}

// Both sides must use the same slot size; a bad one fails locally.
func TestP2PSlotSizes(t *testing.T) {
	withFake(t, func(d *Driver) {
		_, errs := openPair(d, [2]uintptr{4096, 8192})
		for r, err := range errs {
			require.ErrorIs(t, err, ErrNotSupported)
			require.ErrorContains(t, err, "GOSYM_GPU_P2P_SLOT_BYTES", "rank %d", r)
		}
		checkP2PReleases(t, fakeLog())
	})
	withFake(t, func(d *Driver) {
		_, errs := openPair(d, [2]uintptr{24, 24})
		require.ErrorContains(t, errs[0], "multiple of 16")
		require.Zero(t, fakeCalls("cuMemAlloc"))
	})
}

// scripted is one side's peer that answers from a script.
type scripted struct {
	replies [][]byte
	fail    map[string]error
	steps   []string
}

func (s *scripted) Exchange(step string, msg []byte) ([]byte, error) {
	s.steps = append(s.steps, step)
	if err := s.fail[step]; err != nil {
		return nil, err
	}
	r := s.replies[0]
	s.replies = s.replies[1:]
	return r, nil
}

// goodHello is the hello of a peer with 4096-byte slots.
func goodHello() []byte {
	c := &P2PChannel{SlotBytes: 4096}
	b := make([]byte, p2pHelloBytes)
	le := binary.LittleEndian
	le.PutUint32(b[0:], p2pHelloMagic)
	le.PutUint32(b[4:], p2pHelloVersion)
	le.PutUint32(b[8:], 1)
	le.PutUint32(b[12:], P2PBlocks)
	le.PutUint32(b[16:], P2PSlots)
	le.PutUint64(b[24:], P2PCtrlBytes)
	le.PutUint64(b[32:], uint64(c.SlotBytes))
	le.PutUint64(b[40:], uint64(P2PDataBytes(c.SlotBytes)))
	return b
}

// A hello that does not fit is refused (and the refusal confirmed to the
// peer); a link failure at either exchange is returned as it is. Either
// way everything is released.
func TestP2PHelloChecks(t *testing.T) {
	edit := func(off int, v uint32) []byte {
		b := goodHello()
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	for _, c := range []struct {
		name  string
		hello []byte
		want  string
	}{
		{"short", goodHello()[:20], "malformed"},
		{"magic", edit(0, 7), "malformed"},
		{"version", edit(4, 9), "channel version 9"},
		{"not ok", edit(8, 0), "could not allocate or export"},
		{"blocks", edit(12, P2PBlocks+1), "lays its channel out differently"},
		{"slot", edit(32, 8192), "uses 8192-byte slots, this rank 4096"},
	} {
		t.Run(c.name, func(t *testing.T) {
			withFake(t, func(d *Driver) {
				p := &scripted{replies: [][]byte{c.hello, {1}}}
				ch, err := OpenP2P(d, P2PSpec{Peer: 3, SlotBytes: 4096}, p)
				require.Nil(t, ch)
				require.ErrorIs(t, err, ErrNotSupported)
				require.ErrorContains(t, err, "p2p channel with rank 3")
				require.ErrorContains(t, err, c.want)
				require.Equal(t, []string{"handles", "confirm"}, p.steps, "the refusal reaches the peer")
				require.Zero(t, fakeCalls("cuIpcOpenMemHandle"))
				checkP2PReleases(t, fakeLog())
			})
		})
	}
	link := errors.New("link broke")
	for _, step := range []string{"handles", "confirm"} {
		t.Run("link at "+step, func(t *testing.T) {
			withFake(t, func(d *Driver) {
				p := &scripted{replies: [][]byte{goodHello(), {1}}, fail: map[string]error{step: link}}
				ch, err := OpenP2P(d, P2PSpec{Peer: 1, SlotBytes: 4096}, p)
				require.Nil(t, ch)
				require.ErrorIs(t, err, link)
				require.NotErrorIs(t, err, ErrNotSupported)
				checkP2PReleases(t, fakeLog())
			})
		})
	}
	t.Run("peer could not open", func(t *testing.T) {
		withFake(t, func(d *Driver) {
			ch, err := OpenP2P(d, P2PSpec{Peer: 1, SlotBytes: 4096}, &scripted{replies: [][]byte{goodHello(), {0}}})
			require.Nil(t, ch)
			require.ErrorContains(t, err, "rank 1 could not open its end")
			checkP2PReleases(t, fakeLog())
		})
	})
}
