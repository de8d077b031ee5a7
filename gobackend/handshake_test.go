package gobackend

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/ops"
)

// The handshake frames travel over the host p2p path under the reserved
// tag, in both directions at once, and never disturb the pair's own
// messages: one sent before the handshake and received after it, one
// received while it runs.
func TestP2PMailboxExchange(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	early := []float32{1, 2, 3}
	s, err := eps[0].Post(&Op{Kind: ops.Send, Peer: 1, Count: 3, In: addr(early), Tag: 5})
	require.NoError(t, err)
	during, gotDuring := []float32{7, 8}, poisoned(2)
	r, err := eps[0].Post(&Op{Kind: ops.Recv, Peer: 1, Count: 2, Out: addr(gotDuring), Tag: 6})
	require.NoError(t, err)
	msgs := [2][][]byte{{[]byte("hello from 0"), {}}, {make([]byte, p2pFrameBytes-4), {1}}}
	for i := range msgs[1][0] {
		msgs[1][0][i] = byte(rand.Uint32())
	}
	var got [2][][]byte
	var errs [2]error
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := &p2pMailbox{e: eps[rank], peer: 1 - rank, deadline: time.Now().Add(5 * time.Second)}
			for _, msg := range msgs[rank] {
				g, err := m.Exchange("step", msg)
				if err != nil {
					errs[rank] = err
					return
				}
				got[rank] = append(got[rank], g)
			}
		}()
	}
	s1, err := eps[1].Post(&Op{Kind: ops.Send, Peer: 0, Count: 2, In: addr(during), Tag: 6})
	require.NoError(t, err)
	wg.Wait()
	require.Equal(t, [2]error{}, errs)
	require.Equal(t, msgs[1], got[0])
	require.Equal(t, msgs[0], got[1])
	_, err = (&p2pMailbox{e: eps[0], peer: 1}).Exchange("big", make([]byte, p2pFrameBytes))
	require.ErrorContains(t, err, "does not fit")

	gotEarly := poisoned(3)
	r1, err := eps[1].Post(&Op{Kind: ops.Recv, Peer: 0, Count: 3, Out: addr(gotEarly), Tag: 5})
	require.NoError(t, err)
	waitAll(t, s, r, s1, r1)
	require.Equal(t, early, gotEarly)
	require.Equal(t, during, gotDuring)
}
