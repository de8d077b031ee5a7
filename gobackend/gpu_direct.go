package gobackend

// The direct path of the CUDA data plane: large ops read (and all_reduce
// writes) the peers' own buffers instead of going through the staging, so
// every byte crosses NVLink once and nothing is copied in or out.
//
// The buffers are ordinary PyTorch tensors, from the caching allocator: a
// rank publishes the allocation its op's buffers lie in (cuMemGetAddressRange,
// cuIpcGetMemHandle) with the op's addresses, through the host control plane;
// each peer opens the handle once (cuIpcOpenMemHandle) and keeps the mapping
// in a cache keyed by (peer, handle bytes): a buffer reused op after op costs
// no driver call, and an allocation freed and replaced at the same address
// has another handle, so it is opened anew and never served stale. A second
// agreement round confirms that every rank mapped every peer; if one could
// not (or one rank's buffers span allocations), every rank takes the staged
// path for that op. Mappings are closed when the group goes.
//
// The agreement rounds cost tens of microseconds on the host, which is why
// only ops of at least directMin bytes take this path: there the GPU work is
// long and the host runs ahead of it anyway.

import (
	"encoding/binary"
	"fmt"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// gpuMaxIPC bounds the mappings a group keeps open; past it, ops take the
// staged path (mappings are only released with the group).
const gpuMaxIPC = 1024

// gpuRegionBytes is the published region: ok flag (8 bytes, for alignment),
// allocation base, allocation size, IPC handle.
const gpuRegionBytes = 8 + 8 + 8 + len(cuda.IpcHandle{})

type gpuIPCKey struct {
	peer int
	h    cuda.IpcHandle
}

// gpuRegion is one rank's published allocation, as decoded.
type gpuRegion struct {
	ok         bool
	base, size uintptr
	h          cuda.IpcHandle
}

// exportRegion publishes the allocation holding every [addr, addr+n) of
// spans (zero-length spans are ignored), or a region with ok unset if they
// do not lie in one allocation or it cannot be exported.
func (t *gpuTeam) exportRegion(spans ...gpuSpan) []byte {
	out := make([]byte, gpuRegionBytes)
	var base, size uintptr
	for _, sp := range spans {
		if sp.n == 0 {
			continue
		}
		if size == 0 {
			b, n, err := t.g.d.AddressRange(t.g.ctx, sp.addr)
			if err != nil {
				debugf("rank %d: no address range for %#x: %v", t.rank, sp.addr, err)
				return out
			}
			base, size = b, n
		}
		if sp.addr < base || sp.addr+sp.n > base+size || sp.addr+sp.n < sp.addr {
			return out // spans two allocations: staged
		}
	}
	if size == 0 {
		return out
	}
	h, err := t.g.d.IpcGetMemHandle(t.g.ctx, base)
	if err != nil {
		debugf("rank %d: cuIpcGetMemHandle(%#x): %v", t.rank, base, err)
		return out
	}
	le := binary.LittleEndian
	le.PutUint64(out[0:], 1)
	le.PutUint64(out[8:], uint64(base))
	le.PutUint64(out[16:], uint64(size))
	copy(out[24:], h[:])
	return out
}

type gpuSpan struct{ addr, n uintptr }

func decodeRegion(b []byte) gpuRegion {
	le := binary.LittleEndian
	r := gpuRegion{ok: le.Uint64(b) == 1, base: uintptr(le.Uint64(b[8:])), size: uintptr(le.Uint64(b[16:]))}
	copy(r.h[:], b[24:gpuRegionBytes])
	return r
}

// gpuPeers translates addresses of every rank's published allocation into
// this process.
type gpuPeers struct {
	regions []gpuRegion
	local   []uintptr // where rank r's allocation is mapped here
}

func (p *gpuPeers) at(r int, addr uintptr) uintptr { return p.local[r] + (addr - p.regions[r].base) }

// openPeers maps the published region (at the start of each meta) of every
// rank that need says this rank reads, and confirms with every rank that
// all succeeded: ok is false, on every rank alike, when some rank lacked a
// region it needed or could not map one.
func (t *gpuTeam) openPeers(metas [][]byte, need func(r int) bool, who *Op, agree gpuAgree) (*gpuPeers, bool, error) {
	p := &gpuPeers{regions: make([]gpuRegion, t.world), local: make([]uintptr, t.world)}
	for r, m := range metas {
		if len(m) < gpuRegionBytes {
			return nil, false, status.Errorf(status.Mismatch, "gosym: %s: rank %d sent %d bytes of metadata, want at least %d",
				who.Who(), r, len(m), gpuRegionBytes)
		}
		p.regions[r] = decodeRegion(m)
	}
	// need may differ between ranks (all_to_all): a missing region only
	// turns this rank's vote to no.
	local := true
	for r, rg := range p.regions {
		switch {
		case !need(r):
		case !rg.ok:
			local = false
		case r == t.rank:
			p.local[r] = rg.base
		default:
			va, err := t.openIPC(r, rg.h)
			if err != nil {
				debugf("rank %d: opening rank %d's buffer: %v", t.rank, r, err)
				local = false
			}
			p.local[r] = va
		}
	}
	all, err := agree(okFlag(local))
	if err != nil || len(failedRanks(all)) > 0 {
		return nil, false, err
	}
	return p, true, nil
}

// openIPC returns the local address of peer's allocation h, from the cache
// or by opening it.
func (t *gpuTeam) openIPC(peer int, h cuda.IpcHandle) (uintptr, error) {
	k := gpuIPCKey{peer, h}
	if va, ok := t.ipc[k]; ok {
		t.counters.ipcHits.Add(1)
		return va, nil
	}
	if len(t.ipc) >= gpuMaxIPC {
		return 0, fmt.Errorf("%d peer allocations are mapped already", len(t.ipc))
	}
	va, err := t.g.d.IpcOpenMemHandle(t.g.ctx, h, cuda.IpcLazyEnablePeerAccess)
	if err != nil {
		return 0, err
	}
	if t.ipc == nil {
		t.ipc = map[gpuIPCKey]uintptr{}
	}
	t.ipc[k] = va
	t.counters.ipcOpens.Add(1)
	return va, nil
}

// closeIPC unmaps every cached peer allocation (the device is idle).
func (t *gpuTeam) closeIPC() {
	for k, va := range t.ipc {
		if err := t.g.d.IpcCloseMemHandle(t.g.ctx, va); err != nil {
			debugf("rank %d: cuIpcCloseMemHandle of rank %d's buffer: %v", t.rank, k.peer, err)
		}
	}
	t.ipc = nil
}

// direct runs op on the peers' own buffers when it is large enough and
// every rank can; done is false when op should take the staged path.
// all_to_all takes its own route (its agreement carries the splits).
func (t *gpuTeam) direct(op *Op, s cuda.Stream, agree gpuAgree) (done bool, err error) {
	es := uintptr(op.DType.Size())
	n := uintptr(op.Count) * es
	if t.world == 1 || int(n) < t.directMin(op) {
		return false, nil
	}
	var mine []gpuSpan // what peers will address in this rank's memory
	need := func(int) bool { return true }
	switch op.Kind {
	case coll.AllReduce, coll.AllGather:
		mine = append(mine, gpuSpan{op.In, n})
	case coll.Broadcast:
		if t.rank == op.Root {
			mine = append(mine, gpuSpan{op.In, n})
		}
		need = func(r int) bool { return r == op.Root }
	case coll.ReduceScatter:
		for _, pc := range op.InPieces {
			mine = append(mine, gpuSpan{pc.Addr, n})
		}
	default:
		return false, nil
	}
	le := binary.LittleEndian
	// region, then In, then one address per peer (reduce_scatter's pieces)
	meta := make([]byte, gpuRegionBytes+8+8*t.world)
	copy(meta, t.exportRegion(mine...))
	if op.Kind == coll.AllReduce && op.In != op.Out {
		meta[0] = 0 // two-shot runs in place: every rank takes the staged path
	}
	le.PutUint64(meta[gpuRegionBytes:], uint64(op.In))
	for r, pc := range op.InPieces {
		le.PutUint64(meta[gpuRegionBytes+8+8*r:], uint64(pc.Addr))
	}
	metas, err := agree(meta)
	if err != nil {
		return false, err
	}
	for r, m := range metas {
		if len(m) != len(meta) {
			return false, status.Errorf(status.Mismatch, "gosym: %s: rank %d sent %d bytes of metadata, this rank %d",
				op.Who(), r, len(m), len(meta))
		}
	}
	peers, ok, err := t.openPeers(metas, need, op, agree)
	if err != nil || !ok {
		return false, err
	}
	t.counters.directOps.Add(1)
	in := func(r int) uintptr { return peers.at(r, uintptr(le.Uint64(metas[r][gpuRegionBytes:]))) }
	switch op.Kind {
	case coll.AllGather:
		segs := make([]gpuSeg, 0, t.world)
		for r, pc := range op.OutPieces {
			segs = append(segs, gpuSeg{pc.Addr, in(r), n})
		}
		return true, t.moveCE(segs, s)
	case coll.Broadcast:
		var segs []gpuSeg
		if t.rank != op.Root {
			segs = append(segs, gpuSeg{op.Out, in(op.Root), n})
		} else if op.Out != op.In {
			segs = append(segs, gpuSeg{op.Out, op.In, n})
		}
		return true, t.moveCE(segs, s)
	case coll.ReduceScatter:
		p := t.reduceParams(op)
		for r := range metas {
			p.Peers[r] = peers.at(r, uintptr(le.Uint64(metas[r][gpuRegionBytes+8+8*t.rank:])))
		}
		p.Numel, p.Out = uint64(op.Count), op.Out
		return true, t.reduceKernel(op, cuda.OneShot, &p, s)
	default: // all_reduce, in place: two-shot on the peers' buffers
		p := t.reduceParams(op)
		for r := range metas {
			p.Peers[r] = in(r)
		}
		p.Numel, p.Out = uint64(op.Count), op.Out
		return true, t.reduceKernel(op, cuda.TwoShot, &p, s)
	}
}

// moveCE makes segs by the copy engines between two barriers of all ranks.
func (t *gpuTeam) moveCE(segs []gpuSeg, s cuda.Stream) error {
	if err := t.barrier(s); err != nil {
		return err
	}
	for _, sg := range segs {
		if sg.n > 0 {
			if err := t.g.d.MemcpyDtoDAsync(t.g.ctx, sg.dst, sg.src, sg.n, s); err != nil {
				return err
			}
		}
	}
	return t.barrier(s)
}
