package gobackend

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// Receives from any source take one message of their tag from each sender
// (stashed before the receive was posted, or arriving after), report the
// sender in the work and at In, and leave a receive naming the sender its
// own message.
func TestRecvAnySource(t *testing.T) {
	for _, world := range []int{2, 3, 4} {
		eps := group(t, world, 10*time.Second)
		const n = 1<<17 + 5 // several mailbox chunks
		msgs := make([][]float32, world)
		for r := 1; r < world; r++ {
			msgs[r] = make([]float32, n)
			for i := range msgs[r] {
				msgs[r][i] = rand.Float32()
			}
		}
		// A named receive from rank 1 (tag 4) is posted first, and rank 1's
		// first message of tag 4 is its own, though receives from any source
		// of tag 4 wait too.
		named, one := poisoned(3), []float32{9, 8, 7}
		rn, err := eps[0].Post(&Op{Kind: ops.Recv, Peer: 1, Count: 3, Out: addr(named), Tag: 4})
		require.NoError(t, err)
		var sends []*Work
		for r := 1; r < world; r++ {
			if r%2 == 0 { // these arrive before the receive is posted: stashed
				s, err := eps[r].Post(&Op{Kind: ops.Send, Peer: 0, Count: n, In: addr(msgs[r]), Tag: 4})
				require.NoError(t, err)
				sends = append(sends, s)
			}
		}
		got := make([][]float32, world)
		srcs := make([][]int32, world)
		var recvs []*Work
		for i := 1; i < world; i++ {
			got[i], srcs[i] = poisoned(n), []int32{-1}
			w, err := eps[0].Post(&Op{Kind: ops.Recv, Peer: ops.AnySource, Count: n, Out: addr(got[i]), Tag: 4,
				In: addrInt32(srcs[i])})
			require.NoError(t, err)
			recvs = append(recvs, w)
		}
		s, err := eps[1].Post(&Op{Kind: ops.Send, Peer: 0, Count: 3, In: addr(one), Tag: 4})
		require.NoError(t, err)
		sends = append(sends, s)
		for r := 1; r < world; r++ {
			if r%2 == 1 {
				s, err := eps[r].Post(&Op{Kind: ops.Send, Peer: 0, Count: n, In: addr(msgs[r]), Tag: 4})
				require.NoError(t, err)
				sends = append(sends, s)
			}
		}
		waitAll(t, append(append(sends, rn), recvs...)...)
		require.Equal(t, one, named)
		var from []int
		for i, w := range recvs {
			src := int(srcs[i+1][0])
			require.Equal(t, src, w.op.Peer, "the work and In agree on the sender")
			require.Equal(t, msgs[src], got[i+1], "receive %d holds rank %d's message", i, src)
			from = append(from, src)
		}
		slices.Sort(from)
		want := []int{}
		for r := 1; r < world; r++ {
			want = append(want, r)
		}
		require.Equal(t, want, from)
	}
}

// A receive from any source that nobody serves fails at the group's timeout
// with a timeout error naming every peer, and breaks the group as any
// receive that timed out.
func TestRecvAnySourceTimesOut(t *testing.T) {
	eps := group(t, 3, 500*time.Millisecond)
	buf := poisoned(4)
	start := time.Now()
	w, err := eps[0].Post(&Op{Kind: ops.Recv, Peer: ops.AnySource, Count: 4, Out: addr(buf), Tag: 1})
	require.NoError(t, err)
	err = w.Wait(-1)
	require.Equal(t, status.Timeout, status.CodeOf(err))
	require.ErrorContains(t, err, "recv from any source (seq 1, tag 1): Timed out after 500ms waiting for ranks [1 2]")
	require.Less(t, time.Since(start), 3*time.Second)
	require.Equal(t, poisoned(4), buf)
}

// Destroying the group fails a waiting receive from any source.
func TestRecvAnySourceFailsOnDestroy(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	buf := poisoned(4)
	w, err := eps[0].Post(&Op{Kind: ops.Recv, Peer: ops.AnySource, Count: 4, Out: addr(buf)})
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, eps[0].Destroy())
	require.Equal(t, status.Closed, status.CodeOf(w.Wait(time.Second)))
}

func addrInt32(b []int32) uintptr {
	p := uintptr(unsafe.Pointer(&b[0]))
	pinned.Store(p, b)
	return p
}
