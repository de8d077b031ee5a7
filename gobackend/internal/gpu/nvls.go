package gpu

// NVLS setup for a group's GPU buffers (issue #6): a multicast object bound
// over every rank's buffer, so that the NVLS kernels read all stagings in
// one multimem.ld_reduce. Strictly opt-in: cuda.SetupMulticast asks the
// gate (GOSYM_NVLS=1, device support, no NCCL_NVLS_ENABLE=0,
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) on every rank
// and agrees on the answer before anything multicast happens. Run calls
// it after start on every rank; the binding lives on the team and is
// closed before the buffers.

import (
	"os"
	"time"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// nvlsRoot creates the multicast object.
const nvlsRoot = 0

// setupNVLS binds a multicast object over the group's GPU buffers; every
// rank of the group calls it for the same op, on the collective queue (as
// start). On success, nvlsStageAddr(binding) is the stagings' multicast
// address for Team.nvlsReduce. Any local failure on any rank (the gate,
// loading nvls.cu, a driver call) gives every rank the same NotSupported
// error with nothing left behind; a failed link or barrier breaks the group
// as in start.
func setupNVLS(grp Group, t *Team, who symm.Who, deadline time.Time) (*cuda.McBinding, error) {
	who.Op += " (NVLS setup)"
	peers := &nvlsPeers{grp: grp, who: who, deadline: deadline}
	spec := cuda.McSpec{Ctx: t.g.ctx, Dev: t.g.dev, Rank: t.rank, World: t.world, Root: nvlsRoot,
		Mem: t.data.bufs[t.rank].h, Size: t.data.size}
	load := func() error {
		_, err := t.g.Module(cuda.NVLSSource)
		return err
	}
	b, err := cuda.SetupMulticast(t.g.d, os.Getenv, spec, peers, load)
	switch {
	case err == nil:
		dlog.Printf("rank %d: NVLS on group %q: multicast object bound over %d bytes per rank", grp.Rank, grp.Name, t.data.size)
		return b, nil
	case peers.broken != nil:
		return nil, peers.broken
	}
	dlog.Printf("rank %d: no NVLS on group %q: %v", grp.Rank, grp.Name, err)
	return nil, status.Wrap(status.NotSupported, err, "gosym: NVLS on group %q", grp.Name)
}

// nvlsStageAddr is the multicast address of the stagings under b (it
// covers the data allocations, staging from offset 0).
func nvlsStageAddr(b *cuda.McBinding) uintptr { return b.Addr }

// nvlsMsgMagic marks the announcements of the multicast object's fd.
const nvlsMsgMagic = 0x534d5347 // "GSMS"

// nvlsPeers is cuda.McPeers over the group's authenticated links (the fd)
// and its host barrier (the agreements). A failure of either is kept in
// broken: the links are out of step and the group cannot go on.
type nvlsPeers struct {
	grp      Group
	who      symm.Who
	deadline time.Time
	broken   error
}

// ShareFD is an fd exchange in which only the root attaches an fd.
func (p *nvlsPeers) ShareFD(root, fd int) (int, error) {
	if p.grp.Rank != root {
		fd = -1
	}
	msgs, err := p.grp.Peers.ExchangeFD(nvlsMsgMagic, nil, comm.OneFD(fd), p.deadline)
	if err != nil {
		return -1, p.fail(err)
	}
	got := -1
	if p.grp.Rank != root {
		got = msgs[root].Take() // the caller's to close
	}
	comm.CloseFDs(msgs)
	return got, nil
}

func (p *nvlsPeers) Agree(step string, ok bool) ([]int, error) {
	who := p.who
	who.Op += ": " + step
	failed, err := p.grp.Peers.AgreeAll(ok, who, p.deadline)
	if err != nil {
		p.broken = err
	}
	return failed, err
}

func (p *nvlsPeers) fail(err error) error {
	p.broken = status.Wrap(status.Peer, err, "gosym: %s", p.who)
	return p.broken
}
