package gobackend

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// A case builds every rank's op over fresh random inputs and says what
// every rank's outputs must hold. Outputs start poisoned so that unwritten
// elements show.
type opCase struct {
	kind ops.Kind
	name string // "" for kind's name
	// build returns rank r's op and the buffers it writes, with the
	// expected contents of those buffers.
	build func(world, r, n int, in [][]float32) (op *Op, out [][]float32, want [][]float32)
}

const poison = float32(-7.5e33)

func poisoned(n int) []float32 {
	b := make([]float32, n)
	for i := range b {
		b[i] = poison
	}
	return b
}

func sumAt(in [][]float32, off, n int) []float32 {
	s := make([]float32, n)
	for _, b := range in {
		for i := range s {
			s[i] += b[off+i]
		}
	}
	return s
}

// gatherInto gives op one poisoned output piece per rank, expected to
// receive that rank's first n inputs.
func gatherInto(op *Op, w, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
	var outs, wants [][]float32
	for s := 0; s < w; s++ {
		o := poisoned(n)
		op.OutPieces = append(op.OutPieces, Piece{Addr: addr(o), Count: n})
		outs, wants = append(outs, o), append(wants, in[s][:n])
	}
	return op, outs, wants
}

var opCases = []opCase{
	{ops.AllReduce, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		out := poisoned(n)
		return &Op{Kind: ops.AllReduce, Count: n, In: addr(in[r]), Out: addr(out)}, [][]float32{out}, [][]float32{sumAt(in, 0, n)}
	}},
	{ops.Reduce, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		root := w - 1
		if r != root {
			return &Op{Kind: ops.Reduce, Root: root, Count: n, In: addr(in[r])}, nil, nil
		}
		out := poisoned(n)
		return &Op{Kind: ops.Reduce, Root: root, Count: n, In: addr(in[r]), Out: addr(out)}, [][]float32{out}, [][]float32{sumAt(in, 0, n)}
	}},
	{ops.Broadcast, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		out := poisoned(n)
		return &Op{Kind: ops.Broadcast, Root: w / 2, Count: n, In: addr(in[r]), Out: addr(out)}, [][]float32{out}, [][]float32{in[w/2][:n]}
	}},
	{ops.AllGather, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		return gatherInto(&Op{Kind: ops.AllGather, Count: n, In: addr(in[r])}, w, n, in)
	}},
	{ops.ReduceScatter, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		op := &Op{Kind: ops.ReduceScatter, Count: n}
		for d := 0; d < w; d++ {
			op.InPieces = append(op.InPieces, Piece{Addr: addr(in[r][d*n:]), Count: n})
		}
		out := poisoned(n)
		op.Out = addr(out)
		return op, [][]float32{out}, [][]float32{sumAt(in, r*n, n)}
	}},
	{ops.AllToAll, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		// rank s sends (s+d)%3 * n/2 elements to rank d, from offset d*n.
		cnt := func(s, d int) int { return (s + d) % 3 * n / 2 }
		op := &Op{Kind: ops.AllToAll}
		var outs, wants [][]float32
		for d := 0; d < w; d++ {
			op.InPieces = append(op.InPieces, Piece{Addr: addr(in[r][d*n:]), Count: cnt(r, d)})
			o := poisoned(cnt(d, r))
			op.OutPieces = append(op.OutPieces, Piece{Addr: addr(o), Count: len(o)})
			outs, wants = append(outs, o), append(wants, in[d][r*n:r*n+cnt(d, r)])
		}
		return op, outs, wants
	}},
	// The even forms: no pieces, the engine splits one buffer (ops.Even).
	{ops.AllToAll, "all_to_all_even", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		out, want := poisoned(w*n), []float32{}
		for s := 0; s < w; s++ {
			want = append(want, in[s][r*n:r*n+n]...)
		}
		return &Op{Kind: ops.AllToAll, Count: n, In: addr(in[r]), Out: addr(out)}, [][]float32{out}, [][]float32{want}
	}},
	{ops.AllGather, "all_gather_even", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		out, want := poisoned(w*n), []float32{}
		for s := 0; s < w; s++ {
			want = append(want, in[s][:n]...)
		}
		return &Op{Kind: ops.AllGather, Count: n, In: addr(in[r]), Out: addr(out)}, [][]float32{out}, [][]float32{want}
	}},
	{ops.ReduceScatter, "reduce_scatter_even", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		out := poisoned(n)
		return &Op{Kind: ops.ReduceScatter, Count: n, In: addr(in[r]), Out: addr(out)}, [][]float32{out}, [][]float32{sumAt(in, r*n, n)}
	}},
	{ops.Gather, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		op := &Op{Kind: ops.Gather, Root: 0, Count: n, In: addr(in[r])}
		if r != 0 {
			return op, nil, nil
		}
		return gatherInto(op, w, n, in)
	}},
	{ops.Scatter, "", func(w, r, n int, in [][]float32) (*Op, [][]float32, [][]float32) {
		root := w - 1
		op := &Op{Kind: ops.Scatter, Root: root, Count: n}
		if r == root {
			for d := 0; d < w; d++ {
				op.InPieces = append(op.InPieces, Piece{Addr: addr(in[r][d*n:]), Count: n})
			}
		}
		out := poisoned(n)
		op.Out = addr(out)
		return op, [][]float32{out}, [][]float32{in[root][r*n : r*n+n]}
	}},
}

// runCase posts c (float32 SUM) on every rank over inputs in and checks
// every rank's outputs.
func runCase(t *testing.T, eps []*Endpoint, c opCase, n int, in [][]float32) {
	t.Helper()
	world := len(eps)
	outs := make([][][]float32, world)
	wants := make([][][]float32, world)
	errs := postAll(t, eps, func(r int) *Op {
		op, o, w := c.build(world, r, n, in)
		op.DType, op.RedOp = dtype.Float32, dtype.Sum
		outs[r], wants[r] = o, w
		return op
	})
	for r := range eps {
		require.NoError(t, errs[r], "rank %d", r)
		for i := range outs[r] {
			require.Equal(t, wants[r][i], outs[r][i], "rank %d buffer %d", r, i)
		}
	}
}

func TestCollectives(t *testing.T) {
	for _, world := range []int{1, 2, 3} {
		eps := group(t, world, 20*time.Second)
		for _, c := range opCases {
			// 1<<21+5 floats exceed one 4 MiB staging half: several rounds.
			for _, n := range []int{0, 1, 3, 1025, 1<<21 + 5} {
				name := c.name
				if name == "" {
					name = c.kind.String()
				}
				t.Run(fmt.Sprintf("%s/w%d/n%d", name, world, n), func(t *testing.T) {
					in := make([][]float32, world)
					for r := range in {
						in[r] = make([]float32, world*n+1)
						for i := range in[r] {
							in[r][i] = rand.Float32()
						}
					}
					runCase(t, eps, c, n, in)
				})
			}
		}
	}
}

func TestSendRecvBothOrders(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	for _, n := range []int{0, 5, 1<<19 + 3} { // the last spans several mailbox chunks
		a, b := make([]float32, n), make([]float32, n)
		for i := range a {
			a[i], b[i] = rand.Float32(), rand.Float32()
		}
		ga, gb := poisoned(n), poisoned(n)
		// Both ranks post their receive first: sends must not depend on it.
		r0, err := eps[0].Post(&Op{Kind: ops.Recv, Peer: 1, Count: n, Out: addr(ga), Tag: 7})
		require.NoError(t, err)
		r1, err := eps[1].Post(&Op{Kind: ops.Recv, Peer: 0, Count: n, Out: addr(gb), Tag: 7})
		require.NoError(t, err)
		s0, err := eps[0].Post(&Op{Kind: ops.Send, Peer: 1, Count: n, In: addr(a), Tag: 7})
		require.NoError(t, err)
		s1, err := eps[1].Post(&Op{Kind: ops.Send, Peer: 0, Count: n, In: addr(b), Tag: 7})
		require.NoError(t, err)
		waitAll(t, r0, r1, s0, s1)
		require.Equal(t, b, ga)
		require.Equal(t, a, gb)
	}
}

func TestRecvSizeMismatchIsReportedAndDrained(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	a, got := make([]float32, 10), poisoned(12)
	s, _ := eps[0].Post(&Op{Kind: ops.Send, Peer: 1, Count: 10, In: addr(a)})
	r, _ := eps[1].Post(&Op{Kind: ops.Recv, Peer: 0, Count: 12, Out: addr(got)})
	require.NoError(t, s.Wait(-1))
	require.ErrorContains(t, r.Wait(-1), "expected 48 bytes with tag 0, the message with that tag has 40 bytes")
	// The next message on the pair is received intact.
	a[3] = 42
	got = poisoned(10)
	s, _ = eps[0].Post(&Op{Kind: ops.Send, Peer: 1, Count: 10, In: addr(a)})
	r, _ = eps[1].Post(&Op{Kind: ops.Recv, Peer: 0, Count: 10, Out: addr(got)})
	require.NoError(t, s.Wait(-1))
	require.NoError(t, r.Wait(-1))
	require.Equal(t, a, got)
}

func TestBadInputRejectedBeforeQueueing(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 4)
	for name, op := range map[string]*Op{
		"root out of range": {Kind: ops.Broadcast, Root: 2, Count: 4, In: addr(buf), Out: addr(buf)},
		"AVG on int":        {Kind: ops.AllReduce, DType: dtype.Int32, RedOp: dtype.Avg, Count: 4, In: addr(buf), Out: addr(buf)},
		"null buffer":       {Kind: ops.AllReduce, Count: 4},
		"send to self":      {Kind: ops.Send, Peer: 0, Count: 4, In: addr(buf)},
		"pieces per rank":   {Kind: ops.AllGather, Count: 4, In: addr(buf), OutPieces: []Piece{{Addr: addr(buf), Count: 4}}},
		"unknown dtype":     {Kind: ops.AllReduce, DType: 99, Count: 4, In: addr(buf), Out: addr(buf)},
	} {
		_, err := eps[0].Post(op)
		require.Error(t, err, name)
		require.Contains(t, []Code{CodeInvalidArg, -6}, CodeOf(err), name)
	}
}

func TestRecvMatchesByTag(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	a, b := []float32{1, 2, 3}, []float32{4, 5, 6, 7, 8}
	s1, _ := eps[0].Post(&Op{Kind: ops.Send, Peer: 1, Count: 3, In: addr(a), Tag: 3})
	s2, _ := eps[0].Post(&Op{Kind: ops.Send, Peer: 1, Count: 5, In: addr(b), Tag: 1})
	gb, ga := poisoned(5), poisoned(3)
	// Received in the other order: the tag-3 message is stashed until asked for.
	r1, _ := eps[1].Post(&Op{Kind: ops.Recv, Peer: 0, Count: 5, Out: addr(gb), Tag: 1})
	require.NoError(t, r1.Wait(-1))
	r2, _ := eps[1].Post(&Op{Kind: ops.Recv, Peer: 0, Count: 3, Out: addr(ga), Tag: 3})
	waitAll(t, s1, s2, r2)
	require.Equal(t, a, ga)
	require.Equal(t, b, gb)
}

func TestOverflowingExtentsRejected(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 4)
	huge := int(^uint(0)>>1) / 2
	for name, op := range map[string]*Op{
		"count overflows":       {Kind: ops.AllReduce, DType: dtype.Int64, Count: huge, In: addr(buf), Out: addr(buf)},
		"piece extent wraps":    {Kind: ops.AllToAll, InPieces: []Piece{{Addr: ^uintptr(0) - 8, Count: 4}, {Addr: addr(buf), Count: 1}}, OutPieces: []Piece{{Addr: addr(buf), Count: 1}, {Addr: addr(buf), Count: 1}}},
		"piece count overflows": {Kind: ops.AllToAll, DType: dtype.Float64, InPieces: []Piece{{Addr: addr(buf), Count: huge}, {Addr: addr(buf), Count: 1}}, OutPieces: []Piece{{Addr: addr(buf), Count: 1}, {Addr: addr(buf), Count: 1}}},
	} {
		_, err := eps[0].Post(op)
		require.ErrorContains(t, err, "overflows the address space", name)
		require.Equal(t, CodeInvalidArg, CodeOf(err), name)
	}
}

func TestAllToAllRejectsOverlap(t *testing.T) {
	eps := group(t, 2, 5*time.Second)
	buf := make([]float32, 8)
	op := &Op{Kind: ops.AllToAll,
		InPieces:  []Piece{{Addr: addr(buf), Count: 2}, {Addr: addr(buf[2:]), Count: 2}},
		OutPieces: []Piece{{Addr: addr(buf[3:]), Count: 2}, {Addr: addr(buf[5:]), Count: 2}}}
	_, err := eps[0].Post(op)
	require.ErrorContains(t, err, "overlaps an output piece")
}

// Run is Post + Wait for a caller that waits at once: it runs after the ops
// posted before it (not waited for yet), returns its op's own error on every
// rank, and leaves the group usable after a mismatch.
func TestRunKeepsPostOrderAndReportsErrors(t *testing.T) {
	const world, n = 2, 1025
	eps := group(t, world, 10*time.Second)
	each := func(fn func(r int) error) []error {
		errs := make([]error, world)
		var wg sync.WaitGroup
		for r := range eps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = fn(r)
			}()
		}
		wg.Wait()
		return errs
	}
	bufs := make([][]float32, world)
	errs := each(func(r int) error {
		bufs[r] = make([]float32, n)
		for i := range bufs[r] {
			bufs[r][i] = float32(r+1) * rand.Float32()
		}
		b := addr(bufs[r])
		w, err := eps[r].Post(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: n, In: b, Out: b})
		if err != nil {
			return err
		}
		if err := eps[r].Run(&Op{Kind: ops.Broadcast, DType: dtype.Float32, Root: 1, Count: n, In: b, Out: b}); err != nil {
			return err
		}
		return w.Wait(0) // done: Run ran the queue through it
	})
	for r := range eps {
		require.NoError(t, errs[r], "rank %d", r)
		require.Equal(t, bufs[1], bufs[r], "rank %d: the broadcast must carry the all_reduce's result", r)
	}
	errs = each(func(r int) error {
		buf := make([]float32, n)
		return eps[r].Run(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: n - r, In: addr(buf), Out: addr(buf)})
	})
	for r := range eps {
		require.Equal(t, status.Mismatch, status.CodeOf(errs[r]), "rank %d: %v", r, errs[r])
		require.ErrorContains(t, errs[r], "element count")
	}
	errs = each(func(r int) error {
		buf := []float32{float32(r)}
		return eps[r].Run(&Op{Kind: ops.AllReduce, DType: dtype.Float32, Count: 1, In: addr(buf), Out: addr(buf)})
	})
	require.Equal(t, []error{nil, nil}, errs)
}
