package symm

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/shm"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// pair is two ranks' teams over the same control regions, in one process,
// for driving the slot protocol's steps one at a time.
func pair(t *testing.T, slots int) [2]*Team {
	l := NewLayout(2, 4096, 4096, slots)
	ctrl := make([]*shm.Region, 2)
	for r := range ctrl {
		reg, err := shm.NewRegion(fmt.Sprintf("pair%d", r), l.CtrlBytes)
		require.NoError(t, err)
		t.Cleanup(func() { reg.Close() })
		ctrl[r] = reg
	}
	var ts [2]*Team
	for r := range ts {
		ts[r] = &Team{L: l, Rank: r, Mesh: &comm.Mesh{Rank: r}, ctrl: ctrl}
	}
	return ts
}

// TestPublishWaitsForPeersToCopyTheSlot: a rank makes N publications
// nobody has copied, and not one more: publication N+1 would overwrite
// publication 1, so it waits (here: times out naming the rank) until every
// peer has copied publication 1, and then goes ahead. A read of publication
// 1 after that fails on its stamp instead of returning another op's bytes.
func TestPublishWaitsForPeersToCopyTheSlot(t *testing.T) {
	who := Who{Op: "test", Seq: 7}
	meta := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 8) }
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("slots%d", n), func(t *testing.T) {
			ts := pair(t, n)
			fast, slow := ts[0], ts[1]
			for i := 1; i <= n; i++ {
				s, err := fast.publish(meta(i), who, time.Now())
				require.NoError(t, err)
				require.Equal(t, uint32(i), s)
			}
			_, err := fast.publish(meta(n+1), who, time.Now())
			require.Equal(t, status.Timeout, status.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), fmt.Sprintf("test (seq 7): Timed out waiting for ranks [1] to copy out sync slot %d (publication 1)", 1%n))
			require.Equal(t, int64(1), fast.SlotStalls())
			require.Equal(t, uint32(n), fast.Published(), "the refused publication was not made")

			_, err = slow.publish(meta(100), who, time.Now())
			require.NoError(t, err)
			got, err := slow.collect(1, 8, who)
			require.NoError(t, err)
			require.Equal(t, [][]byte{meta(1), meta(100)}, got, "publication 1 was intact")

			s, err := fast.publish(meta(n+1), who, time.Now())
			require.NoError(t, err, "the peer copied publication 1: its slot is free")
			require.Equal(t, uint32(n+1), s)
			_, err = slow.collect(1, 8, who)
			require.Equal(t, status.Internal, status.CodeOf(err))
			require.Contains(t, err.Error(), fmt.Sprintf("rank 0's sync slot %d holds publication %d, not 1", 1%n, n+1))
		})
	}
}

// TestLayoutAgreement: a peer's layout that differs names the setting.
func TestLayoutAgreement(t *testing.T) {
	a, b := NewLayout(3, 1<<20, 1<<16, 4), NewLayout(3, 1<<20, 1<<16, 8)
	require.NoError(t, a.agree(1, a.encode()))
	err := a.agree(2, b.encode())
	require.Equal(t, status.Mismatch, status.CodeOf(err))
	require.Contains(t, err.Error(), "rank 2 uses GOSYM_SLOTS=8, this rank 4")
	require.Equal(t, status.Peer, status.CodeOf(a.agree(1, a.encode()[:8])))
}

// TestLayoutSettings: the settings sent with the regions reach
// CheckSettings, whose error wins; without it, extra bytes are refused.
func TestLayoutSettings(t *testing.T) {
	a, b := NewLayout(2, 1<<20, 1<<16, 4), NewLayout(2, 1<<20, 1<<16, 4)
	b.Settings = []byte("X=2")
	var got []byte
	a.CheckSettings = func(r int, theirs []byte) error {
		got = theirs
		if string(theirs) != "X=1" {
			return status.Errorf(status.Mismatch, "rank %d has %s", r, theirs)
		}
		return nil
	}
	require.EqualError(t, a.agree(1, b.encode()), "rank 1 has X=2")
	require.Equal(t, "X=2", string(got))
	b.Settings = []byte("X=1")
	require.NoError(t, a.agree(1, b.encode()))
	a.CheckSettings = nil
	require.Equal(t, status.Peer, status.CodeOf(a.agree(1, b.encode())))
}

// The bell: a ring wakes the owner's WaitBell at once (well before its
// timeout), says who rang and how often, and lands on its own words (not
// the step or waiters words the hot path uses); Abort wakes it too.
func TestBellWakesAndCountsRings(t *testing.T) {
	ts := pair(t, 2)
	owner, peer := ts[0], ts[1]
	rang := make([]uint32, 2)
	owner.Rings(rang)
	require.Equal(t, []uint32{0, 0}, rang)
	woke := make(chan time.Duration, 1)
	seen := owner.Bell()
	go func() {
		start := time.Now()
		for owner.Bell() == seen {
			owner.WaitBell(seen, 10*time.Second)
		}
		woke <- time.Since(start)
	}()
	time.Sleep(20 * time.Millisecond)
	peer.Ring(0)
	require.Less(t, <-woke, 5*time.Second)
	peer.Ring(0)
	owner.Rings(rang)
	require.Equal(t, []uint32{0, 2}, rang)
	require.Zero(t, *owner.ctrl[0].Word32(offWaiters), "ringing registers no waiter")
	require.Zero(t, *owner.ctrl[0].Word32(offStep))

	seen = owner.Bell()
	go func() {
		start := time.Now()
		for !owner.Aborted() {
			owner.WaitBell(seen, 10*time.Second)
		}
		woke <- time.Since(start)
	}()
	time.Sleep(20 * time.Millisecond)
	owner.Abort()
	require.Less(t, <-woke, 5*time.Second)
	require.NotEqual(t, seen, owner.Bell())
}
