package gpu

// The plane's entry: the group it serves, the op in its turn, and the
// setup that the group's first CUDA op runs on every rank.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Group is the group a State serves: who it is, and the endpoint's
// host-side exchanges over the group's links (Peers).
type Group struct {
	Name        string
	Rank, World int
	Timeout     time.Duration
	Peers       Peers
}

// Peers is all the plane asks of its endpoint. Every call is collective:
// each rank makes it for the same op, in collective order.
type Peers interface {
	// ExchangeFD announces body and fds (the caller keeps them) to every
	// peer over the authenticated links and returns every rank's
	// announcement, by rank; the caller closes them (comm.CloseFDs).
	ExchangeFD(magic uint32, body []byte, fds []int, deadline time.Time) ([]comm.FDMsg, error)
	// AgreeAll tells every rank whether this one succeeded and returns the
	// ranks that did not (the same list on every rank).
	AgreeAll(ok bool, who symm.Who, deadline time.Time) ([]int, error)
	// Barrier publishes meta and returns every rank's, by rank.
	Barrier(meta []byte, who symm.Who, deadline time.Time) ([][]byte, error)
	// Sign, SigOf and Refuse are the collectives' signatures (symm.Team's):
	// not collective, they never wait.
	Sign(seq, sig uint64) (peer int, theirs uint64, posted []int)
	SigOf(r int, seq uint64) (uint64, bool)
	Refuse(seq uint64)
}

// vmmMagic marks the fd exchange that binds fresh VMM memory to a group
// (direct.go, swapFresh).
const vmmMagic = 0x4d565347 // "GSVM"

// swapFD is a swapFunc over peers: every rank announces body and fds to
// every peer and gets every rank's announcement.
func swapFD(peers Peers, body []byte, fds []int, deadline time.Time) ([]comm.FDMsg, func(), error) {
	msgs, err := peers.ExchangeFD(vmmMagic, body, fds, deadline)
	if err != nil {
		return nil, nil, err
	}
	return msgs, func() { comm.CloseFDs(msgs) }, nil
}

// Run runs a CUDA op of grp in its turn on the collective queue (every
// rank runs the group's CUDA ops in the same order): the first sets the
// plane up on every rank.
func (g *State) Run(grp Group, op *ops.Op, a Args, deadline time.Time) error {
	t0 := time.Now()
	defer func() { g.hostNs.Add(int64(time.Since(t0))) }()
	if g.err != nil {
		return g.err
	}
	if g.team == nil {
		t, err := start(grp, a.Device, op.Who(), deadline)
		if err != nil {
			if status.CodeOf(err) == status.NotSupported {
				g.err = err
			}
			return err
		}
		// Every rank asks, so that the gate's answer is agreed; on the lent
		// machines it is no (their safety variables) and nothing multicast
		// is ever called.
		mc, err := setupNVLS(grp, t, op.Who(), deadline)
		switch {
		case err == nil:
			t.nvls = mc
			g.nvls.Store(true)
		case status.CodeOf(err) != status.NotSupported: // links or barrier broke
			t.close(grp.Timeout)
			return err
		}
		t.counters, t.algos, t.reg = &g.counters, &g.algos, &g.reg
		// Over the links, by the current op's deadline: set once, used by
		// the few ops that bind a fresh VMM buffer.
		t.swapFD = func(body []byte, fds []int) ([]comm.FDMsg, func(), error) {
			return swapFD(grp.Peers, body, fds, t.deadline)
		}
		// here, not at the first deferred op, which may come while another stream captures
		if t.cfg.deferOps && t.g.memops && t.df.open(t.g) {
			g.deferring.Store(true)
		}
		g.team = t
		g.mu.Lock()
		g.live = t
		g.mu.Unlock()
		g.device.Store(int32(a.Device) + 1)
		g.dependent.Store(t.g.dependent)
		g.stage.Store(int64(t.stage))
		g.setupNs.Store(int64(time.Since(t0))) // apart from the ops' host time
		t0 = time.Now()
	}
	if err := g.lostError(); err != nil { // after live is set: lost.go
		return err
	}
	t := g.team
	if a.Device != t.g.ordinal {
		return status.Errorf(status.InvalidArg, "gosym: %s on cuda:%d, but group %q runs on cuda:%d (one device per rank and group)",
			op.Kind, a.Device, grp.Name, t.g.ordinal)
	}
	if t.errw.Code() != 0 { // a kernel of an earlier op timed out: the pads are out of step
		g.err = deviceError(grp, t.errw, t.g.ordinal, g.seq.Load())
		return g.err
	}
	if err := t.checkSig(grp, op); err != nil {
		g.err = err
		return err
	}
	g.seq.Store(op.Seq)
	g.kind.Store(int32(op.Kind))
	// Asked here, not by every caller: one driver call, no Python round;
	// the capture sequence orders the op (order.go).
	capturing, capture, err := t.g.d.StreamCaptureInfo(t.g.ctx, a.Stream)
	if err != nil {
		return status.Wrap(status.System, err, "gosym: %s on cuda:%d: asking whether the stream is being captured", op.Kind, a.Device)
	}
	capturing = capturing || a.Capturing
	g.ops.Add(1)
	if capturing {
		g.captured.Add(1)
	}
	if err := t.df.start(t.g, a); err != nil {
		return err
	}
	if err := t.order.before(t.g, a.Stream, capture); err != nil {
		return status.Wrap(status.System, err, "gosym: %s on cuda:%d: waiting for the group's previous op on another stream", op.Kind, a.Device)
	}
	agree := func(meta []byte) ([][]byte, error) {
		t0 := time.Now()
		defer func() { g.agreeRounds.Add(1); g.agreeNs.Add(int64(time.Since(t0))) }()
		return grp.Peers.Barrier(meta, op.Who(), deadline)
	}
	t.capturing, t.deadline = capturing, deadline
	err = t.run(op, a.Stream, agree)
	if rerr := explainRefusal(grp, op, err); rerr != nil { // a peer refused op: the group is out of step
		err, g.err = rerr, rerr
	}
	if oerr := t.order.after(t.g, a.Stream, capture); oerr != nil && err == nil {
		err = status.Wrap(status.System, oerr, "gosym: %s on cuda:%d: recording the op's end for the group's next op", op.Kind, a.Device)
	}
	g.joins.Store(int64(t.order.joins))
	if err != nil && !isCoded(err) {
		return status.Wrap(status.System, err, "gosym: %s on cuda:%d", op.Who(), a.Device)
	}
	return err
}

// isCoded says whether err carries a status code already. Apart from Run so
// that its target is allocated on an error alone, not with every op.
func isCoded(err error) bool {
	var coded *status.Error
	return errors.As(err, &coded)
}

// start sets up the group's CUDA data plane on every rank together.
// Local failures do not stop this rank from taking part in the exchange and
// the agreement barrier, so that the links and the barrier count stay in
// step; they turn into NotSupported on every rank.
func start(grp Group, device int, who symm.Who, deadline time.Time) (*Team, error) {
	who.Op += " (CUDA setup)"
	if grp.World > cuda.MaxRanks { // the same answer on every rank: no exchange needed
		return nil, status.Errorf(status.NotSupported, "gosym: the CUDA data plane handles groups of up to %d ranks, group %q has %d",
			cuda.MaxRanks, grp.Name, grp.World)
	}
	t, local := newTeam(device, grp.Rank, grp.World, ConfigFromEnv(), grp.Timeout)
	for i, sy := range t.symms() { // both exchanges run whatever happened locally
		if err := shareSymm(grp, t, sy, helloMagic+uint32(i), &local, deadline); err != nil {
			t.close(grp.Timeout) // the links are out of step: the group cannot go on
			return nil, status.Wrap(status.Peer, err, "gosym: %s", who)
		}
	}
	if local == nil {
		local = t.zeroPad()
	}
	if local != nil {
		dlog.Printf("rank %d: CUDA data plane setup failed: %v", grp.Rank, local)
	}
	failed, err := grp.Peers.AgreeAll(local == nil, who, deadline)
	if err != nil {
		t.close(grp.Timeout)
		return nil, err
	}
	if len(failed) > 0 {
		t.close(grp.Timeout)
		why := fmt.Sprintf("ranks %v could not set it up", failed)
		if local != nil {
			why = fmt.Sprintf("%s; this rank: %v", why, local)
		}
		return nil, status.Errorf(status.NotSupported, "gosym: the CUDA data plane is not available on group %q (%s)", grp.Name, why)
	}
	return t, nil
}

// shareSymm sends this rank's buffer of sy to every peer and maps theirs.
// A local failure (already in *local, or met here) is recorded in *local
// and this rank still takes part in the exchange; the error returned is a
// link failure.
func shareSymm(grp Group, t *Team, sy *symmBuf, magic uint32, local *error, deadline time.Time) error {
	fd := -1
	if *local == nil {
		fd, *local = t.exportFD(sy)
	}
	body := binary.LittleEndian.AppendUint64(nil, uint64(sy.size))
	body = append(body, t.cfg.shared()...)
	msgs, err := grp.Peers.ExchangeFD(magic, body, comm.OneFD(fd), deadline)
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		return err
	}
	defer comm.CloseFDs(msgs)
	for r, m := range msgs {
		switch {
		case r == grp.Rank || *local != nil:
		case !m.OK:
			*local = fmt.Errorf("rank %d could not set up its GPU %s buffer", r, sy.name)
		case len(m.Body) < 8:
			*local = fmt.Errorf("rank %d announced its GPU %s buffer in %d bytes (another gosym version?)", r, sy.name, len(m.Body))
		case uintptr(binary.LittleEndian.Uint64(m.Body)) != sy.size:
			*local = fmt.Errorf("rank %d's GPU %s buffer has %d bytes, this rank's %d (different GPUs?)", r, sy.name,
				binary.LittleEndian.Uint64(m.Body), sy.size)
		default:
			if *local = t.cfg.sharedMismatch(r, m.Body[8:]); *local == nil {
				*local = t.importPeer(sy, r, m.FD())
			}
		}
	}
	return nil
}
