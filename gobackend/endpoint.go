// Package gobackend is gosym's engine: the public Go API that the C ABI
// (cabi/) exports. An Endpoint is one process group's communicator on this
// rank: it bootstraps the peer links, shares symmetric memory with the
// peers, and runs posted operations in order on worker goroutines.
package gobackend

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/coll"
	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
	"github.com/gosym/gosym/gobackend/internal/gpu"
	"github.com/gosym/gosym/gobackend/internal/host"
	"github.com/gosym/gosym/gobackend/internal/memreg"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/shm"
	"github.com/gosym/gosym/gobackend/internal/status"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// Version is the engine version.
const Version = "0.1.0"

// Op re-exports the operation description.
type Op = ops.Op

// Piece re-exports a (address, count) piece.
type Piece = ops.Piece

// Config holds the tunables read from the environment at creation
// (internal/config's table says what each accepts).
type Config struct {
	StageBytes int           // one staging half (GOSYM_STAGE_BYTES)
	BoxBytes   int           // one mailbox half per peer (GOSYM_BOX_BYTES)
	Threads    int           // goroutines per large copy/reduce (GOSYM_THREADS)
	Spin       time.Duration // poll before sleeping (GOSYM_SPIN_US)
	DirectMin  int           // smallest input read in place (GOSYM_DIRECT_MIN)
	Slots      int           // sync slots per rank (GOSYM_SLOTS); every rank the same
	Watchdog   time.Duration // between two checks for lost peers (GOSYM_WATCHDOG_MS; 0: none)
}

// threadsFor is GOSYM_THREADS, else the cores each of ranks ranks sharing
// them gets, from 1 to 8: the goroutines of one large host copy or reduction.
func threadsFor(ranks int) int {
	return config.Threads.Or(max(1, min(8, runtime.NumCPU()/max(1, ranks))))
}

// DefaultConfig reads the GOSYM_* tunables for a group of world ranks; a
// bad value of any setting the engine reads is an error naming it.
func DefaultConfig(world int) (Config, error) {
	return Config{
		StageBytes: config.StageBytes.Get(),
		BoxBytes:   config.BoxBytes.Get(),
		Threads:    threadsFor(world),
		Spin:       time.Duration(config.SpinUS.Get()) * time.Microsecond,
		DirectMin:  config.DirectMin.Get(),
		Slots:      config.Slots.Get(),
		Watchdog:   time.Duration(config.WatchdogMS.Get()) * time.Millisecond,
	}, config.Check()
}

// Endpoint is one process group on this rank.
type Endpoint struct {
	Rank, Size int
	Name       string
	Timeout    time.Duration
	cfg        Config

	boot *comm.Bootstrap
	mesh *comm.Mesh
	team *symm.Team
	exec *coll.Exec
	bind *memreg.Binder

	mu       sync.Mutex
	closed   bool
	broken   error // first failure that left the peers out of step
	seq      uint64
	p2pSeq   []uint64
	coll     *queue
	sends    []*queue
	recvs    []*inbox
	anys     anyRecvs // receives from any source (anysource.go)
	workers  sync.WaitGroup
	gpu      gpu.State      // the CUDA data plane (internal/gpu, cuda.go)
	p2p      gpu.P2P        // send/recv on CUDA memory (internal/gpu/p2p.go, handshake.go)
	stranded strandedFrames // frames of failed p2p handshakes (handshake.go)
	views    viewCache      // contiguous views of GPU buffers (view.go)
	dog      watchdog       // lost peers of a group with CUDA work (watchdog.go)

	stats Stats
}

// Stats are the endpoint's counters.
type Stats struct {
	Posted, Completed, Failed atomic.Int64
	Barriers                  atomic.Int64
	BytesIn                   atomic.Int64
}

var liveEndpoints atomic.Int64

// FitRuntime lowers GOMAXPROCS to this rank's share of the host's cores
// (cores / ranks, but at least 2) unless the user set GOMAXPROCS. Ranks of
// one host share its cores: Ps that a rank does not need only give the Go
// scheduler room to run threads that take cycles from the peer ranks. Two
// is the floor because with one P, the P of a caller back in Python (its
// thread counts as in a syscall) is retaken by sysmon after 20 µs whenever
// no P is idle, and the caller's next call wakes sysmon again: a thread
// wake-up per op that preempts the rank on its own core (measured: ~3000
// per second, and small collectives that fall into a slow mode of 100 µs
// and more). With a second, idle P sysmon leaves the P alone. The C ABI
// calls it for every endpoint it creates; it only ever lowers the value.
func FitRuntime(world int) {
	if os.Getenv("GOMAXPROCS") != "" || world < 1 {
		return
	}
	if want := max(2, runtime.NumCPU()/world); want < runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(want)
	}
}

// NewEndpoint creates the local half of a group: its listener and blob.
func NewEndpoint(rank, size int, timeout time.Duration, name string) (*Endpoint, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, status.Errorf(status.InvalidArg, "gosym: rank %d is not in a group of %d", rank, size)
	}
	if timeout <= 0 {
		timeout = 30 * time.Minute
	}
	cfg, err := DefaultConfig(size)
	if err != nil {
		return nil, err
	}
	boot, err := comm.Listen(rank, size)
	if err != nil {
		return nil, status.Wrap(status.System, err, "gosym: create endpoint")
	}
	liveEndpoints.Add(1)
	return &Endpoint{Rank: rank, Size: size, Name: name, Timeout: timeout, cfg: cfg, boot: boot}, nil
}

// Blob is this rank's bootstrap blob, to be allgathered out of band.
func (e *Endpoint) Blob() []byte { return e.boot.Self.Encode() }

// Connect takes every rank's blob (in rank order), authenticates the peers,
// shares the symmetric regions and starts the workers.
func (e *Endpoint) Connect(blobs [][]byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return status.Errorf(status.Closed, "gosym: endpoint destroyed")
	}
	if e.team != nil {
		return status.Errorf(status.InvalidArg, "gosym: endpoint already connected")
	}
	deadline := time.Now().Add(e.Timeout)
	mesh, err := e.boot.Connect(blobs, deadline)
	if err != nil {
		return status.Wrap(status.Peer, err, "gosym: group %q rank %d", e.Name, e.Rank)
	}
	e.boot.Close()
	layout := symm.NewLayout(e.Size, e.cfg.StageBytes, e.cfg.BoxBytes, e.cfg.Slots)
	layout.Settings, layout.CheckSettings = config.Agreed(), config.CheckAgreed
	team, err := symm.NewTeam(mesh, layout, fmt.Sprintf("%s:%d", e.Name, e.Rank), deadline)
	if err != nil {
		mesh.Close()
		return err
	}
	team.Spin = e.cfg.Spin
	e.mesh, e.team = mesh, team
	e.exec = coll.NewExec(team, host.Plane{}, e.Rank, e.cfg.Threads)
	if memreg.UBRMode() != "no" {
		e.bind = memreg.NewBinder(e.Rank, mesh)
		e.exec.D = e.bind
		e.exec.DirectMin = e.cfg.DirectMin
	}
	e.p2pSeq = make([]uint64, 2*e.Size)
	e.coll = e.startQueue(e.runColl)
	e.sends = make([]*queue, e.Size)
	e.recvs = make([]*inbox, e.Size)
	e.p2p.Init(e.gpuGroup(), p2pLink{Team: team, e: e}, &e.gpu)
	e.workers.Add(1) // Destroy's Abort stops the listener
	go func() {
		defer e.workers.Done()
		e.p2p.Listen()
	}()
	return nil
}

// Post validates op and queues it; the returned Work completes when it ran.
// Collectives run in post order; sends to one peer run in post order, as do
// receives from one peer, independently of the collectives.
func (e *Endpoint) Post(op *Op) (*Work, error) {
	if err := checkUserTag(op); err != nil {
		return nil, err
	}
	return e.post(op, true)
}

// Run posts op and waits until it is done: Post + Wait for a caller that
// waits at once. Such a caller runs the queue itself, so the op does not
// arm the worker's kick (a timer that would fire into a slow op).
func (e *Endpoint) Run(op *Op) error {
	if err := checkUserTag(op); err != nil {
		return err
	}
	w, err := e.post(op, false)
	if err != nil {
		return err
	}
	return w.Wait(-1)
}

// p2pSetupTag marks the host messages of a CUDA p2p channel's handshake
// (handshake.go). Post and Run refuse it for callers' messages, so the two
// can never be confused.
const p2pSetupTag = math.MinInt64

// checkUserTag refuses the tag the channel handshake reserves.
func checkUserTag(op *Op) error {
	if op.Kind.IsP2P() && op.Tag == p2pSetupTag {
		return status.Errorf(status.InvalidArg, "gosym: %s: tag %d is reserved by gosym", op.Kind, op.Tag)
	}
	return nil
}

// post is Post; kick says whether the worker should take the op if nobody
// claims it soon (async callers) or not (a caller that waits at once).
func (e *Endpoint) post(op *Op, kick bool) (*Work, error) {
	ops.Even(op, e.Size)
	if err := ops.Check(op, e.Rank, e.Size); err != nil {
		return nil, err
	}
	if err := hostReduceSupport(op); err != nil {
		return nil, err
	}
	if err := checkUBR(op); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(op.Kind); err != nil {
		return nil, err
	}
	w := &Work{op: *op, done: make(chan struct{})}
	var q *queue
	switch op.Kind {
	case ops.Send:
		q = e.peerQueue(e.sends, op.Peer, e.runSend)
		e.p2pSeq[op.Peer]++
		w.op.Seq = e.p2pSeq[op.Peer]
	case ops.Recv:
		if op.Peer == ops.AnySource {
			e.postAnyRecv(w)
			return w, nil
		}
		e.p2pSeq[e.Size+op.Peer]++
		w.op.Seq = e.p2pSeq[e.Size+op.Peer]
		if e.recvs[op.Peer] == nil {
			e.recvs[op.Peer] = e.startInbox(op.Peer)
		}
		e.stats.Posted.Add(1)
		e.recvs[op.Peer].post(w)
		return w, nil
	default:
		e.seq++
		w.op.Seq = e.seq
		q = e.coll
	}
	e.stats.Posted.Add(1)
	w.q = q
	q.push(w, kick)
	return w, nil
}

// usable says why no op of kind k may be posted now; called with e.mu held.
func (e *Endpoint) usable(k Kind) error {
	switch {
	case e.closed:
		return status.Errorf(status.Closed, "gosym: %s on a destroyed group", k)
	case e.team == nil:
		return status.Errorf(status.InvalidArg, "gosym: %s before the endpoint was connected", k)
	case e.broken != nil:
		return status.Wrap(status.CodeOf(e.broken), e.broken, "gosym: %s on a group broken by an earlier failure", k)
	}
	return nil
}

func (e *Endpoint) peerQueue(qs []*queue, peer int, run func(*Work) error) *queue {
	if qs[peer] == nil {
		qs[peer] = e.startQueue(run)
	}
	return qs[peer]
}

func (e *Endpoint) runColl(w *Work) error {
	a, ok := e.gpu.Take(w.op.Seq)
	return e.runCollOp(&w.op, a, ok)
}

// runCollOp runs collective op in its turn: a host op, or (cudaOp) a CUDA
// op or group task with its arguments a (runGPU).
func (e *Endpoint) runCollOp(op *Op, a gpu.Args, cudaOp bool) error {
	if cudaOp {
		return e.runGPU(op, a)
	}
	e.stats.Barriers.Add(1)
	return e.exec.Run(op, time.Now().Add(e.Timeout))
}

// finished counts an op that ran and returns its error; an error that
// leaves the peers out of step breaks the group (fail).
func (e *Endpoint) finished(err error) error {
	if err != nil {
		e.fail(err)
	} else {
		e.stats.Completed.Add(1)
	}
	return err
}

func (e *Endpoint) runSend(w *Work) error { return e.exec.SendMsg(&w.op, time.Now().Add(e.Timeout)) }

// fail records a failure; errors other than a cross-rank mismatch leave the
// peers out of step, so the group is unusable afterwards.
func (e *Endpoint) fail(err error) {
	e.stats.Failed.Add(1)
	if c := status.CodeOf(err); c == status.Mismatch || c == status.InvalidArg || c == status.NotSupported {
		return
	}
	e.breakWith(err)
}

// breakWith makes err the group's failure unless it has one: every later
// post fails with it.
func (e *Endpoint) breakWith(err error) {
	e.mu.Lock()
	if e.broken == nil {
		e.broken = err
	}
	e.mu.Unlock()
}

// Destroy stops the workers (failing queued work), tells the peers and
// releases everything. It is idempotent.
func (e *Endpoint) Destroy() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	queues := append([]*queue{e.coll}, e.sends...)
	inboxes := e.recvs
	e.mu.Unlock()
	if e.team != nil {
		e.team.Abort()
	}
	e.dog.stop()
	for _, q := range queues {
		if q != nil {
			q.close()
		}
	}
	for _, b := range inboxes {
		if b != nil {
			b.close()
		}
	}
	e.workers.Wait()
	wait := e.lastCheck() // the device's bound, after this rank's kernels of a lost peer were aborted
	if e.bind != nil {
		e.bind.Close()
	}
	e.gpu.Close(wait) // GPU mappings go before the links and the team
	e.stranded.drop()
	e.p2p.Close(wait)
	e.views.closeViews()
	if e.team != nil {
		e.team.Close()
	}
	if e.mesh != nil {
		e.mesh.Close()
	}
	e.boot.Close()
	liveEndpoints.Add(-1)
	return nil
}

// StatsMap reports counters and settings.
func (e *Endpoint) StatsMap() map[string]any {
	m := map[string]any{
		"rank": e.Rank, "size": e.Size, "name": e.Name,
		"posted": e.stats.Posted.Load(), "completed": e.stats.Completed.Load(), "failed": e.stats.Failed.Load(),
		"stage_bytes": e.cfg.StageBytes, "box_bytes": e.cfg.BoxBytes, "threads": e.cfg.Threads,
		"spin_us": e.cfg.Spin.Microseconds(), "direct_min": e.cfg.DirectMin, "timeout_ms": e.Timeout.Milliseconds(),
		"sync_slots": e.cfg.Slots,
	}
	if e.team != nil {
		m["slot_stalls"] = e.team.SlotStalls()
	}
	e.gpu.Stats(m)
	e.p2p.Stats(m)
	if e.bind != nil {
		for k, v := range e.bind.Stats() {
			m[k] = v
		}
	}
	return m
}

// ProcessStats reports process-wide live resources (for leak tests) and the
// driver calls timed while SetDriverTiming was on (for the call-cost bench, gosym.callcost).
func ProcessStats() map[string]any {
	calls, ns := cuda.Timed()
	return map[string]any{
		"endpoints": liveEndpoints.Load(), "regions": shm.LiveRegions(), "memfds": shm.LiveFDs(),
		"auth_rejected": comm.Rejected.Load(), "goroutines": runtime.NumGoroutine(),
		"driver_calls": calls, "driver_ns": ns,
	}
}

// SetDriverTiming turns on or off the count of CUDA driver calls and of the
// host time spent in them (ProcessStats' driver_calls and driver_ns).
func SetDriverTiming(on bool) { cuda.SetTiming(on) }
