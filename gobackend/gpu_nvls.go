package gobackend

// NVLS setup for a group's GPU buffers (issue #6): a multicast object bound
// over every rank's buffer, so that the NVLS kernels read all stagings in
// one multimem.ld_reduce. Strictly opt-in: cuda.SetupMulticast asks the
// gate (GOSYM_NVLS=1, device support, no NCCL_NVLS_ENABLE=0,
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) on every rank
// and agrees on the answer before anything multicast happens. runGPU calls
// it after startGPU on every rank; the binding lives on the team and is
// closed before the buffers.

import (
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// nvlsRoot creates the multicast object.
const nvlsRoot = 0

// setupNVLS binds a multicast object over the group's GPU buffers; every
// rank of the group calls it for the same op, on the collective queue (as
// startGPU). On success, nvlsStageAddr(binding) is the stagings' multicast
// address for gpuTeam.nvlsReduce. Any local failure on any rank (the gate,
// loading nvls.cu, a driver call) gives every rank the same NotSupported
// error with nothing left behind; a failed link or barrier breaks the group
// as in startGPU.
func (e *Endpoint) setupNVLS(t *gpuTeam, who symm.Who, deadline time.Time) (*cuda.McBinding, error) {
	who.Op += " (NVLS setup)"
	peers := &nvlsPeers{e: e, who: who, deadline: deadline}
	spec := cuda.McSpec{Ctx: t.g.ctx, Dev: t.g.dev, Rank: t.rank, World: t.world, Root: nvlsRoot,
		Mem: t.bufs[t.rank].h, Size: t.size}
	load := func() error {
		_, err := t.g.module(cuda.NVLSSource)
		return err
	}
	b, err := cuda.SetupMulticast(t.g.d, os.Getenv, spec, peers, load)
	switch {
	case err == nil:
		debugf("rank %d: NVLS on group %q: multicast object bound over %d bytes per rank", e.Rank, e.Name, t.size)
		return b, nil
	case peers.broken != nil:
		return nil, peers.broken
	}
	debugf("rank %d: no NVLS on group %q: %v", e.Rank, e.Name, err)
	return nil, status.Wrap(status.NotSupported, err, "gosym: NVLS on group %q", e.Name)
}

// nvlsStageAddr is the multicast address of the stagings under b.
func nvlsStageAddr(b *cuda.McBinding) uintptr { return b.Addr + gpuStageOff }

// The root's message with the multicast object's fd.
const (
	nvlsMsgMagic   = 0x534d5347 // "GSMS"
	nvlsMsgVersion = 1
	nvlsMsgBytes   = 16
)

// nvlsPeers is cuda.McPeers over the group's authenticated links (the fd)
// and its host barrier (the agreements). A failure of either is kept in
// broken: the links are out of step and the group cannot go on.
type nvlsPeers struct {
	e        *Endpoint
	who      symm.Who
	deadline time.Time
	broken   error
}

func (p *nvlsPeers) ShareFD(root, fd int) (int, error) {
	le := binary.LittleEndian
	e := p.e
	if e.Rank == root {
		msg := make([]byte, nvlsMsgBytes)
		le.PutUint32(msg, nvlsMsgMagic)
		le.PutUint32(msg[4:], nvlsMsgVersion)
		le.PutUint32(msg[8:], uint32(root))
		var fds []int
		if fd >= 0 {
			le.PutUint32(msg[12:], 1)
			fds = []int{fd}
		}
		var first error // send to every peer anyway, keeping the links in step
		for _, l := range e.mesh.Links {
			if l != nil {
				if err := l.Send(msg, fds, p.deadline); err != nil && first == nil {
					first = err
				}
			}
		}
		if first != nil {
			return -1, p.fail(first)
		}
		return -1, nil
	}
	msg, fds, err := e.mesh.Links[root].Recv(p.deadline)
	if err != nil {
		return -1, p.fail(err)
	}
	want := 0
	if len(msg) == nvlsMsgBytes {
		want = int(le.Uint32(msg[12:]))
	}
	if len(msg) != nvlsMsgBytes || le.Uint32(msg) != nvlsMsgMagic || le.Uint32(msg[4:]) != nvlsMsgVersion ||
		int(le.Uint32(msg[8:])) != root || want > 1 || len(fds) != want {
		for _, f := range fds {
			unix.Close(f)
		}
		return -1, p.fail(fmt.Errorf("rank %d sent a malformed multicast announcement", root))
	}
	if want == 0 {
		return -1, nil
	}
	return fds[0], nil
}

func (p *nvlsPeers) Agree(step string, ok bool) ([]int, error) {
	flag := []byte{0}
	if ok {
		flag[0] = 1
	}
	who := p.who
	who.Op += ": " + step
	metas, err := p.e.team.Barrier(flag, who, p.deadline)
	if err != nil {
		p.broken = err
		return nil, err
	}
	var failed []int
	for r, m := range metas {
		if len(m) != 1 || m[0] != 1 {
			failed = append(failed, r)
		}
	}
	return failed, nil
}

func (p *nvlsPeers) fail(err error) error {
	p.broken = status.Wrap(status.Peer, err, "gosym: %s", p.who)
	return p.broken
}
