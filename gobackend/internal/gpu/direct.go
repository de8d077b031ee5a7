package gpu

// The direct path of the CUDA data plane: large ops read (and all_reduce
// writes) the peers' own buffers instead of going through the staging, so
// every byte crosses NVLink once and nothing is copied in or out.
//
// Round 1 (host agreement): each rank publishes a record of the allocation
// its op's buffers lie in, with the op's addresses in it.
//
//   - Registered memory (gosym.mem_map of CUDA memory, reg.go): the
//     record is the memh's id and its allocation and handle, resolved once
//     at map time, so the op makes no driver call. Such ops go direct from
//     regMin bytes (GOSYM_GPU_REG_DIRECT_MIN). VMM memory has no handle:
//     binding it sends its fd over the links (swapFresh).
//   - gosym.empty's buffers, from directMin: their implicit registration
//     (mem.go), the same way.
//   - Other memory (the caching allocator's tensors): from directMin bytes
//     (GOSYM_GPU_DIRECT_MIN), the record is the allocation as the driver
//     reports it (cuMemGetAddressRange, cuIpcGetMemHandle), per op; paged
//     VMM memory (torch's expandable segments), which has no IPC handle,
//     is published as a run of pages (pages.go) and binds like a VMM
//     memh.
//
// Each rank maps the peers' allocations it reads (cuIpcOpenMemHandle)
// through caches: registered ones keyed by (peer, memh id), others by
// (peer, handle bytes), so an allocation freed and replaced at the same
// address is opened anew, never served stale.
//
// Round 2 (vote): every rank says, per rank, whether it mapped that rank's
// allocation. If one could not (or one rank's buffers span allocations),
// every rank takes the staged path for that op. The exporter of a fresh
// registered memh that every rank mapped binds it to the group (one that
// some rank could not map is refused: published unshareable from then on);
// an op whose records are all registered and bound skips the vote, since
// every peer is known to hold the mappings. Records also carry the ids this rank retired (unmapped
// since the last round): the peers drop those mappings.
//
// The decision to take round 1 at all must be the same on every rank,
// with no communication: from directMin bytes every rank takes it; between
// regMin and directMin a rank takes it when its input is registered
// (mem_map'ed), so registration must be symmetric at those sizes (every
// rank maps its buffers, or none does), as with NCCL's user buffers. A mix
// ends at the group timeout, naming the rank that did not arrive.

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/dlog"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// maxIPC bounds the per-op (unregistered) mappings a group keeps open;
// past it, such ops take the staged path (they are only released with the
// group). Registered mappings go when their memh is unmapped.
const maxIPC = 1024

// maxRetired bounds the retired ids one record carries; more wait for
// the next round.
const maxRetired = 8

// A record (regionBytes, little-endian): flags | allocation base |
// allocation size | IPC handle[64] | memh id | n retired | retired[maxRetired].
const regionBytes = 8 + 8 + 8 + len(cuda.IpcHandle{}) + 8 + 8 + 8*maxRetired

// A record and its op's addresses fit a sync slot at every world size:
// all_to_all publishes 24 bytes per rank and a record, the other ops a
// record, In and 8 bytes per rank (Team.Barrier refuses longer metadata).
const _ = uint(symm.SlotHeaderBytes + symm.SlotExtraBytes - regionBytes - 8)

// Record flags.
const (
	recOK         = 1 << iota // the buffers lie in this allocation and peers may map it
	recRegistered             // the allocation is a registered memh's (id)
	recBound                  // ... already bound to the group: every rank maps it
	recVMM                    // ... VMM memory with no IPC handle: binding it sends its fd
)

// boundRegion is one rank's record, decoded.
type boundRegion struct {
	flags      uint64
	base, size uintptr
	h          cuda.IpcHandle
	id         uint64
	retired    []uint64
}

func (r *boundRegion) ok() bool         { return r.flags&recOK != 0 }
func (r *boundRegion) registered() bool { return r.ok() && r.flags&recRegistered != 0 }
func (r *boundRegion) bound() bool      { return r.registered() && r.flags&recBound != 0 }
func (r *boundRegion) vmm() bool        { return r.registered() && r.flags&recVMM != 0 }
func (r *boundRegion) paged() bool      { return r.vmm() && r.id&pageRunBit != 0 }

func (r *boundRegion) encode(out []byte) {
	le := binary.LittleEndian
	le.PutUint64(out[0:], r.flags)
	le.PutUint64(out[8:], uint64(r.base))
	le.PutUint64(out[16:], uint64(r.size))
	at := 24 + copy(out[24:], r.h[:])
	le.PutUint64(out[at:], r.id)
	le.PutUint64(out[at+8:], uint64(len(r.retired)))
	for i, id := range r.retired {
		le.PutUint64(out[at+16+8*i:], id)
	}
}

func decodeRegion(b []byte) boundRegion {
	le := binary.LittleEndian
	r := boundRegion{flags: le.Uint64(b), base: uintptr(le.Uint64(b[8:])), size: uintptr(le.Uint64(b[16:]))}
	at := 24 + copy(r.h[:], b[24:])
	r.id = le.Uint64(b[at:])
	n := min(le.Uint64(b[at+8:]), maxRetired)
	for i := range n {
		r.retired = append(r.retired, le.Uint64(b[at+16+8*int(i):]))
	}
	return r
}

type spanRec struct{ addr, n uintptr }

// hull is the range from the lowest start to the highest end of the
// non-empty spans.
func hull(spans []spanRec) (lo, n uintptr) {
	var hi uintptr
	for _, sp := range spans {
		if sp.n == 0 {
			continue
		}
		if hi == 0 || sp.addr < lo {
			lo = sp.addr
		}
		hi = max(hi, sp.addr+sp.n)
	}
	if hi == 0 {
		return 0, 0
	}
	return lo, hi - lo
}

// directMode is which records may take an op direct; every rank
// derives it from what is the same everywhere.
type directMode int

const (
	directNone       directMode = iota // below both thresholds: only retired lists are read
	directRegistered                   // regMin <= size < directMin: registered records only
	directAny                          // size >= directMin
)

// directSide is one rank's part in a direct op's agreement: the driver, the
// group's bindings and caches. Built per op (t.side); tests build it over
// fakes.
type directSide struct {
	rank, world int
	device      int
	ipc         ipcMaps
	reg         *registry
	counters    *Counters
	capturing   bool
	fresh       *memreg.Memh // this rank's registered memh published unbound in this op
	run         *pageRun     // ... or its run of paged memory
	swapFD      swapFunc     // sends the fds of fresh VMM memory (swapFunc)
	// everyNeeds: every rank maps every relevant rank's allocation in this
	// op (not all_to_all, where a rank maps only whom it reads), so a vote
	// that passes means each is mapped everywhere (registry.held)
	everyNeeds bool
}

// swapFunc announces body and fds to every peer over the links and
// returns every rank's announcement, by rank (this rank's own carries no
// fds), and a func that closes the fds received.
type swapFunc func(body []byte, fds []int) (msgs []comm.FDMsg, done func(), err error)

func (t *Team) side() *directSide {
	return &directSide{rank: t.rank, world: t.world, device: t.g.ordinal, ipc: t, reg: t.reg, counters: t.counters,
		capturing: t.capturing, swapFD: t.swapFD}
}

// registered says whether this rank's input of op (n bytes) is a
// registered CUDA memh of the group's device and at least regMin bytes:
// then it takes round 1 below directMin.
func (t *Team) registered(op *ops.Op, n uintptr) bool {
	return int(n) >= t.cfg.regMin && t.inputRegistered(op)
}

// inputRegistered says whether op's input lies in memory registered on
// this device (mem_map), whatever its size.
func (t *Team) inputRegistered(op *ops.Op) bool {
	lo, span, _ := ops.InputSpan(op)
	return t.reg.find(lo, uintptr(span), t.g.ordinal, false) != nil
}

// record is this rank's record for the span [lo, lo+n) of its buffers:
// registered when a shareable CUDA memh holds it (no driver call), else,
// when legacy (every rank takes this round), gosym.empty's buffer it lies
// in, the allocation as the driver reports it, or the run of paged memory
// it lies in; a private memh (paged memory registers private) is looked
// up as a run too. Not ok otherwise. It carries the ids this rank retired
// since the last round, those of this op's walk included.
func (s *directSide) record(lo, n uintptr, legacy bool) []byte {
	var rg boundRegion
	var cur *pageRun
	private := false
	if m := s.reg.find(lo, n, s.device, legacy); m != nil {
		_, bound := m.Binding(s.reg)
		sh, _, ok := m.CUDA()
		private = !ok
		// A fresh binding is not tried while a graph is captured (opening a
		// handle is not allowed then): the op stages, a later one binds.
		if ok && (bound || !s.capturing) && !s.reg.isRefused(m.ID()) {
			rg.flags, rg.id = recOK|recRegistered, m.ID()
			rg.base, rg.size, rg.h = uintptr(sh.Base), uintptr(sh.Size), cuda.IpcHandle(sh.Handle)
			if sh.VMM {
				rg.flags |= recVMM
			}
			if bound {
				rg.flags |= recBound
			} else {
				s.fresh = m
			}
		}
	}
	paged := memreg.UBRMode() != "no"
	switch {
	case rg.ok() || n == 0 || !legacy && !private:
	case paged && (private || s.reg.covers(lo, n)): // no IPC handle to ask for
		cur = s.pagedRecord(&rg, lo, n, nil)
	default:
		base, size, h, err := s.ipc.ipcExport(lo)
		switch {
		case err != nil && paged:
			cur = s.pagedRecord(&rg, lo, n, err)
		case err != nil:
			dlog.Printf("rank %d: no IPC export of %#x: %v", s.rank, lo, err)
		case lo+n <= base+size && lo+n > lo: // else it spans two allocations: staged
			rg.flags, rg.base, rg.size, rg.h = recOK, base, size, h
		}
	}
	if legacy || private {
		s.reg.sweep(s.ipc, cur)
	}
	rg.retired = s.reg.takeRetired(maxRetired)
	out := make([]byte, regionBytes)
	rg.encode(out)
	return out
}

// pagedRecord fills rg for [lo, lo+n) in paged VMM memory (which has no
// IPC handle: why), or leaves it not ok; it returns the run, if any.
func (s *directSide) pagedRecord(rg *boundRegion, lo, n uintptr, why error) *pageRun {
	r, err := s.reg.run(s.ipc, lo, n, s.world, s.capturing)
	if err != nil {
		dlog.Printf("rank %d: no IPC export of %#x (%v), nor a run of pages: %v", s.rank, lo, why, err)
		return nil
	}
	bound := s.reg.runBound(r)
	// As for a memh: no binding while a graph is captured (the op stages).
	if s.reg.isRefused(r.id) || !bound && s.capturing {
		return r
	}
	rg.flags, rg.id, rg.base, rg.size = recOK|recRegistered|recVMM, r.id, r.base, r.size
	if bound {
		rg.flags |= recBound
		if s.capturing {
			s.reg.captureRun(r)
		}
	} else {
		s.run = r
	}
	return r
}

// peersOf translates addresses of every rank's published allocation into
// this process.
type peersOf struct {
	regions []boundRegion
	local   []uintptr // where rank r's allocation is mapped here
}

func (p *peersOf) at(r int, addr uintptr) uintptr { return p.local[r] + (addr - p.regions[r].base) }

// negotiate runs after round 1 on every rank with every rank's record (at
// the start of metas[r]): it drops the peers' retired mappings, decides
// whether the op goes direct (relevant: the ranks whose memory is read;
// the same on every rank), maps what this rank reads (need), votes unless
// every relevant record is registered and bound, and binds or refuses the
// fresh registered memhs by the vote. ok is false, on every rank alike,
// when the op must stage.
func (s *directSide) negotiate(metas [][]byte, relevant, need []bool, mode directMode, who *ops.Op, agree agreeFunc) (*peersOf, bool, error) {
	p := &peersOf{regions: make([]boundRegion, s.world), local: make([]uintptr, s.world)}
	for r, m := range metas {
		if len(m) < regionBytes {
			return nil, false, status.Errorf(status.Mismatch, "gosym: %s: rank %d sent %d bytes of metadata, want at least %d",
				who.Who(), r, len(m), regionBytes)
		}
		p.regions[r] = decodeRegion(m)
	}
	for r := range p.regions {
		if rt := p.regions[r].retired; r != s.rank && len(rt) > 0 {
			s.reg.forget(s.ipc, s.capturing, r, rt)
		}
	}
	if !s.capturing {
		s.reg.flush(s.ipc) // drops deferred while a graph was captured
	}
	direct, vote, held := mode != directNone, false, false
	for r := range p.regions {
		rg := &p.regions[r]
		switch {
		case !relevant[r]:
		case !rg.ok() || mode == directRegistered && !rg.registered():
			direct = false
		case rg.bound():
		case s.held(r, rg):
			held = true
		default:
			vote = true
		}
	}
	if !direct {
		return nil, false, nil
	}
	msgs, done, err := s.swapFresh(p.regions, relevant)
	if err != nil {
		return nil, false, err
	}
	// The mappings hold the memory; the fds are not needed after.
	defer done()
	mapped := make([]byte, s.world) // the vote: 1 where this rank has rank r's allocation (or needs none)
	for r := range p.regions {
		rg := &p.regions[r]
		mapped[r] = 1
		// A fresh registered allocation is mapped by every rank, needed or
		// not, so that bound means mapped everywhere.
		if !relevant[r] || !need[r] && !(vote && rg.registered() && !rg.bound()) {
			continue
		}
		va, err := s.open(r, rg, &msgs[r])
		if err != nil {
			dlog.Printf("rank %d: opening rank %d's buffer: %v", s.rank, r, err)
			mapped[r] = 0
		}
		p.local[r] = va
	}
	if !vote {
		if slices.Contains(mapped, 0) { // bound means every rank mapped it; this one lost or could not reopen it
			return nil, false, status.Errorf(status.Internal, "gosym: %s: a bound peer allocation could not be mapped here", who.Who())
		}
		s.counted(p.regions, relevant)
		if held {
			s.counters.voteSkips.Add(1)
		}
		return p, true, nil
	}
	all, err := agree(mapped)
	if err != nil {
		return nil, false, err
	}
	everywhere := make([]bool, s.world) // rank r's allocation is mapped by every rank
	ok := true
	for r := range everywhere {
		everywhere[r] = true
		for _, v := range all {
			everywhere[r] = everywhere[r] && len(v) == s.world && v[r] == 1
		}
		ok = ok && everywhere[r]
	}
	s.settle(p.regions, relevant, everywhere)
	if ok {
		s.counted(p.regions, relevant)
		if s.everyNeeds {
			for r := range p.regions {
				if rg := &p.regions[r]; relevant[r] && !rg.registered() {
					s.reg.hold(ipcKey{r, rg.h})
				}
			}
		}
	}
	return p, ok, nil
}

// held says whether rank r's published allocation rg (one published per
// op, by handle) is known mapped by every rank: an earlier op's vote
// passed on it, and such mappings stay for the group's life.
func (s *directSide) held(r int, rg *boundRegion) bool {
	return !rg.registered() && s.reg.isHeld(ipcKey{r, rg.h})
}

// swapFresh sends the fds of this rank's fresh VMM memory (if its record
// is a fresh VMM one: a gosym.empty buffer's one allocation, or a run's
// pages), with their sizes, to every peer and returns every rank's
// announcement, by rank, and a func that closes the fds received. It runs
// on every rank or on none: when some relevant record is a fresh VMM one,
// which every rank sees alike. A local export failure sends no fd; the
// peers then fail to map it and the vote refuses it.
func (s *directSide) swapFresh(regions []boundRegion, relevant []bool) ([]comm.FDMsg, func(), error) {
	fresh := false
	for r := range regions {
		fresh = fresh || relevant[r] && regions[r].vmm() && !regions[r].bound()
	}
	if !fresh {
		return make([]comm.FDMsg, s.world), func() {}, nil
	}
	var fds []int
	var body []byte
	if me := &regions[s.rank]; relevant[s.rank] && me.vmm() && !me.bound() {
		var err error
		if s.run != nil {
			fds, body, err = exportRun(s.ipc, s.run)
		} else {
			var fd int
			if fd, err = s.ipc.vmmExport(me.base); err == nil {
				fds, body = []int{fd}, sizesBody([]uintptr{me.size})
			}
		}
		if err != nil {
			dlog.Printf("rank %d: exporting memory %#x's fds: %v", s.rank, me.id, err)
		}
	}
	msgs, done, err := s.swapFD(body, fds)
	closeFDs(fds)
	if err != nil {
		return nil, nil, err
	}
	return msgs, done, nil
}

// open is where rank r's allocation (record rg) is mapped here; m is what
// rank r announced for a fresh VMM record.
func (s *directSide) open(r int, rg *boundRegion, m *comm.FDMsg) (uintptr, error) {
	switch {
	case r == s.rank:
		return rg.base, nil
	case rg.vmm():
		return s.reg.openPeer(r, rg.id, func() (peerMapping, error) {
			sizes, err := announcedSizes(m, rg.size)
			if err != nil {
				return peerMapping{}, fmt.Errorf("rank %d's VMM memory %#x: %w", r, rg.id, err)
			}
			va, err := s.ipc.vmmOpen(m.FDs, sizes)
			return peerMapping{va: va, parts: sizes}, err
		})
	case rg.registered():
		return s.reg.openPeer(r, rg.id, func() (peerMapping, error) {
			va, err := s.ipc.ipcOpen(rg.h)
			return peerMapping{va: va}, err
		})
	}
	return s.reg.openLegacy(s.ipc, s.counters, r, rg.h)
}

// settle binds the fresh registered memhs of the op that every rank
// mapped and refuses the others: the exporter records it, the other ranks
// drop a mapping that will never be used.
func (s *directSide) settle(regions []boundRegion, relevant, everywhere []bool) {
	for r := range regions {
		rg := &regions[r]
		switch {
		case !relevant[r] || !rg.registered() || rg.bound():
		case r != s.rank:
			if !everywhere[r] {
				s.reg.forget(s.ipc, s.capturing, r, []uint64{rg.id})
			}
		case !everywhere[r]:
			dlog.Printf("rank %d: the group could not map registered memory %#x; it stays staged", s.rank, rg.id)
			s.reg.refuse(rg.id)
		case s.run != nil && s.run.id == rg.id:
			s.reg.bindRun(s.run)
		case s.fresh != nil && s.fresh.ID() == rg.id:
			s.reg.bind(s.fresh)
		}
	}
}

// counted updates the counters of an op that goes direct.
func (s *directSide) counted(regions []boundRegion, relevant []bool) {
	all := true
	for r := range regions {
		all = all && (!relevant[r] || regions[r].registered() && !regions[r].paged())
	}
	if all {
		s.reg.regOps.Add(1)
	}
	if me := &regions[s.rank]; relevant[s.rank] && me.bound() {
		s.reg.reused.Add(1)
	}
}

// ipcExport, ipcOpen, ipcClose and ipcIdle make Team the direct path's
// ipcMaps, on the group's device.
func (t *Team) ipcExport(addr uintptr) (uintptr, uintptr, cuda.IpcHandle, error) {
	base, size, err := t.g.d.AddressRange(t.g.ctx, addr)
	if err != nil {
		return 0, 0, cuda.IpcHandle{}, err
	}
	h, err := t.g.d.IpcGetMemHandle(t.g.ctx, base)
	return base, size, h, err
}

func (t *Team) ipcOpen(h cuda.IpcHandle) (uintptr, error) {
	return t.g.d.IpcOpenMemHandle(t.g.ctx, h, cuda.IpcLazyEnablePeerAccess)
}

func (t *Team) ipcClose(va uintptr) error { return t.g.d.IpcCloseMemHandle(t.g.ctx, va) }

// ipcIdle waits until no op of the group can still read a mapping being
// dropped. With deferred ops (defer.go) it waits for the group's last op
// (every earlier one is ordered before it, order.go), not for the context:
// it may run on the queue's worker during a deferred op, whose caller's
// stream waits for a flag that only this thread writes after it.
func (t *Team) ipcIdle() error {
	if t.df.stream == 0 {
		return t.g.d.CtxSynchronize(t.g.ctx)
	}
	if !t.order.any {
		return nil
	}
	return t.g.d.EventSynchronize(t.g.ctx, t.order.ev)
}

func (t *Team) vmmExport(addr uintptr) (int, error) { return t.g.vmmExport(addr) }

func (t *Team) vmmOpen(fds []int, sizes []uintptr) (uintptr, error) {
	return t.g.vmmOpen(fds, sizes)
}

func (t *Team) vmmClose(va uintptr, sizes []uintptr) error {
	t.g.unmapParts(va, sizes, len(sizes))
	return nil
}

func (t *Team) pageAt(addr uintptr) (uintptr, uintptr, cuda.AllocHandle, error) {
	base, size, err := t.g.d.AddressRange(t.g.ctx, addr)
	if err != nil {
		return 0, 0, 0, err
	}
	h, err := t.pageRetain(base)
	return base, size, h, err
}

func (t *Team) pageRetain(addr uintptr) (cuda.AllocHandle, error) {
	return t.g.d.MemRetainAllocationHandle(t.g.ctx, addr)
}

func (t *Team) pageRelease(h cuda.AllocHandle) { t.g.d.MemRelease(t.g.ctx, h) }

func (t *Team) pageExport(h cuda.AllocHandle) (int, error) { return t.g.d.MemExportFD(t.g.ctx, h) }

// closeIPC releases the group's bindings and closes every peer mapping
// (the device is idle).
func (t *Team) closeIPC() {
	if t.reg != nil {
		t.reg.close(t)
	}
}

func everyone(world int) []bool {
	out := make([]bool, world)
	for r := range out {
		out[r] = true
	}
	return out
}

// direct runs op on the peers' own buffers when it is large enough (or
// registered) and every rank can; done is false when op should take the
// staged path. all_to_all takes its own route (its agreement carries the
// splits, allToAllDirect).
func (t *Team) direct(op *ops.Op, s cuda.Stream, agree agreeFunc) (done bool, err error) {
	es := uintptr(op.DType.Size())
	n := uintptr(op.Count) * es
	if t.world == 1 || n == 0 {
		return false, nil
	}
	var mine []spanRec // what peers will address in this rank's memory
	relevant := everyone(t.world)
	published := op.In // the address peers read of this rank's (after the record)
	relay := op.Kind == ops.Broadcast && t.relays(n)
	switch op.Kind {
	case ops.AllReduce, ops.AllGather:
		mine = append(mine, spanRec{op.In, n})
	case ops.Broadcast:
		switch {
		case t.rank == op.Root:
			mine = append(mine, spanRec{op.In, n})
		case relay: // the others relay from this rank's output
			mine, published = append(mine, spanRec{op.Out, n}), op.Out
		}
		if !relay {
			relevant = make([]bool, t.world)
			relevant[op.Root] = true
		}
	case ops.ReduceScatter:
		for _, pc := range op.InPieces {
			mine = append(mine, spanRec{pc.Addr, n})
		}
	default:
		return false, nil
	}
	mode := directAny
	if int(n) < t.directMin(op) {
		if !t.registered(op, n) {
			return false, nil
		}
		mode = directRegistered
	}
	sd := t.side()
	le := binary.LittleEndian
	// record, then In, then one address per peer (reduce_scatter's pieces)
	meta := make([]byte, regionBytes+8+8*t.world)
	lo, span := hull(mine)
	copy(meta, sd.record(lo, span, mode == directAny))
	if op.Kind == ops.AllReduce && op.In != op.Out {
		le.PutUint64(meta, 0) // two-shot runs in place: every rank takes the staged path
	}
	le.PutUint64(meta[regionBytes:], uint64(published))
	for r, pc := range op.InPieces {
		le.PutUint64(meta[regionBytes+8+8*r:], uint64(pc.Addr))
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
	sd.everyNeeds = true
	peers, ok, err := sd.negotiate(metas, relevant, relevant, mode, op, agree)
	if err != nil || !ok {
		return false, err
	}
	t.counters.directOps.Add(1)
	in := func(r int) uintptr { return peers.at(r, uintptr(le.Uint64(metas[r][regionBytes:]))) }
	switch op.Kind {
	case ops.AllGather:
		segs, own := make([]copySeg, 0, t.world), -1
		for _, r := range t.inTurn() {
			if r == t.rank {
				own = len(segs)
			}
			segs = append(segs, copySeg{op.OutPieces[r].Addr, in(r), n})
		}
		return true, t.moveDirect(segs, own, n, s)
	case ops.Broadcast:
		if relay {
			return true, t.relayBroadcast(op, n, in, s)
		}
		var segs []copySeg
		if t.rank != op.Root {
			segs = append(segs, copySeg{op.Out, in(op.Root), n})
		} else if op.Out != op.In {
			segs = append(segs, copySeg{op.Out, op.In, n})
		}
		return true, t.moveDirect(segs, -1, n, s)
	case ops.ReduceScatter:
		p := t.reduceParams(op)
		for r := range metas {
			p.Peers[r] = peers.at(r, uintptr(le.Uint64(metas[r][regionBytes+8+8*t.rank:])))
		}
		p.Numel, p.Out = uint64(op.Count), op.Out
		return true, t.reduceKernel(op, cuda.OneShot, &p, s)
	default: // all_reduce, in place: two-shot on the peers' buffers
		p := t.reduceParams(op)
		for r := range metas {
			p.Peers[r] = in(r)
		}
		p.Numel, p.Out = uint64(op.Count), op.Out
		if t.cfg.arPush {
			p.Stages, p.Slot = t.stages, arPushSlot(t.stage, t.world, op.DType.Size())
			return true, t.reduceKernel(op, cuda.ArPush, &p, s)
		}
		return true, t.reduceKernel(op, cuda.TwoShot, &p, s)
	}
}

// arPushSlot is gs_arpush's most elements of a slice per round: a staging
// of stage bytes holds world slots of that many elements and 16 bytes
// (a piece lands at its destination's 16-byte phase), a multiple of 16
// bytes.
func arPushSlot(stage uintptr, world, es int) uint64 {
	per := (uint64(stage)/uint64(world) - 16) / 16 * 16
	return per / uint64(es)
}

// relays says whether a broadcast of n bytes runs by scatter and relay:
// from three ranks, where every peer reading the root would share the
// root's egress world-1 ways (the same answer on every rank).
func (t *Team) relays(n uintptr) bool {
	return t.world >= 3 && int(n) >= t.cfg.relayMin
}

// relayBroadcast runs gs_bcast_relay (copy.cu) after the direct path's
// agreement: in(r) is rank r's published buffer mapped here, the root's
// input and the others' outputs.
func (t *Team) relayBroadcast(op *ops.Op, n uintptr, in func(int) uintptr, s cuda.Stream) error {
	f, err := t.function(cuda.RelayKernel)
	if err != nil {
		return err
	}
	t.used = true
	t.counters.relayOps.Add(1)
	m := t.world - 1
	g := max(min(t.cfg.relayBlocks.at(t.world, t.arch(), int(n)), cuda.MaxBlocks/m), 1)
	p := cuda.RelayParams{Pads: t.pads, Src: in(op.Root), Bytes: uint64(n), Step: relayStep(uint64(n), m, g, t.cfg.relaySlice),
		TimeoutNs: t.timeoutNs, World: int32(t.world), Rank: int32(t.rank), Root: int32(op.Root), Blocks: int32(g)}
	if t.cfg.relayPush {
		p.Push = 1
	}
	for q := range t.world {
		p.Outs[q] = in(q)
	}
	p.Outs[t.rank] = op.Out
	if t.rank == op.Root {
		p.Src = op.In
	}
	_, block := cuda.CopyGrid(0)
	return t.g.d.Launch(f, cuda.D1(uint32(g*m)), block, 0, s, &p)
}

// relayStep is gs_bcast_relay's slice for n bytes over m chunks of g
// blocks each: an eighth of a block's share (a relaying block trails its
// puller by about one slice), from 16 KiB up to most, a multiple of 16.
func relayStep(n uint64, m, g, most int) uint64 {
	up16 := func(v uint64) uint64 { return (v + 15) / 16 * 16 }
	chunk := up16((n + uint64(m) - 1) / uint64(m))
	per := up16((chunk + uint64(g) - 1) / uint64(g))
	return up16(min(max(per/8, 16<<10), uint64(max(most, 16))))
}

// allToAllRegistered says whether an equal-split all_to_all of n bytes per
// piece takes the agreement round for its registered input (ops.go
// skips the round for equal splits otherwise).
func (t *Team) allToAllRegistered(op *ops.Op, n uintptr) bool {
	return t.world > 1 && int(n) < t.directMin(op) && t.registered(op, n)
}

// allToAllRecord is this rank's record for an all_to_all whose largest own
// piece has localMax bytes: the driver is asked only from the lower
// threshold of allToAllDirectMin (whether the splits differ anywhere is
// known after the agreement).
func (t *Team) allToAllRecord(sd *directSide, op *ops.Op, localMax uintptr) []byte {
	es := uintptr(op.DType.Size())
	spans := make([]spanRec, len(op.InPieces))
	for r, pc := range op.InPieces {
		spans[r] = spanRec{pc.Addr, uintptr(pc.Count) * es}
	}
	lo, n := hull(spans)
	return sd.record(lo, n, int(localMax) >= t.allToAllDirectMin(op, true))
}

// allToAllDirectMin is the longest piece from which an all_to_all reads
// the peers' inputs in place: lower when the splits differ (skewed), since
// that op pays the agreement round whichever path it takes.
func (t *Team) allToAllDirectMin(op *ops.Op, skewed bool) int {
	if skewed {
		return min(t.directMin(op), t.cfg.a2avDirectMin)
	}
	return t.directMin(op)
}

// allToAllDirect runs an all_to_all on the peers' inputs by the agreed
// metas (per rank: 2*world split counts, the record, world piece
// addresses); longest is the longest piece of all, from dmin bytes it
// reads any buffers in place. done is false when it must stage.
func (t *Team) allToAllDirect(sd *directSide, op *ops.Op, s cuda.Stream, all [][]byte, longest uintptr, dmin int, agree agreeFunc) (bool, error) {
	w := t.world
	le := binary.LittleEndian
	mode := directNone
	switch {
	case int(longest) >= dmin:
		mode = directAny
	case int(longest) >= t.cfg.regMin:
		mode = directRegistered
	}
	regions := make([][]byte, w)
	relevant, need := make([]bool, w), make([]bool, w)
	for r, m := range all {
		regions[r] = m[16*w:]
		for j := range w {
			relevant[r] = relevant[r] || le.Uint64(m[8*j:]) > 0
		}
		need[r] = op.OutPieces[r].Count > 0
	}
	peers, ok, err := sd.negotiate(regions, relevant, need, mode, op, agree)
	if err != nil || !ok {
		return false, err
	}
	t.counters.directOps.Add(1)
	es := uintptr(op.DType.Size())
	segs, own := make([]copySeg, 0, w), -1
	for _, j := range t.inTurn() {
		if out := op.OutPieces[j]; out.Count > 0 {
			if j == t.rank {
				own = len(segs)
			}
			src := peers.at(j, uintptr(le.Uint64(regions[j][regionBytes+8*t.rank:])))
			segs = append(segs, copySeg{out.Addr, src, uintptr(out.Count) * es})
		}
	}
	return true, t.moveDirect(segs, own, longest, s)
}

// moveDirect makes segs (copies from the peers' own buffers, each at most
// n bytes, n the same on every rank) by one gs_copy launch with its
// barriers fused in, up to bigBlocks blocks, for n below directCEMin;
// else by the copy engines between two barrier kernels. A launch moves
// every segment at once, where the copy engines of one stream serialise
// them (all_gather's local piece, then the peer's): segs[own], when own
// is not -1, is this rank's own piece, which the copy engines move beside
// the others (moveCE).
func (t *Team) moveDirect(segs []copySeg, own int, n uintptr, s cuda.Stream) error {
	if int(n) < t.cfg.directCEMin {
		g, _ := cuda.CopyGridLimit(uint64(n), t.cfg.bigBlocks)
		return t.copyKernel(nil, segs, g, 0, s) // the peers' own buffers, ready before the launch
	}
	return t.moveCE(segs, own, n, s)
}

// moveCE makes segs (the longest n bytes, n the same on every rank) by the
// copy engines between two barriers of all ranks. segs[own] (own -1:
// none), a copy within this rank's memory, runs on the team's second
// stream beside the others from GOSYM_GPU_CE_OVERLAP_MIN (overlap.go); it
// needs no peer, so it starts before the first barrier.
func (t *Team) moveCE(segs []copySeg, own int, n uintptr, s cuda.Stream) error {
	from := t.cfg.ceOverlapMin.at(t.world, t.arch(), int(n))
	beside := own >= 0 && from > 0 && int(n) >= from && segs[own].n > 0 && len(segs) > 1 &&
		t.ce.ready(t.g, t.capturing)
	if beside {
		if err := t.ce.copyBeside(t.g, segs[own], s); err != nil {
			return err
		}
		t.counters.ceBeside.Add(1)
	}
	if err := t.barrier(s); err != nil {
		return err
	}
	for i, sg := range segs {
		if sg.n > 0 && !(beside && i == own) {
			if err := t.g.d.MemcpyDtoDAsync(t.g.ctx, sg.dst, sg.src, sg.n, s); err != nil {
				return err
			}
		}
	}
	if beside {
		if err := t.ce.joinTo(t.g, s); err != nil {
			return err
		}
	}
	return t.barrier(s)
}
