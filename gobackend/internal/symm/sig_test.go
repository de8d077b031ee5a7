package symm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// TestSignComparesThePeersThatPublished: the first to sign compares with
// nobody; the second finds the difference and who had posted; an entry
// SigRing ops old is not taken for the current one; a rank that refused
// fails the peers' waits for it at once, naming it.
func TestSignComparesThePeersThatPublished(t *testing.T) {
	ts := pair(t, 2)
	peer, _, posted := ts[0].Sign(5, 0xaa)
	require.Equal(t, -1, peer)
	require.Empty(t, posted)
	peer, theirs, posted := ts[1].Sign(5, 0xbb)
	require.Equal(t, 0, peer)
	require.EqualValues(t, 0xaa, theirs)
	require.Equal(t, []int{0}, posted)
	peer, _, posted = ts[1].Sign(6, 0xcc) // rank 0 has not posted 6
	require.Equal(t, -1, peer)
	require.Empty(t, posted)
	_, ok := ts[1].SigOf(0, 5+SigRing) // the same ring entry, another op
	require.False(t, ok)
	peer, _, posted = ts[0].Sign(6, 0xcc) // equal: no difference, but rank 1 had posted
	require.Equal(t, -1, peer)
	require.Equal(t, []int{1}, posted)

	w := ts[0].ctrl[1].Word32(offStep)
	ts[1].Refuse(5)
	start := time.Now()
	err := ts[0].waitGE(1, w, 1, Who{Op: "all_reduce", Seq: 5}, time.Now().Add(time.Minute), false)
	require.Equal(t, status.Mismatch, status.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "rank 1 refused")
	require.Less(t, time.Since(start), 5*time.Second)
}
