package gpu

// An endpoint's CUDA side: the arguments of CUDA ops waiting in the
// collective queue, the group's Team once set up, and its counters.

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Args says where a posted CUDA op runs.
type Args struct {
	Device    int         // CUDA device ordinal
	Stream    cuda.Stream // the caller's stream
	Capturing bool        // the caller says the stream is being captured (Run also asks the driver)
	// Task, when set, runs instead of an op: group-wide setup that must
	// happen in collective order (contiguous views).
	Task func(who symm.Who, deadline time.Time) error
	// Set by Defer (defer.go): the op runs on the team's internal stream
	// after ready (recorded on the caller's stream), then Finish writes
	// release to the flag the caller's stream waits for.
	deferred bool
	ready    cuda.Event
	release  uint32
}

// Deferred says whether the op's caller returned before it ran (Defer).
func (a Args) Deferred() bool { return a.deferred }

// State is an endpoint's CUDA side. CUDA ops go through the collective
// queue like every collective (they share its sequence numbers); their
// device and stream wait in pending, by sequence number, until they run.
type State struct {
	mu       sync.Mutex
	pending  map[uint64]Args
	npending atomic.Int32

	// Used only by whoever runs the collective queue, and by Destroy after
	// the workers stopped.
	team *Team
	err  error // why the data plane could not start on this group, or a kernel's error (sticky)
	// live is team for readers off the queue (stats, DeviceError, Abort),
	// under mu: Close takes it away before freeing it.
	live *Team
	// lost is the group's error once a peer was lost (Abort), under mu:
	// ops check it after the team is live (lost.go says why).
	lost error
	// deferErr is the first error of a deferred op (defer.go), under mu:
	// its caller had returned, so the group's next CUDA op reports it.
	deferErr error
	// deferring: the team made its deferral stream (GOSYM_GPU_DEFER=1), so
	// posts ask Defer; one atomic load per post while it is off
	deferring atomic.Bool

	ops      atomic.Int64
	seq      atomic.Uint64 // the latest op's sequence number (a peer's refusal names it by its low bits)
	kind     atomic.Int32  // the latest op's kind, for Latest
	captured atomic.Int64  // ops enqueued while their stream was being captured (a CUDA graph)
	joins    atomic.Int64  // ops that waited for the group's previous op on another stream (order.go)
	deferred atomic.Int64  // ops whose caller returned before their host rounds (defer.go)
	device   atomic.Int32  // ordinal + 1 once set up, for stats
	stage    atomic.Int64
	counters Counters
	algos    algoStats   // which reduction algorithm ran (sema.go)
	nvls     atomic.Bool // a multicast object is bound over the group's buffers
	// the device launches the group's kernels as programmatic dependents
	// (GOSYM_GPU_PDL where the driver and GPU can: Device.dependent)
	dependent atomic.Bool
	reg       registry // bindings of registered CUDA memory, peer mappings (reg.go)
	// host time of the ops (Run, this rank's thread; the first op's
	// setup apart) and, of it, the host rounds with the peers (the direct
	// path's agreement, the split agreement): what a program whose host
	// runs ahead of its GPU pays, since a round waits for the slowest host
	setupNs, hostNs, agreeNs, agreeRounds atomic.Int64
}

// Counters count what the data plane did, for the endpoint's stats.
type Counters struct {
	directOps atomic.Int64 // ops that ran on the peers' own buffers (direct.go)
	relayOps  atomic.Int64 // of those, broadcasts by scatter and relay (gs_bcast_relay)
	ipcOpens  atomic.Int64 // peer allocations mapped (cache misses)
	ipcHits   atomic.Int64 // peer allocations found mapped
	llMoves   atomic.Int64 // data movement by one gs_llmove launch (ops.go, llMove)
	pacedA2A  atomic.Int64 // all_to_all by one gs_a2av launch (ops.go, allToAllPaced)
	voteSkips atomic.Int64 // direct ops that skipped the vote: their allocations were mapped everywhere already (direct.go, held)
	ceBeside  atomic.Int64 // copy-engine moves whose local piece ran on the second stream (overlap.go)
}

// Park keeps a's op (collective seq) until the queue runs it (Take).
func (g *State) Park(seq uint64, a Args) {
	g.mu.Lock()
	if g.pending == nil {
		g.pending = map[uint64]Args{}
	}
	g.pending[seq] = a
	g.mu.Unlock()
	g.npending.Add(1)
}

// Take returns (and forgets) the CUDA arguments of collective seq, if it
// is a CUDA op. Host ops pay one atomic load.
func (g *State) Take(seq uint64) (Args, bool) {
	if g.npending.Load() == 0 {
		return Args{}, false
	}
	g.mu.Lock()
	a, ok := g.pending[seq]
	if ok {
		delete(g.pending, seq)
	}
	g.mu.Unlock()
	if ok {
		g.npending.Add(-1)
	}
	return a, ok
}

// Close frees the group's GPU buffers once the device is idle, waiting
// for it at most wait (then it leaves them mapped: team.close).
func (g *State) Close(wait time.Duration) {
	g.mu.Lock()
	g.live = nil
	g.mu.Unlock()
	if g.team != nil {
		g.team.close(wait)
		g.team = nil
	}
}

// Ordinal is the device of the group's CUDA ops on this rank, -1 before
// the first.
func (g *State) Ordinal() int { return int(g.device.Load()) - 1 }

// Err is why the plane cannot run the group's CUDA ops (setup refused, a
// kernel's error), nil while it can.
func (g *State) Err() error { return g.err }

// ClaimOrdinal records device d as the group's on this rank unless one is
// (a p2p channel opened before any collective).
func (g *State) ClaimOrdinal(d int) { g.device.CompareAndSwap(0, int32(d)+1) }

// Stats adds the plane's counters to m.
func (g *State) Stats(m map[string]any) {
	m["gpu_ops"] = g.ops.Load()
	m["gpu_captured_ops"] = g.captured.Load()
	m["gpu_stream_joins"] = g.joins.Load()
	m["gpu_deferred_ops"] = g.deferred.Load()
	m["gpu_setup_us"] = g.setupNs.Load() / 1000
	m["gpu_host_us"] = g.hostNs.Load() / 1000
	m["gpu_agree_us"] = g.agreeNs.Load() / 1000
	m["gpu_agree_rounds"] = g.agreeRounds.Load()
	m["gpu_device"] = int(g.device.Load()) - 1
	m["gpu_stage_bytes"] = g.stage.Load()
	m["gpu_direct_ops"] = g.counters.directOps.Load()
	m["gpu_relay_ops"] = g.counters.relayOps.Load()
	m["gpu_ipc_opens"] = g.counters.ipcOpens.Load()
	m["gpu_ipc_hits"] = g.counters.ipcHits.Load()
	m["gpu_ll_moves"] = g.counters.llMoves.Load()
	m["gpu_paced_all_to_all"] = g.counters.pacedA2A.Load()
	m["gpu_ce_beside"] = g.counters.ceBeside.Load()
	m["gpu_vote_skips"] = g.counters.voteSkips.Load()
	m["gpu_nvls"] = g.nvls.Load()
	m["gpu_dependent_launch"] = g.dependent.Load()
	m["gpu_device_error"] = g.deviceErrorCode()
	g.algos.stats(m)
	g.reg.stats(m)
}
